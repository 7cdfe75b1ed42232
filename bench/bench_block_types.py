"""One-row (decode) and many-row (prefill) matmul time of the 32-weight block types against Q4_0.

    python bench/bench_block_types.py [--rows 1 512] [--repeat 21] [-t 2] [--levels avx512 avx2]

On random weights (random bytes, scales of a tame size) of the four decode shapes of Gemma 3 270M
and SmolLM2 135M (640x2048, 2048x640, 576x1536, 1536x576: out x in features), y = x @ w^T for each
of q4_0 (interleaved at load where kernels.interleaved does so, as a model loads it), q4_1, q5_0,
q5_1 and iq4_nl, the types in turn within each repetition (A, B, A, B ...), so a machine whose load
drifts slows them alike. Printed: median microseconds a call, and each type's ratio to q4_0 on the
same shape, level and rows. The ratios are the figure to read; the 2-core machine is noisy.
"""
import argparse
import os
import statistics
import time

import numpy as np

import tinydiff
from tinydiff.engine import kernels as K
from tinydiff.formats import kquants, quant

SHAPES = [(640, 2048), (2048, 640), (576, 1536), (1536, 576)]
TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]


def weights(name, m, k, rng):
    """Random blocks [m, k/32] of the type, every f16 scale in [2^-7, 2^-6) in magnitude."""
    dt = quant.READS[name]
    raw = rng.integers(0, 256, (m, k // 32 * dt.itemsize), dtype=np.uint8)
    w = raw.view(dt).reshape(m, k // 32).copy()
    for field in quant.SCALES[dt]:
        bits = w[field].view(np.uint16)
        bits[...] = (bits & 0x83FF) | 0x2000
    return K.interleaved(w) if name == "q4_0" else w


def best_of(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 512])
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--levels", nargs="+", default=None, help="SIMD levels (default: this CPU's x86 ones)")
    ap.add_argument("--types", nargs="+", default=TYPES)
    args = ap.parse_args()
    if args.threads:
        tinydiff.set_threads(args.threads)
    best = K.simd()
    levels = args.levels or [lv for lv in ("avx512", "avx2") if lv in K.SIMD_LEVELS[:K.SIMD_LEVELS.index(best) + 1]]
    rng = np.random.default_rng(0)
    print(f"threads {K.get_threads()}, load {os.getloadavg()[0]:.2f}, extensions {K.simd_extensions()}")
    for level in levels:
        K._set_simd(level)
        for n in args.rows:
            for m, k in SHAPES:
                ws = {t: weights(t, m, k, rng) for t in args.types}
                x = rng.standard_normal((n, k)).astype(np.float32)
                calls = max(1, int(2e-3 / best_of(lambda: K.matmul(x, ws["q4_0"]), 3)))
                secs = {t: [] for t in args.types}
                for _ in range(args.repeat):
                    for t, w in ws.items():
                        secs[t].append(best_of(lambda: K.matmul(x, w), calls))
                med = {t: statistics.median(s) for t, s in secs.items()}
                line = "  ".join(f"{t} {med[t] * 1e6:8.1f} us {med[t] / med['q4_0']:5.2f}x" for t in args.types)
                print(f"{level:6s} n={n:<4d} {m}x{k:<5d} {line}", flush=True)
    K._set_simd(best)


if __name__ == "__main__":
    main()
