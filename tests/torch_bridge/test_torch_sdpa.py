"""fastattn.torch.scaled_dot_product_attention against torch's own SDPA and
fastattn.attention: values, views (no copies), out=, errors (gradients: in
test_torch_autograd.py)."""

import doctest
import importlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="fastattn.torch needs torch (pip install 'fastattn[torch]')")

import fastattn  # noqa: E402
import fastattn.torch as fat  # noqa: E402
from fastattn import _torch_views as views  # noqa: E402
from fastattn.torch import scaled_dot_product_attention as sdpa  # noqa: E402

F = torch.nn.functional.scaled_dot_product_attention
TOL = {torch.float32: 2e-6, torch.float64: 1e-12, torch.float16: 2e-3}


def _qkv(shape_q, shape_k, dtype=torch.float32, seed=0, ev=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(shape_q, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(shape_k, generator=g, dtype=torch.float64).to(dtype)
    vs = shape_k if ev is None else shape_k[:-1] + (ev,)
    v = torch.randn(vs, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


def _close(a, b, dtype):
    assert a.dtype == b.dtype and a.shape == b.shape
    torch.testing.assert_close(a.double(), b.double(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_sdpa_plain_and_causal(dtype, causal):
    q, k, v = _qkv((2, 3, 17, 16), (2, 3, 17, 16), dtype, ev=8)
    rd = torch.float64 if dtype == torch.float64 else torch.float32
    want = F(q.to(rd), k.to(rd), v.to(rd), is_causal=causal).to(dtype)
    _close(sdpa(q, k, v, is_causal=causal), want, dtype)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_matches_torch_sdpa_with_attn_mask_broadcast(kind):
    q, k, v = _qkv((2, 4, 9, 8), (2, 4, 13, 8))
    g = torch.Generator().manual_seed(1)
    vis = torch.rand((2, 1, 9, 13), generator=g) > 0.3
    vis[..., 0] = True  # no fully hidden row (torch gives NaN there, fastattn zeros)
    mask = vis if kind == "bool" else torch.where(vis, torch.randn(vis.shape, generator=g),
                                                  float("-inf"))
    _close(sdpa(q, k, v, mask), F(q, k, v, mask), torch.float32)


def test_matches_torch_sdpa_gqa_and_scale():
    q, k, v = _qkv((1, 8, 5, 16), (1, 2, 11, 16))
    got = sdpa(q, k, v, scale=0.3, enable_gqa=True, is_causal=True)
    _close(got, F(q, k, v, scale=0.3, enable_gqa=True, is_causal=True), torch.float32)


def test_strided_inputs_are_read_in_place():
    q, k, v = _qkv((2, 6, 4, 8), (2, 6, 4, 8))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # (2, 4, 6, 8), non-contiguous
    assert not qt.is_contiguous()
    view = views.array_view(qt, "query")
    assert view.ctypes.data == qt.data_ptr() and view.strides == tuple(
        s * 4 for s in qt.stride())
    _close(sdpa(qt, kt, vt), F(qt, kt, vt), torch.float32)
    kx = k[:, :1].expand(2, 6, 4, 8)  # stride 0 on the head axis
    _close(sdpa(q, kx, v), F(q, kx, v), torch.float32)


def test_out_is_filled_and_returned_any_strides():
    q, k, v = _qkv((2, 3, 5, 8), (2, 3, 7, 8))
    buf = torch.empty(2, 5, 3, 8)
    out = buf.transpose(1, 2)
    r = sdpa(q, k, v, is_causal=True, out=out)
    assert r is out
    _close(buf.transpose(1, 2), F(q, k, v, is_causal=True), torch.float32)


def test_out_of_wrong_shape_is_left_untouched():
    q, k, v = _qkv((2, 5, 8), (2, 7, 8))
    out = torch.full((2, 5, 7), 3.0)
    with pytest.raises(ValueError, match="out has shape"):
        sdpa(q, k, v, out=out)
    assert bool((out == 3.0).all())


def test_fastattn_options_match_fastattn_attention():
    q, k, v = _qkv((2, 4, 9, 8), (2, 4, 12, 8))
    pad = torch.zeros(2, 12, dtype=torch.bool)
    pad[1, -3:] = True
    kw = dict(window=(3, 1), softcap=4.0, key_padding_mask=pad)
    slopes, sinks = torch.tensor([0.5, 0.25, 0.1, 0.0]), torch.tensor([0.0, 1.0, -1.0, 2.0])
    got, lse = sdpa(q, k, v, is_causal="lower_right", alibi_slopes=slopes, sinks=sinks,
                    return_lse=True, num_threads=2, **kw)
    want, wlse = fastattn.attention(q.numpy(), k.numpy(), v.numpy(), is_causal="lower_right",
                                    alibi_slopes=slopes.numpy(), sinks=sinks.numpy(),
                                    return_lse=True, key_padding_mask=pad.numpy(),
                                    window=(3, 1), softcap=4.0)
    assert isinstance(got, torch.Tensor) and isinstance(lse, torch.Tensor)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(lse.numpy(), wlse)


def test_lse_with_out_returns_out_and_lse():
    q, k, v = _qkv((3, 4, 8), (3, 6, 8))
    out = torch.empty(3, 4, 8)
    r, lse = sdpa(q, k, v, return_lse=True, out=out)
    assert r is out and lse.shape == (3, 4) and lse.dtype == torch.float32
    ref = torch.logsumexp(q @ k.transpose(-1, -2) / 8 ** 0.5, -1)
    torch.testing.assert_close(lse, ref)


def test_dropout_is_refused_naming_torch_sdpa():
    q, k, v = _qkv((3, 4), (3, 4))
    with pytest.raises(ValueError, match="dropout_p.*scaled_dot_product_attention"):
        sdpa(q, k, v, dropout_p=0.1)


def test_inputs_requiring_grad_are_recorded_only_in_grad_mode():
    q, k, v = _qkv((3, 4), (3, 4))
    q.requires_grad_(True)
    assert sdpa(q, k, v).grad_fn is not None
    with torch.no_grad():
        got = sdpa(q, k, v)
        assert got.grad_fn is None and not got.requires_grad
        _close(got, F(q, k, v), torch.float32)
    with torch.inference_mode():
        _close(sdpa(q, k, v), F(q, k, v), torch.float32)


def test_slopes_requiring_grad_are_refused_naming_them_a_float_mask_is_recorded():
    q, k, v = _qkv((2, 3, 4), (2, 3, 4))
    slopes = torch.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="alibi_slopes requires grad.*detach"):
        sdpa(q.requires_grad_(True), k, v, alibi_slopes=slopes)
    bias = torch.zeros(3, 3, requires_grad=True)
    q.requires_grad_(False)
    assert sdpa(q, k, v, bias).grad_fn is not None  # only the mask requires grad
    with torch.no_grad():
        _close(sdpa(q, k, v, bias), F(q, k, v, bias), torch.float32)


def test_non_tensors_are_a_type_error():
    x = np.ones((3, 4), dtype=np.float32)
    with pytest.raises(TypeError, match="query must be a torch.Tensor"):
        sdpa(x, torch.ones(3, 4), torch.ones(3, 4))
    with pytest.raises(TypeError, match="value must be a torch.Tensor"):
        sdpa(torch.ones(3, 4), torch.ones(3, 4), x)


def test_non_cpu_tensors_are_refused():
    q, k, v = _qkv((3, 4), (3, 4))
    with pytest.raises(ValueError, match="meta tensor.*CPU"):
        sdpa(q, k.to("meta"), v)
    with pytest.raises(ValueError, match="attn_mask is a meta tensor"):
        sdpa(q, k, v, torch.ones(3, 3, dtype=torch.bool, device="meta"))


def test_unsupported_dtype_is_a_type_error():
    q = torch.ones(3, 4, dtype=torch.complex64)
    with pytest.raises(TypeError, match="query"):
        sdpa(q, q, q)


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float8_e4m3fn],
                         ids=["int64", "bool", "float8"])
def test_non_float_inputs_are_a_type_error_naming_them(grad, dtype):
    """As torch's SDPA refuses them (the operators' fake results, which
    torch.compile trusts, are float)."""
    q, k, v = _qkv((2, 3, 4), (2, 5, 4))
    q.requires_grad_(grad)
    with pytest.raises(TypeError, match=f"key has dtype {dtype}"):
        sdpa(q, k.to(dtype), v)


def test_a_tensor_on_another_device_is_refused_when_training():
    """Not sent to the operator: with a meta tensor among CPU ones the
    dispatcher would run its fake implementation and return garbage."""
    q, k, v = _qkv((2, 3, 4), (2, 5, 4))
    q.requires_grad_(True)
    for name, kw in (("key", {"key": k.to("meta")}),
                     ("attn_mask", {"attn_mask": torch.zeros(3, 5, device="meta")}),
                     ("sinks", {"sinks": torch.zeros(2, device="meta")})):
        args = {"query": q, "key": k, "value": v, **kw}
        with pytest.raises(ValueError, match=f"{name} is a meta tensor"):
            sdpa(**args)


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_out_whose_elements_share_memory_is_refused(grad):
    q, k, v = _qkv((2, 3, 4), (2, 5, 4), ev=6)
    q.requires_grad_(grad)
    out = torch.zeros(1, 1, 6).expand(2, 3, 6)
    with pytest.raises(ValueError, match="out's strides.*same memory"):
        sdpa(q, k, v, out=out)
    assert not out.any()


@pytest.mark.parametrize("kw", [{"window": np.int64(2)}, {"window": torch.tensor(2)},
                                {"window": (np.int64(2), None)}, {"is_causal": None},
                                {"attn_mask": [[True, False, True, True, False]] * 3},
                                {"key_padding_mask": [False, False, True, False, False]}],
                         ids=["window_numpy_int", "window_tensor", "window_pair_numpy_int",
                              "is_causal_none", "mask_list", "key_padding_mask_list"])
def test_arguments_accepted_alike_with_and_without_grad(kw):
    q, k, v = _qkv((2, 3, 4), (2, 5, 4), torch.float64)
    want = sdpa(q, k, v, **kw)
    got = sdpa(q.clone().requires_grad_(True), k, v, **kw)
    torch.testing.assert_close(got.detach(), want, atol=0, rtol=0)


@pytest.mark.parametrize("kw", [{"softcap": True}, {"num_threads": True},
                                {"window": 1.5}, {"is_causal": "yes"}],
                         ids=["softcap_bool", "num_threads_bool", "window_float", "is_causal_str"])
def test_arguments_refused_alike_with_and_without_grad(kw):
    q, k, v = _qkv((2, 3, 4), (2, 5, 4), torch.float64)
    errors = []
    for grad in (False, True):
        with pytest.raises((TypeError, ValueError)) as info:
            sdpa(q.clone().requires_grad_(grad), k, v, **kw)
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]


def test_forward_mode_tangents_are_refused():
    fw = torch.autograd.forward_ad
    q, k, v = _qkv((2, 3, 4), (2, 5, 4), torch.float64)
    with fw.dual_level():
        dual = fw.make_dual(q, torch.ones_like(q))
        with pytest.raises(ValueError, match="forward-mode tangent"):
            sdpa(dual, k, v)


def test_vmap_runs_the_operator_and_func_grad_is_a_clear_error():
    q, k, v = _qkv((2, 3, 3, 4), (2, 3, 5, 4), torch.float64)
    got = torch.vmap(sdpa)(q, k, v)
    torch.testing.assert_close(got, sdpa(q, k, v), atol=0, rtol=0)
    with pytest.raises(ValueError, match="torch.func.grad"):
        torch.func.grad(lambda x: sdpa(x, k, v).sum())(q)


def _fastattn_takes_bfloat16(ml_dtypes) -> bool:
    x = np.zeros((1, 1), dtype=ml_dtypes.bfloat16)
    try:
        fastattn.attention(x, x, x)
    except TypeError:
        return False
    return True


def test_bfloat16_tensors_are_views_and_match_torch_or_are_refused_clearly():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 tensors need ml_dtypes")
    q, k, v = _qkv((2, 4, 9, 16), (2, 4, 9, 16), torch.bfloat16)
    if not _fastattn_takes_bfloat16(ml_dtypes):
        with pytest.raises(TypeError, match="bfloat16.*float"):
            sdpa(q, k, v)
        return
    view = views.array_view(q, "query")
    assert view.dtype == np.dtype(ml_dtypes.bfloat16) and view.ctypes.data == q.data_ptr()
    got = sdpa(q, k, v, is_causal=True)
    assert got.dtype == torch.bfloat16
    want = F(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)
    out = torch.empty_like(q)
    assert sdpa(q, k, v, out=out) is out
    torch.testing.assert_close(out.float(), F(q.float(), k.float(), v.float()),
                               atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("name", ["fastattn.torch", "fastattn._torch_varlen",
                                  "fastattn._torch_paged"])
def test_module_examples_run_as_written(name):
    # fastattn.torch's functions live in these modules (doctest looks only at
    # the objects defined in the module it is given)
    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0 and result.failed == 0, name


def test_out_overlapping_key_when_training_is_refused_naming_it():
    # the eager call refuses it; the autograd path wrote out over the key
    mem = torch.randn(2, 8, 4)
    q = torch.randn(2, 4, 4, requires_grad=True)
    key, out = mem[:, :6], mem[:, 4:]
    before = mem.clone()
    with pytest.raises(ValueError, match="out overlaps key"):
        fat.scaled_dot_product_attention(q, key, key, out=out)
    assert torch.equal(mem, before)


def test_out_written_eagerly_moves_its_version_so_a_saved_copy_cannot_go_stale():
    # out is written through its NumPy view: without the version's move a
    # backward that saved out would use its new values silently
    q, k, v = (torch.randn(2, 3, 4) for _ in range(3))
    w = torch.randn(2, 3, 4, requires_grad=True)
    out = torch.zeros(2, 3, 4)
    y = (out * w).sum()                       # saves out
    before = out._version
    sdpa(q, k, v, out=out)
    assert out._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_out_that_requires_grad_is_refused_in_grad_mode_and_written_without():
    q, k, v = (torch.randn(2, 3, 4) for _ in range(3))
    out = torch.full((2, 3, 4), 7.0, requires_grad=True)
    with pytest.raises(ValueError, match="out requires grad, and writing into it is not "
                                         "differentiable"):
        sdpa(q, k, v, out=out)
    assert bool((out == 7.0).all())
    with torch.no_grad():
        sdpa(q, k, v, out=out)
        torch.testing.assert_close(out, F(q, k, v))
