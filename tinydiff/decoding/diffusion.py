"""Masked-diffusion decoding (LLaDA, Dream, Fast-dLLM, EB-sampler, block diffusion): fill a canvas of masks.

The canvas is the prompt followed by gen_length mask tokens (infilling: given text with holes
anywhere). The holes are denoised in blocks, left to right (one block unless told), and a step
works on the current block only:
  1. one bidirectional forward pass gives the logits of the block's masked positions;
  2. _predict picks a token for each (argmax, or Gumbel-max at a temperature; after guidance, the
     banned ids and the repetition penalty) and scores how sure it is (the remasking);
  3. _count and _choose say how many and which of them to commit (the schedule, or an adaptive
     rule: threshold, factor, entropy_bound; _apart spaces them by gap); the rest stay masked.
A block ends once it is fully committed (at its last step at the latest); with eos="stop" a block
holding an EOS ends the run. Block diffusion (block_size) also caches the prompt and each finished
block causally and exactly, and a step recomputes its block alone.

A Denoiser is one run as a plain object: next_pass() names the forward pass it needs next (a Pass,
Transformer.forward's arguments, or a CanvasPass, canvas_logits'; None once it is over) and
take(logits) hands that pass's logits back and returns the Step it made. denoise_steps drives one
on a Transformer, denoise_together many at once, one forward a pass for all. Dream's shift (row i
predicts position i+1) is engine.transformer.canvas_rows'. What each option does, at length:
docs/diffusion.md.
"""
import math
import time
from dataclasses import dataclass, field, fields
from typing import Optional

import numpy as np

from ..engine import cost, ledger
from ..engine import kernels as K
from ..engine.masks import BIDIRECTIONAL, CAUSAL
from ..engine.transformer import canvas_rows
from ..errors import (
    NonFiniteLogits,
    UsageError,
    check_all,
    from_keywords,
    is_integer,
    is_number,
)
from .sampling import penalize_near, restrict

REMASKING = ("low_confidence", "margin", "entropy", "random")
SCHEDULES = ("uniform", "timestep")
CACHES = (None, "prefix", "dual")
EOS_MODES = ("stop", "suppress", "keep")
CHUNK_BYTES = 1 << 22   # float64 temporaries of the rows scored at once: 4 MiB, reused from the heap
                        # step after step (128 rows of a 126k vocabulary, 129 MB, were fresh pages every
                        # step: 0.3 s of page faults a step on LLaDA-8B's vocabulary)


# -- what comes out ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One denoising step (one forward pass)."""
    index: int              # 0, 1, ... over the whole run
    block: int              # the block it worked on
    canvas: np.ndarray      # [L] int64: the canvas after the step, prompt included (a copy)
    committed: np.ndarray   # [L] bool: True where the position is no longer masked
    new: np.ndarray         # positions committed by this step, ascending
    passes: int             # forward passes so far, this one included
    span: tuple             # (start, end): canvas positions this pass recomputed
    seconds: float          # wall time of the step (forward pass + choosing)


@dataclass(frozen=True)
class Denoised:
    """The end of a run: the last item denoise_steps yields."""
    ids: list               # the generated ids after EOS handling (with `fixed`: the whole canvas)
    canvas: np.ndarray      # [L] int64: the final canvas
    passes: int             # forward passes used
    passes_saved: int       # passes the skipped blocks were allotted (eos="stop")
    commits: list           # tokens committed by each pass
    seconds: float

    @property
    def tokens_per_pass(self):
        return sum(self.commits) / self.passes if self.passes else 0.0



# -- options -----------------------------------------------------------------------------------

def _option(default, flag, help, **argparse):
    """A field of Options and the command-line flag that sets it (cli.py builds its flags from these)."""
    return field(default=default, metadata=dict(flag=flag, help=help, **argparse))


@dataclass(frozen=True)
class Options:
    """Everything a denoising run can be told, declared once: the API takes these names as keywords,
    the CLI makes a flag of each field that names one. Each mistake is one UsageError line.
    docs/diffusion.md says what each does at length."""
    # the holes are denoised block_length at a time, left to right, in steps / blocks steps each (steps:
    # a multiple of the blocks, at most one a hole: Model._check_plan; with an adaptive rule, a cap)
    steps: Optional[int] = _option(None, "--steps", "denoising steps (default: one per token)", type=int)
    block_length: Optional[int] = _option(None, "--block", "block length, semi-autoregressive (default: one block)",
                                          type=int)
    # block diffusion (BD3-LM, SDAR, Fast-dLLM v2): the prompt and each finished block in the KV cache,
    # causally; a block attends to them and to itself, never to a later block
    block_size: Optional[int] = _option(None, "--block-size", "block diffusion: attention causal across blocks of "
                                        "N, bidirectional inside one, committed blocks cached exactly", type=int)
    # the score of a position's token, from softmax(logits) at temperature 1: p[token] (low_confidence),
    # top-1 minus top-2 (margin), -entropy (entropy), or uniform (random)
    remasking: str = _option("low_confidence", "--remask", "which positions a step commits first",
                             choices=REMASKING)
    temperature: float = 0.0        # 0: argmax; else Gumbel-max in float64, every position on its own
    top_k: int = 0                  # 0 = off; top_k and top_p restrict what a temperature can draw
    top_p: float = 1.0              # 1 = off
    repeat_penalty: float = 1.0     # 1 = off; the known tokens within repeat_last_n positions, either side
    repeat_last_n: int = 64
    # the adaptive rules (at most one): a step commits as many as the rule takes, at least one
    threshold: Optional[float] = _option(None, "--threshold", "commit every position this confident (Fast-dLLM)",
                                         type=float)
    # the largest n whose sorted confidences all have c_i >= 1 - factor / (i + 1)
    factor: Optional[float] = _option(None, "--factor", "Fast-dLLM's factor rule", type=float)
    # the k lowest entropies whose sum less their largest is <= entropy_bound
    entropy_bound: Optional[float] = _option(None, "--entropy-bound", "EB-sampler's entropy bound", type=float)
    # the rule's picks in its order, each kept if none kept before is within gap (DUS's dilated unmasking)
    gap: int = _option(0, "--gap", "positions one step commits are more than N apart (with --threshold, --factor "
                       "or --entropy-bound)", type=int)
    # without a rule: the block's tokens evenly over its steps (LLaDA), or Dream's timesteps 1 .. eps
    schedule: str = _option("uniform", "--schedule", "tokens per step", choices=SCHEDULES)
    eps: float = 1e-3
    alg_temp: Optional[float] = None   # Dream: draw the positions from softmax(score / alg_temp), not the top ones
    # a second canvas row with the prompt masked in the same pass: un + (cfg_scale + 1) * (cond - un)
    cfg_scale: float = _option(0.0, "--cfg", "classifier-free guidance scale (0: off)", type=float)
    # after a block's first, full step: recompute the block and after it (prefix) or the block (dual)
    cache: Optional[str] = _option(None, "--cache", "KV cache (Fast-dLLM)", choices=CACHES)
    # stop: a finished block holding an EOS ends the run, EOS after it; suppress: never chosen; keep
    eos: str = _option("stop", "--eos", "what EOS does (infill: suppress)", choices=EOS_MODES)
    seed: Optional[int] = None      # of the draws' generator (temperature, random, alg_temp); None: fresh

    def __post_init__(self):
        for name, allowed in (("remasking", REMASKING), ("schedule", SCHEDULES), ("cache", CACHES),
                              ("eos", EOS_MODES)):
            if getattr(self, name) not in allowed:
                names = ", ".join("None" if a is None else a for a in allowed)
                raise UsageError(f"{name} must be one of {names}; got {getattr(self, name)!r}")
        check_all([
            (self.steps is None or is_integer(self.steps) and self.steps >= 1,
             f"steps must be an integer >= 1, got {self.steps!r}"),
            (self.block_length is None or is_integer(self.block_length) and self.block_length >= 1,
             f"block_length must be an integer >= 1, got {self.block_length!r}"),
            (self.block_size is None or is_integer(self.block_size) and self.block_size >= 1,
             f"block_size must be an integer >= 1, got {self.block_size!r}"),
            (is_number(self.temperature) and 0 <= self.temperature < math.inf,
             f"temperature must be >= 0 and finite, got {self.temperature!r}"),
            (is_integer(self.top_k) and self.top_k >= 0, f"top_k must be an integer >= 0, got {self.top_k!r}"),
            (is_number(self.top_p) and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}"),
            (is_number(self.repeat_penalty) and 0 < self.repeat_penalty < math.inf,
             f"repeat_penalty must be > 0 and finite, got {self.repeat_penalty!r}"),
            (is_integer(self.repeat_last_n) and self.repeat_last_n >= 0,
             f"repeat_last_n must be an integer >= 0, got {self.repeat_last_n!r}"),
            (self.threshold is None or is_number(self.threshold) and 0 < self.threshold <= 1,
             f"threshold must be in (0, 1], got {self.threshold!r}"),
            (self.factor is None or is_number(self.factor) and 0 < self.factor < math.inf,
             f"factor must be > 0 and finite, got {self.factor!r}"),
            (self.entropy_bound is None or is_number(self.entropy_bound) and 0 <= self.entropy_bound < math.inf,
             f"entropy_bound must be >= 0 and finite, got {self.entropy_bound!r}"),
            (is_integer(self.gap) and self.gap >= 0, f"gap must be an integer >= 0, got {self.gap!r}"),
            (is_number(self.eps) and 0 < self.eps < 1, f"eps must be in (0, 1), got {self.eps!r}"),
            (self.alg_temp is None or is_number(self.alg_temp) and 0 <= self.alg_temp < math.inf,
             f"alg_temp must be >= 0 and finite, got {self.alg_temp!r}"),
            (is_number(self.cfg_scale) and 0 <= self.cfg_scale < math.inf,
             f"cfg_scale must be >= 0 and finite, got {self.cfg_scale!r}"),
            (self.seed is None or is_integer(self.seed) and self.seed >= 0,
             f"seed must be an integer >= 0, got {self.seed!r}"),
        ])
        rules = [n for n in ("threshold", "factor", "entropy_bound") if getattr(self, n) is not None]
        if len(rules) > 1:
            raise UsageError(f"give at most one of threshold, factor, entropy_bound; got {' and '.join(rules)}")
        if self.gap and not rules:
            raise UsageError("gap spaces the picks of an adaptive rule; give threshold, factor or entropy_bound "
                             "(a fixed count a step could not always be met)")
        if rules and self.schedule != "uniform":
            raise UsageError(f"schedule={self.schedule!r} fixes the count per step; "
                             f"it cannot be combined with {rules[0]}")
        if rules and self.alg_temp:
            raise UsageError(f"alg_temp draws a fixed count of positions; it cannot be combined with {rules[0]}")
        if self.block_size is not None and (self.block_length is not None or self.cache is not None):
            raise UsageError(f"block_size makes the blocks and caches them exactly; it cannot be combined with "
                             f"{'block_length' if self.block_length is not None else 'cache'}")
        if (self.threshold is not None or self.factor is not None) and self.remasking == "entropy":
            raise UsageError(f"{rules[0]} compares a confidence in [0, 1]; remasking='entropy' scores -entropy "
                             "(use entropy_bound, or remasking='low_confidence' or 'margin')")

    @classmethod
    def flagged(cls):
        """The fields the command line makes a flag of (their metadata name it)."""
        return [f for f in fields(cls) if "flag" in f.metadata]

    @classmethod
    def of(cls, **options):
        """Options from keywords, an unknown name being a UsageError that lists the known ones."""
        return from_keywords(cls, "denoising option", options)

    @property
    def adaptive(self):
        return self.threshold is not None or self.factor is not None or self.entropy_bound is not None


@dataclass(frozen=True)
class Plan:
    blocks: np.ndarray      # [num_blocks, block_length] canvas positions to denoise, left to right
    steps_per_block: int    # with an adaptive rule: the cap per block


def plan(holes, steps, block_length):
    """The hole positions in blocks of block_length (None: one block), steps (None: one per hole)
    shared among them; the caller has checked that they divide (Model._check_plan)."""
    n = len(holes)
    steps, block_length = n if steps is None else steps, n if block_length is None else block_length
    return Plan(np.asarray(holes, np.int64).reshape(n // block_length, block_length), steps // (n // block_length))


# -- the passes a run asks for -----------------------------------------------------------------

def to_the_end(items, on_step=None):
    """The Denoised that ends denoise_steps' items, calling on_step(step, canvas_ids,
    committed_mask) after each Step on the way."""
    for item in items:
        if isinstance(item, Denoised):
            return item
        if on_step is not None:
            on_step(item.index, item.canvas, item.committed)


@dataclass(frozen=True)
class Pass:
    """A forward pass a Denoiser asks for (Transformer.forward's arguments): ids [B, n] at positions
    start.., attending to cache slots 0..kv_len-1 (None: up to the last new one) under mask; the
    logits of each sequence's last row (last_only), of the rows out_rows (of the B*n), or all."""
    ids: np.ndarray
    start: int
    kv_len: Optional[int]
    mask: object
    last_only: bool = False
    out_rows: Optional[np.ndarray] = None

    def run(self, transformer, state):
        return transformer.forward(self.ids, state, self.start, self.kv_len, self.mask, self.last_only,
                                   out_rows=self.out_rows)

    def as_forward(self, config):
        """This pass as one forward, and how its logits become run()'s: as they are."""
        return self, _as_is

    def logit_rows(self):
        """The rows (of its B*n) whose logits it gives: out_rows, each sequence's last, or all."""
        B, n = self.ids.shape
        if self.out_rows is not None:
            return self.out_rows
        return np.arange(B) * n + n - 1 if self.last_only else np.arange(B * n)


@dataclass(frozen=True)
class CanvasPass:
    """A bidirectional pass for rows start..end-1 of canvas [B, L], the rest read from the cache
    (Transformer.canvas_logits, Dream's shift included); its logits are [B, end-start, V], or
    [B, len(want), V] for the positions want alone."""
    canvas: np.ndarray
    start: int
    end: int
    want: Optional[np.ndarray] = None

    def run(self, transformer, state):
        return transformer.canvas_logits(self.canvas, state, self.start, self.end, self.want)

    def as_forward(self, config):
        """The Pass canvas_logits runs, and how its logits become run()'s (canvas_rows, as there)."""
        first, out_rows, unshift = canvas_rows(config, len(self.canvas), self.start, self.end, self.want)
        ids = self.canvas[:, first:self.end]
        return Pass(ids, first, self.canvas.shape[1], BIDIRECTIONAL, out_rows=out_rows), unshift


def _as_is(logits):
    return logits


def _block_pass(config, x, lo, hi, last, want=None):
    """Block diffusion's pass over block lo..hi-1 of x [B, L], which sees the cached clean blocks
    before it and itself (kv_len = hi), never a later block, and how its logits become the
    distributions [B, hi-lo or len(want), V] (of positions want alone: the LM head on those rows):
    for a shifted model position lo's is `last`, the last row of the pass that cached the text before
    the block, so no clean position is recomputed."""
    first, out_rows, unshift = canvas_rows(config, len(x), lo, hi, want, left=last)
    return Pass(x[:, first:hi], first, hi, BIDIRECTIONAL, out_rows=out_rows), unshift


def block_logits(transformer, x, state, lo, hi, last):
    """_block_pass run on transformer and state: the distributions [B, hi-lo, V] of the block (the
    tests hold it to training's block objective)."""
    p, unshift = _block_pass(transformer.config, x, lo, hi, last)
    return unshift(p.run(transformer, state))


# -- the run -----------------------------------------------------------------------------------

class Denoiser:
    """One denoising run, a step at a time. next_pass() is the pass it needs next (None: the run is
    over, and `result` holds its Denoised); take(logits) hands that pass's logits back, as its run()
    gives them, and returns the Step they made (None after a pass that only fills block diffusion's
    cache). canvas [L] int64 has mask_id at every hole; given [L] bool marks the positions that never
    change; the output ids start at canvas position `start`; options is an Options whose steps and
    blocks fit the holes (Model checks them); stop_ids are the EOS ids."""

    def __init__(self, config, canvas, given, start, options, mask_id, stop_ids):
        o = self.options = options
        self.config, self.start, self.mask_id = config, start, mask_id
        self.plan = plan(np.flatnonzero(~given), o.steps, o.block_size or o.block_length)
        self.counts = _uniform_counts(self.plan.blocks.shape[1], self.plan.steps_per_block)  # every block's
        self.stop_ids = np.asarray(sorted(stop_ids), np.int64)
        self.banned = [mask_id] + (self.stop_ids.tolist() if o.eos == "suppress" else [])
        self.rng = np.random.default_rng(o.seed)
        self.x = canvas[None].copy()                                 # [B, L]: row 0 is the canvas
        if o.cfg_scale:                                              # row 1: nothing given, the unconditional input
            self.x = np.stack([canvas, np.where(given, mask_id, canvas)])
        self.rows = len(self.x)                                      # the cache rows it needs
        self.exact = o.block_size is not None                        # block diffusion: an exact KV cache
        self.b, self.s = 0, 0                                        # the next step: block b's step s
        self.caching = (0, start) if self.exact else None            # positions to cache, causally, first
        self.last = None                                             # [B, V]: that pass's last row
        self.asked = None                                            # the step asked for, until taken
        self.passes, self.commits, self.saved, self.t_run = 0, [], 0, time.perf_counter()
        self.result = None

    def next_pass(self):
        """The Pass or CanvasPass to run next, or None once the run is over."""
        if self.caching is not None:                                 # the text before block b, into the cache
            lo, hi = self.caching
            return Pass(self.x[:, lo:hi], lo, None, CAUSAL, last_only=True)
        if self.b == len(self.plan.blocks):
            if self.result is None:
                self.result = self._denoised()
            return None
        block, x, t_step = self.plan.blocks[self.b], self.x, time.perf_counter()
        lo, hi = int(block[0]), int(block[-1]) + 1
        span = (lo, hi) if self.exact else _span(self.options.cache, self.s, lo, hi, x.shape[1])
        todo = block[x[0, block] == self.mask_id]                    # [m] masked positions of the block
        if self.exact:
            p, unshift = _block_pass(self.config, x, lo, hi, self.last, todo)
        else:                                                        # the rows that can change
            p, unshift = CanvasPass(x, *span, want=todo), _as_is
        self.asked = (todo, span, unshift, t_step)
        return p

    def take(self, logits):
        """The logits of the pass next_pass() gave: the Step they made, or None for a cache pass."""
        self.passes += 1
        if self.caching is not None:
            self.last, self.caching = logits, None                   # [B, V] for the next block's first row
            return None
        todo, span, unshift, t_step = self.asked
        o, x = self.options, self.x
        tokens, conf, entropy = _predict(unshift(logits), o, self.rng, self.banned, todo, x[0], x[0] != self.mask_id)
        count = _count(o, self.s, self.plan.steps_per_block, self.counts, len(todo))
        chosen = _choose(o, conf, entropy, count, self.rng)
        if o.gap and count is None:
            chosen = _apart(chosen, todo, o.gap, x.shape[1])
        pick = todo[chosen]
        x[:, pick] = tokens[chosen]
        self.commits.append(len(pick))
        step = Step(len(self.commits) - 1, self.b, x[0].copy(), x[0] != self.mask_id, np.sort(pick), self.passes,
                    span, time.perf_counter() - t_step)
        self.s += 1
        if len(pick) == len(todo) or self.s == self.plan.steps_per_block:
            self._end_block()
        return step

    def _end_block(self):
        """Block b is done: with eos="stop" an EOS in it ends the run; block diffusion caches it for
        the next (the last block, which nothing reads after, is not)."""
        blocks, b = self.plan.blocks, self.b
        self.b, self.s = b + 1, 0
        if self.options.eos == "stop" and _stop_at_eos(self.x, blocks[b], blocks, self.stop_ids):
            self.saved = (len(blocks) - b - 1) * self.plan.steps_per_block
            self.b = len(blocks)
        elif self.exact and b + 1 < len(blocks):
            self.caching = (int(blocks[b][0]), int(blocks[b][-1]) + 1)

    def _denoised(self):
        x, out = self.x, self.x[0, self.start:]
        if self.options.eos == "stop":
            hits = np.flatnonzero(np.isin(out, self.stop_ids))
            out = out[:hits[0] + 1] if len(hits) else out
        return Denoised(out.tolist(), x[0].copy(), self.passes, self.saved, self.commits,
                        time.perf_counter() - self.t_run)


def denoise_steps(transformer, canvas, given, start, options, mask_id, stop_ids):
    """Denoises canvas [L] (as a Denoiser takes it) step by step on transformer; yields a Step per
    forward pass, then the Denoised, whose ids start at canvas position `start`."""
    d = Denoiser(transformer.config, canvas, given, start, options, mask_id, stop_ids)
    state = transformer.state(len(canvas), batch=d.rows)
    while (p := d.next_pass()) is not None:
        step = _take(transformer, d, p.run(transformer, state))
        if step is not None:
            yield step
    yield d.result


def denoise_together(transformer, jobs, mask_id, stop_ids):
    """Denoises several canvases at once, each pass one forward for all that ask for the same mask
    (Transformer.forward with ragged sequences: canvases of any lengths, each at its own positions
    and cache rows, the LM head on the rows each asks for), so the weights are read once a step for
    all of them. jobs: [(canvas, given, start, options)], each as denoise_steps takes them (its own
    steps, seed, ...). Yields (i, item) for job i's Steps and its Denoised, each equal to what the
    job gives alone."""
    runs = [Denoiser(transformer.config, c, g, s, o, mask_id, stop_ids) for c, g, s, o in jobs]
    row0 = np.cumsum([0] + [d.rows for d in runs])                   # job i's cache rows are row0[i]..row0[i+1]-1
    state = transformer.state(max(len(c) for c, *_ in jobs), batch=int(row0[-1]))
    replies, live = {}, list(range(len(jobs)))
    while live:
        asks = {}
        for i in list(live):                                         # each job takes its logits, asks again or ends
            if i in replies and (step := _take(transformer, runs[i], replies.pop(i))) is not None:
                yield i, step
            p = runs[i].next_pass()
            if p is None:
                yield i, runs[i].result
                live.remove(i)
            else:
                asks[i] = p.as_forward(transformer.config)
        replies = _forward_together(transformer, state, asks, row0)


def _forward_together(transformer, state, asks, row0):
    """{i: the logits job i asked for, as its pass's run() gives them} from one forward for each
    mask asked for. asks: {i: (Pass, how to shape its logits)}."""
    groups, replies = {}, {}
    for i, (p, _) in asks.items():
        groups.setdefault(p.mask, []).append(i)
    for mask, group in groups.items():
        seqs, starts, kv_lens, slots, out, base = [], [], [], [], [], 0
        for i in group:
            p = asks[i][0]
            B, n = p.ids.shape
            seqs += list(p.ids)
            starts += [p.start] * B
            kv_lens += [p.start + n if p.kv_len is None else p.kv_len] * B
            slots += range(row0[i], row0[i + 1])
            out.append(base + p.logit_rows())
            base += p.ids.size
        logits = transformer.forward(seqs, state, starts, kv_lens, mask, slots=slots, out_rows=np.concatenate(out))
        at = 0
        for i, o in zip(group, out):
            replies[i], at = asks[i][1](logits[at:at + len(o)]), at + len(o)
    return replies


def _take(transformer, d, logits):
    """d.take(logits) with its sampler's kernels (softmax_stats, gumbel_max) on the model's pool, as
    its passes are: on the default pool they woke that pool's worker, asleep since the last step,
    once a step, and had three threads on two cores."""
    with transformer.pool:
        return d.take(logits)


def _span(cache, s, lo, hi, L):
    """Canvas positions a pass recomputes: all of them without a cache and at a block's first step
    (that full pass refreshes every K/V slot); then the block and after it (prefix) or the block (dual)."""
    if cache is None or s == 0:
        return 0, L
    return (lo, L) if cache == "prefix" else (lo, hi)


def _uniform_counts(n, steps):
    """n tokens over `steps` steps as evenly as possible, the remainder on the first steps (LLaDA)."""
    return [n // steps + (s < n % steps) for s in range(steps)]


def _count(o, s, steps, counts, masked):
    """How many of the block's `masked` positions step s commits; None = the adaptive rule decides."""
    if s == steps - 1:
        return masked                                # a block's last step completes it
    if o.adaptive:
        return None
    if o.schedule == "uniform":
        return counts[s]
    t = np.linspace(1, o.eps, steps + 1)             # Dream: from t to s = t[s+1], 1 - s/t of the masks
    return int(masked * (1 - t[s + 1] / t[s]))


def _stop_at_eos(x, block, blocks, stop_ids):
    """eos="stop": if the finished block holds an EOS, every hole after the first one becomes that EOS."""
    hits = block[np.isin(x[0, block], stop_ids)]
    if not len(hits):
        return False
    later = blocks.ravel()[blocks.ravel() > hits[0]]
    x[:, later] = x[0, hits[0]]
    return True


# -- choosing tokens and positions -------------------------------------------------------------

def cfg_logits(cond, un, scale):
    """Classifier-free guidance as in LLaDA: un + (scale + 1) * (cond - un)."""
    return un + (scale + 1) * (cond - un)


def _predict(logits, o, rng, banned, todo, canvas, known):
    """logits [B, m, V] of the m masked positions todo [m] -> token [m], confidence [m], entropy [m]
    (float64; the entropies NaN unless the rule or the remasking reads them). canvas [L] and known [L]
    (not masked) for the repetition penalty. The softmax at temperature 1 is summed up by one C pass
    over each row (K.softmax_stats): p is never written out whole."""
    B, m, V = logits.shape
    ledger.book_sampling(cost.sampling(B * m, V))
    tokens, conf, entropy = np.empty(m, np.int64), np.empty(m), np.full(m, np.nan)
    need_h = o.entropy_bound is not None or o.remasking == "entropy"
    chunk = max(1, CHUNK_BYTES // (8 * V))
    z_rows = np.empty((min(m, chunk), V))                            # a chunk's logits in float64, reused
    u_rows = np.empty((min(m, chunk), V)) if o.temperature else None  # and its uniforms (Gumbel-max)
    for i in range(0, m, chunk):
        rows = slice(i, i + chunk)
        z = z_rows[:min(m - i, chunk)]                               # [c, V]
        np.copyto(z, logits[0, rows])
        if B == 2:
            z = cfg_logits(z, logits[1, rows].astype(np.float64), o.cfg_scale)
        z[:, banned] = -np.inf
        penalize_near(z, todo[rows], canvas, known, o.repeat_penalty, o.repeat_last_n)
        top, first, total, h = K.softmax_stats(z, entropy=need_h)    # p = e^(z - top) / total  [c] each
        if not (np.isfinite(top).all() and np.isfinite(total).all()):  # a NaN in a row, or nothing but -inf
            raise NonFiniteLogits("the model gave logits that are NaN or -inf everywhere at a masked position: "
                             "nothing to choose from (a NaN or inf in its weights?)")
        tok = first if _greedy(top, o.temperature) else K.gumbel_max(restrict(z, o.top_k, o.top_p), o.temperature,
                                                            rng.random(out=u_rows[:len(z)]))  # rng.gumbel's
        if need_h:
            entropy[rows] = np.log(total) - h / total                # -sum p log p
        conf[rows] = _confidence(o.remasking, z, top, total, tok, entropy[rows], rng)
        tokens[rows] = tok
    return tokens, conf, entropy


def _confidence(remasking, z, top, total, tok, h, rng):
    """Higher = commit sooner, from p = e^(z - top) / total: z [c, V], top total tok h [c]."""
    if remasking == "low_confidence":
        return np.exp(z[np.arange(len(tok)), tok] - top) / total     # p[tok]
    if remasking == "margin":
        second = np.partition(z, z.shape[-1] - 2, axis=-1)[:, -2]    # [c] the second largest z
        return (1.0 - np.exp(second - top)) / total                  # top-1 minus top-2 probability
    if remasking == "entropy":
        return -h
    return rng.random(len(tok))


def _greedy(scores, temperature):
    """Temperature 0 (or None: alg_temp's off), or one so small that scores / temperature overflow
    (1e-310: inf for most, and argmax(inf + noise) the first of them, not the best): the limit, the
    argmax, either way."""
    with np.errstate(over="ignore"):
        return not temperature or not np.isfinite(np.abs(scores).max() / temperature)


def _choose(o, conf, entropy, count, rng):
    """Indices (into the m candidates) to commit: `count` of them, or as many as the adaptive rule takes."""
    m = len(conf)
    if count is not None:
        # alg_temp: Gumbel top-k, i.e. draws from softmax(conf / alg_temp) without replacement
        keys = conf if _greedy(conf, o.alg_temp) else conf / o.alg_temp + rng.gumbel(size=m)
        return np.argsort(-keys, kind="stable")[:count]                         # ties: leftmost first
    if o.entropy_bound is not None:
        order = np.argsort(entropy, kind="stable")
        e = entropy[order]
        ok = np.cumsum(e) - e <= o.entropy_bound        # sum of the k lowest minus the largest of them
    else:
        order = np.argsort(-conf, kind="stable")
        c = conf[order]
        ok = c >= (o.threshold if o.threshold is not None else 1 - o.factor / (np.arange(1, m + 1) + 1))
    leading = m if ok.all() else int(np.argmin(ok))
    return order[:max(1, leading)]                      # at least one: a block never stalls


def _apart(chosen, positions, gap, L):
    """The indices of `chosen` (in order of preference) whose canvas positions (positions[i]) are more
    than gap from every one kept before them; the first is always kept."""
    gap = min(gap, L)                                               # wider keeps one a step all the same
    blocked, keep = np.zeros(L + 2 * gap, bool), []                 # blocked[p + gap]: position p is too near
    for i in chosen:
        p = int(positions[i]) + gap
        if not blocked[p]:
            keep.append(i)
            blocked[p - gap:p + gap + 1] = True
    return np.asarray(keep, np.int64)
