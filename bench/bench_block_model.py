"""A block-diffusion model against its AR twin: forward passes, tokens per pass, ms per generated token.

    python bench/bench_block_model.py [--model stories5m-bd] [-n 128] [-t 2]

128 tokens (eos kept) after four prompts, greedy, each setting of steps timed in one run after a
warm-up, and the model at its defaults (its generation_config.json: the rule, gap and penalty the
sweep chose); the AR row is `stories5m-ar` decoding greedily. Passes count the prompt's pass, every step
and each block's clean pass but the last's. Ratios are measured in one run; nothing here is asserted by a test.
"""
import argparse
import time

import tinydiff

PROMPTS = ["Once upon a time", "One day, a little boy named Tom", "Lily and her mom went to the park",
           "There was a big red ball"]


def measure(run):
    """(passes, tokens per pass, ms per token) over the prompts; run(prompt) -> (ids, passes)."""
    run(PROMPTS[0])                                           # warm up
    tokens = passes = 0
    t0 = time.perf_counter()
    for p in PROMPTS:
        ids, n = run(p)
        tokens, passes = tokens + len(ids), passes + n
    return passes / len(PROMPTS), tokens / passes, (time.perf_counter() - t0) / tokens * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="stories5m-bd")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, nargs="+", default=None, help="steps of the fixed runs (default n, n/2, n/4)")
    args = ap.parse_args()
    args.steps = args.steps or [args.n, args.n // 2, args.n // 4]
    bd, ar = tinydiff.load(args.model, threads=args.threads), tinydiff.load("stories5m-ar", threads=args.threads)

    def ar_run(p):
        ids = ar.generate_ids(ar.encode_prompt(p), args.n, temperature=0)
        return ids, len(ids)                                  # the prompt's pass and n - 1 decode passes

    def bd_run(**options):
        def run(p):
            r = bd.denoise_result(bd.encode_prompt(p), args.n, eos="keep", **options)
            return r.ids, r.passes
        return run

    rows = [("AR greedy", *measure(ar_run)), ("the model's defaults", *measure(bd_run()))]
    rows += [(f"blocks of {bd.config.block_size}, {s} steps", *measure(bd_run(steps=s))) for s in args.steps]
    print(f"{'run':32s} {'passes':>7s} {'tok/pass':>8s} {'ms/token':>9s} {'x AR':>6s}")
    for label, passes, per_pass, ms in rows:
        print(f"{label:32s} {passes:7.1f} {per_pass:8.2f} {ms:9.3f} {ms / rows[0][3]:6.2f}")


if __name__ == "__main__":
    main()
