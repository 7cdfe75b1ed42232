"""matmul with f16, bf16, Q8_0 and Q4_0 weights (and Q8_0X8 / Q4_0X8, their rows repacked by 8),
on every SIMD path this CPU has.

Two checks per call, with bounds derived, not tuned:
- tight, against reference.matmul_exact (x converted exactly as the kernels convert it: Q8_0 for
  the block types; f16 and bf16 weights widened, x as given; products exact in float64). What is left is the
  kernels' own f32 rounding: at most about one rounding per term summed, k * 2^-24 relative to
  sum |x'| |w| (each block's int32 dot product is exact, so the Q8_0/Q4_0 paths round even less).
- loose, against reference.matmul, x @ dequantize(w).T with x as given: the tight bound plus what
  converting x may cost, |x - x'| <= 0.57 d_x per number for Q8_0 (half a step, and d_x's f16
  rounding over 127 steps), nothing for f16 and bf16. This catches an x converted wrong in both the
  kernels and matmul_exact.
Sizes: n = 1, n below the GEMM thresholds (4 rows for the int8 GEMM and f16/bf16, 16 for the
others, 33 on AMD), above; k a multiple of 32 for the block types (32 included; 288 and more cross
a 256-number panel); m odd and across the 32-row panels.
"""
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinydiff.engine import kernels as K
from tinydiff.engine import reference as R
from tinydiff.formats import quant

TYPES = ["f16", "bf16", "q8_0", "q4_0"]
BLOCKED = {"q8_0", "q4_0"}
U = 2.0**-24
# the SIMD-level fixture is set once per test, not per example, which is what we want
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def data(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def x_as_seen(x, name):
    if name in BLOCKED:
        return quant.dequantize(quant.quantize(x, "q8_0"))
    return x


def x_error(x, name):
    """A bound on |x - x as the kernels see it|, per number."""
    if name in BLOCKED:
        blocks = np.abs(x).reshape(*x.shape[:-1], -1, 32)
        return np.repeat(blocks.max(-1) / 127 * 0.57, 32, axis=-1)
    return np.zeros_like(x)


def check(x, w, name):
    q = quant.quantize(w, name)
    got = K.matmul(x, q)
    wd = np.abs(quant.dequantize(q)).astype(np.float64)
    k = x.shape[-1]
    tight = (k + 4) * U * (np.abs(x_as_seen(x, name)) @ wd.T) + 1e-30
    assert got.dtype == np.float32 and got.shape == x.shape[:-1] + (w.shape[0],)
    err = np.abs(got - R.matmul_exact(x, q))
    assert np.all(err <= tight), f"tight: {(err / tight).max():.3g} x the bound"
    loose = tight + x_error(x, name) @ wd.T * (1 + 1e-6)
    assert np.all(np.abs(got - R.matmul(x, q)) <= loose)
    return got


K_BLOCKED = st.integers(1, 20).map(lambda b: 32 * b)
K_ANY = st.sampled_from([1, 2, 7, 16, 17, 33, 64, 100, 255, 300])
N = st.sampled_from([1, 2, 3, 4, 5, 11, 12, 13, 30, 47])


@pytest.mark.parametrize("name", TYPES)
@SETTINGS
@given(n=N, data_=st.data(), m=st.integers(1, 70), seed=st.integers(0, 99))
def test_matmul_types(level, name, n, data_, m, seed):
    k = data_.draw(K_BLOCKED if name in BLOCKED else K_ANY)
    check(data(seed, n, k), data(seed + 1, m, k), name)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n", [1, 3, 4, 11, 12, 40])
def test_matmul_one_block_rows(level, name, n):
    """k = 32, one block a row, on every path; m odd, below and past one 32-row panel."""
    for m in (7, 33):
        check(data(n, n, 32), data(n + 1, m, 32), name)


@pytest.mark.parametrize("name", TYPES)
def test_matmul_types_large(level, name):
    """Many panels, x row chunks and edges at once; a 1-D x is one row."""
    x, w = data(0, 301, 800), data(1, 259, 800)
    check(x, w, name)
    check(x[7], w, name)


@pytest.mark.parametrize("name", TYPES)
def test_result_of_a_row_does_not_depend_on_the_path(level, name):
    """One x row alone (dot products) and among 40 (GEMM) sees the same converted x: results
    agree to f32 rounding, not to the size of x's conversion error."""
    x, q = data(2, 40, 256), quant.quantize(data(3, 50, 256), name)
    alone = np.stack([K.matmul(x[i], q) for i in range(40)])
    scale = np.abs(x_as_seen(x, name)) @ np.abs(quant.dequantize(q)).T
    assert np.all(np.abs(alone - K.matmul(x, q)) <= 2 * 260 * U * scale)


@pytest.mark.parametrize("name", TYPES)
@SETTINGS
@given(k=K_BLOCKED, m=st.integers(1, 70), seed=st.integers(0, 99))
def test_few_rows_do_not_depend_on_their_company(level, name, k, m, seed):
    """Below the int8 GEMM's 4 rows, x rows pass the weights in tiles of 4 weight rows by up to 4 x
    rows (AVX512_VNNI), each sum in vec_dot's order: a row's result is bit for bit the same
    whichever rows came with it, and whichever 4-row group (or leftover row) its weight is in."""
    x, q = data(seed, 3, k), quant.quantize(data(seed + 1, m, k), name)
    alone = np.stack([K.matmul(x[i:i + 1], q)[0] for i in range(3)])
    for n in (1, 2, 3):
        np.testing.assert_array_equal(K.matmul(x[:n], q), alone[:n])
    by_row = np.concatenate([K.matmul(x, q[j:j + 1]) for j in range(m)], axis=1)   # vec_dot, one row each
    np.testing.assert_array_equal(alone, by_row)


@pytest.mark.parametrize("name", ["q8_0", "q4_0"])
@pytest.mark.parametrize("n", [4, 13])
def test_gemm_panels_packed_in_registers_as_row_by_row(level, name, n):
    """The int8 GEMM packs whole 16-row halves of a panel with a transpose in registers and the
    rest row by row (gemm_q8.c): a weight row's products are the same to the bit whichever way
    its panel was packed; a one-row weight is always packed row by row."""
    x, q = data(10, n, 320), quant.quantize(data(11, 75, 320), name)
    by_row = np.concatenate([K.matmul(x, q[j:j + 1]) for j in range(75)], axis=1)
    np.testing.assert_array_equal(K.matmul(x, q), by_row)


@pytest.mark.parametrize("name", ["f16", "bf16"])
@pytest.mark.parametrize("n,k", [(33, 7), (40, 256), (47, 300), (64, 520)])   # the f32 GEMM's rows
def test_gemm_of_16bit_weights_is_the_f32_gemm_of_them_widened(level, batch_variant, name, n, k):
    """Batch invariance off (the GEMMs of many rows), f16 and bf16 widen to f32 exactly, so their GEMM (the AVX2 one widens inside its panel
    transpose, matmul.c) is the f32 GEMM of the widened weights, bit for bit, at any k and m."""
    x, q = data(12, n, k), quant.quantize(data(13, 75, k), name)
    np.testing.assert_array_equal(K.matmul(x, q), K.matmul(x_as_seen(x, name), quant.dequantize(q)))


@pytest.mark.parametrize("name,weight", [("q8_0", 127), ("q4_0", -8)])
@pytest.mark.parametrize("n", [1, 20])
def test_x_quantized_exactly_as_quant_py(level, name, weight, n):
    """With w = weight * I (d_w = 1, one quant of `weight` per row), y = weight * x' exactly: the
    kernels' Q8_0 copy of x, read back bit for bit. x is full of ties (amax 127, so d = 1)."""
    rng = np.random.default_rng(n)
    x = (rng.integers(-254, 255, (n, 64)) / 2).astype(np.float32)
    x[:, [0, 40]] = 127
    x[:, 32:40] = rng.standard_normal((n, 8)) * 3          # and a block of arbitrary numbers
    x[:, 40] = 9.0
    q = quant.quantize(np.eye(64, dtype=np.float32) * weight, name)
    assert np.all(q["d"][q["d"] != 0] == 1)
    want = weight * quant.dequantize(quant.quantize(x, "q8_0"))
    np.testing.assert_array_equal(K.matmul(x, q), want)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n", [1, 3, 20])
def test_zero_blocks_give_zeros_not_nan(level, name, n):
    x, w = data(4, n, 96), data(5, 40, 96)
    x[0] = 0                      # an all-zero x row: d_x = 0 in every block
    x[-1, 32:64] = 0              # one zero block among live ones
    w[3] = 0                      # an all-zero weight row
    w[:, 64:] = 0                 # a zero block in every row
    got = check(x, w, name)
    assert np.all(np.isfinite(got)) and np.all(got[0] == 0) and np.all(got[:, 3] == 0)


@pytest.mark.parametrize("name", TYPES)
def test_one_and_two_threads_agree(level, threads, name):
    """Threads split weight rows (and x row chunks), never a sum: bit-identical results."""
    x, q = data(6, 70, 320), quant.quantize(data(7, 200, 320), name)
    K.set_threads(1)
    one = [K.matmul(x, q), K.matmul(x[:3], q)]
    K.set_threads(2)
    two = [K.matmul(x, q), K.matmul(x[:3], q)]
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


def test_concurrent_calls_share_the_scratch_safely(threads):
    """x's converted copy lives in one scratch buffer: Python threads calling at once (the GIL is
    released) each get their own answer."""
    K.set_threads(2)
    jobs = [(data(s, n, 256), quant.quantize(data(s + 1, 96, 256), name))
            for s, (n, name) in enumerate([(1, "q8_0"), (40, "q4_0"), (5, "q4_0"), (64, "q8_0"), (3, "bf16")])]
    want = [K.matmul(x, q) for x, q in jobs]
    errors = []

    def work(i):
        for _ in range(20):
            if not np.array_equal(K.matmul(*jobs[i]), want[i]):
                errors.append(i)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors


@pytest.mark.parametrize("name", TYPES)
def test_weights_are_read_in_place(name):
    """A typed weight is never copied: changing it changes the next result."""
    x, q = data(8, 2, 64), quant.quantize(data(9, 3, 64), name)
    before = K.matmul(x, q)
    q[0] = np.zeros(1, q.dtype)
    after = K.matmul(x, q)
    assert np.all(after[:, 0] == 0) and np.array_equal(after[:, 1:], before[:, 1:])


def test_errors():
    x = data(0, 4, 64)
    q = quant.quantize(data(1, 6, 64), "q8_0")
    with pytest.raises(ValueError, match="do not fit"):
        K.matmul(data(0, 4, 32), q)                       # k = 64 is 2 blocks, not 32
    with pytest.raises(ValueError, match="C-contiguous"):
        K.matmul(x, quant.quantize(data(1, 6, 128), "q4_0")[:, ::2])
    with pytest.raises(ValueError, match="C-contiguous"):
        K.matmul(x, quant.quantize(data(1, 64, 6), "f16").T)
    out = np.empty((4, 6), np.float32)
    assert K.matmul(x, q, out=out) is out
    np.testing.assert_array_equal(out, K.matmul(x, q))
    assert K.matmul(np.zeros((0, 64), np.float32), q).shape == (0, 6)


@pytest.mark.parametrize("name", quant.TYPES)   # the read-only block types: test_block_formats.py
def test_embedding_gathers_any_type(name):
    table = quant.quantize(data(10, 50, 64), name)
    ids = np.array([3, 0, 49, 3])
    out = np.full((4, 64), np.nan, np.float32)
    assert K.embedding(table, ids, out) is out
    np.testing.assert_array_equal(out, quant.dequantize(table)[ids])
    for bad in (50, -1):   # never a read outside the table
        with pytest.raises(ValueError, match="token id is outside 0..49"):
            K.embedding(table, np.array([1, bad]), np.empty((2, 64), np.float32))
    with pytest.raises(ValueError, match="do not fit"):
        K.embedding(table, ids, np.empty((4, 64), np.float64))
    with pytest.raises(ValueError, match="token ids must be integers"):
        K.embedding(table, np.array([1.7]), np.empty((1, 64), np.float32))
    read_only = np.empty((4, 64), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="do not fit"):
        K.embedding(table, ids, read_only)


# ---- Q8_0X8 and Q4_0X8 (quant.h): rows interleaved by 8 at load, for the AVX2 and AVX512_VNNI kernels ----

X8 = ["q8_0", "q4_0"]


def interleaved(w, name):
    return quant.interleave(quant.quantize(w, name))


@pytest.mark.parametrize("name", X8)
@SETTINGS
@given(n=N, k=K_BLOCKED, groups=st.integers(1, 9), seed=st.integers(0, 99))
def test_x8_within_the_bounds_of_its_rows(level, name, n, k, groups, seed):
    """The repacked weights give their row type's products within the same tight bound (each block's
    integer dot product exact, one rounding a block), at any n (their kernel, or from 17 rows on
    AVX512_VNNI the int8 GEMM, which reads them too), and added to out as a residual."""
    x, w = data(seed, n, k), interleaved(data(seed + 1, 8 * groups, k), name)
    got = K.matmul(x, w)
    wd = np.abs(quant.dequantize(w)).astype(np.float64)
    tight = (k + 4) * U * (np.abs(x_as_seen(x, name)) @ wd.T) + 1e-30
    assert got.shape == (n, 8 * groups)
    assert np.all(np.abs(got - R.matmul_exact(x, w)) <= tight)
    out = data(seed + 2, n, 8 * groups)
    want = out + got
    K.matmul(x, w, out=out, residual=True)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("name", X8)
@pytest.mark.parametrize("n", [1, 2, 5, 8, 9, 13, 16, 17])
def test_x8_kernel_is_the_readable_one_bit_for_bit(level, name, n):
    """Each SIMD path's X8 kernel gives, to the bit, what the plain C one (quant.c, x8_vec_dot_ref:
    ggml's reference order with one fma a block) gives, for every row whatever rows came with it;
    rows of 10 and 17 blocks (the int sums' two chains)."""
    for k in (320, 544):
        x, w = data(n, n, k), interleaved(data(n + 1, 40, k), name)
        got = K.matmul(x, w)
        alone = np.stack([K.matmul(x[i], w) for i in range(n)])
        best = K._set_simd("c")
        try:
            plain = K.matmul(x, w)
        finally:
            K._set_simd(best)
        np.testing.assert_array_equal(got, plain)
        np.testing.assert_array_equal(alone, plain)


@pytest.mark.parametrize("name,big,small", [("q8_0", 127.0, -127.0), ("q4_0", 7.0, -8.0)])
def test_x8_extremes_do_not_overflow(level, name, big, small):
    """Quants at their extremes against x quants of +-127: the kernels' integer sums at their largest."""
    w = np.full((8, 64), big, np.float32)
    w[:, ::2] = small
    w[4:] *= -1
    x = np.where(np.arange(64) % 2, 127.0, -127.0).astype(np.float32)[None]
    q = interleaved(w, name)
    np.testing.assert_array_equal(K.matmul(x, q), R.matmul_exact(x, q).astype(np.float32))


@pytest.mark.parametrize("name", X8)
def test_interleaved_only_where_the_kernels_want_it(level, name):
    """kernels.interleaved repacks a Q8_0 or Q4_0 matrix of whole groups on the AVX2 path and on
    AVX-512 with VNNI (their X8 kernels), never on NEON or plain C."""
    q = quant.quantize(data(1, 16, 64), name)
    x8_kernels = K.simd() == "avx2" or (K.simd() == "avx512" and "avx512_vnni" in K.simd_extensions())
    assert quant.is_interleaved(K.interleaved(q)) == x8_kernels
    assert K.interleaved(q[:12]).dtype == q.dtype              # not whole groups of 8
    assert K.interleaved(quant.quantize(data(1, 16, 64), "bf16")).dtype == quant.BF16
    repacked = quant.interleave(q)
    assert K.interleaved(repacked) is repacked


def test_simd_extensions():
    assert set(K.simd_extensions()) <= ({"dotprod"} if K.ARM else {"avx512_vnni"})


# ---- F32P, F16P and BF16P (quant.h): f32, f16 and bf16 in the GEMM's panels, made at load ----

PANELED = ["f32", "f16", "bf16"]


def test_panels_are_their_rows_moved():
    """quant.panels puts number p of rows 32g..32g+31 side by side in element [g, p]; unpanel takes
    it back, to the bit; the sizes read through it are the matrix's."""
    for name in PANELED:
        q = quant.quantize(data(1, 96, 40), name)
        p = quant.panels(q)
        assert p.shape == (3, 40) and quant.type_of(p) == name + "p" and quant.is_panels(p)
        assert (quant.rows(p), quant.columns(p), quant.bytes_per_weight(p)) == (96, 40, q.itemsize)
        np.testing.assert_array_equal(quant.dequantize(p)[33, 7], quant.dequantize(q)[33, 7])
        assert p[p.dtype.names[0]][1, 7, 1:2].tobytes() == q[33, 7:8].tobytes()    # row 33 = 32 * 1 + 1
        back = quant.unpanel(p)
        assert back.dtype == q.dtype and back.tobytes() == q.tobytes()


@pytest.mark.parametrize("name", PANELED)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 13, 40, 68])
def test_panels_give_the_f32_gemm_of_their_numbers_bit_for_bit(level, batch_variant, name, n):
    """Only the GEMM reads panels, at any number of x rows, x as it is (bf16 panels too: no
    vdpbf16ps path to agree with), and it gives what it gives for their numbers as f32 rows (which
    it packs into panels on every call), to the bit: the same products summed in the same order.
    The rows' GEMM (batch invariance off: invariant, many f32 rows sum in the few-rows order
    instead) is run among enough rows to take it (a row's result does not depend on its company there). k: less than a k chunk, one, and across chunks; m: three panels, several
    register tiles wide on AVX2, NEON and plain C. Added to out as a residual too."""
    for k in (7, 256, 300, 520):
        x, q = data(n, n, k), quant.quantize(data(n + 1, 96, k), name)
        p = quant.panels(q)
        among = np.concatenate([x, data(n + 2, K.gemm_min_rows(), k)])
        got = K.matmul(x, p)
        np.testing.assert_array_equal(got, K.matmul(among, quant.dequantize(q))[:n])
        out = data(n + 3, n, 96)
        want = out + got
        K.matmul(x, p, out=out, residual=True)
        np.testing.assert_array_equal(out, want)
        q2, q3 = (quant.panels(quant.quantize(data(n + s, 64, k), name)) for s in (4, 5))
        for a, b in zip(K.matmuls(x, [p, q2, q3]), [got, K.matmul(x, q2), K.matmul(x, q3)]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", PANELED)
def test_panels_within_the_bounds_of_their_rows(level, name):
    """Within the tight bound of check() of the exact products of x as it is and their numbers."""
    x, w = data(20, 9, 300), data(21, 64, 300)
    p = quant.panels(quant.quantize(w, name))
    wd = np.abs(quant.dequantize(p)).astype(np.float64)
    tight = (300 + 4) * U * (np.abs(x) @ wd.T) + 1e-30
    assert np.all(np.abs(K.matmul(x, p) - R.matmul_exact(x, p)) <= tight)


def test_interleaved_makes_panels_for_models_of_many_rows():
    """kernels.interleaved(w, panels=True) (a masked-diffusion model's matrices) puts f32, f16 and
    bf16 matrices of whole panels in panels; without panels it takes panels back to rows (a causal
    model reads few rows a pass), and leaves other types to their own rules."""
    for name in PANELED:
        q = quant.quantize(data(1, 64, 48), name)
        p = K.interleaved(q, panels=True)
        assert quant.type_of(p) == name + "p"
        assert K.interleaved(q[:48], panels=True).dtype == q.dtype            # not whole panels
        assert K.interleaved(p, panels=True) is p
        assert K.interleaved(p).tobytes() == q.tobytes() and K.interleaved(p).dtype == q.dtype
        assert K.interleaved(q) is q
    q8 = quant.quantize(data(1, 64, 64), "q8_0")
    assert K.interleaved(q8, panels=True).dtype == K.interleaved(q8).dtype


@pytest.mark.parametrize("name", X8 + PANELED)
def test_embedding_of_a_table_made_at_load(name):
    """A look-up reads a row out of its group of 8 (X8) or its panel of 32, whichever row it is."""
    w = quant.quantize(data(10, 64, 64), name)
    table = quant.interleave(w) if name in X8 else quant.panels(w)
    out = np.empty((3, 64), np.float32)
    K.embedding(table, np.array([63, 0, 33]), out)
    np.testing.assert_array_equal(out, quant.dequantize(table)[[63, 0, 33]])
    with pytest.raises(ValueError, match="outside 0..63"):
        K.embedding(table, np.array([64]), out[:1])


def test_panel_width_is_the_kernels():
    from tinydiff._kernels import lib
    assert lib.TD_PANEL == quant.PANEL
