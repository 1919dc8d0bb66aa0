"""Packed sequences (one row of several documents, ``position_ids`` restarting
at each) through attn_implementation="fastattn": each document attends only
to itself through fastattn.torch.attention_varlen, not a (L, L) mask.  Tiny
random Llama, Mistral (sliding window), Gemma 2 (soft cap and window) and
gpt-oss (sinks), in training, against "eager" given the same row (which
builds transformers' packed mask): loss and every gradient; a flattening
collator's ``cu_seq_lens_*``; inference; masks that are not the packed
pattern keep the mask path.  Tolerance as tests/models/test_transformers_training.py."""

import pytest

torch = pytest.importorskip("torch", reason="the transformers backend needs torch")
transformers = pytest.importorskip("transformers", reason="the transformers backend needs "
                                   "transformers (pip install 'fastattn[torch]')")

from fastattn.integrations import transformers as fa_tf  # noqa: E402
from fastattn.integrations import transformers_packed as fa_packed  # noqa: E402
from models_common import (RTOL, TRAIN_CONFIG, TRAIN_MODELS, assert_grads_close,  # noqa: E402
                           train_pair)

fa_tf.register()

DOCS = (10, 6, 1, 9)  # one row of four documents, one of a single token


def _row():
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, TRAIN_CONFIG["vocab_size"], (1, sum(DOCS)), generator=g)
    pos = torch.cat([torch.arange(n) for n in DOCS])[None]
    return {"input_ids": ids, "position_ids": pos, "labels": ids.clone(), "use_cache": False}


def _count_varlen_calls(monkeypatch):
    calls = []
    varlen = fa_tf._varlen

    def counting(q, k, v, cu_q, cu_k, **kw):
        calls.append(cu_q.tolist())
        return varlen(q, k, v, cu_q, cu_k, **kw)

    monkeypatch.setattr(fa_tf, "_varlen", counting)
    return calls


CU = [0, 10, 16, 17, 26]


# (gpt-oss's models in transformers 5.x build no packed mask from position_ids:
# its packed rows are tested through the collator's offsets below)
@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2"])
def test_packed_row_trains_through_varlen_with_eager_loss_and_gradients(name, monkeypatch):
    eager, ours = train_pair(name, fa_tf.NAME)
    batch = _row()
    want = eager(**batch).loss
    calls = _count_varlen_calls(monkeypatch)
    got = ours(**batch).loss
    assert calls == [CU] * TRAIN_CONFIG["num_hidden_layers"]  # every layer, no (L, L) mask read
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want, rtol=RTOL, atol=0)
    assert_grads_close(ours, eager)


def test_flattening_collator_offsets_are_honoured(monkeypatch):
    # DataCollatorWithFlattening(return_flash_attn_kwargs=True) passes the
    # offsets; with the model's cache on, transformers builds no packed mask,
    # and the offsets alone keep the documents apart
    eager, ours = train_pair("mistral", fa_tf.NAME)
    collate = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    g = torch.Generator().manual_seed(3)
    docs = [{"input_ids": torch.randint(3, 100, (n,), generator=g).tolist()} for n in DOCS]
    batch = collate(docs)
    assert batch["cu_seq_lens_q"].tolist() == CU
    calls = _count_varlen_calls(monkeypatch)
    got = ours(**batch).loss
    assert len(calls) == TRAIN_CONFIG["num_hidden_layers"]
    want = eager(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                 labels=batch["labels"], use_cache=False).loss
    torch.testing.assert_close(got, want, rtol=RTOL, atol=0)
    got.backward()
    want.backward()
    assert_grads_close(ours, eager)


@pytest.mark.parametrize("name", TRAIN_MODELS)
def test_collator_offsets_give_each_document_alone(name, monkeypatch):
    # the packed row against eager on each document as its own batch: the
    # same logits, and the same gradients of a weighted sum of them (gpt-oss's
    # sinks included)
    eager, ours = train_pair(name, fa_tf.NAME)
    collate = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    g = torch.Generator().manual_seed(4)
    docs = [torch.randint(3, 100, (n,), generator=g) for n in DOCS]
    batch = collate([{"input_ids": d.tolist()} for d in docs])
    del batch["labels"]
    calls = _count_varlen_calls(monkeypatch)
    got = ours(**batch).logits[0]
    assert calls == [CU] * TRAIN_CONFIG["num_hidden_layers"]
    want = torch.cat([eager(input_ids=d[None], use_cache=False).logits[0] for d in docs])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    w = torch.randn(got.shape, generator=g)
    (got * w).sum().backward()
    (want * w).sum().backward()
    assert_grads_close(ours, eager)


def test_packed_row_inference_matches_eager(monkeypatch):
    eager, ours = train_pair("gemma2", fa_tf.NAME)
    batch = _row()
    del batch["labels"]
    calls = _count_varlen_calls(monkeypatch)
    with torch.no_grad():
        got = ours.eval()(**batch).logits
        want = eager.eval()(**batch).logits
    assert len(calls) == TRAIN_CONFIG["num_hidden_layers"]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _qk(L, heads=2):
    q = torch.zeros(1, heads, L, 4)
    return q, q


def test_a_mask_other_than_the_packed_pattern_keeps_the_mask_path():
    L = 6
    pos = torch.tensor([[0, 1, 2, 0, 1, 2]])
    cu = torch.tensor([0, 3, 6])
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    packed = (j <= i) & ((i < 3) == (j < 3))
    q, k = _qk(L)
    assert fa_tf._packed_rows(q, k, packed[None, None], True, None, None,
                              {"position_ids": pos}).tolist() == cu.tolist()
    floats = torch.where(packed, 0.0, float("-inf"))[None, None]
    assert fa_tf._packed_rows(q, k, floats, True, None, None, {"position_ids": pos}) is not None
    leaky = packed.clone()
    leaky[4, 1] = True  # one key of another document
    assert fa_tf._packed_rows(q, k, leaky[None, None], True, None, None,
                              {"position_ids": pos}) is None
    biased = floats.clone()
    biased[..., 0, 0] = -1.0  # a bias, not a pattern
    assert fa_tf._packed_rows(q, k, biased, True, None, None, {"position_ids": pos}) is None
    # a window the mask does not have, offsets that disagree, two rows, no restart
    assert fa_tf._packed_rows(q, k, packed[None, None], True, (1, 0), None,
                              {"position_ids": pos}) is None
    assert fa_tf._packed_rows(q, k, None, True, None, None,
                              {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu + 0 * cu - torch.tensor(
                                  [0, 1, 0])}) is None
    q2 = torch.zeros(2, 2, L, 4)
    assert fa_tf._packed_rows(q2, q2, None, True, None, None,
                              {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu}) is None
    assert fa_tf._packed_rows(q, k, packed[None, None], True, None, None,
                              {"position_ids": torch.arange(L)[None]}) is None


def test_a_leak_in_a_later_band_of_a_long_mask_is_seen():
    # the pattern is compared a band of rows at a time: a leak past the first band
    L = 2 * fa_packed.PATTERN_ROWS + 88
    pos = torch.cat([torch.arange(300), torch.arange(L - 300)])[None]
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    packed = (j <= i) & ((i < 300) == (j < 300))
    q, k = _qk(L)
    assert fa_tf._packed_rows(q, k, packed[None, None], True, None, None,
                              {"position_ids": pos}).tolist() == [0, 300, L]
    packed[L - 5, 10] = True
    assert fa_tf._packed_rows(q, k, packed[None, None], True, None, None,
                              {"position_ids": pos}) is None


def test_inference_tensor_masks_are_read_each_call():
    # inference tensors have no version counter: the pattern is not memoised
    L = 6
    pos = torch.tensor([[0, 1, 2, 0, 1, 2]])
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    q, k = _qk(L)
    with torch.inference_mode():
        mask = ((j <= i) & ((i < 3) == (j < 3)))[None, None].clone()
        assert fa_tf._packed_rows(q, k, mask, True, None, None,
                                  {"position_ids": pos}).tolist() == [0, 3, 6]
        mask[0, 0, 4, 1] = True  # written in place: no longer the pattern
        assert fa_tf._packed_rows(q, k, mask, True, None, None, {"position_ids": pos}) is None
        compact = torch.ones(1, 1, 1, L, dtype=torch.bool)  # a padding mask's form
        assert fa_tf._packed_rows(q, k, compact, True, None, None, {"position_ids": pos}) is None


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_left_padded_row_under_inference_mode_matches_no_grad(name):
    # generate()'s position ids for a left-padded row look like a restart
    # ([1, 1, 0, 1, 2]): the mask is not the packed pattern, the mask path runs
    _, ours = train_pair(name, fa_tf.NAME)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(3, TRAIN_CONFIG["vocab_size"], (1, 5), generator=g)
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    ours.eval()
    with torch.no_grad():
        want = ours(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    with torch.inference_mode():
        got = ours(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    assert torch.equal(got[0, 2:], want[0, 2:])
