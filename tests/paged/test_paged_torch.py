"""fastattn.torch.attention_paged and paged_append: tensors read and written
in place (zero-copy), the same results as the NumPy functions, and both as
custom operators under torch.compile and torch.export (skipped without
torch)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="fastattn.torch needs torch")
import fastattn  # noqa: E402
import fastattn.torch as fat  # noqa: E402
from paged_common import make_batch  # noqa: E402


def test_tensors_match_the_numpy_function(rng):
    a = make_batch(rng, [40, 300], [1, 12], block_size=16)
    ref, ref_lse = fastattn.attention_paged(a["query"], a["key_cache"], a["value_cache"],
                                            a["block_table"], a["seq_lens"],
                                            cu_seqlens_q=a["cu_seqlens_q"], return_lse=True)
    t = {k: torch.from_numpy(v) for k, v in a.items() if isinstance(v, np.ndarray)}
    out, lse = fat.attention_paged(t["query"], t["key_cache"], t["value_cache"],
                                   t["block_table"], t["seq_lens"],
                                   cu_seqlens_q=t["cu_seqlens_q"], return_lse=True)
    np.testing.assert_array_equal(out.numpy(), ref)
    np.testing.assert_array_equal(lse.numpy(), ref_lse)


def test_caches_are_read_in_place_and_out_written_in_place(rng):
    # an HND pool that is a strided view of a larger tensor: no copy is made
    big = torch.randn(6, 2, 16, 16)
    kc, vc = big[..., :8], big[..., 8:]
    q = torch.randn(1, 2, 8)
    table, lens = torch.tensor([[5, 0]], dtype=torch.int32), torch.tensor([20])
    out = torch.empty(1, 2, 8)
    got = fat.attention_paged(q, kc, vc, table, lens, layout="HND", out=out)
    assert got is out
    first = out.clone()
    kc[0, :, 0] += 1.0                   # position 16 of the sequence, seen in place
    fat.attention_paged(q, kc, vc, table, lens, layout="HND", out=out)
    assert not torch.equal(first, out)


def test_out_as_a_numpy_array_is_refused_unwritten():
    # the torch function returns tensors: an array is refused before anything is written
    kc = torch.randn(4, 2, 2, 8)
    table, lens = torch.tensor([[0, 1], [2, 3]]), torch.tensor([3, 4])
    out = np.full((2, 2, 8), 7.0, np.float32)
    with pytest.raises(TypeError, match="out must be a torch.Tensor, got ndarray"):
        fat.attention_paged(torch.randn(2, 2, 8), kc, kc, table, lens, out=out)
    assert bool((out == 7.0).all())


def test_bfloat16_caches(rng):
    a = make_batch(rng, [50], dtype="bfloat16")
    kc = torch.from_numpy(a["key_cache"].view(np.int16)).view(torch.bfloat16)
    vc = torch.from_numpy(a["value_cache"].view(np.int16)).view(torch.bfloat16)
    q = torch.from_numpy(a["query"]).to(torch.bfloat16)
    out = fat.attention_paged(q, kc, vc, torch.from_numpy(a["block_table"]),
                              torch.from_numpy(a["seq_lens"]))
    assert out.dtype == torch.bfloat16 and out.shape == (1, 4, 8)
    ref = fastattn.attention_paged(a["query"].astype(a["key_cache"].dtype), a["key_cache"],
                                   a["value_cache"], a["block_table"], a["seq_lens"])
    np.testing.assert_array_equal(out.float().numpy(), ref.astype(np.float32))


def test_a_tensor_off_the_cpu_is_refused_naming_it():
    meta = torch.empty(2, 16, 1, 8, device="meta")
    with pytest.raises(ValueError, match="key_cache is a meta tensor"):
        fat.attention_paged(torch.zeros(1, 1, 8), meta, meta, torch.zeros(1, 1, dtype=torch.int32),
                            torch.tensor([1]))


def _bf16(a):
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_append_writes_bfloat16_tensors_in_place_as_the_numpy_function(rng, layout):
    import ml_dtypes
    shape = (3, 4, 2, 8) if layout == "NHD" else (3, 2, 4, 8)
    kc = np.zeros(shape, ml_dtypes.bfloat16)
    vc = np.zeros(shape, ml_dtypes.bfloat16)
    key = rng.standard_normal((5, 2, 8)).astype(np.float32)
    value = rng.standard_normal((5, 2, 8)).astype(np.float32)
    slots = np.array([7, -1, 0, 11, 4])
    tk, tv = _bf16(kc), _bf16(vc)
    fat.paged_append(tk, tv, torch.from_numpy(slots), torch.from_numpy(key),
                     torch.from_numpy(value), layout=layout)
    fastattn.paged_append(kc, vc, slots, key, value, layout=layout)
    np.testing.assert_array_equal(tk.view(torch.int16).numpy(), kc.view(np.int16))
    np.testing.assert_array_equal(tv.view(torch.int16).numpy(), vc.view(np.int16))
    assert tk.float().abs().sum() > 0


def test_append_int8_caches_writes_levels_and_scales(rng):
    kc, vc = torch.zeros(2, 4, 1, 8, dtype=torch.int8), torch.zeros(2, 4, 1, 8, dtype=torch.int8)
    ks, vs = torch.zeros(2, 4, 1), torch.zeros(2, 4, 1)
    key = torch.from_numpy(rng.standard_normal((3, 1, 8)).astype(np.float32))
    fat.paged_append(kc, vc, torch.tensor([1, 6, 2]), key, 2 * key, key_scales=ks,
                     value_scales=vs)
    assert float(ks[1, 2, 0]) == pytest.approx(float(key[1].abs().max()) / 127, rel=1e-6)
    back = (kc.float() * ks[..., None]).reshape(8, 1, 8)[[1, 6, 2]]
    torch.testing.assert_close(back, key, atol=float(key.abs().max()) / 254, rtol=0)
    assert float(vs[0, 1, 0]) == pytest.approx(2 * float(ks[0, 1, 0]), rel=1e-6)


def test_append_slot_outside_the_pool_names_it_and_writes_nothing():
    kc, vc = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    with pytest.raises(ValueError, match="slot_mapping"):
        fat.paged_append(kc, vc, torch.tensor([3, 8]), torch.ones(2, 1, 8), torch.ones(2, 1, 8))
    assert not kc.any() and not vc.any()


def _decode_args():
    g = torch.Generator().manual_seed(1)
    kc, vc = torch.randn(6, 16, 2, 8, generator=g), torch.randn(6, 16, 2, 8, generator=g)
    table = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
    return kc, vc, table, torch.tensor([20, 40]), torch.randn(2, 4, 8, generator=g)


def test_opcheck_passes_for_the_paged_operators():
    kc, vc, table, lens, q = _decode_args()
    torch.library.opcheck(torch.ops.fastattn.attention_paged.default,
                          (q, kc, vc, table, lens, None, None, None,
                           torch.tensor([0.5, 0.25, 0.1, 0.0]), torch.zeros(4), "NHD", 0.3, True,
                           17, -1, 5.0, None))
    torch.library.opcheck(torch.ops.fastattn.paged_append.default,
                          (kc, vc, torch.tensor([40, -1]), torch.randn(2, 2, 8),
                           torch.randn(2, 2, 8), "NHD", None, None))
    k8, v8 = torch.zeros(2, 4, 1, 8, dtype=torch.int8), torch.zeros(2, 4, 1, 8, dtype=torch.int8)
    torch.library.opcheck(torch.ops.fastattn.paged_append.default,
                          (k8, v8, torch.tensor([5]), torch.randn(1, 1, 8), torch.randn(1, 1, 8),
                           "NHD", torch.zeros(2, 4, 1), torch.zeros(2, 4, 1)))


def _step(kc, vc, table, lens, q, new_k, new_v, slots, out):
    """A decoding step as an engine writes it: the new rows appended, then
    attention over the pages into a preallocated output."""
    fat.paged_append(kc, vc, slots, new_k, new_v)
    o, lse = fat.attention_paged(q, kc, vc, table, lens + 1, window=(16, 0), softcap=20.0,
                                 return_lse=True, out=out)
    return torch.tanh(o) * lse.T[..., None]


def test_a_decoding_step_compiles_in_one_graph_and_matches_eager():
    kc, vc, table, lens, q = _decode_args()
    g = torch.Generator().manual_seed(2)
    new_k, new_v = torch.randn(2, 2, 8, generator=g), torch.randn(2, 2, 8, generator=g)
    slots = torch.tensor([1 * 16 + 4, 3 * 16 + 8])  # position 20 of one, 40 of the other
    kc2, vc2 = kc.clone(), vc.clone()
    out, out2 = torch.empty(2, 4, 8), torch.empty(2, 4, 8)
    torch._dynamo.reset()
    f = torch.compile(_step, fullgraph=True, backend="aot_eager")
    got = f(kc, vc, table, lens, q, new_k, new_v, slots, out)
    want = _step(kc2, vc2, table, lens, q, new_k, new_v, slots, out2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2) and torch.equal(out, out2)
    assert torch.equal(kc[1, 4], new_k[0]) and torch.equal(vc[3, 8], new_v[1])


def test_export_holds_the_paged_operators():
    class Step(torch.nn.Module):
        def forward(self, kc, vc, table, lens, q, new_k, new_v, slots):
            fat.paged_append(kc, vc, slots, new_k, new_v)
            return fat.attention_paged(q, kc, vc, table, lens + 1)

    kc, vc, table, lens, q = _decode_args()
    args = (kc, vc, table, lens, q, torch.ones(2, 2, 8), torch.ones(2, 2, 8),
            torch.tensor([1 * 16 + 4, 3 * 16 + 8]))
    ep = torch.export.export(Step(), args)
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"fastattn.attention_paged.default", "fastattn.paged_append.default"} <= targets


def test_caches_held_as_parameters_go_through_the_operators_once():
    # a Tensor subclass takes the dispatcher's way, whose implementation
    # must not route the call back to the dispatcher
    kc, vc, table, lens, q = _decode_args()
    pk = torch.nn.Parameter(kc.clone(), requires_grad=False)
    pv = torch.nn.Parameter(vc.clone(), requires_grad=False)
    new = torch.ones(2, 2, 8)
    fat.paged_append(pk, pv, torch.tensor([1 * 16 + 4, 3 * 16 + 8]), new, 2 * new)
    fat.paged_append(kc, vc, torch.tensor([1 * 16 + 4, 3 * 16 + 8]), new, 2 * new)
    assert torch.equal(pk.data, kc) and torch.equal(pv.data, vc)
    torch.testing.assert_close(fat.attention_paged(q, pk, pv, table, lens + 1),
                               fat.attention_paged(q, kc, vc, table, lens + 1), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["query", "key_cache", "sinks"])
def test_an_input_requiring_grad_is_refused_not_silently_detached(name):
    # attention_paged has no backward: the result used to carry no gradient
    kc, vc, table, lens, q = _decode_args()
    args = {"query": q, "key_cache": kc, "sinks": torch.zeros(4)}
    args[name] = args[name].clone().requires_grad_(True)
    with pytest.raises(ValueError, match=f"{name} requires grad.*inference only"):
        fat.attention_paged(args["query"], args["key_cache"], vc, table, lens,
                            sinks=args["sinks"])
    with torch.no_grad():
        out = fat.attention_paged(args["query"], args["key_cache"], vc, table, lens,
                                  sinks=args["sinks"])
    assert not out.requires_grad


def test_a_block_table_as_a_list_with_parameter_caches_is_taken_as_eagerly():
    # a Parameter sends the call to the operator, whose schema refused lists
    kc, vc, table, lens, q = _decode_args()
    pk = torch.nn.Parameter(kc.clone(), requires_grad=False)
    want = fat.attention_paged(q, kc, vc, table, lens)
    got = fat.attention_paged(q, pk, vc, table.tolist(), lens.tolist())
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_append_into_an_expanded_cache_tensor_is_refused_unwritten():
    # torch refuses in-place writes to it; the NumPy view wrote two slots to one place
    base = torch.zeros(1, 4, 1, 2)
    kc, vc = base.expand(3, 4, 1, 2), torch.zeros(3, 4, 1, 2)
    with pytest.raises(ValueError, match="key_cache's strides .* same memory"):
        fat.paged_append(kc, vc, torch.tensor([1, 5]), torch.ones(2, 1, 2), torch.ones(2, 1, 2))
    assert not base.any() and not vc.any()


@pytest.mark.parametrize("name", ["key_cache", "key_scales"])
def test_append_into_a_cache_that_requires_grad_is_refused_in_grad_mode(name):
    kc, vc = torch.zeros(2, 4, 1, 2, dtype=torch.int8), torch.zeros(2, 4, 1, 2, dtype=torch.int8)
    ks, vs = torch.zeros(2, 4, 1), torch.zeros(2, 4, 1)
    if name == "key_cache":  # (only float caches can require grad)
        kc, vc = torch.zeros(2, 4, 1, 2, requires_grad=True), torch.zeros(2, 4, 1, 2)
        scales = {}
    else:
        ks.requires_grad_(True)
        scales = dict(key_scales=ks, value_scales=vs)
    rows = torch.ones(1, 1, 2)
    with pytest.raises(ValueError, match=f"{name} requires grad, and writing into it is not "
                                         f"differentiable"):
        fat.paged_append(kc, vc, torch.tensor([1]), rows, rows, **scales)
    assert not kc.detach().any() and not ks.detach().any()
    with torch.no_grad():
        fat.paged_append(kc, vc, torch.tensor([1]), rows, 2 * rows, **scales)
    assert float(vc[0, 1, 0, 0]) != 0


def test_append_moves_the_caches_versions_so_a_saved_copy_cannot_go_stale():
    kc, vc = torch.zeros(2, 4, 1, 2), torch.zeros(2, 4, 1, 2)
    w = torch.randn(2, 4, 1, 2, requires_grad=True)
    y = (kc * w).sum()                        # saves kc
    fat.paged_append(kc, vc, torch.tensor([1]), torch.ones(1, 1, 2), torch.ones(1, 1, 2))
    assert kc._version > 0 and vc._version > 0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_append_of_rows_requiring_grad_is_refused_in_grad_mode_not_cut_from_the_graph():
    x = torch.randn(1, 1, 2, requires_grad=True)
    kc, vc = torch.zeros(2, 4, 1, 2), torch.zeros(2, 4, 1, 2)
    with pytest.raises(ValueError, match="value requires grad, but fastattn.torch.paged_append "
                                         "has no gradients"):
        fat.paged_append(kc, vc, torch.tensor([1]), torch.ones(1, 1, 2), 2 * x)
    assert not kc.any() and not vc.any()
    with torch.no_grad():
        fat.paged_append(kc, vc, torch.tensor([1]), 2 * x, 2 * x)
    torch.testing.assert_close(kc[0, 1], 2 * x.detach()[0])


def test_inference_tensors_are_written_only_in_inference_mode():
    with torch.inference_mode():
        kc, vc = torch.zeros(2, 4, 1, 2), torch.zeros(2, 4, 1, 2)
        out = torch.zeros(1, 1, 2)
    rows, table, lens = torch.ones(1, 1, 2), torch.tensor([[0]]), torch.tensor([1])
    with pytest.raises(ValueError, match="key_cache is an inference tensor"):
        fat.paged_append(kc, vc, torch.tensor([0]), rows, rows)
    assert not kc.any() and not vc.any()
    with torch.inference_mode():
        fat.paged_append(kc, vc, torch.tensor([0]), rows, 3 * rows)
    with pytest.raises(ValueError, match="out is an inference tensor"):
        fat.attention_paged(torch.randn(1, 1, 2), kc, vc, table, lens, out=out)
    assert not out.any()
    with torch.inference_mode():
        fat.attention_paged(torch.randn(1, 1, 2), kc, vc, table, lens, out=out)
    assert out.tolist() == [[[3.0, 3.0]]]
