"""Tiny random-weight transformers models built from configs, for the tests of
this folder (which import transformers and torch first, skipping without them)."""
import copy

import pytest
import torch
import transformers
from packaging.version import Version

# name: (config class, model class, its own config options for a sliding window w)
_VARIANTS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", lambda w: {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", lambda w: {"sliding_window": w}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              lambda w: {"use_sliding_window": True, "sliding_window": w,
                         "max_window_layers": 1}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               lambda w: {"sliding_window": w, "attn_logit_softcapping": 5.0,
                          "query_pre_attn_scalar": 16}),
    "gptoss": ("GptOssConfig", "GptOssForCausalLM",
               lambda w: {"sliding_window": w, "num_local_experts": 4,
                          "num_experts_per_tok": 2}),
}


def tiny_model(name, common, window, *, extra=None, sinks_std=None):
    """A tiny random ``name`` model (torch seed 0): the config options
    ``common``, the model's own for the sliding window ``window``, then
    ``extra[name]``; gpt-oss's sinks, which start at zero, drawn from
    N(0, sinks_std) so that they matter."""
    cfg_name, cls_name, own = _VARIANTS[name]
    cfg = getattr(transformers, cfg_name)(**common, **own(window), **(extra or {}).get(name, {}))
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(cfg)
    if name == "gptoss" and sinks_std is not None:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, sinks_std)
    return model


# The training tests' models: two layers (Gemma 2 and gpt-oss: a sliding
# layer, then a full one), a window of TRAIN_WINDOW tokens (the current one
# and 3 before), no dropout.
TRAIN_CONFIG = dict(vocab_size=100, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=64, attention_dropout=0.0)
TRAIN_WINDOW = 4
TRAIN_MODELS = ["llama", "mistral", "gemma2", "gptoss"]
# both backends compute in float32 and differ only in the order of the
# attention's sums: 1e-4 relative, with an absolute floor of 1e-5 of a
# parameter's largest gradient (for entries that nearly cancel)
RTOL, ATOL_REL = 1e-4, 1e-5

# fastattn[torch]'s lower pin.  Below it, transformers' own backward of gpt-oss's
# experts (``_grouped_mm_fallback_backward``) guards on a data-dependent size and
# does not trace under torch.compile(fullgraph=True) (seen with 5.17, torch 2.11
# and 2.13) -- whatever the attention backend.
TRANSFORMERS_PIN = "5.24"


def compiled_train_models(names=TRAIN_MODELS):
    """``names`` as parameters of a compiled training test: gpt-oss skipped,
    naming the version, on a transformers older than the pin."""
    old = Version(transformers.__version__) < Version(TRANSFORMERS_PIN)
    why = (f"transformers {transformers.__version__} < {TRANSFORMERS_PIN}: its gpt-oss "
           "experts' backward does not trace under torch.compile(fullgraph=True)")
    return [pytest.param(n, marks=pytest.mark.skipif(n == "gptoss" and old, reason=why))
            for n in names]


def train_pair(name, backend):
    """The same random weights under "eager" and ``backend``, in training mode."""
    layers = {"layer_types": ["sliding_attention", "full_attention"]}
    eager = tiny_model(name, TRAIN_CONFIG, TRAIN_WINDOW, sinks_std=1.0,
                       extra={"gemma2": layers, "gptoss": layers})
    ours = copy.deepcopy(eager)
    eager.set_attn_implementation("eager")
    ours.set_attn_implementation(backend)
    return eager.train(), ours.train()


def assert_grad_close(got, want, name):
    assert got is not None, name
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL_REL * float(want.abs().max()),
                               msg=lambda m: f"{name}: {m}")


def assert_grads_close(ours, eager):
    """Every parameter's gradient of ``ours`` close to ``eager``'s (assert_grad_close)."""
    theirs = dict(eager.named_parameters())
    for pname, p in ours.named_parameters():
        assert_grad_close(p.grad, theirs[pname].grad, pname)
