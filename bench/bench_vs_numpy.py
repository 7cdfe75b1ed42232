"""Compute-bound passes against NumPy's own f32 matmul, on the same shapes, in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_vs_numpy.py [--shape SmolLM2-135M] [-t 2]

(Unset both variables for this command only: forced to the Haswell kernel, OpenBLAS is slower
than it can be, and the comparison would flatter us. The kernel OpenBLAS picked is printed, from
threadpoolctl when it is installed.)

For a pass over N positions (pp512: a causal prompt; dd512: a bidirectional diffusion step), every
matmul of the forward pass is x[N,k] @ W[m,k]^T for the model's weight shapes (7 per layer and the
LM head). NumPy's throughput is those matmuls' FLOPs over the time NumPy takes for them alone;
ours is the ledger's FLOPs of the whole pass (attention, norms and all) over the pass's time, so
the ratio is if anything unfair to us. Also our matmul kernel alone on the same matmuls, and each
weight type's pass (quantized GEMM vs f32 GEMM).
"""
import argparse
import os
import time

import numpy as np

import tinydiff
from tinydiff.engine import kernels
from tinydiff.engine.ledger import Ledger
from tinydiff.measure import bench
from tinydiff.measure.shapes import SHAPES, random_model


def matmul_shapes(w):
    """[(name, W [m, k])] of every matrix one forward pass multiplies by."""
    mats = [(n, getattr(lw, n)) for lw in w.layers
            for n in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")]
    return mats + [("lm_head", w.lm_head)]


def best_of(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def blas_kernel():
    try:
        import threadpoolctl
    except ImportError:
        return "unknown (pip install threadpoolctl to see it)"
    return ", ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')} kernel, "
                     f"{i.get('num_threads')} threads" for i in threadpoolctl.threadpool_info())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="SmolLM2-135M", choices=list(SHAPES))
    ap.add_argument("-n", type=int, default=512, help="positions per pass")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    tinydiff.set_threads(args.threads)
    rng = np.random.default_rng(0)
    n = args.n
    f32 = random_model(args.shape)
    mats = matmul_shapes(f32.weights)
    xs = {k: rng.standard_normal((n, k), dtype=np.float32) for k in {w.shape[1] for _, w in mats}}
    mm_flops = sum(2 * n * w.shape[0] * w.shape[1] for _, w in mats)

    def numpy_matmuls():
        for _, w in mats:
            xs[w.shape[1]] @ w.T

    def our_matmuls():
        for _, w in mats:
            kernels.matmul(xs[w.shape[1]], w)

    rows = [("NumPy f32 matmuls alone", mm_flops, best_of(numpy_matmuls, args.repeat)),
            ("tinydiff f32 matmuls alone", mm_flops, best_of(our_matmuls, args.repeat))]
    for wtype in ("f32", "q8_0", "q4_0"):
        model = f32 if wtype == "f32" else random_model(args.shape, weight_type=wtype)
        for spec in (f"pp{n}", f"dd{n}x1"):
            run = bench.prepare(model, *bench.parse_test(spec), rng)
            with Ledger() as led:
                run()
            rows.append((f"tinydiff {wtype} {spec} whole pass", led.total()["flops"], best_of(run, args.repeat)))
    numpy_rate = rows[0][1] / rows[0][2]
    print(f"{args.shape}, {n} positions, {kernels.get_threads()} threads; NumPy {np.__version__}: {blas_kernel()}")
    print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')} "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE', '(unset)')}")
    print("| what | GFLOP | ms | GFLOP/s | x NumPy |\n|---|---|---|---|---|")
    for name, flops, secs in rows:
        print(f"| {name} | {flops / 1e9:.2f} | {secs * 1e3:.1f} | {flops / secs / 1e9:.1f} | "
              f"{flops / secs / numpy_rate:.2f} |")


if __name__ == "__main__":
    main()
