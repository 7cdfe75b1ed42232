"""Plain NumPy versions of every kernel in tinydiff.engine.kernels, with the same signatures.

Written to be read, not to be fast: the tests check the C kernels against these. Shapes follow
tinydiff.engine.kernels; all math is float32 like the kernels (and like HF's float32 forward).
"""
import numpy as np

from ..formats import quant
from .masks import CAUSAL

_threads = 1


def set_threads(n):
    global _threads
    _threads = int(n)


def get_threads():
    return _threads


def _into(out, y):
    if out is None:
        return y
    out[...] = y
    return out


def matmul(x, w, out=None):
    x = np.asarray(x, np.float32)                                # [n,k] or [k]
    w = _widened(w)                                              # [m,k], any weight type
    return _into(out, x @ w.T)                                   # [n,m] or [m]


def matmul_exact(x, w):
    """x @ w.T in float64 as the C kernels compute it, before any f32 rounding of theirs.

    x is first converted as the kernels convert it for w's type: quantized to Q8_0 for Q8_0 and
    Q4_0 weights (quant.quantize rounds as the C does), else kept (f16 and bf16 weights are widened
    and x stays f32). Any two such numbers multiply exactly in float64
    (a Q8_0 value d*q has 11+8 significant bits, an f32 24), so the sum over a 32-block of
    d_x*q_x * d_w*q_w is d_x*d_w times the integer block dot product the C computes; only the
    float64 sums round (k * 2^-53 relative), far below the kernels' own f32 rounding."""
    x = np.asarray(x, np.float32)                                          # [n,k] or [k]
    if quant.is_blocked(w):
        x = quant.dequantize(quant.quantize(x, "q8_0"))                    # exact: d*q fits in f32
    return x.astype(np.float64) @ _widened(w).astype(np.float64).T       # [n,m] or [m]


def _widened(w):
    """A weight array of any type as float32 [m, k]."""
    if isinstance(w, np.ndarray) and w.dtype in (*quant.TYPES.values(), *quant.MADE_AT_LOAD.values()):
        return quant.dequantize(w)
    return np.asarray(w, np.float32)


def rmsnorm(x, w, eps, out=None):
    x = np.asarray(x, np.float32)                                      # [n,d]
    var = np.mean(x * x, axis=-1, keepdims=True)                       # [n,1]
    y = x * (np.float32(1.0) / np.sqrt(var + np.float32(eps)))         # [n,d]
    return _into(out, np.asarray(w, np.float32) * y)                   # [n,d]


def softmax(x, out=None):
    x = np.asarray(x, np.float32)                                      # [n,d]
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))                  # [n,d]
    return _into(out, e / np.sum(e, axis=-1, keepdims=True))          # [n,d]


def softmax_stats(z, entropy=False):
    z = np.asarray(z, np.float64)                                      # [n,V] float64: the sampler's scores
    top = np.max(z, axis=-1)                                           # [n]
    d = np.maximum(z - top[:, None], -745.0)                           # [n,V] -inf adds 0, never NaN
    e = np.exp(d)                                                      # [n,V]
    return top, np.argmax(z, axis=-1), e.sum(-1), (e * d).sum(-1) if entropy else None


def gumbel_max(z, temperature, u):
    z, u = np.asarray(z, np.float64), np.asarray(u, np.float64)       # [n,V] each, float64
    with np.errstate(divide="ignore"):                                 # u = 0: log(-log 1) = -inf
        g = np.where(u > 0, -np.log(-np.log(1.0 - u)), -np.inf)        # [n,V] Gumbel noise from u
    return np.argmax(z / temperature + g, axis=-1)                     # [n]


def rope(x, pos, inv_freq):
    half = x.shape[-1] // 2
    angle = np.asarray(pos).astype(np.float32)[:, None] * np.asarray(inv_freq, np.float32)  # [n,hd/2]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]    # [n,1,hd/2]
    x1, x2 = x[..., :half].copy(), x[..., half:].copy()                # [n,heads,hd/2]
    x[..., :half] = x1 * cos - x2 * sin
    x[..., half:] = x2 * cos + x1 * sin
    return x                                                           # [n,heads,hd], in place


def silu_mul(gate, up, out=None):
    g = np.asarray(gate, np.float32)
    return _into(out, g / (np.float32(1.0) + np.exp(-g)) * np.asarray(up, np.float32))


def gelu_tanh_mul(gate, up, out=None):
    # gelu_tanh(g) = 0.5 g (1 + tanh(u)), u = sqrt(2/pi) (g + 0.044715 g^3) (torch's approximate="tanh"),
    # written g / (1 + exp(-2u)) since 1 + tanh(u) = 2 / (1 + exp(-2u)), with -2u = g (a + b g^2) as
    # csrc/activation.c has it: no cancellation in 1 + tanh(u) for g < 0. At -inf its limit, -0.
    g = np.asarray(gate, np.float32)
    a, b = np.float32(-2 * np.sqrt(2 / np.pi)), np.float32(-2 * np.sqrt(2 / np.pi) * 0.044715)
    with np.errstate(over="ignore", invalid="ignore"):                 # exp -> inf (g < -10.2): g / inf = -0
        y = np.where(g == -np.inf, np.float32(-0.0), g / (np.float32(1.0) + np.exp(g * (a + b * (g * g)))))
    return _into(out, y * np.asarray(up, np.float32))


def attention(q, k, v, out=None, *, mask=CAUSAL, q_pos0=0, scale=None):
    q, k, v = (np.asarray(a, np.float32) for a in (q, k, v))          # q [n,H,hd], k v [t,KVH,hd]
    n, heads, hd = q.shape
    t = k.shape[0]
    k = np.repeat(k, heads // k.shape[1], axis=1)                      # [t,H,hd], head h -> kv head h // group
    v = np.repeat(v, heads // v.shape[1], axis=1)                      # [t,H,hd]
    scale = 1.0 / np.sqrt(hd) if scale is None else scale
    s = np.einsum("nhd,thd->hnt", q, k) * np.float32(scale)            # [H,n,t]
    allowed = mask.dense(n, t, q_pos0)                                 # [n,t]
    s = np.where(allowed[None], s, -np.inf)                            # [H,n,t]
    smax = np.max(s, axis=-1, keepdims=True)                           # [H,n,1]
    p = np.exp(s - np.where(np.isfinite(smax), smax, 0))               # [H,n,t], 0 where masked
    l = np.sum(p, axis=-1, keepdims=True)                              # [H,n,1]
    p = p / np.where(l > 0, l, 1)                                      # a query with no key: all zeros
    return _into(out, np.einsum("hnt,thd->nhd", p, v).astype(np.float32))  # [n,H,hd]
