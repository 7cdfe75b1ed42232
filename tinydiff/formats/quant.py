"""Weight types: how a matrix's numbers are stored, and the NumPy reference for each.

A weight matrix W [m, k] (HF layout: out_features x in_features) is a NumPy array whose dtype says
its storage type, as a ggml tensor's type does:

    f32   float32 [m, k]                                                    4 bytes a weight
    f16   float16 [m, k]  (IEEE half)                                       2 bytes
    bf16  BF16 [m, k]     the top 16 bits of a float32, rounded to nearest even   2 bytes
    q8_0  Q8_0 [m, k/32]  one block per 32 weights: d (f16), qs int8[32];
                          w[j] = d * qs[j]                                  34 bytes / 32 = 8.5 bits
    q4_0  Q4_0 [m, k/32]  d (f16), qs uint8[16]: weight j in the low nibble of qs[j], weight j+16
                          in the high nibble; w[j] = d * (nibble - 8)       18 bytes / 32 = 4.5 bits

The block layouts are llama.cpp's (ggml-common.h: block_q8_0, block_q4_0), byte for byte, so a
GGUF tensor maps onto these arrays without conversion. The rounding rules are ggml's reference
quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref), so our files match llama.cpp's.

The formats llama.cpp writes beyond these, which tinydiff reads, are kquants.py's: q4_1, q5_0,
q5_1, iq4_nl (blocks of 32), q2_k, q3_k, q4_k, q5_k, q6_k, q8_k, iq4_xs (super-blocks of 256); their
arrays are [m, k/32] or [m, k/256] blocks, and every function here takes them. quantize writes
q4_1, q5_0, q5_1, q4_k, q5_k and q6_k too, with ggml's reference quantizers (kquantize.py).
TYPES names the types quantize makes here, WRITES all it makes, READS every stored type.

Layouts made at load, never stored: Q8_0X8 and Q4_0X8 [m/8, k/32], Q8_0 and Q4_0 with
their rows interleaved 8 at a time (csrc/quant.h, block_q8_0x8: d f16[8], qs int8[256], the bytes
of 8 Q8_0 blocks; block_q4_0x8: d f16[8], qs uint8[128], of 8 Q4_0 blocks), for the AVX2 and
AVX512_VNNI kernels (interleave; kernels.interleaved decides where). And F32P, F16P and BF16P
[m/32, k], f32, f16 and bf16 in the f32 GEMM's panels of 32 rows (csrc/quant.h): element [g, p]
holds number p of rows 32g..32g+31, for a model whose passes all have many rows (panels).
"""
import numpy as np

from ..errors import UsageError
from . import kquantize, kquants

QK = 32                                                        # weights per block
BF16 = np.dtype([("bf16", "<u2")])                             # 2 bytes
Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", QK)])              # 34 bytes
Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", QK // 2)])         # 18 bytes
TYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": BF16, "q8_0": Q8_0, "q4_0": Q4_0}  # quantize's
READS = {**TYPES, **{name: dt for name, (dt, _) in kquants.FORMATS.items()}}  # every stored type, kquants.py's too
WRITES = (*TYPES, *kquantize.QUANTIZERS)                       # quantize's: TYPES and kquantize.py's
Q8_0X8 = np.dtype([("d", "<f2", 8), ("qs", "i1", 8 * QK)])          # 272 bytes: 8 rows' blocks
Q4_0X8 = np.dtype([("d", "<f2", 8), ("qs", "u1", 8 * QK // 2)])     # 144 bytes
X8 = {Q8_0: Q8_0X8, Q4_0: Q4_0X8}                              # row type -> its interleaved type
GROUP = 8                                                      # rows an X8 element holds
PANEL = 32                                                     # rows a panel element holds
F32P = np.dtype([("f32", "<f4", PANEL)])                       # number p of 32 rows: 128 bytes
F16P = np.dtype([("f16", "<f2", PANEL)])                       # 64 bytes
BF16P = np.dtype([("bf16", "<u2", PANEL)])                     # 64 bytes
PANELS = {np.dtype(np.float32): F32P, np.dtype(np.float16): F16P, BF16: BF16P}  # row type -> its panels
MADE_AT_LOAD = {"q8_0x8": Q8_0X8, "q4_0x8": Q4_0X8, "f32p": F32P, "f16p": F16P, "bf16p": BF16P}
# weights an element of a block type holds (an X8 element: one row's share of its group)
BLOCK = {Q8_0: QK, Q4_0: QK, Q8_0X8: QK, Q4_0X8: QK, **{dt: n for dt, n in kquants.FORMATS.values()}}
# the fields of a block type holding float scales (a file's NaN or inf there is refused at load)
SCALES = {Q8_0: ("d",), Q4_0: ("d",), **kquants.SCALES}


def type_of(w):
    """The storage type name of a weight array: 'f32', 'f16', 'bf16', 'q8_0', 'q4_0', one of
    kquants.py's ('q4_k', ...), or one made at load: 'q8_0x8', 'q4_0x8', 'f32p', 'f16p', 'bf16p'."""
    for name, dt in (*READS.items(), *MADE_AT_LOAD.items()):
        if w.dtype == dt:
            return name
    raise UsageError(f"weights of dtype {w.dtype} are not a tinydiff weight type ({', '.join(READS)})")


def is_blocked(w):
    """True for the block types, whose last axis counts blocks (of block_size(w) weights), not weights."""
    return w.dtype in BLOCK


def block_size(w):
    """Weights an element of w's last axis holds: 32 or 256 for a block type, else 1."""
    return BLOCK.get(w.dtype, 1)


def is_interleaved(w):
    return w.dtype in (Q8_0X8, Q4_0X8)


def is_panels(w):
    return w.dtype in PANELS.values()


def columns(w):
    """k, the number of weights in one row, whatever the storage type."""
    return w.shape[-1] * block_size(w)


def rows(w):
    """m, the number of rows of a weight matrix, whatever the storage type."""
    return w.shape[0] * (GROUP if is_interleaved(w) else PANEL if is_panels(w) else 1)


def interleave(w):
    """Q8_0 or Q4_0 [m, k/32] (m % 8 == 0) -> Q8_0X8 or Q4_0X8 [m/8, k/32]: group g's block b holds
    rows 8g..8g+7's block b, each row's quant bytes in runs of 4 (csrc/quant.h, block_q4_0x8)."""
    (m, nb), runs = w.shape, w.dtype["qs"].shape[0] // 4
    rows8 = w.reshape(m // GROUP, GROUP, nb)                                     # [g, r, b]
    y = np.empty((m // GROUP, nb), X8[w.dtype])
    y["d"] = rows8["d"].transpose(0, 2, 1)                                       # [g, b, r]
    qs = rows8["qs"].reshape(m // GROUP, GROUP, nb, runs, 4)                     # [g, r, b, run, 4]
    y["qs"] = qs.transpose(0, 2, 3, 1, 4).reshape(m // GROUP, nb, GROUP * runs * 4)  # [g, b, run, r, 4]
    return y


def deinterleave(y):
    """interleave undone: Q8_0X8 or Q4_0X8 [m/8, k/32] -> Q8_0 or Q4_0 [m, k/32]."""
    (groups, nb), runs = y.shape, y.dtype["qs"].shape[0] // GROUP // 4
    w = np.empty((groups, GROUP, nb), Q8_0 if y.dtype == Q8_0X8 else Q4_0)
    w["d"] = y["d"].transpose(0, 2, 1)
    w["qs"] = y["qs"].reshape(groups, nb, runs, GROUP, 4).transpose(0, 3, 1, 2, 4).reshape(groups, GROUP, nb, runs * 4)
    return w.reshape(groups * GROUP, nb)


def panels(w):
    """f32, f16 or bf16 [m, k] (m % 32 == 0) -> F32P, F16P or BF16P [m/32, k]: element [g, p] holds
    number p of rows 32g..32g+31, side by side (csrc/quant.h)."""
    (m, k), y = w.shape, np.empty((w.shape[0] // PANEL, w.shape[1]), PANELS[w.dtype])
    y[y.dtype.names[0]] = _numbers(w).reshape(m // PANEL, PANEL, k).transpose(0, 2, 1)   # [g, p, c]
    return y


def unpanel(y):
    """panels undone: F32P, F16P or BF16P [m/32, k] -> f32, f16 or bf16 [m, k]."""
    (groups, k), row_type = y.shape, next(t for t, p in PANELS.items() if p == y.dtype)
    w = np.empty((groups * PANEL, k), row_type)
    _numbers(w)[...] = y[y.dtype.names[0]].transpose(0, 2, 1).reshape(groups * PANEL, k)
    return w


def _numbers(w):
    """A float array's numbers as an array of its own (bf16's: uint16)."""
    return w["bf16"] if w.dtype == BF16 else w


def bits_per_weight(name):
    return READS[name].itemsize * 8 / BLOCK.get(READS[name], 1)


def bytes_per_weight(w):
    """Bytes a weight of array w takes in memory: 4 for f32, 34/32 for Q8_0, 18/32 for Q4_0, 144/256
    for Q4_K, ... (a block's bytes over its weights; the X8 types' and panels' as their rows')."""
    if is_panels(w):
        return w.itemsize / PANEL
    return w.itemsize / (block_size(w) * (GROUP if is_interleaved(w) else 1))


# The exponent bits of each float type, all ones for an inf or a NaN (compared as integers: no copy
# in float32 of a bf16 or f16 tensor is made to find them)
_EXPONENT = {np.dtype(np.float32): (np.uint32, 0x7F800000), np.dtype(np.float16): (np.uint16, 0x7C00),
             BF16: (np.uint16, 0x7F80)}


def _nonfinite(v):
    """v's numbers that are NaN or infinite, as a bool array (v f32, f16 or bf16)."""
    uint, mask = _EXPONENT[v.dtype]
    return (v.view(uint) & mask) == mask


def _bad_scales(w):
    """Per block of w, whether its float scales (d, and dmin or m where it has them) hold a NaN or
    an inf; None for a type without scales. Vectorised over the fields: one pass over each."""
    bad = None
    for field in SCALES.get(w.dtype, ()):
        hit = _nonfinite(w[field])
        bad = hit if bad is None else bad | hit
    return bad


def nonfinite_scale(w):
    """The index of w's first block whose float scales are NaN or infinite, as a tuple, or None."""
    bad = _bad_scales(w)
    if bad is None or not bad.any():
        return None
    return tuple(int(i) for i in np.unravel_index(np.argmax(bad), bad.shape))


def nonfinite_count(w, chunk=1 << 22):
    """How many of a stored array's numbers are NaN or infinite: its weights for f32, f16 and bf16,
    its blocks with such a scale for the block types (their quants are integers). `chunk`
    elements at a time, so a large tensor costs no large temporary."""
    flat = w.reshape(-1)
    total = 0
    for i in range(0, len(flat), chunk):
        bad = _nonfinite(flat[i:i + chunk]) if w.dtype in _EXPONENT else _bad_scales(flat[i:i + chunk])
        total += 0 if bad is None else int(np.count_nonzero(bad))
    return total


def quantize(w, name):
    """The matrix w [m, k] stored as type `name` (WRITES). Block types need k a multiple of their
    block (32, or 256 for the K-quants). w may already be of
    a weight type: as it is if that is `name`, else its values (dequantized) stored anew."""
    if isinstance(w, np.ndarray) and w.dtype in (*READS.values(), *MADE_AT_LOAD.values()) and w.dtype != np.float32:
        if type_of(w) == name:
            return w
        w = dequantize(w)
    w = np.ascontiguousarray(w, dtype=np.float32)
    if name == "f32":
        return w
    if name == "f16":
        return w.astype(np.float16)
    if name == "bf16":
        return to_bf16(w)
    if name not in WRITES:
        why = "tinydiff reads {} weights but does not write them" if name in READS else "unknown weight type {!r}"
        raise UsageError(f"{why.format(name)}; choose one of {', '.join(WRITES)}")
    n = BLOCK[READS[name]]
    if w.shape[-1] % n:
        raise UsageError(f"cannot store a matrix with rows of {w.shape[-1]} weights as {name}: "
                         f"rows must be a multiple of {n}")
    blocks = w.reshape(*w.shape[:-1], w.shape[-1] // n, n)    # [..., k/n, n]
    if name in kquantize.QUANTIZERS:
        return kquantize.QUANTIZERS[name](blocks)
    return quantize_q8_0(blocks) if name == "q8_0" else quantize_q4_0(blocks)


# the x type each block type's dot product takes (csrc/quant.h; ggml's vec_dot_type)
X_TYPE = {Q8_0: "q8_0", Q4_0: "q8_0", Q8_0X8: "q8_0", Q4_0X8: "q8_0", kquants.Q5_0: "q8_0", kquants.IQ4_NL: "q8_0",
          kquants.Q4_1: "q8_1", kquants.Q5_1: "q8_1",
          **{dt: "q8_k" for dt, n in kquants.FORMATS.values() if n == kquants.QK_K}}


def quantize_x(x, w):
    """x [..., k] f32 as the C kernels convert it for the block type of w (X_TYPE): Q8_0 [..., k/32],
    kquants.Q8_1 [..., k/32] or kquants.Q8_K [..., k/256] blocks, to the bit."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = kquants.QK_K if X_TYPE[w.dtype] == "q8_k" else QK
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // n, n)
    if X_TYPE[w.dtype] == "q8_k":
        return kquants.quantize_q8_k(blocks)
    q8_0 = quantize_q8_0(blocks)
    return q8_0 if X_TYPE[w.dtype] == "q8_0" else kquants.quantize_q8_1(blocks, q8_0)


def quantize_q8_0(x):
    """x [..., 32] f32 -> Q8_0 [...]: d = max|x| / 127, qs = round(x / d) (half away from zero)."""
    amax = np.abs(x).max(axis=-1)                                                 # [...]
    d = amax / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)       # a zero block stays zero
    y = np.empty(x.shape[:-1], Q8_0)
    y["d"] = d.astype(np.float16)
    y["qs"] = _round_away(x * inv[..., None]).astype(np.int8)
    return y


def quantize_q4_0(x):
    """x [..., 32] f32 -> Q4_0 [...]: d = (the value of largest magnitude) / -8, so it maps to
    nibble 0 exactly; nibble = min(15, trunc(x / d + 8.5))."""
    i = np.abs(x).argmax(axis=-1)[..., None]
    vmax = np.take_along_axis(x, i, axis=-1)[..., 0]                              # [...] signed
    d = vmax / np.float32(-8)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(15, np.trunc(x * inv[..., None] + np.float32(8.5))).astype(np.uint8)  # [..., 32]
    y = np.empty(x.shape[:-1], Q4_0)
    y["d"] = d.astype(np.float16)
    y["qs"] = q[..., :QK // 2] | (q[..., QK // 2:] << 4)
    return y


def dequantize(w):
    """Any weight array back to float32, [m, k]."""
    if w.dtype == np.float32:
        return w
    if w.dtype == np.float16:
        return w.astype(np.float32)
    if w.dtype == BF16:
        return (w["bf16"].astype(np.uint32) << 16).view(np.float32)
    if is_interleaved(w):
        return dequantize(deinterleave(w))
    if is_panels(w):
        return dequantize(unpanel(w))
    if w.dtype in kquants.SCALES or w.dtype == kquants.Q8_1:       # Q8_1: an x row (quantize_x)
        return kquants.dequantize(w)
    if w.dtype == Q8_0:
        q = w["qs"].astype(np.float32)                                            # [..., k/32, 32]
    elif w.dtype == Q4_0:
        qs = w["qs"]
        q = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float32) - 8
    else:
        raise UsageError(f"weights of dtype {w.dtype} are not a tinydiff weight type")
    d = w["d"].astype(np.float32)[..., None]                                      # [..., k/32, 1]
    return (d * q).reshape(*w.shape[:-1], w.shape[-1] * QK)


def to_bf16(w):
    """float32 -> BF16, rounding to nearest even (NaN stays NaN), as torch and ggml do."""
    u = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    y = np.empty(w.shape, BF16)
    y["bf16"] = np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)
    return y


def _round_away(x):
    """C's roundf: halves away from zero (NumPy's round goes to even). x - trunc(x) is exact."""
    whole = np.trunc(x)
    return np.where(np.abs(x - whole) >= 0.5, whole + np.sign(x), whole)
