"""The roofline of this machine, measured with the engine's own C code and threads.

Three numbers bound how fast any kernel can run here:
  mem_gbs      sustained read bandwidth from memory: every thread reads its slice of an array far
               larger than the last-level cache (4x it, at least 1 GiB, at most 2 GiB);
  llc_gbs      read bandwidth from the last-level cache: each thread re-reads a slice 4x its own L2
               (so nearly every read misses L2) that together fit in half the LLC;
  peak_gflops  f32 FLOP/s of td_matmul_f32 on a compute-bound 1024 x 1024 x 1024 product.
Both bandwidths time td_read_sum_u32 (csrc/roofline.c), which sums the array as uint32 words with 8
vector accumulators, so the loads, not the adds, are the limit. GB are 10^9 bytes. Each number is
the best of several runs: the machine's capability, not its average under other load.

Machine balance = peak_gflops / mem_gbs, in FLOPs per byte: an operation doing fewer FLOPs per byte
it moves (its arithmetic intensity) is memory-bound, and its roofline time is bytes / bandwidth;
above the balance it is compute-bound, time flops / peak. The same numbers from numpy (an int32
max over the same array, one thread; a BLAS f32 matmul of the same shape) are kept for comparison.

load_or_measure() caches results in $XDG_CACHE_HOME/tinydiff/measure/roofline.json (~/.cache by default),
one entry per CPU model and thread count. A measurement that fails (the big array cannot be
allocated, say) is named in `failures` and the others still run; such a result is not cached.
"""
import dataclasses
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

from .._kernels import ffi, lib
from ..engine import kernels
from ..errors import UsageError

GiB, MiB = 1 << 30, 1 << 20
MATMUL_SHAPE = (1024, 1024, 1024)  # n, k, m: 2 GFLOP on 12 MiB, far above any machine's balance
CACHE_READ_BYTES = 2 * GiB          # bytes read per timed pass of the cache test, enough for ~20+ ms


@dataclass
class Roofline:
    mem_gbs: Optional[float]      # None when that measurement failed
    llc_gbs: Optional[float]
    peak_gflops: Optional[float]
    balance: Optional[float]      # peak_gflops / mem_gbs, FLOPs per byte
    llc_balance: Optional[float]  # peak_gflops / llc_gbs
    cpu: str
    threads: int
    simd: str
    when: str                     # local time of the measurement, ISO 8601
    failures: List[Tuple[str, str]] = field(default_factory=list)  # (what, message)
    mem_bytes: int = 0            # sizes measured, for the report
    llc_bytes: int = 0
    llc_level: str = "LLC"
    matmul_shape: Tuple[int, int, int] = MATMUL_SHAPE
    numpy_mem_gbs: Optional[float] = None     # int32 max over the same array, one thread
    numpy_gflops: Optional[float] = None      # np.matmul, same shape
    numpy_blas: str = ""
    cache_path: Optional[str] = None          # where load_or_measure keeps it (not saved in the file)
    from_cache: bool = False


_RUNTIME = ("cache_path", "from_cache")  # fields that describe this load, not the machine


# ---- the machine ----

def cpu_name():
    """The CPU model from /proc/cpuinfo, else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model name", "Hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _parse_size(text):
    """'48K', '2048K', '32M' (sysfs cache sizes) -> bytes"""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": MiB, "G": GiB}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def cache_sizes(cpu=0):
    """{level: bytes} of cpu's data/unified caches from sysfs, e.g. {1: 49152, 2: 2097152, 3: ...}.
    Empty when sysfs does not say (not Linux)."""
    base, sizes = f"/sys/devices/system/cpu/cpu{cpu}/cache", {}
    for index in sorted(os.listdir(base)) if os.path.isdir(base) else ():
        d = os.path.join(base, index)
        try:
            with open(d + "/type") as t, open(d + "/level") as lv, open(d + "/size") as sz:
                if t.read().strip() != "Instruction":
                    sizes[int(lv.read())] = _parse_size(sz.read())
        except (OSError, ValueError):
            continue
    return sizes


def memory_test_bytes(caches):
    """4x the last-level cache (so at most a quarter of it could be served from there), at least
    1 GiB, at most 2 GiB (RAM; and 2 GiB already takes ~0.1 s per pass)."""
    llc = caches[max(caches)] if caches else 32 * MiB
    return int(min(max(4 * llc, GiB), 2 * GiB))


def cache_test_bytes(caches, threads):
    """(bytes, level name): 4x L2 per thread, so nearly every read misses L2, capped at half the
    last-level cache so the whole array stays there while other programs use it too."""
    if not caches:
        return 16 * MiB, "LLC"
    top = max(caches)
    per_thread = 4 * caches.get(2, caches[top] // 16)
    return int(min(per_thread * threads, caches[top] // 2)), f"L{top}"


def _available_bytes():
    """MemAvailable from /proc/meminfo, or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _touched(nbytes):
    """A 64-byte aligned uint32 array of nbytes, every page written (an untouched page reads as
    the shared zero page, never from memory). MemoryError when RAM is short, before allocating: an
    overcommitted allocation would fail later, in the kernel's OOM killer."""
    avail = _available_bytes()
    if avail is not None and nbytes > 0.8 * avail:
        raise MemoryError(f"needs {nbytes / GiB:.2f} GiB, only {avail / GiB:.2f} GiB of RAM available")
    raw = np.empty(nbytes + 64, np.uint8)
    off = -raw.ctypes.data % 64
    x = raw[off:off + nbytes // 4 * 4].view(np.uint32)
    x.fill(1)
    return x


# ---- the measurements ----

def read_sum(x, reps=1):
    """td_read_sum_u32: x (uint32, C-contiguous) summed mod 2^32, read reps times on every thread."""
    if x.dtype != np.uint32 or not x.flags.c_contiguous:
        raise ValueError(f"read_sum: x must be a C-contiguous uint32 array, got {x.dtype}")
    return lib.td_read_sum_u32(ffi.from_buffer("uint32_t[]", x), x.size, reps)


def _best_seconds(fn, runs):
    best = math.inf
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def memory_bandwidth(nbytes, passes=3):
    """(engine GB/s, numpy GB/s): the best of `passes` reads of an nbytes array, by
    td_read_sum_u32 on every thread, then by numpy's int32 max (one thread) over the same bytes."""
    x = _touched(nbytes)
    ours = x.nbytes / _best_seconds(lambda: read_sum(x), passes) / 1e9
    theirs = x.nbytes / _best_seconds(lambda: x.view(np.int32).max(), passes) / 1e9
    return ours, theirs


def cache_bandwidth(nbytes, passes=5):
    """GB/s re-reading an nbytes array: each thread re-reads its own slice, from whichever cache
    holds it, about CACHE_READ_BYTES in all per pass; best of `passes`."""
    x = _touched(nbytes)
    reps = max(1, CACHE_READ_BYTES // x.nbytes)
    read_sum(x)  # bring it into the cache
    return reps * x.nbytes / _best_seconds(lambda: read_sum(x, reps), passes) / 1e9


def matmul_gflops(n, k, m, runs=10):
    """(engine GFLOP/s, numpy GFLOP/s) of y[n,m] = x[n,k] @ w[m,k]^T: td_matmul_f32 (through
    kernels.matmul), then np.matmul; best of `runs` each, after one warm-up run."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, k), np.float32)
    w = rng.standard_normal((m, k), np.float32)
    y = np.empty((n, m), np.float32)
    flops = 2 * n * k * m
    kernels.matmul(x, w, out=y)
    ours = flops / _best_seconds(lambda: kernels.matmul(x, w, out=y), runs) / 1e9
    np.matmul(x, w.T, out=y)
    theirs = flops / _best_seconds(lambda: np.matmul(x, w.T, out=y), runs) / 1e9
    return ours, theirs


def numpy_blas():
    """numpy's BLAS (name and version) and the OPENBLAS_* settings in the environment."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except (TypeError, KeyError):  # numpy < 1.25 has no mode=
        name = "BLAS"
    env = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("OPENBLAS_"))
    return f"{name}, {env}" if env else name


def measure(threads=None, *, mem_bytes=None, llc_bytes=None, matmul_shape=MATMUL_SHAPE):
    """Measure this machine with `threads` threads (default: the current count; restored after).
    Sizes default from the caches sysfs reports; tests pass tiny ones. ~5-10 s on 2 cores."""
    before = kernels.get_threads()
    if threads is not None:
        kernels.set_threads(threads)
    try:
        return _measure(mem_bytes, llc_bytes, matmul_shape)
    finally:
        kernels.set_threads(before)


def _measure(mem_bytes, llc_bytes, shape):
    threads, caches = kernels.get_threads(), cache_sizes()
    llc_auto, level = cache_test_bytes(caches, threads)
    mem_bytes, llc_bytes = mem_bytes or memory_test_bytes(caches), llc_bytes or llc_auto
    failures = []

    def attempt(what, fn, *args):
        """fn(*args), or None with the failure noted: one failure must not stop the rest"""
        try:
            return fn(*args)
        except Exception as e:  # MemoryError above all, but whatever it is, say it and carry on
            failures.append((what, f"{type(e).__name__}: {e}"))
            return None

    mem, np_mem = attempt("memory bandwidth", memory_bandwidth, mem_bytes) or (None, None)
    llc = attempt(f"{level} bandwidth", cache_bandwidth, llc_bytes)
    peak, np_peak = attempt("peak matmul", matmul_gflops, *shape) or (None, None)
    return Roofline(
        mem_gbs=mem, llc_gbs=llc, peak_gflops=peak,
        balance=peak / mem if peak and mem else None,
        llc_balance=peak / llc if peak and llc else None,
        cpu=cpu_name(), threads=threads, simd=kernels.simd(),
        when=time.strftime("%Y-%m-%dT%H:%M:%S"), failures=failures,
        mem_bytes=mem_bytes, llc_bytes=llc_bytes, llc_level=level, matmul_shape=tuple(shape),
        numpy_mem_gbs=np_mem, numpy_gflops=np_peak, numpy_blas=numpy_blas())


# ---- the cache ----

def cache_file():
    """$XDG_CACHE_HOME/tinydiff/measure/roofline.json, ~/.cache when XDG_CACHE_HOME is unset or relative."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tinydiff", "roofline.json")


def _key(cpu, threads):
    return f"{cpu} | {threads} threads"


def _entries(path):
    """The cache's {key: entry}; {} when missing or unreadable (then it is measured again)."""
    try:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)
        return entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):
        return {}


def _from_json(d):
    """A cached entry back into a Roofline; ValueError if it is not one (an old or damaged file)."""
    names = {f.name for f in dataclasses.fields(Roofline)} - set(_RUNTIME)
    if not isinstance(d, dict) or set(d) != names:
        raise ValueError("not a roofline entry")
    r = Roofline(**d)
    numbers = (r.mem_gbs, r.llc_gbs, r.peak_gflops, r.balance, r.llc_balance, r.numpy_mem_gbs, r.numpy_gflops)
    if not all(v is None or isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in numbers):
        raise ValueError("a measurement is not a positive number")
    if not (isinstance(r.threads, int) and r.threads > 0 and r.failures == []  # failures are never cached
            and isinstance(r.matmul_shape, list) and len(r.matmul_shape) == 3):
        raise ValueError("threads, failures or matmul_shape damaged")
    r.matmul_shape = tuple(r.matmul_shape)
    return r


def write_atomic(path, write):
    """write(tmp) to a temporary name beside path, then rename it over path: a reader (or a
    crash) never sees half a file. The temporary file is removed if write fails."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _save(path, key, roofline):
    entries = _entries(path)
    entries[key] = {k: v for k, v in dataclasses.asdict(roofline).items() if k not in _RUNTIME}
    os.makedirs(os.path.dirname(path), exist_ok=True)

    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(entries, f, indent=1)

    write_atomic(path, write)


def load_or_measure(threads=None, remeasure=False, **sizes):
    """The cached roofline for this CPU model and thread count (default: the current count), or a
    new measurement (then cached) when there is none, the entry is damaged, or remeasure is set.
    A roofline with failed measurements is returned but not cached. sizes go to measure()."""
    path = cache_file()
    key = _key(cpu_name(), threads or kernels.get_threads())
    if not remeasure:
        try:
            r = _from_json(_entries(path)[key])
            r.cache_path, r.from_cache = path, True
            return r
        except (KeyError, TypeError, ValueError):
            pass
    r = measure(threads, **sizes)
    if not r.failures:
        try:
            _save(path, key, r)
            r.cache_path = path
        except OSError as e:
            r.failures.append(("cache", f"cannot write {path}: {e.strerror or e}"))
    return r


# ---- using it ----

def intensity(flops, nbytes):
    """Arithmetic intensity: FLOPs per byte moved."""
    return flops / nbytes if nbytes else math.inf


def _need(roofline, name):
    v = getattr(roofline, name)
    if not v:
        raise UsageError(f"the roofline has no {name} (its measurement failed); measure it again")
    return v


def bound(flops, nbytes, roofline):
    """'memory-bound' when the intensity is below the machine balance, else 'compute-bound'."""
    return "memory-bound" if intensity(flops, nbytes) < _need(roofline, "balance") else "compute-bound"


def predict_seconds(flops, nbytes, roofline):
    """The roofline's time: the longer of doing the FLOPs at peak and moving the bytes from memory."""
    return max(flops / (_need(roofline, "peak_gflops") * 1e9), nbytes / (_need(roofline, "mem_gbs") * 1e9))


def _size(n):
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.3g} MiB" if n >= MiB else f"{n / 1024:.3g} KiB"


def _num(v, unit):
    return f"{v:8.1f} {unit}" if v else f"{'failed':>8} {' ' * len(unit)}"


def report(r):
    """What `tinydiff roofline` prints."""
    n, k, m = r.matmul_shape
    how = "cached" if r.from_cache else "measured"
    lines = [
        f"roofline of {r.cpu}: {r.threads} thread{'s' * (r.threads != 1)}, {r.simd} kernels, {how} {r.when}",
        f"  memory read       {_num(r.mem_gbs, 'GB/s   ')}  {_size(r.mem_bytes)} array, read once per pass",
        f"  {r.llc_level + ' read':<17} {_num(r.llc_gbs, 'GB/s   ')}  {_size(r.llc_bytes)} array re-read, "
        f"{_size(r.llc_bytes // r.threads)} per thread",
        f"  peak f32 matmul   {_num(r.peak_gflops, 'GFLOP/s')}  td_matmul_f32, n={n} k={k} m={m}",
    ]
    if r.balance:
        llc = f" ({r.llc_balance:.1f} against {r.llc_level})" if r.llc_balance else ""
        lines += [f"  machine balance   {r.balance:8.1f} FLOPs/byte against memory{llc}",
                  "                    below it an operation is memory-bound, above it compute-bound"]
    if r.numpy_mem_gbs or r.numpy_gflops:
        lines.append(f"  numpy, to compare: int32 max (1 thread) {_num(r.numpy_mem_gbs, 'GB/s').strip()}, "
                     f"f32 matmul {_num(r.numpy_gflops, 'GFLOP/s').strip()} ({r.numpy_blas})")
    if r.cache_path:
        lines.append(f"  cached in {r.cache_path} (tinydiff roofline --remeasure measures again)")
    lines += [f"  FAILED {what}: {msg}" for what, msg in r.failures]
    return "\n".join(lines)
