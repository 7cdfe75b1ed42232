"""The roofline measurement (tinydiff.measure.roofline, csrc/roofline.c): tiny sizes so it runs in a blink.
No timing is asserted, only that the numbers are there, the read loop reads every word, failures are
named, and the cache behaves."""
import json
import math
import os

import numpy as np
import pytest

from tinydiff.engine import kernels as K
from tinydiff.errors import UsageError
from tinydiff.measure import roofline as R

TINY = dict(mem_bytes=1 << 20, llc_bytes=1 << 16, matmul_shape=(16, 32, 24))
LEVELS = K.SIMD_LEVELS[: K.SIMD_LEVELS.index(K.simd()) + 1]


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def positive(v):
    return isinstance(v, float) and math.isfinite(v) and v > 0


def fake(threads=None, **sizes):
    """A measurement without the waiting."""
    return R.Roofline(mem_gbs=10.0, llc_gbs=40.0, peak_gflops=100.0, balance=10.0, llc_balance=2.5,
                      cpu=R.cpu_name(), threads=threads or K.get_threads(), simd=K.simd(), when="now")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("n", [0, 1, 127, 128, 4096 * 3 + 5, 100_003])
@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_read_sum_reads_every_word(level, n, nthreads, threads):
    best = K.simd()
    K._set_simd(level)
    K.set_threads(nthreads)
    try:
        x = np.random.default_rng(n).integers(0, 2**32, n, dtype=np.uint32)
        for reps in (1, 3):
            assert R.read_sum(x, reps) == int(x.astype(np.uint64).sum()) * reps % 2**32
    finally:
        K._set_simd(best)


def test_read_sum_wants_uint32():
    with pytest.raises(ValueError, match="uint32"):
        R.read_sum(np.ones(8, np.float32))


def test_measurements_are_positive_numbers():
    mem, np_mem = R.memory_bandwidth(1 << 20, passes=2)
    peak, np_peak = R.matmul_gflops(16, 32, 24, runs=2)
    assert all(positive(v) for v in (mem, np_mem, R.cache_bandwidth(1 << 16, passes=2), peak, np_peak))


def test_measure_tiny(threads):
    K.set_threads(2)
    r = R.measure(threads=1, **TINY)
    assert K.get_threads() == 2  # restored
    assert r.failures == [] and r.threads == 1 and r.simd == K.simd() and r.cpu == R.cpu_name()
    for v in (r.mem_gbs, r.llc_gbs, r.peak_gflops, r.balance, r.llc_balance, r.numpy_mem_gbs, r.numpy_gflops):
        assert positive(v)
    assert r.balance == pytest.approx(r.peak_gflops / r.mem_gbs)
    assert r.llc_balance == pytest.approx(r.peak_gflops / r.llc_gbs)
    assert r.mem_bytes == 1 << 20 and r.matmul_shape == (16, 32, 24)
    text = R.report(r)
    assert "GB/s" in text and "GFLOP/s" in text and "machine balance" in text and "FAILED" not in text


def test_a_failed_measurement_is_named_and_the_others_run(monkeypatch):
    def no_memory(nbytes, passes=3):
        raise MemoryError("cannot allocate 2 GiB")

    monkeypatch.setattr(R, "memory_bandwidth", no_memory)
    r = R.measure(**TINY)
    assert r.failures == [("memory bandwidth", "MemoryError: cannot allocate 2 GiB")]
    assert r.mem_gbs is None and r.balance is None
    assert positive(r.llc_gbs) and positive(r.peak_gflops) and positive(r.llc_balance)
    text = R.report(r)
    assert "FAILED memory bandwidth: MemoryError: cannot allocate 2 GiB" in text and "failed" in text


def test_too_big_for_ram_fails_before_allocating():
    r = R.measure(**{**TINY, "mem_bytes": 1 << 60})
    assert [what for what, _ in r.failures] == ["memory bandwidth"]
    assert "GiB of RAM available" in r.failures[0][1] and positive(r.peak_gflops)


def test_sizes_from_the_caches():
    caches = {1: 48 << 10, 2: 2 << 20, 3: 480 << 20}
    assert R.memory_test_bytes(caches) == 1920 << 20              # 4 x L3
    assert R.memory_test_bytes({2: 1 << 20, 3: 8 << 20}) == 1 << 30   # at least 1 GiB
    assert R.memory_test_bytes({3: 1 << 30}) == 2 << 30           # at most 2 GiB
    assert R.cache_test_bytes(caches, 2) == (16 << 20, "L3")      # 4 x L2 per thread
    assert R.cache_test_bytes({2: 1 << 20, 3: 8 << 20}, 8) == (4 << 20, "L3")  # half the L3
    assert R.memory_test_bytes({}) == 1 << 30 and R.cache_test_bytes({}, 2)[0] > 0
    assert R._parse_size("491520K") == 480 << 20 and R._parse_size("32M") == 32 << 20


def test_cache_round_trip_keyed_by_cpu_and_threads(cache_home):
    r = R.load_or_measure(threads=1, **TINY)
    assert not r.from_cache and r.cache_path == os.path.join(cache_home, "tinydiff", "roofline.json")
    again = R.load_or_measure(threads=1, **TINY)
    assert again.from_cache and again.cache_path == r.cache_path
    for name in ("mem_gbs", "llc_gbs", "peak_gflops", "balance", "cpu", "threads", "when", "matmul_shape"):
        assert getattr(again, name) == getattr(r, name)
    assert "cached in" in R.report(again)
    R.load_or_measure(threads=2, **TINY)
    with open(r.cache_path) as f:
        assert set(json.load(f)) == {R._key(R.cpu_name(), 1), R._key(R.cpu_name(), 2)}
    assert os.listdir(os.path.dirname(r.cache_path)) == ["roofline.json"]  # no temporary file left


def test_another_cpu_or_remeasure_measures_again(cache_home, monkeypatch):
    calls = []
    monkeypatch.setattr(R, "measure", lambda threads=None, **s: calls.append(threads) or fake(threads))
    R.load_or_measure(threads=2)
    R.load_or_measure(threads=2)
    assert calls == [2]
    R.load_or_measure(threads=2, remeasure=True)
    assert calls == [2, 2]
    monkeypatch.setattr(R, "cpu_name", lambda: "Some Other CPU")
    assert not R.load_or_measure(threads=2).from_cache and calls == [2, 2, 2]


@pytest.mark.parametrize("damage", [b"\x00\xffnot json", b"[1, 2]", b'{"', "entry"])
def test_a_damaged_cache_is_measured_again(cache_home, monkeypatch, damage):
    monkeypatch.setattr(R, "measure", lambda threads=None, **s: fake(threads))
    path = R.cache_file()
    os.makedirs(os.path.dirname(path))
    if damage == "entry":  # valid JSON, but the entry is not a roofline
        damage = json.dumps({R._key(R.cpu_name(), 2): {"mem_gbs": "fast"}}).encode()
    with open(path, "wb") as f:
        f.write(damage)
    r = R.load_or_measure(threads=2)
    assert not r.from_cache and r.mem_gbs == 10.0
    assert R.load_or_measure(threads=2).from_cache  # and the file is whole again


def test_failures_are_not_cached(cache_home, monkeypatch):
    broken = fake(2)
    broken.failures = [("peak matmul", "MemoryError: no")]
    monkeypatch.setattr(R, "measure", lambda threads=None, **s: broken)
    assert R.load_or_measure(threads=2).cache_path is None
    assert not os.path.exists(R.cache_file())


def test_an_unwritable_cache_is_reported_not_raised(cache_home, monkeypatch):
    monkeypatch.setattr(R, "measure", lambda threads=None, **s: fake(threads))
    (cache_home / "tinydiff").write_text("a file where the folder should be")
    r = R.load_or_measure(threads=2)
    assert r.mem_gbs == 10.0 and [what for what, _ in r.failures] == ["cache"]


def test_cache_file_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert R.cache_file() == os.path.join(tmp_path, "tinydiff", "roofline.json")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/is/ignored")
    assert R.cache_file() == os.path.join(os.path.expanduser("~"), ".cache", "tinydiff", "roofline.json")


def test_predict_and_bound_by_hand():
    r = fake(2)  # 10 GB/s, 100 GFLOP/s: balance 10 FLOPs per byte
    assert R.intensity(2e9, 1e9) == 2.0 and R.intensity(1, 0) == math.inf
    assert R.predict_seconds(2e9, 1e9, r) == pytest.approx(0.1)   # 1 GB at 10 GB/s
    assert R.predict_seconds(1e12, 1e9, r) == pytest.approx(10.0)  # 1 TFLOP at 100 GFLOP/s
    assert R.bound(2e9, 1e9, r) == "memory-bound"
    assert R.bound(1e12, 1e9, r) == "compute-bound"
    assert R.bound(10e9, 1e9, r) == "compute-bound"  # on the ridge: both limits meet


def test_predict_without_a_measurement_says_which():
    r = fake(2)
    r.mem_gbs = r.balance = None
    with pytest.raises(UsageError, match="mem_gbs"):
        R.predict_seconds(1, 1, r)
    with pytest.raises(UsageError, match="balance"):
        R.bound(1, 1, r)
