"""tinydiff.formats.quant: the weight types' layouts and rounding, checked against llama.cpp's conventions
on hand-computed blocks and bit patterns, and against a line-by-line scalar transcription of
ggml's reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinydiff.errors import UsageError
from tinydiff.formats import quant

ALL = list(quant.TYPES)   # the types quantize makes (the others read only: test_block_formats.py)


def block(*values):
    """One row of 32 float32 numbers: the given ones first, zeros after."""
    x = np.zeros((1, 32), np.float32)
    x[0, :len(values)] = values
    return x


# ---- layouts: GGUF's bytes ----

def test_block_layouts_are_ggml_bytes():
    assert quant.Q8_0.itemsize == 34 and quant.Q4_0.itemsize == 18 and quant.BF16.itemsize == 2
    assert quant.Q8_0.fields["d"][1] == 0 and quant.Q8_0.fields["qs"][1] == 2
    assert quant.Q4_0.fields["d"][1] == 0 and quant.Q4_0.fields["qs"][1] == 2
    # d = 1.0 is f16 0x3C00, little-endian; then the quants as bytes (int8 two's complement)
    q = quant.quantize(block(127, 2, -3), "q8_0")
    assert q.tobytes()[:5] == bytes([0x00, 0x3C, 127, 2, 0xFD]) and q.tobytes()[5:] == bytes(29)


def test_type_of_columns_and_sizes():
    w = np.ones((3, 64), np.float32)
    for name in ALL:
        q = quant.quantize(w, name)
        assert quant.type_of(q) == name and quant.columns(q) == 64
        assert q.nbytes == 3 * 64 * quant.bytes_per_weight(q) == 3 * 64 * quant.bits_per_weight(name) / 8
    assert quant.quantize(w, "q4_0").shape == (3, 2) and quant.quantize(w, "bf16").shape == (3, 64)
    assert quant.bytes_per_weight(quant.quantize(w, "q8_0")) == 34 / 32
    with pytest.raises(UsageError, match="not a tinydiff weight type"):
        quant.type_of(np.ones(3, np.int32))


def test_errors():
    with pytest.raises(UsageError, match="multiple of 32"):
        quant.quantize(np.ones((2, 48), np.float32), "q8_0")
    with pytest.raises(UsageError, match="multiple of 32"):
        quant.quantize(np.ones((2, 33), np.float32), "q4_0")
    with pytest.raises(UsageError, match="unknown weight type"):
        quant.quantize(np.ones((2, 32), np.float32), "q7_z")
    with pytest.raises(UsageError, match="reads q2_k weights but does not write them"):
        quant.quantize(np.ones((2, 256), np.float32), "q2_k")
    with pytest.raises(UsageError):
        quant.dequantize(np.ones(3, np.int16))


# ---- Q8_0 ----

def test_q8_0_hand_block():
    """amax 127 makes d = 1 exactly, so x * (1/d) = x: the halves show the rounding."""
    q = quant.quantize(block(127, 2.5, -2.5, 0.5, -0.5, 1.49, -126.5, 0.4999), "q8_0")
    assert q["d"][0, 0] == 1.0
    # C's roundf: halves away from zero (np.round would give 2, -2, 0, -0, -126)
    assert q["qs"][0, 0, :8].tolist() == [127, 3, -3, 1, -1, 1, -127, 0]
    assert not q["qs"][0, 0, 8:].any()


def test_q8_0_scale_is_amax_over_127_in_f16():
    x = block(0.1, -0.7, 0.3)
    q = quant.quantize(x, "q8_0")
    d = np.float32(0.7) / np.float32(127)
    assert q["d"][0, 0] == np.float16(d)
    assert q["qs"][0, 0, :3].tolist() == [round(0.1 / d), -127, round(0.3 / d)]


# ---- Q4_0 ----

def test_q4_0_hand_block_nibble_order():
    """-8 has the largest magnitude: d = -8 / -8 = 1, nibble = min(15, trunc(x + 8.5)); weight j
    in the low nibble of byte j, weight j + 16 in its high nibble."""
    x = block(-8, 7, 7.9, 0, 0.49, 0.5, -0.5, -0.51)
    x[0, 16:19] = [3, -7.5, 1]
    q = quant.quantize(x, "q4_0")
    assert q["d"][0, 0] == 1.0
    nibbles = [0, 15, 15, 8, 8, 9, 8, 7]                 # 7.9 + 8.5 = 16.4 clamps to 15
    high = [11, 1, 9] + [8] * 13
    assert q["qs"][0, 0].tolist() == [lo | hi << 4 for lo, hi in zip(nibbles + [8] * 8, high)]
    assert q.tobytes() == bytes([0x00, 0x3C]) + bytes([0xB0, 0x1F, 0x9F]) + bytes([0x88, 0x88, 0x89, 0x88, 0x87]) \
        + bytes([0x88] * 8)
    np.testing.assert_array_equal(quant.dequantize(q)[0, :3], [-8, 7, 7])


def test_q4_0_scale_is_signed_max_over_minus_8():
    """A positive maximum gives a negative d and maps to nibble 0 exactly; the first of equal
    magnitudes wins, as ggml's strict < keeps it."""
    q = quant.quantize(block(16, -14, 2), "q4_0")
    assert q["d"][0, 0] == -2.0
    assert [v & 15 for v in q["qs"][0, 0, :3]] == [0, 15, 7]   # 16/-2 = -8 -> 0; -14/-2 = 7 -> 15
    assert quant.dequantize(q)[0, 0] == 16
    assert quant.quantize(block(-4, 4), "q4_0")["d"][0, 0] == 0.5
    assert quant.quantize(block(4, -4), "q4_0")["d"][0, 0] == -0.5


# ---- every block type: zeros, round trips, ggml's scalar code ----

@pytest.mark.parametrize("name", ["q8_0", "q4_0"])
def test_zero_blocks_give_zeros_not_nan(name):
    x = np.zeros((2, 96), np.float32)
    x[1, 32:64] = np.linspace(-1, 1, 32)                          # one live block among zero ones
    with np.errstate(all="raise"):                                # no 0/0 anywhere
        q = quant.quantize(x, name)
        y = quant.dequantize(q)
    assert q["d"][0].tolist() == [0, 0, 0] and q["d"][1, 0] == 0 and q["d"][1, 2] == 0
    assert np.all(y[0] == 0) and np.all(y[1, :32] == 0) and np.all(y[1, 64:] == 0)
    assert np.all(np.isfinite(y))


def ggml_q8_0_ref(x):
    """quantize_row_q8_0_ref, one float32 operation at a time (numpy float32 scalars)."""
    out = []
    for blk in x.reshape(-1, 32):
        amax = np.float32(0)
        for v in blk:
            amax = max(amax, abs(v))
        d = amax / np.float32(127)
        idv = np.float32(1) / d if d else np.float32(0)
        qs = []
        for v in blk:
            t = float(v * idv)                                   # |t| + 0.5 is exact in float64
            qs.append(int(math.copysign(math.floor(abs(t) + 0.5), t)))   # C's roundf
        out.append((np.float16(d), qs))
    return out


def ggml_q4_0_ref(x):
    """quantize_row_q4_0_ref, one float32 operation at a time."""
    out = []
    for blk in x.reshape(-1, 32):
        amax, vmax = np.float32(0), np.float32(0)
        for v in blk:
            if amax < abs(v):
                amax, vmax = abs(v), v
        d = vmax / np.float32(-8)
        idv = np.float32(1) / d if d else np.float32(0)
        nib = [min(15, int(np.int8(blk[j] * idv + np.float32(8.5)))) for j in range(32)]
        out.append((np.float16(d), [nib[j] | nib[j + 16] << 4 for j in range(16)]))
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), scale=st.sampled_from([1e-6, 0.02, 1.0, 300.0]),
       ints=st.booleans())
def test_block_types_match_ggml_scalar_code(seed, scale, ints):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((2, 64)) * scale).astype(np.float32)
    if ints:   # halves and ties everywhere: integers and half-integers with amax 127 (d = 1)
        x = (rng.integers(-254, 255, (2, 64)) / 2).astype(np.float32)
        x[:, ::32] = 127
    for name, ref in (("q8_0", ggml_q8_0_ref), ("q4_0", ggml_q4_0_ref)):
        q = quant.quantize(x, name).reshape(-1)
        for got, (d, qs) in zip(q, ref(x)):
            assert got["d"] == d and got["qs"].tolist() == qs, name


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), scale=st.sampled_from([0.05, 1.0, 1e4]))   # d stays a normal f16
def test_round_trip_error_bounds(seed, scale):
    """Q8_0: |x - x'| <= d/2 plus the f16 rounding of d (<= 2^-11 d, on 127 steps);
    Q4_0: |x - x'| <= |d| (the clamp at nibble 15 can cost a whole step) plus 8 steps of d's rounding."""
    x = (np.random.default_rng(seed).standard_normal((3, 128)) * scale).astype(np.float32)
    blocks = x.reshape(3, 4, 32)
    amax = np.abs(blocks).max(-1, keepdims=True)
    err8 = np.abs(quant.dequantize(quant.quantize(x, "q8_0")).reshape(3, 4, 32) - blocks)
    assert np.all(err8 <= amax / 127 * (0.5 + 127 * 2.0**-11) * (1 + 1e-6))
    err4 = np.abs(quant.dequantize(quant.quantize(x, "q4_0")).reshape(3, 4, 32) - blocks)
    assert np.all(err4 <= amax / 8 * (1 + 8 * 2.0**-11) * (1 + 1e-6))
    for name, rtol in (("f16", 2.0**-11), ("bf16", 2.0**-8)):
        np.testing.assert_allclose(quant.dequantize(quant.quantize(x, name)), x, rtol=rtol, atol=6e-8)


@pytest.mark.parametrize("name", ALL)
def test_dequantize_works_on_row_slices_and_requantizes_exactly_for_floats(name):
    w = np.random.default_rng(0).standard_normal((6, 64)).astype(np.float32)
    q = quant.quantize(w, name)
    np.testing.assert_array_equal(quant.dequantize(q[2:4]), quant.dequantize(q)[2:4])
    np.testing.assert_array_equal(quant.dequantize(q[[5, 0, 5]]), quant.dequantize(q)[[5, 0, 5]])
    if name in ("f32", "f16", "bf16"):      # a float type holds its own values exactly
        assert quant.quantize(quant.dequantize(q), name).tobytes() == q.tobytes()


# ---- bf16 ----

def bits_to_bf16(*bits):
    return quant.to_bf16(np.array(bits, np.uint32).view(np.float32))["bf16"].tolist()


def test_bf16_rounds_to_nearest_even():
    assert bits_to_bf16(0x3F808000) == [0x3F80]      # a tie, even below: down
    assert bits_to_bf16(0x3F818000) == [0x3F82]      # a tie, odd below: up to even
    assert bits_to_bf16(0x3F808001) == [0x3F81]      # above the tie: up
    assert bits_to_bf16(0x3F807FFF) == [0x3F80]      # below the tie: down
    assert bits_to_bf16(0xBF818000) == [0xBF82]      # the sign does not matter
    assert bits_to_bf16(0x7F7FFFFF) == [0x7F80]      # the largest float rounds to inf
    assert bits_to_bf16(0x7F800000, 0xFF800000, 0x80000000, 0x00000001) == [0x7F80, 0xFF80, 0x8000, 0x0000]


def test_bf16_nan_stays_nan():
    got = bits_to_bf16(0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x7F80FFFF)
    assert got == [0x7FC0, 0x7FC0, 0xFFFF, 0x7FC0]   # quieted, never rounded into inf
    assert np.all(np.isnan(quant.dequantize(quant.to_bf16(np.array([np.nan, -np.nan], np.float32)))))


def test_quantize_a_typed_matrix_starts_from_its_values():
    w = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)
    q8 = quant.quantize(w, "q8_0")
    assert quant.quantize(q8, "q8_0") is q8                        # already that type: as it is
    np.testing.assert_array_equal(quant.quantize(q8, "f32"), quant.dequantize(q8))
    q4 = quant.quantize(q8, "q4_0")
    assert q4.tobytes() == quant.quantize(quant.dequantize(q8), "q4_0").tobytes()


# ---- Q8_0X8 and Q4_0X8: Q8_0 and Q4_0 repacked at load ----

@pytest.mark.parametrize("name,runs", [("q8_0", 8), ("q4_0", 4)])
def test_x8_holds_each_rows_bytes_where_quant_h_says(name, runs):
    """Group g's block b: d[r] is row 8g+r's scale; run h, bytes 4r..4r+3 are row 8g+r's qs[4h..4h+3]."""
    w = quant.quantize(np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32), name)
    y = quant.interleave(w)
    assert y.dtype.itemsize == 8 * w.dtype.itemsize and y.shape == (2, 2) and quant.is_interleaved(y)
    assert quant.rows(y) == 16 and quant.columns(y) == 64 and quant.type_of(y) == name + "x8"
    assert quant.bytes_per_weight(y) == quant.bytes_per_weight(w)
    for g, b, r, h in [(0, 0, 0, 0), (1, 1, 7, runs - 1), (0, 1, 5, 2), (1, 0, 3, 1)]:
        assert y["d"][g, b, r] == w["d"][8 * g + r, b]
        run = slice(32 * h + 4 * r, 32 * h + 4 * r + 4)
        assert y["qs"][g, b, run].tobytes() == w["qs"][8 * g + r, b, 4 * h:4 * h + 4].tobytes()
    assert quant.deinterleave(y).tobytes() == w.tobytes()
    np.testing.assert_array_equal(quant.dequantize(y), quant.dequantize(w))
    assert quant.quantize(y, "q8_0").tobytes() == quant.quantize(quant.dequantize(w), "q8_0").tobytes()
