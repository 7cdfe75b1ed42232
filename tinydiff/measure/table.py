"""`tinydiff cost`: autoregressive decoding and masked diffusion side by side, measured.

For each run (AR decoding, then each diffusion setting) on the same prompt: forward passes, tokens
committed per pass, FLOPs and bytes per pass and per generated token (from the Ledger of the run
itself; a speculative run, --draft, counts its verify, draft and prefill passes alike, and a line
under the table says which were which and what the drafts earned), arithmetic intensity against the
machine's balance, the time the roofline predicts
(each pass at max(FLOPs / peak, bytes / bandwidth)), the time measured, and their ratio.
"""
import dataclasses
import os
import time
from dataclasses import dataclass

import numpy as np

from ..engine.ledger import Ledger
from ..engine.masks import BIDIRECTIONAL
from .roofline import predict_seconds


@dataclass
class Run:
    label: str
    tokens: int           # tokens generated
    passes: list          # the Ledger's pass entries
    sampling_flops: int
    seconds: float        # measured, wall time of the whole generation
    predicted: float      # roofline time of the passes
    speculative: dict = None   # the Ledger's speculative counts of a run with drafts

    @property
    def flops(self):
        return sum(p["flops"] for p in self.passes)

    @property
    def bytes(self):
        return sum(sum(p["bytes"].values()) for p in self.passes)


def measure(label, roofline, generate):
    """Runs generate() (which returns the generated ids) in a Ledger and times it."""
    with Ledger() as led:
        t0 = time.perf_counter()
        ids = generate()
        seconds = time.perf_counter() - t0
    predicted = sum(predict_seconds(p["flops"], sum(p["bytes"].values()), roofline) for p in led.passes)
    return Run(label, len(ids), led.passes, led.sampling["flops"], seconds, predicted,
               dict(led.speculative) if led.speculative["rounds"] else None)


def cost_runs(ar, dm, prompt, n_predict, options, weight_types, roofline, draft=None):
    """The runs of `tinydiff cost`, for each weight type (None: as loaded): greedy AR decoding (unless
    ar is None; and with draft, (draft, draft_max, ngram sizes) as Model.speculator takes them, greedy
    speculative decoding), then each diffusion setting of dm (for a type named, only the first)."""
    runs = []
    for wtype in weight_types:
        prefix = f"{wtype} " if wtype else ""
        if ar is not None:
            m = stored_as(ar, wtype)
            ids = m.encode_prompt(prompt)
            runs.append(measure(prefix + "autoregressive, greedy", roofline,
                                lambda m=m, ids=ids: m.generate_ids(ids, n_predict, temperature=0)))
            if draft is not None:
                spec = m.speculator(draft[0], draft[1], None, draft[2])
                runs.append(measure(f"{prefix}autoregressive, --draft {os.path.basename(spec.name)} "
                                    f"k={spec.draft_max}", roofline,
                                    lambda m=m, ids=ids, s=spec: m.generate_ids(ids, n_predict, temperature=0, draft=s)))
        m = stored_as(dm, wtype)
        ids = m.encode_prompt(prompt)
        for setting in diffusion_settings(n_predict, options)[:1 if wtype else None]:
            runs.append(measure(prefix + describe(setting), roofline,
                                lambda s=setting, m=m, ids=ids: m.denoise_ids(ids, n_predict, **{"eos": "keep", **s})))
    return runs


def bidirectional_twin(ar):
    """The AR model's weights read bidirectionally, its last token id the mask: a diffusion pass of
    its shape, whose costs are real (they depend on the shape alone) but whose commits are not."""
    return type(ar)(dataclasses.replace(ar.config, causal=False, mask_token_id=ar.config.vocab_size - 1),
                    ar.weights, ar.tokenizer)


def stored_as(model, weight_type):
    """The model with its matrices stored as weight_type (None: as loaded), quantized in memory."""
    from .shapes import stored_as as weights_as
    if weight_type is None:
        return model
    return type(model)(model.config, weights_as(model.weights, weight_type), model.tokenizer)


def diffusion_settings(n, options):
    """The user's one setting (denoising keywords), or a spread from one-token-per-step to cached
    threshold decoding."""
    given = {name: value for name, value in options.items() if value is not None}
    if given:
        return [given]
    block = 32 if n % 32 == 0 and n > 32 else None
    quarter = max(1, n // 4) if block is None or (n // 4) % (n // block) == 0 else n // block
    settings = [dict(steps=n), dict(steps=quarter)]
    if block:
        settings += [dict(steps=quarter, block_length=block, cache="dual"),
                     dict(steps=n, block_length=block, cache="dual", threshold=0.9)]
    return settings


def describe(setting):
    parts = [f"{k.replace('_length', '')}={v}" for k, v in setting.items() if v is not None]
    return "diffusion " + " ".join(parts)


def table(runs, roofline):
    """The side-by-side table, one row per run."""
    head = (f"{'run':44s} {'passes':>6s} {'tok/pass':>8s} {'GFLOP/pass':>10s} {'MB/pass':>8s} {'MB/token':>8s} "
            f"{'FLOP/B':>7s} {'bound':>7s} {'predicted':>10s} {'measured':>10s} {'meas/pred':>9s}")
    rows = [head, "-" * len(head)]
    for r in runs:
        n = len(r.passes)
        intensity = r.flops / r.bytes
        bound = "compute" if intensity > roofline.balance else "memory"
        rows.append(f"{r.label:44s} {n:6d} {r.tokens / n:8.2f} {r.flops / n / 1e9:10.4f} "
                    f"{r.bytes / n / 1e6:8.2f} {r.bytes / r.tokens / 1e6:8.2f} {intensity:7.1f} {bound:>7s} "
                    f"{r.predicted * 1e3:8.1f}ms {r.seconds * 1e3:8.1f}ms {r.seconds / r.predicted:9.2f}")
    rows += [speculative_note(r) for r in runs if r.speculative]
    rows.append(f"machine: {roofline.mem_gbs:.1f} GB/s memory, {roofline.peak_gflops:.0f} GFLOP/s peak f32, "
                f"balance {roofline.balance:.1f} FLOP/byte ({roofline.threads} threads)")
    return "\n".join(rows)


def speculative_note(r):
    """Which passes of a speculative run were what: the prefill, the verify passes (their rows: the
    newest token and its drafts), the drafter's; and what the drafts earned."""
    verify = [p["tokens"] for p in r.passes if p.get("role") == "verify"]
    draft = sum(p.get("role") == "draft" for p in r.passes)
    s = r.speculative
    return (f"  {r.label}: {len(r.passes) - len(verify) - draft} prefill, {len(verify)} verify ({sum(verify)} rows, "
            f"{sum(verify) / max(len(verify), 1):.2f} a pass), {draft} draft passes; {s['drafted']} drafted, "
            f"{s['accepted']} accepted, {s['drafted'] - s['accepted']} rejected: "
            f"{s['accepted'] / s['rounds']:.2f} accepted and {(r.tokens - 1) / s['rounds']:.2f} tokens a verify pass")


def plot_points(runs, model, sizes=(64, 256, 1024)):
    """(label, flops, bytes, seconds) a pass of each run, then of one full pass of model per canvas
    size: the points `tinydiff cost --plot` draws on the roofline."""
    points = [(r.label, r.flops / len(r.passes), r.bytes / len(r.passes), r.seconds / len(r.passes)) for r in runs]
    return points + canvas_points(model, list(sizes))


def canvas_points(model, sizes, repetitions=3):
    """(label, flops, bytes, seconds) of one full bidirectional pass per canvas size, for the plot."""
    rng = np.random.default_rng(0)
    points = []
    for L in sizes:
        if L > model.config.max_position_embeddings:
            continue
        canvas = rng.integers(0, model.config.vocab_size, size=(1, L))
        state = model.transformer.state(L)
        model.transformer.forward(canvas, state, 0, mask=BIDIRECTIONAL)  # warm up
        best = float("inf")
        for _ in range(repetitions):
            with Ledger() as led:
                t0 = time.perf_counter()
                model.transformer.forward(canvas, state, 0, mask=BIDIRECTIONAL)
                best = min(best, time.perf_counter() - t0)
        p = led.passes[0]
        points.append((f"diffusion step, canvas {L}", p["flops"], sum(p["bytes"].values()), best))
    return points
