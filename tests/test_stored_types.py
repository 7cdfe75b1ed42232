"""Safetensors matrices run in their stored type (f16, bf16), as views of the mapped file.

A 16 GB bf16 checkpoint must not become 32 GB of f32 at load: every matrix stays a view of the map
in its stored type and the kernels read it there; only vectors (norms, biases) are widened.
"""
import os
import shutil

import numpy as np

import tinydiff
from tinydiff.formats import quant
from tinydiff.formats.safetensors import load_checkpoint, save_safetensors

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")


def _arrays(model, ndim):
    w = model.weights
    arrays = [w.embed_tokens, w.lm_head, w.norm] + [a for lw in w.layers for a in vars(lw).values() if a is not None]
    return list({id(a): a for a in arrays if a.ndim == ndim}.values())   # a tied lm_head once


def test_bf16_matrices_are_views_of_the_file_in_bf16():
    model = tinydiff.load(os.path.join(HF, "llama-bf16"))
    assert all(a.dtype == quant.BF16 for a in _arrays(model, 2))
    assert all(a.dtype == np.float32 for a in _arrays(model, 1))
    by_type, mapped = model.weight_bytes()
    assert mapped == by_type["bf16"] == sum(a.nbytes for a in _arrays(model, 2))
    assert by_type["f32"] == sum(a.nbytes for a in _arrays(model, 1))


def _rewritten(tmp_path, name, dtype):
    """The fixture `name` with every matrix stored as dtype ("F16" or "F32") and vectors as F32."""
    src, out = os.path.join(HF, name), tmp_path / f"{name}-{dtype}"
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.npy", "model.safetensors"))
    ckpt = load_checkpoint(src)
    tensors = {n: ckpt.f32(n) for n in ckpt.names}
    half = {n: a.astype(np.float16) for n, a in tensors.items() if a.ndim == 2}
    tensors.update(half if dtype == "F16" else {n: h.astype(np.float32) for n, h in half.items()})
    save_safetensors(out / "model.safetensors", tensors)
    return str(out)


def test_f16_matrices_run_in_f16_and_give_the_f32_logits_of_the_same_numbers(tmp_path):
    f16 = tinydiff.load(_rewritten(tmp_path, "llama-gqa", "F16"))
    f32 = tinydiff.load(_rewritten(tmp_path, "llama-gqa", "F32"))
    assert all(a.dtype == np.float16 for a in _arrays(f16, 2))
    assert all(a.dtype == np.float32 for a in _arrays(f32, 2))
    by_type, mapped = f16.weight_bytes()
    assert by_type["f16"] == sum(a.size * 2 for a in _arrays(f32, 2))
    assert mapped == sum(by_type.values())   # F32 vectors are views of the file too
    ids = list(range(3, 40))
    a, b = f16.logits(ids), f32.logits(ids)
    # the f16 dot product reads f32 x and sums in f32: only the order of the sums differs
    assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()
    assert f16.generate_ids(ids[:5], 12, temperature=0) == f32.generate_ids(ids[:5], 12, temperature=0)
