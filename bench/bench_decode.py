"""Prefill and decode speed on random-weight models of real shapes.

    python bench/bench_decode.py [--shapes stories15M SmolLM2-135M] [-p 128] [-n 64] [-t 2] [--repeat 3]

Prints tokens/s for prompt processing and generation, and the weight bandwidth decoding achieves:
every decode pass reads every weight matrix once, so GB/s = weight bytes x tokens/s. The last
column is decode speed with a cost Ledger open, relative to without (runs interleaved): what
booking every kernel call costs. Compare runs made in one sitting; the machine is noisy.
"""
import argparse
import contextlib
import statistics

import numpy as np

import tinydiff
from tinydiff.measure.shapes import SHAPES, random_model


def decode_weight_bytes(w):
    """Bytes one decode pass reads: every layer matrix and norm, the final norm and the LM head."""
    per_layer = sum(a.nbytes for lw in w.layers for a in vars(lw).values() if a is not None)
    return per_layer + w.norm.nbytes + w.lm_head.nbytes


def run(model, n_prompt, n_gen, seed, ledger=False):
    ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, n_prompt).tolist()
    timings = tinydiff.decoding.generate.Timings()
    with tinydiff.Ledger() if ledger else contextlib.nullcontext():
        for _ in model.generate_tokens(ids, n_gen, temperature=0.0, timings=timings):
            pass
    return timings.prompt_tokens / timings.prompt_s, timings.gen_tokens / timings.gen_s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("-p", type=int, default=128, help="prompt tokens")
    ap.add_argument("-n", type=int, default=64, help="generated tokens")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if args.threads:
        tinydiff.set_threads(args.threads)
    print(f"threads: {tinydiff.engine.kernels.get_threads()}")
    print(f"{'shape':14s} {'params':>8s} {'pp t/s':>16s} {'tg t/s':>16s} {'tg GB/s':>8s} {'ledger on':>9s}")
    for name in args.shapes:
        model = random_model(name)
        run(model, 8, 4, 0)                                   # warm up: page in, spin up threads
        pp, tg = zip(*(run(model, args.p, args.n, r) for r in range(args.repeat)))
        _, tg_led = zip(*(run(model, args.p, args.n, r, ledger=True) for r in range(args.repeat)))
        gbs = decode_weight_bytes(model.weights) * statistics.mean(tg) / 1e9
        sd = lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0
        print(f"{name:14s} {model.parameter_count() / 1e6:7.1f}M {statistics.mean(pp):9.1f} ± {sd(pp):5.1f} "
              f"{statistics.mean(tg):9.1f} ± {sd(tg):5.1f} {gbs:8.2f} "
              f"{statistics.mean(tg_led) / statistics.mean(tg):9.3f}")


if __name__ == "__main__":
    main()
