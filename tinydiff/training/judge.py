"""How good a model's samples are (`tinydiff eval --judge`, and `tinydiff compare`): generative perplexity.

Takes the model that writes the samples and an autoregressive judge that shares its tokenizer (the
command checks both); guarantees a JudgeRow per setting, sample i drawn with seed + i in every row.

Generative perplexity (--judge): N samples from the diffusion model, each continuing a short story
opening (at position 0, where training sequences start) by gen_length tokens, cut after the first
EOS; the AR judge scores the generated tokens given the opening, perplexity = exp(total NLL / total
tokens). Low perplexity is easy for a degenerate sample ("the the the"), so each row also reports
the samples' unigram entropy: bits per token of each sample's empirical token distribution (EOS left
out), averaged over samples (as MDLM reports it), and rep4, the share of a sample's 4-grams it had
already written (loops). Steps, threshold (or entropy bound) and temperature take comma lists;
every combination is one row, and sample i uses the same seed in every row. With --data, a
reference row scores the first N held-out stories the same way: gen_length tokens given the
story's first 4. --from-nothing: no opening; a bidirectional model fills an all-mask canvas, an AR
model continues an EOT.
"""
import dataclasses
import itertools
import math
import time

import numpy as np

from .sequences import Seq, ar_seq_nll, boundary_id

REFERENCE_PROMPT = 4        # tokens of a held-out story given in the reference row: an opening's length
OPENINGS = ("Once upon a time", "One day", "Lily and Ben", "There was a little", "Tom had a big",
            "Once there was a", "Mia wanted to", "The sun was")


def unigram_entropy(ids):
    """Bits per token of the empirical distribution of ids (0 for a single repeated token)."""
    counts = np.unique(np.asarray(ids), return_counts=True)[1]
    p = counts / counts.sum()
    return abs(float((p * np.log2(p)).sum()))          # abs: one token gives -0.0


def repeated_ngrams(ids, n=4):
    """The share of the n-grams of ids that already occurred earlier in ids: 0 for text that never
    repeats itself, near 1 for a loop (" The cat was very happy." four times, 24 tokens: 0.71 at n = 4)."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return sum(g in set(grams[:i]) for i, g in enumerate(grams)) / len(grams) if grams else 0.0


@dataclasses.dataclass
class JudgeRow:
    setting: dict           # steps, threshold, temperature (or "held-out text")
    samples: list           # [Seq]: opening + generated ids; ids[first:] are the generated tokens
    texts: list             # [str] the generated text of each sample, up to EOS
    nats: float             # judge's total NLL of the generated tokens
    tokens: int
    entropy: float          # mean over samples of the unigram entropy of its tokens (EOS left out)
    repeats: float          # mean over samples of repeated_ngrams (4-grams) of its tokens
    passes: float           # mean forward passes per sample (0 for the reference row)
    seconds: float

    @property
    def perplexity(self):
        return math.exp(self.nats / self.tokens)

    def as_dict(self):
        return {**self.setting, "samples": len(self.samples), "tokens": self.tokens, "nats": self.nats,
                "perplexity": self.perplexity, "unigram_entropy_bits": self.entropy,
                "repeated_4grams": self.repeats,
                "passes_per_sample": self.passes, "seconds": self.seconds, "texts": self.texts}


def judge_row(model, judge, samples, setting, passes=0.0, seconds=0.0):
    """The judge's scores of the samples' generated tokens (model: the one that made them)."""
    nats, tokens = ar_seq_nll(judge, samples)
    generated = [[t for t in s.ids[s.first:] if t not in model.stop_ids] for s in samples]
    entropy = float(np.mean([unigram_entropy(g) if g else 0.0 for g in generated]))
    repeats = float(np.mean([repeated_ngrams(g) for g in generated]))
    texts = [model.tokenizer.text(g) for g in generated]
    return JudgeRow(setting, samples, texts, float(nats.sum()), int(tokens.sum()), entropy, repeats, passes,
                    seconds)


def continuations(model, n, generate):
    """[Seq] of n samples: sample i continues OPENINGS[i % 8] by generate(opening ids, i) -> new ids.

    The opening starts the sequence, as a story starts every training sequence (no EOT before it)."""
    samples = []
    for i in range(n):
        prompt = model.tokenizer.encode(OPENINGS[i % len(OPENINGS)], add_special_tokens=False)
        samples.append(Seq(np.array(prompt + list(generate(prompt, i)), np.int64), len(prompt)))
    return samples


def draw_samples(model, n, gen_length, seed, **options):
    """([Seq] n denoised samples, mean forward passes): sample i with seed seed + i."""
    passes = []

    def generate(prompt, i):
        result = model.denoise_result(prompt, gen_length, seed=seed + i, **options)
        passes.append(result.passes)
        return result.ids
    return continuations(model, n, generate), sum(passes) / n


def from_nothing(model, n, gen_length, seed, **options):
    """([Seq] n samples written from nothing, mean forward passes): a bidirectional model fills an
    all-mask canvas (Model.infill with the options), a causal one continues <|endoftext|> (only
    `temperature` applies, top-k/top-p off); each is scored after an <|endoftext|>."""
    eot, samples, passes = boundary_id(model), [], []
    for i in range(n):
        if model.config.causal:
            ids = model.generate_ids([eot], gen_length, temperature=options["temperature"], top_k=0, top_p=1.0,
                                     min_p=0.0, repeat_penalty=options.get("repeat_penalty", 1.0), repeat_last_n=64,
                                     seed=seed + i)
            passes.append(len(ids))
        else:
            result = model.denoise_result([model.mask_id] * gen_length, fixed=np.zeros(gen_length, bool),
                                          eos="suppress", seed=seed + i, **options)   # Model.infill's run
            ids = result.ids
            passes.append(result.passes)
        samples.append(Seq(np.array([eot] + list(ids), np.int64), 1))
    return samples, sum(passes) / n


def generative_perplexity(model, judge, n, gen_length, steps=(None,), thresholds=(None,), temps=(1.0,),
                          seed=0, block_length=None, remasking="low_confidence", nothing=False, bounds=(None,),
                          repeat_penalty=1.0, gap=0):
    """One JudgeRow per combination of steps x rule x temperature, the rules the thresholds, or
    (given instead) the entropy bounds; nothing: from_nothing's samples instead of continued openings."""
    rows = []
    rules = [(th, None) for th in thresholds] if list(bounds) == [None] else [(None, eb) for eb in bounds]
    for s, (th, eb), temp in itertools.product(steps, rules, temps):
        t0 = time.perf_counter()
        if nothing and model.config.causal:
            samples, passes = from_nothing(model, n, gen_length, seed, temperature=temp, repeat_penalty=repeat_penalty)
        else:
            draw = from_nothing if nothing else draw_samples
            samples, passes = draw(model, n, gen_length, seed, steps=s, threshold=th, entropy_bound=eb,
                                   temperature=temp, block_length=block_length, remasking=remasking,
                                   repeat_penalty=repeat_penalty, gap=gap if th is not None or eb is not None else 0)
        setting = {"steps": gen_length if s is None else s, "threshold": th, "entropy_bound": eb, "temperature": temp}
        rows.append(judge_row(model, judge, samples, setting, passes, time.perf_counter() - t0))
    return rows


def reference_row(model, judge, stories, gen_length):
    """Each held-out story's gen_length tokens after its first REFERENCE_PROMPT, scored as the samples are."""
    seqs = []
    for story in stories:
        ids = model.tokenizer.encode(story, add_special_tokens=False) + [boundary_id(model)]
        first = min(REFERENCE_PROMPT, len(ids) - 1)
        seqs.append(Seq(np.array(ids[:first + gen_length], np.int64), first))
    return judge_row(model, judge, seqs, {"steps": "held-out text", "threshold": None, "entropy_bound": None,
                                          "temperature": None})
