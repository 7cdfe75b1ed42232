"""The fused calls of a forward pass: matmuls (several weights, one x), matmul with residual=True
(out += x @ w.T) and rope_qk (q and k in one call) give exactly what the single calls give, on every SIMD path and weight type, and check
their arguments as the single calls do."""
import numpy as np
import pytest

from tinydiff.engine import kernels as K
from tinydiff.engine.ledger import Ledger
from tinydiff.formats import quant


def data(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def weight(seed, m, k, name):
    w = data(seed, m, k)
    return w if name == "f32" else quant.quantize(w, name)


@pytest.mark.parametrize("name", ["f32", "f16", "bf16", "q8_0", "q4_0"])
@pytest.mark.parametrize("n", [1, 3, 5, 13])               # few rows (one job), and the GEMM paths
@pytest.mark.parametrize("threads", [1, 2])
def test_matmuls_equal_one_matmul_each(level, name, n, threads):
    K.set_threads(threads)
    try:
        x = data(0, n, 64)
        ws = [weight(1, 40, 64, name), weight(2, 17, 64, name), weight(3, 33, 64, name), weight(4, 8, 64, name),
              weight(5, 16, 64, name)]                     # five: more than one job holds
        outs = K.matmuls(x, ws)
        for w, out in zip(ws, outs):
            np.testing.assert_array_equal(out, K.matmul(x, w))
    finally:
        K.set_threads(K.physical_cores())


def test_matmuls_of_mixed_types_and_into_outs():
    x = data(0, 2, 64)
    ws = [weight(1, 9, 64, "q4_0"), weight(2, 7, 64, "f32"), weight(3, 5, 64, "q4_0"), data(4, 3, 64).astype(np.float64)]
    outs = [np.full((2, w.shape[0]), np.nan, np.float32) for w in ws]
    got = K.matmuls(x, ws, outs)
    assert all(a is b for a, b in zip(got, outs))
    for w, out in zip(ws, outs):
        np.testing.assert_array_equal(out, K.matmul(x, w))


def test_matmuls_book_each_matmul():
    x, ws = data(0, 1, 64), [weight(1, 9, 64, "q8_0"), weight(2, 7, 64, "q8_0")]
    with Ledger() as fused:
        K.matmuls(x, ws)
    with Ledger() as single:
        for w in ws:
            K.matmul(x, w)
    assert fused.passes == single.passes


def test_matmuls_errors():
    x = data(0, 2, 64)
    with pytest.raises(ValueError, match="do not fit"):
        K.matmuls(x, [data(1, 4, 64), data(2, 4, 63)])
    with pytest.raises(ValueError, match="one out per weight"):
        K.matmuls(x, [data(1, 4, 64)], [None, None])
    with pytest.raises(ValueError, match="overlaps"):
        K.matmuls(x, [data(1, 2, 64)], [x.reshape(-1)[:4].reshape(2, 2)])
    w = data(1, 8, 64)
    with pytest.raises(ValueError, match="overlaps"):
        K.matmuls(x, [data(2, 4, 64), w], [None, w.reshape(-1)[100:116].reshape(2, 8)])
    row = np.zeros(2 * 64 + 2 * 8, np.float32)          # out right after x in one buffer: no overlap
    xs, out = row[:128].reshape(2, 64), row[128:].reshape(2, 8)
    xs[:] = x
    np.testing.assert_array_equal(K.matmul(xs, w, out=out), K.matmul(x, w))
    with pytest.raises(ValueError, match="C-contiguous"):
        K.matmuls(x, [quant.quantize(data(1, 4, 128), "q8_0")[:, ::2]])


@pytest.mark.parametrize("n,heads,kv_heads,hd", [(1, 6, 6, 48), (5, 9, 3, 64), (3, 4, 1, 2)])
def test_rope_qk_equals_rope_on_each(level, n, heads, kv_heads, hd):
    q, k = data(0, n, heads, hd), data(1, n, kv_heads, hd)
    pos, inv_freq = np.arange(7, 7 + n), data(2, hd // 2)
    q1, k1 = K.rope(q.copy(), pos, inv_freq), K.rope(k.copy(), pos, inv_freq)
    with Ledger() as led:
        assert K.rope_qk(q, k, pos, inv_freq) == (q, k)
    np.testing.assert_array_equal(q, q1)
    np.testing.assert_array_equal(k, k1)
    assert led.passes[0]["flops"] == 3 * n * (heads + kv_heads) * hd


def test_rope_qk_errors():
    q, k, pos, inv_freq = data(0, 2, 4, 8), data(1, 2, 2, 8), np.arange(2), data(2, 4)
    with pytest.raises(ValueError, match="do not fit"):
        K.rope_qk(q, data(1, 2, 2, 6), pos, inv_freq)
    with pytest.raises(ValueError, match="do not fit"):
        K.rope_qk(q, data(1, 3, 2, 8), pos, inv_freq)
    with pytest.raises(ValueError, match="in place"):
        K.rope_qk(q, k.astype(np.float64), pos, inv_freq)


@pytest.mark.parametrize("name", ["f32", "f16", "bf16", "q8_0", "q4_0"])
@pytest.mark.parametrize("n", [1, 5, 13, 17])
def test_residual_adds_the_product_to_out(level, name, n):
    """out + the finished product on every path: the f32 GEMM adds out in its tiles when one k chunk
    (256) holds the product, and through a temporary past it (k 320)."""
    for k in (64, 320):
        x, ws = data(0, n, k), [weight(1, 40, k, name), weight(2, 9, k, name)]
        before = [data(3, n, 40), data(4, n, 9)]
        outs = [b.copy() for b in before]
        with Ledger() as led:
            K.matmuls(x, ws, outs, op="mlp", residual=True)
        for w, b, out in zip(ws, before, outs):
            np.testing.assert_array_equal(out, b + K.matmul(x, w))
        assert led.passes[0]["by_op"]["residual"]["flops"] == n * (40 + 9)
    with pytest.raises(ValueError, match="must be given"):
        K.matmul(x, ws[0], residual=True)


@pytest.mark.parametrize("name", ["f32", "f16", "bf16", "q8_0", "q4_0"])
def test_empty_weights_on_the_gemm_paths(level, name):
    """A weight of no rows (alone, beside another, as a residual) and, for the float types, rows of
    no numbers (out + 0, so -0.0 becomes +0.0): as the one-row paths give them, never a crash."""
    x = data(0, 17, 64)
    empty, w = weight(1, 0, 64, name), weight(2, 8, 64, name)
    assert K.matmul(x, empty).shape == (17, 0)
    outs = [np.empty((17, 0), np.float32), np.empty((17, 8), np.float32)]
    K.matmuls(x, [empty, w], outs)
    np.testing.assert_array_equal(outs[1], K.matmul(x, w))
    K.matmul(x, empty, out=np.empty((17, 0), np.float32), residual=True)
    if name in ("f32", "f16", "bf16"):
        out = np.full((17, 8), -0.0, np.float32)
        K.matmul(data(0, 17, 0), weight(2, 8, 0, name), out=out, residual=True)
        assert not np.signbit(out).any()
