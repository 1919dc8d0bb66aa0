"""fastattn as a Hugging Face ``transformers`` attention backend.

After :func:`register`, ``attn_implementation="fastattn"`` is accepted by
``from_pretrained`` and ``model.set_attn_implementation``::

    from fastattn.integrations.transformers import register
    register()
    model = AutoModel.from_pretrained(name, attn_implementation="fastattn")

Two functions are registered under the name: the attention function (in
``transformers.AttentionInterface``) and the mask function (in
``transformers.AttentionMaskInterface``).  The mask function does not build
the ``(batch, 1, L, S)`` mask when the model's mask is one fastattn computes
natively: it evaluates the model's mask pattern on the query/key positions
and, when that is plain causal, causal with the sliding window the model
names, or full (bidirectional), with the queries the last keys, it returns
only the padding (``None`` without padding, else a ``(batch, 1, 1, S)`` bool
tensor, True = attend).  The attention function then calls fastattn with
``is_causal='lower_right'`` (when the module is causal), ``window=(W - 1, 0)``
for ``sliding_window=W`` (transformers counts the current token), and the
padding as ``key_padding_mask``.  While torch.compile traces, no pattern can
be evaluated: the plain causal one (known by the model's mask function) and
the sliding window transformers declares (its ``local_size`` the config's
``sliding_window`` with ``allow_is_causal_skip``: the contract its own sdpa
mask trusts) still get only the padding (kept even where it hides nothing),
the others the full mask.  Any other pattern (chunked, packed sequences, a
static cache whose keys run past the queries) gets the full mask, as a float
tensor (0 or ``-inf``), used as it is, except one row of packed sequences:
where a flattening collator passes ``cu_seq_lens_q`` / ``cu_seq_lens_k``, or
``position_ids`` restart and the mask is exactly transformers' packed
pattern, the attention function runs :func:`fastattn.torch.attention_varlen`
over the documents (each attends only to itself, its own length squared of
work) instead of reading the mask.  Under ``torch.compile`` such a row (the
collator's offsets, or ``position_ids`` and a mask) becomes the operator
``fastattn::packed_rows``, which makes that decision when it runs
(:mod:`fastattn.integrations.transformers_packed`).  ``scaling``,
``softcap``, ``s_aux`` (attention sinks) and ``position_bias`` are honoured;
grouped-query heads are read in place (never repeated); the result is written
straight into the ``(batch, L, heads, Ev)`` tensor the model reads.

Attention runs on ``torch.get_num_threads()`` threads (under
``torch.compile``, their number when the model was traced) unless
``register`` was given ``num_threads``.  The backend trains: with grad mode
on and the queries, keys, values, ``s_aux`` or ``position_bias`` requiring
grad, the call is recorded by autograd (see :mod:`fastattn.torch`), and
``s_aux`` and a learned ``position_bias`` (T5's relative attention bias) get
their gradients; there is no dropout (an ``attention_dropout`` > 0 in
training is refused).

``register`` also lets ``model.generate_batch`` (continuous batching) run
with the name: see :mod:`fastattn.integrations.transformers_cb` for the
mechanism and the releases it is installed on.  There the attention function
reads full-attention layers' paged cache in place with
:func:`fastattn.attention_paged`.
"""

from __future__ import annotations

from typing import Any

import torch

from .._api import attention as _attention
from ..torch import attention_varlen as _varlen
from ..torch import scaled_dot_product_attention as _sdpa
from . import transformers_cb as _cb
from . import transformers_packed as _packed

__all__ = ["register", "attention_forward", "attention_mask", "NAME"]

NAME = "fastattn"
_settings: dict[str, Any] = {"num_threads": None}
_get_threads = torch.get_num_threads
_Tensor = torch.Tensor
_from_numpy = torch.from_numpy
_is_compiling = torch.compiler.is_compiling
# the dtypes a decoding step reads as NumPy views directly (bfloat16 takes
# fastattn.torch's path)
_DECODE_DTYPES = frozenset((torch.float32, torch.float64, torch.float16))
_is_grad_enabled = torch.is_grad_enabled


def register(name: str = NAME, *, num_threads: int | None = None) -> None:
    """Add fastattn to ``transformers``' attention and mask interfaces as ``name``.

    Idempotent: calling it again replaces the entries with the same functions
    (and updates ``num_threads``: None = ``torch.get_num_threads()`` at each
    call).  Also lets ``model.generate_batch`` (continuous batching) run with
    ``name`` where this transformers allows it
    (:func:`fastattn.integrations.transformers_cb.install`).
    """
    from transformers import AttentionInterface, AttentionMaskInterface
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)
                                    or num_threads < 1):
        raise ValueError(f"num_threads must be None or an int >= 1, got {num_threads!r}")
    _settings["num_threads"] = num_threads
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, attention_mask)
    _cb.install(name)


# ---------------------------------------------------------------------------
# the mask function
# ---------------------------------------------------------------------------

_mu: list[Any] = []  # transformers.masking_utils, once imported


def _masking_utils():
    if not _mu:
        from transformers import masking_utils
        _mu.append(masking_utils)
    return _mu[0]


def _padding(attention_mask, batch_size: int, kv_length: int, kv_offset: int, read: bool):
    """The (batch, S) bool padding of the keys (True = attend), None if none;
    unless ``read`` (while tracing no value can be read), a 2-D mask's
    padding is kept even where it hides nothing."""
    if attention_mask is None:
        return None
    pad = attention_mask.to(torch.bool)
    short = kv_offset + kv_length - pad.shape[-1]
    if short > 0:  # keys past the 2-D mask are not attended (as transformers does)
        pad = torch.nn.functional.pad(pad, (0, short), value=False)
    pad = pad[:, kv_offset:kv_offset + kv_length]
    if read and bool(pad.all()):
        return None
    return pad.expand(batch_size, kv_length) if pad.shape[0] != batch_size else pad


def _native_pattern(mask_function, batch_size, q_length, kv_length, q_offset, kv_offset,
                    local_size) -> bool:
    """Whether ``mask_function`` over these positions is full, or causal (with
    a window of ``local_size`` if given) with the queries the last keys."""
    if not isinstance(q_offset, int) or not isinstance(kv_offset, int):
        return False
    if q_offset + q_length != kv_offset + kv_length:  # the queries are not the last keys
        return False
    dev = "cpu"
    b = torch.arange(batch_size, device=dev)[:, None, None, None]
    h = torch.zeros(1, dtype=torch.long, device=dev)[None, :, None, None]
    qi = (torch.arange(q_length, device=dev) + q_offset)[None, None, :, None]
    ki = (torch.arange(kv_length, device=dev) + kv_offset)[None, None, None, :]
    got = mask_function(b, h, qi, ki)
    if bool(got.all()):
        return True
    want = ki <= qi
    if local_size is not None:
        want = want & (ki > qi - local_size)
    return bool((got == want).all())


def _declared_window(local_size, kwargs) -> bool:
    """Whether transformers declares the mask causal with the config's sliding
    window of ``local_size``, as its own sdpa mask trusts without evaluating
    it: ``allow_is_causal_skip`` (which it turns off wherever it changes the
    mask function: packed rows, added and/or masks, a compiled cache's
    decoding step), ``local_size`` the config's ``sliding_window``, and no
    attention chunks (whose mask passes the chunk size as ``local_size``).
    The window itself reaches the attention function as its
    ``sliding_window`` argument, as it does for every backend."""
    config = kwargs.get("config")
    return (type(local_size) is int and kwargs.get("allow_is_causal_skip") is True
            and config is not None and getattr(config, "sliding_window", None) == local_size
            and getattr(config, "attention_chunk_size", None) is None)


def attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0,
                   kv_offset: int = 0, mask_function=None, attention_mask=None,
                   local_size: int | None = None, **kwargs):
    """The mask interface's function: None or the (batch, 1, 1, S) bool padding
    when fastattn computes the pattern natively, else the full float mask."""
    mu = _masking_utils()
    if mask_function is None:
        mask_function = mu.causal_mask_function
    tracing = _is_compiling() or (
        attention_mask is not None and type(attention_mask) is not torch.Tensor)
    if (mask_function is mu.causal_mask_function and local_size is None
            or tracing and _declared_window(local_size, kwargs)):
        # plain causal, or while tracing the sliding window transformers
        # declares: native whenever the queries are the last keys
        native = (isinstance(q_offset, int) and isinstance(kv_offset, int)
                  and q_offset + q_length == kv_offset + kv_length)
    else:
        native = not tracing and _native_pattern(mask_function, batch_size, q_length,
                                                 kv_length, q_offset, kv_offset, local_size)
    if native:
        pad = _padding(attention_mask, batch_size, kv_length, kv_offset, read=not tracing)
        return None if pad is None else pad[:, None, None, :]
    full = mu.sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length,
                        q_offset=q_offset, kv_offset=kv_offset, mask_function=mask_function,
                        attention_mask=attention_mask, local_size=local_size,
                        allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
                        use_vmap=kwargs.get("use_vmap", False),
                        device=kwargs.get("device", "cpu"))
    zero = torch.zeros((), dtype=torch.float32, device=full.device)
    return torch.where(full, zero, float("-inf"))


# ---------------------------------------------------------------------------
# the attention function
# ---------------------------------------------------------------------------

def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, sliding_window: int | None = None,
                      softcap: float | None = None, s_aux: torch.Tensor | None = None,
                      position_bias: torch.Tensor | None = None, **kwargs):
    """The attention interface's function: query (B, H, L, E), key and value
    (B, Hkv, S, E|Ev) -> ((B, L, H, Ev) output, None)."""
    B, H, L, _ = query.shape
    _check_arguments(attention_mask, sliding_window)
    if L == 1 and s_aux is None and position_bias is None and not dropout:
        out = _decoding_step(module, query, key, value, attention_mask, scaling, is_causal,
                             sliding_window, softcap, kwargs)
        if out is not None:
            return out, None
    S = key.shape[-2]
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    if kwargs.get("output_attentions"):
        raise ValueError("attn_implementation='fastattn' does not return attention weights; "
                         "use 'eager' with output_attentions=True")
    nt = _settings["num_threads"] or (_traced_threads() if _is_compiling() else _get_threads())
    window = (sliding_window - 1, 0) if causal and sliding_window is not None else None
    if "cu_seq_lens_q" in kwargs and _cb.is_batching_call(kwargs):
        return _cb.batching_attention(query, key, value, kwargs, causal=causal, scale=scaling,
                                      window=window, softcap=softcap, sinks=s_aux,
                                      num_threads=nt), None
    cu = None if dropout else _packed_rows(query, key, attention_mask, causal, window,
                                           position_bias, kwargs)
    if cu is not None:  # one row of packed sequences: each attends only to itself
        q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (L, heads, E) views
        res = _varlen(q, k, v, cu, cu, is_causal="lower_right" if causal else False,
                      scale=scaling, window=window, softcap=softcap, sinks=s_aux,
                      num_threads=nt)
        return res[None], None
    if not dropout and _traced_rows(query, key, attention_mask, position_bias, kwargs):
        mask = None if attention_mask is None else attention_mask[..., :L]
        cu = kwargs.get("cu_seq_lens_q")
        return _packed.packed_or_masked(
            query, key, value, mask, cu, kwargs.get("cu_seq_lens_k"),
            kwargs.get("position_ids") if cu is None else None, causal=causal, window=window,
            scale=scaling, softcap=softcap, sinks=s_aux, num_threads=nt), None
    mask = pad = None
    if _padding_only(attention_mask):  # the compact form (B, 1, 1, S)
        pad = ~attention_mask[:, 0, 0, :S]
    elif attention_mask is not None and attention_mask.shape[-2] == 1:
        mask = attention_mask[..., :S]  # one row for every query: with causal and the window
    elif attention_mask is not None:
        mask, causal, window = attention_mask[..., :S], False, None  # a full mask: as it is
    if position_bias is not None:
        mask = position_bias if mask is None else position_bias + mask
    gqa = key.shape[1] != H
    # (a decoding step's grouped heads run as the rows of one problem per
    # key/value head: fastattn's own enable_gqa does that)
    if _is_grad_enabled() and _training(query, key, value, s_aux, mask):
        res = _sdpa(query, key, value, mask, dropout, "lower_right" if causal else False,
                    scaling, gqa, key_padding_mask=pad, window=window, softcap=softcap,
                    sinks=s_aux, num_threads=nt)
        return res.transpose(1, 2), None
    out = torch.empty((B, L, H, value.shape[-1]), dtype=query.dtype, device=query.device)
    _sdpa(query, key, value, mask, dropout, "lower_right" if causal else False, scaling,
          gqa, key_padding_mask=pad, window=window, softcap=softcap,
          sinks=s_aux, num_threads=nt, out=out.transpose(1, 2))
    return out, None


def _check_arguments(attention_mask, sliding_window) -> None:
    """The errors for a mask that is not 4-D and a window that holds no key
    (transformers' sliding_window counts the current token)."""
    if attention_mask is not None and attention_mask.ndim != 4:
        raise ValueError(f"attention_mask must be 4-D (batch, heads or 1, L or 1, S), got "
                         f"shape {tuple(attention_mask.shape)}")
    if sliding_window is not None and not (isinstance(sliding_window, int)
                                           and sliding_window >= 1):
        raise ValueError(f"sliding_window must be an int >= 1 (the current token included), "
                         f"got {sliding_window!r}")


def _padding_only(attention_mask) -> bool:
    """Is attention_mask the compact padding form (B, 1, 1, S) of bool?"""
    return (attention_mask is not None and attention_mask.dtype is torch.bool
            and attention_mask.shape[1] == 1 and attention_mask.shape[2] == 1)


@torch.compiler.assume_constant_result
def _traced_threads() -> int:
    """torch.get_num_threads() for a call torch.compile traces, read when it
    traces (a torch function that returns no tensor would break the graph)."""
    return _get_threads()


def _packed_rows(query, key, attention_mask, causal, window, position_bias, kwargs):
    """The sequence offsets (int64, from 0 to L) when the call is self-attention
    over one row of packed sequences, each attending only to itself, else
    None.  The offsets are the ``cu_seq_lens_q`` / ``cu_seq_lens_k`` a
    flattening collator passes (equal for self-attention), or else the
    starts of ``position_ids`` (a position that does not follow its
    predecessor by 1 starts a sequence, as transformers finds packed
    sequences); a mask given with them must be exactly the packed pattern
    (within each sequence: causal, with the window, or full; a collator's
    offsets also stand against the row's own pattern: transformers_packed's
    offsets_of), or the call keeps the mask.  None while torch.compile
    traces (_traced_rows)."""
    B, _, L, _ = query.shape
    if (B != 1 or L < 2 or key.shape[-2] != L or position_bias is not None or _is_compiling()
            or not query.is_cpu):
        return None
    cu, ck, pos = (kwargs.get(n) for n in ("cu_seq_lens_q", "cu_seq_lens_k", "position_ids"))
    if cu is not None and not (isinstance(cu, _Tensor) and isinstance(ck, _Tensor)):
        return None
    if not isinstance(pos, _Tensor):
        pos = None
    return _packed.row_offsets(cu, ck, pos, L, attention_mask, causal, window)


def _traced_rows(query, key, attention_mask, position_bias, kwargs) -> bool:
    """Whether a call traced by torch.compile is one row that _packed_rows
    would look at: a flattening collator's offsets (and no mask, or the full
    (1, 1, L, S) one), or ``position_ids`` with that full mask; then the
    operator fastattn::packed_rows makes _packed_rows' decision when it runs."""
    B, _, L, _ = query.shape
    cu, ck, pos = (kwargs.get(n) for n in ("cu_seq_lens_q", "cu_seq_lens_k", "position_ids"))
    full = (attention_mask is not None and attention_mask.ndim == 4
            and attention_mask.shape[:3] == (1, 1, L))
    given = isinstance(cu, _Tensor) and isinstance(ck, _Tensor)
    found = cu is None and isinstance(pos, _Tensor) and pos.shape[-1] == L and full
    return (B == 1 and L >= 2 and key.shape[-2] == L and position_bias is None and query.is_cpu
            and _is_compiling() and (given or found) and (attention_mask is None or full))


def _decoding_step(module, query, key, value, attention_mask, scaling, is_causal,
                   sliding_window, softcap, kwargs):
    """A decoding step's attention (one query per sequence, no mask array,
    no sinks or bias, plain CPU tensors of one float dtype, nothing to
    record for autograd) with no more Python than fastattn.attention's own:
    the grouped query heads of each key/value head as the rows of one
    problem, the keys cut to the window; None when the call is not such a
    step."""
    if (type(query) is not _Tensor or type(key) is not _Tensor or type(value) is not _Tensor
            or query.dtype not in _DECODE_DTYPES or key.dtype is not query.dtype
            or value.dtype is not query.dtype or not (query.is_cpu and key.is_cpu and value.is_cpu)
            or query.requires_grad or key.requires_grad or value.requires_grad
            or "cu_seq_lens_q" in kwargs or kwargs.get("output_attentions")
            or _is_compiling()):
        return None
    B, H, _, E = query.shape
    hk, S = key.shape[1], key.shape[2]
    if H % hk or (attention_mask is not None and not _padding_only(attention_mask)):
        return None
    k, v = key.numpy(), value.numpy()
    pad = None if attention_mask is None else (~attention_mask[:, 0, 0, :S]).numpy()
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    # the one query sits at the last position: causal or not it sees every
    # key, and with a window of W (counting itself) the last W
    if causal and sliding_window is not None and S > sliding_window:
        lo = S - sliding_window
        k, v = k[:, :, lo:], v[:, :, lo:]
        pad = None if pad is None else pad[:, lo:]
    # the (B, hk, g, Ev) result is the (B, 1, H, Ev) output's memory
    res = _attention(query.numpy().reshape(B, hk, H // hk, E), k, v, None, False, scaling,
                     key_padding_mask=pad, softcap=softcap,
                     num_threads=_settings["num_threads"] or _get_threads())
    return _from_numpy(res).reshape(B, 1, H, v.shape[-1])


def _training(*tensors) -> bool:
    """Whether autograd records the call: then the result is returned rather
    than written into a preallocated tensor (which would add an in-place copy
    to the graph)."""
    return any(t is not None and t.requires_grad for t in tensors)
