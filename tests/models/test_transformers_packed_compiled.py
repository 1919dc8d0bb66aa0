"""Packed rows under torch.compile through attn_implementation="fastattn": a
traced call with a flattening collator's offsets, or with position_ids and a
mask, becomes the operator fastattn::packed_rows, which runs the documents
alone where it finds them and the mask to be their pattern (or, for the
collator's offsets, the row's own) and reads the mask otherwise -- the eager
call's result either way.  Tiny random models compiled whole
(fullgraph=True) with the aot_eager backend (the operator's own code runs; no
C++ build), against eager on each document alone; the operator's decisions,
torch.library.opcheck and float64 gradcheck on both branches."""

import pytest

torch = pytest.importorskip("torch", reason="the transformers backend needs torch")
transformers = pytest.importorskip("transformers", reason="the transformers backend needs "
                                   "transformers (pip install 'fastattn[torch]')")

from fastattn.integrations import transformers as fa_tf  # noqa: E402
from fastattn.integrations import transformers_packed as fa_packed  # noqa: E402
from models_common import (TRAIN_CONFIG, assert_grads_close, compiled_train_models,  # noqa: E402
                           train_pair)

fa_tf.register()

DOCS = (10, 6, 1, 9)  # one row of four documents, one of a single token
LAYERS = TRAIN_CONFIG["num_hidden_layers"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # every test compiles new models of the same classes: no recompile limit
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _count_calls(monkeypatch):
    """The operator's calls of the packed kernels: (forward, backward) lists."""
    calls = ([], [])
    fwd, bwd = fa_packed._attention_varlen, fa_packed._attention_varlen_backward

    def forward(q, k, v, cu_q, cu_k, **kw):
        calls[0].append(cu_q.tolist())
        return fwd(q, k, v, cu_q, cu_k, **kw)

    def backward(*args, **kw):
        calls[1].append(1)
        return bwd(*args, **kw)

    monkeypatch.setattr(fa_packed, "_attention_varlen", forward)
    monkeypatch.setattr(fa_packed, "_attention_varlen_backward", backward)
    return calls


def _collated(seed, offsets=True):
    collate = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=offsets)
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(3, 100, (n,), generator=g) for n in DOCS]
    batch = collate([{"input_ids": d.tolist()} for d in docs])
    del batch["labels"]
    return docs, batch, g


def _compiled_documents_alone(name, monkeypatch, offsets):
    """A tiny ``name`` model compiled, on a collated row (with or without the
    offsets) against eager on each document alone: the packed kernels ran in
    every layer, forward and backward; logits and gradients alike."""
    eager, ours = train_pair(name, fa_tf.NAME)
    docs, batch, g = _collated(4, offsets)
    assert ("cu_seq_lens_q" in batch) == offsets
    # with the offsets, the model's cache on: transformers builds the row's
    # causal mask, not the packed one (the offsets stand against it); without
    # them, off: the packed mask from position_ids
    cache = {} if offsets else {"use_cache": False}
    calls = _count_calls(monkeypatch)
    got = torch.compile(ours, backend="aot_eager", fullgraph=True)(**batch, **cache).logits[0]
    assert calls[0] == [[0, 10, 16, 17, 26]] * LAYERS  # no (L, L) mask read by the kernels
    want = torch.cat([eager(input_ids=d[None], use_cache=False).logits[0] for d in docs])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    w = torch.randn(got.shape, generator=g)
    (got * w).sum().backward()
    (want * w).sum().backward()
    assert len(calls[1]) == LAYERS
    assert_grads_close(ours, eager)


@pytest.mark.parametrize("name", compiled_train_models())
def test_compiled_row_with_collator_offsets_gives_each_document_alone(name, monkeypatch):
    _compiled_documents_alone(name, monkeypatch, offsets=True)


# DataCollatorWithFlattening's default: position_ids alone; transformers builds
# the packed mask from them, which the operator finds their pattern.  (gpt-oss's
# models in transformers 5.x build no packed mask from position_ids: without the
# collator's offsets its row is read through the mask, eager or compiled.)
@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2"])
def test_compiled_row_of_restarting_positions_gives_each_document_alone(name, monkeypatch):
    _compiled_documents_alone(name, monkeypatch, offsets=False)


def test_compiled_row_of_one_sequence_reads_its_mask(monkeypatch):
    eager, ours = train_pair("mistral", fa_tf.NAME)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 100, (1, 20), generator=g)
    calls = _count_calls(monkeypatch)
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    got = compiled(input_ids=ids, use_cache=False).logits
    assert calls[0] == []
    torch.testing.assert_close(got, eager(input_ids=ids, use_cache=False).logits, rtol=1e-4,
                               atol=1e-5)


def test_compiled_offsets_the_mask_contradicts_keep_the_mask(monkeypatch):
    # the row's position_ids make transformers build the packed mask of DOCS;
    # offsets that cut the row elsewhere are neither that pattern nor the
    # row's own: the mask is read, as the eager call reads it
    eager, ours = train_pair("llama", fa_tf.NAME)
    _, batch, _ = _collated(5)
    wrong = torch.tensor([0, 13, 26], dtype=batch["cu_seq_lens_q"].dtype)
    batch.update(cu_seq_lens_q=wrong, cu_seq_lens_k=wrong, use_cache=False)
    calls = _count_calls(monkeypatch)
    got = torch.compile(ours, backend="aot_eager", fullgraph=True)(**batch).logits
    assert calls[0] == []
    want = eager(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                 use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# the operator itself
# ---------------------------------------------------------------------------

L, H, HKV, E = 9, 4, 2, 8
CU = torch.tensor([0, 4, 9])


def _qkv(dtype=torch.float32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, L, H, E, generator=g, dtype=dtype).transpose(1, 2)  # transformers' view
    k = torch.randn(1, L, HKV, E, generator=g, dtype=dtype).transpose(1, 2)
    v = torch.randn(1, L, HKV, E, generator=g, dtype=dtype).transpose(1, 2)
    sinks = torch.randn(H, generator=g, dtype=dtype)
    return [x.detach().requires_grad_(grad) for x in (q, k, v, sinks)]


def _pattern(cu, causal=True):
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    seg = torch.searchsorted(cu[1:], torch.arange(L), right=True)
    attend = seg[:, None] == seg[None, :]
    return (attend & (j <= i) if causal else attend)[None, None]


MASKS = {
    "documents": lambda: _pattern(CU),
    "row_causal": lambda: _pattern(torch.tensor([0, L])),
    "no_mask": lambda: None,
    "leaky": lambda: _pattern(CU).index_put_((torch.tensor([0]), torch.tensor([0]),
                                              torch.tensor([6]), torch.tensor([1])),
                                             torch.tensor(True)),
}
ALONE = {"documents": 1, "row_causal": 1, "no_mask": 1, "leaky": 0}


POSITIONS = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4]])  # CU's documents


def _op(q, k, v, mask, cu, sinks, causal=True, positions=None):
    return torch.ops.fastattn.packed_rows(q, k, v, mask, cu, cu, positions, causal, -1, -1,
                                          None, None, sinks, 1)


@pytest.mark.parametrize("mask", list(MASKS))
def test_operator_runs_documents_alone_only_where_the_mask_allows(mask):
    q, k, v, sinks = _qkv()
    m = MASKS[mask]()
    out, lse, alone = _op(q, k, v, m, CU, sinks)
    assert int(alone) == ALONE[mask]
    if ALONE[mask]:
        q3, k3, v3 = (x[0].transpose(0, 1) for x in (q, k, v))  # (L, heads, E)
        want = fa_tf._varlen(q3, k3, v3, CU, CU, is_causal="lower_right", sinks=sinks)
    else:
        want = fa_tf._sdpa(q, k, v, m, 0.0, False, None, True, sinks=sinks).transpose(1, 2)[0]
    torch.testing.assert_close(out[0], want, rtol=0, atol=0)


# the documents found from position_ids need a mask, and it must be their pattern
POSITION_CASES = {"documents": 1, "row_causal": 0, "no_mask": 0, "leaky": 0}


@pytest.mark.parametrize("mask", list(POSITION_CASES))
def test_operator_finds_documents_from_positions_only_with_their_pattern(mask):
    q, k, v, sinks = _qkv()
    m = MASKS[mask]()
    out, _, alone = _op(q, k, v, m, None, sinks, positions=POSITIONS)
    assert int(alone) == POSITION_CASES[mask]
    found = fa_tf._packed_rows(q, k, m, True, None, None, {"position_ids": POSITIONS})
    assert (found is not None) == bool(POSITION_CASES[mask])
    with_offsets, _, _ = _op(q, k, v, m, CU, sinks)
    if POSITION_CASES[mask]:
        torch.testing.assert_close(out, with_offsets, rtol=0, atol=0)


def test_offsets_from_position_ids_do_not_stand_against_the_row_pattern():
    q, k, _, _ = _qkv()
    row = _pattern(torch.tensor([0, L]))
    assert fa_tf._packed_rows(q, k, row, True, None, None, {"position_ids": POSITIONS}) is None
    got = fa_tf._packed_rows(q, k, row, True, None, None,
                             {"cu_seq_lens_q": CU, "cu_seq_lens_k": CU})
    assert got.tolist() == CU.tolist()


@pytest.mark.parametrize("mask, positions", [("documents", False), ("leaky", False),
                                             ("no_mask", False), ("documents", True)],
                         ids=["documents", "leaky", "no_mask", "documents_from_positions"])
def test_operator_passes_opcheck(mask, positions):
    q, k, v, sinks = _qkv(grad=True)
    cu = None if positions else CU
    torch.library.opcheck(torch.ops.fastattn.packed_rows,
                          (q, k, v, MASKS[mask](), cu, cu, POSITIONS if positions else None,
                           True, -1, -1, 0.3, 5.0, sinks, 1))


@pytest.mark.parametrize("mask, window, positions",
                         [("documents", None, False), ("no_mask", (2, 0), False),
                          ("leaky", None, False), ("documents", None, True)],
                         ids=["documents_alone", "documents_alone_window", "mask_read",
                              "documents_from_positions"])
def test_operator_gradients_match_finite_differences_in_float64(mask, window, positions):
    q, k, v, sinks = _qkv(torch.float64, grad=True)
    m = MASKS[mask]()
    cu, pos = (None, POSITIONS) if positions else (CU, None)
    _, _, alone = _op(q, k, v, m, cu, sinks, positions=pos)
    assert int(alone) == ALONE[mask]
    wl, wr = (-1, -1) if window is None else window

    def f(q, k, v, sinks):  # the result and each row's lse, both differentiable
        return torch.ops.fastattn.packed_rows(q, k, v, m, cu, cu, pos, True, wl, wr, 0.5, 4.0,
                                              sinks, 1)[:2]

    assert torch.autograd.gradcheck(f, (q, k, v, sinks))
