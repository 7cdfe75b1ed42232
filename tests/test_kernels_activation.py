"""The gated MLPs' activation products (csrc/activation.c): kernels.gelu_tanh_mul, Gemma's GeGLU,
on every SIMD level against reference.gelu_tanh_mul and against PyTorch's formula in float64.

Tolerances, in ulps of the float32 result: exp(-2u) turns an error in its argument 2u (|2u| the
size of it) into a relative error |2u| times as large, so the bound is 4 * (1 + |2u|) ulp: 4 where
|gate| < 0.5, ~40 at gate = -3, ~360 near gate = -10 where the result is ~1e-37 (plain C, which
on x86-64 rounds the argument as the reference does: within 4 ulp of it everywhere). Results smaller
than 1e-36 (gate < -10.1) may come out as -0 (the vector exp overflows to inf a little sooner than
NumPy's): an absolute 1e-36 besides.
"""
import numpy as np
import pytest

from tinydiff.engine import cost
from tinydiff.engine import kernels as K
from tinydiff.engine import reference as R
from tinydiff.engine.ledger import Ledger

C2 = np.sqrt(2 / np.pi)
SPECIAL = [0.0, -0.0, 1e-30, -1e-30, 1e-45, -1e-45, 0.5, -0.5, 1.0, -1.0, 3.0, -3.0, 10.0, -10.0, -10.3, -11.0,
           -20.0, 20.0, 100.0, -100.0, 1e30, -1e30, 3.4e38, -3.4e38, np.inf, -np.inf]


def torch_gelu_tanh(x):
    """PyTorch's gelu(x, approximate="tanh") formula, in float64. 1 + tanh(u) cancels for x < -4
    (at -7 all its digits), so the sample it checks stays above -4."""
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1 + np.tanh(C2 * (x + 0.044715 * x ** 3)))


def exact_gelu_tanh(x):
    """The same function as x / (1 + exp(-2u)) in float64 (1 + tanh(u) = 2 / (1 + exp(-2u))): exact
    enough for every float32 x, -0 at -inf (its limit; torch's formula gives -inf * 0 = NaN there)."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        y = x / (1 + np.exp(-2 * C2 * (x + 0.044715 * x ** 3)))
    return np.where(x == -np.inf, -0.0, y)


def tolerance(gate, up):
    """4 (1 + |2u|) ulps of the result, and 1e-36 (module docstring)"""
    g = gate.astype(np.float64)
    with np.errstate(over="ignore"):
        two_u = np.abs(2 * C2 * (g + 0.044715 * g ** 3))
    want = np.abs(exact_gelu_tanh(gate) * up).astype(np.float32)
    return 4 * (1 + two_u) * np.spacing(want).astype(np.float64) + 1e-36 * np.abs(up)


def sample(n, seed=0):
    rng = np.random.default_rng(seed)
    gate = np.concatenate([rng.standard_normal(n) * 3, rng.uniform(-12, 12, n)]).astype(np.float32)
    up = rng.standard_normal(2 * n).astype(np.float32)
    return gate, up


def assert_close(got, want, gate, up):
    got, want = got.astype(np.float64), np.asarray(want, np.float64)
    assert (np.isnan(got) == np.isnan(want)).all()
    with np.errstate(invalid="ignore", over="ignore"):                 # inf - inf, inf ulps: equal ones pass first
        far = (got != want) & ~np.isnan(want) & ~(np.abs(got - want) <= tolerance(gate, up))
    assert not far.any(), (gate[far], got[far], want[far])


def test_against_the_reference(level):
    gate, up = sample(50_000)
    assert_close(K.gelu_tanh_mul(gate, up), R.gelu_tanh_mul(gate, up), gate, up)


@pytest.mark.skipif(K.ARM, reason="arm64's plain C contracts a + b g^2 into FMAs (-ffp-contract=fast): "
                                   "the 4 (1 + |2u|) ulp bound of test_against_the_reference holds there")
def test_plain_c_within_4_ulp_of_the_reference():
    """Plain C on x86-64 (no FMA) rounds the argument as the reference does: only the exp differs."""
    best = K.simd()
    K._set_simd("c")
    try:
        gate, up = sample(50_000, seed=1)
        got, want = K.gelu_tanh_mul(gate, up), R.gelu_tanh_mul(gate, up)
    finally:
        K._set_simd(best)
    assert (np.abs(got.astype(np.float64) - want) <= 4 * np.spacing(np.abs(want)) + 1e-36 * np.abs(up)).all()


def test_against_torchs_formula_in_float64(level):
    gate, up = sample(20_000, seed=2)
    gate = gate[gate > -4]
    up = up[: len(gate)]
    assert_close(K.gelu_tanh_mul(gate, up), torch_gelu_tanh(gate) * up, gate, up)
    assert_close(K.gelu_tanh_mul(gate, up), exact_gelu_tanh(gate) * up, gate, up)


def test_special_values(level):
    """±0, tiny and huge numbers, ±inf give what the function gives (gelu(inf) = inf, gelu(x) = -0
    from about x = -10.2 on, -inf included: its limit; the formula torch evaluates gives NaN at -inf
    and -0 below); NaN stays NaN."""
    gate = np.array(SPECIAL + [np.nan], np.float32)
    ones = np.ones_like(gate)
    got = K.gelu_tanh_mul(gate, ones)
    want = exact_gelu_tanh(gate)
    assert_close(got, want, gate, ones)
    assert np.isnan(got[-1]) and got[SPECIAL.index(np.inf)] == np.inf
    for x in (-11.0, -100.0, -1e30, -3.4e38, -np.inf):
        y = got[SPECIAL.index(x)]
        assert y == 0 and np.signbit(y), (x, y)
    assert np.signbit(got[:2]).tolist() == [False, True]              # gelu(±0) = ±0
    assert got[SPECIAL.index(1e30)] == np.float32(1e30) and got[SPECIAL.index(100.0)] == 100
    np.testing.assert_array_equal(got, R.gelu_tanh_mul(gate, ones))   # bit for bit here (signs of 0 too)
    assert np.isnan(K.gelu_tanh_mul(np.float32([1.0]), np.float32([np.nan]))).all()


@pytest.mark.parametrize("n", [0, 1, 3, 15, 17, 4096, 4096 * 3 + 5])
def test_lengths_and_aliasing(level, n):
    """Every tail length of the vectors and of the tasks of 4096; out may be gate or up."""
    gate, up = sample(n, seed=n)
    gate, up = gate[:n], up[:n]
    want = K.gelu_tanh_mul(gate, up)
    assert_close(want, R.gelu_tanh_mul(gate, up), gate, up)
    g, u = gate.copy(), up.copy()
    assert K.gelu_tanh_mul(g, up, out=g) is g
    assert K.gelu_tanh_mul(gate, u, out=u) is u
    np.testing.assert_array_equal(g, want)
    np.testing.assert_array_equal(u, want)


def test_shapes_and_ledger():
    gate, up = sample(6, seed=3)
    with pytest.raises(ValueError, match="gelu_tanh_mul"):
        K.gelu_tanh_mul(gate, up[:-1])
    gate, up = gate.reshape(3, 4), up.reshape(3, 4)
    with Ledger() as led:
        y = K.gelu_tanh_mul(gate, up)
    assert y.shape == (3, 4)
    assert led.passes[0]["by_op"]["mlp"]["flops"] == cost.gelu_tanh_mul(12)[0] == 8 * 12
    assert "gelu_tanh_mul" in K.__all__
