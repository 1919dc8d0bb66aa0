# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The bridge: turns validated NumPy arrays into pointers, sizes and strides
and calls the C kernels of ``src_c/`` with the GIL released.  Validation,
broadcasting and dtype rules live in the Python layer (``fastattn/_api.py``,
``fastattn/_validate.py``); the arrays are positional, every other argument
is a keyword."""

cimport numpy as cnp
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint64_t
from libc.string cimport memset

cnp.import_array()

cdef extern from "fastattn.h" nogil:
    enum:
        FA_OK
        FA_ENOMEM
        FA_EINVAL
        FA_FLOAT32
        FA_FLOAT64
        FA_FLOAT16
        FA_BFLOAT16
        FA_ISA_COUNT
        FA_MAX_BATCH_DIMS
    int64_t FA_UNBOUNDED
    ctypedef struct fa_operand:
        const void *data
        int64_t bstride[32]
        int64_t rs
        int64_t cs
    ctypedef struct fa_attention_args:
        int dtype
        int storage
        int kv_storage
        int nbatch_dims
        int64_t batch_shape[32]
        int64_t L, S, E, Ev
        fa_operand q, k, v, out
        double scale
        int causal
        int64_t causal_offset
        int64_t win_left, win_right
        fa_operand bool_mask
        fa_operand add_mask
        fa_operand pad
        void *weights
        int num_threads
        double softcap
        fa_operand alibi
        fa_operand sinks
        fa_operand lse
    int fa_attention(const fa_attention_args *args)
    ctypedef struct fa_backward_args:
        fa_attention_args fwd
        fa_operand dout
        fa_operand glse
        fa_operand dq, dk, dv
        int grad_storage
        fa_operand dsinks
        fa_operand dmask
    enum:
        FA_ELSE
    int fa_attention_backward(const fa_backward_args *args)
    ctypedef struct fa_varlen_args:
        fa_backward_args t
        int64_t n
        const int64_t *cu_q
        const int64_t *cu_k
        int lower_right
        int64_t alibi_ss, sinks_ss, dsinks_ss
    int fa_attention_varlen(const fa_varlen_args *args)
    int fa_attention_backward_varlen(const fa_varlen_args *args)
    int fa_backward_rounds(int storage)
    int fa_round_half(int storage, int64_t n, const float *x, uint16_t *y)
    int fa_softmax_rows(int dtype, int64_t nrows, int64_t n, const void *x, int64_t x_rs,
                        int64_t x_cs, void *y, int64_t y_rs, int64_t y_cs, const uint8_t *keep,
                        int64_t k_rs, int64_t k_cs, int num_threads)
    int fa_isa_built(int isa)
    int fa_cpu_supports(int isa)
    int fa_get_isa()
    int fa_set_isa(int isa)
    int fa_avx512_emulated()
    int fa_neon_emulated()
    int fa_amx_fp16()
    const char *fa_isa_name(int isa)
    int fa_init_dispatch(char *msg, size_t msg_len)
    int fa_openmp_enabled()
    int fa_max_threads()
    const char *fa_openmp_runtime()
    void fa_debug_fail_alloc_after(int64_t n_ok)
    int64_t fa_cached_bytes()
    void fa_release_cached()
    void fa_debug_poison_cached(int byte)
    int fa_fma_probe(int dtype, int64_t n, int num_threads, double *flops)
    int fa_read_probe(const void *p, int64_t nbytes, int num_threads, uint64_t *sink)
    int fa_exp(int dtype, int base2, int64_t n, const void *x, void *y)
    int fa_tanh(int dtype, int64_t n, const void *x, void *y)
    int fa_bf16_op(int op, int native, const void *a, const void *b, void *c)
    void fa_init_threads()
    void fa_set_default_threads(int n)
    ctypedef struct fa_decode_q8_args:
        int64_t B, Hq, Hkv, L, S, E, Ev
        const float *q
        int64_t q_bs, q_hs, q_rs
        const signed char *k
        const signed char *v
        int64_t k_bs, k_hs, k_rs, v_bs, v_hs, v_rs
        const float *k_scale
        const float *v_scale
        int64_t ks_bs, ks_hs, vs_bs, vs_hs
        float *out
        int64_t o_bs, o_hs, o_rs
        double scale
        int causal
        int64_t causal_offset, win_left, win_right
        const uint8_t *pad
        double softcap
        const double *alibi
        const double *sinks
        float *lse
        int num_threads
    int fa_decode_q8(const fa_decode_q8_args *args)
    int fa_quantize_q8(int64_t rows, int64_t n, const float *x, int64_t x_rs, signed char *y,
                       int64_t y_rs, float *scale)
    enum:
        FA_INT8
    ctypedef struct fa_paged_args:
        int dtype, storage, kv_storage
        int64_t B, Hq, Hkv, E, Ev, total_q, num_blocks, block_size, max_blocks
        const void *q
        int64_t q_rs, q_hs, q_cs
        const void *k
        const void *v
        int64_t k_bs, k_ps, k_hs, k_cs, v_bs, v_ps, v_hs, v_cs
        const float *k_scale
        const float *v_scale
        int64_t ks_bs, ks_ps, ks_hs, vs_bs, vs_ps, vs_hs
        const int64_t *block_table
        const int64_t *seq_lens
        const int64_t *cu_q
        void *out
        int64_t o_rs, o_hs, o_cs
        void *lse
        double scale, softcap
        int causal
        int64_t win_left, win_right
        const double *alibi
        const double *sinks
        int num_threads
    int fa_attention_paged(const fa_paged_args *args)
    ctypedef struct fa_paged_append_args:
        int src_storage, kv_storage
        int64_t T, Hkv, E, Ev, num_blocks, block_size
        const void *key
        const void *value
        int64_t key_ts, key_hs, value_ts, value_hs
        void *k
        void *v
        int64_t k_bs, k_ps, k_hs, v_bs, v_ps, v_hs
        float *k_scale
        float *v_scale
        int64_t ks_bs, ks_ps, ks_hs, vs_bs, vs_ps, vs_hs
        const int64_t *slots
        int num_threads
    int fa_paged_append(const fa_paged_append_args *args)

MAX_BATCH_DIMS = FA_MAX_BATCH_DIMS
UNBOUNDED = FA_UNBOUNDED  # a window side that bounds nothing

fa_init_threads()
cdef char _msg[512]
if fa_init_dispatch(_msg, sizeof(_msg)) != FA_OK:
    raise RuntimeError(_msg.decode())


cdef int _fill(fa_operand *op, cnp.ndarray a, int nb) except -1:
    """Point op at a; its dims are right-aligned against nb batch dims + 2,
    and a dimension of length 1 broadcasts (stride 0)."""
    cdef int nd = cnp.PyArray_NDIM(a), d, src
    cdef Py_ssize_t isz = cnp.PyArray_ITEMSIZE(a)
    cdef cnp.npy_intp *st = cnp.PyArray_STRIDES(a)
    cdef cnp.npy_intp *sh = cnp.PyArray_DIMS(a)
    op.data = cnp.PyArray_DATA(a)
    for d in range(nb):
        src = d - (nb + 2 - nd)
        op.bstride[d] = 0 if (src < 0 or sh[src] == 1) else st[src] // isz
    op.rs = 0 if sh[nd - 2] == 1 else st[nd - 2] // isz
    op.cs = 0 if sh[nd - 1] == 1 else st[nd - 1] // isz
    return 0


cdef int _fill_optional(fa_operand *op, object a, int nb) except -1:
    """_fill, or op.data = NULL for a = None."""
    if a is None:
        op.data = NULL
        return 0
    return _fill(op, <cnp.ndarray?>a, nb)


cdef int _storage(cnp.ndarray a):
    """The element type of a float array: FA_FLOAT32, FA_FLOAT64, FA_FLOAT16,
    or FA_BFLOAT16 (the other 2-byte float _api.py lets through)."""
    cdef Py_ssize_t isz = cnp.PyArray_ITEMSIZE(a)
    if isz == 8:
        return FA_FLOAT64
    if isz == 4:
        return FA_FLOAT32
    return FA_FLOAT16 if cnp.PyArray_TYPE(a) == cnp.NPY_FLOAT16 else FA_BFLOAT16


cdef int64_t _seq_stride(object a, int nb):
    """The element stride between sequences of a per-sequence operand (a
    leading axis before its nb batch dimensions + 2), 0 when shared."""
    if a is None:
        return 0
    cdef cnp.ndarray x = <cnp.ndarray?>a
    if cnp.PyArray_NDIM(x) != nb + 3 or cnp.PyArray_DIM(x, 0) == 1:
        return 0
    return cnp.PyArray_STRIDE(x, 0) // cnp.PyArray_ITEMSIZE(x)


cdef int _fill_seqs(fa_varlen_args *va, tuple seqs, object alibi, object sinks,
                    object dsinks, int nb) except -1:
    """va's sequences from seqs = (cu_q, cu_k, lower_right): cu_q, cu_k
    C-contiguous int64 of one length n + 1; alibi, sinks, dsinks with a
    leading sequence axis (or None)."""
    cdef cnp.ndarray cq = <cnp.ndarray?>seqs[0], ck = <cnp.ndarray?>seqs[1]
    if (cnp.PyArray_TYPE(cq) != cnp.NPY_INT64 or cnp.PyArray_TYPE(ck) != cnp.NPY_INT64
            or not cnp.PyArray_IS_C_CONTIGUOUS(cq) or not cnp.PyArray_IS_C_CONTIGUOUS(ck)
            or cnp.PyArray_SIZE(cq) != cnp.PyArray_SIZE(ck) or cnp.PyArray_SIZE(cq) < 1):
        raise ValueError("seqs: cu_q and cu_k must be C-contiguous int64 of one length >= 1")
    va.n = cnp.PyArray_SIZE(cq) - 1
    va.cu_q = <const int64_t *>cnp.PyArray_DATA(cq)
    va.cu_k = <const int64_t *>cnp.PyArray_DATA(ck)
    va.lower_right = bool(seqs[2])
    va.alibi_ss = _seq_stride(alibi, nb)
    va.sinks_ss = _seq_stride(sinks, nb)
    va.dsinks_ss = _seq_stride(dsinks, nb)
    return 0


cdef int _run(fa_varlen_args *va, bint backward, tuple seqs, object alibi, object sinks,
             object dsinks, int nb) except -1:
    """The call va.t describes (the forward's, va.t.fwd, unless backward),
    over the packed sequences of seqs if given; its status."""
    cdef int status
    if seqs is not None:
        _fill_seqs(va, seqs, alibi, sinks, dsinks, nb)
    with nogil:
        if seqs is None:
            status = fa_attention_backward(&va.t) if backward else fa_attention(&va.t.fwd)
        else:
            status = (fa_attention_backward_varlen(va) if backward
                      else fa_attention_varlen(va))
    return status


cdef int _check(int status) except -1:
    if status == FA_ENOMEM:
        raise MemoryError("fastattn: the kernel could not allocate its scratch memory")
    if status != FA_OK:
        raise ValueError(f"fastattn: the kernel rejected its arguments (status {status})")
    return 0


def attention(cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, object out, *, tuple batch,
              double scale, bint causal=False, int64_t causal_offset=0,
              int64_t win_left=FA_UNBOUNDED, int64_t win_right=FA_UNBOUNDED,
              object bool_mask=None, object add_mask=None, object pad=None,
              object weights=None, int num_threads=0, double softcap=0, object alibi=None,
              object sinks=None, object lse=None, tuple seqs=None):
    """Fill ``out`` (batch + (L, Ev); None: a new C-ordered array of q's
    dtype) and ``weights`` if given, and return ``out``; every array
    validated, same float dtype (float32, float64, float16 or bfloat16: then
    read in place and computed in float32; or float32 q, out with k, v of
    one 16-bit dtype), dims broadcastable to batch.  causal, causal_offset:
    query i sees keys j <= i + causal_offset; win_left, win_right: the
    sliding window's sides (>= 0; UNBOUNDED: none); bool_mask (uint8, 1 =
    may attend), add_mask (q's dtype), pad (uint8 (batch..., 1, S), 1 =
    padding): None or broadcastable to batch + (L, S); num_threads 0: the
    OpenMP default.  The score options: softcap (0: none); alibi, sinks:
    float64 (batch..., 1, 1) or None; lse: None or (batch..., L, 1) of q's
    dtype (float32 for 16-bit q), filled.  seqs = (cu_q, cu_k, lower_right):
    packed sequences (fastattn.h: fa_varlen_args), the rows of q, out, lse
    and the keys of k, v cut at cu_q, cu_k; alibi and sinks then have a
    leading sequence axis; out given."""
    cdef fa_varlen_args va
    cdef fa_attention_args *a = &va.t.fwd
    cdef int nb = len(batch), d
    cdef cnp.npy_intp dims[FA_MAX_BATCH_DIMS + 2]
    cdef cnp.ndarray o
    if nb > FA_MAX_BATCH_DIMS:
        raise ValueError(f"at most {FA_MAX_BATCH_DIMS} leading dimensions, got {nb}")
    memset(&va, 0, sizeof(va))
    a.storage = _storage(q)
    a.kv_storage = _storage(k)  # 16-bit k, v with float32 q: read in place
    a.dtype = FA_FLOAT64 if a.storage == FA_FLOAT64 else FA_FLOAT32
    a.nbatch_dims = nb
    for d in range(nb):
        a.batch_shape[d] = batch[d]
        dims[d] = a.batch_shape[d]
    a.L = cnp.PyArray_DIM(q, cnp.PyArray_NDIM(q) - 2)
    a.E = cnp.PyArray_DIM(q, cnp.PyArray_NDIM(q) - 1)
    a.S = cnp.PyArray_DIM(k, cnp.PyArray_NDIM(k) - 2)
    a.Ev = cnp.PyArray_DIM(v, cnp.PyArray_NDIM(v) - 1)
    if out is None:
        dims[nb] = a.L
        dims[nb + 1] = a.Ev
        o = cnp.PyArray_EMPTY(nb + 2, dims, cnp.PyArray_TYPE(q), 0)
    else:
        o = <cnp.ndarray?>out
    _fill(&a.q, q, nb)
    _fill(&a.k, k, nb)
    _fill(&a.v, v, nb)
    _fill(&a.out, o, nb)
    a.scale = scale
    a.causal = causal
    a.causal_offset = causal_offset
    a.win_left = win_left
    a.win_right = win_right
    a.bool_mask.data = NULL
    a.add_mask.data = NULL
    a.pad.data = NULL
    if bool_mask is not None:
        _fill(&a.bool_mask, bool_mask, nb)
    if add_mask is not None:
        _fill(&a.add_mask, add_mask, nb)
    if pad is not None:
        _fill(&a.pad, pad, nb)
    a.weights = NULL if weights is None else cnp.PyArray_DATA(<cnp.ndarray>weights)
    a.num_threads = num_threads
    a.softcap = softcap
    _fill_optional(&a.alibi, alibi, nb)
    _fill_optional(&a.sinks, sinks, nb)
    _fill_optional(&a.lse, lse, nb)
    _check(_run(&va, False, seqs, alibi, sinks, None, nb))
    return o


def attention_backward(cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, cnp.ndarray out,
                       cnp.ndarray lse, cnp.ndarray dout, cnp.ndarray dq, cnp.ndarray dk,
                       cnp.ndarray dv, *, tuple batch, double scale, bint causal=False,
                       int64_t causal_offset=0, int64_t win_left=FA_UNBOUNDED,
                       int64_t win_right=FA_UNBOUNDED, object bool_mask=None,
                       object add_mask=None, object pad=None, int num_threads=0,
                       double softcap=0, object alibi=None, object sinks=None,
                       object glse=None, object dsinks=None, object dmask=None,
                       tuple seqs=None):
    """Fill dq (batch + (L, E)), dk (batch + (S, E)), dv (batch + (S, Ev))
    and, with sinks, dsinks (float64 batch + (1, 1)): one gradient per batch
    index (nothing summed but for grouped query heads: dk and dv of length 1
    along the last of batch, the kernel summing that dimension's gradients
    into them in order), from the validated q, k, v, the forward's out
    and dout (one float dtype; 16-bit ones read in place), the forward's lse
    and glse (None or the gradient into lse), both batch + (L, 1), float64
    for float64 q, else float32, and the forward's options as
    :func:`attention` takes them; dq, dk, dv of lse's dtype, or all three
    of q's 16-bit dtype where :func:`backward_rounds` says so.  ValueError
    naming lse when a row whose lse is -inf sees a key (nothing written).
    dmask: None or zeros of lse's dtype, batch + (L, S), one element per
    batch index (no stride 0 along a batch dimension longer than 1): the
    gradient of an additive mask per batch index is written into it.
    seqs: packed sequences as :func:`attention` takes them (dsinks with a
    leading sequence axis too); a sequence with no query row or no key is
    skipped (its gradients left as they were)."""
    cdef fa_varlen_args va
    cdef fa_backward_args *g = &va.t
    cdef int nb = len(batch), d, status
    if nb > FA_MAX_BATCH_DIMS:
        raise ValueError(f"at most {FA_MAX_BATCH_DIMS} leading dimensions, got {nb}")
    memset(&va, 0, sizeof(va))
    g.fwd.storage = _storage(q)
    g.fwd.kv_storage = _storage(k)
    g.fwd.dtype = FA_FLOAT64 if g.fwd.storage == FA_FLOAT64 else FA_FLOAT32
    g.fwd.nbatch_dims = nb
    for d in range(nb):
        g.fwd.batch_shape[d] = batch[d]
    g.fwd.L = cnp.PyArray_DIM(q, cnp.PyArray_NDIM(q) - 2)
    g.fwd.E = cnp.PyArray_DIM(q, cnp.PyArray_NDIM(q) - 1)
    g.fwd.S = cnp.PyArray_DIM(k, cnp.PyArray_NDIM(k) - 2)
    g.fwd.Ev = cnp.PyArray_DIM(v, cnp.PyArray_NDIM(v) - 1)
    _fill(&g.fwd.q, q, nb)
    _fill(&g.fwd.k, k, nb)
    _fill(&g.fwd.v, v, nb)
    _fill(&g.fwd.out, out, nb)
    g.fwd.weights = NULL
    g.fwd.scale = scale
    g.fwd.causal = causal
    g.fwd.causal_offset = causal_offset
    g.fwd.win_left = win_left
    g.fwd.win_right = win_right
    _fill_optional(&g.fwd.bool_mask, bool_mask, nb)
    _fill_optional(&g.fwd.add_mask, add_mask, nb)
    _fill_optional(&g.fwd.pad, pad, nb)
    g.fwd.num_threads = num_threads
    g.fwd.softcap = softcap
    _fill_optional(&g.fwd.alibi, alibi, nb)
    _fill_optional(&g.fwd.sinks, sinks, nb)
    _fill(&g.fwd.lse, lse, nb)
    _fill(&g.dout, dout, nb)
    _fill_optional(&g.glse, glse, nb)
    _fill_optional(&g.dsinks, dsinks, nb)
    _fill_optional(&g.dmask, dmask, nb)
    _fill(&g.dq, dq, nb)
    _fill(&g.dk, dk, nb)
    _fill(&g.dv, dv, nb)
    g.grad_storage = _storage(dq)
    if _storage(dk) != g.grad_storage or _storage(dv) != g.grad_storage:
        raise ValueError("dq, dk and dv must have one dtype")
    if dmask is not None and _storage(dmask) != g.fwd.dtype:
        raise ValueError("dmask must have lse's dtype")
    status = _run(&va, True, seqs, alibi, sinks, dsinks, nb)
    if status == FA_ELSE:
        raise ValueError("lse is -inf on a row that sees keys: lse must be what attention("
                         "..., return_lse=True) returned for the same arguments")
    _check(status)



def backward_rounds(cnp.ndarray x):
    """Whether :func:`attention_backward` writes the gradients of q, k, v
    of x's 16-bit dtype itself (each rounded once from its float32 sum) on
    the ISA in use."""
    return fa_backward_rounds(_storage(x)) != 0


def round_half(cnp.ndarray x, cnp.ndarray y):
    """y = x rounded to nearest even once, in y's 16-bit dtype; x C-contiguous
    float32, y a C-contiguous float16 or bfloat16 array of x's size."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    cdef int storage = _storage(y)
    cdef const float *xp = <const float *>cnp.PyArray_DATA(x)
    cdef uint16_t *yp = <uint16_t *>cnp.PyArray_DATA(y)
    cdef int status
    with nogil:
        status = fa_round_half(storage, n, xp, yp)
    _check(status)

def in_kernel_form(cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, cnp.dtype dtype):
    """Whether q, k and v all have the dtype object ``dtype`` and are aligned,
    i.e. ``q.dtype is dtype and ... and q.flags.aligned and ...``: whether
    the kernel can read them in place (checked here, in one call, because it
    is part of the per-call overhead of tiny problems)."""
    cdef void *d = <void *>dtype
    cdef bint ok = (<void *>cnp.PyArray_DESCR(q) == d and <void *>cnp.PyArray_DESCR(k) == d
                    and <void *>cnp.PyArray_DESCR(v) == d and cnp.PyArray_ISALIGNED(q) != 0
                    and cnp.PyArray_ISALIGNED(k) != 0 and cnp.PyArray_ISALIGNED(v) != 0)
    return ok


def softmax_rows(cnp.ndarray x, cnp.ndarray y, *, object keep=None, int num_threads=0):
    """y[r, :] = softmax(x[r, :]) for 2-D x, y (same shape and float dtype:
    float32, float64, float16 or bfloat16, the last two computed in float32
    and rounded once); keep: None or a uint8 array broadcast to x's shape;
    num_threads 0: the OpenMP default."""
    cdef int dtype = _storage(x)
    cdef Py_ssize_t isz = x.dtype.itemsize
    cdef int64_t nrows = x.shape[0], n = x.shape[1]
    cdef int64_t xrs = x.strides[0] // isz, xcs = x.strides[1] // isz
    cdef int64_t yrs = y.strides[0] // isz, ycs = y.strides[1] // isz
    cdef int64_t krs = 0, kcs = 0
    cdef const uint8_t *kp = NULL
    cdef const void *xp = cnp.PyArray_DATA(x)
    cdef void *yp = cnp.PyArray_DATA(y)
    cdef int status
    if keep is not None:
        kp = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>keep)
        krs = keep.strides[0]
        kcs = keep.strides[1]
    with nogil:
        status = fa_softmax_rows(dtype, nrows, n, xp, xrs, xcs, yp, yrs, ycs, kp, krs, kcs,
                                 num_threads)
    _check(status)


ISA_NAMES = tuple(fa_isa_name(i).decode() for i in range(FA_ISA_COUNT))
BUILT_ISAS = tuple(n for i, n in enumerate(ISA_NAMES) if fa_isa_built(i))


def cpu_supports(str name):
    return bool(fa_cpu_supports(ISA_NAMES.index(name)))


def get_isa():
    return ISA_NAMES[fa_get_isa()]


def set_isa(str name):
    if name not in ISA_NAMES or fa_set_isa(ISA_NAMES.index(name)) != FA_OK:
        raise ValueError(f"ISA path {name!r} is not available here; available: "
                         f"{tuple(n for n in ISA_NAMES if cpu_supports(n))}")


def avx512_emulated():
    return bool(fa_avx512_emulated())


def neon_emulated():
    return bool(fa_neon_emulated())


def amx_fp16():
    return bool(fa_amx_fp16())


def openmp_enabled():
    return bool(fa_openmp_enabled())


def openmp_max_threads():
    return fa_max_threads()


def set_default_threads(int n):
    """Set the OpenMP default thread count (what num_threads=None uses)."""
    fa_set_default_threads(n)


def openmp_runtime():
    return fa_openmp_runtime().decode()


def fma_probe(str dtype, int64_t n, int num_threads):
    """Run the ISA's register-only FMA loop, n steps on each of num_threads
    threads; returns the floating point operations done (the benchmark's FMA
    peak: divide by the wall time)."""
    cdef int dt = FA_FLOAT64 if dtype == "float64" else FA_FLOAT32
    cdef double flops = 0
    cdef int status
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', not {dtype!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    with nogil:
        status = fa_fma_probe(dt, n, num_threads, &flops)
    _check(status)
    return flops


def read_probe(cnp.ndarray a, int num_threads):
    """Read the C-contiguous array a once on num_threads threads (the
    benchmark's read-bandwidth probe: divide a.nbytes by the wall time);
    returns the OR of its 8-byte words."""
    cdef uint64_t sink = 0
    cdef int status
    cdef const void *p = cnp.PyArray_DATA(a)
    cdef int64_t nbytes = a.nbytes
    if not a.flags.c_contiguous:
        raise ValueError("read_probe needs a C-contiguous array")
    with nogil:
        status = fa_read_probe(p, nbytes, num_threads, &sink)
    _check(status)
    return sink


def decode_q8(cnp.ndarray q, cnp.ndarray k, cnp.ndarray k_scale, cnp.ndarray v,
              cnp.ndarray v_scale, cnp.ndarray out, *, object lse=None, double scale,
              bint causal=False, int64_t causal_offset=0, int64_t win_left=FA_UNBOUNDED,
              int64_t win_right=FA_UNBOUNDED, object pad=None, double softcap=0,
              object alibi=None, object sinks=None, int num_threads=0):
    """Fill ``out`` (B, Hq, L, Ev) float32 (and ``lse`` (B, Hq, L) float32 if
    given) with attention of the float32 queries ``q`` (B, Hq, L, E) over the
    int8 cache rows ``k`` (B, Hkv, S, E), ``v`` (B, Hkv, S, Ev) and their
    float32 scales (B, Hkv, S); every row of every array has unit column
    stride, scales unit stride along S; pad None or (B, S) uint8 C-ordered;
    alibi, sinks None or (B, Hq) float64 C-ordered (validated by the caller);
    causal, the window and softcap as in :func:`attention`."""
    cdef fa_decode_q8_args a
    cdef int status
    a.B, a.Hq, a.L, a.E = q.shape[0], q.shape[1], q.shape[2], q.shape[3]
    a.Hkv, a.S, a.Ev = k.shape[1], k.shape[2], v.shape[3]
    a.q = <const float *>cnp.PyArray_DATA(q)
    a.q_bs, a.q_hs, a.q_rs = q.strides[0] // 4, q.strides[1] // 4, q.strides[2] // 4
    a.k = <const signed char *>cnp.PyArray_DATA(k)
    a.k_bs, a.k_hs, a.k_rs = k.strides[0], k.strides[1], k.strides[2]
    a.v = <const signed char *>cnp.PyArray_DATA(v)
    a.v_bs, a.v_hs, a.v_rs = v.strides[0], v.strides[1], v.strides[2]
    a.k_scale = <const float *>cnp.PyArray_DATA(k_scale)
    a.ks_bs, a.ks_hs = k_scale.strides[0] // 4, k_scale.strides[1] // 4
    a.v_scale = <const float *>cnp.PyArray_DATA(v_scale)
    a.vs_bs, a.vs_hs = v_scale.strides[0] // 4, v_scale.strides[1] // 4
    a.out = <float *>cnp.PyArray_DATA(out)
    a.o_bs, a.o_hs, a.o_rs = out.strides[0] // 4, out.strides[1] // 4, out.strides[2] // 4
    a.scale = scale
    a.causal = causal
    a.causal_offset = causal_offset
    a.win_left = win_left
    a.win_right = win_right
    a.pad = NULL
    a.alibi = NULL
    a.sinks = NULL
    a.lse = NULL
    if pad is not None:
        a.pad = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>pad)
    if alibi is not None:
        a.alibi = <const double *>cnp.PyArray_DATA(<cnp.ndarray>alibi)
    if sinks is not None:
        a.sinks = <const double *>cnp.PyArray_DATA(<cnp.ndarray>sinks)
    if lse is not None:
        a.lse = <float *>cnp.PyArray_DATA(<cnp.ndarray>lse)
    a.softcap = softcap
    a.num_threads = num_threads
    with nogil:
        status = fa_decode_q8(&a)
    _check(status)


def quantize_q8(cnp.ndarray x, cnp.ndarray y, cnp.ndarray scale):
    """Quantise the rows of the 2-D float32 ``x`` (unit column stride) into
    the int8 ``y`` (same shape, unit column stride) and ``scale`` (rows,
    contiguous); a non-finite ``x`` raises ValueError, nothing written."""
    cdef int64_t rows = x.shape[0], n = x.shape[1]
    cdef int64_t xrs = x.strides[0] // 4, yrs = y.strides[0]
    cdef const float *xp = <const float *>cnp.PyArray_DATA(x)
    cdef signed char *yp = <signed char *>cnp.PyArray_DATA(y)
    cdef float *sp = <float *>cnp.PyArray_DATA(scale)
    cdef int status
    with nogil:
        status = fa_quantize_q8(rows, n, xp, xrs, yp, yrs, sp)
    _check(status)


cdef int _kv_storage(cnp.ndarray a):
    """_storage, or FA_INT8 for an int8 cache."""
    return FA_INT8 if cnp.PyArray_ITEMSIZE(a) == 1 else _storage(a)


def attention_paged(cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, object k_scale,
                    object v_scale, cnp.ndarray table, cnp.ndarray seq_lens, cnp.ndarray cu_q,
                    cnp.ndarray out, object lse, *, double scale, bint causal=True,
                    int64_t win_left=FA_UNBOUNDED, int64_t win_right=FA_UNBOUNDED,
                    double softcap=0, object alibi=None, object sinks=None,
                    int num_threads=0):
    """Fill ``out`` (total_q, Hq, Ev) (and ``lse`` (Hq, total_q), C-ordered,
    if given) with attention of ``q`` (total_q, Hq, E) over the block pools
    ``k``, ``v`` (num_blocks, block_size, Hkv, E / Ev: any strides; an
    HND pool is passed as this view of itself) and, for int8 pools, their
    float32 scales (num_blocks, block_size, Hkv); ``table`` (B, max_blocks),
    ``seq_lens`` (B), ``cu_q`` (B + 1) C-ordered int64; alibi, sinks None or
    (Hq) float64 C-ordered.  Validated by the caller (fastattn/paged.py)."""
    cdef fa_paged_args a
    cdef int status
    cdef Py_ssize_t qsz = q.dtype.itemsize, ksz = k.dtype.itemsize
    a.dtype = FA_FLOAT64 if qsz == 8 else FA_FLOAT32
    a.storage, a.kv_storage = _storage(q), _kv_storage(k)
    a.B, a.max_blocks = table.shape[0], table.shape[1]
    a.total_q, a.Hq, a.E = q.shape[0], q.shape[1], q.shape[2]
    a.num_blocks, a.block_size, a.Hkv, a.Ev = k.shape[0], k.shape[1], k.shape[2], v.shape[3]
    a.q = cnp.PyArray_DATA(q)
    a.q_rs, a.q_hs, a.q_cs = q.strides[0] // qsz, q.strides[1] // qsz, q.strides[2] // qsz
    a.k, a.v = cnp.PyArray_DATA(k), cnp.PyArray_DATA(v)
    a.k_bs, a.k_ps, a.k_hs, a.k_cs = (k.strides[0] // ksz, k.strides[1] // ksz,
                                      k.strides[2] // ksz, k.strides[3] // ksz)
    a.v_bs, a.v_ps, a.v_hs, a.v_cs = (v.strides[0] // ksz, v.strides[1] // ksz,
                                      v.strides[2] // ksz, v.strides[3] // ksz)
    a.k_scale, a.v_scale = NULL, NULL
    a.ks_bs = a.ks_ps = a.ks_hs = a.vs_bs = a.vs_ps = a.vs_hs = 0
    if k_scale is not None:
        a.k_scale = <const float *>cnp.PyArray_DATA(<cnp.ndarray>k_scale)
        a.ks_bs, a.ks_ps, a.ks_hs = [st // 4 for st in k_scale.strides]
        a.v_scale = <const float *>cnp.PyArray_DATA(<cnp.ndarray>v_scale)
        a.vs_bs, a.vs_ps, a.vs_hs = [st // 4 for st in v_scale.strides]
    a.block_table = <const int64_t *>cnp.PyArray_DATA(table)
    a.seq_lens = <const int64_t *>cnp.PyArray_DATA(seq_lens)
    a.cu_q = <const int64_t *>cnp.PyArray_DATA(cu_q)
    a.out = cnp.PyArray_DATA(out)
    a.o_rs, a.o_hs, a.o_cs = out.strides[0] // qsz, out.strides[1] // qsz, out.strides[2] // qsz
    a.lse = NULL if lse is None else cnp.PyArray_DATA(<cnp.ndarray>lse)
    a.scale, a.softcap, a.causal = scale, softcap, causal
    a.win_left, a.win_right = win_left, win_right
    a.alibi, a.sinks = NULL, NULL
    if alibi is not None:
        a.alibi = <const double *>cnp.PyArray_DATA(<cnp.ndarray>alibi)
    if sinks is not None:
        a.sinks = <const double *>cnp.PyArray_DATA(<cnp.ndarray>sinks)
    a.num_threads = num_threads
    with nogil:
        status = fa_attention_paged(&a)
    _check(status)


def paged_append(cnp.ndarray k, cnp.ndarray v, object k_scale, object v_scale,
                 cnp.ndarray slots, cnp.ndarray key, cnp.ndarray value, int num_threads=0):
    """Write token t's rows ``key[t]`` (T, Hkv, E) and ``value[t]`` (T, Hkv, Ev)
    into the pools ``k``, ``v`` (num_blocks, block_size, Hkv, E / Ev: an HND
    pool as this view of itself) at slot ``slots[t]`` (C-ordered int64;
    negative: skipped); rows and pools of unit column stride, the rows
    float32 or the pools' own type; int8 pools with their float32 scales
    (num_blocks, block_size, Hkv).  Validated by the caller
    (fastattn/paged.py); a NaN or infinity bound for an int8 pool raises
    ValueError, nothing written."""
    cdef fa_paged_append_args a
    cdef int status
    cdef Py_ssize_t ssz = key.dtype.itemsize, ksz = k.dtype.itemsize
    a.src_storage, a.kv_storage = _storage(key), _kv_storage(k)
    a.T, a.Hkv, a.E, a.Ev = key.shape[0], k.shape[2], k.shape[3], v.shape[3]
    a.num_blocks, a.block_size = k.shape[0], k.shape[1]
    a.key, a.value = cnp.PyArray_DATA(key), cnp.PyArray_DATA(value)
    a.key_ts, a.key_hs = key.strides[0] // ssz, key.strides[1] // ssz
    a.value_ts, a.value_hs = value.strides[0] // ssz, value.strides[1] // ssz
    a.k, a.v = cnp.PyArray_DATA(k), cnp.PyArray_DATA(v)
    a.k_bs, a.k_ps, a.k_hs = k.strides[0] // ksz, k.strides[1] // ksz, k.strides[2] // ksz
    a.v_bs, a.v_ps, a.v_hs = v.strides[0] // ksz, v.strides[1] // ksz, v.strides[2] // ksz
    a.k_scale, a.v_scale = NULL, NULL
    a.ks_bs = a.ks_ps = a.ks_hs = a.vs_bs = a.vs_ps = a.vs_hs = 0
    if k_scale is not None:
        a.k_scale = <float *>cnp.PyArray_DATA(<cnp.ndarray>k_scale)
        a.ks_bs, a.ks_ps, a.ks_hs = [st // 4 for st in k_scale.strides]
        a.v_scale = <float *>cnp.PyArray_DATA(<cnp.ndarray>v_scale)
        a.vs_bs, a.vs_ps, a.vs_hs = [st // 4 for st in v_scale.strides]
    a.slots = <const int64_t *>cnp.PyArray_DATA(slots)
    a.num_threads = num_threads
    with nogil:
        status = fa_paged_append(&a)
    _check(status)


# The test hooks, declared in _core.pxd: C-level only, for fastattn/_testing.pyx.

cdef int exp_kernel(bint double_precision, bint base2, int64_t n, const void *x,
                    void *y) except -1:
    cdef int dtype = FA_FLOAT64 if double_precision else FA_FLOAT32
    cdef int status
    with nogil:
        status = fa_exp(dtype, base2, n, x, y)
    return _check(status)


cdef int tanh_kernel(bint double_precision, int64_t n, const void *x, void *y) except -1:
    cdef int dtype = FA_FLOAT64 if double_precision else FA_FLOAT32
    cdef int status
    with nogil:
        status = fa_tanh(dtype, n, x, y)
    return _check(status)


cdef int bf16_op(int op, bint native, const void *a, const void *b, void *c) noexcept:
    cdef int status
    with nogil:
        status = fa_bf16_op(op, native, a, b, c)
    return status


cdef void fail_alloc_after(int64_t n_ok) noexcept:
    fa_debug_fail_alloc_after(n_ok)


cdef int64_t cached_bytes() noexcept:
    return fa_cached_bytes()


cdef void release_cached() noexcept:
    fa_release_cached()


cdef void poison_cached(int byte) noexcept:
    fa_debug_poison_cached(byte)
