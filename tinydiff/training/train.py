"""`tinydiff train`: trains a small Llama-layout model on stories, causal (ar) or masked diffusion (mdm).

    tinydiff train --objective ar  --data A.txt B.txt --val V.txt --out runs/ar
    tinydiff train --objective mdm --data A.txt B.txt --val V.txt --out runs/mdm
    tinydiff train --objective block --block-size 8 --init weights/stories5m-ar ... --out runs/bd

PyTorch is an optional extra (`pip install .[train]`) imported only here, inside run_train.

The run folder OUT holds:
    tokenizer.json   the byte-level BPE (trained on the training stories unless --tokenizer is given)
    checkpoint.pt    the resumable state (model, optimizer, step; torch.save, never shipped)
    log.csv          step, tokens, lr, train_loss, val_loss, elapsed_s
    loss.svg         the log's train and validation loss curves, drawn when the run stops
    args.json        the settings of the run
    model/           the export with the best validation loss so far: config.json (Hugging Face Llama
                     form), model.safetensors, tokenizer.json. Replaced as a whole, never half-written.

The model is Llama: RMSNorm, rotate-half RoPE (theta 10000), SwiGLU MLP, optional GQA, tied
embeddings, tensors named as in transformers, so the ar export loads as LlamaForCausalLM.

Objectives, per sequence of token ids x (L tokens):
    ar   mean over positions of -log p(x[i+1] | x[..i]), causal attention.
    mdm  t ~ U(eps, 1) (stratified over the batch); each token replaced by <|mask|> with
         probability t; loss = sum over masked i of -log p(x[i] | masked x) / t, divided by L (the
         MDLM/LLaDA bound on -log p(x) per token, so both losses are nats per token), bidirectional.
         --shift-logits (Dream, DiffuLLaMA): x[i] is predicted by row i-1, as an AR model predicts
         it, so an AR model given by --init starts from its own habits (x[0] is never masked).
    mlm15 (BERT, Devlin et al. 2019): 15% of the tokens chosen; of those 80% become <|mask|>,
         10% a random token, 10% stay; loss = mean CE over the chosen tokens, bidirectional. A
         masked-diffusion model frozen at one mask rate (t = 0.15, unweighted): the twin that
         shows what training at every rate buys.
    block (BD3-LM's objective, with an AR model's conventions so an AR checkpoint adapts to it
         SDAR-style, --init): x is cut into blocks of --block-size; each block gets its own rate
         t ~ U(eps, 1) and is masked at it. One pass runs [noisy x ; clean x] (positions 0..L-1
         twice): the clean half causally, as an AR model reads text; a noisy block sees itself
         (bidirectionally) and the clean positions before it, never a later block. Row i predicts
         position i+1, as in the AR model: a masked position is predicted from the noisy row before
         it, the first of a block from the clean row before it (the row decoding keeps when it caches
         a block, decoding/diffusion.py). loss = sum over masked positions of CE / t over L, plus
         the clean half's next-token CE, which keeps the rows the next block starts from sharp.

--short-steps N: the first N steps cut each sequence into --short-len windows (same tokens). The
mdm needs it: a masked position has no token of its own, so all it learns comes through attention,
and with 512 keys each gets 1/512 of the attention at the start. At 512 tokens from the first step
the mdm sat at the bag-of-words loss (the unigram entropy) for 100+ steps; with 64-token windows it
leaves that plateau within ~150 steps. (BERT trained 90% of its steps at 128 tokens for speed.)

Data: each epoch shuffles the stories (seeded) and packs them into sequences of --seq-len tokens,
each sequence starting at a story start, stories joined by <|endoftext|>; the story that overflows
a sequence is cut there. --unit-ends P replaces a share P of them by sequences that end where a
story or a paragraph ends, as every sequence `tinydiff eval` scores does: a bidirectional model
sees where its canvas ends, and from packed sequences alone it learns that text runs on past it.
(Measured on stories5m-mdm: 1.5 and 1.8 nats more than the AR model on a held-out paragraph's last
two tokens, ~0.5 a token elsewhere; --unit-ends 0.5 took 0.2 nats off the last token and left the
paragraph bound where it was.) Validation: the held-out stories joined the same way, cut into
consecutive windows, the first --eval-tokens of them; the mdm masks for validation are drawn once,
so successive evaluations differ only by the model.

Determinism: everything random is seeded from --seed and the step, so a run resumed from a
checkpoint reproduces the uninterrupted run exactly (same --threads).
"""
import csv
import json
import math
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from ..errors import ModelError, UsageError, is_integer
from ..formats import bpe
from . import corpus

EOT, MASK = "<|endoftext|>", "<|mask|>"
MDM_EPS = 1e-3          # smallest mask rate drawn: keeps the 1/t weight finite
RMS_EPS = 1e-5
ROPE_THETA = 10000.0
STATE_FILES = ("checkpoint.pt", "log.csv", "loss.svg", "args.json", "tokenizer.json", "model")
LOG_FIELDS = ["step", "tokens", "lr", "train_loss", "val_loss", "elapsed_s"]


def add_train_arguments(p):
    p.add_argument("--objective", choices=["ar", "mdm", "block", "mlm15"],
                   help="ar: next-token, causal; mdm: masked diffusion, bidirectional; block: block "
                        "diffusion; mlm15: BERT's masked LM, 15%% of tokens, bidirectional")
    p.add_argument("--data", nargs="+", help="training text files (stories split by <|endoftext|>)")
    p.add_argument("--val", help="held-out text file")
    p.add_argument("--out", required=True, help="run folder (refused if it exists, unless --force or --resume)")
    p.add_argument("--tokenizer", help="tokenizer.json to use (default: train one on --data)")
    p.add_argument("--vocab-size", type=int, default=2048, help="BPE vocabulary when training one (default 2048)")
    p.add_argument("--dim", type=int, default=256, help="hidden size (default 256)")
    p.add_argument("--layers", type=int, default=6, help="transformer blocks (default 6)")
    p.add_argument("--heads", type=int, default=8, help="query heads (default 8)")
    p.add_argument("--kv-heads", type=int, help="key/value heads (default: --heads)")
    p.add_argument("--hidden", type=int, help="MLP width (default: 8/3 dim rounded up to 32)")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per training sequence (default 512)")
    p.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    p.add_argument("--short-steps", type=int, default=0,
                   help="for this many first steps, cut every sequence into windows of --short-len tokens "
                        "(same tokens, shorter attention span; BERT's sequence-length warmup). Default 0")
    p.add_argument("--short-len", type=int, default=64, help="window of the --short-steps phase (default 64)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    p.add_argument("--warmup", type=int, default=100, help="warmup steps (default 100)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay of matrices (default 0.1)")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout on the embeddings and each block's two residual writes, while training "
                        "(default 0)")
    p.add_argument("--input-mask", type=float, default=0.0,
                   help="ar: replace this share of input tokens by <|mask|>, the targets kept (masked-input "
                        "regularisation; default 0)")
    p.add_argument("--paragraph-starts", type=float, default=0.0,
                   help="start this share of the stories at one of their later paragraphs, so text after "
                        "<|endoftext|> may begin mid-story, as a paragraph scored alone does (default 0)")
    p.add_argument("--unit-ends", type=float, default=0.0,
                   help="make this share of the sequences (and of the validation windows) end where a story "
                        "or a paragraph ends, as the sequences `tinydiff eval` scores do (default 0)")
    p.add_argument("--tokens", type=float, default=12e6, help="training tokens in all (default 12e6)")
    p.add_argument("--eval-every", type=int, default=50, help="steps between validations (default 50)")
    p.add_argument("--eval-tokens", type=int, default=65536, help="validation tokens per evaluation (default 65536)")
    p.add_argument("--checkpoint-minutes", type=float, default=5.0, help="minutes between checkpoints (default 5)")
    p.add_argument("--stop-after", type=int, help="save a checkpoint and stop after this step (resume later)")
    p.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                   help="compute: f32, or bf16 autocast (weights and optimizer stay f32; ~2x faster on CPUs "
                        "with AMX/AVX512-BF16)")
    p.add_argument("--export-dtype", choices=["bf16", "f16", "f32"], default="bf16",
                   help="storage of the exported weights (default bf16)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--block-size", type=int,
                   help="block objective: positions per block (default 8; refused with the other objectives)")
    p.add_argument("--shift-logits", action="store_true",
                   help="mdm: row i predicts position i+1 (Dream's convention, an AR model's: the way to "
                        "start a masked-diffusion model from an AR one with --init)")
    p.add_argument("--init", help="start from this model folder's weights (its shape and tokenizer); "
                                  "e.g. an AR model to adapt to the block objective")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--force", action="store_true", help="start afresh in an existing run folder")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")


# ---------------------------------------------------------------------------------------------
# Setup: folder, tokenizer, data (no torch needed)

# Settings that define a run: a resumed run takes them from args.json, not from the command line.
RUN_KEYS = ("objective", "data", "val", "vocab_size", "dim", "layers", "heads", "kv_heads", "hidden",
            "seq_len", "batch", "short_steps", "short_len", "lr", "warmup", "weight_decay", "dropout",
            "input_mask", "paragraph_starts", "unit_ends", "shift_logits", "tokens",
            "eval_every", "eval_tokens", "precision", "export_dtype", "seed", "block_size", "init")


def settle_settings(args):
    """The run's settings, checked, with nothing written yet: on --resume those of OUT/args.json,
    else the flags (the shape taken from --init, the defaults that depend on others filled in).
    A new run into an OUT that holds files is refused here unless --force."""
    out = args.out
    if args.resume:
        if not os.path.exists(os.path.join(out, "checkpoint.pt")):
            raise UsageError(f"{out}: no checkpoint.pt to resume from")
        path = os.path.join(out, "args.json")
        saved = _json_object(path, ModelError, path)
        print(f"resume: the run's settings come from {path}", file=sys.stderr)
        defaults = _defaults()
        for k in RUN_KEYS:
            given, was = getattr(args, k), saved.get(k, defaults[k])
            if given != defaults[k] and given != was:
                raise UsageError(f"--resume: --{k.replace('_', '-')} {given} differs from the run's {was} "
                                 f"({path}); leave it out, or start a new run")
            setattr(args, k, was)
        return args
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"{out}: not a folder")
    if os.path.exists(out) and os.listdir(out) and not args.force:
        raise UsageError(f"{out}: already exists (use --resume to continue it, --force to start afresh)")
    if args.init:
        _take_shape_from(args, args.init)
    if args.kv_heads is None:
        args.kv_heads = args.heads
    if args.hidden is None:
        args.hidden = -(-8 * args.dim // 3 // 32) * 32
    if args.block_size is None and args.objective == "block":
        args.block_size = 8
    _check_shape(args)
    return args


def make_folder(args):
    """OUT for the settled settings: created (our files in it cleared for --force) with its
    args.json; on --resume, left as it is."""
    out = args.out
    if args.resume:
        return args
    if args.force and os.path.isdir(out):
        for name in STATE_FILES:
            path = os.path.join(out, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "args.json"), "w", encoding="utf-8") as f:
        json.dump({k: getattr(args, k) for k in RUN_KEYS}, f, indent=1)
    return args


def check_regularisers(args):
    """The flags that shape the objective, checked before torch is even imported."""
    if not args.resume:
        for k in ("objective", "data", "val"):
            if getattr(args, k) is None:
                raise UsageError(f"tinydiff train: --{k} is required (a resumed run takes it from its args.json)")
    for k in ("dropout", "input_mask", "paragraph_starts", "unit_ends"):
        if not 0 <= getattr(args, k) < 1:
            raise UsageError(f"--{k.replace('_', '-')} must be in [0, 1), got {getattr(args, k)}")
    if args.shift_logits and args.objective != "mdm":
        raise UsageError(f"--shift-logits is a choice of the mdm objective ({args.objective} "
                         f"{'always' if args.objective == 'block' else 'never'} shifts)")
    if args.unit_ends and args.objective == "ar":
        raise UsageError("--unit-ends is for the bidirectional objectives: a causal model never sees where its "
                         "sequence ends")
    if args.input_mask and args.objective != "ar":
        raise UsageError(f"--input-mask is a regulariser of the ar objective; {args.objective} masks its inputs itself")
    if args.block_size is not None and args.objective not in (None, "block"):
        raise UsageError(f"--block-size is a setting of the block objective; {args.objective} has no blocks")


def check_run_flags(args):
    """The numbers that steer the run (tokenizer size, optimizer, schedule, checkpoints, threads),
    checked before torch is imported and before OUT is made."""
    if args.vocab_size < 256 + 2:
        raise UsageError(f"--vocab-size {args.vocab_size} leaves no room for the 256 bytes and the 2 special "
                         f"tokens (258 at least)")
    if not 0 <= args.seed < 2**32:
        raise UsageError(f"--seed must be from 0 to 2**32 - 1, got {args.seed}")
    for k in ("lr", "tokens"):
        if not 0 < getattr(args, k) < math.inf:
            raise UsageError(f"--{k} must be positive and finite, got {getattr(args, k)}")
    if not 0 <= args.weight_decay < math.inf:
        raise UsageError(f"--weight-decay must be 0 or more and finite, got {args.weight_decay}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be 0 or more, got {args.warmup}")
    if not args.checkpoint_minutes >= 0:
        raise UsageError(f"--checkpoint-minutes must be 0 or more, got {args.checkpoint_minutes}")
    if args.stop_after is not None and args.stop_after < 0:
        raise UsageError(f"--stop-after must be 0 or more, got {args.stop_after}")
    if args.block_size is not None and args.block_size < 1:
        raise UsageError(f"--block-size must be positive, got {args.block_size}")
    if args.threads is not None:                      # the rule of the other subcommands' --threads
        from ..engine.kernels import check_threads
        check_threads(args.threads, "--threads")


def _defaults():
    """Each flag's default: on --resume, a flag that differs from it was given on purpose."""
    import argparse
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    return {a.dest: a.default for a in p._actions}


def _check_shape(args):
    for k in ("dim", "layers", "heads", "kv_heads", "hidden", "seq_len", "batch", "eval_every", "eval_tokens"):
        if getattr(args, k) <= 0:
            raise UsageError(f"--{k.replace('_', '-')} must be positive")
    if args.dim % args.heads or (args.dim // args.heads) % 2:
        raise UsageError(f"--dim {args.dim} must split into --heads {args.heads} heads of even size")
    if args.short_steps < 0:
        raise UsageError("--short-steps must be 0 or more")
    if args.short_steps and (args.short_len <= 0 or args.seq_len % args.short_len):
        raise UsageError(f"--short-len {args.short_len} must divide --seq-len {args.seq_len}")
    if args.heads % args.kv_heads:
        raise UsageError(f"--heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")
    if args.objective == "block" and (args.block_size < 1 or args.seq_len % args.block_size):
        raise UsageError(f"--block-size {args.block_size} must divide --seq-len {args.seq_len}")


def _json_object(path, error, what):
    """The JSON object in the file at path; else error(f"{what}: ...") in one line."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise error(f"{what}: cannot read ({e})") from None
    if not isinstance(obj, dict):
        raise error(f"{what}: not a JSON object")
    return obj


def _take_shape_from(args, folder):
    """--init: the model's shape and tokenizer are those of the folder it starts from."""
    path = os.path.join(folder, "config.json")
    cfg = _json_object(path, UsageError, f"--init {path}")
    if cfg.get("num_key_value_heads") is None:                  # no GQA: as many as the query heads
        cfg = dict(cfg, num_key_value_heads=cfg.get("num_attention_heads"))
    keys = {"dim": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
            "kv_heads": "num_key_value_heads", "hidden": "intermediate_size", "vocab_size": "vocab_size"}
    for ours, key in keys.items():
        if not is_integer(cfg.get(key)) or cfg[key] <= 0:
            raise UsageError(f"--init {path}: field '{key}' should be a positive whole number, got {cfg.get(key)!r}")
        setattr(args, ours, cfg[key])
    args.tokenizer = args.tokenizer or os.path.join(folder, "tokenizer.json")


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


def lr_at(step, total, peak, warmup):
    """Linear warmup, then cosine decay to a tenth of the peak at the last step."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


# ---------------------------------------------------------------------------------------------
# The model and the losses (torch)

def build_model(torch, cfg, dropout=0.0):
    """A Llama with transformers' tensor names. cfg: the config.json dict; dropout: while training,
    on the embeddings and the two residual writes of each block (not on the attention weights:
    with it, PyTorch's CPU attention leaves its fused kernel and a step takes ~2x as long)."""
    nn, F = torch.nn, torch.nn.functional
    d, hd = cfg["hidden_size"], cfg["head_dim"]
    H, KVH = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]))

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(d, H * hd, bias=False)
            self.k_proj = nn.Linear(d, KVH * hd, bias=False)
            self.v_proj = nn.Linear(d, KVH * hd, bias=False)
            self.o_proj = nn.Linear(H * hd, d, bias=False)

        def forward(self, x, cos, sin, mask):
            B, L, _ = x.shape
            q = self.q_proj(x).view(B, L, H, hd).transpose(1, 2)     # [B, H, L, hd]
            k = self.k_proj(x).view(B, L, KVH, hd).transpose(1, 2)   # [B, KVH, L, hd]
            v = self.v_proj(x).view(B, L, KVH, hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            if KVH != H:  # query head h reads kv head h // (H // KVH), as transformers' repeat_kv
                k, v = k.repeat_interleave(H // KVH, dim=1), v.repeat_interleave(H // KVH, dim=1)
            # mask: True causal, False bidirectional, or a bool [L, L] tensor (True = may attend)
            y = (F.scaled_dot_product_attention(q, k, v, is_causal=mask) if isinstance(mask, bool)
                 else F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
            return self.o_proj(y.transpose(1, 2).reshape(B, L, H * hd))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            f = cfg["intermediate_size"]
            self.gate_proj = nn.Linear(d, f, bias=False)
            self.up_proj = nn.Linear(d, f, bias=False)
            self.down_proj = nn.Linear(f, d, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm()
            self.self_attn = Attention()
            self.post_attention_layernorm = RMSNorm()
            self.mlp = MLP()
            self.drop = nn.Dropout(dropout)

        def forward(self, x, cos, sin, mask):
            x = x + self.drop(self.self_attn(self.input_layernorm(x), cos, sin, mask))
            return x + self.drop(self.mlp(self.post_attention_layernorm(x)))

    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(cfg["vocab_size"], d)
            self.layers = nn.ModuleList(Block() for _ in range(cfg["num_hidden_layers"]))
            self.norm = RMSNorm()

    def rope(x, cos, sin):
        """rotate-half RoPE: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Body()
            inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            self.register_buffer("inv_freq", inv_freq, persistent=False)
            self.drop = nn.Dropout(dropout)

        def hidden(self, ids, causal, pos=None):
            """[B, L] ids -> [B, L, d] final-norm hidden states. causal: True, False or a bool [L, L]
            attention mask; pos: the L positions (default 0..L-1)."""
            pos = torch.arange(ids.shape[1], dtype=torch.float32) if pos is None else pos.to(torch.float32)
            freqs = torch.outer(pos, self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)              # [L, hd]
            cos, sin = emb.cos(), emb.sin()
            x = self.drop(self.model.embed_tokens(ids))
            for layer in self.model.layers:
                x = layer(x, cos, sin, causal)
            return self.model.norm(x)

        def logits(self, h):
            return h @ self.model.embed_tokens.weight.T          # tied LM head

    model = Llama()
    _init_weights(torch, model, cfg["num_hidden_layers"])
    return model


def load_init(torch, model, folder):
    """--init: the folder's model.safetensors into the model (tensor names are transformers')."""
    from ..formats.safetensors import load_checkpoint
    ckpt = load_checkpoint(folder)
    state = model.state_dict()
    missing = [name for name in state if name not in ckpt]
    if missing:
        raise UsageError(f"--init {folder}: no tensor {missing[0]} (a tinydiff train model of another layout?)")
    model.load_state_dict({name: torch.from_numpy(np.array(ckpt.f32(name))) for name in state})


def _init_weights(torch, model, n_layers):
    """N(0, 0.02) everywhere, the two projections that write into the residual stream scaled by
    1/sqrt(2 n_layers) (GPT-2), so the stream's variance does not grow with depth."""
    for name, p in model.named_parameters():
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            continue
        std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
        torch.nn.init.normal_(p, mean=0.0, std=std)


def ar_loss(torch, model, x, input_mask=0.0, mask_id=None, gen=None):
    """Mean next-token cross-entropy over the sequence (nats per predicted token). input_mask: the
    share of input tokens replaced by mask_id (the targets are the true tokens)."""
    inputs = x[:, :-1]
    if input_mask:
        inputs = torch.where(torch.rand(inputs.shape, generator=gen) < input_mask, mask_id, inputs)
    logits = model.logits(model.hidden(inputs, causal=True))
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def mdm_mask(torch, x, t, mask_id, gen, shift=False):
    """(masked input, bool mask): each token masked with its sequence's probability t [B]; with
    shift, never the first (no row before it to predict it)."""
    m = torch.rand(x.shape, generator=gen) < t[:, None]
    if shift:
        m[:, 0] = False
    return torch.where(m, torch.full_like(x, mask_id), x), m


MLM_RATE = 0.15


def mlm_corrupt(torch, x, mask_id, vocab_size, gen):
    """(BERT's input, bool chosen): MLM_RATE of the tokens chosen; of those 80% <|mask|>, 10% a
    random id, 10% kept."""
    chosen = torch.rand(x.shape, generator=gen) < MLM_RATE
    how = torch.rand(x.shape, generator=gen)
    random_ids = torch.randint(0, vocab_size, x.shape, generator=gen)
    return torch.where(chosen & (how < 0.8), mask_id, torch.where(chosen & (how < 0.9), random_ids, x)), chosen


def mlm_loss(torch, model, x, mask_id, gen):
    """BERT's masked-LM loss (module docstring), nats per chosen token."""
    xm, chosen = mlm_corrupt(torch, x, mask_id, model.model.embed_tokens.num_embeddings, gen)
    h = model.hidden(xm, causal=False)[chosen]                                # [n_chosen, d]
    return torch.nn.functional.cross_entropy(model.logits(h), x[chosen])


def mdm_loss(torch, model, x, t, mask_id, gen, shift=False):
    """The masked-diffusion bound on -log p(x) per token: sum over masked tokens of CE / t, over B*L.
    shift (Dream): position i is predicted by row i-1."""
    xm, m = mdm_mask(torch, x, t, mask_id, gen, shift)
    h = model.hidden(xm, causal=False)
    if shift:
        h = torch.cat([h[:, :1], h[:, :-1]], dim=1)                            # row i-1 -> position i
    h = h[m]                                                                  # [n_masked, d]
    ce = torch.nn.functional.cross_entropy(model.logits(h), x[m], reduction="none")
    weight = (1.0 / t)[:, None].expand_as(x)[m]
    return (ce * weight).sum() / x.numel()


def block_attention(torch, L, b):
    """The bool [2L, 2L] mask of the block objective's pass over [noisy ; clean] (True = may attend):
    clean rows causal over the clean half; a noisy block over itself and the clean positions before it."""
    i = torch.arange(L)
    blk = i // b
    noisy_noisy = blk[None, :] == blk[:, None]
    noisy_clean = blk[None, :] < blk[:, None]
    clean_clean = i[None, :] <= i[:, None]
    top = torch.cat([noisy_noisy, noisy_clean], dim=1)
    bottom = torch.cat([torch.zeros(L, L, dtype=torch.bool), clean_clean], dim=1)
    return torch.cat([top, bottom], dim=0)


def block_loss(torch, model, x, b, mask_id, gen):
    """The block objective (module docstring), nats per token: masked CE / t over B*L, plus the
    clean half's next-token CE."""
    B, L = x.shape
    t = MDM_EPS + (1 - MDM_EPS) * torch.rand(B, L // b, generator=gen)       # a rate per block
    t_pos = t.repeat_interleave(b, dim=1)                                     # [B, L]
    m = torch.rand(x.shape, generator=gen) < t_pos
    m[:, 0] = False                                                           # no row before it
    xt = torch.where(m, torch.full_like(x, mask_id), x)
    pos = torch.arange(L)
    h = model.hidden(torch.cat([xt, x], dim=1), block_attention(torch, L, b), torch.cat([pos, pos]))
    src = torch.where(pos % b == 0, L + pos - 1, pos - 1)                   # the row that predicts position i
    rows = h[:, src.clamp(min=0)][m]                                         # [n_masked, d]
    F = torch.nn.functional
    ce = F.cross_entropy(model.logits(rows), x[m], reduction="none")
    clean = model.logits(h[:, L:-1])                                          # clean rows predict the next token
    ar = F.cross_entropy(clean.reshape(-1, clean.shape[-1]), x[:, 1:].reshape(-1))
    return (ce / t_pos[m]).sum() / x.numel() + ar


def mask_rates(torch, n, gen):
    """n mask rates in (eps, 1), one per sequence: t_i = (u + i/n) mod 1 for one uniform u, MDLM's
    low-discrepancy sampler. Each t is still uniform, so the loss is the same bound, but a batch
    covers the range evenly and the gradient's variance drops."""
    u = torch.rand(1, generator=gen)
    return MDM_EPS + (1 - MDM_EPS) * torch.remainder(u + torch.arange(n) / n, 1.0)


def step_generator(torch, seed, step):
    """The random stream of one training step: a resumed run draws the same masks."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def autocast(torch, args):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")


def train_loss(torch, model, x, args, mask_id, step):
    torch.manual_seed(args.seed * 1_000_003 + step)      # dropout's stream: a resumed run drops the same
    with autocast(torch, args):
        gen = step_generator(torch, args.seed, step)
        if args.objective == "ar":
            return ar_loss(torch, model, x, args.input_mask, mask_id, gen)
        if args.objective == "block":
            return block_loss(torch, model, x, args.block_size, mask_id, gen)
        if args.objective == "mlm15":
            return mlm_loss(torch, model, x, mask_id, gen)
        return mdm_loss(torch, model, x, mask_rates(torch, x.shape[0], gen), mask_id, gen, args.shift_logits)


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


def evaluate(torch, model, windows, args, mask_id, batch):
    """Validation loss, nats per token (mlm15: per chosen token). mdm: mask rates stratified over the
    windows, t_i in the i-th of n equal slices of (eps, 1), from a fixed seed so every evaluation
    sees the same masks."""
    model.eval()
    x_all = torch.from_numpy(windows)
    n = len(windows)
    gen = torch.Generator().manual_seed(12345)
    t_all = MDM_EPS + (1 - MDM_EPS) * (torch.randperm(n, generator=gen) + torch.rand(n, generator=gen)) / n
    total, count = 0.0, 0
    with torch.no_grad(), autocast(torch, args):
        for i in range(0, n, batch):
            x = x_all[i:i + batch]
            if args.objective == "ar":
                total += ar_loss(torch, model, x).item() * x[:, 1:].numel()
                count += x[:, 1:].numel()
            elif args.objective == "block":
                total += block_loss(torch, model, x, args.block_size, mask_id, gen).item() * x.numel()
                count += x.numel()
            elif args.objective == "mlm15":                          # per chosen token, batches weighed
                total += mlm_loss(torch, model, x, mask_id, gen).item() * x.numel()   # by their size
                count += x.numel()
            else:
                total += mdm_loss(torch, model, x, t_all[i:i + batch], mask_id, gen,
                                  args.shift_logits).item() * x.numel()
                count += x.numel()
    model.train()
    return total / count


# ---------------------------------------------------------------------------------------------
# Export, checkpoint, log

def model_config(args, eot, mask, vocab_size):
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.dim,
        "intermediate_size": args.hidden,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.dim // args.heads,
        "max_position_embeddings": args.seq_len,
        "rms_norm_eps": RMS_EPS,
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": vocab_size,
        "bos_token_id": None,
        "eos_token_id": eot,
        "hidden_act": "silu",
        "torch_dtype": {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[args.export_dtype],
    }
    if args.objective in ("mdm", "block", "mlm15"):
        cfg["is_causal"] = False
        cfg["mask_token_id"] = mask
    if args.objective == "block":
        cfg["block_size"] = args.block_size
    if args.objective == "block" or args.shift_logits:
        cfg["shift_logits"] = True            # row i predicts position i+1, as in the AR model
    return cfg


def export(torch, model, cfg, tokenizer_obj, args, out_dir):
    """Writes config.json, model.safetensors, tokenizer.json into a temporary folder beside
    out_dir, then swaps it in: out_dir is always a whole export or absent."""
    from ..formats.safetensors import save_safetensors
    parent = os.path.dirname(os.path.abspath(out_dir))
    tmp = tempfile.mkdtemp(dir=parent, prefix=".export-")
    tensors, dtypes = {}, {}
    for name, p in model.state_dict().items():
        p = p.detach().contiguous()
        if args.export_dtype == "bf16":
            tensors[name] = p.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            dtypes[name] = "BF16"
        else:
            tensors[name] = p.to(torch.float16 if args.export_dtype == "f16" else torch.float32).numpy()
    save_safetensors(os.path.join(tmp, "model.safetensors"), tensors, metadata={"format": "pt"}, dtypes=dtypes)
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    bpe.save_tokenizer_json(tokenizer_obj, os.path.join(tmp, "tokenizer.json"))
    os.chmod(tmp, 0o755)
    old = None
    if os.path.exists(out_dir):
        old = tempfile.mkdtemp(dir=parent, prefix=".old-")
        os.replace(out_dir, os.path.join(old, "x"))
    os.replace(tmp, out_dir)
    if old:
        shutil.rmtree(old)


def save_checkpoint(torch, path, state):
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def open_log(path, resume_step):
    """The CSV log, appending; on resume, rows past the checkpoint are dropped (they are redone)."""
    rows = []
    if resume_step is not None and os.path.exists(path):
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
    f = open(path, "w", newline="")
    w = csv.DictWriter(f, fieldnames=LOG_FIELDS)
    w.writeheader()
    w.writerows(rows)
    f.flush()
    return f, w


def draw_losses(out, title):
    """OUT/loss.svg from OUT/log.csv (the model cards show it)."""
    from ..measure.plot import loss_svg
    with open(os.path.join(out, "log.csv"), newline="") as f:
        loss_svg(list(csv.DictReader(f)), f"{title}: loss per token", os.path.join(out, "loss.svg"))


# ---------------------------------------------------------------------------------------------
# The loop

def import_torch():
    try:
        import torch
    except ImportError:
        raise UsageError("tinydiff train needs PyTorch: pip install 'tinydiff[train]' (or pip install torch)") from None
    return torch


def run_train(args):
    check_regularisers(args)
    check_run_flags(args)
    args = settle_settings(args)       # every check that needs no torch, before OUT is made
    torch = import_torch()
    make_folder(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok_obj, train_ids, val_ids, eot, mask_id, newline = prepare_data(args)
    for k in ("paragraph_starts", "unit_ends"):
        if getattr(args, k) and newline is None:
            raise UsageError(f"--{k.replace('_', '-')}: the tokenizer has no single token for a newline")
    vocab_size = len(tok_obj["model"]["vocab"])
    if any(t["id"] >= vocab_size for t in tok_obj["added_tokens"]):
        raise UsageError("tokenizer: a special token's id lies outside the model vocabulary")
    cfg = model_config(args, eot, mask_id, vocab_size)
    model = build_model(torch, cfg, args.dropout)
    if args.init and not args.resume:
        load_init(torch, model, args.init)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    tokens_per_step = args.batch * args.seq_len
    total_steps = max(1, math.ceil(args.tokens / tokens_per_step))
    windows = val_windows(val_ids, args.seq_len, args.eval_tokens, args.unit_ends, eot, newline)

    ckpt_path = os.path.join(args.out, "checkpoint.pt")
    start, best, elapsed0 = 0, math.inf, 0.0
    window_loss, window_n = 0.0, 0        # train loss summed over the steps since the last validation
    if args.resume:
        state = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start, best, elapsed0 = state["step"], state["best_val"], state["elapsed"]
        window_loss, window_n = state["window"]
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.objective}: {n_params:,} parameters, {sum(map(len, train_ids)):,} training tokens in "
          f"{len(train_ids)} stories, {windows.size:,} validation tokens; {total_steps} steps of "
          f"{tokens_per_step} tokens; starting at step {start}", flush=True)

    log_file, log = open_log(os.path.join(args.out, "log.csv"), start if args.resume else None)
    t0 = time.time()
    last_ckpt = t0

    def state_at(step):
        return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                "best_val": best, "elapsed": elapsed0 + time.time() - t0, "window": (window_loss, window_n)}

    def validate(step, train_loss_mean):
        nonlocal best
        val = evaluate(torch, model, windows, args, mask_id, args.batch)
        elapsed = elapsed0 + time.time() - t0
        lr = lr_at(step, total_steps, args.lr, args.warmup)
        log.writerow({"step": step, "tokens": step * tokens_per_step, "lr": f"{lr:.3g}",
                      "train_loss": "" if train_loss_mean is None else f"{train_loss_mean:.4f}",
                      "val_loss": f"{val:.4f}", "elapsed_s": f"{elapsed:.0f}"})
        log_file.flush()
        if val < best:
            best = val
            export(torch, model, cfg, tok_obj, args, os.path.join(args.out, "model"))
        print(f"step {step}/{total_steps} tokens {step * tokens_per_step:,} train "
              f"{'-' if train_loss_mean is None else f'{train_loss_mean:.4f}'} val {val:.4f} best {best:.4f} "
              f"elapsed {elapsed:.0f}s", flush=True)

    if start == 0:
        validate(0, None)
    step = start
    for step, x in batches(train_ids, args.seq_len, args.batch, args.seed, start,
                           paragraph_starts=args.paragraph_starts, unit_ends=args.unit_ends, newline=newline, eot=eot):
        if step >= total_steps or (args.stop_after is not None and step >= args.stop_after):
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total_steps, args.lr, args.warmup)
        if step < args.short_steps:
            x = x.reshape(-1, args.short_len)
        loss = train_loss(torch, model, torch.from_numpy(x), args, mask_id, step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        window_loss += loss.item()
        window_n += 1
        done = step + 1
        if done % args.eval_every == 0 or done == total_steps:
            validate(done, window_loss / window_n)
            window_loss, window_n = 0.0, 0
        if time.time() - last_ckpt > 60 * args.checkpoint_minutes:
            save_checkpoint(torch, ckpt_path, state_at(done))
            last_ckpt = time.time()
        step = done
    save_checkpoint(torch, ckpt_path, state_at(step))
    log_file.close()
    draw_losses(args.out, args.objective)
    print(f"stopped at step {step}; best validation loss {best:.4f}; export in {os.path.join(args.out, 'model')}")
    return 0


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="tinydiff train", description=__doc__.split("\n")[0])
    add_train_arguments(p)
    try:
        return run_train(p.parse_args(argv))
    except UsageError as e:
        print(f"tinydiff train: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
