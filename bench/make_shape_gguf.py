"""GGUF files of a real model shape with random weights, for side-by-side runs with llama.cpp.

    python bench/make_shape_gguf.py --shape SmolLM2-135M --type f32,q8_0,q4_0 --out /tmp/shapes

writes /tmp/shapes/SmolLM2-135M-{TYPE}.gguf through `tinydiff convert`, as it converts any
checkpoint (llama.cpp's tensor names and Q/K row order): the shape's random weights saved as a
Hugging Face folder first, with a made-up byte-level BPE vocabulary of the shape's size (the 256
bytes, then merges of two byte tokens), since llama.cpp will not load a model without one. Both
programs read the same file; speed does not depend on the values.

A masked-diffusion shape (LLaDA-8B/4) is saved in LLaDA's own layout (OLMo's names and config
keys), so that convert writes a `llada` GGUF, the architecture llama.cpp's `llama-diffusion-cli`
runs.
"""
import argparse
import json
import os
import sys
import tempfile

from tinydiff.convert import convert
from tinydiff.engine.weights import HF_NAMES, LLADA_NAMES, random_weights
from tinydiff.formats.mixes import CHOICES
from tinydiff.formats.pretokenizer import BYTE_TO_CHAR
from tinydiff.formats.safetensors import save_safetensors
from tinydiff.measure.shapes import SHAPES, shape_config


def tokenizer_json(vocab_size):
    """A byte-level BPE tokenizer of vocab_size ids: the 256 byte tokens, then merges of two of
    them (each a new two-byte token) until the size is reached; ids past the merges' reach are
    plain two-byte tokens too."""
    chars = list(BYTE_TO_CHAR)
    vocab, merges = {c: i for i, c in enumerate(chars)}, []
    for a in chars:
        for b in chars:
            if len(vocab) == vocab_size:
                break
            vocab[a + b] = len(vocab)
            merges.append(f"{a} {b}")
    return {"version": "1.0", "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "vocab": vocab, "merges": merges}}


def llada_config(shape):
    """A Llama-layout shape's config.json in LLaDA's keys (GSAI-ML/LLaDA-8B-Base's)."""
    return dict(model_type="llada", architectures=["LLaDAModelLM"], d_model=shape["hidden_size"],
                n_layers=shape["num_hidden_layers"], n_heads=shape["num_attention_heads"],
                n_kv_heads=shape["num_key_value_heads"], mlp_hidden_size=shape["intermediate_size"],
                embedding_size=shape["vocab_size"], vocab_size=shape["vocab_size"],
                max_sequence_length=shape["max_position_embeddings"], rope_theta=shape.get("rope_theta", 10000.0),
                rms_norm_eps=shape["rms_norm_eps"], weight_tying=shape["tie_word_embeddings"],
                mask_token_id=shape["mask_token_id"], activation_type="silu", block_type="llama",
                include_bias=False, include_qkv_bias=False, layer_norm_type="rms", rope=True)


def hf_folder(name, folder, seed=0):
    """config.json, model.safetensors (f32) and tokenizer.json of the shape, in folder."""
    cfg = shape_config(name)
    llada = SHAPES[name].get("mask_token_id") is not None
    names = LLADA_NAMES if llada else HF_NAMES
    w = random_weights(cfg, seed)
    tensors = {names["embed_tokens"]: w.embed_tokens, names["norm"]: w.norm}
    if w.lm_head is not w.embed_tokens:
        tensors[names["lm_head"]] = w.lm_head
    for i, lw in enumerate(w.layers):
        for field, a in vars(lw).items():
            if a is not None:
                tensors[names["layer"].format(i=i) + names[field]] = a
    save_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    layout = llada_config(SHAPES[name]) if llada else {**SHAPES[name], "architectures": ["LlamaForCausalLM"]}
    config = {**layout, "torch_dtype": "float32", "bos_token_id": 0, "eos_token_id": 1}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(cfg.vocab_size), f)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", required=True, choices=sorted(SHAPES))
    p.add_argument("--type", default="f32,q8_0,q4_0", help="comma list of convert's types")
    p.add_argument("--out", required=True, help="folder for the .gguf files")
    args = p.parse_args(argv)
    types = args.type.split(",")
    if any(t not in CHOICES for t in types):
        p.error(f"--type: {args.type!r} is not a comma list of {', '.join(CHOICES)}")
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        hf_folder(args.shape, folder)
        for wtype in types:
            out = os.path.join(args.out, f"{args.shape.replace('/', '-')}-{wtype}.gguf")
            convert(folder, out, wtype)
            print(out)


if __name__ == "__main__":
    sys.exit(main())
