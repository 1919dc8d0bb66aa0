"""Tiny random-weight transformers models built from configs, for the tests of
this folder (which import transformers and torch first, skipping without them)."""
import torch
import transformers

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
