"""The x86 tiles of the blocks of 32 (csrc/quant_x86_32.h: Q4_1, Q5_1, Q5_0, IQ4_NL; AVX2 and
AVX512_VNNI) and their x quantizers (Q8_1; Q8_0S on AVX512_VNNI), pinned to plain C bit for bit
on every level this CPU runs:

- the few-rows path runs vec_dot_4xn on 4 weight rows by up to 4 x rows and vec_dot on the rows
  left over (m % 4); the VNNI tile takes 4 blocks a step and a tail of 1-3: every (m, n, nb) shape
  of those gives test_block_formats.replica() (plain C's integer sums and float chain) to the bit;
- x quantized by the level's own quantizer is quant.quantize_x's to the bit: d and the quants
  (identity weights give y = x as quantized), and Q8_1's s (weights d = 0, m = 1 give y = s).
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from test_block_formats import SETTINGS, blocks, identity, per, replica, same_bits
from tinydiff.engine import kernels as K
from tinydiff.formats import kquants, quant

BLOCK32 = ["q4_1", "q5_1", "q5_0", "iq4_nl"]


@pytest.mark.parametrize("name", BLOCK32)
@SETTINGS
@given(nb=st.integers(1, 13), m=st.integers(1, 41), n=st.integers(1, 9), seed=st.integers(0, 999))
def test_tiles_are_plain_cs_chains(level, name, nb, m, n, seed):
    w = blocks(name, (m, nb), seed, tame=True)
    x = np.random.default_rng(seed + 1).standard_normal((n, nb * per(name))).astype(np.float32)
    same_bits(K.matmul(x, w), replica(x, w, name))


@pytest.mark.parametrize("name", BLOCK32)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 7, 13, 19])
def test_every_tile_width_and_odd_row_counts(level, name, n, m):
    """nx = 1..4 x rows a tile, rows in tiles of 4 and one by one, 4 blocks a step and a tail of 3."""
    nb = 7
    w = blocks(name, (m, nb), 100 * m + n, tame=True)
    x = np.random.default_rng(m + n).standard_normal((n, nb * 32)).astype(np.float32)
    same_bits(K.matmul(x, w), replica(x, w, name))


def x_rows(nb):
    """x [2, 32 nb]: floats of each block scaled on its own, its largest magnitude the scale (some
    blocks zero, some whose d is an f16 subnormal or rounds to 0), below 2047 in magnitude, where Q8_1's s (up to 32 amax) is a finite f16
    (beyond it every level gives m * inf, plain C too)."""
    values = hnp.arrays(np.float32, (2, nb, 32), elements=st.floats(-1, 1, width=32))
    scales = hnp.arrays(np.float32, (2, nb, 1), elements=st.sampled_from([0.0, 1e-30, 1e-6, 1.0, 3.0, 60.0]))
    def make(vs):
        v, scale = vs
        v[..., 0] = 1                          # each block's largest magnitude is its scale: 1 / d finite
        return (v * scale).reshape(2, nb * 32)
    return st.tuples(values, scales).map(make)


@pytest.mark.parametrize("name", ["q4_1", "q5_0"])
@SETTINGS
@given(data=st.data(), nb=st.integers(1, 9))
def test_x_quantizers_are_quant_pys(level, name, data, nb):
    """d and the quants of Q8_1 (Q4_1's x) and of Q8_0 / Q8_0S (Q5_0's) through identity weights."""
    x = data.draw(x_rows(nb))
    w = identity(name, nb * 32)
    same_bits(K.matmul(x, w), quant.dequantize(quant.quantize_x(x, w)) + np.float32(0))


@SETTINGS
@given(data=st.data(), nb=st.integers(1, 9))
def test_q8_1_s_is_quant_pys(level, data, nb):
    x = data.draw(x_rows(nb))
    w = np.zeros((nb, nb), kquants.Q4_1)
    w["m"][np.arange(nb), np.arange(nb)] = 1                      # row b: block b's s, d = 0
    same_bits(K.matmul(x, w), quant.quantize_x(x, w)["s"].astype(np.float32) + np.float32(0))
