"""Token choice, for both decoders: from rows of logits to token ids.

The chain, in llama.cpp's order: repetition penalty -> top-k -> top-p -> min-p -> temperature ->
draw. Temperature 0 is greedy: argmax after the penalty, no randomness at all. A draw is Gumbel-max,
argmax(z / T + g) with g ~ Gumbel(0, 1) drawn in float64 for every row and candidate token, which
is a draw from softmax(z / T) (LLaDA notes that low-precision Gumbel noise hurts quality). Top-p
and min-p compare probabilities at temperature 1, as llama.cpp does (transformers applies the
temperature first, so the same top_p keeps fewer tokens there when T < 1).

Autoregressive decoding (generate.py) samples one row at a time through a Sampler, whose defaults
are llama.cpp's (temp 0.8, top-k 40, top-p 0.95, min-p 0.05, no repetition penalty); masked
diffusion (diffusion.py) calls penalize_near(), restrict() and gumbel_max() on many rows at once
(its penalty looks at the known tokens near each masked position, on both sides).
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..engine import cost, ledger
from ..errors import NonFiniteLogits, check_all, from_keywords, is_integer, is_number


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40             # keep the k most likely tokens; 0 = all
    top_p: float = 0.95         # keep the smallest set whose probability reaches p; 1 = all
    min_p: float = 0.05         # drop tokens less likely than min_p x the most likely; 0 = none
    repeat_penalty: float = 1.0  # >1 discourages the last repeat_last_n tokens (HF/llama.cpp rule)
    repeat_last_n: int = 64
    seed: Optional[int] = None

    def __post_init__(self):
        check_all([
            (is_number(self.temperature) and 0 <= self.temperature < float("inf"),
             f"temperature must be >= 0 and finite, got {self.temperature!r}"),
            (is_integer(self.top_k) and self.top_k >= 0, f"top_k must be an integer >= 0, got {self.top_k!r}"),
            (is_number(self.top_p) and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}"),
            (is_number(self.min_p) and 0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p!r}"),
            (is_number(self.repeat_penalty) and 0 < self.repeat_penalty < float("inf"),
             f"repeat_penalty must be > 0 and finite, got {self.repeat_penalty!r}"),
            (is_integer(self.repeat_last_n) and self.repeat_last_n >= 0,
             f"repeat_last_n must be an integer >= 0, got {self.repeat_last_n!r}"),
            (self.seed is None or is_integer(self.seed) and self.seed >= 0,
             f"seed must be an integer >= 0 (or None: a fresh one), got {self.seed!r}"),
        ])

    @classmethod
    def of(cls, **params):
        """SamplingParams from keywords, an unknown name being a UsageError that lists the known ones."""
        return from_keywords(cls, "sampling option", params)


class Sampler:
    """Picks the next token of one sequence, with its own random stream."""

    def __init__(self, params):
        self.p = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits, history):
        """logits [V] of the next position; history: token ids so far (prompt included)."""
        ledger.book_sampling(cost.sampling(1, len(logits)))
        if not np.isfinite(logits.max()):       # a NaN anywhere, or nothing but -inf: a broken model
            raise NonFiniteLogits("the model gave logits that are NaN or -inf everywhere: nothing to sample from "
                             "(a NaN or inf in its weights?)")
        logits = penalize(logits, history, self.p.repeat_penalty, self.p.repeat_last_n)
        if self.p.temperature == 0:
            return int(np.argmax(logits))
        ids, z = candidates(logits.astype(np.float64)[None], self.p.top_k, self.p.top_p, self.p.min_p)
        keep = np.isfinite(z[0])
        return int(ids[0, keep][gumbel_max(z[:1, keep], self.p.temperature, self.rng)[0]])


def penalize(logits, history, penalty, last_n):
    """Divides the positive logits of the last `last_n` tokens of history by the penalty and
    multiplies the negative ones, as HF and llama.cpp do. A new row; the caller's is untouched."""
    recent = history[-last_n:] if last_n else []
    if penalty == 1.0 or not recent:
        return logits
    logits = logits.copy()
    seen = np.unique(np.asarray(recent, dtype=np.int64))
    logits[seen] = _penalized(logits[seen], penalty)
    return logits


def _penalized(vals, penalty):
    """The rule on some logits (in their own type, as HF's), kept finite: a penalty of 1e-40 made a
    positive one inf and the softmax NaN; it stops at the type's largest number instead, a tie
    there. A zero stays zero (0 x a penalty beyond float32's range, inf there, is NaN)."""
    big = np.finfo(vals.dtype).max
    with np.errstate(all="ignore"):
        out = np.where(vals > 0, vals / penalty, vals * penalty)
    return np.clip(np.where(vals == 0, vals, out), -big, big)


def penalize_near(z, positions, canvas, known, penalty, last_n):
    """Masked diffusion's repetition penalty, in place on z [c, V] (float64 logits of the canvas
    positions `positions` [c]): row r gets penalize()'s rule for every distinct token at a known
    position of canvas [L] (known [L] bool: given or committed) within last_n positions of
    positions[r], on either side (a canvas is read both ways, and a word committed to the right
    repeats as much as one to the left). last_n = 0 or penalty = 1: off."""
    if penalty == 1.0 or not last_n:
        return z
    at = np.flatnonzero(known)                                           # [s] known positions
    r, k = np.nonzero(np.abs(positions[:, None] - at[None, :]) <= last_n)  # pairs (row, known one) near
    hit = np.zeros(z.shape, bool)
    hit[r, canvas[at[k]]] = True                                         # each token once per row
    z[hit] = _penalized(z[hit], penalty)
    return z


def candidates(z, top_k=0, top_p=1.0, min_p=0.0):
    """The tokens each row of z [c, V] (float64 logits) may still draw: (ids [c, k], z [c, k]), most
    likely first, with -inf where top-p or min-p drops a token. k = top_k (0 = all V)."""
    c, V = z.shape
    if 0 < top_k < V:
        ids = np.argpartition(-z, top_k - 1, axis=-1)[:, :top_k]       # [c, k] the k best, unordered
    else:
        ids = np.broadcast_to(np.arange(V), (c, V))
    zk = np.take_along_axis(z, ids, axis=-1)
    order = np.argsort(-zk, axis=-1, kind="stable")                   # [c, k] most likely first
    ids, zk = np.take_along_axis(ids, order, axis=-1), np.take_along_axis(zk, order, axis=-1)
    if top_p < 1 or min_p > 0:
        p = np.exp(zk - zk[:, :1])
        p /= p.sum(axis=-1, keepdims=True)                              # at temperature 1
        before = np.cumsum(p, axis=-1) - p                              # probability of the better ones
        keep = (before < top_p) & (p >= min_p * p[:, :1])               # the best always stays
        zk = np.where(keep, zk, -np.inf)
    return ids, zk


def restrict(z, top_k=0, top_p=1.0, min_p=0.0):
    """z [c, V] with every token outside candidates() set to -inf."""
    if not (0 < top_k < z.shape[-1] or top_p < 1 or min_p > 0):
        return z
    ids, zk = candidates(z, top_k, top_p, min_p)
    out = np.full(z.shape, -np.inf)
    np.put_along_axis(out, ids, zk, axis=-1)
    return out


def gumbel_max(z, temperature, rng):
    """One index per row of z [c, m] drawn from softmax(z / temperature): Gumbel-max with float64
    noise for every row and entry, so rows are drawn independently."""
    return np.argmax(z / temperature + rng.gumbel(size=z.shape), axis=-1)


def distribution(logits, params):
    """The probability [V] the Sampler draws each token with (0 for the tokens it drops), at the
    temperature (temperature 0: all on the argmax). For tests and inspection."""
    z = np.asarray(logits, np.float64)
    probs = np.zeros(z.shape)
    if params.temperature == 0:
        probs[np.argmax(z)] = 1.0
        return probs
    ids, zk = candidates(z[None], params.top_k, params.top_p, params.min_p)
    e = np.exp((zk[0] - zk[0, 0]) / params.temperature)
    probs[ids[0]] = e / e.sum()
    return probs
