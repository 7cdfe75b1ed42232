"""The K-quants' fast paths (csrc/quant_x86_k.c: Q2_K .. Q6_K, IQ4_XS and Q8_K as weights, and the
Q8_K x quantizer) pinned to plain C bit for bit on every SIMD level this CPU has.

- the dot products: the 4-row tile (vec_dot_4xn, nx 1..4) and the row (vec_dot, the rows past the
  last whole tile) give every x row's products as plain C's row by row, at any number of weight
  rows (odd ones too) and x rows, on any blocks (any bytes, any finite scale, from the smallest
  subnormal f16 to 65504) and x of any size; where the scales are tame, NumPy's replica too;
- the x quantizer: the quants and scale (through identity Q8_K weights: y = d x') and the sums
  of 16 (through Q2_K weights whose only term is one minimum: y = d x's sum) are NumPy's, on ties,
  a largest magnitude held by both signs, zero blocks, subnormal and huge x; with NaN and infinite
  x, whatever plain C makes of them, to the bit.
tests/test_block_formats.py pins these paths to NumPy on tame blocks too (one and a few x rows).
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_block_formats import blocks, from_bytes, replica, same_bits
from tinydiff.engine import kernels as K
from tinydiff.formats import kquants, quant

K_TYPES = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs", "q8_k"]
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def on_c(fn):
    """fn() on plain C, then back on the level the test runs on."""
    level = K.simd()
    K._set_simd("c")
    try:
        return fn()
    finally:
        K._set_simd(level)


def same_bits_any(a, b):
    """a and b the same float32s to the bit, NaN and infinities included."""
    assert a.shape == b.shape and a.dtype == b.dtype == np.float32
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("name", K_TYPES)
@SETTINGS
@given(nb=st.integers(1, 3), m=st.sampled_from([1, 2, 3, 4, 5, 7, 8, 9, 13]), n=st.integers(1, 6),
       seed=st.integers(0, 10**6), tame=st.booleans(), scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e3, 1e30]))
def test_tiles_and_rows_are_plain_cs(level, name, nb, m, n, seed, tame, scale):
    """Weight rows in tiles of 4 and the rest one by one, x rows 1..6 (the tile takes up to 4): each
    product plain C's to the bit, any finite scales (tame: NumPy's replica as well)."""
    w = blocks(name, (m, nb), seed, tame=tame)
    x = (np.random.default_rng(seed + 1).standard_normal((n, nb * 256)) * scale).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        got = K.matmul(x, w)
        same_bits_any(got, on_c(lambda: K.matmul(x, w)))
        if tame:
            same_bits(got, replica(x, w, name))


@pytest.mark.parametrize("name", K_TYPES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_block_bytes_are_plain_cs(level, name, data):
    """Blocks of any bytes (their scales made finite), 4 rows and one more, by 1..4 x rows."""
    nb = data.draw(st.integers(1, 2))
    size = 5 * nb * quant.READS[name].itemsize
    w = from_bytes(name, data.draw(st.binary(min_size=size, max_size=size))).reshape(5, nb)
    x = np.random.default_rng(data.draw(st.integers(0, 999))).standard_normal((data.draw(st.integers(1, 4)), nb * 256))
    x = x.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        same_bits_any(K.matmul(x, w), on_c(lambda: K.matmul(x, w)))


def identity_q8_k(k):
    """Q8_K weights [k, k/256] whose row j is e_j with d = 1: y = d_x q_x, x as the kernels quantized it."""
    w = np.zeros((k, k // 256), kquants.Q8_K)
    w["d"] = 1
    w["qs"] = np.eye(k, dtype=np.int8).reshape(k, k // 256, 256)
    return w


def bsum_probe(k):
    """Q2_K weights [k/16, k/256] whose row r's only term is minimum 1 (dmin -1) in sub-block r of 16:
    y = d_x times x's sum of 16 r, as the kernels' sums of 16 (bsums) have it."""
    w = np.zeros((k // 16, k // 256), kquants.Q2_K)
    w["dmin"] = -1
    r = np.arange(k // 16)
    w["scales"][r, r // 16, r % 16] = 0x10
    return w


def awkward_x(k, rng):
    """x rows with what the quantizer must get right: ties after scaling, a largest magnitude held
    by both signs (the first one wins), a zero block, subnormals, huge values, -0."""
    x = rng.standard_normal((6, k)).astype(np.float32)
    x[0, :256] = np.round(x[0, :256] * 4) / 4 * 127 / 3                           # halves after scaling
    x[1, 5], x[1, 200] = -7, 7                                                       # -7 first: iscale > 0
    x[1, 256 + 9], x[1, 256 + 3] = -7, 7                                             # 7 first
    x[2, 256:512] = 0
    x[2, 300] = -0.0
    x[3] *= np.float32(1e-40)                                                        # subnormal
    x[4] *= np.float32(1e37)
    x[5, :256] = np.float32(2.0**-149)                                               # all the smallest subnormal
    return x


@pytest.mark.parametrize("k", [512, 768])
def test_q8_k_quantizer_is_numpys(level, k):
    x = awkward_x(k, np.random.default_rng(k))
    with np.errstate(over="ignore", invalid="ignore"):           # subnormal x: iscale -inf, as in C
        xq = quant.quantize_x(x, np.zeros((1, k // 256), kquants.Q4_K))
        same_bits(K.matmul(x, identity_q8_k(k)), quant.dequantize(xq) + np.float32(0))  # sums start at +0
        probe = bsum_probe(k)
        same_bits(K.matmul(x, probe), replica(x, probe, "q2_k"))
    assert np.array_equal(xq["bsums"], xq["qs"].reshape(6, k // 256, 16, 16).astype(np.int16).sum(-1))


@SETTINGS
@given(data=st.data())
def test_q8_k_quantizer_on_any_numbers_is_plain_cs(level, data):
    """Any float32s (NaN and infinities among them) put anywhere in x rows of any size: the quants,
    scale and sums of 16 plain C's, and where x is finite NumPy's."""
    k = 512
    rng = np.random.default_rng(data.draw(st.integers(0, 999)))
    x = (rng.standard_normal((2, k)) * 10.0 ** data.draw(st.integers(-40, 36))).astype(np.float32)
    picks = data.draw(st.lists(st.floats(width=32), min_size=1, max_size=40))
    x.reshape(-1)[rng.choice(2 * k, len(picks), replace=False)] = picks
    w, probe = identity_q8_k(k), bsum_probe(k)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        same_bits_any(K.matmul(x, w), on_c(lambda: K.matmul(x, w)))
        same_bits_any(K.matmul(x, probe), on_c(lambda: K.matmul(x, probe)))
        if np.isfinite(x).all():
            same_bits(K.matmul(x, w), quant.dequantize(quant.quantize_x(x, w)) + np.float32(0))
