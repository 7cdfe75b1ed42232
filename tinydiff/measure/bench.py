"""`tinydiff bench`: llama-bench's tests, plus one for masked diffusion.

    pp N     prompt processing: one causal pass over N positions
    tg N     text generation: N decode passes, one token each, after a one-token prompt
    tg NxB   the same for B sequences decoded as one batch (llama-batched-bench's -npl B): N passes
             of B rows, B x N tokens; its t/s against tg N's is what batching buys
    dd LxS   diffusion: S bidirectional passes over a canvas of L positions (S steps make L tokens)
    bd NxBxS block diffusion: N tokens after a one-token prompt, B at a time, S steps a block, each
             step committing B/S of them (a fixed schedule: with random weights no rule of
             confidence means anything), then the block's clean pass (but the last block's); the
             real sampler runs (decoding.diffusion), so its passes, scoring and Python are all in
             the time. Its t/s against tg's is block diffusion's speed against AR decoding.
    kp K     the k-row pass: one forward of K new positions after a cached prompt of 64 (cached
             untimed, causally), the logits of all K rows, as a block-diffusion step or a
             speculative verify pass needs them: causal for a causal model, else the K rows
             bidirectional among themselves, attending the prompt (the block step's pass:
             BIDIRECTIONAL reading slots 0..64+K-1). One pass is short, so a repetition runs it P
             times over the same K slots, every pass in the ledger: P = 32, or fewer for a model
             whose P passes would read more than 4 GiB of weights (kp_passes; at least 1); K x P
             tokens, so t/s is K over one pass's time. Its time in decode steps is its pass's time
             over kp1's.

Each test runs `repetitions` times inside a Ledger, so its FLOPs and bytes come from the same code
that ran; the repetitions go round the tests, so that the ratios between tests are taken side by
side. The table shows tokens/s (mean ± sd), the GB/s and GFLOP/s achieved, and the share of the
roofline time (tinydiff roofline) the run reached: 100% would be as fast as this machine's memory
bandwidth or peak FLOP/s allows, whichever binds. Without -m, models of real shapes are
built in memory with random weights (speed does not depend on the values).
"""
import json
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..decoding.diffusion import Options, denoise_steps, to_the_end
from ..engine.ledger import Ledger
from ..engine.masks import BIDIRECTIONAL, CAUSAL
from ..errors import UsageError


@dataclass
class Result:
    model: str
    params: int
    threads: int
    test: str             # "pp512", "tg128", "dd256x8", "bd128x8x2", "kp8"
    tokens: int           # tokens produced (tg, dd, bd) or processed (pp, kp) per repetition
    seconds: list         # wall time of each repetition
    flops: int            # per repetition, from the ledger
    bytes: int            # per repetition, from the ledger
    weight_bytes: int = 0  # the part of bytes that is weights
    passes: int = 0       # forward passes per repetition, from the ledger
    roofline_seconds: float = 0.0

    @property
    def tokens_per_s(self):
        return [self.tokens / s for s in self.seconds]

    def row(self):
        rate, t = self.tokens_per_s, statistics.mean(self.seconds)
        sd = statistics.stdev(rate) if len(rate) > 1 else 0.0
        share = f"{100 * self.roofline_seconds / t:.1f}%" if self.roofline_seconds else "-"
        rates = f"{statistics.mean(rate):.1f} ± {sd:.1f}"
        return (f"| {self.model:20s} | {self.params / 1e6:7.1f}M | {self.threads:7d} | {self.test:>9s} | "
                f"{rates:>19s} | {self.bytes / t / 1e9:7.2f} | "
                f"{self.flops / t / 1e9:8.2f} | {share:>8s} |")


HEADER = ("| model                |   params | threads |      test |                 t/s |    GB/s |  GFLOP/s | "
          "roofline |\n|----------------------|----------|---------|-----------|---------------------|---------|----------|"
          "----------|")


MAX_SEQUENCES = 1024    # a tg test's batch: a pass of at most this many rows is one C call a layer
KP_PROMPT = 64          # a kp test's cached prompt, in positions
KP_PASSES = 32          # a kp test's passes a repetition at most (one pass of a 5M model is ~0.4 ms) ...
KP_READ = 4 << 30       # ... and at most ~4 GiB of weight bytes (a pass of a 1.5 GB model is ~0.1 s)


def parse_test(spec):
    """'pp512' / 'tg128' / 'tg128x8' / 'dd256x8' / 'bd128x8x2' / 'kp8' -> (kind, n, steps, block):
    steps a block for bd, in all for dd, the passes a repetition for kp (at most: KP_PASSES), 1 for pp and
    tg; block: B for bd, the sequences for tg, else 0 (tg: 1 when not given); n: K for kp."""
    kind, rest = spec[:2], spec[2:]
    try:
        if kind in ("pp", "tg") and rest.isdigit() and int(rest) > 0:
            return kind, int(rest), 1, int(kind == "tg")
        if kind == "kp" and rest.isdigit() and int(rest) > 0:
            return kind, int(rest), KP_PASSES, 0
        if kind == "tg":
            N, B = (int(v) for v in rest.lower().split("x"))
            if N > 0 and 0 < B <= MAX_SEQUENCES:
                return kind, N, 1, B
        if kind == "dd":
            L, S = (int(v) for v in rest.lower().split("x"))
            if 0 < S <= L:
                return kind, L, S, 0
        if kind == "bd":
            N, B, S = (int(v) for v in rest.lower().split("x"))
            if N > 0 and B > 0 and 0 < S <= B and N % B == 0:
                return kind, N, S, B
    except ValueError:
        pass
    raise UsageError(f"bench: test '{spec}' should look like pp512, tg128, tg128x8 (8 sequences, at most "
                     f"{MAX_SEQUENCES}), dd256x8 (S <= L steps), bd128x8x2 (N tokens in blocks of B, S <= B steps "
                     f"a block, N a multiple of B) or kp8 (a pass of K >= 1 rows after a {KP_PROMPT}-position prompt)")


def kp_passes(model):
    """A kp test's passes a repetition for model: KP_PASSES, fewer when they would read more than
    KP_READ bytes of weights (enough to time, on any model; no minutes of it on a large one)."""
    by_type, _ = model.weight_bytes()
    return max(1, min(KP_PASSES, KP_READ // max(1, sum(by_type.values()))))


def check_fits(spec, n_ctx):
    """parse_test(spec), its positions checked within a context of n_ctx (tg and bd read one more
    than they make, kp KP_PROMPT more)."""
    plan = kind, n, _, _ = parse_test(spec)
    if n + {"tg": 1, "bd": 1, "kp": KP_PROMPT}.get(kind, 0) > n_ctx:
        prompt = f" ({KP_PROMPT} prompt positions + {n})" if kind == "kp" else ""
        raise UsageError(f"bench: {spec} exceeds a model's context of {n_ctx}{prompt}")
    return plan


def prepare(model, kind, n, steps, block, rng):
    """Sets up one repetition; returns the function to time, which returns the tokens it made."""
    cfg = model.config
    seqs = block if kind == "tg" else 1
    length = KP_PROMPT + n if kind == "kp" else n + 1
    ids = rng.integers(0, cfg.vocab_size, size=(seqs, length))                 # [seqs, length]
    forward, state = model.transformer.forward, model.transformer.state(length, batch=seqs)

    def pp():
        forward(ids[:, :n], state, 0, last_only=True)
        return n

    def tg():
        for i in range(1, n + 1):
            forward(ids[:, i:i + 1], state, i, last_only=True)         # [seqs, 1]: one token of each
        return n * seqs

    def dd():
        for _ in range(steps):
            forward(ids[:, :n], state, 0, mask=BIDIRECTIONAL)
        return n

    def bd():
        mask_id = cfg.vocab_size - 1                                  # any id: the weights are what they are
        canvas = np.full(n + 1, mask_id, np.int64)                    # [1 + n]: the prompt token, then the holes
        canvas[0] = ids[0, 0]
        given = np.arange(n + 1) == 0
        options = Options(steps=n // block * steps, block_size=block, eos="keep")
        return len(to_the_end(denoise_steps(model.transformer, canvas, given, 1, options, mask_id, ())).ids)

    def kp():
        mask = CAUSAL if cfg.causal else BIDIRECTIONAL               # else the K rows see each other, and the
        for _ in range(steps):                                        # prompt (slots < length): a block step's pass
            forward(ids[:, KP_PROMPT:], state, KP_PROMPT, length, mask)   # [K, V]: every row's logits, same slots
        return n * steps

    if kind == "tg":
        forward(ids[:, :1], state, 0, last_only=True)                 # the one-token prompt, not timed
    if kind == "kp":
        forward(ids[:, :KP_PROMPT], state, 0, last_only=True)         # the prompt, cached causally, not timed
    return {"pp": pp, "tg": tg, "dd": dd, "bd": bd, "kp": kp}[kind]


def timed(run):
    t0 = time.perf_counter()
    tokens = run()
    return time.perf_counter() - t0, tokens


def bench(model, name, tests, repetitions=3, roofline=None, seed=0):
    """The tests' Results. The repetitions go round the tests (every test once, then again), so
    that a shared machine's change of pace falls on all of them alike and their ratios (tg32x8
    against tg32) are measured side by side, not minutes apart."""
    from .roofline import predict_seconds
    rng = np.random.default_rng(seed)
    plans = [check_fits(spec, model.config.max_position_embeddings) for spec in tests]
    plans = [(kind, n, kp_passes(model) if kind == "kp" else steps, block) for kind, n, steps, block in plans]
    prepare(model, "pp", 8, 1, 0, rng)()                                   # warm up: page weights in
    seconds, ledgers, tokens = [[] for _ in tests], [None] * len(tests), [0] * len(tests)
    for _ in range(repetitions):
        for i, (kind, n, steps, block) in enumerate(plans):
            run = prepare(model, kind, n, steps, block, rng)
            with Ledger() as led:
                s, tokens[i] = timed(run)
            seconds[i].append(s)
            ledgers[i] = led
    results = []
    for spec, sec, led, made in zip(tests, seconds, ledgers, tokens):
        t = led.total()
        nbytes = sum(t["bytes"].values())
        r = Result(name, model.parameter_count(), model.pool.threads, spec, made, sec, t["flops"], nbytes,
                   t["bytes"]["weights"], len(led.passes))
        if roofline is not None:
            r.roofline_seconds = predict_seconds(t["flops"], nbytes, roofline)
        results.append(r)
    return results


def as_json(results):
    return json.dumps([{**asdict(r), "tokens_per_s": r.tokens_per_s} for r in results], indent=1)


def type_ratios(results, types):
    """Each test's mean t/s in every weight type as a ratio to the first type's, per model: the
    lines under a `--type f32,q8_0,q4_0` table."""
    rows, first = [], {}
    for r in results:
        name, wtype = r.model.rsplit(" ", 1)
        rate = statistics.mean(r.tokens_per_s)
        if wtype == types[0]:
            first[name, r.test] = rate
        elif (name, r.test) in first:
            rows.append(f"{name} {r.test}: {wtype} {rate / first[name, r.test]:.2f}x the {types[0]} t/s")
    return "\n".join(rows)


def weight_bandwidth(results, roofline):
    """For each decode test: the weights read per second, against the machine's memory read (a
    decode step reads every weight once, so this is how close decoding is to the memory roof)."""
    rows = []
    for r in results:
        if r.test.startswith("tg") and roofline is not None and roofline.mem_gbs:
            gbs = r.weight_bytes / statistics.mean(r.seconds) / 1e9
            rows.append(f"{r.model} {r.test}: weights read at {gbs:.1f} GB/s, {gbs / roofline.mem_gbs:.0%} of the "
                        f"memory's {roofline.mem_gbs:.1f} GB/s")
    return "\n".join(rows)


def batch_ratios(results, roofline=None):
    """For each batched decode test: its t/s against the same model's single-sequence tg of as many
    steps, the weight bytes a token (falling as 1/B: a pass reads the weights once for all rows),
    and its FLOP per byte against the machine's balance (above it, decoding is compute-bound)."""
    rows, one = [], {(r.model, parse_test(r.test)[1]): r for r in results if parse_test(r.test)[:1] == ("tg",)
                     and parse_test(r.test)[3] == 1}
    for r in results:
        kind, n, _, seqs = parse_test(r.test)
        if kind == "tg" and seqs > 1 and (r.model, n) in one:
            base = one[r.model, n]
            speedup = statistics.mean(r.tokens_per_s) / statistics.mean(base.tokens_per_s)
            bound = ""
            if roofline is not None and roofline.mem_gbs and roofline.peak_gflops:
                balance = roofline.peak_gflops / roofline.mem_gbs
                bound = f", {r.flops / r.bytes:.1f} FLOP/B ({'compute' if r.flops / r.bytes > balance else 'memory'}-bound)"
            rows.append(f"{r.model} {r.test}: {speedup:.2f}x tg{n}'s t/s; weights {r.weight_bytes / r.tokens / 1e6:.2f} MB "
                        f"a token (tg{n}: {base.weight_bytes / base.tokens / 1e6:.2f}){bound}")
    return "\n".join(rows)


def block_ratios(results):
    """For each bd test: its tokens a step and a pass (passes as the ledger counted them: the prompt,
    the steps, a clean pass a block but the last), and its t/s against the same model's tg test of
    as many tokens (ms per token, block diffusion against AR decoding)."""
    rows, tg = [], {(r.model, r.tokens): statistics.mean(r.tokens_per_s) for r in results
                    if r.test.startswith("tg") and "x" not in r.test}
    for r in results:
        if r.test.startswith("bd") and (r.model, r.tokens) in tg:
            _, n, steps, block = parse_test(r.test)
            ratio = tg[r.model, r.tokens] / statistics.mean(r.tokens_per_s)
            rows.append(f"{r.model} {r.test}: {block / steps:.2g} tokens a step, {n / r.passes:.2f} a pass; "
                        f"ms per token {ratio:.2f}x tg{r.tokens}'s")
    return "\n".join(rows)


def kp_ratios(results):
    """For each kp test: its pass's mean time, that time in decode steps (over the same model's kp1
    pass, same run) and against the roofline's time (weights read once, K rows of arithmetic, the
    LM head on all K rows; left out without a roofline)."""
    rows, one = [], {r.model: _pass_seconds(r) for r in results if r.test == "kp1"}
    for r in results:
        if not r.test.startswith("kp"):
            continue
        parts = [f"{_pass_seconds(r) * 1e3:.3g} ms a pass"]
        if r.test != "kp1" and r.model in one:
            parts.append(f"{_pass_seconds(r) / one[r.model]:.2f} decode steps (kp1's time)")
        if r.roofline_seconds:
            parts.append(f"{statistics.mean(r.seconds) / r.roofline_seconds:.2f}x the roofline's time")
        rows.append(f"{r.model} {r.test}: {', '.join(parts)}")
    return "\n".join(rows)


def _pass_seconds(r):
    """A kp test's mean time of one pass: a repetition's mean over its passes."""
    return statistics.mean(r.seconds) / r.passes
