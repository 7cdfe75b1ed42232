"""Exact speculative decoding for autoregressive models: draft k tokens cheaply, verify them in ONE pass.

Contract. Speculator.tokens(decoder, request) yields the request's new ids one by one, the same ids
Decoder.tokens yields (greedy, or sampled with the same seed) wherever the target's logits are the
same. A round:
  1. the drafter proposes up to k tokens d_1..d_k to follow request.history, a deterministic function
     of the history: NgramDrafter copies them from the history itself (prompt lookup), ModelDrafter
     runs a smaller causal model greedily, BlockDrafter one block-diffusion pass over k masks;
  2. ONE target pass of k+1 rows: the newest token h[-1] and the drafts, at positions pos..pos+k
     (pos = len(history) - 1) over the KV cache; row i holds the target's logits for the token after
     history + d_1..d_i (Decoder.verify);
  3. row by row, request.take(row i) draws the token as plain decoding draws it: its own Sampler, the
     repetition penalty over the history so far (the drafts taken included), top-k, top-p, min-p,
     temperature, a Gumbel-max draw from its own random stream. Equal to d_{i+1}: the draft is
     accepted and the next row is read; else the drawn token stands and the round ends. With all k
     accepted, row k gives one more. A round gives accepted + 1 tokens for one target pass.

Why this is exact. The drafts are a function of the text, so the drafter's proposal q is a point mass
on d. The rule of Leviathan et al. / Chen et al. (2023) accepts d with probability min(1, p(d)/q(d))
= p(d) and on a reject draws from norm(max(0, p - q)), which is p with d removed and renormalised.
Drawing y ~ p and accepting iff y == d is that rule: P(d) = p(d), and given a reject y is drawn from
p over the other tokens (llama.cpp samples a greedy draft's verification the same way). Here p is the
Sampler's own distribution (sampling.distribution: after penalty, top-k, top-p, min-p, at the
temperature), so every option applies to p exactly as in plain sampling; temperature 0 is argmax.
And since every emitted token is one draw of the request's Sampler on the same logits and history,
in the same order, its random stream is consumed as plain decoding consumes it: the same seed gives
the same tokens, not only the same distribution. "The same logits" is the one caveat: a pass of k+1
rows must compute each row as a pass of 1 does (kernels whose rounding changes with the rows of a
pass, csrc/matmul.c's GEMM from 16 rows, can flip a near-tie, as batching can).

The cache needs no rollback: the pass writes K/V at positions pos..pos+k; those after the accepted
ones are never read, since the next pass starts at the first position not accepted and overwrites
them, and a pass reads keys 0..its own last position only (Transformer.forward's kv_len). A drafter
model keeps its own cache the same way: the ids it holds (`ids`), trimmed to the longest prefix the
new history shares with them.

Costs (engine/ledger.py): a verify pass is booked as a pass of k+1 rows with the role "verify", a
drafter's passes with the role "draft", and each round's drafted and accepted counts
(ledger.book_draft); Counts says the same for --stats.
"""
import time

import numpy as np

from ..engine import ledger
from ..engine.masks import CAUSAL
from ..errors import UsageError, is_integer
from .diffusion import block_logits
from .generate import PREFILL_ROWS, Timings

DRAFT_MAX = 8       # drafts a round (llama.cpp's --draft-max is 16): prompt lookup drafts only as far as a match's
                    # continuation goes, so the bound matters where text repeats; a 9-row pass costs ~3 decode
                    # steps with today's kernels (bench/bench_speculative.py), 17 rows more; k = 4 and 8 ran
                    # alike on SmolLM2 summarising, and f32's GEMM changes its rounding from 16 rows
NGRAM_MAX = 4       # prompt lookup tries the last 4..3 tokens: 4 is llama.cpp's LLAMA_NGRAM_MAX; matches of 1
NGRAM_MIN = 3       # or 2 tokens draft mostly wrong continuations whose rows a verify pass pays for (SmolLM2
                    # summarising, drafts up to 8: min 1 took 14% of its drafts and ran at 0.72x plain decoding,
                    # min 2 49% and 1.26x, min 3 62% and 1.32x; bench/bench_speculative.py)


class Counts:
    """What speculation did in one generation: rounds (verify passes), tokens drafted, accepted, and
    the drafter's own passes; report() is the --stats line."""

    def __init__(self):
        self.rounds = self.drafted = self.accepted = self.emitted = self.draft_passes = 0

    def report(self):
        r = max(self.rounds, 1)
        rate = self.accepted / self.drafted if self.drafted else 0.0
        return (f"speculative: {self.rounds} verify passes, {self.drafted} drafted, {self.accepted} accepted "
                f"({rate:.0%}), {self.drafted - self.accepted} rejected; {self.accepted / r:.2f} accepted and "
                f"{self.emitted / r:.2f} tokens per verify pass; drafter: {self.draft_passes} passes")


class NgramDrafter:
    """Prompt lookup (llama.cpp's lookup decoding, transformers' prompt_lookup_num_tokens): the longest
    n-gram ending the history (n from ngram_max down to ngram_min) that also occurs earlier in it; the
    drafts are the tokens that followed its latest earlier occurrence (none without a match). No
    model, no passes."""

    def __init__(self, ngram_max=NGRAM_MAX, ngram_min=NGRAM_MIN):
        self.ngram_max, self.ngram_min, self.passes = ngram_max, ngram_min, 0

    def fresh(self):
        return self                     # it keeps nothing between rounds

    def draft(self, history, k):
        h = np.asarray(history, np.int64)
        last = len(h) - 1
        best, follow = 0, None
        for end in np.flatnonzero(h[:last] == h[last])[::-1].tolist():  # earlier copies of the last token, latest first
            n = 1
            while n < self.ngram_max and end - n >= 0 and h[end - n] == h[last - n]:
                n += 1
            if n > best:                                                 # longer; of equal ones the latest stays
                best, follow = n, end + 1
                if n == self.ngram_max:
                    break
        return h[follow:follow + k].tolist() if best >= self.ngram_min else []


class ModelDrafter:
    """A smaller causal model with the target's vocabulary: drafts k tokens greedily (argmax, no
    sampling options: a draft need only be a function of the text), one pass a token, on a KV cache
    of its own (n_ctx positions, at most its context; past them it drafts nothing)."""

    def __init__(self, transformer, n_ctx):
        self.t = transformer
        self.n_ctx = min(n_ctx, transformer.config.max_position_embeddings)
        self.state = transformer.state(self.n_ctx, rows=min(self.n_ctx, PREFILL_ROWS))   # [n_ctx] cache
        self.ids = []                   # the ids whose K/V the cache holds, from position 0
        self.passes = 0

    def fresh(self):
        """The same drafter with a cache of its own (a server's slot each)."""
        return ModelDrafter(self.t, self.n_ctx)

    def room(self, history, k):
        """Drafts that fit: the catch-up writes len(history) positions, each draft but the last one more."""
        return max(0, min(k, self.n_ctx - len(history) + 1))

    def draft(self, history, k):
        k = self.room(history, k)
        if k == 0:
            return []
        out = [int(np.argmax(self.catch_up(history)))]
        while len(out) < k:
            pos = len(history) + len(out) - 1
            out.append(int(np.argmax(self._forward([out[-1]], pos, CAUSAL)[0])))
            self.ids.append(out[-2])
        return out

    def catch_up(self, history):
        """Runs the ids of history its cache does not hold (at least the last, for its logits), in
        passes of the buffers' rows; the logits [V] of the token after history."""
        same = next((i for i, (a, b) in enumerate(zip(self.ids, history)) if a != b), min(len(self.ids), len(history)))
        same = min(same, len(history) - 1)
        rows = self.state.buf.n_max
        for i in range(same, len(history), rows):
            logits = self._forward(history[i:i + rows], i, CAUSAL)
        self.ids = list(history)
        return logits[0]

    def _forward(self, ids, start, mask):
        self.passes += 1
        with ledger.role("draft"):
            return self.t.forward(np.asarray([ids]), self.state, start, mask=mask, last_only=True)   # [1, V]


class BlockDrafter(ModelDrafter):
    """A block-diffusion model (BD3-LM / SDAR: the shipped stories5m-bd) as the drafter: its cache holds
    the text causally, as block decoding caches committed blocks, and ONE bidirectional pass over k
    masks after it (k at most its block size) proposes all k at once, each the argmax of its
    position's distribution (the mask id banned). Two drafter passes a round, whatever k."""

    def __init__(self, transformer, n_ctx, mask_id, block_size):
        super().__init__(transformer, n_ctx)
        self.mask_id, self.block_size = mask_id, block_size

    def fresh(self):
        return BlockDrafter(self.t, self.n_ctx, self.mask_id, self.block_size)

    def room(self, history, k):
        return max(0, min(k, self.block_size, self.n_ctx - len(history)))

    def draft(self, history, k):
        k = self.room(history, k)
        if k == 0:
            return []
        last = self.catch_up(history)[None]                              # [1, V]: the block's first position
        P = len(history)
        x = np.full((1, P + k), self.mask_id, np.int64)                  # only x[:, P:P+k] is read: the masks
        self.passes += 1
        with ledger.role("draft"):
            z = block_logits(self.t, x, self.state, P, P + k, last)[0]   # [k, V]
        z[:, self.mask_id] = -np.inf
        return [int(t) for t in np.argmax(z, axis=-1)]


class Speculator:
    """A drafter and the most drafts a round (draft_max >= 1), checked by Model.speculator; runs one
    generation at a time (a drafter model's cache is one sequence). tokens() is Decoder.tokens with
    every decode step a verify round; counts (a Counts) is the last generation's."""

    def __init__(self, drafter, draft_max=DRAFT_MAX, name="ngram"):
        self.drafter, self.draft_max, self.name = drafter, draft_max, name
        self.counts = Counts()

    def fresh(self):
        """A Speculator like this one for another sequence at the same time (its drafter's own cache)."""
        return Speculator(self.drafter.fresh(), self.draft_max, self.name)

    def drafts(self, request, room):
        """The drafts of the request's next round: at most draft_max, none past its last new token
        (the round's own token is one more) or the cache's `room` positions after its newest."""
        left = request.max_new_tokens - len(request.new) - 1
        k = min(self.draft_max, left, room)
        if k < 1:
            return []
        before = self.drafter.passes
        d = self.drafter.draft(request.history, k)
        self.counts.draft_passes += self.drafter.passes - before
        return d

    def take(self, request, logits, draft):
        """The round's tokens from its verify logits [k+1, V], as module docstring's step 3 takes them;
        returns (tokens, done)."""
        out, done = [], False
        for i, row in enumerate(logits):
            done = request.take(row)
            out.append(request.history[-1])
            if done or i == len(draft) or out[-1] != draft[i]:
                break
        accepted = sum(t == d for t, d in zip(out, draft))               # all but (maybe) the last: the loop stops there
        c = self.counts
        c.rounds, c.drafted, c.accepted, c.emitted = (c.rounds + 1, c.drafted + len(draft), c.accepted + accepted,
                                                      c.emitted + len(out))
        ledger.book_draft(len(draft), accepted)
        return out, done

    def tokens(self, decoder, request, timings=None, cached=0):
        """Yields the request's new ids (Decoder.tokens' contract), a verify round for each decode step;
        timings.gen_tokens counts tokens after the first, timings.speculation the rounds."""
        timings = timings or Timings()
        self.counts = timings.speculation = Counts()
        n_ctx = decoder.state.cache.k.shape[2]
        t0 = time.perf_counter()
        logits = decoder.prefill(request, cached)                        # [1, V]
        timings.prompt_tokens, timings.prompt_s = len(request.ids) - cached, time.perf_counter() - t0
        done = request.take(logits[-1])
        timings.first_token_s = time.perf_counter() - timings.start
        yield request.history[-1]
        while not done:
            t0 = time.perf_counter()
            room = min(n_ctx - len(request.history), decoder.state.buf.n_max - 1)
            draft = self.drafts(request, room)
            (logits,) = decoder.verify([request], [draft])               # [k+1, V]
            tokens, done = self.take(request, logits, draft)
            timings.gen_tokens += len(tokens)
            timings.gen_s += time.perf_counter() - t0
            yield from tokens



def check_same_vocabulary(target, drafter):
    """UsageError unless the drafter's ids are the target's tokens (a Model each): the drafter's
    ids are read as the target's own."""
    a, b = target.tokenizer, drafter.tokenizer
    if target.config.vocab_size != drafter.config.vocab_size or (a is not None and b is not None
                                                                  and list(a.tokens) != list(b.tokens)):
        raise UsageError(f"--draft {drafter.path}: its vocabulary ({drafter.config.vocab_size} ids) is not the "
                         f"one of {target.path} ({target.config.vocab_size} ids): a drafter needs the same tokens")

def ngram_speculator(ngram, draft_max):
    """The Speculator of prompt lookup; ngram: (shortest, longest) n-gram, None for a default."""
    lo, hi = (NGRAM_MIN if ngram[0] is None else ngram[0]), (NGRAM_MAX if ngram[1] is None else ngram[1])
    if not (is_integer(lo) and is_integer(hi) and 1 <= lo <= hi):
        raise UsageError(f"--draft-ngram-min and --draft-ngram-max must be integers with 1 <= min <= max, "
                         f"got {lo!r} and {hi!r}")
    return Speculator(NgramDrafter(hi, lo), draft_max, "ngram")


def model_speculator(transformer, mask_id, n_ctx, draft_max, name):
    """The Speculator of a drafter model (its Transformer, mask id and path; the vocabulary checked by
    Model.speculator): causal, or block diffusion; a masked-diffusion model without blocks is refused."""
    c = transformer.config
    if c.causal:
        return Speculator(ModelDrafter(transformer, n_ctx), draft_max, name)
    if c.block_size and mask_id is not None:
        return Speculator(BlockDrafter(transformer, n_ctx, mask_id, c.block_size), draft_max, name)
    raise UsageError(f"--draft {name}: a masked-diffusion model without blocks cannot draft a continuation; "
                     "give a causal or a block-diffusion model, or ngram")
