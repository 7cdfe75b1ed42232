"""Picks the next token from a row of logits.

The chain, in llama.cpp's order: repetition penalty -> top-k -> top-p -> min-p -> temperature ->
draw. Temperature 0 is greedy: argmax after the penalty, no randomness at all. Defaults are
llama.cpp's (temp 0.8, top-k 40, top-p 0.95, min-p 0.05, no repetition penalty).
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import cost, ledger
from .errors import UsageError


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
        checks = [
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (self.repeat_penalty > 0, f"repeat_penalty must be > 0, got {self.repeat_penalty}"),
            (self.repeat_last_n >= 0, f"repeat_last_n must be >= 0, got {self.repeat_last_n}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)


class Sampler:
    def __init__(self, params):
        self.p = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits, history):
        """logits [V] of the next position; history: token ids so far (prompt included)."""
        ledger.book_sampling(cost.sampling(1, len(logits)))
        logits = self.penalize(logits, history)
        if self.p.temperature == 0:
            return int(np.argmax(logits))
        ids, probs = self.truncate(logits)
        return int(ids[self.draw(probs)])

    def penalize(self, logits, history):
        """Divides positive logits by the penalty and multiplies negative ones, as HF and llama.cpp do."""
        recent = history[-self.p.repeat_last_n:] if self.p.repeat_last_n else []
        if self.p.repeat_penalty == 1.0 or not recent:
            return logits
        logits = logits.copy()
        seen = np.unique(np.asarray(recent, dtype=np.int64))
        vals = logits[seen]
        logits[seen] = np.where(vals > 0, vals / self.p.repeat_penalty, vals * self.p.repeat_penalty)
        return logits

    def truncate(self, logits):
        """The surviving token ids, most likely first, and their probabilities at the temperature."""
        k = self.p.top_k if 0 < self.p.top_k < len(logits) else len(logits)
        ids = np.argpartition(-logits, k - 1)[:k] if k < len(logits) else np.arange(len(logits))
        ids = ids[np.argsort(-logits[ids], kind="stable")]              # [k] best first
        z = logits[ids].astype(np.float64)
        p = np.exp(z - z[0]); p /= p.sum()                               # at temperature 1
        keep = int(np.searchsorted(np.cumsum(p), self.p.top_p) + 1)     # top-p: smallest prefix >= p
        keep = min(keep, int(np.sum(p >= self.p.min_p * p[0])))         # min-p relative to the best
        ids, z = ids[:max(keep, 1)], z[:max(keep, 1)]
        p = np.exp((z - z[0]) / self.p.temperature)
        return ids, p / p.sum()

    def draw(self, probs):
        return min(int(np.searchsorted(np.cumsum(probs), self.rng.random(), side="right")), len(probs) - 1)
