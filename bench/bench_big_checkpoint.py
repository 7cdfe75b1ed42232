"""A bf16 checkpoint of LLaDA-8B's shape, run from its memory map: peak RSS, one decode token, one
64-position denoising step.

    python bench/bench_big_checkpoint.py [--dir /tmp/tinydiff-llada8b] [-t 2] [--keep]

Writes a random-weight checkpoint in LLaDA's own layout (config.json with OLMo's keys, tensors
named model.transformer.*, every matrix BF16: hidden 4096, 32 layers, MLP 12288, vocabulary 126464,
untied head; 8.0 B weights, ~16 GB) into --dir, unless one is there already, then in a fresh
process loads it, runs a 1-position pass (the cost of one decode token: every weight read once)
and a 64-position bidirectional pass with the sampler's step (a prompt of 8 and 56 masks, one
step), each twice (the first run reads the pages from the file), and prints the peak resident memory against the file's size, the times and the ledger's
bytes and FLOPs for each. Peak RSS counts the mapped file's pages a pass touched: it can reach the
file size, never twice it, which is what widening bf16 to f32 at load would cost.

A benchmark, not a test: it needs ~17 GB of disk and ~18 GB of memory, and says "skipped" with the
reason where the machine lacks them. The checkpoint is removed afterwards unless --keep.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

SHAPE = dict(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, mlp_hidden_size=12288,
             embedding_size=126464, vocab_size=126464, max_sequence_length=4096, rope_theta=500000.0,
             rms_norm_eps=1e-5, weight_tying=False, mask_token_id=126336, eos_token_id=126081,
             model_type="llada", architectures=["LLaDAModelLM"], activation_type="silu", block_type="llama",
             include_bias=False, include_qkv_bias=False, layer_norm_type="rms", rope=True)
TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "weights", "stories5m-ar", "tokenizer.json")


def tensors():
    """(name, shape) of every tensor, in LLaDA's names."""
    d, f, V = SHAPE["d_model"], SHAPE["mlp_hidden_size"], SHAPE["embedding_size"]
    out = [("model.transformer.wte.weight", (V, d)), ("model.transformer.ln_f.weight", (d,)),
           ("model.transformer.ff_out.weight", (V, d))]
    for i in range(SHAPE["n_layers"]):
        b = f"model.transformer.blocks.{i}."
        out += [(b + "attn_norm.weight", (d,)), (b + "ff_norm.weight", (d,))]
        out += [(b + n + ".weight", (d, d)) for n in ("q_proj", "k_proj", "v_proj", "attn_out")]
        out += [(b + "ff_proj.weight", (f, d)), (b + "up_proj.weight", (f, d)), (b + "ff_out.weight", (d, f))]
    return out


def write_checkpoint(folder):
    """Streams the checkpoint to disk tensor by tensor (it never is in memory at once): norms are
    ones, matrices cycle through one 64 MiB block of random bf16 numbers of std ~0.02."""
    os.makedirs(folder, exist_ok=True)
    header, offset = {}, 0
    for name, shape in tensors():
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    noise = (np.random.default_rng(0).standard_normal(1 << 25, dtype=np.float32) * 0.02).view(np.uint32)
    noise = (noise >> 16).astype(np.uint16).tobytes()
    one = np.array([1.0], np.float32).view(np.uint32) >> 16
    tmp = os.path.join(folder, "model.safetensors.tmp")
    with open(tmp, "wb") as out:
        out.write(len(text).to_bytes(8, "little") + text)
        for name, shape in tensors():
            n = int(np.prod(shape)) * 2
            if len(shape) == 1:
                out.write(np.full(shape, one, np.uint16).tobytes())
                continue
            while n:
                out.write(noise[:min(n, len(noise))])
                n -= min(n, len(noise))
    os.replace(tmp, os.path.join(folder, "model.safetensors"))
    json.dump(SHAPE, open(os.path.join(folder, "config.json"), "w"), indent=1)
    shutil.copy(TOKENIZER, os.path.join(folder, "tokenizer.json"))


RUN = r"""
import json, resource, sys, time
import tinydiff
from tinydiff.engine.masks import CAUSAL
folder, threads = sys.argv[1], int(sys.argv[2])
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Python, NumPy and the kernels
t0 = time.perf_counter()
model = tinydiff.load(folder, threads=threads)
out = {"load_s": time.perf_counter() - t0, "weight_bytes": model.weight_bytes()}
for name, run in (("decode token", lambda: model.logits([5], mask=CAUSAL)),
                  ("denoise step, 64 positions", lambda: model.denoise_ids(list(range(5, 13)), 56, steps=1))):
    times = []
    for _ in range(2):   # the first reads the pages from the file, the second from memory
        with tinydiff.Ledger() as led:
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
    out[name] = {"s": times, "total": led.total()}
out["rss_before_load"] = rss0
out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(out))
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/tmp/tinydiff-llada8b", help="where the checkpoint is written (default %(default)s)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--keep", action="store_true", help="keep the checkpoint for the next run")
    a = p.parse_args()
    size = 8 + sum(int(np.prod(s)) * 2 for _, s in tensors())
    path = os.path.join(a.dir, "model.safetensors")
    have = os.path.exists(path) and os.path.getsize(path) >= size
    parent = a.dir if os.path.isdir(a.dir) else os.path.dirname(os.path.abspath(a.dir))
    free = shutil.disk_usage(parent).free
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if not have and free < size + (1 << 30):
        return print(f"skipped: the checkpoint needs {size / 1e9:.1f} GB of disk, {parent} has {free / 1e9:.1f} GB free")
    if memory < 1.1 * size:
        return print(f"skipped: the checkpoint is {size / 1e9:.1f} GB, this machine has {memory / 1e9:.1f} GB of memory")
    if not have:
        print(f"writing {size / 1e9:.2f} GB to {path} ...", flush=True)
        write_checkpoint(a.dir)
    try:
        r = subprocess.run([sys.executable, "-c", RUN, a.dir, str(a.threads)], capture_output=True, text=True)
        if r.returncode:
            sys.exit(r.stderr.strip().splitlines()[-1])
        out = json.loads(r.stdout)
    finally:
        if not a.keep:
            shutil.rmtree(a.dir, ignore_errors=True)
    by_type, mapped = out["weight_bytes"]
    print(f"file {size / 1e9:.2f} GB; weights {', '.join(f'{t} {n / 1e9:.2f} GB' for t, n in by_type.items())}, "
          f"{mapped / 1e9:.2f} GB of them mapped; load {out['load_s']:.2f} s")
    print(f"peak RSS {out['peak_rss'] / 1e9:.2f} GB = {out['peak_rss'] / size:.3f} x the file "
          f"(target <= 1.1x; widened to f32 it would be ~2x), of which {out['rss_before_load'] / 1e9:.2f} GB "
          "before loading (Python, NumPy, the kernels)")
    for name in ("decode token", "denoise step, 64 positions"):
        (cold, s), t = out[name]["s"], out[name]["total"]
        moved = sum(t["bytes"].values())
        print(f"{name:28s} {s:7.2f} s (first {cold:.2f} s)  {t['flops'] / 1e9:8.1f} GFLOP  weights {t['bytes']['weights'] / 1e9:6.2f} GB"
              f"  all bytes {moved / 1e9:6.2f} GB  -> {moved / s / 1e9:5.1f} GB/s, {t['flops'] / s / 1e9:6.1f} GFLOP/s")


if __name__ == "__main__":
    main()
