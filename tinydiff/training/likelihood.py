"""How well a model predicts held-out text (`tinydiff eval --data`): nats per token and bits per byte.

Takes a loaded Model and the stories or paragraphs to score (sequences.py says how they become
scored sequences); guarantees a Likelihood: the total nats, the tokens and bytes they are over, and
the standard errors. The autoregressive NLL is exact, the masked-diffusion one an upper bound.

Masked diffusion: the ELBO, -log p(x) <= E_t [ (1/t) sum over masked i of -log p(x_i | x masked at
rate t) ], estimated as LLaDA does (its Eq. 6; RADD): instead of masking each token with probability
t, mask exactly l tokens, l uniform on 1..m (m = tokens scored), weight m/l. Both forms have the same
expectation (integrating the binomial over t gives weight 1/l to every l-subset in both), but the
count form never draws l = 0 or a huge 1/t with few masks, so its variance is lower. The K copies of
a sequence take stratified counts l_j = ceil(t_j m), t_j = (j + u)/K with one u ~ U(0, 1] per
window: each l_j is then exactly uniform on 1..m over u and j, and together they cover the range
evenly. All K copies go through one batched bidirectional pass. The bound conditions on the
sequence length (the canvas has exactly the story's positions, as in LLaDA's evaluation), which
leaves out -log p(length): about log(n_ctx) ~ 6 nats per story at most, ~1% of a 250-token story.

Block diffusion (a model whose config.json names a block_size): the block ELBO, the sum over blocks
of b positions (from the first scored one, as decoding takes them) of the bound above for one block
given the clean text before it, each block with its own stratified counts; one causal pass caches
every clean position, then one small pass per block (last to first, so a block's pass overwrites
only slots no earlier block reads).

Two standard errors: `se`, of nats/token over stories (the text is a sample, and the MC noise is in
it), and for the ELBO `mc_se`, the Monte Carlo part alone (from the spread of the K draws, treated
as independent, which overstates the noise of stratified draws: an upper bound). More copies K
shrink mc_se; more stories shrink se.

--bigram TRAIN...: the baseline a model must beat. An interpolated Kneser-Ney bigram (discount 0.75,
Chen & Goodman) counted on the training files, tokenized by the model's tokenizer, with stories
joined by EOT as in training; it scores the same tokens and bytes as the model would.
"""
import dataclasses
import math
import time

import numpy as np

from ..engine.masks import BIDIRECTIONAL
from .sequences import (
    ar_seq_nll,
    boundary_id,
    mask_token,
    story_bytes,
    story_seqs,
    token_nll,
    windows,
)


@dataclasses.dataclass
class Likelihood:
    bound: str                  # "exact NLL" (autoregressive), "ELBO" (masked diffusion: >= NLL), "block ELBO (...)"
    stories: int
    tokens: int
    bytes: int
    nats: float                 # total over the scored tokens
    se: float                   # standard error of nats_per_token over stories (nan for one story)
    mc_se: float | None = None          # ELBO: the Monte Carlo part of se (an upper bound)
    samples_per_seq: int | None = None
    seconds: float = 0.0

    @property
    def nats_per_token(self):
        return self.nats / self.tokens

    @property
    def bits_per_byte(self):
        return self.nats / math.log(2) / self.bytes

    def to_bits_per_byte(self, nats_per_token):
        return nats_per_token * self.tokens / math.log(2) / self.bytes

    def as_dict(self):
        return {**dataclasses.asdict(self), "nats_per_token": self.nats_per_token,
                "bits_per_byte": self.bits_per_byte, "bits_per_byte_se": self.to_bits_per_byte(self.se)}


def ratio_se(nats, tokens):
    """Standard error of sum(nats) / sum(tokens) over independent stories (the ratio estimator's
    linearisation: the residuals nats_s - r tokens_s)."""
    s = len(nats)
    if s < 2:
        return float("nan")
    r = nats.sum() / tokens.sum()
    return float(np.sqrt(((nats - r * tokens) ** 2).sum() * s / (s - 1)) / tokens.sum())


def ar_likelihood(model, stories, limit=None, unit="story"):
    """The exact NLL of stories[:limit] (the rest of the list only lends the first one its context);
    unit: story_seqs'."""
    t0 = time.perf_counter()
    nats, tokens = ar_seq_nll(model, story_seqs(model, stories, limit, unit))
    return Likelihood("exact NLL", len(tokens), int(tokens.sum()), story_bytes(stories[:limit], unit),
                      float(nats.sum()), ratio_se(nats, tokens), seconds=time.perf_counter() - t0)


def masked_losses(transformer, canvas, first, k, mask_id, rng):
    """[K] float64: K draws of the ELBO of canvas[first:] given canvas[:first], one batched pass.

    Copy j masks exactly l_j = ceil(t_j m) of the m scored positions, t_j = (j + u)/K, and weighs
    their summed -log p by m / l_j (see the module docstring)."""
    L, m = len(canvas), len(canvas) - first
    t = (np.arange(k) + (1.0 - rng.random())) / k                   # [K] in (0, 1], u ~ U(0, 1]
    counts = np.ceil(t * m).astype(np.int64)                         # [K] in 1..m
    masked = rng.random((k, m)).argsort(axis=1) < counts[:, None]    # [K, m]: a uniform l_j-subset per row
    x = np.tile(canvas, (k, 1))                                      # [K, L]
    x[:, first:][masked] = mask_id
    logits = transformer.canvas_logits(x, transformer.state(L, k))   # [K, L, V]
    rows, cols = np.nonzero(masked)                                  # [M] each: copy, scored position
    nll = token_nll(logits[rows, first + cols], canvas[first + cols])
    return np.bincount(rows, weights=nll, minlength=k) * m / counts


def block_masked_losses(transformer, canvas, first, k, mask_id, rng, b):
    """[K] float64: K draws of the block ELBO of canvas[first:] given canvas[:first] (block
    diffusion, blocks of b from `first`, as decoding takes them): the sum over blocks of the
    masked-diffusion bound of a block given the clean text before it, each block's mask counts
    drawn as masked_losses draws them.

    One causal pass caches the clean K/V of every position; then the blocks, last to first: a
    block's pass overwrites its own slots, which no earlier block reads."""
    L = len(canvas)
    x = np.tile(canvas, (k, 1))                                      # [K, L]
    state = transformer.state(L, k)
    clean = transformer.forward(x, state, 0).reshape(k, L, -1)       # [K, L, V], causal
    total = np.zeros(k)
    for lo in reversed(range(first, L, b)):
        hi = min(lo + b, L)
        m = hi - lo
        t = (np.arange(k) + (1.0 - rng.random())) / k
        counts = np.ceil(t * m).astype(np.int64)                     # [K] in 1..m
        masked = rng.random((k, m)).argsort(axis=1) < counts[:, None]
        xb = x[:, lo:hi].copy()
        xb[masked] = mask_id
        rows = transformer.forward(xb, state, lo, kv_len=hi, mask=BIDIRECTIONAL).reshape(k, m, -1)
        if transformer.config.shifted_logits:                        # row i predicts position i+1
            rows = np.concatenate([clean[:, lo - 1:lo], rows[:, :-1]], axis=1)
        r, c = np.nonzero(masked)
        nll = token_nll(rows[r, c], canvas[lo + c])
        total += np.bincount(r, weights=nll, minlength=k) * m / counts
    return total


def mdm_likelihood(model, stories, k=8, seed=0, limit=None, unit="story"):
    """The ELBO of stories[:limit] (a block model's: the block ELBO); K mask draws per window of
    each story; unit: story_seqs'."""
    t0 = time.perf_counter()
    mask_id = mask_token(model)
    rng = np.random.default_rng(seed)
    ctx, block = model.config.max_position_embeddings, model.config.block_size
    seqs = story_seqs(model, stories, limit, unit)
    nats, var = np.zeros(len(seqs)), np.zeros(len(seqs))
    for i, s in enumerate(seqs):
        for a, f, e in windows(len(s.ids), s.first, ctx):
            losses = (block_masked_losses(model.transformer, s.ids[a:e], f - a, k, mask_id, rng, block)
                      if block else masked_losses(model.transformer, s.ids[a:e], f - a, k, mask_id, rng))
            nats[i] += losses.mean()
            var[i] += losses.var(ddof=1) / k if k > 1 else np.nan
    tokens = np.array([len(s.ids) - s.first for s in seqs])
    mc_se = float(np.sqrt(var.sum()) / tokens.sum())
    bound = f"block ELBO (blocks of {block})" if block else "ELBO"
    return Likelihood(bound, len(seqs), int(tokens.sum()), story_bytes(stories[:limit], unit), float(nats.sum()),
                      ratio_se(nats, tokens), mc_se, k, time.perf_counter() - t0)


def kneser_ney_bigram(train, V, discount=0.75):
    """p(w | v) for arrays of contexts v and next tokens w, from a token stream train [N]:
        p(w | v) = max(c(v,w) - D, 0) / c(v) + D N1+(v .) / c(v) * p_cont(w),
        p_cont(w) = (N1+(. w) + 1) / (N1+(. .) + V)   (distinct left contexts; +1 so unseen w > 0);
    a context v never seen in training falls back to p_cont. Each row sums to 1 over w."""
    pairs, counts = np.unique(train[:-1] * V + train[1:], return_counts=True)   # [P] sorted, [P]
    c_v = np.bincount(train[:-1], minlength=V).astype(np.float64)               # [V] c(v)
    n1_v = np.bincount(pairs // V, minlength=V).astype(np.float64)              # [V] N1+(v .)
    p_cont = (np.bincount(pairs % V, minlength=V) + 1.0) / (len(pairs) + V)     # [V]

    def prob(v, w):
        at = np.minimum(np.searchsorted(pairs, v * V + w), len(pairs) - 1)
        c_vw = np.where(pairs[at] == v * V + w, counts[at], 0)
        seen = c_v[v] > 0
        cv = np.where(seen, c_v[v], 1.0)
        return np.where(seen, np.maximum(c_vw - discount, 0) / cv + discount * n1_v[v] / cv * p_cont[w], p_cont[w])
    return prob


def bigram_likelihood(model, train_stories, stories, limit=None, unit="story"):
    """The Kneser-Ney bigram's NLL of stories[:limit], counted on train_stories joined by EOT as in
    training, scored like ar_likelihood (same tokens, same bytes)."""
    t0 = time.perf_counter()
    eot = boundary_id(model)
    train = np.array([eot] + [i for st in train_stories for i in
                              model.tokenizer.encode(st, add_special_tokens=False) + [eot]], np.int64)
    prob = kneser_ney_bigram(train, model.config.vocab_size)
    seqs = story_seqs(model, stories, limit, unit)
    nats = np.array([-np.log(prob(s.ids[s.first - 1:-1], s.ids[s.first:])).sum() for s in seqs])
    tokens = np.array([len(s.ids) - s.first for s in seqs])
    return Likelihood("bigram NLL", len(seqs), int(tokens.sum()), story_bytes(stories[:limit], unit),
                      float(nats.sum()), ratio_se(nats, tokens), seconds=time.perf_counter() - t0)
