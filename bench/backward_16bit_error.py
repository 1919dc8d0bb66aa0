"""16-bit gradient error against float64: fastattn vs torch SDPA (CPU flash kernel).

    python bench/backward_16bit_error.py     # needs torch and ml_dtypes

The ISA path is fastattn's default (FASTATTN_ISA picks another): on amx and
avx512_bf16 bfloat16 runs the matrix instructions' backward, P and dS
rounded to bfloat16 as operands; elsewhere the 16-bit inputs are widened
into the float32 kernels.  The figures are deterministic.
"""
import numpy as np, ml_dtypes, torch, fastattn
from fastattn import reference
from torch.nn.attention import sdpa_kernel, SDPBackend
rng = np.random.default_rng(0)
print("fastattn ISA path:", fastattn.get_isa(), "| torch", torch.__version__)
for dtn, ndt, tdt in (("bfloat16", ml_dtypes.bfloat16, torch.bfloat16), ("float16", np.float16, torch.float16)):
    for L, causal in ((256, False), (1024, True)):
        q, k, v, go = (rng.standard_normal((1, 4, L, 64)).astype(ndt) for _ in range(4))
        f64 = [x.astype(np.float64) for x in (q, k, v, go)]
        out, lse = reference.attention(*f64[:3], is_causal=causal, return_lse=True)
        ref = reference.attention_backward(f64[3], *f64[:3], out, lse, is_causal=causal)
        o16, l16 = fastattn.attention(q, k, v, is_causal=causal, return_lse=True)
        fa = fastattn.attention_backward(go, q, k, v, o16, l16, is_causal=causal)
        tq, tk, tv = (torch.from_numpy(x.astype(np.float32)).to(tdt).requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        to.backward(torch.from_numpy(go.astype(np.float32)).to(tdt))
        th = [t.grad.float().numpy().astype(np.float64) for t in (tq, tk, tv)]
        row = []
        for name, r, a, b in zip("qkv", ref, fa, th):
            n = np.abs(r).max()
            row.append(f"d{name}: fastattn {np.abs(a.astype(np.float64) - r).max() / n:.2e} torch {np.abs(b - r).max() / n:.2e}")
        print(dtn, L, "causal" if causal else "", "| max error / max |grad|:", "; ".join(row))
