"""The block formats llama.cpp writes beyond Q8_0 and Q4_0 (formats/kquants.py, csrc/quant.h,
csrc/quant_ref.c): Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_XS.

- layouts: each dtype's bytes and block are GGUF's (gguf.py's table, and gguf-py's where installed);
- dequantization: NumPy's equals gguf.quants.dequantize bit for bit on random blocks (any bytes, any
  finite scale: hypothesis, and a few thousand seeded blocks a type) and on every tensor of the two
  real files; the C's to_float (an embedding's rows) equals NumPy's bit for bit on every SIMD level;
- x rows: the kernels quantize x to Q8_0, Q8_1 or Q8_K exactly as quant.quantize_x does;
- the dot products (one x row, and a few: vec_dot): on every level bit for bit NumPy's repetition
  of their integer sums and float steps, and within f32 rounding of that model's exact value; many
  rows (the f32 GEMM): bit for bit the GEMM of x as seen and the widened weights;
- every path within the activation-quantization error of x @ dequantize(w), the bound made of the
  actual |x - x'| (and for Q4_1 and Q5_1 the rounding of x's block sums s);
- loading: the types map to the kernels', the ledger books each one's true bytes a weight; a block
  with a NaN or infinite scale, a row that is not whole blocks: a ModelError naming the tensor.
AVX2 and AVX512_VNNI have their own tiles of Q4_1, Q5_1, Q5_0 and IQ4_NL and x quantizers
(quant_x86_32.h, tests/test_block32_tiles.py); AVX2 and AVX-512 their own dot products of every K
type and IQ4_XS, and the Q8_K quantizer (quant_x86_k.c; tests/test_kquants_x86.py pins them on any
blocks); the other x quantizers and to_float run plain C's (quant.c's merge).
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from real_models import GEMMA3, SMOLLM2, real_model
from tinydiff.engine import kernels as K
from tinydiff.engine import ledger
from tinydiff.errors import ModelError
from tinydiff.formats import gguf as G
from tinydiff.formats import kquants, quant

FORMATS = list(kquants.FORMATS)                                   # "q4_1", ..., "iq4_xs"
U = np.float32(2.0**-24)
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
BITS = {"q4_1": 5, "q5_0": 5.5, "q5_1": 6, "iq4_nl": 4.5, "q2_k": 2.625, "q3_k": 3.4375, "q4_k": 4.5, "q5_k": 5.5,
        "q6_k": 6.5625, "q8_k": 9.125, "iq4_xs": 4.25}


def gguf_py():
    return pytest.importorskip("gguf", reason="gguf (gguf-py) is not installed: pip install gguf")


def dtype_of(name):
    return quant.READS[name]


def per(name):
    return quant.BLOCK[quant.READS[name]]


def finite(w, tame=False):
    """w with every scale made finite (an exponent of all ones loses its top bit); tame: scales
    below 2 in magnitude (f16) or normal and small (Q8_K's f32), for products that stay finite."""
    for field in quant.SCALES[w.dtype]:
        v = w[field]
        if v.dtype == np.float16:
            bits = v.view(np.uint16)
            bits[...] = np.where((bits & 0x7C00) == 0x7C00, bits ^ 0x4000, bits)
            if tame:
                bits &= np.uint16(0xBFFF)
        else:
            bits = v.view(np.uint32)
            bits[...] = np.where((bits & 0x7F800000) == 0x7F800000, bits ^ 0x40000000, bits)
            if tame:
                bits[...] = (bits & np.uint32(0x807FFFFF)) | np.uint32(0x3C000000)    # |d| in [2^-7, 2^-6)
    return w


def blocks(name, shape, seed, tame=False):
    """Random blocks of a format: random bytes, finite scales."""
    dt = dtype_of(name)
    raw = np.random.default_rng(seed).integers(0, 256, (*shape[:-1], shape[-1] * dt.itemsize), dtype=np.uint8)
    return finite(raw.view(dt).reshape(shape), tame)


def from_bytes(name, data):
    dt = dtype_of(name)
    return finite(np.frombuffer(bytearray(data), np.uint8).view(dt).reshape(1, -1).copy())


def gguf_dequantize(w, type_name):
    """gguf-py's dequantization of a block array (its bytes as GGUF holds them)."""
    g = gguf_py()
    return g.quants.dequantize(np.ascontiguousarray(w).view(np.uint8).reshape(*w.shape[:-1], -1),
                               g.GGMLQuantizationType[type_name.upper()])


def same_bits(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype == np.float32
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


# ---- layouts ----

@pytest.mark.parametrize("name", FORMATS)
def test_layouts_are_gguf_blocks(name):
    code = G.GGML_CODES[name.upper()]
    _, block, size = G.GGML_TYPES[code]
    assert (per(name), dtype_of(name).itemsize) == (block, size)
    assert quant.bits_per_weight(name) == BITS[name] == size * 8 / block
    assert name.upper() in G.STORAGE and quant.READS[name] == dtype_of(name)
    w = blocks(name, (3, 2), 0)
    assert quant.type_of(w) == name and quant.columns(w) == 2 * block and quant.rows(w) == 3
    assert quant.bytes_per_weight(w) == size / block and quant.is_blocked(w)


def test_layouts_are_gguf_pys():
    g = gguf_py()
    for name in FORMATS:
        block, size = g.GGML_QUANT_SIZES[g.GGMLQuantizationType[name.upper()]]
        assert (per(name), dtype_of(name).itemsize) == (block, size)


def test_field_offsets_are_the_c_structs():
    """Where csrc/quant.h's structs put each field (the scales of Q2_K and Q3_K, Q6_K's d, last)."""
    offsets = lambda dt: {f: dt.fields[f][1] for f in dt.names}          # noqa: E731
    assert offsets(kquants.Q4_K) == {"d": 0, "dmin": 2, "scales": 4, "qs": 16}
    assert offsets(kquants.Q5_K) == {"d": 0, "dmin": 2, "scales": 4, "qh": 16, "qs": 48}
    assert offsets(kquants.Q2_K) == {"scales": 0, "qs": 16, "d": 80, "dmin": 82}
    assert offsets(kquants.Q3_K) == {"hmask": 0, "qs": 32, "scales": 96, "d": 108}
    assert offsets(kquants.Q6_K) == {"ql": 0, "qh": 128, "scales": 192, "d": 208}
    assert offsets(kquants.Q8_K) == {"d": 0, "qs": 4, "bsums": 260}
    assert offsets(kquants.IQ4_XS) == {"d": 0, "scales_h": 2, "scales_l": 4, "qs": 8}
    assert offsets(kquants.Q5_1) == {"d": 0, "m": 2, "qh": 4, "qs": 8}
    assert kquants.IQ4_NL != quant.Q4_0 and kquants.IQ4_NL.itemsize == quant.Q4_0.itemsize


def test_hand_blocks():
    """A few blocks worked by hand from ggml's dequantize_row_* (independent of gguf-py)."""
    b = np.zeros(1, kquants.Q4_1)
    b["d"], b["m"], b["qs"][0, 0], b["qs"][0, 1] = 0.5, -1, 0x3F, 0x01        # weights 0, 16, 1, 17
    y = quant.dequantize(b)
    assert (y[0], y[16], y[1], y[17], y[2]) == (0.5 * 15 - 1, 0.5 * 3 - 1, 0.5 - 1, -1, -1)
    b = np.zeros(1, kquants.Q5_0)
    b["d"], b["qh"][0, 0], b["qs"][0, 0] = 2, 0b1, 0x0F                        # weight 0: 16 + 15
    assert quant.dequantize(b)[0] == 2 * 15 and quant.dequantize(b)[16] == 2 * -16
    b = np.zeros(1, kquants.Q4_K)
    b["d"], b["dmin"] = 1, 0.25
    b["scales"][0, 0], b["scales"][0, 4] = 3, 8                                 # sub-block 0: scale 3, min 8
    b["scales"][0, 8], b["scales"][0, 0 + 4] = 0x21, 8                          # sub-block 4: 1 | (0 << 4), min 2
    b["qs"][0, 0] = 0x75                                                        # weight 0: 5, weight 32: 7
    y = quant.dequantize(b)
    assert y[0] == 3 * 5 - 0.25 * 8 and y[32] == 0 and y[128] == 1 * 0 - 0.25 * 2
    b = np.zeros(1, kquants.Q6_K)
    b["d"], b["scales"][0], b["ql"][0, 0], b["qh"][0, 0] = 1, -2, 0x1F, 0b11     # weight 0: 15 | 3 << 4, 64: 1
    assert quant.dequantize(b)[0] == -2 * (63 - 32) and quant.dequantize(b)[64] == -2 * (1 - 32)
    b = np.zeros(1, kquants.IQ4_XS)
    b["d"], b["scales_l"][0, 0], b["scales_h"], b["qs"][0, 0] = 1, 0x0F, 0b10, 0xF0   # sub-block 0: 47 - 32
    assert quant.dequantize(b)[0] == 15 * -127 and quant.dequantize(b)[16] == 15 * 113


# ---- dequantization: gguf-py's numbers, and the C's ----

@pytest.mark.parametrize("name", FORMATS)
def test_dequantize_is_gguf_pys_on_seeded_blocks(name):
    if name == "q8_k":
        pytest.skip("gguf-py has no Q8_K dequantizer (ggml writes Q8_K only as an activation type)")
    w = blocks(name, (64, 4096 // per(name) * 8), seed=1)
    same_bits(quant.dequantize(w), gguf_dequantize(w, name))


@pytest.mark.parametrize("name", [n for n in FORMATS if n != "q8_k"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_dequantize_is_gguf_pys_on_any_block(name, data):
    nb = data.draw(st.integers(1, 3))
    w = from_bytes(name, data.draw(st.binary(min_size=nb * dtype_of(name).itemsize, max_size=nb * dtype_of(name).itemsize)))
    same_bits(quant.dequantize(w), gguf_dequantize(w, name))


def test_q8_k_is_d_times_its_quants():
    w = blocks("q8_k", (5, 2), 2)
    same_bits(quant.dequantize(w), (w["d"][..., None] * w["qs"].astype(np.float32)).reshape(5, 512))


@pytest.mark.parametrize("name", FORMATS)
@SETTINGS
@given(data=st.data())
def test_c_to_float_is_numpys(level, name, data):
    """The C's to_float (td_rows_to_f32: an embedding look-up) gives NumPy's numbers bit for bit,
    -ffp-contract=fast notwithstanding (quant_ref.c: every product before the add is exact)."""
    nb = data.draw(st.integers(1, 3))
    size = 5 * nb * dtype_of(name).itemsize
    w = from_bytes(name, data.draw(st.binary(min_size=size, max_size=size))).reshape(5, nb)
    rows = np.array(data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=6)))
    out = np.empty((rows.size, nb * per(name)), np.float32)
    same_bits(K.embedding(w, rows, out), quant.dequantize(w)[rows])


@pytest.mark.parametrize("name", FORMATS)
def test_c_to_float_on_seeded_blocks(level, name):
    w = blocks(name, (300, 2048 // per(name)), seed=3)
    out = np.empty((300, 2048), np.float32)
    same_bits(K.embedding(w, np.arange(300), out), quant.dequantize(w))


# ---- x rows ----

def identity(name, k):
    """A weight [k, k] of the type whose row j is e_j with its scale 1, so that y = x as the kernels
    quantized it, exactly: Q8_K (x to Q8_K), Q4_1 (x to Q8_1: y = d_x q_x, m = 0), Q5_0 (x to Q8_0:
    q = 17 - 16, its fifth bit set and the nibble 1)."""
    n, e = per(name), np.eye(k, dtype=np.int64).reshape(k, k // per(name), per(name))
    w = np.zeros((k, k // n), dtype_of(name))
    w["d"] = 1
    if name == "q8_k":
        w["qs"] = e
    elif name == "q4_1":
        w["qs"] = e[..., :16] | (e[..., 16:] << 4)
    else:                                                        # q5_0: q = 16 everywhere, 17 at j
        w["qs"] = e[..., :16] | (e[..., 16:] << 4)
        w["qh"] = 0xFF
    return w


@pytest.mark.parametrize("name", ["q8_k", "q4_1", "q5_0"])
@pytest.mark.parametrize("n", [1, 3, 20])
def test_x_quantized_exactly_as_quant_py(level, name, n):
    """With identity weights y = x' bit for bit, on the few-rows path (vec_dot) and the many-rows one
    (x widened back for the f32 GEMM); x has ties, zero blocks and a lone largest value per block
    (y's zeros are +0 where x' has -0: every sum starts at +0)."""
    k = 512
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, k)).astype(np.float32)
    x[0, :256] = np.round(x[0, :256] * 4) / 4 * 127 / 3                      # halves after scaling
    x[-1, 256:] = 0
    w = identity(name, k)
    same_bits(K.matmul(x, w), quant.dequantize(quant.quantize_x(x, w)) + np.float32(0))   # sums start at +0


def test_q8_1_sum_is_d_times_the_sum_of_its_quants():
    """s of Q8_1 in the kernels: Q4_1 weights d = 0, m = 1 in block b alone give y = s_b."""
    x = np.random.default_rng(5).standard_normal((2, 128)).astype(np.float32)
    w = np.zeros((4, 4), kquants.Q4_1)
    w["m"][np.arange(4), np.arange(4)] = 1
    xq = quant.quantize_x(x, w)
    for level in K.SIMD_LEVELS[:K.SIMD_LEVELS.index(K.simd()) + 1]:
        with simd(level):
            same_bits(K.matmul(x, w), xq["s"].astype(np.float32))
    d = np.abs(x.reshape(2, 4, 32)).max(-1) / np.float32(127)
    np.testing.assert_array_equal(xq["s"], (xq["qs"].astype(np.int32).sum(-1).astype(np.float32) * d).astype(np.float16))


class simd:
    def __init__(self, level):
        self.level, self.best = level, K.simd()

    def __enter__(self):
        K._set_simd(self.level)

    def __exit__(self, *exc):
        K._set_simd(self.best)


def test_q8_k_rounds_to_nearest_even_and_zero_blocks_are_zero():
    x = np.zeros((1, 512), np.float32)
    x[0, 0], x[0, 1], x[0, 2] = -127, 0.5, 1.5                  # iscale 1: 0.5 -> 0, 1.5 -> 2 (half to even)
    q = quant.quantize_x(x, np.zeros((1, 2), kquants.Q4_K))
    assert q["d"][0, 0] == 1 and list(q["qs"][0, 0, :3]) == [-127, 0, 2] and q["bsums"][0, 0, 0] == -125
    assert q["d"][0, 1] == 0 and not q["qs"][0, 1].any() and not q["bsums"][0, 1].any()


# ---- dot products ----

def weight_quants(w, name):
    """(q [m, nb, S, sub] integers, scales [m, nb, S], minimums [m, nb, S] or None) of a weight: what
    its dot product multiplies x's quants by, per sub-block (S sub-blocks of sub quants a block)."""
    if name in ("q4_1", "q5_1", "q5_0", "iq4_nl"):
        qs = w["idx" if name == "iq4_nl" else "qs"].astype(np.int64)
        q = np.concatenate([qs & 15, qs >> 4], axis=-1)
        if name != "q4_1" and name != "iq4_nl":
            q |= np.unpackbits(w["qh"], axis=-1, bitorder="little").astype(np.int64) << 4
        q = kquants.GRID[q].astype(np.int64) if name == "iq4_nl" else q - 16 if name == "q5_0" else q
        return q[..., None, :], np.ones(w.shape + (1,), np.int64), None
    if name == "q8_k":
        return w["qs"].astype(np.int64)[..., None, :], np.ones(w.shape + (1,), np.int64), None
    parts = getattr(kquants, f"{name}_quants")(w)
    q, sc = parts[0].astype(np.int64), parts[1].astype(np.int64)
    sub = 256 // sc.shape[-1]
    mn = parts[2].astype(np.int64) if len(parts) == 3 else None
    return q.reshape(*w.shape, 256 // sub, sub), sc, mn


def integer_sums(x, w, name):
    """The kernels' exact integer sums per (x row, weight row, block): isum = sum_s sc_s (q_s . x_s),
    imin = sum_s mn_s (sum of x_s), and x's blocks as quantized (quant.quantize_x)."""
    xq = quant.quantize_x(x, w)
    q, sc, mn = weight_quants(w, name)
    xs = xq["qs"].astype(np.int64).reshape(x.shape[0], w.shape[1], *q.shape[2:])    # [n, nb, S, sub]
    isum = np.einsum("mbsj,nbsj,mbs->nmb", q, xs, sc)
    imin = None if mn is None else np.einsum("mbs,nbs->nmb", mn, xs.sum(-1))
    return isum, imin, xq


def replica(x, w, name):
    """quant_ref.c's dot products repeated in NumPy: the integer sums, then its float32 steps in its
    order, a block after another (the kernels on plain C give this bit for bit)."""
    isum, imin, xq = integer_sums(x, w, name)
    f = np.float32
    total = np.zeros(isum.shape[:2], f)
    for b in range(w.shape[1]):
        dw, dx = w["d"][None, :, b].astype(f), xq["d"][:, None, b].astype(f)
        t = dw * dx * isum[..., b].astype(f)
        if name in ("q4_1", "q5_1"):
            t = t + w["m"][None, :, b].astype(f) * xq["s"][:, None, b].astype(f)
        if imin is not None:
            t = t - w["dmin"][None, :, b].astype(f) * dx * imin[..., b].astype(f)
        total = total + t
    return total


def exact(x, w, name):
    """The value the dot products approximate, in float64 (products of their inputs), and the sum of
    the magnitudes of its terms (the scale of their f32 rounding)."""
    isum, imin, xq = integer_sums(x, w, name)
    d = w["d"][None].astype(np.float64) * xq["d"][:, None].astype(np.float64)         # [n, m, nb]
    terms = [d * isum]
    if name in ("q4_1", "q5_1"):
        terms.append(w["m"][None].astype(np.float64) * xq["s"][:, None].astype(np.float64))
    if imin is not None:
        terms.append(-w["dmin"][None].astype(np.float64) * xq["d"][:, None].astype(np.float64) * imin)
    return sum(t.sum(-1) for t in terms), sum(np.abs(t).sum(-1) for t in terms)


def x_error(x, w, name, wd):
    """What quantizing x costs a product with the weights, a bound per (x row, weight row): |x - x'|
    @ |w|, and for Q4_1 and Q5_1, whose minimums multiply s instead of the sum of x', |m| |s - sum x'|."""
    xq = quant.quantize_x(x, w)
    xs = quant.dequantize(xq).astype(np.float64)
    err = np.abs(x - xs) @ np.abs(wd).T
    if name in ("q4_1", "q5_1"):
        block_sums = xs.reshape(x.shape[0], -1, 32).sum(-1)
        err += np.abs(xq["s"].astype(np.float64) - block_sums) @ np.abs(w["m"].astype(np.float64)).T
    return err * (1 + 1e-6) + 2**-20 * (np.abs(xs) @ np.abs(wd).T)     # and w's own f32 rounding in wd


@pytest.mark.parametrize("name", FORMATS)
@SETTINGS
@given(nb=st.integers(1, 4), m=st.integers(1, 40), n=st.integers(1, 3), seed=st.integers(0, 999))
def test_vec_dot_is_its_integer_arithmetic(level, name, nb, m, n, seed):
    """Few x rows (vec_dot, row by row): every level is replica() to the bit (the SIMD kernels make
    the same exact integer sums and take plain C's float steps in its order); within f32 rounding of
    the exact value, (nb + 4) roundings of each term's size; and within the activation error of
    x @ dequantize(w)."""
    w = blocks(name, (m, nb), seed, tame=True)
    x = np.random.default_rng(seed + 1).standard_normal((n, nb * per(name))).astype(np.float32)
    got = K.matmul(x, w)
    same_bits(got, replica(x, w, name))
    value, size = exact(x, w, name)
    tight = (nb + 4) * float(U) * size + 1e-30
    assert np.all(np.abs(got - value) <= tight)
    wd = quant.dequantize(w).astype(np.float64)
    assert np.all(np.abs(got - x @ wd.T) <= tight + x_error(x, w, name, wd))


@pytest.mark.parametrize("name", FORMATS)
def test_many_rows_are_the_f32_gemm_of_the_widened_weights(level, batch_variant, name):
    """Batch invariance off, from gemm_min_rows() x rows the f32 GEMM runs, on x quantized and widened back and the weights
    widened by to_float in its panels: bit for bit the f32 GEMM of those numbers (k across a 256-number
    panel, m across 32-row panels), within the activation error of x @ dequantize(w)."""
    n, k, m = K.gemm_min_rows() + 7, 768, 71
    w = blocks(name, (m, k // per(name)), 7, tame=True)
    x = np.random.default_rng(8).standard_normal((n, k)).astype(np.float32)
    got = K.matmul(x, w)
    xs = quant.dequantize(quant.quantize_x(x, w))
    same_bits(got, K.matmul(xs, quant.dequantize(w)))
    wd = quant.dequantize(w).astype(np.float64)
    tight = (k + 4) * float(U) * (np.abs(xs) @ np.abs(wd).T)
    assert np.all(np.abs(got - x @ wd.T) <= tight + x_error(x, w, name, wd))


@pytest.mark.parametrize("name", FORMATS)
def test_a_rows_result_does_not_depend_on_its_company(level, name):
    """Up to the GEMM's rows every x row is its own vec_dot: alone or with others, the same bits;
    matmuls (several weights of one x: q/k/v) give each matmul's; residual adds to out."""
    w = blocks(name, (37, 1024 // per(name)), 9, tame=True)
    x = np.random.default_rng(10).standard_normal((3, 1024)).astype(np.float32)
    alone = np.stack([K.matmul(x[i], w) for i in range(3)])
    same_bits(K.matmul(x, w), alone)
    w2 = blocks(name, (5, 1024 // per(name)), 11, tame=True)
    a, b = K.matmuls(x, (w, w2))
    same_bits(a, alone)
    same_bits(b, K.matmul(x, w2))
    out = np.ones((3, 37), np.float32)
    same_bits(K.matmul(x, w, out=out, residual=True), np.float32(1) + alone)


@pytest.mark.parametrize("name", FORMATS)
def test_zero_blocks_give_zeros(level, name):
    w = np.zeros((4, 2), dtype_of(name))
    x = np.zeros((2, 2 * per(name)), np.float32)
    assert not K.matmul(x, w).any() and not K.matmul(np.ones_like(x), w).any()


# ---- loading ----

def test_kernels_map_every_format_to_its_c_type():
    c_types = {K._TYPES[dtype_of(name)] for name in FORMATS}
    assert len(c_types) == len(FORMATS)
    for name in FORMATS:
        kind, n = K._TYPES[dtype_of(name)]
        assert kind == getattr(K.lib, "TD_" + name.upper()) and n == per(name)


@pytest.mark.parametrize("name", FORMATS)
def test_ledger_books_true_bytes_a_weight(name):
    w = blocks(name, (8, 2), 12, tame=True)
    with ledger.Ledger() as led:
        K.matmul(np.ones((1, 2 * per(name)), np.float32), w)
        K.embedding(w, np.arange(3), np.empty((3, 2 * per(name)), np.float32))
    by_op = led.total()["by_op"]
    assert by_op["matmul"]["bytes"]["weights"] == w.nbytes == 8 * 2 * per(name) * BITS[name] / 8
    assert by_op["embedding"]["bytes"]["weights"] == round(3 * 2 * per(name) * BITS[name] / 8)


def write(path, tensors):
    G.write_gguf(path, {"general.architecture": ("string", "llama")}, tensors)
    return path


def test_a_tensor_with_a_nan_or_infinite_scale_is_refused_by_name(tmp_path):
    for name, field, bad in [("q4_k", "dmin", np.inf), ("q5_0", "d", np.nan), ("q8_k", "d", -np.inf),
                             ("q8_0", "d", np.nan), ("q4_1", "m", np.inf), ("iq4_xs", "d", np.nan)]:
        w = blocks(name, (3, 2), 13, tame=True)
        w[field][2, 1] = bad
        f = G.open_gguf(write(tmp_path / f"{name}.gguf", {"blk.0.ffn_up.weight": w, "ok.weight": w[:2]}))
        assert f.raw("ok.weight").shape == (2, 2)
        with pytest.raises(ModelError) as e:
            f.raw("blk.0.ffn_up.weight")
        msg = str(e.value)
        assert "\n" not in msg and "tensor blk.0.ffn_up.weight:" in msg and "block [2, 1]" in msg
        assert f"{name.upper()} blocks" in msg and "NaN or infinite" in msg


def test_rows_that_are_not_whole_blocks_are_refused_by_name(tmp_path):
    """A K-quant row of 300 weights (not a multiple of 256), a Q4_1 row of 48 (of 32): the header's
    dimensions, whose byte size is then no whole number of blocks."""
    for name, cols in [("q4_k", 300), ("q6_k", 128), ("q4_1", 48), ("iq4_nl", 40)]:
        w = blocks(name, (1, 2 * cols // per(name)), 14)               # the bytes the header's size says
        planned = G.Planned(name, (2, cols), lambda w=w: w)
        with pytest.raises(ModelError) as e:
            G.open_gguf(write(tmp_path / f"{name}.gguf", {"blk.3.attn_q.weight": planned}))
        msg = str(e.value)
        assert "\n" not in msg and "tensor blk.3.attn_q.weight:" in msg
        assert f"rows of {cols} weights are not whole {name.upper()} blocks of {per(name)}" in msg


def test_a_type_that_does_not_read_is_refused_by_name(tmp_path):
    path = write(tmp_path / "iq2.gguf", {"w.weight": blocks("q4_k", (2, 1), 15)})
    data = bytearray(path.read_bytes())
    at = data.index(b"w.weight") + len(b"w.weight") + 4 + 16          # name, n_dims, ne[2]: then the type
    data[at:at + 4] = (16).to_bytes(4, "little")                      # IQ2_XXS: 256 a block, 66 bytes
    del data[len(data) - (2 * 144 - 160):]            # its two blocks, padded to 32, end the file
    path.write_bytes(bytes(data))
    f = G.open_gguf(path)
    with pytest.raises(ModelError, match="tensor w.weight: type IQ2_XXS not supported"):
        f.raw("w.weight")


# ---- the real files ----

@pytest.mark.parametrize("model", [SMOLLM2, GEMMA3])
def test_every_tensor_of_the_real_files_reads_as_gguf_py_reads_it(model):
    """Every tensor of both files: NumPy's dequantization is gguf-py's bit for bit (in chunks of
    rows, the embeddings being large), the C's of a sample of rows NumPy's; every type reads."""
    f = G.open_gguf(real_model(model))
    rng = np.random.default_rng(16)
    for name in f.tensors:
        a = f.raw(name)
        t = f.type_name(name)
        rows = a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(1, -1)
        for r0 in range(0, rows.shape[0], 16384):
            chunk = rows[r0:r0 + 16384]
            ours = quant.dequantize(chunk)
            theirs = gguf_dequantize(chunk, t) if t not in ("F32", "F16") else chunk.astype(np.float32)
            same_bits(ours, theirs.reshape(ours.shape))
        if a.ndim == 2:
            pick = rng.integers(0, a.shape[0], 64)
            out = np.empty((64, quant.columns(a)), np.float32)
            same_bits(K.embedding(np.ascontiguousarray(a), pick, out), quant.dequantize(a[pick]))


def test_the_real_files_hold_the_types_they_should():
    types = {}
    for model in (SMOLLM2, GEMMA3):
        f = G.open_gguf(real_model(model))
        types[model] = set(f.stored_bytes())
    assert types[SMOLLM2] == {"F32", "Q4_1", "Q8_0"}
    assert {"Q5_0", "Q4_K", "Q6_K", "Q8_0"} <= types[GEMMA3]
