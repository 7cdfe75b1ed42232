"""Plain NumPy versions of every kernel in tinydiff.kernels, with the same signatures.

Written to be read, not to be fast: the tests check the C kernels against these. Shapes follow
tinydiff.kernels; all math is float32 like the kernels (and like HF's float32 forward).
"""
import os

import numpy as np

_threads = 1


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
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)  # x [n,k] or [k], w [m,k]
    return _into(out, x @ w.T)                                   # [n,m] or [m]


def rmsnorm(x, w, eps, out=None):
    x = np.asarray(x, np.float32)                                      # [n,d]
    var = np.mean(x * x, axis=-1, keepdims=True)                       # [n,1]
    y = x * (np.float32(1.0) / np.sqrt(var + np.float32(eps)))         # [n,d]
    return _into(out, np.asarray(w, np.float32) * y)                   # [n,d]


def softmax(x, out=None):
    x = np.asarray(x, np.float32)                                      # [n,d]
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))                  # [n,d]
    return _into(out, e / np.sum(e, axis=-1, keepdims=True))          # [n,d]


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


def attention(q, k, v, out=None, *, causal=True, q_pos0=0, mask=None, scale=None):
    q, k, v = (np.asarray(a, np.float32) for a in (q, k, v))          # q [n,H,hd], k v [t,KVH,hd]
    n, heads, hd = q.shape
    t = k.shape[0]
    k = np.repeat(k, heads // k.shape[1], axis=1)                      # [t,H,hd], head h -> kv head h // group
    v = np.repeat(v, heads // v.shape[1], axis=1)                      # [t,H,hd]
    scale = 1.0 / np.sqrt(hd) if scale is None else scale
    s = np.einsum("nhd,thd->hnt", q, k) * np.float32(scale)            # [H,n,t]
    allowed = np.ones((n, t), bool)                                    # [n,t]
    if causal:
        allowed &= np.arange(t)[None, :] <= q_pos0 + np.arange(n)[:, None]
    if mask is not None:
        allowed &= np.asarray(mask, bool)
    s = np.where(allowed[None], s, -np.inf)                            # [H,n,t]
    smax = np.max(s, axis=-1, keepdims=True)                           # [H,n,1]
    p = np.exp(s - np.where(np.isfinite(smax), smax, 0))               # [H,n,t], 0 where masked
    l = np.sum(p, axis=-1, keepdims=True)                              # [H,n,1]
    p = p / np.where(l > 0, l, 1)                                      # a query with no key: all zeros
    return _into(out, np.einsum("hnt,thd->nhd", p, v).astype(np.float32))  # [n,H,hd]
