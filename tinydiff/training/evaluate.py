"""`tinydiff eval`: how well a model predicts held-out text, and how good a diffusion model's samples are.

    tinydiff eval -m AR_DIR  --data valid.txt                 # exact NLL: nats/token, bits/byte
    tinydiff eval -m MDM_DIR --data valid.txt --samples-per-seq 8   # ELBO (upper bound on the NLL)
    tinydiff eval -m MDM_DIR --judge AR_DIR --samples 32 --steps 32,64,128 --threshold none,0.9
    tinydiff eval -m Q8_DIR  --against F32_DIR --data valid.txt       # KL(ref || model), top-1 agreement
    tinydiff eval -m AR_DIR  --bigram train.txt --data valid.txt      # the baseline: a bigram, same tokens
    tinydiff eval -m MDM_DIR --infill 0.15,0.5 --data valid.txt       # holes given back exactly

What is scored. The data file is read into stories by tinydiff.training.corpus (the trainer's
reader, mojibake repaired), and --max-stories takes the first N of them. --unit paragraph (the
default, as published tiny-model evaluations score): each paragraph of those stories is one
sequence, [EOT] paragraph, the EOT given, no EOT scored after it and no byte counted for one (a
paragraph is no end of text). --unit story: training packs shuffled stories as `story
<|endoftext|> story <|endoftext|> ...`, every sequence starting at a story start, so a story is
scored as the sequence

    [last PREV_CONTEXT tokens of the story before it in the file] [EOT] story [EOT]

where the tail and the first EOT are given, and every story token and the trailing EOT are scored
(the model pays for knowing where the story ends). The tail is there because an EOT at position 0
never occurs in training: given [EOT] alone, the 5.3M AR model trained here spent 6.9 nats on a
story's first token and 1.4% more on the whole text; after 64 tokens of the previous story, 0.45
nats, and within 0.1% of the whole previous story as context. The previous story is unrelated text (training
shuffles them), so the story is still scored on its own. The first story's tail comes from the
file's last story; a file of one story gets the EOT alone.
Bytes: the story's UTF-8 bytes plus one per story for its end marker (the separator any plain-text
model would have to predict), so bits per byte = total nats / ln 2 / bytes, and an AR model and a
diffusion model scored on the same file share both denominators (tokens and bytes).

Longer than the context (n_ctx positions): windows of at most n_ctx positions, each scoring the
tokens after the previous window's end given the n_ctx/2 tokens before them (a sliding window of
stride n_ctx/2, as transformers' perplexity guide does); the first window starts at the sequence start.

Autoregressive models: the exact NLL, windows of similar length batched into one causal pass.

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

--infill RATES: in each paragraph of the first --max-stories stories (default 300), that share of
its tokens (at least one) hidden at seeded places; a bidirectional model fills them by
Model.infill (one token a step, greedy), a causal one left to right from what is left of each
hole; the accuracy is the share of holes given back the very token that was there.

--against REF_DIR: on the held-out text, the mean KL(ref || model) of the next-token distributions
and the top-1 agreement (the two argmaxes equal), as llama.cpp's perplexity --kl-divergence reports
them; both autoregressive, same tokenizer, all in float64.

--bigram TRAIN...: the baseline a model must beat. An interpolated Kneser-Ney bigram (discount 0.75,
Chen & Goodman) counted on the training files, tokenized by the model's tokenizer, with stories
joined by EOT as in training; it scores the same tokens and bytes as the model would.
"""
import dataclasses
import itertools
import json
import math
import time
from typing import Optional

import numpy as np

from ..decoding import diffusion
from ..engine.masks import BIDIRECTIONAL
from ..errors import ModelError, UsageError
from . import corpus

BATCH_POSITIONS = 4096      # positions per batched causal pass: logits stay 4096 x V float32
PREV_CONTEXT = 64           # tokens of the previous story given before a story's EOT (docstring)
UNITS = ("paragraph", "story")
PLURAL = {"paragraph": "paragraphs", "story": "stories"}
MDM_DEFAULT_STORIES = 300   # x ~250 tokens x K=8 copies: ~1.5 minutes on 2 cores
ELBO_DRAWS = 8              # mask draws per story, K (--samples-per-seq)
REFERENCE_PROMPT = 4        # tokens of a held-out story given in the reference row: an opening's length
OPENINGS = ("Once upon a time", "One day", "Lily and Ben", "There was a little", "Tom had a big",
            "Once there was a", "Mia wanted to", "The sun was")


# ---------------------------------------------------------------------------------------------
# Arguments

def _list_of(kind, allow_none=False):
    """argparse type for a comma list: '16,32' -> [16, 32]; 'none' -> None where allowed."""
    def parse(text):
        return [None if allow_none and item.strip().lower() == "none" else kind(item) for item in text.split(",")]
    parse.__name__ = f"comma list of {kind.__name__}"      # argparse names the type in its message
    return parse


def add_eval_arguments(p):
    p.add_argument("-m", "--model", default=None, help="model folder (default: the shipped AR model; "
                                                       "with --judge the shipped diffusion model)")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--data", default=None, help="held-out text (stories split by <|endoftext|> or blank lines)")
    p.add_argument("--max-stories", type=int, default=None,
                   help=f"score the first N stories (default: all; masked diffusion: {MDM_DEFAULT_STORIES})")
    p.add_argument("--unit", default="paragraph", choices=UNITS,
                   help="score each paragraph alone after an end-of-text (as published tiny-model evaluations "
                        "do), or each story with the end of the one before as context (default paragraph)")
    p.add_argument("--samples-per-seq", type=int, default=None,
                   help=f"masked diffusion: mask draws K per story (default {ELBO_DRAWS})")
    p.add_argument("-s", "--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the report")
    p.add_argument("--against", default=None, metavar="REF_DIR",
                   help="reference model: KL(ref || model) and top-1 agreement on --data")
    p.add_argument("--infill", type=_list_of(float), default=None, metavar="RATES",
                   help="infill accuracy: hide these shares of each paragraph's tokens (comma list, e.g. "
                        "0.15,0.5) and count the holes the model gives back exactly")
    p.add_argument("--bigram", nargs="+", default=None, metavar="TRAIN",
                   help="score --data with a Kneser-Ney bigram counted on these training files instead "
                        "(the model gives only its tokenizer): the baseline")
    g = p.add_argument_group("generative perplexity (--judge)")
    g.add_argument("--judge", default=None, metavar="AR_DIR", help="autoregressive model that scores the samples")

    def setting(flag, **kw):                                        # one of the settings of the samples it scores
        action = g.add_argument(flag, **kw)
        JUDGE_SETTINGS[action.dest] = (flag, action.default)

    setting("--samples", type=int, default=16, help="samples per setting (default 16)")
    setting("--gen-length", type=int, default=128, help="tokens per sample (default 128)")
    setting("--steps", type=_list_of(int), default=[None],
            help="denoising steps, comma list (default: one per token)")
    setting("--threshold", type=_list_of(float, allow_none=True), default=[None],
            help="Fast-dLLM threshold, comma list, 'none' = off (default none)")
    setting("--entropy-bound", type=_list_of(float, allow_none=True), default=[None],
            help="EB-sampler's entropy bound, comma list, 'none' = off (default none; not with --threshold)")
    setting("--temp", type=_list_of(float), default=[1.0],
            help="sampling temperature, comma list (default 1: the model's own distribution)")
    setting("--block", type=int, default=None, help="block length (default: one block)")
    setting("--remask", default="low_confidence", choices=diffusion.REMASKING,
            help="which positions a step commits first (default low_confidence)")
    setting("--gap", type=int, default=0,
            help="positions one step commits are more than N apart (with --threshold or --entropy-bound; "
                 "default 0)")
    setting("--repeat-penalty", type=float, default=1.0,
            help="repetition penalty of every row, 1 = off (default 1; the tokens within 64 positions)")
    setting("--from-nothing", action="store_true",
            help="write each sample from nothing instead of a story opening: a bidirectional model "
                 "fills an all-mask canvas, an autoregressive one continues <|endoftext|>")


JUDGE_SETTINGS = {}     # dest -> (flag, default): refused without --judge, which alone reads them


# ---------------------------------------------------------------------------------------------
# Sequences and windows

@dataclasses.dataclass(frozen=True)
class Seq:
    ids: np.ndarray     # [n] int64
    first: int          # ids[first:] are scored, each given everything before it


def boundary_id(model):
    """The story separator: the trainer's <|endoftext|>, else the model's EOS."""
    tok = model.tokenizer
    for i in (tok.token_to_id(corpus.EOT), *model.config.eos_token_ids, tok.eos_id):
        if i is not None:
            return int(i)
    raise ModelError(f"{model.path or 'the model'}: no <|endoftext|> or EOS token to mark a story boundary")


def story_seqs(model, stories, limit=None, unit="story"):
    """The scored sequences of stories[:limit]. unit "story": [previous story's tail] [EOT] story
    [EOT], the tail and the first EOT given. unit "paragraph" (the stories are paragraphs): [EOT]
    paragraph, each alone, the EOT given; no EOT is scored after it (a paragraph is no end of text)."""
    eot = boundary_id(model)

    def ids(story):
        return model.tokenizer.encode(story, add_special_tokens=False)

    if unit == "paragraph":
        return [Seq(np.array([eot] + ids(p), np.int64), 1) for p in stories[:limit]]
    seqs = []
    for k in range(len(stories[:limit])):
        prev = ids(stories[k - 1]) if len(stories) > 1 else []          # k = 0: the file's last story
        tail = prev[max(0, len(prev) - PREV_CONTEXT):]
        seqs.append(Seq(np.array(tail + [eot] + ids(stories[k]) + [eot], np.int64), len(tail) + 1))
    return seqs


def story_bytes(stories, unit="story"):
    """UTF-8 bytes of the stories, plus one per story for its end marker (unit "story")."""
    return sum(len(s.encode("utf-8")) + (unit == "story") for s in stories)


def windows(n, first, ctx):
    """[(a, f, e)]: ids[a:e] (at most ctx positions) scores tokens f..e-1 given a..f-1; together
    they score first..n-1 once each, every window after the first with ctx - ctx//2 tokens of context."""
    stride = max(1, ctx // 2)
    out, f = [], first
    while f < n:
        a = max(0, f - (ctx - stride))
        e = min(n, a + ctx)
        out.append((a, f, e))
        f = e
    return out


def log_softmax(logits):
    """[r, V] float32 -> [r, V] float64 log-probabilities."""
    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    return x


def token_nll(logits, targets):
    """[r, V] logits, [r] targets -> [r] float64 -log p(target)."""
    return -log_softmax(logits)[np.arange(len(targets)), targets]


# ---------------------------------------------------------------------------------------------
# Autoregressive: exact NLL

def causal_rows(model, seqs, ctx=None):
    """Yields (sequence index, targets [m], logits [m, V]) for every window of every sequence.

    Windows (of at most ctx positions, default the model's context) are sorted by length and packed
    into batched causal passes of up to BATCH_POSITIONS positions; shorter rows are padded at the
    end, which a causal pass never lets earlier positions see."""
    cfg = model.config
    ctx = ctx or cfg.max_position_embeddings
    jobs = [(i, a, f, e) for i, s in enumerate(seqs) for a, f, e in windows(len(s.ids), s.first, ctx)]
    jobs.sort(key=lambda j: j[3] - j[1], reverse=True)
    at = 0
    while at < len(jobs):
        n = jobs[at][3] - 1 - jobs[at][1]                         # the longest input of this batch
        batch = jobs[at:at + max(1, BATCH_POSITIONS // n)]
        at += len(batch)
        ids = np.full((len(batch), n), seqs[batch[0][0]].ids[0], np.int64)   # [B, n]; any valid id pads
        for r, (i, a, f, e) in enumerate(batch):
            ids[r, :e - 1 - a] = seqs[i].ids[a:e - 1]
        logits = model.transformer.forward(ids, model.transformer.state(n, len(batch)), 0)
        logits = logits.reshape(len(batch), n, -1)                # [B, n, V]; row p predicts p + 1
        for r, (i, a, f, e) in enumerate(batch):
            yield i, seqs[i].ids[f:e], logits[r, f - 1 - a:e - 1 - a]


def ar_seq_nll(model, seqs):
    """([S] nats, [S] tokens) per sequence, exact."""
    nats, count = np.zeros(len(seqs)), np.zeros(len(seqs), np.int64)
    for i, targets, logits in causal_rows(model, seqs):
        nats[i] += token_nll(logits, targets).sum()
        count[i] += len(targets)
    return nats, count


@dataclasses.dataclass
class Likelihood:
    bound: str                  # "exact NLL" (autoregressive), "ELBO" (masked diffusion: >= NLL), "block ELBO (...)"
    stories: int
    tokens: int
    bytes: int
    nats: float                 # total over the scored tokens
    se: float                   # standard error of nats_per_token over stories (nan for one story)
    mc_se: Optional[float] = None       # ELBO: the Monte Carlo part of se (an upper bound)
    samples_per_seq: Optional[int] = None
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


# ---------------------------------------------------------------------------------------------
# Masked diffusion: the ELBO

def mask_token(model):
    if model.mask_id is None:
        raise ModelError(f"{model.path or 'the model'}: neither causal nor with a mask token, so it cannot "
                         "be scored")
    return model.mask_id


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


# ---------------------------------------------------------------------------------------------
# --bigram: the baseline

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


# ---------------------------------------------------------------------------------------------
# --against: KL(ref || model) and top-1 agreement

@dataclasses.dataclass
class Agreement:
    tokens: int
    bytes: int
    model_nats: float
    ref_nats: float
    kl: np.ndarray          # [tokens] float64 KL(ref || model) per predicted position
    same_top1: np.ndarray   # [tokens] bool

    def as_dict(self):
        n, kl, p = self.tokens, self.kl, self.same_top1.mean()
        return {"tokens": n, "bytes": self.bytes,
                "model_nats_per_token": self.model_nats / n, "ref_nats_per_token": self.ref_nats / n,
                "model_bits_per_byte": self.model_nats / math.log(2) / self.bytes,
                "ref_bits_per_byte": self.ref_nats / math.log(2) / self.bytes,
                "kl_mean": float(kl.mean()), "kl_se": float(kl.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan"),
                "kl_median": float(np.median(kl)), "kl_p99": float(np.percentile(kl, 99)), "kl_max": float(kl.max()),
                "top1_agreement": float(p), "top1_se": float(math.sqrt(p * (1 - p) / n))}


def against(model, ref, stories, limit=None, unit="story"):
    seqs = story_seqs(model, stories, limit, unit)
    ctx = min(model.config.max_position_embeddings, ref.config.max_position_embeddings)
    kl, same, nats, ref_nats = [], [], 0.0, 0.0
    # both models run the same windows in the same order, so their rows line up
    for (_, targets, logits), (_, _, ref_logits) in zip(causal_rows(model, seqs, ctx), causal_rows(ref, seqs, ctx)):
        lp, lq = log_softmax(logits), log_softmax(ref_logits)       # [m, V] model, reference
        kl.append((np.exp(lq) * (lq - lp)).sum(axis=1))
        same.append(lp.argmax(axis=1) == lq.argmax(axis=1))
        rows = np.arange(len(targets))
        nats -= lp[rows, targets].sum()
        ref_nats -= lq[rows, targets].sum()
    kl, same = np.concatenate(kl), np.concatenate(same)
    return Agreement(len(kl), story_bytes(stories[:limit], unit), nats, ref_nats, kl, same)


# ---------------------------------------------------------------------------------------------
# --infill: filling blanks in held-out text

def infill_accuracy(model, texts, rate, seed=0):
    """(holes, correct) over texts (scored as story_seqs' paragraphs: [EOT] text, cut to the
    context). In each, round(rate * n) of its n tokens (at least one) become holes at seeded
    random places. A bidirectional model fills them with Model.infill (one token a step, the most
    confident first, greedy); a causal one left to right, each hole the argmax given everything
    left of it, its own earlier fills included (it cannot see to the right). correct: holes given
    back the very token that was there."""
    holes = correct = 0
    ctx = model.config.max_position_embeddings
    for i, seq in enumerate(story_seqs(model, texts, unit="paragraph")):
        ids = seq.ids[:ctx].copy()
        n = len(ids) - 1
        k = max(1, round(rate * n))
        where = 1 + np.sort(np.random.default_rng([seed, i]).choice(n, size=k, replace=False))
        filled = _fill(model, ids, where)
        holes, correct = holes + k, correct + int((filled[where] == ids[where]).sum())
    return holes, correct


def _fill(model, ids, where):
    """ids with the positions `where` filled by the model (infill_accuracy's two ways)."""
    if model.config.causal:
        out = ids.copy()
        for h in where:
            out[h] = int(np.argmax(model.logits(out[:h])[-1]))
        return out
    canvas = ids.copy()
    canvas[where] = model.mask_id
    return np.asarray(model.infill(canvas.tolist()), np.int64)


# ---------------------------------------------------------------------------------------------
# --judge: generative perplexity

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


# ---------------------------------------------------------------------------------------------
# The command

def _load(path, threads, what):
    from ..model import default_model_path, load
    return load(path or default_model_path(what), threads=threads)


def _read_stories(args):
    if args.data is None:
        raise UsageError("eval needs the held-out text: --data FILE")
    return corpus.load_stories([args.data])


def _same_vocabulary(model, other, flag, path, probe):
    if model.config.vocab_size != other.config.vocab_size:
        raise UsageError(f"{flag} {path}: vocabulary of {other.config.vocab_size} tokens, but the model's has "
                         f"{model.config.vocab_size}; the two must share a tokenizer")
    if model.tokenizer.encode(probe, add_special_tokens=False) != \
            other.tokenizer.encode(probe, add_special_tokens=False):
        raise UsageError(f"{flag} {path}: its tokenizer splits the text differently from the model's")


def _check_args(args):
    for flag, value in (("--max-stories", args.max_stories), ("--samples-per-seq", args.samples_per_seq),
                        ("--samples", args.samples), ("--gen-length", args.gen_length)):
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if sum(x is not None for x in (args.judge, args.against, args.bigram, args.infill)) > 1:
        raise UsageError("give one of --judge, --against, --bigram and --infill")
    if args.threshold != [None] and args.entropy_bound != [None]:
        raise UsageError("give --threshold or --entropy-bound, not both (a step commits by one rule)")
    if args.samples_per_seq is not None and (args.judge or args.against or args.infill or args.bigram):
        raise UsageError("--samples-per-seq is the masked-diffusion ELBO's: this evaluation would ignore it")
    if args.seed < 0:
        raise UsageError(f"-s/--seed must be >= 0, got {args.seed}")
    if not 0 < args.repeat_penalty < float("inf"):
        raise UsageError(f"--repeat-penalty must be > 0 and finite, got {args.repeat_penalty:g}")
    given = [flag for dest, (flag, default) in JUDGE_SETTINGS.items() if getattr(args, dest, default) != default]
    if args.judge is None and given:
        raise UsageError(f"{given[0]} is a setting of the samples --judge scores; without --judge it would be ignored")
    if args.gap < 0 or args.gap and args.threshold == [None] and args.entropy_bound == [None]:
        raise UsageError(f"--gap {args.gap}: give N >= 1 with --threshold or --entropy-bound (it spaces their picks)")
    for rate in args.infill or ():
        if not 0 < rate < 1:
            raise UsageError(f"--infill: each rate must be in (0, 1), got {rate:g}")


def run_eval(args):
    _check_args(args)
    if args.judge:
        return _run_judge(args)
    model = _load(args.model, args.threads, "ar")
    if args.samples_per_seq is not None and model.config.causal:
        raise UsageError("--samples-per-seq is the masked-diffusion ELBO's: an autoregressive model's likelihood "
                         "is exact and would ignore it")
    if args.against:
        return _run_against(args, model)
    if args.infill:
        return _run_infill(args, model)
    stories = _read_stories(args)
    default = None if model.config.causal or args.bigram else MDM_DEFAULT_STORIES   # the ELBO takes its time
    texts, limit = _units(args, stories, default)
    if args.bigram:
        result = bigram_likelihood(model, corpus.load_stories(args.bigram), texts, limit, args.unit)
    elif model.config.causal:
        result = ar_likelihood(model, texts, limit, args.unit)
    else:
        result = mdm_likelihood(model, texts, args.samples_per_seq or ELBO_DRAWS, args.seed, limit, args.unit)
    scored = len(stories[:args.max_stories or default])
    _print(args, {"model": model.path, "unit": args.unit, "stories_in_file": len(stories), "first_stories": scored,
                  **result.as_dict()}, lambda: likelihood_report(model, args, result, scored, len(stories)))


def _units(args, stories, default_stories):
    """(texts, limit): the first --max-stories stories (else default_stories; None: all), as their
    paragraphs or whole (--unit); whole stories keep the rest of the list, which lends the first one
    its context (the file's last story)."""
    n = args.max_stories or default_stories
    if args.unit == "paragraph":
        return corpus.split_paragraphs(stories[:n]), None
    return stories, n


def _run_infill(args, model):
    if not model.config.causal:
        mask_token(model)
    stories = _read_stories(args)
    n = args.max_stories or MDM_DEFAULT_STORIES
    paragraphs = corpus.split_paragraphs(stories[:n])
    rows = []
    for rate in args.infill:
        t0 = time.perf_counter()
        holes, correct = infill_accuracy(model, paragraphs, rate, args.seed)
        rows.append({"rate": rate, "holes": holes, "correct": correct, "accuracy": correct / holes,
                     "seconds": time.perf_counter() - t0})
    _print(args, {"model": model.path, "stories": len(stories[:n]), "paragraphs": len(paragraphs), "rows": rows},
           lambda: infill_report(model, args, len(stories[:n]), len(paragraphs), rows))


def infill_report(model, args, stories, paragraphs, rows):
    how = ("left to right, each hole from what is left of it" if model.config.causal else
           "Model.infill: one token a step, the most confident first, greedy")
    lines = [f"model: {model.path} ({how})",
             f"data:  {args.data}: the paragraphs of the first {stories} stories ({paragraphs}), each alone"]
    for r in rows:
        p = r["accuracy"]
        se = math.sqrt(p * (1 - p) / r["holes"])
        lines.append(f"infill at {100 * r['rate']:g}%: {r['correct']:,} of {r['holes']:,} holes given back exactly, "
                     f"{100 * p:.1f} ± {100 * se:.1f}%  ({r['seconds']:.0f} s)")
    return "\n".join(lines)


def _run_against(args, model):
    ref = _load(args.against, args.threads, "ar")
    for m in (model, ref):
        if not m.config.causal:
            raise UsageError(f"--against compares autoregressive models; {m.path} is masked diffusion")
    stories = _read_stories(args)
    _same_vocabulary(model, ref, "--against", args.against, stories[0])
    result = against(model, ref, *_units(args, stories, None), args.unit)
    scored = len(stories[:args.max_stories])
    _print(args, {"model": model.path, "reference": ref.path, "unit": args.unit, "stories": scored,
                  **result.as_dict()}, lambda: against_report(model, ref, scored, args.unit, result.as_dict()))


def _run_judge(args):
    model = _load(args.model, args.threads, "diffusion")
    judge = _load(args.judge, args.threads, "ar")
    if model.config.causal and not args.from_nothing:
        raise UsageError(f"--judge scores masked-diffusion samples; {model.path} is autoregressive (its samples "
                         f"from nothing: add --from-nothing; after the openings: tinydiff compare)")
    if model.config.causal and (args.steps != [None] or args.threshold != [None] or args.entropy_bound != [None]
                                or args.block is not None):
        raise UsageError("--steps, --threshold, --entropy-bound and --block are diffusion settings; the model is "
                         "autoregressive")
    if not judge.config.causal:
        raise UsageError(f"--judge {args.judge}: not an autoregressive model (config.json says is_causal false)")
    _same_vocabulary(model, judge, "--judge", args.judge, " ".join(OPENINGS))
    if not model.config.causal:
        mask_token(model)
    rows = generative_perplexity(model, judge, args.samples, args.gen_length, args.steps, args.threshold,
                                 args.temp, args.seed, args.block, args.remask, args.from_nothing, args.entropy_bound,
                                 args.repeat_penalty, args.gap)
    if args.data:
        rows.append(reference_row(model, judge, _read_stories(args)[:args.samples], args.gen_length))
    _print(args, {"model": model.path, "judge": judge.path, "gen_length": args.gen_length,
                  "repeat_penalty": args.repeat_penalty, "gap": args.gap, "rows": [r.as_dict() for r in rows]},
           lambda: judge_report(model, judge, args, rows))


def _print(args, data, report):
    print(json.dumps(_no_nan(data), indent=1) if args.json else report())


def _no_nan(x):
    """NaN (a standard error from one story or one draw) as null: JSON has no NaN."""
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_no_nan(v) for v in x]
    return None if isinstance(x, float) and math.isnan(x) else x


# ---------------------------------------------------------------------------------------------
# Reports

def _pm(se):
    """' ± se', or ' ± n/a' when there is no spread to measure (one story, one draw)."""
    return " ± n/a" if math.isnan(se) else f" ± {se:.4f}"


def likelihood_report(model, args, r, stories, available):
    kind = "autoregressive" if model.config.causal else "masked diffusion"
    what = (f"Kneser-Ney bigram counted on {' '.join(args.bigram)}, tokenized by {model.path}" if args.bigram
            else f"{model.path} ({kind}, {model.parameter_count():,} parameters)")
    units = PLURAL[args.unit]
    how = ("each paragraph alone after an end-of-text" if args.unit == "paragraph" else
           "each story and its end-of-text, after the end of the one before")
    extra = "" if args.unit == "paragraph" else " (+1 per end-of-text)"
    lines = [f"model:  {what}",
             f"data:   {args.data}: the first {stories} of {available} stories, {r.stories} {units}; "
             f"{r.tokens:,} tokens scored ({how}); {r.bytes:,} UTF-8 bytes{extra}"]
    if "ELBO" in r.bound:
        lines.append(f"bound:  {r.bound}, an upper bound on the NLL; K={r.samples_per_seq} stratified mask counts "
                     f"per {args.unit} (LLaDA); Monte Carlo part of the se:{_pm(r.mc_se)} nats/token")
    lines += [f"{r.bound}: {r.nats_per_token:.4f}{_pm(r.se)} nats/token (se over {units}), "
              f"perplexity {math.exp(r.nats_per_token):.3f}",
              f"bits per byte: {r.bits_per_byte:.4f}{_pm(r.to_bits_per_byte(r.se))}",
              f"time:   {r.seconds:.1f} s"]
    return "\n".join(lines)


def against_report(model, ref, stories, unit, d):
    return "\n".join([
        f"model:     {model.path}",
        f"reference: {ref.path}",
        f"data:      {stories} stories (scored by {unit}), {d['tokens']:,} next-token predictions, "
        f"{d['bytes']:,} bytes",
        f"model:     {d['model_nats_per_token']:.4f} nats/token, {d['model_bits_per_byte']:.4f} bits/byte",
        f"reference: {d['ref_nats_per_token']:.4f} nats/token, {d['ref_bits_per_byte']:.4f} bits/byte",
        f"KL(ref || model): mean {d['kl_mean']:.4g} ± {d['kl_se']:.2g} nats, median {d['kl_median']:.4g}, "
        f"99% {d['kl_p99']:.4g}, max {d['kl_max']:.4g}",
        f"same top-1: {100 * d['top1_agreement']:.3f} ± {100 * d['top1_se']:.3f} %"])


def judge_report(model, judge, args, rows):
    lines = [f"model: {model.path}", f"judge: {judge.path}",
             f"{args.samples} samples per row, gen_length {args.gen_length}, " +
             ("from nothing (an all-mask canvas, or <|endoftext|> for an AR model)" if args.from_nothing else
              f"openings cycled from {', '.join(repr(o) for o in OPENINGS)}") +
             (f"; repetition penalty {args.repeat_penalty:g} (the tokens within 64 positions)"
              if args.repeat_penalty != 1 else "") +
             (f"; a step's commits more than {args.gap} apart (rows with a rule)" if args.gap else ""),
             f"{'steps':>13} {'threshold':>9} {'ebound':>6} {'temp':>5} {'passes':>7} {'tokens':>7} {'judge ppl':>9} "
             f"{'entropy':>7} {'rep4':>5} {'seconds':>7}"]
    for r in rows:
        s = r.setting
        th = "-" if s["threshold"] is None else f"{s['threshold']:g}"
        eb = "-" if s["entropy_bound"] is None else f"{s['entropy_bound']:g}"
        temp = "-" if s["temperature"] is None else f"{s['temperature']:g}"
        lines.append(f"{s['steps']:>13} {th:>9} {eb:>6} {temp:>5} {r.passes:>7.1f} {r.tokens:>7} {r.perplexity:>9.3f} "
                     f"{r.entropy:>7.3f} {r.repeats:>5.3f} {r.seconds:>7.1f}")
    lines.append("entropy: bits per token of each sample's unigram distribution, averaged over samples; rep4: "
                 "the share of a sample's 4-grams it had already written (loops), averaged over samples")
    return "\n".join(lines)
