"""Fixtures the kernel tests share, and the --long option of the fuzz test."""
import pytest

from tinydiff.engine import kernels as K

# every SIMD path this CPU can run, up to the best one
LEVELS = K.SIMD_LEVELS[: K.SIMD_LEVELS.index(K.simd()) + 1]


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", help="tests/test_fuzz.py: ~10k mutants instead of ~1k")


@pytest.fixture(params=LEVELS)
def level(request):
    """Run the test on one SIMD path, then restore the best one."""
    best = K.simd()
    K._set_simd(request.param)
    yield request.param
    K._set_simd(best)


@pytest.fixture
def threads():
    """Restore the thread count a test changes."""
    n = K.get_threads()
    yield
    K.set_threads(n)


@pytest.fixture
def batch_variant():
    """Run the test with batch invariance off (the GEMMs that sum in their own order), then on again."""
    K.set_batch_invariant(False)
    yield
    K.set_batch_invariant(True)
