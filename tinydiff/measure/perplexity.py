"""Perplexity of a text as llama.cpp's llama-perplexity measures it, and KL-divergence against a
reference model as its --kl-divergence does (`tinydiff perplexity`).

Takes a loaded causal Model (and a reference Model for KL), the text, the context n_ctx and how
many chunks; guarantees the same figures llama-perplexity prints for the same logits, by the same
protocol (tools/perplexity/perplexity.cpp, its perplexity() and kl_divergence()):

  - the text is tokenized once, whole, with the vocabulary's BOS in front where it adds one (never
    an EOS: llama.cpp asserts the vocabulary adds none). The CLI drops one trailing newline first,
    as llama.cpp's -f does.
  - the text of a special (control) token in the file, <|endoftext|> between stories, is read as
    plain text, as llama.cpp's common_tokenize with parse_special false reads it
    (split_special_tokens); user-defined added tokens still match.
  - it must give at least 2 n_ctx tokens. The chunks are the first floor(tokens / n_ctx) runs of
    n_ctx consecutive tokens, at most `chunks` of them (-1: all); the tokens after the last are
    not read.
  - each chunk runs alone from an empty cache, at positions 0..n_ctx-1. Where the vocabulary adds
    BOS, the chunk's first token is replaced by BOS (the first chunk's already is BOS).
  - only the second half is scored: the logits at positions first = n_ctx // 2 .. n_ctx - 2
    predict tokens first+1 .. n_ctx-1, so every scored token has at least n_ctx/2 tokens before it;
    n_ctx - 1 - first tokens a chunk.
  - after each chunk the running estimate exp(mean NLL so far) is printed as [1]6.1234,[2]...;
    at the end `Final estimate: PPL = exp(m) +/- exp(m) * sqrt((mean(NLL^2) - m^2) / (count - 1))`,
    m the mean NLL over every scored token (the delta method on the mean's standard error).

KL (--kl-against REF): llama.cpp does it in two runs (the base model's log-probabilities written
to a file by --kl-divergence-base, then read by --kl-divergence). Here both models run in one
process on the same chunks, one chunk after the other, so no file is written and the reference's
log-probabilities are exact (llama.cpp stores them as 16-bit steps and drops the tokens of
probability below e^-16 from the sum). The reference must tokenize the text to the same ids. Per
scored token: KL(ref || model) = sum_v p_ref(v) (log p_ref(v) - log p_model(v)), dp = p_model(t) -
p_ref(t) for the true next token t, and whether the two argmaxes are the same token; the summary
is llama.cpp's (mean with its uncertainty, percentiles, "Same top p").

Every log-softmax is in float64. The passes go through the Model's Transformer: batch positions
a pass (llama.cpp's -b): below n_ctx a chunk takes several passes through the KV cache, a multiple
of n_ctx runs that many chunks side by side; the LM head runs on the scored rows alone.
"""
import dataclasses
import math
import time

import numpy as np

from ..errors import UsageError

ROWS_A_BLOCK = 32          # rows of logits turned into float64 log-probabilities at once (memory)


# ---------------------------------------------------------------------------------------------
# What is run: the tokens and the chunks

def check_model(model, n_ctx, flag="-m"):
    """A causal model whose context holds n_ctx positions."""
    name = model.path or "the model"
    if not model.config.causal:
        raise UsageError(f"{flag} {name}: perplexity is for causal (autoregressive) models; this one is a "
                         "masked-diffusion model (tinydiff eval gives its ELBO)")
    if n_ctx > model.config.max_position_embeddings:
        raise UsageError(f"-c {n_ctx} is more than the {model.config.max_position_embeddings} positions of "
                         f"{flag} {name}'s context")


def adds_bos(tokenizer):
    """Whether the vocabulary puts BOS in front of a text (llama.cpp's llama_vocab_get_add_bos)."""
    bos = tokenizer.bos_id
    return bos is not None and tokenizer.encode("a")[:1] == [bos] != tokenizer.encode("a", add_special_tokens=False)[:1]


def tokenize(tokenizer, text):
    """The whole text's ids, BOS first where the vocabulary adds one, no EOS."""
    ids = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    return [tokenizer.bos_id] + ids if adds_bos(tokenizer) else ids


@dataclasses.dataclass
class Chunks:
    ids: np.ndarray         # [n_chunk, n_ctx] int64 the chunks as run (first token BOS where the vocabulary adds one)
    targets: np.ndarray     # [n_chunk, n_ctx - 1 - first] int64 the text's tokens the scored rows predict
    tokens: int             # the whole text's token count
    bos: bool               # whether the first token of each chunk was replaced by BOS

    @property
    def n_ctx(self):
        return self.ids.shape[1]

    @property
    def first(self):
        return self.n_ctx // 2


def make_chunks(tokens, n_ctx, n_chunks, bos_id, where):
    """The chunks llama.cpp runs of tokens (the text's, from tokenize); bos_id None: no BOS added.
    where names the text in the message of one too short."""
    check_request(n_ctx, n_chunks)
    if len(tokens) < 2 * n_ctx:
        raise UsageError(f"{where} tokenizes to only {len(tokens)} tokens; perplexity with a context of {n_ctx} "
                         f"needs at least {2 * n_ctx} (two chunks): a longer text or a smaller -c")
    n_chunk = len(tokens) // n_ctx if n_chunks == -1 else min(n_chunks, len(tokens) // n_ctx)
    text = np.asarray(tokens[:n_chunk * n_ctx], np.int64).reshape(n_chunk, n_ctx)   # [n_chunk, n_ctx]
    ids = text.copy()
    if bos_id is not None:
        ids[:, 0] = bos_id
    return Chunks(ids, text[:, n_ctx // 2 + 1:], len(tokens), bos_id is not None)


def check_request(n_ctx, n_chunks, batch=None):
    """-c, --chunks and -b as they must be; batch (positions a pass) below n_ctx or a whole number
    of chunks, as llama.cpp asserts."""
    if n_ctx < 4:
        raise UsageError(f"-c {n_ctx}: the context must be at least 4 tokens (a chunk scores the tokens of "
                         "its second half)")
    if n_chunks == 0 or n_chunks < -1:
        raise UsageError(f"--chunks {n_chunks}: give a number of chunks >= 1, or -1 for all")
    if batch is not None and (batch < 1 or (batch > n_ctx and batch % n_ctx)):
        raise UsageError(f"-b {batch}: the positions a pass must be >= 1 and, above -c {n_ctx}, a multiple of it "
                         "(that many chunks a pass)")


# ---------------------------------------------------------------------------------------------
# Running them

def chunk_logits(model, chunks, batch):
    """Yields logits [n_ctx - 1 - first, V] float32 of each chunk's scored rows (positions
    first .. n_ctx-2), chunk after chunk; batch positions a pass (check_batch's rule)."""
    n_chunk, n_ctx = chunks.ids.shape
    first, t = chunks.first, model.transformer
    step = min(batch, n_ctx)                                   # positions of one chunk a pass
    side = max(1, batch // n_ctx)                              # chunks side by side
    state = t.state(n_ctx, batch=side, rows=side * step)       # reused: each chunk starts at 0 again
    for c0 in range(0, n_chunk, side):
        ids = chunks.ids[c0:c0 + side]                         # [S, n_ctx]
        S, rows = len(ids), []
        for p0 in range(0, n_ctx, step):
            p1 = min(p0 + step, n_ctx)
            wanted = np.arange(max(first, p0), min(p1, n_ctx - 1)) - p0    # this pass's scored rows, per chunk
            out = np.concatenate([s * (p1 - p0) + wanted for s in range(S)])
            if not len(out):                                   # a pass of the first half: cache only
                t.forward(ids[:, p0:p1], state, p0, last_only=True)
                continue
            logits = t.forward(ids[:, p0:p1], state, p0, out_rows=out)      # [S * scored here, V]
            rows.append(logits.reshape(S, len(wanted), -1))                # [S, scored here, V]
        per_chunk = np.concatenate(rows, axis=1)                           # [S, n_ctx - 1 - first, V]
        yield from per_chunk


def log_probs(logits):
    """[r, V] float32 -> [r, V] float64 log-softmax."""
    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    return x


def token_nll(logits, targets):
    """[r, V] logits, [r] targets -> [r] float64 -log p(target), in blocks of rows."""
    out = np.empty(len(targets))
    for i in range(0, len(targets), ROWS_A_BLOCK):
        lp = log_probs(logits[i:i + ROWS_A_BLOCK])
        out[i:i + len(lp)] = -lp[np.arange(len(lp)), targets[i:i + ROWS_A_BLOCK]]
    return out


def kl_rows(logits, ref_logits, targets):
    """Per scored token of one chunk: (nll, ref nll, KL(ref || model), dp, same argmax), as arrays [r]."""
    r = len(targets)
    nll, ref_nll, kld, dp, same = np.empty(r), np.empty(r), np.empty(r), np.empty(r), np.empty(r, bool)
    for i in range(0, r, ROWS_A_BLOCK):
        lp, lq = log_probs(logits[i:i + ROWS_A_BLOCK]), log_probs(ref_logits[i:i + ROWS_A_BLOCK])   # [b, V]
        b, at = len(lp), slice(i, i + len(lp))
        tgt = targets[at]
        nll[at], ref_nll[at] = -lp[np.arange(b), tgt], -lq[np.arange(b), tgt]
        kld[at] = (np.exp(lq) * (lq - lp)).sum(axis=1)
        dp[at] = np.exp(-nll[at]) - np.exp(-ref_nll[at])
        same[at] = lp.argmax(axis=1) == lq.argmax(axis=1)
    return nll, ref_nll, kld, dp, same


def chunk_nll(model, chunks, batch):
    """Yields each chunk's NLLs [n_ctx - 1 - first] float64 of its scored tokens."""
    for logits, targets in zip(chunk_logits(model, chunks, batch), chunks.targets):
        yield token_nll(logits, targets)


def chunk_kl(model, ref, chunks, batch):
    """Yields each chunk's kl_rows, the model and the reference run on the same chunks in turn."""
    pairs = zip(chunk_logits(model, chunks, batch), chunk_logits(ref, chunks, batch), chunks.targets)
    for logits, ref_logits, targets in pairs:
        yield kl_rows(logits, ref_logits, targets)


# ---------------------------------------------------------------------------------------------
# The figures

def estimate(nll):
    """(PPL, its standard error) of the scored tokens' NLLs, llama.cpp's Final estimate."""
    m = nll.mean()
    var = (nll ** 2).mean() - m * m
    se = math.sqrt(var / (len(nll) - 1)) if var > 0 and len(nll) > 1 else float("nan")
    return math.exp(m), math.exp(m) * se


def mean_and_uncertainty(x):
    """llama.cpp's mean_and_uncertainty: the mean and sqrt(var / (n - 1)), 0 for n <= 10."""
    n, m = len(x), float(np.mean(x))
    var = float(np.mean(np.square(x))) - m * m
    return m, math.sqrt(var / (n - 1)) if var > 0 and n > 10 else 0.0


def covariance(a, b):
    """llama.cpp's covariance of two means: (mean(ab) - mean(a) mean(b)) / (n - 1), 0 for n < 10."""
    n = len(a)
    return (float(np.mean(a * b)) - float(np.mean(a)) * float(np.mean(b))) / (n - 1) if n >= 10 else 0.0


@dataclasses.dataclass
class Agreement:
    """The KL run's per-token values so far, over every scored token of the chunks run."""
    nll: np.ndarray
    ref_nll: np.ndarray
    kld: np.ndarray
    dp: np.ndarray
    same: np.ndarray

    @classmethod
    def empty(cls):
        return cls(*(np.empty(0, dtype) for dtype in (float, float, float, float, bool)))

    def add(self, rows):
        for f, new in zip(dataclasses.fields(self), rows):
            setattr(self, f.name, np.concatenate([getattr(self, f.name), new]))

    def ppl(self):
        (m, u), (mb, ub) = mean_and_uncertainty(self.nll), mean_and_uncertainty(self.ref_nll)
        ratio_u = math.sqrt(max(u * u + ub * ub - 2 * covariance(self.nll, self.ref_nll), 0.0))
        return (math.exp(m), math.exp(m) * u), (math.exp(mb), math.exp(mb) * ub), (m - mb, ratio_u)

    def rms_dp(self):
        m, u = mean_and_uncertainty(self.dp ** 2)
        return math.sqrt(m), 0.5 / math.sqrt(m) * u if m > 0 else 0.0

    def same_top(self):
        n, p = len(self.same), float(self.same.mean())
        return p, math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else 0.0


KL_HEADER = ("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
             "              Δp RMS            Same top p")


def kl_row(chunk, a):
    """llama.cpp's line of the KL table after `chunk` chunks (1-based)."""
    (ppl, ppl_u), _, (lr, lr_u) = a.ppl()
    kl, kl_u = mean_and_uncertainty(a.kld)
    (rms, rms_u), (top, top_u) = a.rms_dp(), a.same_top()
    return (f"{chunk:4d}    {ppl:9.4f} ± {ppl_u:9.4f}    {lr:10.5f} ± {lr_u:10.5f}    {kl:10.5f} ± {kl_u:10.5f}"
            f"    {100 * rms:6.3f} ± {100 * rms_u:6.3f} %    {100 * top:6.3f} ± {100 * top_u:6.3f} %")


def _percentile(sorted_x, fraction):
    """llama.cpp's: linear between the two nearest of the sorted values."""
    p = fraction * (len(sorted_x) - 1)
    i = int(p)
    return (1 - (p - i)) * sorted_x[i] + (p - i) * sorted_x[min(i + 1, len(sorted_x) - 1)]


def kl_summary(a):
    """llama.cpp's three blocks of statistics at the end of a KL run, as lines."""
    (ppl, ppl_u), (base, base_u), (lr, lr_u) = a.ppl()
    cov = covariance(a.nll, a.ref_nll)
    u, ub = mean_and_uncertainty(a.nll)[1], mean_and_uncertainty(a.ref_nll)[1]
    cor = cov / (u * ub) if u * ub > 0 else float("nan")
    diff_u = math.sqrt(max(ppl_u ** 2 + base_u ** 2 - 2 * ppl * base * cov, 0.0))
    kl, kl_u = mean_and_uncertainty(a.kld)
    kld, dp = np.sort(a.kld), np.sort(a.dp)
    dp_m, dp_u = mean_and_uncertainty(a.dp)
    (rms, rms_u), (top, top_u) = a.rms_dp(), a.same_top()
    lines = ["====== Perplexity statistics ======",
             f"Mean PPL(Q)                   : {ppl:10.6f} ± {ppl_u:10.6f}",
             f"Mean PPL(base)                : {base:10.6f} ± {base_u:10.6f}",
             f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * cor:6.2f}%",
             f"Mean ln(PPL(Q)/PPL(base))     : {lr:10.6f} ± {lr_u:10.6f}",
             f"Mean PPL(Q)/PPL(base)         : {math.exp(lr):10.6f} ± {math.exp(lr) * lr_u:10.6f}",
             f"Mean PPL(Q)-PPL(base)         : {ppl - base:10.6f} ± {diff_u:10.6f}",
             "", "====== KL divergence statistics ======",
             f"Mean    KLD: {kl:10.6f} ± {kl_u:10.6f}",
             f"Maximum KLD: {kld[-1]:10.6f}"]
    lines += [f"{f'{100 * q:.1f}%':8s}KLD: {_percentile(kld, q):10.6f}" for q in (0.999, 0.99, 0.95, 0.90)]
    lines += [f"Median  KLD: {np.median(kld):10.6f}"]
    lines += [f"{f'{100 * q:4.1f}%':8s}KLD: {_percentile(kld, q):10.6f}" for q in (0.10, 0.05, 0.01, 0.001)]
    lines += [f"Minimum KLD: {kld[0]:10.6f}", "", "====== Token probability statistics ======",
              f"Mean    Δp: {100 * dp_m:6.3f} ± {100 * dp_u:5.3f} %",
              f"Maximum Δp: {100 * dp[-1]:6.3f}%"]
    lines += [f"{f'{100 * q:.1f}%':8s}Δp: {100 * _percentile(dp, q):6.3f}%" for q in (0.999, 0.99, 0.95, 0.90, 0.75)]
    lines += [f"Median  Δp: {100 * np.median(dp):6.3f}%"]
    lines += [f"{f'{100 * q:4.1f}%':8s}Δp: {100 * _percentile(dp, q):6.3f}%" for q in (0.25, 0.10, 0.05, 0.01, 0.001)]
    lines += [f"Minimum Δp: {100 * dp[0]:6.3f}%",
              f"RMS Δp    : {100 * rms:6.3f} ± {100 * rms_u:5.3f} %",
              f"Same top p: {100 * top:6.3f} ± {100 * top_u:5.3f} %"]
    return lines


def passes(n_chunk, n_ctx, batch):
    """How many times chunk_logits runs the chunks side by side (its passes of all n_ctx positions)."""
    return -(-n_chunk // max(1, batch // n_ctx))


class Clock:
    """llama.cpp's line after the first chunk: the seconds of its pass and the whole run's estimate."""

    def __init__(self):
        self.t0 = time.perf_counter()

    def eta(self, n_passes):
        per = time.perf_counter() - self.t0
        return f"perplexity: {per:.2f} seconds per pass - ETA {per * n_passes / 60:.2f} minutes"
