"""Time of one denoising step, uncached and with each cache, and tokens committed per pass.

    python bench/bench_diffusion.py [--shapes stories15M SmolLM2-135M] [--canvas 64 256 1024]
                                    [--block 32] [-t 2] [--repeat 3] [--skip-steps]

Random-weight models of real shapes (no download). A canvas of L positions is half prompt, half
masks; the block being denoised is the first `--block` masks. Per canvas it times one forward pass:
  full    the whole canvas (no cache, and every block's first step with a cache)
  prefix  a later step with cache="prefix": the block and everything after it
  dual    a later step with cache="dual": the block only
and "choose", the sampler's own work on the block's rows (scores, positions) after a pass.

Then tokens committed per forward pass for the threshold sampler, on a random model of each shape
and on the small real fixture checkpoint used bidirectionally. A random model spreads its
probability over the whole vocabulary, so nothing reaches the threshold and the sampler commits its
guaranteed one token per pass: expect ~1 there. Compare runs made in one sitting; the machine is
shared and noisy.
"""
import argparse
import dataclasses
import os
import statistics
import time

import numpy as np

import tinydiff
from tinydiff.decoding import diffusion
from tinydiff.engine.weights import random_weights
from tinydiff.measure.shapes import SHAPES, shape_config
from tinydiff.model import Model

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "hf", "llama-gqa")


def diffusion_model(name, n_ctx):
    """A shape's random model made bidirectional with a mask token (its last id), context >= n_ctx."""
    cfg = shape_config(name)
    cfg = dataclasses.replace(cfg, causal=False, mask_token_id=cfg.vocab_size - 1,
                              max_position_embeddings=max(cfg.max_position_embeddings, n_ctx))
    return Model(cfg, random_weights(cfg), tokenizer=None)


def median_ms(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def time_steps(model, L, block, repeat):
    """ms of a full pass, a prefix-cached and a dual-cached later step, and of choosing on the block."""
    mask = model.config.mask_token_id
    rng = np.random.default_rng(0)
    prompt = L // 2
    canvas = np.concatenate([rng.integers(0, mask, prompt), np.full(L - prompt, mask)])[None]   # [1, L]
    t = model.transformer
    state = t.state(L)
    lo, hi = prompt, prompt + min(block, L - prompt)
    t.canvas_logits(canvas, state)                                    # warm up; fills the cache
    full = median_ms(lambda: t.canvas_logits(canvas, state), repeat)
    prefix = median_ms(lambda: t.canvas_logits(canvas, state, lo, L), repeat)
    dual = median_ms(lambda: t.canvas_logits(canvas, state, lo, hi), repeat)
    logits = t.canvas_logits(canvas, state, lo, hi)                   # [1, block, V]
    opts, todo, known = diffusion.Options(), np.arange(lo, hi), canvas[0] != mask
    choose = median_ms(lambda: diffusion._choose(
        opts, *diffusion._predict(logits, opts, rng, [mask], todo, canvas[0], known)[1:], 1, rng), repeat)
    return full, prefix, dual, choose


def tokens_per_pass(model, prompt, gen, block, **opts):
    out = model.denoise_result(prompt, gen, block_length=block, eos="keep", **opts)
    return out.tokens_per_pass, out.passes


def first_step_top_p(model, prompt, gen):
    """Median top-1 probability over the masked positions at the first step: what a threshold sees."""
    mask = model.mask_id
    canvas = np.array([prompt + [mask] * gen])
    logits = model.transformer.canvas_logits(canvas, model.transformer.state(canvas.shape[1]))[0, len(prompt):]
    z = logits.astype(np.float64)
    z[:, mask] = -np.inf
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    return float(np.median(1 / p.sum(axis=-1)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--canvas", nargs="+", type=int, default=[64, 256, 1024])
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-steps", action="store_true", help="only the tokens-per-pass part")
    ap.add_argument("--model", action="append", default=[], help="also measure tokens/pass on this "
                    "masked-diffusion checkpoint folder (repeatable)")
    args = ap.parse_args()
    if args.threads:
        tinydiff.set_threads(args.threads)
    print(f"threads: {tinydiff.engine.kernels.get_threads()}")

    if not args.skip_steps:
        print(f"\none denoising step, ms (median of {args.repeat}); canvas = half prompt, block = {args.block}")
        print(f"{'shape':14s} {'canvas':>6s} {'full':>9s} {'prefix':>9s} {'dual':>9s} {'choose':>7s} "
              f"{'full/dual':>9s}")
        for name in args.shapes:
            model = diffusion_model(name, max(args.canvas))
            for L in args.canvas:
                full, prefix, dual, choose = time_steps(model, L, args.block, args.repeat)
                print(f"{name:14s} {L:6d} {full:9.1f} {prefix:9.1f} {dual:9.1f} {choose:7.1f} {full / dual:9.1f}")

    print("\ntokens committed per forward pass (gen 64, block 32, greedy)")
    samplers = [("fixed, 1/step", {}), ("threshold 0.9", dict(threshold=0.9)),
                ("threshold 0.9, dual cache", dict(threshold=0.9, cache="dual")),
                ("threshold 0.5", dict(threshold=0.5)), ("threshold 0.1", dict(threshold=0.1)),
                ("factor 1.0", dict(factor=1.0)),
                ("entropy_bound 0.5", dict(entropy_bound=0.5))]
    models = [(f"{name} (random)", diffusion_model(name, 128)) for name in args.shapes]
    real = tinydiff.load(FIXTURE)
    real = Model(dataclasses.replace(real.config, causal=False, mask_token_id=2), real.weights, real.tokenizer)
    models.append(("llama-gqa fixture", real))
    models += [(os.path.normpath(path)[-40:], tinydiff.load(path)) for path in args.model]
    for label, model in models:
        if model.tokenizer is not None:
            prompt = model.tokenizer.encode("Once upon a time, there was a little girl named Lily. She")
        else:
            prompt = np.random.default_rng(1).integers(3, 300, 16).tolist()
        print(f"\n{label}: median top-1 p of the masked positions at the first step "
              f"{first_step_top_p(model, prompt, 64):.3g}")
        print(f"  {'sampler':28s} {'tokens/pass':>11s} {'passes':>6s}")
        for what, opts in samplers:
            tpp, passes = tokens_per_pass(model, prompt, 64, 32, **opts)
            print(f"  {what:28s} {tpp:11.2f} {passes:6d}")


if __name__ == "__main__":
    main()
