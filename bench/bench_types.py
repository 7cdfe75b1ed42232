"""Decode and prefill speed of each weight type, on a real model shape with random weights.

    python bench/bench_types.py [--shape SmolLM2-135M] [--tg 32] [--pp 512] [-t 2] [--repeat 5]

For f32, f16, bf16, q8_0 and q4_0 (shapes.random_model(..., weight_type)), in one run:
  tg    decode tokens/s (tgN after a one-token prompt), and the weight GB/s that is: a decode pass
        reads every matrix once, so GB/s = the ledger's weight bytes per pass x passes/s;
  pp    one causal pass over N positions: tokens/s and GFLOP/s (FLOPs from the ledger);
  gemm  the MLP's two shapes alone, 512 rows: x[512,d] @ gate[f,d]^T and x[512,f] @ down[d,f]^T;
each with its ratio to f32. Types are measured in turn within each repetition, so a machine whose
load drifts slows them alike; medians are shown, and the load average, since speed on a busy
machine says little on its own.
"""
import argparse
import os
import statistics
import time

import numpy as np

import tinydiff
from tinydiff.engine import kernels
from tinydiff.engine.ledger import Ledger
from tinydiff.formats import quant
from tinydiff.measure import bench
from tinydiff.measure.shapes import SHAPES, random_model

TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0"]


def per_run(model, spec, rng):
    """(flops, weight bytes) of one run of spec, from the ledger (timed runs go without one)."""
    run = bench.prepare(model, *bench.parse_test(spec), rng)
    with Ledger() as led:
        run()
    t = led.total()
    return t["flops"], t["bytes"]["weights"]


def time_run(model, spec, rng):
    return bench.timed(bench.prepare(model, *bench.parse_test(spec), rng))[0]


def time_gemm(x, w, reps=3):
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        kernels.matmul(x, w)
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="SmolLM2-135M", choices=list(SHAPES))
    ap.add_argument("--tg", type=int, default=32, help="decode passes per repetition")
    ap.add_argument("--pp", type=int, default=512, help="prompt positions")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if args.threads:
        tinydiff.set_threads(args.threads)
    tg, pp = f"tg{args.tg}", f"pp{args.pp}"
    rng = np.random.default_rng(0)
    models = {t: random_model(args.shape, weight_type=t) for t in TYPES}
    cfg = models["f32"].config
    d, f = cfg.hidden_size, cfg.intermediate_size
    gemm_x = {"gate": rng.standard_normal((512, d), dtype=np.float32),
              "down": rng.standard_normal((512, f), dtype=np.float32)}

    costs, secs = {}, {t: {"tg": [], "pp": [], "gate": [], "down": []} for t in TYPES}
    for t, model in models.items():
        time_run(model, "tg4", rng)                                   # warm up: page in, spin up threads
        costs[t] = {"tg": per_run(model, tg, rng), "pp": per_run(model, pp, rng)}
    load0 = os.getloadavg()
    for _ in range(args.repeat):
        for t, model in models.items():
            secs[t]["tg"].append(time_run(model, tg, rng))
            secs[t]["pp"].append(time_run(model, pp, rng))
            layer = model.weights.layers[0]
            secs[t]["gate"].append(time_gemm(gemm_x["gate"], layer.gate_proj))
            secs[t]["down"].append(time_gemm(gemm_x["down"], layer.down_proj))
    load1 = os.getloadavg()

    med = {t: {k: statistics.median(v) for k, v in s.items()} for t, s in secs.items()}
    gemm_flops = 2 * 512 * d * f
    print(f"{args.shape}, {kernels.get_threads()} threads, SIMD {kernels.simd()} "
          f"{'+'.join(kernels.simd_extensions())}, medians of {args.repeat}; "
          f"load average {load0[0]:.2f} -> {load1[0]:.2f} (over {os.cpu_count()} CPUs)")
    print(f"| type | bits/w | weight MB | {tg} t/s | x f32 | weight GB/s | {pp} t/s | x f32 | GFLOP/s | "
          f"gemm 512x{d}x{f} GFLOP/s | x f32 | gemm 512x{f}x{d} GFLOP/s | x f32 |")
    print("|" + "---|" * 13)
    for t in TYPES:
        m, base = med[t], med["f32"]
        (_, tg_bytes), (pp_flops, _) = costs[t]["tg"], costs[t]["pp"]
        print(f"| {t} | {quant.bits_per_weight(t):.1f} | {tg_bytes / args.tg / 1e6:.1f} | "
              f"{args.tg / m['tg']:.1f} | {base['tg'] / m['tg']:.2f} | {tg_bytes / m['tg'] / 1e9:.2f} | "
              f"{args.pp / m['pp']:.1f} | {base['pp'] / m['pp']:.2f} | {pp_flops / m['pp'] / 1e9:.1f} | "
              f"{gemm_flops / m['gate'] / 1e9:.1f} | {base['gate'] / m['gate']:.2f} | "
              f"{gemm_flops / m['down'] / 1e9:.1f} | {base['down'] / m['down']:.2f} |")


if __name__ == "__main__":
    main()
