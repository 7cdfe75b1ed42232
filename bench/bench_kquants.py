"""The K-quants' matmul speed against Q4_0's, per SIMD level, on random weights of real shapes.

    python bench/bench_kquants.py [--levels c,avx2,avx512] [--shapes 640x2048,576x1536,2048x1536]
                                  [--rows 1,512] [-t 2] [--repeat 7] [--calls 50]

For each shape (weight rows x k) and number of x rows (1: a decode step's matmul; 512: prefill),
the time of one matmul of Q4_0 (as stored: rows), Q4_0 as the model loads it on this level
(kernels.interleaved: Q4_0X8 on AVX2 and AVX512_VNNI), Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS and
Q8_K, each a median over the repetitions of the fastest of `calls` calls (on a shared machine
the least disturbed). Levels, shapes and types
are measured in turn within each repetition (A, B, A, B...), so a machine whose load drifts slows
them alike. Printed: microseconds, the ratio to Q4_0 (rows) and to the loaded Q4_0 on the same
level and shape, and the speed-up over plain C (when c is among the levels).
"""
import argparse
import os
import statistics
import time

import numpy as np

import tinydiff
from tinydiff.engine import kernels as K
from tinydiff.formats import quant

TYPES = ["q4_0", "q4_0 loaded", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs", "q8_k"]


def random_blocks(name, m, k, rng):
    """m rows of k weights of a block type: random bytes with small finite scales (|d| < 2)."""
    dt = quant.READS[name]
    w = rng.integers(0, 256, (m, k // quant.BLOCK[dt] * dt.itemsize), dtype=np.uint8).view(dt).copy()
    for field in quant.SCALES[dt]:
        v = w[field]
        if v.dtype == np.float16:
            v[...] = rng.uniform(-1, 1, v.shape).astype(np.float16) * np.float16(2.0**-4)
        else:
            v[...] = rng.uniform(2.0**-7, 2.0**-6, v.shape).astype(np.float32)
    return w


def best_call(x, w, calls):
    """the fastest of `calls` calls: on a shared machine the least disturbed one"""
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        K.matmul(x, w)
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default=",".join(K.SIMD_LEVELS[:K.SIMD_LEVELS.index(K.simd()) + 1]))
    ap.add_argument("--shapes", default="640x2048,576x1536,2048x1536")
    ap.add_argument("--rows", default="1,512", help="x rows per matmul")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--calls", type=int, default=50, help="calls a sample (512 rows: a tenth as many)")
    args = ap.parse_args()
    if args.threads:
        tinydiff.set_threads(args.threads)
    best = K.simd()
    levels, types = args.levels.split(","), args.types.split(",")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    rng = np.random.default_rng(0)
    weights, xs = {}, {}
    for m, k in shapes:
        for t in types:
            w = random_blocks(t.split()[0], m, k, rng)
            for level in levels:
                K._set_simd(level)
                weights[m, k, t, level] = K.interleaved(w) if t.endswith("loaded") else w
        for n in rows:
            xs[n, k] = rng.standard_normal((n, k), dtype=np.float32)
    secs = {key + (n,): [] for key in weights for n in rows}
    load0 = os.getloadavg()
    for _ in range(args.repeat):
        for (m, k, t, level), w in weights.items():
            K._set_simd(level)
            for n in rows:
                secs[m, k, t, level, n].append(best_call(xs[n, k], w, max(1, args.calls if n < 16 else args.calls // 10)))
    load1 = os.getloadavg()
    K._set_simd(best)
    med = {key: statistics.median(v) for key, v in secs.items()}
    print(f"{K.get_threads()} threads, extensions {'+'.join(K.simd_extensions())}, medians of {args.repeat}; "
          f"load average {load0[0]:.2f} -> {load1[0]:.2f} (over {os.cpu_count()} CPUs)")
    for n in rows:
        for m, k in shapes:
            print(f"\n{n} x rows @ {m}x{k}: us (x Q4_0 rows, x Q4_0 loaded{', x faster than c' if 'c' in levels else ''})")
            print("| type | " + " | ".join(levels) + " |")
            print("|---|" + "---|" * len(levels))
            for t in types:
                cells = []
                for level in levels:
                    v = med[m, k, t, level, n]
                    cell = f"{v * 1e6:.0f} ({v / med[m, k, 'q4_0', level, n]:.2f}, {v / med[m, k, 'q4_0 loaded', level, n]:.2f}"
                    cell += f", {med[m, k, t, 'c', n] / v:.1f}x)" if "c" in levels else ")"
                    cells.append(cell)
                print(f"| {t} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
