"""The settings of a `tinydiff train` run: its flags, their checks, and the run folder OUT with args.json.

No torch here: every check runs before torch is imported and before OUT is made, so a refused
command leaves nothing behind and the corrected one runs in the same folder. Takes the parsed
flags (add_train_arguments); guarantees settled settings: on --resume those of OUT/args.json (a
flag given that differs from them is refused), else the flags with the shape taken from --init and
the defaults that depend on other flags filled in. train.py's docstring lists what OUT holds.
"""
import json
import math
import os
import shutil
import sys

from ..errors import ModelError, UsageError, is_integer

STATE_FILES = ("checkpoint.pt", "log.csv", "loss.svg", "args.json", "tokenizer.json", "model")   # a run's files in OUT


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
