"""The C kernels (tinydiff.engine.kernels) against the NumPy reference (tinydiff.engine.reference).

Shapes are drawn by hypothesis (size 1, odd sizes that miss every SIMD width, sizes that cross the
matmul tile and panel edges); data comes from a seeded NumPy generator. Every SIMD path this CPU
has is tested. Tolerances are f32 rounding relative to the size of the terms summed.
"""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinydiff.decoding import sampling as S
from tinydiff.engine import kernels as K
from tinydiff.engine import reference as R
from tinydiff.engine.masks import BIDIRECTIONAL, CAUSAL, block_causal

HERE = os.path.dirname(os.path.abspath(__file__))

ODD = st.sampled_from([1, 2, 3, 7, 16, 17, 33, 64, 100])
# the SIMD-level fixture is set once per test, not per example, which is what we want
settings.register_profile("kernels", max_examples=150, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.load_profile("kernels")


def data(seed, *shape, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def assert_close(got, want, scale, rtol=1e-4):
    """|got - want| <= rtol * scale elementwise, scale being the size of what was summed (>= 1e-3)."""
    assert got.shape == want.shape and got.dtype == np.float32
    err = np.abs(got.astype(np.float64) - want)
    bound = rtol * np.maximum(scale, 1e-3)
    assert np.all(err <= bound), f"max error {err.max():.3g} (bound {np.min(bound):.3g})"


def check_matmul(x, w):
    got = K.matmul(x, w)
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    assert_close(got, R.matmul(x, w), np.abs(x64) @ np.abs(w64).T)


# ---- matmul ----

@given(n=st.integers(1, 60), k=st.one_of(ODD, st.integers(250, 600)), m=st.integers(1, 100), seed=st.integers(0, 99))
def test_matmul(level, n, k, m, seed):
    check_matmul(data(seed, n, k), data(seed + 1, m, k))


@given(k=ODD, m=st.integers(1, 70), seed=st.integers(0, 99))
def test_matvec_1d(level, k, m, seed):
    x, w = data(seed, k), data(seed + 1, m, k)
    assert K.matmul(x, w).shape == (m,)
    check_matmul(x, w)


@given(n=st.integers(1, 30), k=ODD, m=st.integers(1, 40), seed=st.integers(0, 99))
def test_matmul_strided_and_wrong_types(n, k, m, seed):
    big_x, big_w = data(seed, 2 * n, k + 3), data(seed + 1, m + 2, 2 * k)
    check_matmul(big_x[::2, 1:k + 1], big_w[1:m + 1, ::2])  # non-contiguous slices
    check_matmul(big_x[:n, :k].astype(np.float64), big_w[:m, :k].astype(np.float64))
    check_matmul((big_x[:n, :k] * 10).astype(np.int32), big_w[:m, :k])


@given(k=st.one_of(ODD, st.integers(250, 600)), m=st.integers(1, 40), seed=st.integers(0, 99))
def test_matmul_few_rows_do_not_depend_on_their_company(level, k, m, seed):
    """Below the GEMM's 16 rows (33 on AMD), x rows pass the weights in register tiles of several
    rows; each product is summed as one row alone sums it, so a row's result is bit for bit the
    same whichever rows (and how many) came with it: a block of a block-diffusion pass gives what
    its positions give one at a time."""
    few = K.gemm_min_rows() - 1
    x, w = data(seed, few, k), data(seed + 1, m, k)
    alone = np.stack([K.matmul(x[i:i + 1], w)[0] for i in range(few)])
    for n in range(1, few + 1):
        np.testing.assert_array_equal(K.matmul(x[:n], w), alone[:n])


@given(k=st.one_of(ODD, st.integers(250, 600)), m=st.integers(1, 40), seed=st.integers(0, 99))
def test_gemm_rows_do_not_depend_on_their_tile(level, k, m, seed):
    """From 16 rows (33 on AMD) the GEMM cuts x into tiles of 6 (12 with AVX-512), 4 and 1-3
    rows, and where a cut would leave 1 or 2 rows it takes 4 + 3 or 4 + 4 instead; every tile sums
    a row as the others do, so each row is the same to the bit whichever n it came in."""
    first = K.gemm_min_rows()
    x, w = data(seed, first + 24, k), data(seed + 1, m, k)
    whole = K.matmul(x, w)
    for n in range(first, first + 24):
        np.testing.assert_array_equal(K.matmul(x[:n], w), whole[:n])


def test_matmul_large(level):
    """Several k panels, x row chunks and tile edges at once (n, k, m not multiples of any tile)."""
    check_matmul(data(0, 301, 777), data(1, 259, 777))


def test_matmul_empty():
    assert K.matmul(np.zeros((0, 5), np.float32), data(0, 4, 5)).shape == (0, 4)
    np.testing.assert_array_equal(K.matmul(np.ones((3, 0), np.float32), np.ones((4, 0), np.float32)), np.zeros((3, 4)))


def test_matmul_out_and_errors():
    x, w = data(0, 5, 17), data(1, 9, 17)
    out = np.full((5, 9), np.nan, np.float32)
    assert K.matmul(x, w, out=out) is out
    assert_close(out, R.matmul(x, w), np.abs(x) @ np.abs(w).T)
    for bad in [np.empty((5, 9)), np.empty((5, 8), np.float32), np.empty((9, 5), np.float32).T, x]:
        with pytest.raises(ValueError):
            K.matmul(x, w, out=bad)
    with pytest.raises(ValueError, match="do not fit"):
        K.matmul(x, data(1, 9, 16))
    with pytest.raises(ValueError, match="do not fit"):
        K.matmul(x, data(1, 17))


def test_matmul_zero_copy_weights():
    """An f32 C-contiguous weight is read in place: changing it changes the result."""
    x, w = data(0, 2, 8), data(1, 3, 8)
    before = K.matmul(x, w)
    w[0] = 0
    after = K.matmul(x, w)
    assert np.all(after[:, 0] == 0) and np.array_equal(after[:, 1:], before[:, 1:])


# ---- rmsnorm, softmax, silu_mul ----

@given(n=st.integers(1, 9), d=ODD, eps=st.sampled_from([1e-6, 1e-5, 0.1]), seed=st.integers(0, 99))
def test_rmsnorm(n, d, eps, seed):
    x, w = data(seed, n, d) * 3, data(seed + 1, d)
    assert_close(K.rmsnorm(x, w, eps), R.rmsnorm(x, w, eps), np.abs(R.rmsnorm(x, w, eps)), rtol=1e-5)
    assert_close(K.rmsnorm(x[:, ::-1], w, eps), R.rmsnorm(x[:, ::-1], w, eps), 1 + np.abs(x[:, ::-1] * w), rtol=1e-5)
    out = np.empty_like(x)
    assert K.rmsnorm(x.astype(np.float64), w, eps, out=out) is out
    with pytest.raises(ValueError, match="do not fit"):
        K.rmsnorm(x, np.ones(d + 1, np.float32), eps)


@given(n=st.integers(1, 9), d=ODD, seed=st.integers(0, 99))
def test_softmax(n, d, seed):
    x = data(seed, n, d) * 5
    got = K.softmax(x)
    assert_close(got, R.softmax(x), R.softmax(x), rtol=1e-5)
    assert np.allclose(got.sum(-1), 1, atol=1e-5)
    assert_close(K.softmax(x[:, ::2]), R.softmax(x[:, ::2]), R.softmax(x[:, ::2]), rtol=1e-5)
    assert_close(K.softmax(x[0]), R.softmax(x[0]), R.softmax(x[0]), rtol=1e-5)


@given(n=st.integers(1, 9), V=st.sampled_from([1, 2, 3, 7, 8, 9, 33, 2048, 2049]), seed=st.integers(0, 99),
       ruled_out=st.integers(0, 5))
def test_softmax_stats(level, n, V, seed, ruled_out):
    """The sampler's float64 softmax sums against NumPy's: max and argmax exactly, the sums within
    float64 rounding (terms in another order, e^ within 2 ulp), with -inf tokens adding nothing."""
    z = np.random.default_rng(seed).standard_normal((n, V)) * 6
    z[:, 1:1 + ruled_out] = -np.inf                                    # never the whole row
    top, first, total, h = K.softmax_stats(z, entropy=True)
    want = R.softmax_stats(z, entropy=True)
    np.testing.assert_array_equal(top, want[0])
    np.testing.assert_array_equal(first, want[1])
    np.testing.assert_allclose(total, want[2], rtol=1e-14)
    assert np.all(np.abs(h - want[3]) <= 1e-13 * (np.abs(want[3]) + want[2]))
    assert K.softmax_stats(z)[3] is None


def test_softmax_stats_exp_and_ties(level):
    """e^x for x in [-708, 0] within 2 ulp of NumPy's (h / x of the row [0, x] is e^x itself), 0
    below; the first of equal maxima is the argmax, as np.argmax says."""
    x = np.concatenate([-np.geomspace(1e-12, 708, 3000), np.linspace(-708, -1e-3, 3000)])
    _, _, total, h = K.softmax_stats(np.stack([np.zeros_like(x), x], 1), entropy=True)
    np.testing.assert_allclose(h / x, np.exp(x), rtol=4.5e-16, atol=0)
    np.testing.assert_allclose(total, 1 + np.exp(x), rtol=2.3e-16)    # the row [0, x]: 1 + e^x
    below = K.softmax_stats(np.array([[0.0, -709.0, -745.0, -1e300, -np.inf]]), entropy=True)
    assert below[2][0] == 1.0 and below[3][0] == 0.0
    ties = np.array([[1.0, 3.0, 3.0, -np.inf, 3.0], [5.0, 5.0, 5.0, 5.0, 5.0]])
    np.testing.assert_array_equal(K.softmax_stats(ties)[1], [1, 0])
    with pytest.raises(ValueError, match="softmax_stats"):
        K.softmax_stats(np.zeros(4))


@given(n=st.integers(1, 6), V=st.sampled_from([1, 2, 3, 7, 8, 9, 33, 1000]), seed=st.integers(0, 99),
       temperature=st.sampled_from([0.1, 0.7, 1.0, 3.0]))
def test_gumbel_max_draws_what_numpy_gumbel_draws(level, n, V, seed, temperature):
    """The C Gumbel-max from rng.random's uniforms picks what argmax(z / T + rng.gumbel(...)) picks
    with the same seed (decoding/sampling.py's gumbel_max), -inf tokens never."""
    z = np.random.default_rng(seed).standard_normal((n, V)) * 4
    z[:, 1:3] = -np.inf
    want = S.gumbel_max(z, temperature, np.random.default_rng(seed + 1))
    u = np.random.default_rng(seed + 1).random(z.shape)
    np.testing.assert_array_equal(K.gumbel_max(z, temperature, u), want)
    np.testing.assert_array_equal(R.gumbel_max(z, temperature, u), want)


def test_gumbel_max_log_within_4_ulp(level):
    """Two tokens whose scores z / T + g differ by 4 ulp of their size, by NumPy's logs: the C
    draw takes the larger every time, so its two logs are that close to libm's; over uniforms
    from 1e-12 to 1 - 1e-12. A uniform of 0 (NumPy draws again) leaves its token out; ties go to
    the first, as np.argmax."""
    rng = np.random.default_rng(0)
    u = rng.random((20000, 2))
    u[:200, 0], u[200:400, 1] = rng.random(200) * 1e-12, 1 - rng.random(200) * 1e-12
    g = -np.log(-np.log(1.0 - u))
    margin = 4 * 2.0**-52 * np.maximum(np.abs(g).max(1), 1.0)
    for sign in (1, -1):
        z = np.stack([np.zeros(len(u)), g[:, 0] - g[:, 1] + sign * margin], 1)
        np.testing.assert_array_equal(K.gumbel_max(z, 1.0, u), np.full(len(u), int(sign > 0)))
    assert K.gumbel_max(np.array([[5.0, 0.0]]), 1.0, np.array([[0.0, 0.5]]))[0] == 1
    assert K.gumbel_max(np.zeros((1, 9)), 1.0, np.full((1, 9), 0.5))[0] == 0
    with pytest.raises(ValueError, match="gumbel_max"):
        K.gumbel_max(np.zeros((2, 3)), 0.0, np.zeros((2, 3)))


def test_exp_extremes(level):
    """The vector exp: -inf gives exactly 0, large arguments saturate instead of wrapping."""
    x = np.array([[0, -np.inf, 1, -1e30, -100, -87, 3, 4, 5, -np.inf, 7, 8, 9, 10, 11, 12, 13]], np.float32)
    assert_close(K.softmax(x), R.softmax(x), R.softmax(x), rtol=1e-5)
    assert K.softmax(x)[0, 1] == 0
    g = np.array([-np.inf, -1e30, -100, -88, -87, -20, 0, 20, 88, 89, 100, 1e30, np.inf] * 2, np.float32)
    with np.errstate(all="ignore"):
        want = R.silu_mul(g, np.ones_like(g))
    np.testing.assert_allclose(K.silu_mul(g, np.ones_like(g)), want, rtol=1e-6, atol=1e-30)


@given(shape=st.sampled_from([(1,), (3,), (17,), (2, 33), (3, 5000)]), seed=st.integers(0, 99))
def test_silu_mul(shape, seed):
    g, u = data(seed, *shape) * 4, data(seed + 1, *shape)
    want = R.silu_mul(g, u)
    assert_close(K.silu_mul(g, u), want, np.abs(want), rtol=1e-5)
    assert_close(K.silu_mul(g.astype(np.float64), u), want, np.abs(want), rtol=1e-5)
    assert K.silu_mul(g, u, out=g) is g  # in place on an input is fine: elementwise
    assert_close(g, want, np.abs(want), rtol=1e-5)
    with pytest.raises(ValueError, match="differ"):
        K.silu_mul(g, u[..., :-1] if shape[-1] > 1 else np.ones(2, np.float32))


# ---- rope ----

def inv_freq(hd, base=10000.0):
    return (1.0 / base ** (np.arange(0, hd, 2, dtype=np.int64).astype(np.float32) / hd)).astype(np.float32)


@given(n=st.integers(1, 9), heads=st.integers(1, 5), hd=st.sampled_from([2, 4, 18, 34, 64, 128]),
       pos0=st.integers(0, 5000), pos_dtype=st.sampled_from([np.int32, np.int64]), seed=st.integers(0, 99))
def test_rope(n, heads, hd, pos0, pos_dtype, seed):
    x = data(seed, n, heads, hd)
    pos = (pos0 + np.arange(n)).astype(pos_dtype)
    want = R.rope(x.copy(), pos, inv_freq(hd))
    assert K.rope(x, pos, inv_freq(hd)) is x
    assert_close(x, want, 1 + np.abs(want), rtol=1e-5)


def test_rope_errors():
    x = data(0, 2, 3, 8)
    with pytest.raises(ValueError, match="in place"):
        K.rope(x.astype(np.float64), [0, 1], inv_freq(8))
    with pytest.raises(ValueError, match="in place"):
        K.rope(data(0, 2, 3, 16)[..., ::2], [0, 1], inv_freq(8))
    with pytest.raises(ValueError, match="do not fit"):
        K.rope(x, [0, 1, 2], inv_freq(8))
    with pytest.raises(ValueError, match="do not fit"):
        K.rope(x, [0, 1], inv_freq(6))
    with pytest.raises(ValueError, match="integers"):
        K.rope(x, [0.0, 1.0], inv_freq(8))


# ---- attention ----

def check_attention(q, k, v, **kw):
    got = K.attention(q, k, v, **kw)
    assert_close(got, R.attention(q, k, v, **kw), np.maximum(1, np.abs(v).max()), rtol=2e-4)
    return got


MASKS = st.sampled_from([CAUSAL, BIDIRECTIONAL, block_causal(2), block_causal(5)])


@given(n=st.integers(1, 12), extra=st.integers(0, 70), kvh=st.integers(1, 3), group=st.sampled_from([1, 2, 3]),
       hd=st.sampled_from([1, 3, 16, 17, 64]), mask=MASKS, seed=st.integers(0, 99))
def test_attention(level, n, extra, kvh, group, hd, mask, seed):
    t = n + extra  # queries are the last n positions of a KV cache of t keys
    q, k, v = data(seed, n, kvh * group, hd), data(seed + 1, t, kvh, hd), data(seed + 2, t, kvh, hd)
    check_attention(q, k, v, mask=mask, q_pos0=extra)


@settings(max_examples=60)
@given(n=st.integers(1, 70), extra=st.integers(0, 140), kvh=st.integers(1, 2),
       group=st.sampled_from([1, 2, 3, 4, 9, 50]), hd=st.sampled_from([1, 3, 17, 64]),
       mask=MASKS, seed=st.integers(0, 99), behind=st.integers(0, 20))
def test_attention_tiles(level, n, extra, kvh, group, hd, mask, seed, behind):
    """The many-query path: query blocks of up to 48 rows (16 queries of 3 heads, 48 of 1, 5 of 9,
    heads past 48 in several tasks; the queries shared out in blocks of about one size), key blocks
    of 64 and their ends, rows whose keys end inside a block, the keys past a block's last full tile."""
    t = n + extra
    q, k, v = data(seed, n, kvh * group, hd), data(seed + 1, t, kvh, hd), data(seed + 2, t, kvh, hd)
    check_attention(q, k, v, mask=mask, q_pos0=max(extra - behind, 0))


@settings(max_examples=60)
@given(n=st.integers(2, 13), extra=st.integers(0, 140), kvh=st.integers(1, 2), group=st.sampled_from([1, 3]),
       hd=st.sampled_from([1, 3, 17, 32, 64, 80]), seed=st.integers(0, 99), paged=st.booleans())
def test_a_causal_passes_queries_are_each_query_alone(level, n, extra, kvh, group, hd, seed, paged):
    """Batch invariant, a causal pass's queries take the one-query order, four of a head at a time
    (attend_rows_q: shared key and value loads, each query's own keys past the others'): every
    output is the bits the query gets alone, as in decoding, its keys ending inside a block or
    past one, contiguous or paged."""
    t = n + extra
    q, k, v = data(seed, n, kvh * group, hd), data(seed + 1, t, kvh, hd), data(seed + 2, t, kvh, hd)
    kw = {}
    if paged:
        used = -(-t // K.PAGE)
        pages = np.random.default_rng(seed).permutation(used + 1)[:used]
        pool_k, pool_v = data(seed + 3, (used + 1) * K.PAGE, kvh, hd), data(seed + 4, (used + 1) * K.PAGE, kvh, hd)
        gather = np.concatenate([np.arange(p * K.PAGE, (p + 1) * K.PAGE) for p in pages])[:t]
        pool_k[gather], pool_v[gather] = k, v
        k, v, kw = pool_k, pool_v, {"pages": pages}
    together = K.attention(q, k, v, mask=CAUSAL, q_pos0=extra, **kw, **({"t": t} if paged else {}))
    for i in range(n):
        alone = K.attention(q[i:i + 1], k, v, mask=CAUSAL, q_pos0=extra + i, **kw, **({"t": extra + i + 1} if paged else {}))
        assert together[i].tobytes() == alone[0].tobytes(), i


@settings(max_examples=40)
@given(n=st.integers(1, 70), t=st.integers(1, 260), kvh=st.integers(1, 2), group=st.sampled_from([1, 3, 9]),
       hd=st.sampled_from([1, 17, 64]), mask=MASKS, seed=st.integers(0, 99), spare=st.integers(0, 3))
def test_paged_attention_is_the_attention_of_the_gathered_keys(level, n, t, kvh, group, hd, mask, seed, spare):
    """Keys in pages of a pool, in any order: bit for bit the contiguous attention over them."""
    n = min(n, t)
    used = -(-t // K.PAGE)
    pages = np.random.default_rng(seed).permutation(used + spare)[:used]          # [used] pool pages
    pool_k, pool_v = data(seed + 1, (used + spare) * K.PAGE, kvh, hd), data(seed + 2, (used + spare) * K.PAGE, kvh, hd)
    gather = np.concatenate([np.arange(p * K.PAGE, (p + 1) * K.PAGE) for p in pages])[:t]
    q = data(seed, n, kvh * group, hd)
    want = K.attention(q, pool_k[gather], pool_v[gather], mask=mask, q_pos0=t - n)
    got = K.attention(q, pool_k, pool_v, mask=mask, q_pos0=t - n, pages=pages, t=t)
    np.testing.assert_array_equal(got, want)


def test_paged_attention_checks_its_pages():
    q, pool = data(0, 1, 2, 8), data(1, 2 * K.PAGE, 2, 8)
    for pages, t in [([0, 2], 70), ([0], K.PAGE + 1), ([-1], 3), ([0], None)]:
        with pytest.raises(ValueError, match="do not fit a pool"):
            K.attention(q, pool, pool, pages=np.array(pages), t=t)


def test_attention_options():
    q, k, v = data(0, 4, 4, 8), data(1, 10, 2, 8), data(2, 10, 2, 8)
    check_attention(q, k, v, q_pos0=6, scale=0.3)
    check_attention(q, k, v, mask=BIDIRECTIONAL)
    check_attention(q.astype(np.float64), k[:, ::-1], v, q_pos0=2)  # q_pos0 + n < t: later keys unseen
    check_attention(q[:, :, ::2], k[..., ::2], v[..., ::2], mask=BIDIRECTIONAL)
    np.testing.assert_array_equal(K.attention(q, k[:0], v[:0], mask=BIDIRECTIONAL), 0)  # no keys at all
    assert K.attention(q[:0], k, v).shape == (0, 4, 8)
    out = np.empty_like(q)
    assert K.attention(q, k, v, out=out) is out
    for bad in [dict(k=k[:, :1].repeat(3, 1)), dict(v=v[:9]), dict(q=q[..., :7])]:
        args = dict(q=q, k=k, v=v) | bad
        with pytest.raises(ValueError, match="do not fit"):
            K.attention(args["q"], args["k"], args["v"])
    with pytest.raises(ValueError, match="AttentionMask"):  # a dense mask: masks are data
        K.attention(q, k, v, mask=np.ones((4, 10), bool))
    with pytest.raises(ValueError):
        K.attention(q, k, v, out=q)


# ---- threads ----

def test_threads_setting(threads):
    assert K.physical_cores() >= 1
    K.set_threads(1)
    assert K.get_threads() == 1
    K.set_threads(3)
    assert K.get_threads() == 3
    for bad in [0, -1, 1.5]:
        with pytest.raises(ValueError):
            K.set_threads(bad)


def test_threads_from_environment():
    code = "from tinydiff.engine import kernels; print(kernels.get_threads())"
    env = dict(os.environ, TINYDIFF_THREADS="1")
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=HERE).stdout == "1\n"
    env["TINYDIFF_THREADS"] = "zero"          # not a number: importing still works (load() reports it)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=HERE)
    assert run.stdout == f"{K.physical_cores()}\n"


def test_simd_from_environment():
    """TINYDIFF_SIMD runs a lower path than the CPU's best (each one this CPU has); a value that
    is not one of them leaves the best at import (tinydiff.load reports it)."""
    code = "from tinydiff.engine import kernels; print(kernels.simd(), kernels.BEST_SIMD)"
    for level in K.SIMD_LEVELS[:K.SIMD_LEVELS.index(K.BEST_SIMD) + 1]:
        env = dict(os.environ, TINYDIFF_SIMD=level.upper())
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=HERE)
        assert run.stdout == f"{level} {K.BEST_SIMD}\n", run.stderr
    env = dict(os.environ, TINYDIFF_SIMD="sse9")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=HERE)
    assert run.stdout == f"{K.BEST_SIMD} {K.BEST_SIMD}\n", run.stderr


def run_all(seed):
    """One call of every threaded kernel, on inputs big enough to be split across threads."""
    x, w = data(seed, 70, 300), data(seed + 1, 200, 300)
    q, k, v = data(seed, 40, 6, 64), data(seed + 1, 100, 2, 64), data(seed + 2, 100, 2, 64)
    rope_x = data(seed, 64, 8, 64)
    K.rope(rope_x, np.arange(64), inv_freq(64))
    return [K.matmul(x, w), K.matmul(x[0], w), K.attention(q, k, v, q_pos0=60),
            K.attention(q, k, v, mask=BIDIRECTIONAL), K.rmsnorm(data(seed, 300, 400), data(seed, 400), 1e-6),
            K.softmax(data(seed, 300, 400)), K.silu_mul(data(seed, 100000), data(seed + 1, 100000)), rope_x]


def test_one_and_two_threads_agree(level, threads):
    """Threads split rows and (query, head) pairs, never a sum: results are bit-identical."""
    K.set_threads(1)
    one = run_all(0)
    K.set_threads(2)
    two = run_all(0)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


def test_concurrent_python_threads(threads):
    """Two Python threads calling kernels at once (the GIL is released) both get right answers."""
    K.set_threads(2)
    want = {seed: run_all(seed) for seed in (1, 2)}
    errors = []

    def work(seed):
        for _ in range(5):
            for a, b in zip(run_all(seed), want[seed]):
                if not np.array_equal(a, b):
                    errors.append(seed)

    workers = [threading.Thread(target=work, args=(seed,)) for seed in (1, 2)]
    for th in workers:
        th.start()
    for th in workers:
        th.join()
    assert not errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_can_use_the_pool(threads):
    """A forked child (multiprocessing's default on Linux) gets a fresh pool instead of a deadlock."""
    K.set_threads(2)
    want = K.matmul(data(0, 64, 256), data(1, 256, 256))
    pid = os.fork()
    if pid == 0:
        ok = np.array_equal(K.matmul(data(0, 64, 256), data(1, 256, 256)), want)
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("forked child hung")
