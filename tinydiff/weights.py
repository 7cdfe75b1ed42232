"""The model's weights as plain arrays, carved out of the checkpoint's memory map.

Names match the Hugging Face checkpoint keys (model.layers.{i}.self_attn.q_proj.weight, ...), so a
reader can grep a key from the file and find where it lands. Every matrix keeps HF's [out, in]
layout, which is what the matmul kernel expects: y = x @ W.T. F32 tensors are views of the mmap
(zero copy); F16/BF16 tensors are widened to f32 once, at load.
"""
from dataclasses import dataclass
from typing import List, Optional

import numpy as np


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


def llama_weights(cfg, ckpt):
    """Carves a Llama/Mistral/Qwen2 checkpoint into Weights, checking every name and shape."""
    d, hd, f, V = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size
    qd, kvd = cfg.q_dim, cfg.kv_dim

    def layer(i):
        p = f"model.layers.{i}."
        bias = (lambda name, n: ckpt.expect(p + name, (n,))) if cfg.qkv_bias else (lambda name, n: None)
        return LayerWeights(
            input_layernorm=ckpt.expect(p + "input_layernorm.weight", (d,)),
            q_proj=ckpt.expect(p + "self_attn.q_proj.weight", (qd, d)),
            k_proj=ckpt.expect(p + "self_attn.k_proj.weight", (kvd, d)),
            v_proj=ckpt.expect(p + "self_attn.v_proj.weight", (kvd, d)),
            o_proj=ckpt.expect(p + "self_attn.o_proj.weight", (d, qd)),
            post_attention_layernorm=ckpt.expect(p + "post_attention_layernorm.weight", (d,)),
            gate_proj=ckpt.expect(p + "mlp.gate_proj.weight", (f, d)),
            up_proj=ckpt.expect(p + "mlp.up_proj.weight", (f, d)),
            down_proj=ckpt.expect(p + "mlp.down_proj.weight", (d, f)),
            q_bias=bias("self_attn.q_proj.bias", qd),
            k_bias=bias("self_attn.k_proj.bias", kvd),
            v_bias=bias("self_attn.v_proj.bias", kvd),
            o_bias=ckpt.expect(p + "self_attn.o_proj.bias", (d,)) if cfg.o_bias else None,
        )

    embed = ckpt.expect("model.embed_tokens.weight", (V, d))
    return Weights(
        embed_tokens=embed,
        layers=[layer(i) for i in range(cfg.num_hidden_layers)],
        norm=ckpt.expect("model.norm.weight", (d,)),
        lm_head=embed if cfg.tie_word_embeddings else ckpt.expect("lm_head.weight", (V, d)),
    )


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
