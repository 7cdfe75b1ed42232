"""`tinydiff bench`: llama-bench's tests, plus one for masked diffusion.

    pp N     prompt processing: one causal pass over N positions
    tg N     text generation: N decode passes, one token each, after a one-token prompt
    dd LxS   diffusion: S bidirectional passes over a canvas of L positions (S steps make L tokens)

Each test runs `repetitions` times inside a Ledger, so its FLOPs and bytes come from the same code
that ran; the table shows tokens/s (mean ± sd), the GB/s and GFLOP/s achieved, and the share of
the roofline time (tinydiff roofline) the run reached: 100% would be as fast as this machine's
memory bandwidth or peak FLOP/s allows, whichever binds. Without -m, models of real shapes are
built in memory with random weights (speed does not depend on the values).
"""
import json
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..engine.ledger import Ledger
from ..engine.masks import BIDIRECTIONAL
from ..errors import UsageError


@dataclass
class Result:
    model: str
    params: int
    threads: int
    test: str             # "pp512", "tg128", "dd256x8"
    tokens: int           # tokens produced (tg, dd) or processed (pp) per repetition
    seconds: list         # wall time of each repetition
    flops: int            # per repetition, from the ledger
    bytes: int            # per repetition, from the ledger
    weight_bytes: int = 0  # the part of bytes that is weights
    roofline_seconds: float = 0.0

    @property
    def tokens_per_s(self):
        return [self.tokens / s for s in self.seconds]

    def row(self):
        rate, t = self.tokens_per_s, statistics.mean(self.seconds)
        sd = statistics.stdev(rate) if len(rate) > 1 else 0.0
        share = f"{100 * self.roofline_seconds / t:.1f}%" if self.roofline_seconds else "-"
        return (f"| {self.model:20s} | {self.params / 1e6:7.1f}M | {self.threads:7d} | {self.test:>9s} | "
                f"{statistics.mean(rate):8.1f} ± {sd:5.1f} | {self.bytes / t / 1e9:7.2f} | "
                f"{self.flops / t / 1e9:8.2f} | {share:>8s} |")


HEADER = ("| model                |   params | threads |      test |              t/s |    GB/s |  GFLOP/s | "
          "roofline |\n|----------------------|----------|---------|-----------|------------------|---------|----------|"
          "----------|")


def parse_test(spec):
    """'pp512' / 'tg128' / 'dd256x8' -> (kind, n, steps)."""
    kind, rest = spec[:2], spec[2:]
    try:
        if kind in ("pp", "tg") and int(rest) > 0:
            return kind, int(rest), 1
        if kind == "dd":
            L, S = (int(v) for v in rest.lower().split("x"))
            if L > 0 and S > 0:
                return kind, L, S
    except ValueError:
        pass
    raise UsageError(f"bench: test '{spec}' should look like pp512, tg128 or dd256x8")


def prepare(model, kind, n, steps, rng):
    """Sets up one repetition; returns the function to time, which returns the tokens it made."""
    cfg = model.config
    if n + (kind == "tg") > cfg.max_position_embeddings:
        raise UsageError(f"bench: {kind}{n} exceeds the model's context of {cfg.max_position_embeddings}")
    ids = rng.integers(0, cfg.vocab_size, size=(1, n + 1))
    forward, state = model.transformer.forward, model.transformer.state(n + 1)

    def pp():
        forward(ids[:, :n], state, 0, last_only=True)
        return n

    def tg():
        for i in range(1, n + 1):
            forward(ids[:, i:i + 1], state, i, last_only=True)
        return n

    def dd():
        for _ in range(steps):
            forward(ids[:, :n], state, 0, mask=BIDIRECTIONAL)
        return n

    if kind == "tg":
        forward(ids[:, :1], state, 0, last_only=True)                 # the one-token prompt, not timed
    return {"pp": pp, "tg": tg, "dd": dd}[kind]


def timed(run):
    t0 = time.perf_counter()
    tokens = run()
    return time.perf_counter() - t0, tokens


def bench(model, name, tests, repetitions=3, roofline=None, seed=0):
    from .roofline import predict_seconds
    rng = np.random.default_rng(seed)
    results = []
    for spec in tests:
        kind, n, steps = parse_test(spec)
        prepare(model, kind, min(n, 8), 1, rng)()                      # warm up: page weights in
        seconds, ledgers = [], []
        for _ in range(repetitions):
            run = prepare(model, kind, n, steps, rng)
            with Ledger() as led:
                s, tokens = timed(run)
            seconds.append(s)
            ledgers.append(led.total())
        t = ledgers[0]
        nbytes = sum(t["bytes"].values())
        r = Result(name, model.parameter_count(), model.pool.threads, spec, tokens, seconds, t["flops"], nbytes,
                   t["bytes"]["weights"])
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
