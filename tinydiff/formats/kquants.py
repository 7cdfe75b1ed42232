"""The block formats llama.cpp writes beyond Q8_0 and Q4_0, as NumPy dtypes and their reference
dequantizers; quant.py's registry (TYPES, dequantize, bytes_per_weight) takes them from here.

Byte for byte ggml-common.h's blocks (csrc/quant.h documents each beside its C struct), so a GGUF
tensor maps onto an array of them without conversion: [..., k / block] of

    name    block  bytes  bits   fields                                  weight
    Q4_1     32     20    5      d, m f16; qs u8[16] nibbles              d * q + m
    Q5_0     32     22    5.5    d f16; qh u8[4] fifth bits; qs u8[16]    d * (q - 16)
    Q5_1     32     24    6      d, m f16; qh u8[4]; qs u8[16]            d * q + m
    IQ4_NL   32     18    4.5    d f16; idx u8[16] nibbles                d * GRID[idx]
    Q2_K    256     84    2.625  scales u8[16] (4-bit scale, 4-bit min); qs u8[64]; d, dmin f16
    Q3_K    256    110    3.4375 hmask u8[32]; qs u8[64]; scales u8[12] (16 6-bit); d f16
    Q4_K    256    144    4.5    d, dmin f16; scales u8[12] (8 6-bit scales, 8 mins); qs u8[128]
    Q5_K    256    176    5.5    d, dmin f16; scales u8[12]; qh u8[32]; qs u8[128]
    Q6_K    256    210    6.5625 ql u8[128]; qh u8[64]; scales i8[16]; d f16
    Q8_K    256    292    9.125  d f32; qs i8[256]; bsums i16[16] (sums of 16)
    IQ4_XS  256    136    4.25   d f16; scales_h u16; scales_l u8[4] (8 6-bit); qs u8[128]

A nibble array of 32 weights holds weight j in the low nibble of byte j and weight j + 16 in the
high one (Q4_0's order); the K-quants' sub-blocks are 16 or 32 weights, each with an integer scale
(and minimum) times the super-block's d (and dmin). IQ4_NL's field is `idx`, not `qs`, so that its
dtype differs from Q4_0's, whose bytes it shares.

Each dequantizer gives gguf-py's numbers (gguf.quants.dequantize) bit for bit: the same float32
steps in the same order (d * sub-block scale, then * q, then - dmin * minimum), which the C's
to_float repeats (csrc/quant_ref.c says why an fma there cannot change them). The x-row
quantizers (Q8_1 for Q4_1 and Q5_1, Q8_K for the K-quants and IQ4_XS) are ggml's reference ones,
as the C kernels quantize x (tests compare them).
"""
import numpy as np

QK_K = 256
GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)  # IQ4_NL's

Q4_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)])
Q5_0 = np.dtype([("d", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16)])
Q5_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16)])
IQ4_NL = np.dtype([("d", "<f2"), ("idx", "u1", 16)])
Q2_K = np.dtype([("scales", "u1", 16), ("qs", "u1", 64), ("d", "<f2"), ("dmin", "<f2")])
Q3_K = np.dtype([("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", "<f2")])
Q4_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)])
Q5_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)])
Q6_K = np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")])
Q8_K = np.dtype([("d", "<f4"), ("qs", "i1", QK_K), ("bsums", "<i2", 16)])
IQ4_XS = np.dtype([("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", 4), ("qs", "u1", 128)])
Q8_1 = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", 32)])        # x rows only (Q4_1, Q5_1)

# name -> (dtype, weights a block); the order is csrc/tinydiff.h's
FORMATS = {"q4_1": (Q4_1, 32), "q5_0": (Q5_0, 32), "q5_1": (Q5_1, 32), "iq4_nl": (IQ4_NL, 32),
           "q2_k": (Q2_K, QK_K), "q3_k": (Q3_K, QK_K), "q4_k": (Q4_K, QK_K), "q5_k": (Q5_K, QK_K),
           "q6_k": (Q6_K, QK_K), "q8_k": (Q8_K, QK_K), "iq4_xs": (IQ4_XS, QK_K)}
# the fields holding a block's float scales: a file's NaN or inf there is refused at load
SCALES = {Q4_1: ("d", "m"), Q5_0: ("d",), Q5_1: ("d", "m"), IQ4_NL: ("d",), Q2_K: ("d", "dmin"),
          Q3_K: ("d",), Q4_K: ("d", "dmin"), Q5_K: ("d", "dmin"), Q6_K: ("d",), Q8_K: ("d",), IQ4_XS: ("d",)}


def _f32(a):
    return a.astype(np.float32)


def _shifted(b, shifts):
    """b [..., n] u8 >> each shift: [..., len(shifts), n] (bit fields laid out along a new axis)."""
    return b[..., None, :] >> np.asarray(shifts, np.uint8)[:, None]


def _nibbles(qs):
    """[..., 16] bytes -> [..., 32]: the low nibbles, then the high ones."""
    return (_shifted(qs, [0, 4]) & 15).reshape(*qs.shape[:-1], 32)


def _fifth_bits(qh):
    """[..., 4] bytes, a little-endian uint32 -> [..., 32]: bit j, shifted to 16 (a quant's bit 4)."""
    return np.unpackbits(qh, axis=-1, bitorder="little") << np.uint8(4)


def _scale_min_k4(scales):
    """Q4_K's and Q5_K's [..., 12] packed bytes -> 8 scales and 8 minimums of 6 bits, [..., 8] each."""
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 63, (md & 15) | ((d >> 2) & 48)], axis=-1)
    mn = np.concatenate([m & 63, (md >> 4) | ((m >> 2) & 48)], axis=-1)
    return sc, mn


def _blocks_of(q, sub):
    """[..., 256] -> [..., 256 / sub, sub]: a super-block's quants by sub-block."""
    return q.reshape(*q.shape[:-1], QK_K // sub, sub)


def _k(w, q, sc, sub, mn=None):
    """Weights [..., 256] of super-blocks: (d * sc) * q (- (dmin * mn)), per sub-block of sub."""
    dl = (_f32(w["d"])[..., None] * _f32(sc))[..., None]                    # [..., 256/sub, 1]
    y = dl * _f32(_blocks_of(q, sub))
    if mn is not None:
        y = y - (_f32(w["dmin"])[..., None] * _f32(mn))[..., None]
    return y.reshape(*w.shape[:-1], w.shape[-1] * QK_K)


def q2_k_quants(w):
    """[..., 256] quants 0..3 (weight 128h + 32j + l in bits 2j of qs[32h + l]), scales, minimums."""
    q = _shifted(w["qs"].reshape(*w.shape, 2, 32), [0, 2, 4, 6]) & 3      # [..., h, j, l]
    return q.reshape(*w.shape, QK_K), w["scales"] & 15, w["scales"] >> 4


def q3_k_quants(w):
    """[..., 256] quants -4..3 (Q2_K's low bits, minus 4 where hmask's bit is clear), scales -32..31."""
    low = (_shifted(w["qs"].reshape(*w.shape, 2, 32), [0, 2, 4, 6]) & 3).reshape(*w.shape, QK_K)
    high = (_shifted(w["hmask"], range(8)) & 1).reshape(*w.shape, QK_K)       # bit j of hmask[l]: weight 32j + l
    q = low.astype(np.int8) - ((1 - high) << 2).astype(np.int8)
    s = w["scales"]
    lo = (_shifted(s[..., :8], [0, 4]) & 15).reshape(*w.shape, 16)             # scale t: byte t % 8, nibble t // 8
    hi = (_shifted(s[..., 8:], [0, 2, 4, 6]) & 3).reshape(*w.shape, 16)       # byte 8 + t % 4, bits 2 (t // 4)
    return q, (lo | (hi << 4)).astype(np.int8) - np.int8(32)


def q4_k_quants(w):
    """[..., 256] quants 0..15 (weight 64j + 32n + l in nibble n of qs[32j + l]), scales, minimums."""
    q = (_shifted(w["qs"].reshape(*w.shape, 4, 32), [0, 4]) & 15).reshape(*w.shape, QK_K)
    return (q, *_scale_min_k4(w["scales"]))


def q5_k_quants(w):
    """Q4_K's quants with a fifth bit: bit j of qh[l] for weight 32j + l."""
    q, sc, mn = q4_k_quants(w)
    return q | ((_shifted(w["qh"], range(8)) & 1).reshape(*w.shape, QK_K) << 4), sc, mn


def q6_k_quants(w):
    """[..., 256] quants -32..31: low 4 bits, weight 128h + 64n + l in nibble n of ql[64h + l]; high
    2, weight 128h + 32j + l in bits 2j of qh[32h + l]."""
    low = (_shifted(w["ql"].reshape(*w.shape, 2, 64), [0, 4]) & 15).reshape(*w.shape, QK_K)
    high = (_shifted(w["qh"].reshape(*w.shape, 2, 32), [0, 2, 4, 6]) & 3).reshape(*w.shape, QK_K)
    return (low | (high << 4)).astype(np.int8) - np.int8(32), w["scales"]


def iq4_xs_quants(w):
    """[..., 256] grid values (sub-block s of 32: the nibbles of qs[16s..16s+15]), scales -32..31."""
    q = GRID[_nibbles(w["qs"].reshape(*w.shape, 8, 16))].reshape(*w.shape, QK_K)
    lo = (_shifted(w["scales_l"], [0, 4]) & 15).swapaxes(-1, -2).reshape(*w.shape, 8)   # scale s: byte s // 2
    hi = (w["scales_h"][..., None] >> np.arange(0, 16, 2, dtype=np.uint16)) & 3
    return q, (lo | (hi.astype(np.uint8) << 4)).astype(np.int8) - np.int8(32)


def dequantize(w):
    """An array of one of FORMATS' dtypes [..., nb] -> float32 [..., nb * block]."""
    t = w.dtype
    if t in (Q4_1, Q5_1, Q5_0):
        q = _nibbles(w["qs"]) | (_fifth_bits(w["qh"]) if t != Q4_1 else np.uint8(0))
        q = _f32(q) if t != Q5_0 else _f32(q.astype(np.int8) - np.int8(16))
        y = _f32(w["d"])[..., None] * q
        if t != Q5_0:
            y = y + _f32(w["m"])[..., None]
    elif t == IQ4_NL:
        y = _f32(w["d"])[..., None] * _f32(GRID[_nibbles(w["idx"])])
    elif t == Q2_K:
        q, sc, mn = q2_k_quants(w)
        return _k(w, q, sc, 16, mn)
    elif t == Q3_K:
        return _k(w, *q3_k_quants(w), 16)
    elif t in (Q4_K, Q5_K):
        q, sc, mn = q4_k_quants(w) if t == Q4_K else q5_k_quants(w)
        return _k(w, q, sc, 32, mn)
    elif t == Q6_K:
        return _k(w, *q6_k_quants(w), 16)
    elif t == IQ4_XS:
        return _k(w, *iq4_xs_quants(w), 32)
    elif t in (Q8_K, Q8_1):
        with np.errstate(over="ignore"):                       # Q8_K's f32 d: a huge one gives inf, as in C
            y = _f32(w["d"])[..., None] * _f32(w["qs"])
    else:
        raise ValueError(f"not a block format of kquants.py: {t}")
    return y.reshape(*w.shape[:-1], -1)


def quantize_q8_1(x, q8_0):
    """x [..., 32] f32 -> Q8_1 [...] (ggml's quantize_row_q8_1_ref): q8_0 = quant.quantize_q8_0(x)'s
    d and quants, and s = d * sum(quants) with d before its f16 rounding."""
    d = np.abs(x).max(axis=-1) / np.float32(127)
    y = np.empty(x.shape[:-1], Q8_1)
    y["d"], y["qs"] = q8_0["d"], q8_0["qs"]
    y["s"] = (_f32(q8_0["qs"].astype(np.int32).sum(axis=-1)) * d).astype(np.float16)
    return y


def quantize_q8_k(x):
    """x [..., 256] f32 -> Q8_K [...] (ggml's quantize_row_q8_K_ref): iscale = -127 / the value of
    largest magnitude (the first), q = min(127, iscale * x rounded to nearest even), d = 1 / iscale,
    bsums the sums of 16; a block of zeros all zeros."""
    x = np.asarray(x, np.float32)
    big = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[..., None], axis=-1)[..., 0]   # [...] signed
    zero = big == 0
    with np.errstate(divide="ignore"):
        iscale = np.where(zero, np.float32(0), np.float32(-127) / np.where(zero, np.float32(1), big))
    q = np.minimum(np.rint(iscale[..., None] * x), np.float32(127)).astype(np.int8)
    y = np.zeros(x.shape[:-1], Q8_K)
    y["qs"] = q
    y["bsums"] = q.reshape(*q.shape[:-1], 16, 16).astype(np.int16).sum(axis=-1)
    with np.errstate(divide="ignore"):
        y["d"] = np.where(zero, np.float32(0), np.float32(1) / np.where(zero, np.float32(1), iscale))
    return y
