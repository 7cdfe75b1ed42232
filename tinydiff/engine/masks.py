"""Attention masks as data: which keys a query may see, in two integers.

AttentionMask(block=b): a query at absolute position p sees the keys j < min(t, (p // b + 1) * b),
t the keys there are. Positions are absolute: block k holds positions k*b .. k*b + b - 1, and the
first query of a call sits at position q_pos0 (the one after the cached ones when decoding).

  b = 1   causal (CAUSAL): position p sees keys 0..p, autoregressive decoding.
  b = 0   bidirectional (BIDIRECTIONAL; None means the same): every query sees all t keys, masked
          diffusion.
  b >= 2  block-causal (block_causal(b)): bidirectional inside a block of b positions, causal
          across blocks, block diffusion.

AttentionMask(block, window=w), w > 0 (mask.windowed(w)): besides, the query at p sees only the keys
j > p - w, the last w positions up to its own (Hugging Face's sliding_window: kv_idx > q_idx - w,
AND the block mask; Gemma's and Qwen's sliding-window layers); w = 0, no window.

The C attention (td_attention_f32: block, window, q_pos0), tinydiff.engine.reference.attention and
tinydiff.engine.kernels.attention (mask=, q_pos0=), cost.forward and the cost ledger all take this one
description. dense() spells it out as a bool [n, t] array (tests, the NumPy reference); pairs()
counts the (query, key) pairs it lets through in closed form, cheap enough to book every call.
"""
import dataclasses
import numbers

import numpy as np

from ..errors import UsageError

__all__ = ["AttentionMask", "CAUSAL", "BIDIRECTIONAL", "block_causal"]


@dataclasses.dataclass(frozen=True)
class AttentionMask:
    block: int       # b: 1 causal, 0 (None becomes 0) bidirectional, >= 2 block-causal
    window: int = 0  # w: query p sees only keys j > p - w; 0 (None becomes 0): no window

    def __post_init__(self):
        for field, what in (("block", "1 causal, 0 bidirectional"), ("window", "0 none")):
            given = getattr(self, field)
            x = 0 if given is None else given
            if isinstance(x, bool) or not isinstance(x, numbers.Integral) or not 0 <= x < 2**62:   # (C's int64)
                raise UsageError(f"attention mask: {field} must be a whole number >= 0 ({what}), got {given!r}")
            object.__setattr__(self, field, int(x))

    def __str__(self):
        kind = {0: "bidirectional", 1: "causal"}.get(self.block, f"block-causal({self.block})")
        return f"{kind}, window {self.window}" if self.window else kind

    def windowed(self, window):
        """The same block mask with a sliding window of window keys (0: none)."""
        return dataclasses.replace(self, window=window)

    def dense(self, n, t, q_pos0=0):
        """bool [n, t]: True where query i (at position q_pos0 + i) may see key j."""
        p, j = q_pos0 + np.arange(n)[:, None], np.arange(t)[None, :]
        seen = j < self._ends(p, t)
        return seen & (j > p - self.window) if self.window else seen

    def pairs(self, n, t, q_pos0=0):
        """The (query, key) pairs dense(n, t, q_pos0) lets through, dense(...).sum(), in O(1): the
        keys before each query's end, less those before its start (the window's)."""
        return self._ends_sum(n, t, q_pos0) - self._starts_sum(q_pos0 + n, t) + self._starts_sum(q_pos0, t)

    def _ends_sum(self, n, t, q_pos0):
        """sum of the ends min(t, (p // b + 1) * b) over positions q_pos0 .. q_pos0 + n - 1"""
        b = self.block
        if b == 0:
            return n * t
        # positions below cap see a whole number of blocks, (p // b + 1) * b < t; the rest see all t
        cap = max(q_pos0, (-(-t // b) - 1) * b)
        u = min(q_pos0 + n, cap)
        return self._block_sum(u) - self._block_sum(q_pos0) + (q_pos0 + n - u) * t

    def _starts_sum(self, x, t):
        """sum of the starts min(t, max(0, p - w + 1)) (the keys the window hides) over positions
        0..x-1: max(0, p - w + 1) sums to T(x - w), T(k) = 1 + ... + k, and the part of it past t
        to T(x - w - t). (Every start is at most its end: p - w + 1 <= p.)"""
        w = self.window
        if w == 0:
            return 0
        tri = lambda k: k * (k + 1) // 2 if k > 0 else 0   # noqa: E731
        return tri(x - w) - tri(x - w - t)

    def _ends(self, p, t):
        """The keys before positions p's ends: min(t, (p // b + 1) * b), t when bidirectional."""
        b = self.block
        return np.full_like(p, t) if b == 0 else np.minimum(t, (p // b + 1) * b)

    def _block_sum(self, x):
        """sum of (p // b + 1) * b over positions 0..x-1: x = q*b + r is q whole blocks and r more."""
        b = self.block
        q, r = divmod(x, b)
        return b * (b * q * (q + 1) // 2 + r * (q + 1))


CAUSAL = AttentionMask(1)
BIDIRECTIONAL = AttentionMask(0)


def block_causal(b):
    """Bidirectional inside blocks of b positions, causal across them (b = 1: CAUSAL)."""
    return AttentionMask(b)
