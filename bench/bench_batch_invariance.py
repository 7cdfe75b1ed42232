"""What batch invariance costs: the same tests with it on (the default) and off, alternated in one run.

    python bench/bench_batch_invariance.py [MODEL ...] [--shapes SmolLM2-135M] [--types f32 bf16 q4_k]
        [--tests pp512 tg32x8 tg32x32] [-r 3] [-t 2]

On, every matmul sums a row's products in the few-rows kernels' order at any number of rows (csrc/
matmul.c); off, the GEMMs that sum in another order take over from their thresholds. Prints tokens/s
of each and their ratio (on / off) per test: below 1 is the price. The two settings alternate
repetition by repetition, so a shared machine's change of pace falls on both alike.
"""
import argparse
import statistics

import numpy as np

import tinydiff
from tinydiff.engine import kernels as K
from tinydiff.measure.bench import check_fits, prepare, timed
from tinydiff.measure.shapes import SHAPES, random_model


def measure(model, tests, repetitions, seed=0):
    """{(test, on): [tokens/s per repetition]}, on and off alternated within every repetition."""
    rng = np.random.default_rng(seed)
    plans = [check_fits(spec, model.config.max_position_embeddings) for spec in tests]
    prepare(model, "pp", 8, 1, 0, rng)()                          # warm up: page weights in
    rates = {}
    try:
        for r in range(repetitions):
            for spec, plan in zip(tests, plans):
                for on in ((True, False) if r % 2 == 0 else (False, True)):
                    K.set_batch_invariant(on)
                    run = prepare(model, *plan, rng)
                    seconds, tokens = timed(run)
                    rates.setdefault((spec, on), []).append(tokens / seconds)
    finally:
        K.set_batch_invariant(True)
    return rates


def report(name, tests, rates):
    for spec in tests:
        on, off = (statistics.median(rates[spec, v]) for v in (True, False))
        print(f"| {name:28s} | {spec:9s} | {on:9.1f} | {off:9.1f} | {on / off:5.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="model folders or GGUF files")
    ap.add_argument("--shapes", nargs="*", default=[], choices=list(SHAPES), help="random-weight models of these shapes")
    ap.add_argument("--types", nargs="+", default=["f32"], help="weight types of the --shapes models")
    ap.add_argument("--tests", nargs="+", default=["pp512", "tg32x8", "tg32x32"])
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=None, help="of the model files (the shapes': TINYDIFF_THREADS)")
    args = ap.parse_args()
    print(f"simd {K.simd()}; tokens/s with batch invariance on and off, and on / off\n")
    print("| model                        | test      |        on |       off | ratio |")
    print("|------------------------------|-----------|-----------|-----------|-------|")
    runs = [(path, lambda path=path: tinydiff.load(path, threads=args.threads)) for path in args.models]
    runs += [(f"{shape} {t}", lambda shape=shape, t=t: random_model(shape, weight_type=t))
             for shape in args.shapes for t in args.types]
    for name, load in runs:
        model = load()
        report(name.rsplit("/", 1)[-1], args.tests, measure(model, args.tests, args.repetitions))


if __name__ == "__main__":
    main()
