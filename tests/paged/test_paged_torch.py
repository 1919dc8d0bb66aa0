"""fastattn.torch.attention_paged: tensors read in place (zero-copy), the
same result as the NumPy function (skipped without torch)."""

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
