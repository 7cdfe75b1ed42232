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
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from ..formats.files import fail, show


@dataclass
class LayerWeights:
    input_layernorm: np.ndarray            # [d]
    q_proj: np.ndarray                     # [H*hd, d]
    k_proj: np.ndarray                     # [KVH*hd, d]
    v_proj: np.ndarray                     # [KVH*hd, d]
    o_proj: np.ndarray                     # [d, H*hd]
    post_attention_layernorm: np.ndarray   # [d]
    gate_proj: np.ndarray                  # [f, d]
    up_proj: np.ndarray                    # [f, d]
    down_proj: np.ndarray                  # [d, f]
    q_bias: Optional[np.ndarray] = None    # [H*hd]   qwen2 / attention_bias
    k_bias: Optional[np.ndarray] = None    # [KVH*hd]
    v_bias: Optional[np.ndarray] = None    # [KVH*hd]
    o_bias: Optional[np.ndarray] = None    # [d]      llama attention_bias only


@dataclass
class Weights:
    embed_tokens: np.ndarray               # [V, d]
    layers: List[LayerWeights]
    norm: np.ndarray                       # [d]
    lm_head: np.ndarray                    # [V, d]: embed_tokens itself when tied


# Checkpoint key of each weight, per layout. Llama, Mistral, Qwen2 and Dream use Hugging Face's
# names; LLaDA keeps the OLMo names of its own modeling code.
HF_NAMES = dict(
    embed_tokens="model.embed_tokens.weight", norm="model.norm.weight", lm_head="lm_head.weight",
    layer="model.layers.{i}.",
    input_layernorm="input_layernorm.weight", post_attention_layernorm="post_attention_layernorm.weight",
    q_proj="self_attn.q_proj.weight", k_proj="self_attn.k_proj.weight", v_proj="self_attn.v_proj.weight",
    o_proj="self_attn.o_proj.weight", gate_proj="mlp.gate_proj.weight", up_proj="mlp.up_proj.weight",
    down_proj="mlp.down_proj.weight", q_bias="self_attn.q_proj.bias", k_bias="self_attn.k_proj.bias",
    v_bias="self_attn.v_proj.bias", o_bias="self_attn.o_proj.bias",
)
LLADA_NAMES = dict(
    embed_tokens="model.transformer.wte.weight", norm="model.transformer.ln_f.weight",
    lm_head="model.transformer.ff_out.weight", layer="model.transformer.blocks.{i}.",
    input_layernorm="attn_norm.weight", post_attention_layernorm="ff_norm.weight",
    q_proj="q_proj.weight", k_proj="k_proj.weight", v_proj="v_proj.weight", o_proj="attn_out.weight",
    gate_proj="ff_proj.weight", up_proj="up_proj.weight", down_proj="ff_out.weight",
    q_bias="q_proj.bias", k_bias="k_proj.bias", v_bias="v_proj.bias", o_bias="attn_out.bias",
)

# llama.cpp's names in a GGUF file (gguf-py constants.py, TENSOR_NAMES); its Q/K rows are permuted
# for RoPE, which gguf.py undoes.
GGUF_NAMES = dict(
    embed_tokens="token_embd.weight", norm="output_norm.weight", lm_head="output.weight", layer="blk.{i}.",
    input_layernorm="attn_norm.weight", post_attention_layernorm="ffn_norm.weight",
    q_proj="attn_q.weight", k_proj="attn_k.weight", v_proj="attn_v.weight", o_proj="attn_output.weight",
    gate_proj="ffn_gate.weight", up_proj="ffn_up.weight", down_proj="ffn_down.weight",
    q_bias="attn_q.bias", k_bias="attn_k.bias", v_bias="attn_v.bias", o_bias="attn_output.bias",
)


def load_weights(cfg, ckpt, names=None):
    """Carves a checkpoint (safetensors, or a GGUF file with names=GGUF_NAMES) into Weights,
    checking that every tensor is there with its shape."""
    names = names or (LLADA_NAMES if cfg.model_type == "llada" else HF_NAMES)
    refuse_unused(cfg, ckpt, names)
    d, f, V, qd, kvd = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.q_dim, cfg.kv_dim

    def layer(i):
        def get(field, *shape):
            return ckpt.expect(names["layer"].format(i=i) + names[field], shape)

        bias = get if cfg.qkv_bias else (lambda field, n: None)
        return LayerWeights(
            input_layernorm=get("input_layernorm", d),
            q_proj=get("q_proj", qd, d), k_proj=get("k_proj", kvd, d), v_proj=get("v_proj", kvd, d),
            o_proj=get("o_proj", d, qd),
            post_attention_layernorm=get("post_attention_layernorm", d),
            gate_proj=get("gate_proj", f, d), up_proj=get("up_proj", f, d), down_proj=get("down_proj", d, f),
            q_bias=bias("q_bias", qd), k_bias=bias("k_bias", kvd), v_bias=bias("v_bias", kvd),
            o_bias=get("o_bias", d) if cfg.o_bias else None,
        )

    embed = ckpt.expect(names["embed_tokens"], (V, d))
    return Weights(
        embed_tokens=embed,
        layers=[layer(i) for i in range(cfg.num_hidden_layers)],
        norm=ckpt.expect(names["norm"], (d,)),
        lm_head=embed if cfg.tie_word_embeddings else ckpt.expect(names["lm_head"], (V, d)),
    )


def refuse_unused(cfg, ckpt, names=None):
    """A tensor the config does not read means the config describes another model: an error."""
    names = names or (LLADA_NAMES if cfg.model_type == "llada" else HF_NAMES)
    layer = ["input_layernorm", "q_proj", "k_proj", "v_proj", "o_proj", "post_attention_layernorm",
             "gate_proj", "up_proj", "down_proj"]
    layer += ["q_bias", "k_bias", "v_bias"] * cfg.qkv_bias + ["o_bias"] * cfg.o_bias
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
    """Weights of the right shapes filled with noise: for benchmarks of real model shapes."""
    rng = np.random.default_rng(seed)

    def mat(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std))

    d, f, V, qd, kvd = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.q_dim, cfg.kv_dim
    bias = (lambda n: mat(n)) if cfg.qkv_bias else (lambda n: None)
    layers = [LayerWeights(
        input_layernorm=np.ones(d, np.float32), q_proj=mat(qd, d), k_proj=mat(kvd, d), v_proj=mat(kvd, d),
        o_proj=mat(d, qd), post_attention_layernorm=np.ones(d, np.float32), gate_proj=mat(f, d),
        up_proj=mat(f, d), down_proj=mat(d, f), q_bias=bias(qd), k_bias=bias(kvd), v_bias=bias(kvd),
        o_bias=mat(d) if cfg.o_bias else None) for _ in range(cfg.num_hidden_layers)]
    embed = mat(V, d)
    return Weights(embed, layers, np.ones(d, np.float32), embed if cfg.tie_word_embeddings else mat(V, d))
