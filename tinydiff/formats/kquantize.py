"""Quantizers for the block formats of kquants.py that llama-quantize writes without an importance
matrix: Q4_1, Q5_0, Q5_1 (blocks of 32) and Q4_K, Q5_K, Q6_K (super-blocks of 256).

Each takes float32 blocks x [..., 32] or [..., 256] and returns the blocks [...] of its dtype,
byte for byte what ggml's reference quantizer writes (ggml-quants.c, quantize_row_*_ref, which
quantize_q4_K & co. call when quant_weights is NULL, as llama-quantize passes without --imatrix).
The same float32 steps in the same order, vectorised across blocks: every sum over a block's
weights is a left fold (ggml's loop; NumPy's pairwise sum rounds differently), rounding to the
nearest integer is rint (ggml's nearest_int, halves to even), float -> int8 casts truncate, as C's.
libggml-base is built without FMA (GGML_NATIVE off: no contraction), so plain float32 products and
sums are its arithmetic; tests compare our bytes with llama-quantize's own.

The K-quants search each sub-block's scale (and minimum) as ggml does:
  Q4_K, Q5_K  make_qkx2_quants: per sub-block of 32, weights av|x| + |x_i|, a minimum <= 0 and a
              scale refit by weighted least squares over nstep + 1 trial grids (rmin + rdelta * is);
              the 8 scales and 8 minimums then 6-bit integers of the super-block's d and dmin
  Q6_K        make_qx_quants (rmse_type 1): per sub-block of 16, symmetric, weights x^2, 18 trial
              scales -(32 + 0.1 is) / max; the 16 scales int8 of the super-block's d
and the quants are finally recomputed from the stored (f16-rounded) scales.
"""
import functools
import operator

import numpy as np

from . import kquants
from .kquants import QK_K

GROUP_MAX_EPS = np.float32(1e-15)   # ggml's threshold for an all-zero group
F = np.float32


def _fold(a):
    """a [n, ...] -> [...]: a[0] + a[1] + ... in that order (a C loop's float sum)."""
    return functools.reduce(operator.add, a)


def _trunc_u8(v):
    """C's (int8_t) / (uint8_t) cast of a float in 0..127: truncation."""
    return np.trunc(v).astype(np.int8).astype(np.uint8)


def _f16(v):
    return v.astype(np.float16)


def _fifth_bits(q):
    """q [..., 32] quants 0..31 -> [..., 4] bytes: bit j of the little-endian u32 is q[j]'s bit 4."""
    return np.packbits((q >> 4).astype(np.uint8) & 1, axis=-1, bitorder="little")


def _nibble_pairs(q):
    """q [..., 32] -> [..., 16]: low nibble q[j], high nibble q[j + 16] (Q4_0's order)."""
    return (q[..., :16] & 15) | ((q[..., 16:] & 15) << 4)


# ----------------------------------------------------------------------------------------------
# blocks of 32

def _min_max_scale(x, nmax):
    """Q4_1's and Q5_1's d = (max - min) / nmax, its inverse (0 for a flat block) and min."""
    lo, hi = x.min(axis=-1), x.max(axis=-1)
    d = (hi - lo) / F(nmax)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F(1) / d, F(0)).astype(F)
    return d, inv, lo


def quantize_q4_1(x):
    """x [..., 32] f32 -> Q4_1 [...] (quantize_row_q4_1_ref): q = min(15, trunc((x - min) / d + 0.5))."""
    x = np.asarray(x, F)
    d, inv, lo = _min_max_scale(x, 15)
    q = np.minimum(_trunc_u8((x - lo[..., None]) * inv[..., None] + F(0.5)), 15)
    y = np.empty(x.shape[:-1], kquants.Q4_1)
    y["d"], y["m"], y["qs"] = _f16(d), _f16(lo), _nibble_pairs(q)
    return y


def quantize_q5_1(x):
    """x [..., 32] f32 -> Q5_1 [...] (quantize_row_q5_1_ref): q = trunc((x - min) / d + 0.5)."""
    x = np.asarray(x, F)
    d, inv, lo = _min_max_scale(x, 31)
    q = _trunc_u8((x - lo[..., None]) * inv[..., None] + F(0.5))
    y = np.empty(x.shape[:-1], kquants.Q5_1)
    y["d"], y["m"], y["qh"], y["qs"] = _f16(d), _f16(lo), _fifth_bits(q), _nibble_pairs(q)
    return y


def quantize_q5_0(x):
    """x [..., 32] f32 -> Q5_0 [...] (quantize_row_q5_0_ref): d = (the value of largest magnitude,
    the first) / -16, q = min(31, trunc(x / d + 16.5))."""
    x = np.asarray(x, F)
    big = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    d = big / F(-16)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F(1) / d, F(0)).astype(F)
    q = np.minimum(_trunc_u8(x * inv[..., None] + F(16.5)), 31)
    y = np.empty(x.shape[:-1], kquants.Q5_0)
    y["d"], y["qh"], y["qs"] = _f16(d), _fifth_bits(q), _nibble_pairs(q)
    return y


# ----------------------------------------------------------------------------------------------
# super-blocks of 256: the sub-blocks' weights along axis 0, X [n, S] for S sub-blocks

def _grid(iscale, X, lo, nmax):
    """clamp(nearest_int(iscale * (x - lo)), 0, nmax) as float32 [n, S]."""
    return np.clip(np.rint(iscale * (X - lo)), 0, nmax)


def make_qkx2_quants(X, W, nmax, rmin, rdelta, nstep):
    """ggml's make_qkx2_quants on every column of X [n, S] with weights W [n, S] (use_mad false):
    quants L [n, S] in 0..nmax, scale [S] and the minimum's magnitude [S], x ~ scale * L - min."""
    lo, hi = X.min(axis=0), X.max(axis=0)
    sum_w, sum_x = _fold(W), _fold(W * X)
    lo = np.minimum(lo, F(0))
    flat = hi == lo
    iscale = F(nmax) / np.where(flat, F(1), hi - lo)
    scale = F(1) / iscale
    L = _grid(iscale, X, lo, nmax)
    best = _fold(W * np.square(scale * L + lo - X))
    for step in range(nstep + 1):       # ggml's grids span max - min with the minimum found so far
        iscale = (F(rmin) + F(rdelta) * F(step) + F(nmax)) / np.where(flat, F(1), hi - lo)
        La = _grid(iscale, X, lo, nmax)
        WL = W * La
        sum_l, sum_l2, sum_xl = _fold(WL), _fold(WL * La), _fold(WL * X)
        D = sum_w * sum_l2 - sum_l * sum_l
        with np.errstate(divide="ignore", invalid="ignore"):
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0
            this_min = np.where(pos, F(0), this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
        err = _fold(W * np.square(this_scale * La + this_min - X))
        better = (D > 0) & (err < best) & ~flat
        L = np.where(better, La, L)
        best, scale, lo = np.where(better, err, best), np.where(better, this_scale, scale), np.where(better, this_min, lo)
    L = np.where(flat, F(0), L)
    scale = np.where(flat, F(0), scale)
    return L, scale, -lo


def _six_bits(v, inv):
    """min(63, (uint8) nearest_int(inv * v)): a 6-bit sub-block scale or minimum."""
    return np.minimum(np.rint(inv * v).astype(np.int64) & 255, 63).astype(np.uint8)


def _pack_scale_min_k4(ls, lm):
    """8 scales and 8 minimums of 6 bits [..., 8] -> Q4_K's 12 bytes (kquants._scale_min_k4 undone)."""
    out = np.empty((*ls.shape[:-1], 12), np.uint8)
    out[..., 0:4] = ls[..., :4] | ((ls[..., 4:] >> 4) << 6)
    out[..., 4:8] = lm[..., :4] | ((lm[..., 4:] >> 4) << 6)
    out[..., 8:12] = (ls[..., 4:] & 15) | ((lm[..., 4:] & 15) << 4)
    return out


def _positive_max(v):
    """max(0, v over the last axis), as a C loop from 0 with `if (v > best)` finds it."""
    return np.maximum(v.max(axis=-1), F(0))


def _quantize_k(x, nmax, rmin, nstep):
    """Q4_K (nmax 15) or Q5_K (31): x [N, 256] -> d, dmin f32 (f16-rounded) [N], packed scales
    [N, 12], quants [N, 256] in 0..nmax (quantize_row_q4_K_ref / _q5_K_ref)."""
    N = x.shape[0]
    X = np.ascontiguousarray(x.reshape(N * 8, 32).T)                          # [32, S]: S = 8N sub-blocks
    av = np.sqrt(_fold(X * X) / F(32))
    L, scales, mins = make_qkx2_quants(X, av + np.abs(X), nmax, rmin, 0.1, nstep)
    scales, mins = scales.reshape(N, 8), mins.reshape(N, 8)
    max_scale, max_min = _positive_max(scales), _positive_max(mins)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, F(63) / max_scale, F(0)).astype(F)
        inv_min = np.where(max_min > 0, F(63) / max_min, F(0)).astype(F)
    ls, lm = _six_bits(scales, inv_scale[:, None]), _six_bits(mins, inv_min[:, None])
    d, dmin = _f16(max_scale / F(63)), _f16(max_min / F(63))
    dl = (d.astype(F)[:, None] * ls.astype(F)).reshape(-1)                     # [S]
    ml = (dmin.astype(F)[:, None] * lm.astype(F)).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        Lr = np.clip(np.rint((X + ml) / dl), 0, nmax)
    L = np.where(dl != 0, Lr, L)                                              # a zero scale keeps the search's quants
    return d, dmin, _pack_scale_min_k4(ls, lm), L.T.reshape(N, QK_K).astype(np.uint8)


def _blocks256(x):
    x = np.asarray(x, F)
    return x.reshape(-1, QK_K), x.shape[:-1]


def _nibbles_64(q):
    """quants [N, 256] 0..15 -> [N, 128]: byte 32j + l holds weight 64j + l low, 64j + 32 + l high."""
    q = q.reshape(-1, 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)


def quantize_q4_k(x):
    """x [..., 256] f32 -> Q4_K [...] (quantize_row_q4_K_ref)."""
    xb, shape = _blocks256(x)
    d, dmin, scales, q = _quantize_k(xb, 15, -1.0, 20)
    y = np.empty(len(xb), kquants.Q4_K)
    y["d"], y["dmin"], y["scales"], y["qs"] = d, dmin, scales, _nibbles_64(q)
    return y.reshape(shape)


def quantize_q5_k(x):
    """x [..., 256] f32 -> Q5_K [...] (quantize_row_q5_K_ref): Q4_K's layout, the fifth bit of weight
    32j + l in bit j of qh[l]."""
    xb, shape = _blocks256(x)
    d, dmin, scales, q = _quantize_k(xb, 31, -0.5, 15)
    y = np.empty(len(xb), kquants.Q5_K)
    y["d"], y["dmin"], y["scales"] = d, dmin, scales
    y["qs"] = _nibbles_64(q & 15)
    high = (q >> 4).reshape(-1, 8, 32)                                        # [N, j, l]
    y["qh"] = (high << np.arange(8, dtype=np.uint8)[:, None]).sum(axis=1, dtype=np.uint8)
    return y.reshape(shape)


def make_qx_quants(X, nmax):
    """ggml's make_qx_quants with rmse_type 1 and no weights on every column of X [n, S]: quants
    L [n, S] in 0..2 nmax - 1 (x ~ scale * (L - nmax)) and scale [S]."""
    idx = np.abs(X).argmax(axis=0)
    big = np.take_along_axis(X, idx[None], axis=0)[0]                         # [S] signed, the first
    zero = np.abs(big) < GROUP_MAX_EPS
    big = np.where(zero, F(1), big)
    W = X * X

    def trial(iscale):
        l = np.clip(np.rint(iscale * X), -nmax, nmax - 1)
        return l, _fold(W * X * l), _fold(W * l * l)

    l, sumlx, suml2 = trial(F(-nmax) / big)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 != 0, sumlx / suml2, F(0)).astype(F)
    best, L = scale * sumlx, l
    for step in (*range(-9, 0), *range(1, 10)):
        l, sumlx, suml2 = trial(-(F(nmax) + F(0.1) * F(step)) / big)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        with np.errstate(divide="ignore", invalid="ignore"):
            new = sumlx / suml2
        L, scale = np.where(better, l, L), np.where(better, new, scale)
        best = np.where(better, scale * sumlx, best)
    return np.where(zero, F(0), L + nmax), np.where(zero, F(0), scale)


def quantize_q6_k(x):
    """x [..., 256] f32 -> Q6_K [...] (quantize_row_q6_K_ref): 16 sub-blocks of 16, int8 scales of
    d = max_scale / -128 (the scale of largest magnitude), quants -32..31 stored + 32."""
    xb, shape = _blocks256(x)
    N = len(xb)
    X = np.ascontiguousarray(xb.reshape(N * 16, 16).T)                        # [16, S]: S = 16N
    L, scales = make_qx_quants(X, 32)
    scales = scales.reshape(N, 16)
    first = np.abs(scales).argmax(axis=-1)[:, None]
    max_scale = np.take_along_axis(scales, first, axis=-1)[:, 0]
    zero = np.abs(max_scale) < GROUP_MAX_EPS
    with np.errstate(divide="ignore"):
        iscale = F(-128) / np.where(zero, F(1), max_scale)
    d = _f16(F(1) / iscale)
    sq = np.minimum(np.rint(iscale[:, None] * scales), 127).astype(np.int8)    # [N, 16]
    dl = (d.astype(F)[:, None] * sq.astype(F)).reshape(-1)                     # [S]
    with np.errstate(divide="ignore", invalid="ignore"):
        Lr = np.clip(np.rint(X / dl), -32, 31) + 32
    L = np.where(dl != 0, Lr, L).T.reshape(N, QK_K).astype(np.uint8)          # [N, 256] 0..63
    q = L.reshape(N, 2, 4, 32)                                                 # [N, half, quarter, l]
    y = np.zeros(N, kquants.Q6_K)
    y["ql"] = ((q[:, :, 0:2] & 15) | ((q[:, :, 2:4] & 15) << 4)).reshape(N, 128)
    y["qh"] = ((q >> 4) << (2 * np.arange(4, dtype=np.uint8))[:, None]).sum(axis=2, dtype=np.uint8).reshape(N, 64)
    y["scales"], y["d"] = sq, d
    y[zero] = np.zeros(1, kquants.Q6_K)                                        # an all-zero super-block
    return y.reshape(shape)


QUANTIZERS = {"q4_1": quantize_q4_1, "q5_0": quantize_q5_0, "q5_1": quantize_q5_1,
              "q4_k": quantize_q4_k, "q5_k": quantize_q5_k, "q6_k": quantize_q6_k}
