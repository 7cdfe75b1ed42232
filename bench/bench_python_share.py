"""How much of a decode step, and of a diffusion step, is Python: time outside the C kernels.

    python bench/bench_python_share.py [--shapes stories15M SmolLM2-135M] [-t 2] [-n 200]
                                       [--diffusion stories5m-mdm] [--steps 16]

Each C kernel the forward pass calls is wrapped with a timer that adds up the time spent inside
it; a decode step's wall time minus that sum is the time spent in Python (wrappers, argument
checks, ledger tests, the loop over layers). The timers add ~0.1 us a call, counted as Python,
so the share printed is slightly high. NumPy glue (KV stores, biases: only in passes of
more than one token) counts as Python here: it is outside our kernels.

--diffusion MODEL: the same for the steps of a real denoising run (a 64-token answer to "Once upon
a time" in --steps steps, every step a full-canvas pass): the sampler's scoring is NumPy around one
C pass (softmax_stats), the NumPy part counted as Python. Beside it, the roofline's prediction
for a step (the run's FLOPs and bytes from a ledger, the machine measured in this run, as
`tinydiff roofline --remeasure` measures it: a cached one may be from a faster or slower hour of a
shared machine) and the measured time over it; the wall time is from runs without a ledger open.
The machine and the step are measured by turns, --rounds times: each round's ratio (its step over
its own roofline) is printed, then the best step over the best roofline (a neighbour's load on a
shared machine slows both, but not always in the same seconds).
"""
import argparse
import dataclasses
import time

import numpy as np

import tinydiff
from tinydiff.engine import kernels, layer_c
from tinydiff.measure.roofline import measure, predict_seconds
from tinydiff.measure.shapes import random_model

inside = [0.0]


def timed(fn):
    def call(*args):
        t0 = time.perf_counter()
        r = fn(*args)
        inside[0] += time.perf_counter() - t0
        return r
    return call


def wrap_kernels():
    for name in ("_matmuls", "_rmsnorm", "_rope", "_rope_qk", "_silu_mul", "_attention", "_rows_to_f32",
                 "_softmax_stats"):
        setattr(kernels, name, timed(getattr(kernels, name)))
    layer_c._forward = timed(layer_c._forward)


def decode_seconds(model, n):
    """(wall seconds, seconds inside C) per decode step, n steps after a 16-token prefill."""
    t = model.transformer
    state = t.state(16 + n, rows=16)
    t.forward(np.ones((1, 16), np.int64), state, 0)
    inside[0] = 0.0
    t0 = time.perf_counter()
    for i in range(n):
        t.forward(np.array([[5]]), state, 16 + i)
    return (time.perf_counter() - t0) / n, inside[0] / n


def predicted_step_seconds(model, steps, roofline):
    """The roofline's time for one step of that run: its FLOPs and bytes, booked by a ledger."""
    ids = model.encode_prompt("Once upon a time")
    with tinydiff.Ledger() as led:
        model.denoise_ids(ids, 64, steps=steps, eos="keep")
    t = led.total()
    return predict_seconds(t["flops"], sum(t["bytes"].values()), roofline) / steps


def diffusion_step_seconds(model, steps):
    """(wall seconds, seconds inside C) per denoising step of a 64-token answer."""
    ids = model.encode_prompt("Once upon a time")
    inside[0] = 0.0
    t0 = time.perf_counter()
    model.denoise_ids(ids, 64, steps=steps, eos="keep")
    return (time.perf_counter() - t0) / steps, inside[0] / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", default=["stories15M", "SmolLM2-135M"])
    ap.add_argument("--types", nargs="+", default=["f32"])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--diffusion", nargs="*", default=[], metavar="MODEL", help="diffusion models to time a step of")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="roofline and step measured by turns this many times")
    args = ap.parse_args()
    tinydiff.set_threads(args.threads)
    wrap_kernels()
    print(f"{'shape':14s} {'type':5s} {'ms/token':>9s} {'in C':>8s} {'Python':>8s} {'share':>6s}")
    for shape in args.shapes:
        for wtype in args.types:
            model = random_model(shape, weight_type=wtype)
            decode_seconds(model, 5)                                  # warm up
            wall, c = min((decode_seconds(model, args.n) for _ in range(3)), key=lambda r: r[0])
            print(f"{shape:14s} {wtype:5s} {wall * 1e3:9.3f} {c * 1e3:8.3f} {(wall - c) * 1e3:8.3f} "
                  f"{(wall - c) / wall:6.1%}")
    for name in args.diffusion:
        diffusion_against_roofline(name, args)


def diffusion_against_roofline(name, args):
    """A diffusion step's time, Python's share of it and the roofline's prediction, by turns."""
    model = tinydiff.load(name)
    diffusion_step_seconds(model, args.steps)                           # warm up
    print(f"\n{name}, {args.steps} steps: the roofline measured now, then the step (best of 3), "
          f"{args.rounds} times")
    print(f"{'round':5s} {'GFLOP/s':>8s} {'GB/s':>6s} {'ms/step':>9s} {'in C':>8s} {'Python':>8s} {'share':>6s} "
          f"{'predicted':>9s} {'meas/pred':>9s}")
    best_roof, best_step = None, None
    for r in range(args.rounds):
        roofline = measure(args.threads)
        step = min((diffusion_step_seconds(model, args.steps) for _ in range(3)), key=lambda t: t[0])
        _row(f"{r + 1}", roofline, step, predicted_step_seconds(model, args.steps, roofline))
        best_step = min(best_step or step, step, key=lambda t: t[0])
        best_roof = roofline if best_roof is None else dataclasses.replace(
            best_roof, peak_gflops=max(best_roof.peak_gflops, roofline.peak_gflops),
            mem_gbs=max(best_roof.mem_gbs, roofline.mem_gbs))
    _row("best", best_roof, best_step, predicted_step_seconds(model, args.steps, best_roof))


def _row(label, roofline, step, pred):
    wall, c = step
    print(f"{label:5s} {roofline.peak_gflops:8.1f} {roofline.mem_gbs:6.1f} {wall * 1e3:9.3f} {c * 1e3:8.3f} "
          f"{(wall - c) * 1e3:8.3f} {(wall - c) / wall:6.1%} {pred * 1e3:9.3f} {wall / pred:9.2f}")


if __name__ == "__main__":
    main()
