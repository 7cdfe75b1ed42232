"""Speculative decoding against plain greedy decoding, in one interleaved run: accepted tokens per
verify pass, tokens per pass, and the speed-up in generation (prefill excluded).

    python bench/bench_speculative.py [-n 128] [--repeat 3] [-t 2] [--draft-max 8] [--smollm FILE]

Cases: the shipped stories5m-ar with --draft ngram and with the block-diffusion twin stories5m-bd
as drafter, on a TinyStories opening; and, when --smollm names the SmolLM2-135M-Instruct GGUF, that
model with --draft ngram on a "Summarise this text: <paragraph>" chat prompt (the paragraph read
from --data, TinyStories' validation text), where prompt lookup pays: the summary copies the text.
Each case runs plain, speculative, plain, speculative, ... (`--repeat` of each) and reports the
ratio of the medians of generation speed. It also says whether the speculative output equalled the
plain one token for token (it must: batch invariance makes a row of a k+1-row pass the row a
1-row pass computes; with tinydiff.set_batch_invariant(False) a near-tie may turn). The machine is noisy: compare ratios within one run only.
"""
import argparse
import os
import statistics
import time

import numpy as np

import tinydiff
from tinydiff.decoding.generate import Timings

DATA = "/work/shared/data/tinystories/v1-valid-prefix.txt"


def run(model, ids, n, draft=None, draft_max=8):
    """(new ids, generation tokens/s, Counts or None)."""
    timings = Timings()
    draft = draft.fresh() if hasattr(draft, "fresh") else draft        # a drafter model's cache starts empty
    out = list(model.generate_tokens(ids, n, temperature=0, timings=timings,
                                     **({"draft": draft, "draft_max": draft_max} if draft else {})))
    return out, timings.gen_tokens / timings.gen_s, timings.speculation


def case(label, model, ids, n, draft, draft_max, repeat):
    plain_speed, spec_speed, same = [], [], True
    for _ in range(repeat):
        base, speed, _ = run(model, ids, n)
        plain_speed.append(speed)
        out, speed, counts = run(model, ids, n, draft, draft_max)
        spec_speed.append(speed)
        same &= out == base
    c = counts
    ratio = statistics.median(spec_speed) / statistics.median(plain_speed)
    print(f"{label:46s} {statistics.median(plain_speed):8.1f} {statistics.median(spec_speed):8.1f} {ratio:6.2f}x "
          f"{c.accepted / c.rounds:9.2f} {c.emitted / c.rounds:9.2f} {c.accepted}/{c.drafted:<8d} "
          f"{'yes' if same else 'NO'}", flush=True)


def pass_cost(label, model, rows=(1, 2, 3, 5, 9), repeat=5):
    """What a verify pass of r rows costs in decode steps (1-row passes) on this model, interleaved:
    speculation pays when tokens per pass exceed the cost of its pass (plus the drafter's)."""
    t = model.transformer
    state = t.state(256, rows=128)
    t.forward(np.arange(1, 101)[None], state, 0, last_only=True)
    times = {r: [] for r in rows}
    for _ in range(repeat):
        for r in rows:
            t0 = time.perf_counter()
            for _ in range(10):
                t.forward(np.arange(5, 5 + r)[None], state, 100)
            times[r].append(time.perf_counter() - t0)
    one = statistics.median(times[1])
    print(f"{label}: a pass of r rows costs " + ", ".join(f"r={r}: {statistics.median(times[r]) / one:.2f}"
                                                           for r in rows) + " decode steps")


def summarise_prompt(model, data):
    with open(data, encoding="utf-8") as f:
        paragraphs = [p.strip() for p in f.read().split("\n\n") if len(p.strip()) > 400]
    text = paragraphs[0]
    return model.chat_ids([{"role": "user", "content": f"Summarise this text: {text}"}])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=128, help="tokens generated a run")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each, interleaved")
    ap.add_argument("--draft-max", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--smollm", default="/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--smollm-f32", default="/tmp/models/SmolLM2-135M-Instruct-f32.gguf",
                    help="its F32 copy, whose kernels compute a row of a small pass as a 1-row pass does")
    ap.add_argument("--data", default=DATA)
    a = ap.parse_args()
    print(f"{'case':46s} {'plain':>8s} {'spec':>8s} {'ratio':>7s} {'acc/pass':>9s} {'tok/pass':>9s} "
          f"{'acc/drafted':12s} same")
    print(f"{'':46s} {'tok/s':>8s} {'tok/s':>8s}")
    ar = tinydiff.load("stories5m-ar", threads=a.threads)
    bd = tinydiff.load("stories5m-bd", threads=a.threads)
    ids = ar.encode_prompt("Once upon a time, there was a little girl named Lily. She loved to play outside.")
    for k in a.draft_max:
        case(f"stories5m-ar, --draft ngram --draft-max {k}", ar, ids, a.n, "ngram", k, a.repeat)
        case(f"stories5m-ar, --draft stories5m-bd --draft-max {k}", ar, ids, a.n, ar.speculator(bd, k), k, a.repeat)
    sm = None
    if os.path.exists(a.smollm) and os.path.exists(a.data):
        sm = tinydiff.load(a.smollm, threads=a.threads)
        for k in a.draft_max:
            case(f"SmolLM2 Q4_1, summarise, --draft ngram --draft-max {k}", sm, summarise_prompt(sm, a.data), a.n,
                 "ngram", k, a.repeat)
    else:
        print(f"(no {a.smollm} or {a.data}: the SmolLM2 case is skipped)")
    if os.path.exists(a.smollm_f32) and os.path.exists(a.data):
        f32 = tinydiff.load(a.smollm_f32, threads=a.threads)
        k = max(a.draft_max)
        case(f"SmolLM2 F32, summarise, --draft ngram --draft-max {k}", f32, summarise_prompt(f32, a.data), a.n,
             "ngram", k, a.repeat)
    pass_cost("stories5m-ar", ar)
    if sm is not None:
        pass_cost("SmolLM2 Q4_1", sm)


if __name__ == "__main__":
    main()
