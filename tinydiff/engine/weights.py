"""The model's weights as plain arrays, carved out of the checkpoint's memory map.

Field names are the Hugging Face checkpoint keys (model.layers.{i}.self_attn.q_proj.weight, ...);
the tables below give each layout's key for each field, so a reader can grep a key from the file
and find where it lands. Every matrix keeps HF's [out, in]
layout, which is what the matmul kernel expects: y = x @ W.T. Every matrix stays in its stored
type, a view of the mmap (zero copy): f32, f16 or bf16 from safetensors, any of quant.py's types
from GGUF, except GGUF's attn_q/attn_k, whose rows are put back in HF's order (a copy, in the same
type). Vectors (norms, biases) are widened to f32, the only type the kernels take for them.

A checkpoint tensor the config leaves unread is refused, not ignored: a config.json that says one
layer for a two-layer file, a bias the config does not add, would otherwise run a different model.
Two exceptions, both as transformers loads them: rotary_emb.inv_freq buffers (old Llama saves;
RoPE's frequencies are recomputed from rope_theta), and lm_head.weight in a file whose config says
tie_word_embeddings: transformers ties the head to the embedding and overwrites the stored head
(tie_weights), so its logits come from the embedding, and ours match them.
"""
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import numpy as np

from ..formats.files import fail, show
from .config import GEMMA


def tensor(shape, matrix=False, op="norm", present=None, permuted_heads=None, *, hf, gguf, llada=None, gemma=None):
    """A LayerWeights field declared with what every reader of the table needs (LayerTensor)."""
    meta = LayerTensor(shape, matrix, op, present or (lambda c: True), permuted_heads, hf, gguf, llada, gemma or hf)
    return field(metadata={"tensor": meta}) if present is None else field(default=None, metadata={"tensor": meta})


@dataclass(frozen=True)
class LayerTensor:
    """One tensor of a decoder layer: its shape from the config, whether it is a matrix (read by the
    matmul in its stored type; else a vector, widened to f32), the ledger op its matmul or bias is
    booked under, whether the config's layers have it (optional tensors), the heads whose rows
    llama.cpp's converter permuted in a "llama" GGUF file (gguf_model.py), and its key in each
    layout (HF_NAMES, GGUF_NAMES, LLADA_NAMES, GEMMA_NAMES below are made of these). `name` is the
    field's."""
    shape: Callable                  # Config -> shape
    matrix: bool
    op: str
    present: Callable                # Config -> bool
    permuted_heads: Optional[Callable]   # Config -> heads, or None
    hf: str
    gguf: str
    llada: Optional[str]
    gemma: str                       # Gemma's Hugging Face key, where its names differ (its norms)
    name: str = ""


def _heads(c):
    return c.num_attention_heads


def _kv_heads(c):
    return c.num_key_value_heads


@dataclass
class LayerWeights:
    """A decoder layer's tensors, each declared once, here: the loaders (load_weights, GGUF's),
    the C layer's view and shape check (layer_c.Layer), the cost model's matmuls (cost.layer),
    convert.py and random_weights all read this table (LAYER_TENSORS). A new tensor is a line here,
    its use in Transformer.layers and in csrc/layer.c (struct td_layer), and nothing else."""
    input_layernorm: np.ndarray = tensor(                                                   # [d]
        lambda c: (c.hidden_size,), hf="input_layernorm.weight", gguf="attn_norm.weight", llada="attn_norm.weight")
    q_proj: np.ndarray = tensor(                                                            # [H*hd, d]
        lambda c: (c.q_dim, c.hidden_size), True, "matmul", permuted_heads=_heads,
        hf="self_attn.q_proj.weight", gguf="attn_q.weight", llada="q_proj.weight")
    k_proj: np.ndarray = tensor(                                                            # [KVH*hd, d]
        lambda c: (c.kv_dim, c.hidden_size), True, "matmul", permuted_heads=_kv_heads,
        hf="self_attn.k_proj.weight", gguf="attn_k.weight", llada="k_proj.weight")
    v_proj: np.ndarray = tensor(                                                            # [KVH*hd, d]
        lambda c: (c.kv_dim, c.hidden_size), True, "matmul",
        hf="self_attn.v_proj.weight", gguf="attn_v.weight", llada="v_proj.weight")
    o_proj: np.ndarray = tensor(                                                            # [d, H*hd]
        lambda c: (c.hidden_size, c.q_dim), True, "matmul",
        hf="self_attn.o_proj.weight", gguf="attn_output.weight", llada="attn_out.weight")
    post_attention_layernorm: np.ndarray = tensor(              # [d] the MLP's input norm (Gemma: pre_feedforward)
        lambda c: (c.hidden_size,), hf="post_attention_layernorm.weight", gguf="ffn_norm.weight",
        llada="ff_norm.weight", gemma="pre_feedforward_layernorm.weight")
    gate_proj: np.ndarray = tensor(                                                         # [f, d]
        lambda c: (c.intermediate_size, c.hidden_size), True, "mlp",
        hf="mlp.gate_proj.weight", gguf="ffn_gate.weight", llada="ff_proj.weight")
    up_proj: np.ndarray = tensor(                                                           # [f, d]
        lambda c: (c.intermediate_size, c.hidden_size), True, "mlp",
        hf="mlp.up_proj.weight", gguf="ffn_up.weight", llada="up_proj.weight")
    down_proj: np.ndarray = tensor(                                                         # [d, f]
        lambda c: (c.hidden_size, c.intermediate_size), True, "mlp",
        hf="mlp.down_proj.weight", gguf="ffn_down.weight", llada="ff_out.weight")
    q_bias: Optional[np.ndarray] = tensor(                                  # [H*hd] qwen2 / attention_bias
        lambda c: (c.q_dim,), op="matmul", present=lambda c: c.qkv_bias, permuted_heads=_heads,
        hf="self_attn.q_proj.bias", gguf="attn_q.bias", llada="q_proj.bias")
    k_bias: Optional[np.ndarray] = tensor(                                  # [KVH*hd]
        lambda c: (c.kv_dim,), op="matmul", present=lambda c: c.qkv_bias, permuted_heads=_kv_heads,
        hf="self_attn.k_proj.bias", gguf="attn_k.bias", llada="k_proj.bias")
    v_bias: Optional[np.ndarray] = tensor(                                  # [KVH*hd]
        lambda c: (c.kv_dim,), op="matmul", present=lambda c: c.qkv_bias,
        hf="self_attn.v_proj.bias", gguf="attn_v.bias", llada="v_proj.bias")
    o_bias: Optional[np.ndarray] = tensor(                                  # [d] llama attention_bias only
        lambda c: (c.hidden_size,), op="matmul", present=lambda c: c.o_bias,
        hf="self_attn.o_proj.bias", gguf="attn_output.bias", llada="attn_out.bias")
    q_norm: Optional[np.ndarray] = tensor(                                  # [hd] qk_norm: q's heads normed
        lambda c: (c.head_dim,), present=lambda c: c.qk_norm, hf="self_attn.q_norm.weight", gguf="attn_q_norm.weight")
    k_norm: Optional[np.ndarray] = tensor(                                  # [hd] and k's, before RoPE
        lambda c: (c.head_dim,), present=lambda c: c.qk_norm, hf="self_attn.k_norm.weight", gguf="attn_k_norm.weight")
    post_attention_norm: Optional[np.ndarray] = tensor(                     # [d] sandwich_norms: the attention's
        lambda c: (c.hidden_size,), present=lambda c: c.sandwich_norms,     # output normed (Gemma's
        hf="post_attention_norm.weight", gguf="post_attention_norm.weight",  # post_attention_layernorm)
        gemma="post_attention_layernorm.weight")
    post_feedforward_layernorm: Optional[np.ndarray] = tensor(              # [d] and the MLP's
        lambda c: (c.hidden_size,), present=lambda c: c.sandwich_norms,
        hf="post_feedforward_layernorm.weight", gguf="post_ffw_norm.weight")


LAYER_TENSORS = tuple(dataclasses.replace(f.metadata["tensor"], name=f.name) for f in dataclasses.fields(LayerWeights))
MATRICES = tuple(t.name for t in LAYER_TENSORS if t.matrix)
NORMS = tuple(t.name for t in LAYER_TENSORS if not t.matrix and t.op == "norm")


def layer_tensors(cfg):
    """The LAYER_TENSORS this config's layers have."""
    return [t for t in LAYER_TENSORS if t.present(cfg)]


@dataclass
class Weights:
    embed_tokens: np.ndarray               # [V, d]
    layers: List[LayerWeights]
    norm: np.ndarray                       # [d]
    lm_head: np.ndarray                    # [V, d]: embed_tokens itself when tied


# Checkpoint key of each weight, per layout: the model's own tensors, then the layer's from its
# table. Llama, Mistral, Qwen 2 and 3 and Dream use Hugging Face's names; Gemma's differ in its
# norms (its post_attention_layernorm norms the attention's output, pre_feedforward_layernorm is
# the MLP's input norm, which the others call post_attention_layernorm); LLaDA keeps the OLMo
# names of its own modeling code; GGUF has llama.cpp's (gguf-py constants.py, TENSOR_NAMES; its
# Q/K rows are permuted for RoPE, which gguf_model.py undoes).
HF_NAMES = dict(embed_tokens="model.embed_tokens.weight", norm="model.norm.weight", lm_head="lm_head.weight",
                layer="model.layers.{i}.", **{t.name: t.hf for t in LAYER_TENSORS})
LLADA_NAMES = dict(embed_tokens="model.transformer.wte.weight", norm="model.transformer.ln_f.weight",
                   lm_head="model.transformer.ff_out.weight", layer="model.transformer.blocks.{i}.",
                   **{t.name: t.llada for t in LAYER_TENSORS if t.llada})
GEMMA_NAMES = dict(HF_NAMES, **{t.name: t.gemma for t in LAYER_TENSORS})
GGUF_NAMES = dict(embed_tokens="token_embd.weight", norm="output_norm.weight", lm_head="output.weight",
                  layer="blk.{i}.", **{t.name: t.gguf for t in LAYER_TENSORS})


def checkpoint_names(cfg):
    """The key table of a Hugging Face-style checkpoint of this config's family."""
    return LLADA_NAMES if cfg.model_type == "llada" else GEMMA_NAMES if cfg.model_type in GEMMA else HF_NAMES


def load_weights(cfg, ckpt, names=None):
    """Carves a checkpoint (safetensors, or a GGUF file with names=GGUF_NAMES) into Weights,
    checking that every tensor the config's layers have (layer_tensors) is there with its shape.
    Norm weights are stored as offset + w when the config's RMSNorm scales by that (Gemma's 1 + w)."""
    names = names or checkpoint_names(cfg)
    refuse_unused(cfg, ckpt, names)
    d, V = cfg.hidden_size, cfg.vocab_size

    def layer(i):
        return LayerWeights(**{t.name: stored_norm(cfg, t.name, ckpt.expect(names["layer"].format(i=i) + names[t.name],
                                                                      t.shape(cfg)))
                               for t in layer_tensors(cfg)})

    embed = ckpt.expect(names["embed_tokens"], (V, d))
    return Weights(
        embed_tokens=embed,
        layers=[layer(i) for i in range(cfg.num_hidden_layers)],
        norm=stored_norm(cfg, "norm", ckpt.expect(names["norm"], (d,))),
        lm_head=embed if cfg.tie_word_embeddings else ckpt.expect(names["lm_head"], (V, d)),
    )


def stored_norm(cfg, name, w):
    """A norm's weight as the kernels scale by it: offset + w in f32 (computed as Gemma's
    RMSNorm computes 1.0 + weight.float()); anything else as it is."""
    if cfg.norm_offset and (name in NORMS or name == "norm"):
        return (np.float32(cfg.norm_offset) + np.asarray(w, np.float32)).astype(np.float32)
    return w


def refuse_unused(cfg, ckpt, names=None):
    """A tensor the config does not read means the config describes another model: an error."""
    names = names or checkpoint_names(cfg)
    layer = [t.name for t in layer_tensors(cfg)]
    read = {names["embed_tokens"], names["norm"], names["lm_head"]}   # a tied lm_head: see the docstring
    if cfg.rope_scaling[:1] == ("freq_factors",):
        read.add("rope_freqs.weight")   # GGUF's llama3 scaling, read into the config (gguf_model.py)
    layers = min(cfg.num_hidden_layers, len(ckpt.names))   # beyond: load_weights reports the first missing
    read |= {names["layer"].format(i=i) + names[field] for i in range(layers) for field in layer}
    unused = [n for n in ckpt.names if n not in read and not n.endswith("rotary_emb.inv_freq")]
    if unused:   # a layer beyond num_hidden_layers, a bias, ...
        fail(ckpt.path, f"tensor {show(unused[0])} is not part of a {cfg.model_type} model as tinydiff runs it"
                        f"{f' (nor are {len(unused) - 1} more)' if len(unused) > 1 else ''}: "
                        "does the config describe this checkpoint?")


def random_weights(cfg, seed=0, std=0.02):
    """Weights of the right shapes filled with noise (norms ones): for benchmarks of real model shapes."""
    rng = np.random.default_rng(seed)

    def mat(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std))

    def tensor(t):
        return np.ones(t.shape(cfg), np.float32) if t.op == "norm" else mat(*t.shape(cfg))

    layers = [LayerWeights(**{t.name: tensor(t) for t in layer_tensors(cfg)}) for _ in range(cfg.num_hidden_layers)]
    d, V = cfg.hidden_size, cfg.vocab_size
    embed = mat(V, d)
    return Weights(embed, layers, np.ones(d, np.float32), embed if cfg.tie_word_embeddings else mat(V, d))
