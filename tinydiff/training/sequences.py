"""What every metric of `tinydiff eval` scores: the sequences of held-out text, their windows, and
the causal passes over them.

Takes a loaded Model and stories (corpus.load_stories, or corpus.split_paragraphs for paragraphs);
guarantees Seq objects whose ids[first:] are the scored tokens, windows that score each of them
exactly once, and float64 log-probabilities.

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
"""
import dataclasses

import numpy as np

from ..errors import ModelError
from . import corpus

BATCH_POSITIONS = 4096      # positions per batched causal pass: logits stay 4096 x V float32
PREV_CONTEXT = 64           # tokens of the previous story given before a story's EOT (docstring)


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


def mask_token(model):
    if model.mask_id is None:
        raise ModelError(f"{model.path or 'the model'}: neither causal nor with a mask token, so it cannot "
                         "be scored")
    return model.mask_id
