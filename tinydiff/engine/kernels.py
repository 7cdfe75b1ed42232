"""The C kernels (csrc/, built by cffi as tinydiff._kernels), wrapped for NumPy arrays.

Inputs are read as float32 C-contiguous arrays: one that already is one is passed zero-copy
(weights are never copied); anything else (float64, int, a strided slice) is copied explicitly
first. Weights may also be of another weight type (tinydiff.formats.quant: f16, bf16, Q8_0, Q4_0, and
the formats of kquants.py: Q4_1 .. IQ4_XS), read in place in their own type; those must be C-contiguous. `out` must already be right (float32,
C-contiguous, writable, the result's shape) or ValueError is raised; results are never written to
a copy. out may be the input itself for the elementwise/row kernels (rmsnorm, softmax, silu_mul),
never for matmul or attention. rope works in place, so its x must be float32 C-contiguous. The C
calls release the GIL; one kernel runs at a time on a pool (a mutex in it), so calls from several
Python threads are safe, and calls on different pools run at once.

Threads: a kernel call runs on the calling thread's current pool: a ThreadPool inside `with pool:`
(a model's own: Model.pool), else the process default pool, of physical_cores() threads or
TINYDIFF_THREADS if set at import.
SIMD: AVX-512 or AVX2+FMA kernels when the CPU has them (simd() says which), else plain C; on the
AVX-512 path, the int8 dot products use AVX512_VNNI when the CPU has it (simd_extensions()).
Signatures and meaning match tinydiff.engine.reference, the plain NumPy version.
"""
import math
import os
import platform
import threading

import numpy as np

from .._kernels import ffi, lib
from ..errors import UsageError, is_integer
from ..formats import kquants, quant
from . import cost, ledger
from .masks import CAUSAL, AttentionMask

__all__ = ["ThreadPool", "set_threads", "get_threads", "threads_from_env", "check_threads", "physical_cores",
           "simd", "simd_extensions",
           "matmul", "matmuls", "interleaved", "rmsnorm", "softmax", "softmax_stats", "gumbel_max", "rope",
           "rope_qk", "silu_mul", "gelu_tanh_mul", "attention", "add_bias", "add", "scale", "softcap", "embedding",
           "store", "store_at"]

ARM = platform.machine().lower() in ("aarch64", "arm64")
SIMD_LEVELS = ("c", "neon") if ARM else ("c", "avx2", "avx512")  # index = the C level (cpu.c)
_F32, _I64 = np.dtype(np.float32), np.dtype(np.int64)
_ndarray = np.ndarray
_buf = ffi.from_buffer  # ~0.1 us; ffi.cast("float *", a.ctypes.data) costs ~1 us
_shares = np.may_share_memory
_matmuls, _rmsnorm, _softmax = lib.td_matmuls, lib.td_rmsnorm_f32, lib.td_softmax_f32
_softmax_stats, _gumbel_max = lib.td_softmax_stats_f64, lib.td_gumbel_max_f64
_rope, _silu_mul, _attention = lib.td_rope_f32, lib.td_silu_mul_f32, lib.td_attention_f32
_gelu_tanh_mul = lib.td_gelu_tanh_mul_f32
_attention_paged = lib.td_attention_paged_f32
PAGE = lib.TD_PAGE                 # keys per page of a paged KV cache (one block of the attention's)
_rope_qk, _rows_to_f32 = lib.td_rope_qk_f32, lib.td_rows_to_f32
_TYPES = {_F32: (lib.TD_F32, 1), np.dtype(np.float16): (lib.TD_F16, 1), quant.BF16: (lib.TD_BF16, 1),
          quant.Q8_0: (lib.TD_Q8_0, quant.QK), quant.Q4_0: (lib.TD_Q4_0, quant.QK),
          quant.Q8_0X8: (lib.TD_Q8_0X8, quant.QK),
          quant.Q4_0X8: (lib.TD_Q4_0X8, quant.QK), quant.F32P: (lib.TD_F32P, 1),
          quant.F16P: (lib.TD_F16P, 1), quant.BF16P: (lib.TD_BF16P, 1),
          **{dt: (getattr(lib, "TD_" + name.upper()), per) for name, (dt, per) in kquants.FORMATS.items()}}
# (weight dtype: its C type, the weights an element holds)


def physical_cores():
    """Distinct (package, core) pairs among the CPUs this process may run on; os.cpu_count() if unknown."""
    cores = set()
    for cpu in os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ():
        topo = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(topo + "physical_package_id") as f1, open(topo + "core_id") as f2:
                cores.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            return os.cpu_count() or 1
    return len(cores) or os.cpu_count() or 1


def _count(n):
    """n as an int, if it is a whole number of threads C can have (1..TD_MAX_THREADS)."""
    if not is_integer(n) or not 1 <= n <= lib.TD_MAX_THREADS:
        raise UsageError(f"threads must be a whole number from 1 to {lib.TD_MAX_THREADS}, got {n!r}")
    return int(n)


def set_threads(n):
    """Use n >= 1 threads (the caller decides how many cores make sense) in the calling thread's
    current pool: the default pool, or inside `with pool:` that pool."""
    lib.td_set_threads(_count(n))


def get_threads():
    """The thread count of the calling thread's current pool."""
    return lib.td_get_threads()


def check_threads(n, where="threads"):
    """n if it is a thread count for a model: an int from 1 to the machine's physical cores."""
    cores = physical_cores()
    if not is_integer(n) or not 1 <= n <= cores:
        raise UsageError(f"{where} must be between 1 and {cores} (this machine's cores), got {n!r}")
    return int(n)


def threads_from_env():
    """TINYDIFF_THREADS checked by check_threads, or the physical cores if it is not set."""
    env = os.environ.get("TINYDIFF_THREADS", "").strip()
    if not env:
        return physical_cores()
    return check_threads(int(env) if env.isdigit() else env, "TINYDIFF_THREADS")


class ThreadPool:
    """Threads of its own for the kernels (a model's: Model.pool), freed with the object.

    `with pool:` runs the calling thread's kernel calls on it until the block ends, then on the
    pool that was current before; blocks nest, and several Python threads may be inside one pool's
    block at once (their calls take turns on its threads)."""

    def __init__(self, threads):
        p = lib.td_pool_new(_count(threads))
        if p == ffi.NULL:
            raise MemoryError(f"no memory for a pool of {threads} threads")
        self._c = ffi.gc(p, lib.td_pool_free)
        self._outer = threading.local()     # per Python thread: the pools current before each `with`

    @property
    def threads(self):
        return lib.td_pool_threads(self._c)

    @threads.setter
    def threads(self, n):
        """A model's count, as load(threads=) takes it: 1 .. the machine's physical cores."""
        lib.td_pool_set_threads(self._c, check_threads(n))

    def __enter__(self):
        self._outer.__dict__.setdefault("stack", []).append(lib.td_pool_use(self._c))
        return self

    def __exit__(self, *exc):
        lib.td_pool_use(self._outer.stack.pop())

    def _max_parts(self, reset=False):
        """For tests: the most parts (threads) one job of this pool was cut into since the last reset."""
        return lib.td_pool_max_parts(self._c, reset)


def _default_pool_max_parts(reset=False):
    """For tests: ThreadPool._max_parts of the default pool (the one kernels run on outside a `with`)."""
    return lib.td_pool_max_parts(ffi.NULL, reset)


def _max_busy_pools(reset=False):
    """For tests: the most pools (the default one included) running a job at the same moment
    since the last reset."""
    return lib.td_max_busy_pools(reset)


def simd():
    """The instruction set the kernels use on this CPU: 'avx512', 'avx2' or 'c' (x86-64); 'neon'
    or 'c' (arm64)."""
    return SIMD_LEVELS[lib.td_get_simd()]


def simd_extensions():
    """The extensions the kernels use on this CPU: a tuple of 'avx512_vnni' (the int8 dot products
    on the AVX-512 path; without it, that kernel's AVX2 version runs),
    'dotprod' (arm64's int8 dot products on the NEON path; without it, widening multiplies)."""
    ext = lib.td_get_simd_ext()
    return tuple(name for bit, name in ((lib.TD_EXT_VNNI, "avx512_vnni"), (lib.TD_EXT_DOTPROD, "dotprod")) if ext & bit)


def _set_simd(name):
    """For tests: force a lower SIMD path (one of SIMD_LEVELS); returns the one in use."""
    return SIMD_LEVELS[lib.td_set_simd(SIMD_LEVELS.index(name))]


def _f32(a):
    """a itself if it is a float32 C-contiguous ndarray, else a float32 C-contiguous copy."""
    if a.__class__ is _ndarray and a.dtype is _F32 and a.flags.c_contiguous:
        return a
    return np.ascontiguousarray(a, dtype=np.float32)


def _out(out, shape, name, *inputs):
    """A new result array, or the caller's out after checking it fits and overlaps no input."""
    if out is None:
        return np.empty(shape, _F32)
    if not (isinstance(out, _ndarray) and out.dtype == _F32 and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"{name}: out must be a writable C-contiguous float32 array, got "
                         f"{getattr(out, 'dtype', type(out).__name__)} {getattr(out, 'shape', '')}")
    if out.shape != shape:
        raise ValueError(f"{name}: out has shape {out.shape}, expected {shape}")
    for a in inputs:
        if _shares(out, a):
            raise ValueError(f"{name}: out overlaps an input")
    return out


def _p(a):
    return _buf("float[]", a)


def matmul(x, w, out=None, op="matmul", residual=False):
    """out[..., m] = x[..., k] @ w[m, k].T (w in HF layout: out_features x in_features).

    w: float32 (or anything that converts to it), or a weight type of tinydiff.formats.quant read as it
    is stored (a block type: [m, k/32] or [m, k/256] blocks; x is then quantized first to the type its
    dot product takes, Q8_0, Q8_1 or Q8_K, as llama.cpp does: quant.quantize_x).
    residual: out (given) is the residual stream: out += x @ w.T, the add booked under 'residual'.
    op: the operation the cost is booked under when a Ledger is open (as in every kernel here)."""
    return matmuls(x, (w,), (out,), op, residual)[0]


def matmuls(x, ws, outs=None, op="matmul", residual=False):
    """outs[j] = matmul(x, ws[j], out=outs[j]) for each j: several matmuls of one input (q/k/v,
    gate/up) in one C call. For few rows of x (decoding), x is converted once to the weights' type
    and the output rows of all the weights make one job for the threads; weights of different
    types are multiplied one type after the other. Each matmul books its own cost. Returns the outs."""
    x = _f32(x)
    outs = (None,) * len(ws) if outs is None else outs
    if x.ndim < 1 or len(outs) != len(ws):
        raise ValueError(f"matmul: need x [n,k] or [k] and one out per weight, got x {x.shape}, "
                         f"{len(ws)} weights and {len(outs)} outs")
    if residual and any(out is None for out in outs):
        raise ValueError("matmul: residual=True adds to out: it must be given")
    lead, k = x.shape[:-1], x.shape[-1]
    n = lead[0] if len(lead) == 1 else math.prod(lead)
    ws, outs, wp, yp, ms, kinds = list(ws), list(outs), [], [], [], []
    for j, w in enumerate(ws):
        w, kind, cols, ptr = _weight(w)
        if w.ndim != 2 or cols != k:
            raise ValueError(f"matmul: x {x.shape} and w {w.shape} {w.dtype} do not fit; need x [n,k] or [k] and "
                             "w [m,k] (or [m,k/32] or [m,k/256] blocks)")
        m = quant.rows(w)
        ws[j] = w
        outs[j] = out = _out(outs[j], lead + (m,), "matmul", x, w)
        wp.append(ptr), yp.append(_p(out)), ms.append(m), kinds.append(kind)
    if _matmuls(kinds, _p(x), n, k, len(ws), wp, yp, ms, residual):
        raise MemoryError(f"matmul: no memory for x [{n},{k}] in the dot product's type"
                          + (" or for the products added to out" if residual else ""))
    if ledger.active():
        for w, m in zip(ws, ms):
            ledger.book(op, cost.matmul(n, k, m, quant.bytes_per_weight(w)))
            if residual:
                ledger.book("residual", cost.add(n * m))
    return outs


def gemm_min_rows():
    """The x rows from which f32 weights go through the GEMM (below them, register tiles whose
    rows do not depend on their company): 24, or 33 on AMD (matmul.c)."""
    return lib.td_gemm_min_rows()


def set_batch_invariant(on):
    """on (the default): every matmul computes a row of its product the same way whatever the
    rows beside it, so a request's answer does not depend on the batch it runs in; off: the GEMMs
    whose summation order differs from the few-rows kernels' take many rows (faster prefill).
    Returns the setting it replaces."""
    return bool(lib.td_set_batch_invariant(int(bool(on))))


def interleaved(w, panels=False):
    """w as the matmul reads it fastest on this CPU (a copy, made once at load, or w itself): a
    Q8_0 or Q4_0 matrix with rows in eights repacked into Q8_0X8 or Q4_0X8 where the SIMD path's
    kernels want that (AVX2, AVX512_VNNI); with panels (a model whose passes all have many rows:
    masked diffusion), an f32, f16 or bf16 one of whole panels of 32 rows into F32P, F16P or BF16P,
    which the GEMM reads without packing it on every call (csrc/matmul.c); without, one in panels
    back into rows, which few-row passes read best; anything else as it is."""
    if not isinstance(w, _ndarray) or w.ndim != 2:
        return w
    if quant.is_panels(w) and not panels:
        return quant.unpanel(w)
    if panels and w.dtype in quant.PANELS and w.shape[0] % quant.PANEL == 0:
        return quant.panels(w)
    if w.dtype in quant.X8 and w.shape[0] % quant.GROUP == 0 and lib.td_interleave(_TYPES[w.dtype][0]):
        return quant.interleave(w)
    return w


def _weight(w):
    """(w as the C kernels read it, its C type, k (numbers in a row), a pointer to it): an array of
    a weight type as it is (never copied: it must be C-contiguous), anything else as float32."""
    kind, per = _TYPES.get(w.dtype, (None, 1)) if isinstance(w, _ndarray) else (None, 1)
    if kind is not None and w.flags.c_contiguous and w.ndim:
        return w, kind, w.shape[-1] * per, _buf(w)
    if kind not in (None, lib.TD_F32):
        raise ValueError(f"matmul: {quant.type_of(w)} weights must be C-contiguous (they are never copied)")
    w = _f32(w)
    return w, lib.TD_F32, w.shape[-1] if w.ndim else -1, _buf(w)


def rmsnorm(x, w, eps, out=None, op="norm"):
    """out[n, d] = x / sqrt(mean(x^2) + eps) * w[d], per row (any leading dims)."""
    x, w = _f32(x), _f32(w)
    if x.ndim < 1 or w.shape != x.shape[-1:]:
        raise ValueError(f"rmsnorm: x {x.shape} and w {w.shape} do not fit; need x [n,d] and w [d]")
    out = _out(out, x.shape, "rmsnorm")
    n, d = x.shape[0] if x.ndim == 2 else math.prod(x.shape[:-1]), x.shape[-1]
    _rmsnorm(_p(x), _p(w), _p(out), n, d, eps)
    if ledger.active():
        ledger.book(op, cost.rmsnorm(n, d))
    return out


def softmax(x, out=None):
    """Softmax over the last axis."""
    x = _f32(x)
    if x.ndim < 1:
        raise ValueError("softmax: x must have at least one axis")
    out = _out(out, x.shape, "softmax")
    _softmax(_p(x), _p(out), math.prod(x.shape[:-1]), x.shape[-1])
    return out


def softmax_stats(z, entropy=False):
    """The softmax of each row of z [n, V] in float64 (-inf for the tokens ruled out, never a whole
    row), summed up in one pass: (top [n] the row's max, first [n] where it first is (argmax),
    total [n] = sum e^(z - top), h [n] = sum e^(z - top) (z - top) if entropy else None), so that
    p = e^(z - top) / total and its entropy is log(total) - h / total. e^ within ~2 ulp."""
    z = np.ascontiguousarray(z, np.float64)
    if z.ndim != 2 or z.shape[1] < 1:
        raise ValueError(f"softmax_stats: z must be [n, V] with V >= 1, got {z.shape}")
    n = len(z)
    top, total, first = np.empty(n), np.empty(n), np.empty(n, np.int64)
    h = np.empty(n) if entropy else None
    _softmax_stats(_buf("double[]", z), n, z.shape[1], _buf("double[]", top), _buf("int64_t[]", first),
                   _buf("double[]", total), _buf("double[]", h) if entropy else ffi.NULL)
    return top, first, total, h


def gumbel_max(z, temperature, u):
    """One token per row of z [n, V] (float64 logits, -inf for the tokens ruled out), drawn from
    softmax(z / temperature) by Gumbel-max: argmax(z / temperature + g), g = -log(-log(1 - u)) from
    the uniforms u [n, V] in [0, 1) (rng.random(z.shape): the numbers rng.gumbel(size=z.shape)
    would have made, so the draw is tinydiff.decoding.sampling.gumbel_max's with that rng)."""
    z, u = np.ascontiguousarray(z, np.float64), np.ascontiguousarray(u, np.float64)
    if z.ndim != 2 or z.shape[1] < 1 or u.shape != z.shape or not temperature > 0:
        raise ValueError(f"gumbel_max: z {z.shape} and u {u.shape} must be the same [n, V], temperature > 0 "
                         f"(got {temperature!r})")
    tok = np.empty(len(z), np.int64)
    _gumbel_max(_buf("double[]", z), _buf("double[]", u), len(z), z.shape[1], float(temperature),
                _buf("int64_t[]", tok))
    return tok


def rope(x, pos, inv_freq, op="rope"):
    """Rotate x [n, heads, hd] in place (rotate-half layout); pos int [n], inv_freq [hd/2]. Returns x."""
    pos, inv_freq = _rope_args((x,), pos, inv_freq)
    _rope(_p(x), _buf("int64_t[]", pos), _p(inv_freq), *x.shape)
    if ledger.active():
        ledger.book(op, cost.rope(*x.shape))
    return x


def rope_qk(q, k, pos, inv_freq, op="rope"):
    """rope(q, pos, inv_freq) and rope(k, pos, inv_freq) in one call: q [n, H, hd] and k [n, KVH, hd]
    rotated in place alike, each position's angles computed once. Returns q, k."""
    pos, inv_freq = _rope_args((q, k), pos, inv_freq)
    _rope_qk(_p(q), _p(k), _buf("int64_t[]", pos), _p(inv_freq), q.shape[0], q.shape[1], k.shape[1], q.shape[2])
    if ledger.active():
        ledger.book(op, cost.rope(*q.shape))
        ledger.book(op, cost.rope(*k.shape))
    return q, k


def _rope_args(xs, pos, inv_freq):
    """(pos as int64, inv_freq as float32), C-contiguous, after checking they fit each x of xs
    (which rope rotates in place)."""
    if not (pos.__class__ is _ndarray and pos.dtype is _I64 and pos.flags.c_contiguous):
        pos = np.asarray(pos)
        if pos.dtype.kind not in "iu":
            raise ValueError(f"rope: pos must be integers, got {pos.dtype}")
        pos = np.ascontiguousarray(pos, dtype=np.int64)
    inv_freq = _f32(inv_freq)
    for x in xs:
        if not (isinstance(x, _ndarray) and x.dtype == _F32 and x.flags.c_contiguous and x.flags.writeable):
            raise ValueError("rope: x must be a writable C-contiguous float32 array (it is rotated in place)")
        if x.ndim != 3 or x.shape[2] % 2 or inv_freq.shape != (x.shape[2] // 2,) or pos.shape != x.shape[:1]:
            raise ValueError(f"rope: x {x.shape}, pos {pos.shape}, inv_freq {inv_freq.shape} do not fit; "
                             "need x [n,heads,hd] with hd even, pos [n], inv_freq [hd/2]")
    return pos, inv_freq


def silu_mul(gate, up, out=None, op="mlp"):
    """out = silu(gate) * up, elementwise; gate and up of one shape."""
    return _gated("silu_mul", _silu_mul, cost.silu_mul, gate, up, out, op)


def gelu_tanh_mul(gate, up, out=None, op="mlp"):
    """out = gelu_tanh(gate) * up, elementwise (Gemma's GeGLU); gate and up of one shape. gelu_tanh is
    PyTorch's gelu(approximate="tanh"): 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), -0 at -inf."""
    return _gated("gelu_tanh_mul", _gelu_tanh_mul, cost.gelu_tanh_mul, gate, up, out, op)


def _gated(name, kernel, booked, gate, up, out, op):
    """A gated MLP product act(gate) * up by its C kernel, checked and booked the same for every act."""
    gate, up = _f32(gate), _f32(up)
    if gate.shape != up.shape:
        raise ValueError(f"{name}: gate {gate.shape} and up {up.shape} differ")
    out = _out(out, gate.shape, name)
    kernel(_p(gate), _p(up), _p(out), gate.size)
    if ledger.active():
        ledger.book(op, booked(gate.size))
    return out


def attention(q, k, v, out=None, *, mask=CAUSAL, q_pos0=0, scale=None, op="attention", pages=None, t=None):
    """out[n,H,hd] = softmax(q k^T * scale, over the visible keys) v; q [n,H,hd], k v [t,KVH,hd].

    Head h uses kv head h // (H // KVH). mask: a masks.AttentionMask (CAUSAL, BIDIRECTIONAL,
    block_causal(b), any of them .windowed(w)) saying which keys query i, at position q_pos0 + i,
    sees; the ledger books the
    mask.pairs (query, key) pairs it lets through. scale defaults to 1/sqrt(hd). A query that sees
    no key gets zeros. Hidden keys weigh exactly 0, so, as in a plain softmax(...) @ v, their values
    must be finite (a KV cache from np.zeros is fine).

    Paged keys (a paged KV cache): k and v are pools [pages*PAGE, KVH, hd] of pages of PAGE rows,
    pages (int64) the pool page of each PAGE keys of the sequence, t its number of keys.
    """
    q, k, v = _f32(q), _f32(k), _f32(v)
    if (q.ndim != 3 or k.ndim != 3 or v.shape != k.shape or q.shape[2] != k.shape[2]
            or k.shape[1] == 0 or q.shape[1] % k.shape[1]):
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit; need q [n,H,hd], "
                         "k and v [t,KVH,hd] with H a multiple of KVH")
    if not isinstance(mask, AttentionMask):
        raise ValueError(f"attention: mask must be a masks.AttentionMask, got {mask!r}")
    n, heads, hd = q.shape
    kv_heads = k.shape[1]
    if q_pos0 < 0:
        raise ValueError(f"attention: q_pos0 must be >= 0, got {q_pos0}")
    out = _out(out, q.shape, "attention", q, k, v)
    scale = (1.0 / math.sqrt(hd) if hd else 1.0) if scale is None else float(scale)
    if pages is None:
        t = k.shape[0]
        failed = _attention(_p(q), _p(k), _p(v), _p(out), n, t, heads, kv_heads, hd, mask.block, mask.window,
                            int(q_pos0), scale)
    else:
        pages = np.ascontiguousarray(pages, dtype=np.int64)
        if (t is None or not 0 <= t <= len(pages) * PAGE or len(k) % PAGE
                or ((pages < 0) | (pages >= len(k) // PAGE)).any()):
            raise ValueError(f"attention: {t} keys in pages {pages.tolist()} do not fit a pool of {len(k)} rows "
                             f"(pages of {PAGE})")
        failed = _attention_paged(_p(q), _p(k), _p(v), _buf("int64_t[]", pages), _p(out), n, t, heads, kv_heads,
                                  hd, mask.block, mask.window, int(q_pos0), scale)
    if failed:
        raise MemoryError("attention: no scratch memory")
    if ledger.active():
        ledger.book(op, cost.attention(n, heads, kv_heads, hd, t, mask.pairs(n, t, int(q_pos0))))
    return out


# -- NumPy glue the forward pass also books: small next to the kernels, but real bytes ----------

def add_bias(x, b, op="matmul"):
    """x[n, m] += b[m] in place (b is a weight, read once)."""
    np.add(x, b, out=x)
    if ledger.active():
        ledger.book(op, cost.bias_add(x.size // b.size, b.size, quant.bytes_per_weight(b)))
    return x


def add(x, y, op="residual"):
    """x[n, d] += y[n, d] in place (a residual from a block whose output was normed first)."""
    np.add(x, y, out=x)
    if ledger.active():
        ledger.book(op, cost.add(x.size))
    return x


def scale(x, s, op="embedding"):
    """x *= s in place, in float32 (the embedding's scale)."""
    np.multiply(x, np.float32(s), out=x)
    if ledger.active():
        ledger.book(op, cost.scale(x.size))
    return x


def softcap(x, cap, op="lm_head"):
    """x = cap * tanh(x / cap) in place, in float32, in the order Gemma 2 writes it (divide, tanh, multiply)."""
    cap = np.float32(cap)
    np.divide(x, cap, out=x)
    np.tanh(x, out=x)
    np.multiply(x, cap, out=x)
    if ledger.active():
        ledger.book(op, cost.softcap(x.size))
    return x


def embedding(table, ids, out, op="embedding"):
    """out[n, d] = table[ids], the table of any weight type: only the rows asked for are read."""
    kind, per = _TYPES.get(table.dtype, (None, 1))
    if ids.dtype.kind not in "iu":
        raise ValueError(f"embedding: token ids must be integers, got {ids.dtype}")
    if (kind is None or out.shape != (ids.size, table.shape[1] * per) or out.dtype is not _F32
            or not out.flags.writeable):
        raise ValueError(f"embedding: table {table.shape} {table.dtype}, ids {ids.shape} and out "
                         f"{out.shape} {out.dtype} do not fit")
    table = table if table.flags.c_contiguous else np.ascontiguousarray(table)  # weights are: no copy
    ids = ids if ids.dtype is _I64 and ids.flags.c_contiguous else np.ascontiguousarray(ids, dtype=np.int64)
    m = quant.rows(table)
    if _rows_to_f32(kind, _buf(table), m, out.shape[1], _buf("int64_t[]", ids), ids.size, _p(out)):
        raise ValueError(f"embedding: a token id is outside 0..{m - 1}")
    if ledger.active():
        ledger.book(op, cost.embedding(*out.shape, quant.bytes_per_weight(table)))
    return out


def store(slot, rows, op="attention"):
    """slot[...] = rows: new K or V rows copied into their cache slots."""
    slot[...] = rows
    if ledger.active():
        ledger.book(op, cost.kv_store(rows.size))
    return slot


def store_at(pool, at, rows, op="attention"):
    """pool[at] = rows: new K or V rows copied into the pool rows `at` (a paged cache's)."""
    pool[at] = rows
    if ledger.active():
        ledger.book(op, cost.kv_store(rows.size))
    return pool


def _threads_at_import():
    """threads_from_env(), or the physical cores if TINYDIFF_THREADS is bad: importing never fails
    on it (tinydiff.load reports it)."""
    try:
        return threads_from_env()
    except UsageError:
        return physical_cores()


def simd_from_env():
    """TINYDIFF_SIMD, one of this CPU's SIMD paths (SIMD_LEVELS up to the best it has), or None if
    it is not set: the kernels run that path instead of the best one (another CPU's instruction
    set measured on this one, as `TINYDIFF_SIMD=avx2 tinydiff bench` on an AVX-512 machine)."""
    env = os.environ.get("TINYDIFF_SIMD", "").strip().lower()
    if not env:
        return None
    levels = SIMD_LEVELS[:SIMD_LEVELS.index(BEST_SIMD) + 1]
    if env not in levels:
        raise UsageError(f"TINYDIFF_SIMD must be one of this CPU's paths ({', '.join(levels)}), got {env!r}")
    return env


def _simd_at_import():
    """Runs simd_from_env()'s path if it names a good one: importing never fails on it
    (tinydiff.load reports it)."""
    try:
        level = simd_from_env()
    except UsageError:
        return
    if level:
        _set_simd(level)


set_threads(_threads_at_import())
BEST_SIMD = simd()                  # this CPU's best path, before TINYDIFF_SIMD
_simd_at_import()
