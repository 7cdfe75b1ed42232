"""Attention masks as data: which keys a query may see, in one integer.

AttentionMask(block=b): a query at absolute position p sees the keys j < min(t, (p // b + 1) * b),
t the keys there are. Positions are absolute: block k holds positions k*b .. k*b + b - 1, and the
first query of a call sits at position q_pos0 (the one after the cached ones when decoding).

  b = 1   causal (CAUSAL): position p sees keys 0..p, autoregressive decoding.
  b = 0   bidirectional (BIDIRECTIONAL; None means the same): every query sees all t keys, masked
          diffusion.
  b >= 2  block-causal (block_causal(b)): bidirectional inside a block of b positions, causal
          across blocks, block diffusion.

The C attention (td_attention_f32: block, q_pos0), tinydiff.reference.attention and
tinydiff.kernels.attention (mask=, q_pos0=), cost.forward and the cost ledger all take this one
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
    block: int  # b: 1 causal, 0 (None becomes 0) bidirectional, >= 2 block-causal

    def __post_init__(self):
        b = 0 if self.block is None else self.block
        if isinstance(b, bool) or not isinstance(b, numbers.Integral) or not 0 <= b < 2**62:   # (C's int64)
            raise UsageError(f"attention mask: block must be a whole number >= 0 (1 causal, 0 bidirectional), "
                             f"got {self.block!r}")
        object.__setattr__(self, "block", int(b))

    def __str__(self):
        return {0: "bidirectional", 1: "causal"}.get(self.block, f"block-causal({self.block})")

    def dense(self, n, t, q_pos0=0):
        """bool [n, t]: True where query i (at position q_pos0 + i) may see key j."""
        return np.arange(t)[None, :] < self._ends(q_pos0 + np.arange(n), t)[:, None]

    def pairs(self, n, t, q_pos0=0):
        """The (query, key) pairs dense(n, t, q_pos0) lets through, dense(...).sum(), in O(1)."""
        b = self.block
        if b == 0:
            return n * t
        # positions below cap see a whole number of blocks, (p // b + 1) * b < t; the rest see all t
        cap = max(q_pos0, (-(-t // b) - 1) * b)
        u = min(q_pos0 + n, cap)
        return self._block_sum(u) - self._block_sum(q_pos0) + (q_pos0 + n - u) * t

    def _ends(self, p, t):
        """The keys positions p see: min(t, (p // b + 1) * b), t when bidirectional."""
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
