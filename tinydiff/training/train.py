"""`tinydiff train`: trains a small Llama-layout model on stories, causal (ar) or masked diffusion (mdm).

    tinydiff train --objective ar  --data A.txt B.txt --val V.txt --out runs/ar
    tinydiff train --objective mdm --data A.txt B.txt --val V.txt --out runs/mdm
    tinydiff train --objective block --block-size 8 --init weights/stories5m-ar ... --out runs/bd

This module holds the run: the loop, the learning-rate schedule, the export, the checkpoint and
the log. Its parts: settings.py (the flags and their checks, OUT and args.json), data.py (the
tokenizer, packing, the validation windows), losses.py (the objectives ar, mdm, mlm15, block, in
its docstring), torch_llama.py (the model). PyTorch is an optional extra (`pip install .[train]`)
imported only inside run_train; torch_llama.py, which needs it at import, only after that.

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

--short-steps N: the first N steps cut each sequence into --short-len windows (same tokens). The
mdm needs it: a masked position has no token of its own, so all it learns comes through attention,
and with 512 keys each gets 1/512 of the attention at the start. At 512 tokens from the first step
the mdm sat at the bag-of-words loss (the unigram entropy) for 100+ steps; with 64-token windows it
leaves that plateau within ~150 steps. (BERT trained 90% of its steps at 128 tokens for speed.)

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

from ..errors import UsageError
from ..formats import bpe
from .data import batches, prepare_data, val_windows
from .losses import train_loss, validation_loss
from .settings import (
    add_train_arguments,
    check_regularisers,
    check_run_flags,
    make_folder,
    settle_settings,
)

RMS_EPS = 1e-5
ROPE_THETA = 10000.0
LOG_FIELDS = ["step", "tokens", "lr", "train_loss", "val_loss", "elapsed_s"]


def lr_at(step, total, peak, warmup):
    """Linear warmup, then cosine decay to a tenth of the peak at the last step."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


# ---------------------------------------------------------------------------------------------
# The model: made, started from --init, exported

def build_model(torch, cfg, dropout=0.0):
    """torch_llama.Llama for the config.json dict cfg, its weights drawn from torch's seeded stream.
    torch: the module import_torch returned; torch_llama, which imports it at its top, is imported
    here, after it, so a missing torch is import_torch's one-line error."""
    from .torch_llama import Llama, LlamaConfig
    return Llama(LlamaConfig.of(cfg, dropout))


def load_init(torch, model, folder):
    """--init: the folder's model.safetensors into the model (tensor names are transformers')."""
    from ..formats.safetensors import load_checkpoint
    ckpt = load_checkpoint(folder)
    state = model.state_dict()
    missing = [name for name in state if name not in ckpt]
    if missing:
        raise UsageError(f"--init {folder}: no tensor {missing[0]} (a tinydiff train model of another layout?)")
    model.load_state_dict({name: torch.from_numpy(np.array(ckpt.f32(name))) for name in state})


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


# ---------------------------------------------------------------------------------------------
# Checkpoint and log

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
    f = open(path, "w", newline="")          # noqa: SIM115 (the loop writes to it until the run stops)
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


def vocabulary_size(args, tok_obj, newline):
    """The model's vocabulary: the tokenizer's, once it is seen to hold the special tokens' ids and,
    for the flags that cut at paragraphs, a newline token."""
    for k in ("paragraph_starts", "unit_ends"):
        if getattr(args, k) and newline is None:
            raise UsageError(f"--{k.replace('_', '-')}: the tokenizer has no single token for a newline")
    vocab_size = len(tok_obj["model"]["vocab"])
    if any(t["id"] >= vocab_size for t in tok_obj["added_tokens"]):
        raise UsageError("tokenizer: a special token's id lies outside the model vocabulary")
    return vocab_size


def make_optimizer(torch, model, args):
    """AdamW, the weight decay on the matrices only (not on the norms' gains)."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


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
    vocab_size = vocabulary_size(args, tok_obj, newline)
    cfg = model_config(args, eot, mask_id, vocab_size)
    model = build_model(torch, cfg, args.dropout)
    if args.init and not args.resume:
        load_init(torch, model, args.init)
    opt = make_optimizer(torch, model, args)
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
        val = validation_loss(torch, model, windows, args, mask_id, args.batch)
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
