"""Training through attn_implementation="fastattn": tiny random-weight Llama,
Mistral (sliding window shorter than the sequence), Gemma 2 (soft cap and
sliding window) and gpt-oss (sinks, sliding window), built from configs, in
float32 and ``model.train()`` (no dropout in the configs), against "eager":
the loss and every parameter's gradient after one forward and backward, the
losses of five optimizer steps, and gpt-oss's per-layer sinks gradients;
and T5, whose learned relative position bias reaches the backend as
``position_bias`` and gets its gradient through the mask's.

Tolerance: both backends compute in float32 and differ only in the order of
the attention's sums, so a gradient's difference is float32 rounding spread
through two layers: 1e-4 relative, with an absolute floor of 1e-5 of that
parameter's largest gradient (so that entries that nearly cancel, on their
own ~1e-7 relative noise, do not fail the test)."""

import copy

import pytest

torch = pytest.importorskip("torch", reason="the transformers backend needs torch")
transformers = pytest.importorskip("transformers", reason="the transformers backend needs "
                                   "transformers (pip install 'fastattn[torch]')")

import fastattn.torch as fat  # noqa: E402
from fastattn.integrations import transformers as fa_tf  # noqa: E402
from models_common import (RTOL, TRAIN_CONFIG, TRAIN_MODELS, assert_grad_close,  # noqa: E402
                           assert_grads_close, compiled_train_models, train_pair)

fa_tf.register()

SEQ = 16     # four windows long


def _batch():
    """Two sequences, the second right-padded (its padding ignored by the loss)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, TRAIN_CONFIG["vocab_size"], (2, SEQ), generator=g)
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, SEQ - 5:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _count_recorded_calls(monkeypatch):
    """Count fastattn.torch's calls recorded for autograd (the operator path)."""
    calls = []
    traced = fat._traced

    def counting(*args):
        calls.append(args[-1])  # train
        return traced(*args)

    monkeypatch.setattr(fat, "_traced", counting)
    return calls


@pytest.mark.parametrize("name", TRAIN_MODELS)
def test_one_step_loss_and_every_gradient_match_eager(name, monkeypatch):
    eager, ours = train_pair(name, fa_tf.NAME)
    batch = _batch()
    want = eager(**batch).loss
    calls = _count_recorded_calls(monkeypatch)
    got = ours(**batch).loss
    assert calls == [True] * TRAIN_CONFIG["num_hidden_layers"]  # fastattn ran every layer
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want, rtol=RTOL, atol=0)
    theirs = dict(eager.named_parameters())
    n = 0
    for pname, p in ours.named_parameters():
        assert_grad_close(p.grad, theirs[pname].grad, pname)
        n += 1
    assert n == len(theirs)


def test_gpt_oss_sinks_of_every_layer_get_eager_gradient():
    eager, ours = train_pair("gptoss", fa_tf.NAME)
    batch = _batch()
    eager(**batch).loss.backward()
    ours(**batch).loss.backward()
    for a, b in zip(ours.model.layers, eager.model.layers):
        g, w = a.self_attn.sinks.grad, b.self_attn.sinks.grad
        assert g is not None and g.shape == (TRAIN_CONFIG["num_attention_heads"],)
        assert torch.count_nonzero(g) == g.numel()
        assert_grad_close(g, w, "sinks")


def _adam_losses(model, batch, steps=5):
    """The losses of ``steps`` Adam steps on one batch."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    run = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        run.append(loss.detach())
    return torch.stack(run)


@pytest.mark.parametrize("name", TRAIN_MODELS)
def test_five_adam_steps_give_eager_losses(name):
    eager, ours = train_pair(name, fa_tf.NAME)
    want, got = (_adam_losses(m, _batch()) for m in (eager, ours))
    torch.testing.assert_close(got, want, rtol=RTOL, atol=0)
    assert got[-1] < got[0]  # the steps trained


def test_inference_under_no_grad_takes_the_direct_path(monkeypatch):
    _, ours = train_pair("gptoss", fa_tf.NAME)
    ours.eval()

    def refuse(*a, **kw):
        raise AssertionError("the autograd operator path was taken")

    monkeypatch.setattr(fat, "_traced", refuse)
    with torch.no_grad():
        logits = ours(input_ids=_batch()["input_ids"]).logits
    assert logits.grad_fn is None


def test_attention_dropout_in_training_is_refused():
    model = train_pair("llama", fa_tf.NAME)[1]
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    model.set_attn_implementation(fa_tf.NAME)
    model.train()
    with pytest.raises(ValueError, match="dropout_p=0.1"):
        model(input_ids=_batch()["input_ids"])


# qwen2: a full and a windowed layer
@pytest.mark.parametrize("name", compiled_train_models(TRAIN_MODELS + ["qwen2"]))
def test_compiled_training_step_is_one_graph_and_matches_eager(name, monkeypatch):
    # fullgraph=True: the attention and mask functions break no graph (the
    # thread count read once while tracing); every model's loss and gradients
    # as eager, sliding windows, soft cap and sinks included.  A plain causal
    # pattern is known from its mask function without evaluating it, and a
    # sliding window's from what transformers declares with it: every traced
    # call gets the padding alone (fastattn's causal path, with the layer's
    # window), not the (L, S) mask
    torch._dynamo.reset()
    eager, ours = train_pair(name, fa_tf.NAME)
    seen = []
    sdpa = fa_tf._sdpa

    def spying(q, k, v, mask, *args, key_padding_mask=None, **kw):
        seen.append((mask is None, key_padding_mask is not None))
        return sdpa(q, k, v, mask, *args, key_padding_mask=key_padding_mask, **kw)

    monkeypatch.setattr(fa_tf, "_sdpa", spying)
    batch = _batch()
    got = torch.compile(ours, backend="aot_eager", fullgraph=True)(**batch).loss
    assert len(seen) == TRAIN_CONFIG["num_hidden_layers"]  # traced once per layer
    assert seen == [(True, True)] * len(seen)
    want = eager(**batch).loss
    torch.testing.assert_close(got, want, rtol=RTOL, atol=0)
    got.backward()
    want.backward()
    assert_grads_close(ours, eager)
    torch._dynamo.reset()


def _t5_pair():
    """A tiny random T5 (encoder and decoder of two layers, relative position
    buckets, no dropout) under "eager" and fastattn, in training mode."""
    cfg = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                num_decoder_layers=2, num_heads=4,
                                relative_attention_num_buckets=8, dropout_rate=0.0,
                                decoder_start_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    eager = transformers.T5ForConditionalGeneration(cfg)
    ours = copy.deepcopy(eager)
    eager.set_attn_implementation("eager")
    ours.set_attn_implementation(fa_tf.NAME)
    return eager.train(), ours.train()


def _t5_batch():
    """Two source sequences, the second right-padded, and their targets."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 100, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0
    return {"input_ids": ids, "attention_mask": mask,
            "labels": torch.randint(3, 100, (2, 7), generator=g)}


def test_t5_learned_position_bias_trains_as_eager(monkeypatch):
    eager, ours = _t5_pair()
    batch = _t5_batch()
    calls = _count_recorded_calls(monkeypatch)
    got = ours(**batch).loss
    assert calls and all(calls)  # fastattn ran the layers, recorded for autograd
    want = eager(**batch).loss
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want, rtol=RTOL, atol=0)
    assert_grads_close(ours, eager)
    for stack in (ours.encoder, ours.decoder):
        bias = stack.block[0].layer[0].SelfAttention.relative_attention_bias.weight
        assert torch.count_nonzero(bias.grad) > 0
    want, got = (_adam_losses(m, batch) for m in (eager, ours))
    torch.testing.assert_close(got, want, rtol=RTOL, atol=0)
