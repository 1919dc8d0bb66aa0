"""Parity with the models' own attention: Mistral, Gemma 2, gpt-oss, BLOOM.

Tiny random-weight models are built from ``transformers`` configs (nothing
downloaded) and run once in float32 on random hidden states.  The inputs
their attention layers receive (queries and keys after the rotary
embedding, the model's own dense mask, scaling, sliding window, soft cap,
sinks) and the eager outputs are captured, then compared with
``fastattn.attention`` given the native options instead of the dense mask:

* Mistral's ``sliding_window=W`` (the window counts the current token) is
  ``window=(W - 1, 0)`` with ``is_causal=True``;
* Gemma 2's ``attn_logit_softcapping`` is ``softcap`` (sliding layers also
  take the window);
* gpt-oss's per-head ``sinks`` parameter is ``sinks`` (sliding layers also
  take the window);
* BLOOM's ALiBi (``slope * j`` added to the scores, which equals
  ``-slope * |i - j|`` up to a per-row constant under the causal mask) is
  ``alibi_slopes`` with the slopes of ``build_alibi_tensor``.

torch SDPA with the equivalent dense mask checks the same outputs wherever
the option has one (the window, the slope bias, a sink as an extra key of
zero value whose bias is the sink logit); a soft cap has none.  Every case
also checks that the option changes the result, so that it is exercised.

Skipped when torch or transformers is not installed.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (needed for the model parity tests)")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (needed for the model parity tests)")
F = torch.nn.functional

import fastattn  # noqa: E402

L = 48        # tokens: several windows long
WINDOW = 12   # transformers' sliding_window: the current token and 11 before it
ATOL = 2e-5   # float32 everywhere; outputs are O(1)


def _capture_eager(monkeypatch, module):
    """Replace ``module.eager_attention_forward`` by a wrapper recording each
    call's (module, query, key, value, mask, kwargs) and its output."""
    calls = []
    eager = module.eager_attention_forward

    def recording(mod, query, key, value, attention_mask, *args, **kwargs):
        out, weights = eager(mod, query, key, value, attention_mask, *args, **kwargs)
        calls.append({"module": mod, "query": query.detach().clone(), "key": key.detach().clone(),
                      "value": value.detach().clone(),
                      "mask": None if attention_mask is None else attention_mask.detach().clone(),
                      "kwargs": kwargs, "out": out.detach().clone()})
        return out, weights

    monkeypatch.setattr(module, "eager_attention_forward", recording)
    return calls


def _run_model(model_cls, config, seed=0):
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    hidden = torch.randn(1, L, config.hidden_size)
    with torch.no_grad():
        model(inputs_embeds=hidden)
    return model


def _np(t):
    return t.detach().numpy()


def _scaling(call):
    """The scale the layer passed (or its own)."""
    kw = call["kwargs"]
    return kw["scaling"] if kw.get("scaling") is not None else call["module"].scaling


def _ours(call, **options):
    """fastattn on a captured call, heads first; (B, L, H, D) as the eager output."""
    q, k, v = _np(call["query"]), _np(call["key"]), _np(call["value"])
    out = fastattn.attention(q, k, v, scale=_scaling(call), enable_gqa=q.shape[1] != k.shape[1],
                             is_causal=True, **options)
    return np.swapaxes(out, 1, 2)


def _sdpa(call, mask_bias, sink=None):
    """torch SDPA on a captured call with a float (L, S) or (H, L, S) bias; a
    sink (H,) joins as one more key of zero value whose bias is the sink."""
    q, k, v = call["query"], call["key"], call["value"]
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    bias = torch.as_tensor(mask_bias, dtype=q.dtype).expand(q.shape[0], q.shape[1], L, L)
    if sink is not None:
        k = torch.cat([k, torch.zeros_like(k[:, :, :1])], dim=2)
        v = torch.cat([v, torch.zeros_like(v[:, :, :1])], dim=2)
        col = torch.as_tensor(sink, dtype=q.dtype).reshape(1, -1, 1, 1).expand(*bias.shape[:3], 1)
        bias = torch.cat([bias, col], dim=-1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=_scaling(call))
    return _np(out.transpose(1, 2))


def _band_bias(window):
    """0 where key j is visible from query i (causal, within the window), -inf elsewhere."""
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    seen = j <= i
    if window is not None:
        seen &= j > i - window
    return np.where(seen, 0.0, -np.inf).astype(np.float32)


def _assert_visible_mask(call, window):
    """The model's own dense mask hides exactly what the native options hide."""
    mask = call["mask"]
    assert mask is not None
    seen = _np(mask[0, 0]) > np.finfo(np.float32).min / 2
    np.testing.assert_array_equal(seen, _band_bias(window) == 0)


def _check(call, want_window, options, sdpa_bias=None, sink=None):
    eager = _np(call["out"])
    window = (want_window - 1, 0) if want_window else None
    ours = _ours(call, window=window, **options)
    np.testing.assert_allclose(ours, eager, rtol=1e-4, atol=ATOL)
    if sdpa_bias is not None:
        np.testing.assert_allclose(_sdpa(call, sdpa_bias, sink), eager, rtol=1e-4, atol=ATOL)
    # the options matter here: without them the result is clearly different
    plain = _ours(call, window=None)
    assert np.abs(plain - eager).max() > 100 * ATOL


def test_mistral_sliding_window(monkeypatch):
    from transformers import MistralConfig, MistralModel
    from transformers.models.mistral import modeling_mistral

    calls = _capture_eager(monkeypatch, modeling_mistral)
    config = MistralConfig(vocab_size=16, hidden_size=64, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, sliding_window=WINDOW, initializer_range=0.3,
                           attn_implementation="eager")
    _run_model(MistralModel, config)
    assert len(calls) == 1
    call = calls[0]
    assert call["kwargs"]["sliding_window"] == WINDOW
    _assert_visible_mask(call, WINDOW)
    _check(call, WINDOW, {}, sdpa_bias=_band_bias(WINDOW))


def test_gemma2_softcap_and_window(monkeypatch):
    from transformers import Gemma2Config, Gemma2Model
    from transformers.models.gemma2 import modeling_gemma2

    calls = _capture_eager(monkeypatch, modeling_gemma2)
    config = Gemma2Config(vocab_size=16, hidden_size=64, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                          attn_logit_softcapping=2.0, initializer_range=0.3,
                          layer_types=["sliding_attention", "full_attention"],
                          attn_implementation="eager")
    _run_model(Gemma2Model, config)
    assert [c["kwargs"]["sliding_window"] for c in calls] == [WINDOW, None]
    for call in calls:
        cap = call["kwargs"]["softcap"]
        assert cap == 2.0
        window = call["kwargs"]["sliding_window"]
        _assert_visible_mask(call, window)
        _check(call, window, {"softcap": cap})
        # the cap matters: the window alone gives a different result
        alone = _ours(call, window=(window - 1, 0) if window else None)
        assert np.abs(alone - _np(call["out"])).max() > 100 * ATOL


def test_gpt_oss_sinks_and_window(monkeypatch):
    from transformers import GptOssConfig, GptOssModel
    from transformers.models.gpt_oss import modeling_gpt_oss

    calls = _capture_eager(monkeypatch, modeling_gpt_oss)
    config = GptOssConfig(vocab_size=16, hidden_size=64, intermediate_size=32,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, sliding_window=WINDOW, num_local_experts=2,
                          num_experts_per_tok=1, initializer_range=0.3,
                          layer_types=["sliding_attention", "full_attention"],
                          attn_implementation="eager")
    torch.manual_seed(1)
    model = GptOssModel(config).eval()
    with torch.no_grad():
        for layer in model.layers:  # sinks of either sign, large enough to matter
            layer.self_attn.sinks.copy_(torch.tensor([-1.0, 0.5, 2.0, 1.0]))
        model(inputs_embeds=torch.randn(1, L, config.hidden_size))
    assert [c["kwargs"]["sliding_window"] for c in calls] == [WINDOW, None]
    for call in calls:
        sinks = _np(call["kwargs"]["s_aux"]).astype(np.float64)
        window = call["kwargs"]["sliding_window"]
        _assert_visible_mask(call, window)
        _check(call, window, {"sinks": sinks}, sdpa_bias=_band_bias(window), sink=sinks)
        alone = _ours(call, window=(window - 1, 0) if window else None)
        assert np.abs(alone - _np(call["out"])).max() > 100 * ATOL


def test_bloom_alibi():
    from transformers import BloomConfig, BloomModel
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    config = BloomConfig(vocab_size=16, hidden_size=64, n_layer=1, n_head=4,
                         initializer_range=0.3, attn_implementation="eager")
    torch.manual_seed(0)
    model = BloomModel(config).eval()
    attn = model.h[0].self_attention
    seen = {}

    def pre(mod, args, kwargs):
        seen.update(kwargs)
        seen["args"] = args

    def post(mod, args, kwargs, output):
        seen["out"] = output[0] if isinstance(output, tuple) else output

    attn.register_forward_pre_hook(pre, with_kwargs=True)
    attn.register_forward_hook(post, with_kwargs=True)
    with torch.no_grad():
        model(inputs_embeds=torch.randn(1, L, config.hidden_size))
    hidden = seen["args"][0] if seen["args"] else seen["hidden_states"]
    residual = seen["args"][1] if len(seen["args"]) > 1 else seen["residual"]
    alibi = seen["alibi"]
    H = config.n_head
    # the slopes: build_alibi_tensor on one token is slope * 0; on two, slope * 1
    slopes = _np(build_alibi_tensor(torch.ones(1, 2), H, torch.float64)[:, 0, 1])
    np.testing.assert_allclose(_np(alibi).reshape(H, L), slopes[:, None] * np.arange(L),
                               rtol=1e-6)
    with torch.no_grad():  # the layer's own projections
        q, k, v = attn._reshape(attn.query_key_value(hidden))
    call = {"query": q, "key": k, "value": v,  # (B, H, L, D) already
            "module": attn, "kwargs": {"scaling": float(attn.inv_norm_factor)}}

    def layer_out(ctx):  # heads merged, then the layer's dense projection and residual
        with torch.no_grad():
            return _np(attn.dense(torch.from_numpy(np.ascontiguousarray(ctx)).reshape(1, L, -1))
                       + residual)

    eager = _np(seen["out"])
    ours = layer_out(_ours(call, alibi_slopes=slopes))
    np.testing.assert_allclose(ours, eager, rtol=1e-4, atol=ATOL)
    bias = -slopes[:, None, None] * np.abs(np.arange(L)[:, None] - np.arange(L)[None, :])
    torch_ = layer_out(_sdpa(call, (bias + _band_bias(None)).astype(np.float32)))
    np.testing.assert_allclose(torch_, eager, rtol=1e-4, atol=ATOL)
    plain = layer_out(_ours(call))
    assert np.abs(plain - eager).max() > 100 * ATOL
