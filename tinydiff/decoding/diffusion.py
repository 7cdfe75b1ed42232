"""Masked-diffusion decoding (LLaDA, Dream, Fast-dLLM, EB-sampler): fill a canvas of masks.

The canvas is the prompt followed by gen_length mask tokens. Each step is one bidirectional forward
pass: it predicts a token for every masked position, commits some of them, and leaves the rest
masked for the next step. Blocks make it semi-autoregressive: the masked positions are taken
block_length at a time, left to right, and a step only ever commits positions of the current block.
block_length=1 with one step per block is plain left-to-right decoding again. denoise_steps runs a
Transformer on a canvas and Options that model.py has checked: the denoiser asks for each pass
(Pass, CanvasPass) and is sent its logits, so one loop serves a single canvas (denoise_steps) and
many at once, one forward for all (denoise_together).

How many positions a step commits:
  schedule="uniform"   the block's tokens spread evenly over its steps, the remainder on the first
                       steps (LLaDA's get_num_transfer_tokens): 10 tokens in 4 steps -> 3, 3, 2, 2.
  schedule="timestep"  Dream: with t = linspace(1, eps, S+1), step s commits
                       int(masked_now * (1 - t[s+1] / t[s])) and the block's last step all the rest
                       (so a step may commit nothing, as in Dream).
  threshold            Fast-dLLM: every masked position of the block with confidence >= threshold,
                       and always at least the most confident one, so a block never stalls.
  factor               Fast-dLLM's factor rule: with c_1 >= c_2 >= ... the sorted confidences, the
                       largest n with c_i >= 1 - factor / (i + 1) for every i <= n (at least 1).
                       Fast-dLLM's code commits the whole block when only the last one fails; here
                       that position stays masked, as the rule says.
  entropy_bound        EB-sampler (as in DiffusionGemma): positions by entropy, lowest first; the
                       largest k with sum(their entropies) - max(their entropy) <= entropy_bound
                       (at least 1).
  With threshold/factor/entropy_bound the number of steps is adaptive: `steps` is a cap (per block),
  and a block that reaches its cap commits everything left at its last step.
  gap                  with an adaptive rule: the positions one step commits are more than `gap`
                       apart. The rule's picks are taken in its order (the most confident first)
                       and each is kept only if no position kept before it is within `gap`; a later
                       step takes the others if they still qualify. Neighbours depend on each other
                       most, and drawing them in one step draws each from its marginal as if the
                       other were unknown (each likely, the pair not): DUS
                       (Luxembourg, Permuter & Nachmani 2025, dilated unmasking) keeps the tokens of
                       one step apart for this reason; here it filters Fast-dLLM's picks.

Which positions (remasking), scored from p = softmax(logits) at temperature 1 in float64, taken
after guidance, after the banned tokens are removed and after the repetition penalty, before
top-k/top-p (those only limit what can be drawn); each row's max, sum of e^(z - max) (and entropy
sum) come from one C pass (kernels.softmax_stats, e^ within 2 ulp), p is never written out whole.
This is LLaDA's choice for low_confidence (Dream scores the tempered distribution):
  low_confidence  p[chosen token]     margin  top-1 minus top-2 probability
  entropy         -entropy(p): the least uncertain position first        random  uniform
alg_temp > 0 (Dream) draws the positions from softmax(confidence / alg_temp) without replacement
(Gumbel top-k) instead of taking the top ones.

Which token: temperature 0 is argmax, exactly and deterministically. temperature > 0 draws every
position independently by Gumbel-max, argmax(logits / T + g) with g ~ Gumbel(0, 1) in float64 for
every position and token (LLaDA notes that low-precision Gumbel noise hurts quality); top-k and
top-p first restrict the token set, in tinydiff.decoding.sampling's order. g is made in C
(kernels.gumbel_max) from the uniforms NumPy's rng.gumbel would make it from, by its formula: the
draws are sampling.gumbel_max's with the same rng, in a third of its time (choosing 119 positions
of a 126k vocabulary: 80 ms against 290 on 2 cores). The mask token is never chosen (a committed
mask would look masked again); with eos="suppress" neither are the EOS ids. repeat_penalty > 1 is
HF's and llama.cpp's rule (positive logits divided by it, negative ones multiplied) on the distinct
tokens already on the canvas (given or committed) within repeat_last_n positions of the masked one,
on either side: a canvas has no "last n tokens", and a word committed ahead repeats as much as one
behind (sampling.penalize_near).

cfg_scale > 0 is classifier-free guidance: a second canvas row with the prompt replaced by masks
runs in the same forward pass (batch of 2), and logits = un + (cfg_scale + 1) * (cond - un).

block_size (block diffusion: BD3-LM, SDAR, Fast-dLLM v2): the prompt is prefilled causally into the
KV cache; the generated positions are taken block_size at a time, each block starting all-masked and
denoised by the rules above while it attends to the cached positions before it and to itself only
(never to a later block); once committed, one more pass writes its clean K/V into the cache, causally
(the clean text is read as an AR model reads it, as `tinydiff train --objective block` trains it;
the last block, which nothing reads after, skips it), and no committed position is ever
recomputed. With block_size 1 and one step per block, a model whose row i predicts position i+1
decodes exactly as greedy autoregressive decoding does.

cache (Fast-dLLM): None recomputes the whole canvas every step. "prefix": a block's first step is a
full pass (it refreshes every K/V slot), later steps recompute the block and everything after it and
read the K/V before the block from the cache. "dual": later steps recompute only the block. Both are
approximations for a bidirectional model: the cached K/V of the other positions are those of the
block's first step, not of the current canvas. A block's first step equals the uncached pass exactly.

eos: "stop" - once a block is fully committed and holds an EOS id, every position after the first
EOS becomes EOS and the remaining blocks are skipped (passes_saved counts the steps they were
allotted: exact for the fixed schedules, the cap for the adaptive rules); "suppress" - EOS logits
are -inf; "keep" - no special treatment. Text is returned up to the first EOS.

steps > gen_length is an error, not clamped: a step must commit at least one token on average.
steps must be a multiple of the number of blocks (each block gets steps / blocks), as in LLaDA.
(Model._check_plan holds both.)

Infilling: the canvas is given whole, the holes anywhere; only the holes are denoised, every given
token stays fixed, and "the prompt" for guidance is everything given. Blocks are then groups of
block_length holes, left to right.
"""
import math
import re
import time
from collections import namedtuple
from dataclasses import dataclass, field, fields
from typing import Optional

import numpy as np

from ..engine import cost, ledger
from ..engine import kernels as K
from ..engine.masks import BIDIRECTIONAL, CAUSAL
from ..engine.transformer import canvas_pass, canvas_rows, source_rows
from ..errors import (
    ModelError,
    UsageError,
    check_all,
    from_keywords,
    is_integer,
    is_number,
)
from ..formats.files import show
from .sampling import penalize_near, restrict

REMASKING = ("low_confidence", "margin", "entropy", "random")
SCHEDULES = ("uniform", "timestep")
CACHES = (None, "prefix", "dual")
EOS_MODES = ("stop", "suppress", "keep")
MASK_NAMES = ("<|mask|>", "[MASK]", "<mask>", "<|mdm_mask|>")
HOLE = re.compile(r"\[MASK(?:\*(\d+))?\]")      # [MASK] = one token, [MASK*N] = N tokens
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
    the CLI makes a flag of each field that names one. Each mistake is one UsageError line."""
    steps: Optional[int] = _option(None, "--steps", "denoising steps (default: one per token)", type=int)
    block_length: Optional[int] = _option(None, "--block", "block length, semi-autoregressive (default: one block)",
                                          type=int)
    block_size: Optional[int] = _option(None, "--block-size", "block diffusion: attention causal across blocks of "
                                        "N, bidirectional inside one, committed blocks cached exactly", type=int)
    remasking: str = _option("low_confidence", "--remask", "which positions a step commits first",
                             choices=REMASKING)
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repeat_penalty: float = 1.0     # 1 = off; the known tokens within repeat_last_n positions, either side
    repeat_last_n: int = 64
    threshold: Optional[float] = _option(None, "--threshold", "commit every position this confident (Fast-dLLM)",
                                         type=float)
    factor: Optional[float] = _option(None, "--factor", "Fast-dLLM's factor rule", type=float)
    entropy_bound: Optional[float] = _option(None, "--entropy-bound", "EB-sampler's entropy bound", type=float)
    gap: int = _option(0, "--gap", "positions one step commits are more than N apart (with --threshold, --factor "
                       "or --entropy-bound)", type=int)
    schedule: str = _option("uniform", "--schedule", "tokens per step", choices=SCHEDULES)
    eps: float = 1e-3
    alg_temp: Optional[float] = None
    cfg_scale: float = _option(0.0, "--cfg", "classifier-free guidance scale (0: off)", type=float)
    cache: Optional[str] = _option(None, "--cache", "KV cache (Fast-dLLM)", choices=CACHES)
    eos: str = _option("stop", "--eos", "what EOS does (infill: suppress)", choices=EOS_MODES)
    seed: Optional[int] = None

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


# -- the mask token and the canvas -------------------------------------------------------------

def to_the_end(items, on_step=None):
    """The Denoised that ends denoise_steps' items, calling on_step(step, canvas_ids,
    committed_mask) after each Step on the way."""
    for item in items:
        if isinstance(item, Denoised):
            return item
        if on_step is not None:
            on_step(item.index, item.canvas, item.committed)


def mask_token_id(config, tokenizer):
    """config.json's mask_token_id, else a special token with a usual mask name, else None."""
    if config.mask_token_id is not None:
        return config.mask_token_id
    for name in MASK_NAMES if tokenizer is not None else ():
        i = tokenizer.token_to_id(name)
        if i is not None and i in getattr(tokenizer, "special_ids", ()):
            return i
    return None


# -- the run -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pass:
    """A forward pass a denoiser asks for (Transformer.forward's arguments): ids [B, n] at positions
    start.., attending to cache slots 0..kv_len-1 (None: up to the last new one) under mask; the
    logits of each sequence's last row (last_only), of the rows out_rows (of the B*n), or all."""
    ids: np.ndarray
    start: int
    kv_len: Optional[int]
    mask: object
    last_only: bool = False
    out_rows: Optional[np.ndarray] = None


@dataclass(frozen=True)
class CanvasPass:
    """A bidirectional pass for rows start..end-1 of canvas [B, L], the rest read from the cache
    (Transformer.canvas_logits, Dream's shift included); its reply is logits [B, end-start, V], or
    [B, len(want), V] for the positions want alone."""
    canvas: np.ndarray
    start: int
    end: int
    want: Optional[np.ndarray] = None


def denoise_steps(transformer, canvas, given, start, options, mask_id, stop_ids):
    """Denoises canvas [L] (int64, mask_id at every hole; given [L] bool: the positions that never
    change) step by step; yields a Step per forward pass, then a Denoised whose ids start at
    canvas position `start`. options: an Options whose steps and block_length fit the holes
    (Model checks them). stop_ids: the EOS ids."""
    run = _denoise(transformer.config, canvas, given, start, options, mask_id, stop_ids)
    state = transformer.state(len(canvas), batch=1 + bool(options.cfg_scale))
    reply = None
    while True:                                                      # run each pass the denoiser asks for
        item = _send(transformer, run, reply)
        if isinstance(item, Pass):
            reply = transformer.forward(item.ids, state, item.start, item.kv_len, item.mask, item.last_only,
                                        out_rows=item.out_rows)
            continue
        if isinstance(item, CanvasPass):
            reply = transformer.canvas_logits(item.canvas, state, item.start, item.end, item.want)
            continue
        reply = None
        yield item
        if isinstance(item, Denoised):
            return


def denoise_together(transformer, jobs, mask_id, stop_ids):
    """Denoises several canvases at once, each pass one forward for all that ask for the same mask
    (Transformer.forward with ragged sequences: canvases of any lengths, each at its own positions
    and cache rows, the LM head on the rows each asks for), so the weights are read once a step for
    all of them. jobs: [(canvas, given, start, options)], each as denoise_steps takes them (its own
    steps, seed, ...). Yields (i, item) for job i's Steps and its Denoised, each equal to what the
    job gives alone."""
    cfg = transformer.config
    runs = [_denoise(cfg, c, g, s, o, mask_id, stop_ids) for c, g, s, o in jobs]
    rows = [1 + bool(o.cfg_scale) for *_, o in jobs]                 # cache rows of each job (guidance: 2)
    row0 = np.cumsum([0] + rows)                                     # job i's cache rows are row0[i]..row0[i+1]-1
    state = transformer.state(max(len(c) for c, *_ in jobs), batch=int(row0[-1]))
    replies, live = [None] * len(jobs), list(range(len(jobs)))
    while live:
        asks = {}
        for i in list(live):                                         # each job to its next pass, or its end
            while not isinstance(item := _send(transformer, runs[i], replies[i]), (Pass, CanvasPass)):
                replies[i] = None
                yield i, item
                if isinstance(item, Denoised):
                    live.remove(i)
                    break
            else:
                asks[i] = _as_forward(cfg, item)
        groups = {}
        for i, f in asks.items():
            groups.setdefault(f.mask, []).append(i)
        for mask, group in groups.items():                           # one forward for every job of a mask
            seqs, starts, kv_lens, slots, out, base = [], [], [], [], [], 0
            for i in group:
                f = asks[i]
                seqs += list(f.ids)
                starts += [f.start] * rows[i]
                kv_lens += [f.start + f.ids.shape[1] if f.kv_len is None else f.kv_len] * rows[i]
                slots += range(row0[i], row0[i + 1])
                out.append(base + f.out_rows)
                base += f.ids.size
            logits = transformer.forward(seqs, state, starts, kv_lens, mask, slots=slots, out_rows=np.concatenate(out))
            at = 0
            for i, o in zip(group, out):
                replies[i], at = asks[i].shape(logits[at:at + len(o)]), at + len(o)


def _send(transformer, run, reply):
    """The denoiser run's next item for reply, its sampler's kernels (softmax_stats, gumbel_max) on
    the model's pool as its passes are: on the default pool they woke that pool's worker, asleep
    since the last step, once a step, and had three threads on two cores. Never held across a yield."""
    with transformer.pool:
        return run.send(reply)


_Forward = namedtuple("_Forward", "ids start kv_len mask out_rows shape")


def _as_forward(config, ask):
    """A Pass or CanvasPass as a forward of its own: ids, start, kv_len, mask, the rows (of its
    B*n) whose logits it needs, and how to give them back as it would get them alone."""
    if isinstance(ask, Pass):
        B, n = ask.ids.shape
        rows = ask.out_rows if ask.out_rows is not None else \
            (np.arange(B) * n + n - 1 if ask.last_only else np.arange(B * n))
        return _Forward(ask.ids, ask.start, ask.kv_len, ask.mask, rows, lambda logits: logits)
    B, L = ask.canvas.shape
    first, end = canvas_pass(config, ask.start, ask.end)
    n = end - first
    if ask.want is not None:
        rows = (np.arange(B)[:, None] * n + source_rows(config, ask.want, first)).reshape(-1)
        return _Forward(ask.canvas[:, first:end], first, L, BIDIRECTIONAL, rows,
                        lambda logits: logits.reshape(B, len(ask.want), -1))
    return _Forward(ask.canvas[:, first:end], first, L, BIDIRECTIONAL, np.arange(B * n),
                    lambda logits: canvas_rows(config, logits.reshape(B, n, -1), first, ask.start))


def _denoise(config, canvas, given, start, o, mask_id, stop_ids):
    """The denoiser: yields a Pass or CanvasPass whenever it needs logits (and is sent them back,
    shaped as Transformer.forward or canvas_logits gives them for its rows), a Step after each step,
    then the Denoised."""
    plan_ = plan(np.flatnonzero(~given), o.steps, o.block_size or o.block_length)
    stop_ids = np.asarray(sorted(stop_ids), np.int64)
    L = len(canvas)
    banned = [mask_id] + (stop_ids.tolist() if o.eos == "suppress" else [])
    rng = np.random.default_rng(o.seed)
    x = canvas[None].copy()                                          # [B, L]: row 0 is the canvas
    if o.cfg_scale:                                                  # row 1: nothing given, the unconditional input
        x = np.stack([canvas, np.where(given, mask_id, canvas)])
    exact = o.block_size is not None                                 # block diffusion: an exact KV cache
    passes, commits, saved, t_run = 0, [], 0, time.perf_counter()
    if exact:                                                        # the prompt, causally, into the cache
        last = yield Pass(x[:, :start], 0, None, CAUSAL, last_only=True)   # [B, V] its last row
        passes += 1

    for b, block in enumerate(plan_.blocks):
        lo, hi = int(block[0]), int(block[-1]) + 1
        counts = _uniform_counts(len(block), plan_.steps_per_block)
        for s in range(plan_.steps_per_block):
            t_step = time.perf_counter()
            span = (lo, hi) if exact else _span(o.cache, s, lo, hi, L)
            todo = block[x[0, block] == mask_id]                     # [m] masked positions of the block
            logits = (yield from _block_logits(config, x, lo, hi, last, todo)) if exact \
                else (yield CanvasPass(x, *span, want=todo))         # [B, m, V]: only the rows that can change
            passes += 1
            tokens, conf, entropy = _predict(logits, o, rng, banned, todo, x[0], x[0] != mask_id)
            count = _count(o, s, plan_.steps_per_block, counts, len(todo))
            chosen = _choose(o, conf, entropy, count, rng)
            if o.gap and count is None:
                chosen = _apart(chosen, todo, o.gap, L)
            pick = todo[chosen]
            x[:, pick] = tokens[chosen]
            commits.append(len(pick))
            yield Step(len(commits) - 1, b, x[0].copy(), x[0] != mask_id, np.sort(pick), passes, span,
                       time.perf_counter() - t_step)
            if len(pick) == len(todo):
                break
        if o.eos == "stop" and _stop_at_eos(x, block, plan_.blocks, stop_ids):
            saved = (len(plan_.blocks) - b - 1) * plan_.steps_per_block
            break
        if exact and b + 1 < len(plan_.blocks):                      # the clean block's K/V, once, causally,
            last = yield Pass(x[:, lo:hi], lo, None, CAUSAL, last_only=True)  # for the next
            passes += 1

    out = x[0, start:]
    if o.eos == "stop":
        hits = np.flatnonzero(np.isin(out, stop_ids))
        out = out[:hits[0] + 1] if len(hits) else out
    yield Denoised(out.tolist(), x[0].copy(), passes, saved, commits, time.perf_counter() - t_run)


def block_logits(transformer, x, state, lo, hi, last):
    """_block_logits with its pass run on transformer and state (the evaluator's and tests' use)."""
    run = _block_logits(transformer.config, x, lo, hi, last)
    p = next(run)
    try:
        run.send(transformer.forward(p.ids, state, p.start, p.kv_len, p.mask, p.last_only))
    except StopIteration as done:
        return done.value


def _block_logits(config, x, lo, hi, last, want=None):
    """Block diffusion: the distributions [B, hi-lo, V] of block lo..hi-1 (of its positions `want`
    alone: [B, len(want), V], the LM head run on those rows only), which sees the cached clean
    blocks before it and itself (kv_len = hi), never a later block. For a model whose row i
    predicts position i+1 (Dream's shift, an AR model read as one) position lo's comes from `last`,
    the last row of the pass that cached the clean prefix, so no clean position is recomputed."""
    B = len(x)
    if want is not None:
        src = np.asarray(want) - lo - config.shifted_logits          # rows of the block pass; -1: from `last`
        inner = src[src >= 0]
        rows = (yield Pass(x[:, lo:hi], lo, hi, BIDIRECTIONAL,
                           out_rows=(np.arange(B)[:, None] * (hi - lo) + inner).reshape(-1)))
        rows = rows.reshape(B, len(inner), config.vocab_size)
        return np.concatenate([last[:, None], rows], axis=1) if len(inner) < len(src) else rows
    rows = (yield Pass(x[:, lo:hi], lo, hi, BIDIRECTIONAL)).reshape(B, hi - lo, -1)
    if config.shifted_logits:
        rows = np.concatenate([last[:, None], rows[:, :-1]], axis=1)
    return rows


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
            raise ModelError("the model gave logits that are NaN or -inf everywhere at a masked position: "
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


# -- infilling text ---------------------------------------------------------------------------

def parse_holes(tokenizer, text, mask_id, n_ctx):
    """Text with [MASK]/[MASK*N] holes -> (ids, where the text's ids start, where they end).

    [MASK] is one token, [MASK*N] is N tokens. The text between holes is tokenized piece by piece and
    never changes, except that one space right before a hole is left to the hole: byte-level BPE
    spells a word with its leading space (" time"), so "a [MASK]" asks for a word after "a", not for
    a word after "a ". The tokenizer's mask token written literally in the text is a hole too."""
    if not isinstance(text, str) or not text:
        raise UsageError("the text to infill is empty")
    bad = re.search(r"\[MASK\*(?!\d+\])[^\]]*\]?", text)
    if bad:
        raise UsageError(f"malformed hole {show(bad.group(0))} at character {bad.start()}: write [MASK] or "
                         "[MASK*N]")
    prefix, suffix = list(tokenizer.prefix_ids), list(tokenizer.suffix_ids)
    ids, at = list(prefix), 0
    for hole in HOLE.finditer(text):
        digits = (hole.group(1) or "1").lstrip("0") or "0"
        n = int(digits) if len(digits) <= 9 else n_ctx + 1        # (Python refuses to read 4300 digits)
        if n == 0:
            raise UsageError(f"empty hole {hole.group(0)} at character {hole.start()}: N must be >= 1")
        if len(ids) + n > n_ctx:
            raise UsageError(f"the holes and text exceed the context of {n_ctx} positions")
        before = text[at:hole.start()]
        before = before[:-1] if before.endswith(" ") and not before.endswith("  ") else before
        ids += tokenizer.encode(before, add_special_tokens=False) + [mask_id] * n
        at = hole.end()
    ids += tokenizer.encode(text[at:], add_special_tokens=False)
    if mask_id not in ids:
        raise UsageError("the text has no hole to fill: mark them with [MASK] or [MASK*N]")
    return ids + suffix, len(prefix), len(ids)
