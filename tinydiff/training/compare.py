"""`tinydiff compare`: the question the project exists for, measured. Where does diffusion pay?

    tinydiff compare [--ar stories5m-ar] [--mdm stories5m-mdm] [--bd stories5m-bd] [-n 64] [--samples 8]
                     [--temp 1] [--repeat-penalty 1] [--threshold X [--gap N]] [--plot FILE.svg]

The autoregressive model, the masked-diffusion model and the block-diffusion model each write n
tokens after the same story openings (sample i continues OPENINGS[i % 8] with seed i), at one
temperature, top-k/top-p off, one repetition penalty (1: off; the tokens within 64 positions).
Settings: AR decoding; the masked-diffusion model at 1 and 2 tokens a step; the block model at 1,
2 and 4 tokens a step (its config's blocks); with --threshold, each diffusion model also by that
rule (the masked-diffusion model at most one pass a token, the block model one more for its prompt
and for each finished block; --gap spaces a step's commits, diffusion.py says how). For each, per
generated token: forward passes, weight bytes and FLOPs (the run's own Ledger), the roofline's predicted time
(each pass at max(FLOPs / peak, bytes / bandwidth)) and the measured time; and the quality: the AR
model's perplexity on the samples (judged perplexity, as `tinydiff eval --judge`), their unigram
entropy and rep4, the share of their 4-grams already written (loops). --plot draws measured ms
per token against judged perplexity: down and left is better.
"""
import time
from dataclasses import dataclass

from ..engine.ledger import Ledger
from ..errors import UsageError
from ..measure.roofline import predict_seconds
from .judge import JudgeRow, continuations, judge_row


@dataclass
class Row:
    label: str
    tokens: int             # generated, EOS included
    passes: int
    flops: float
    bytes: float
    predicted: float        # s, the roofline's time of the passes
    seconds: float          # measured, wall time of the generations
    judged: JudgeRow

    def line(self):
        t = self.tokens
        return (f"{self.label:40s} {self.passes / t:6.2f} {t / self.passes:6.2f} {self.bytes / t / 1e6:8.2f} "
                f"{self.flops / t / 1e6:8.2f} {self.predicted / t * 1e3:8.3f} {self.seconds / t * 1e3:8.3f} "
                f"{self.judged.perplexity:9.2f} {self.judged.entropy:7.3f} {self.judged.repeats:5.3f}")


HEADER = (f"{'setting':40s} {'pass/t':>6s} {'t/pass':>6s} {'MB/tok':>8s} {'MFLOP/t':>8s} {'pred ms':>8s} "
          f"{'ms/tok':>8s} {'judge ppl':>9s} {'entropy':>7s} {'rep4':>5s}")


def settings(ar, mdm, bd, n, temperature, repeat_penalty=1.0, threshold=None, gap=0):
    """[(label, model, generate(prompt_ids, seed) -> new ids)] for the models given (None: left out);
    with a threshold, each diffusion model also decodes by it (and gap), one step a token at most."""
    out, pen = [], dict(repeat_penalty=repeat_penalty, repeat_last_n=64)
    if ar is not None:
        out.append(("autoregressive", ar, lambda p, s: ar.generate_ids(
            p, n, temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=s, **pen)))
    for model, name, per_step in ((mdm, "masked diffusion", (1, 2)), (bd, "block diffusion", (1, 2, 4))):
        if model is None:
            continue
        for k in per_step:
            if n % k:
                raise UsageError(f"compare: -n {n} is not a multiple of {k} tokens a step")
            out.append((f"{name}, {k} token{'s' if k > 1 else ''} a step", model,
                        lambda p, s, m=model, k=k: m.denoise_ids(p, n, steps=n // k, temperature=temperature, seed=s,
                                                                 **pen)))
        if threshold is not None:
            out.append((f"{name}, threshold {threshold:g}" + (f", gap {gap}" if gap else ""), model,
                        lambda p, s, m=model: m.denoise_ids(p, n, threshold=threshold, gap=gap,
                                                            temperature=temperature, seed=s, **pen)))
    return out


def run_setting(label, model, generate, judge, samples, roofline):
    """Row of one setting: the samples generated inside a Ledger, timed, then judged."""
    with Ledger() as led:
        t0 = time.perf_counter()
        seqs = continuations(model, samples, generate)
        seconds = time.perf_counter() - t0
    passes = led.passes
    flops = sum(p["flops"] for p in passes)
    nbytes = sum(sum(p["bytes"].values()) for p in passes)
    predicted = sum(predict_seconds(p["flops"], sum(p["bytes"].values()), roofline) for p in passes)
    tokens = sum(len(s.ids) - s.first for s in seqs)
    return Row(label, tokens, len(passes), flops, nbytes, predicted, seconds, judge_row(model, judge, seqs, label))


def compare(ar, mdm, bd, judge, n, samples, temperature, roofline, repeat_penalty=1.0, threshold=None, gap=0):
    return [run_setting(label, model, generate, judge, samples, roofline)
            for label, model, generate in settings(ar, mdm, bd, n, temperature, repeat_penalty, threshold, gap)]


def table(rows, roofline, n, samples, temperature, repeat_penalty=1.0):
    penalty = f", repetition penalty {repeat_penalty:g} (the tokens within 64)" if repeat_penalty != 1 else ""
    lines = [f"{samples} samples of {n} tokens after story openings, temperature {temperature:g}{penalty}, top-k/top-p "
             "off; per generated token; judged by the AR model", HEADER, "-" * len(HEADER)]
    lines += [r.line() for r in rows]
    lines.append(f"machine: {roofline.mem_gbs:.1f} GB/s memory, {roofline.peak_gflops:.0f} GFLOP/s peak f32 "
                 f"({roofline.threads} threads)")
    return "\n".join(lines)
