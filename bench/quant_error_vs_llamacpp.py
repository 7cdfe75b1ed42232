"""tinydiff convert against llama-quantize on the same F32 GGUF: per tensor, the RMSE of each one's
quantization against the f32 weights, and whether the bytes are the same.

    python bench/quant_error_vs_llamacpp.py --llama-quantize /tmp/llama.cpp/build/bin/llama-quantize \
        [--types q4_k_m,q5_k_m,...] [--keep DIR] F32.gguf [F32.gguf ...]

Per file and type it runs `llama-quantize F32.gguf theirs.gguf TYPE 2` and `tinydiff convert -m
F32.gguf --type TYPE -o ours.gguf` (timing each), reads both back with tinydiff's reader, and
prints per type: tensors whose types differ, tensors and blocks with different bytes, and the
ratio ours / theirs of the per-tensor RMSE (worst and mean; the issue's target: within 2 %), plus
the two wall times. The files go to a temporary folder unless --keep.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from tinydiff.formats import quant
from tinydiff.formats.gguf import open_gguf

TYPES = "q4_k_m,q5_k_m,q6_k,q4_k_s,q5_k_s,q5_0,q5_1,q4_1,q4_0,q8_0"


def timed(argv):
    t = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - t


def rmse(a, b):
    return float(np.sqrt(np.mean((a.astype(np.float64) - b) ** 2)))


def compare(src, ours, theirs):
    f, a, b = open_gguf(src), open_gguf(ours), open_gguf(theirs)
    types = blocks = bad_blocks = bad_tensors = 0
    ratios = []
    for name in f.tensors:
        if a.type_name(name) != b.type_name(name):
            types += 1
            continue
        ra, rb = a.raw(name), b.raw(name)
        same = (ra.view(np.uint8).reshape(*ra.shape, -1) == rb.view(np.uint8).reshape(*rb.shape, -1)).all(-1)
        blocks, bad_blocks, bad_tensors = blocks + same.size, bad_blocks + (~same).sum(), bad_tensors + (not same.all())
        if a.type_name(name) != f.type_name(name):
            w = quant.dequantize(f.raw(name))
            ea, eb = rmse(quant.dequantize(ra), w), rmse(quant.dequantize(rb), w)
            ratios.append(ea / eb if eb else (1.0 if ea == 0 else np.inf))
    return types, bad_tensors, bad_blocks, blocks, ratios


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-quantize", required=True)
    p.add_argument("--types", default=TYPES)
    p.add_argument("--keep", help="folder to keep the quantized files in")
    p.add_argument("files", nargs="+")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = a.keep or tmp
        for src in a.files:
            base = os.path.basename(src).removesuffix(".gguf")
            for t in a.types.split(","):
                ours, theirs = (os.path.join(out, f"{base}-{t}-{who}.gguf") for who in ("tinydiff", "llama"))
                t_theirs = timed([a.llama_quantize, src, theirs, t.upper(), "2"])
                t_ours = timed([sys.executable, "-m", "tinydiff", "convert", "-m", src, "--type", t, "-o", ours])
                types, bad_t, bad_b, n_b, r = compare(src, ours, theirs)
                print(f"{base} {t:7s} type mismatches {types}, tensors with other bytes {bad_t}, "
                      f"blocks {bad_b}/{n_b}; RMSE ours/theirs worst {max(r):.4f} mean {np.mean(r):.4f} "
                      f"({len(r)} tensors); time tinydiff {t_ours:.1f} s, llama-quantize {t_theirs:.1f} s", flush=True)


if __name__ == "__main__":
    main()
