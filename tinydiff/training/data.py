"""What `tinydiff train` trains on: the tokenizer, the packed training sequences, the validation windows.

No torch here: everything is NumPy, checked and made before torch is imported. Takes the run's
settings (settings.py) and the stories corpus.py reads; guarantees int64 id arrays, the same ones
for the same --seed and epoch, so a resumed run sees the batches the uninterrupted one saw.

Tokenizer: --tokenizer (checked to be the byte-level BPE bpe.BPE encodes, as train_bpe writes
it), else one trained on the training stories with EOT and MASK as its special tokens; either way
copied into the run folder.

Data: each epoch shuffles the stories (seeded) and packs them into sequences of --seq-len tokens,
each sequence starting at a story start, stories joined by <|endoftext|>; the story that overflows
a sequence is cut there. --unit-ends P replaces a share P of them by sequences that end where a
story or a paragraph ends, as every sequence `tinydiff eval` scores does: a bidirectional model
sees where its canvas ends, and from packed sequences alone it learns that text runs on past it.
(Measured on stories5m-mdm: 1.5 and 1.8 nats more than the AR model on a held-out paragraph's last
two tokens, ~0.5 a token elsewhere; --unit-ends 0.5 took 0.2 nats off the last token and left the
paragraph bound where it was.) Validation: the held-out stories joined the same way, cut into
consecutive windows, the first --eval-tokens of them; the mdm masks for validation are drawn once
(losses.validation_loss), so successive evaluations differ only by the model.
"""
import json
import math
import os
import sys

import numpy as np

from ..errors import UsageError, is_integer
from ..formats import bpe
from . import corpus

EOT, MASK = "<|endoftext|>", "<|mask|>"


def prepare_tokenizer(args, stories):
    """The tokenizer.json dict: read from --tokenizer, or trained on the stories; copied into OUT."""
    path = os.path.join(args.out, "tokenizer.json")
    if os.path.exists(path) and args.resume:
        src = path
    elif args.tokenizer:
        src = args.tokenizer
    else:
        obj = bpe.train_bpe(stories, args.vocab_size, [EOT, MASK])
        bpe.save_tokenizer_json(obj, path)
        return obj
    try:
        with open(src, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"{src}: cannot read tokenizer ({e})") from None
    _check_tokenizer(obj, src)
    if src != path:
        bpe.save_tokenizer_json(obj, path)
    return obj


def _check_tokenizer(obj, where):
    """The trainer encodes with bpe.BPE, which knows only the layout train_bpe writes."""
    problem = tokenizer_problem(obj)
    if problem:
        raise UsageError(f"{where}: {problem}")


def tokenizer_problem(obj):
    """What keeps bpe.BPE from encoding and decoding with the tokenizer.json dict `obj` as
    train_bpe writes it (byte-level BPE, <|endoftext|> and <|mask|> among its special tokens), in
    words; None when nothing does."""
    if not isinstance(obj, dict):
        return "not a JSON object"
    model, pre = obj.get("model"), obj.get("pre_tokenizer")
    if not isinstance(model, dict):
        return f"field 'model' should be the BPE model, got {json.dumps(model)[:40]}"
    if not (model.get("type") == "BPE" and isinstance(pre, dict)
            and pre.get("type") == "ByteLevel" and obj.get("normalizer") is None):
        return "not a byte-level BPE tokenizer without normalizer (as tinydiff train writes)"
    vocab, merges, added = model.get("vocab"), model.get("merges"), obj.get("added_tokens", [])
    if not isinstance(vocab, dict) or not all(is_integer(i) for i in vocab.values()):
        return "field 'model.vocab' should map token strings to ids"
    if not isinstance(added, list) or not all(isinstance(t, dict) and isinstance(t.get("content"), str)
                                              and is_integer(t.get("id")) for t in added):
        return "field 'added_tokens' should list the special tokens, each a content and an id"
    specials = {t["content"]: t["id"] for t in added}
    for tok in (EOT, MASK):
        if tok not in specials:
            return f"has no special token {tok}"
    if any(vocab.get(tok) != i for tok, i in specials.items()):
        return "field 'added_tokens' gives a special token an id that is not its id in 'model.vocab'"
    if any(c not in vocab for c in bpe.BYTE_CHAR.values()):
        return "field 'model.vocab' lacks some of the 256 byte tokens"
    if any(s not in specials and not all(c in bpe.CHAR_BYTE for c in s) for s in vocab):
        return "field 'model.vocab' holds a token not spelled in byte-level characters"
    def merge(m):
        return isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m) and m[0] + m[1] in vocab
    if not isinstance(merges, list) or not all(merge(m) for m in merges):
        return "field 'model.merges' should list pairs of tokens whose join is in 'model.vocab'"
    return None


def prepare_data(args):
    """(tokenizer dict, [train story ids], validation ids as one array, eot id, mask id, newline id
    or None when a newline is not one token)."""
    train = corpus.load_stories(args.data)
    val = corpus.load_stories([args.val])
    shared = corpus.overlap(train, val)
    if shared:
        print(f"warning: {shared} of the {len(val)} stories in {args.val} also occur in the training data",
              file=sys.stderr)
    obj = prepare_tokenizer(args, train)
    enc = bpe.BPE(obj)
    return (obj, *encode_data(enc, train, val), enc.specials[EOT], enc.specials[MASK], newline_id(enc))


def newline_id(enc):
    """The id of a newline, or None when a newline is not one token."""
    newline = enc.encode("\n")
    return newline[0] if len(newline) == 1 else None


def encode_data(enc, train, val):
    """([each training story's ids, then EOT], the validation stories as one array joined by EOT)."""
    eot = enc.specials[EOT]
    train_ids = [np.array(enc.encode(s) + [eot], dtype=np.int64) for s in train]
    return train_ids, np.array(enc.encode(EOT.join(val) + EOT), dtype=np.int64)


def pack_epoch(stories, seq_len, seed, epoch, paragraph_starts=0.0, newline=None, unit_ends=0.0, eot=None):
    """[n, seq_len] int64: the stories in this epoch's seeded order, packed from story starts;
    a story that does not fit is cut at the end of the sequence, and the next one starts afresh.
    paragraph_starts: the share of stories that begin instead right after one of their newline
    tokens (drawn from the epoch's own seeded stream), still after the <|endoftext|> before them.
    unit_ends: the share of sequences replaced by the seq_len tokens of the epoch's stories (joined,
    whole) that end where a unit of text ends (unit_end_positions), one drawn uniformly."""
    order = np.random.default_rng([seed, epoch]).permutation(len(stories))
    cut = np.random.default_rng([seed, epoch, 1])
    rows, row, used = [], np.empty(seq_len, dtype=np.int64), 0
    for i in order:
        s = stories[i]
        if paragraph_starts and cut.random() < paragraph_starts:
            starts = np.flatnonzero(s[:-2] == newline) + 1                 # a paragraph, not the EOT, follows
            s = s[cut.choice(starts):] if len(starts) else s
        take = min(len(s), seq_len - used)
        row[used:used + take] = s[:take]
        used += take
        if used == seq_len:
            rows.append(row.copy())
            used = 0
    rows = np.stack(rows)
    if unit_ends:
        stream = np.concatenate([stories[i] for i in order])
        ends = unit_end_positions(stream, eot, newline)
        ends = ends[ends >= seq_len - 1]
        draw = np.random.default_rng([seed, epoch, 2])
        for r in np.flatnonzero(draw.random(len(rows)) < unit_ends) if len(ends) else ():
            e = draw.choice(ends)
            rows[r] = stream[e + 1 - seq_len:e + 1]
    return rows


def unit_end_positions(stream, eot, newline):
    """Where the units `tinydiff eval` scores end in a token stream: each <|endoftext|> (a story's
    end, scored) and each paragraph's last token (a newline follows it). A bidirectional model sees
    where its canvas ends, and an evaluated paragraph or story ends with its canvas, where a packed
    sequence is cut mid-text: sequences that end there teach it what such an end means."""
    para = np.flatnonzero((stream[1:] == newline) & (stream[:-1] != newline) & (stream[:-1] != eot))
    return np.union1d(np.flatnonzero(stream == eot), para)


def batches(stories, seq_len, batch, seed, start_step, **packing):
    """Yields (step, [batch, seq_len]) from start_step on; epochs follow each other, the last
    incomplete batch of an epoch is dropped. packing: pack_epoch's options."""
    step, epoch = 0, 0
    while True:
        seqs = pack_epoch(stories, seq_len, seed, epoch, **packing)
        n = len(seqs) // batch
        if n == 0:
            raise UsageError(f"the training data fill fewer than --batch {batch} sequences of {seq_len} tokens")
        if step + n <= start_step:
            step += n
        else:
            for b in range(max(0, start_step - step), n):
                yield step + b, seqs[b * batch:(b + 1) * batch]
            step += n
        epoch += 1


def val_windows(val_ids, seq_len, eval_tokens, unit_ends=0.0, eot=None, newline=None):
    """[n, seq_len]: consecutive windows of the validation stream; with unit_ends, that share of
    them (every 1/unit_ends-th, evenly spread) moved back to end at the last unit end
    (unit_end_positions) inside it, as the same share of training sequences end."""
    n = min(len(val_ids) // seq_len, max(1, eval_tokens // seq_len))
    if n == 0:
        raise UsageError(f"the validation text holds fewer than --seq-len {seq_len} tokens")
    out = val_ids[:n * seq_len].reshape(n, seq_len).copy()
    ends = unit_end_positions(val_ids, eot, newline) if unit_ends else None
    for i in range(n):
        if unit_ends and math.floor((i + 1) * unit_ends) > math.floor(i * unit_ends):
            inside = ends[(ends >= max(i * seq_len, seq_len - 1)) & (ends < (i + 1) * seq_len)]
            if len(inside):
                out[i] = val_ids[inside[-1] + 1 - seq_len:inside[-1] + 1]
    return out
