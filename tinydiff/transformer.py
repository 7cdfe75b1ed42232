"""The transformer: one forward pass you can read top to bottom.

Three plain structures, as in llama2.c: the Config (config.py), the Weights (weights.py, views of
the memory-mapped checkpoint) and the run state: a KVCache that lives as long as one generation and
the scratch Buffers one forward pass writes into, allocated once and reused for every token.

Shapes: n = positions in this pass, t = positions in the cache after it, d = hidden_size,
H/KVH = query/key-value heads, hd = head_dim, f = intermediate_size, V = vocab_size.
"""
import numpy as np

from . import kernels as K


def rope_inv_freq(cfg):
    """RoPE's inverse frequencies, computed in float32 exactly as transformers does."""
    exponent = np.arange(0, cfg.head_dim, 2, dtype=np.float32) / np.float32(cfg.head_dim)
    return (np.float32(1.0) / np.float32(cfg.rope_theta) ** exponent).astype(np.float32)  # [hd/2]


class KVCache:
    """Keys (after RoPE) and values of every position processed so far, for every layer."""

    def __init__(self, cfg, n_ctx):
        self.k = np.zeros((cfg.num_hidden_layers, n_ctx, cfg.kv_dim), np.float32)  # [L, ctx, KVH*hd]
        self.v = np.zeros((cfg.num_hidden_layers, n_ctx, cfg.kv_dim), np.float32)  # [L, ctx, KVH*hd]
        self.n = 0                                                                  # positions filled

    @property
    def capacity(self):
        return self.k.shape[1]


class Buffers:
    """Scratch activations for up to n_max positions per pass; a pass of n uses the first n rows."""

    def __init__(self, cfg, n_max):
        self.n_max = n_max
        self.x = np.zeros((n_max, cfg.hidden_size), np.float32)           # [n, d] residual stream
        self.h = np.zeros((n_max, cfg.hidden_size), np.float32)           # [n, d] normed input of a block
        self.q = np.zeros((n_max, cfg.q_dim), np.float32)                 # [n, H*hd]
        self.att = np.zeros((n_max, cfg.q_dim), np.float32)               # [n, H*hd] attention output
        self.proj = np.zeros((n_max, cfg.hidden_size), np.float32)        # [n, d] o_proj / down_proj out
        self.gate = np.zeros((n_max, cfg.intermediate_size), np.float32)  # [n, f]
        self.up = np.zeros((n_max, cfg.intermediate_size), np.float32)    # [n, f]


def forward(cfg, w, inv_freq, ids, cache, buf, causal=True, last_only=False):
    """Runs ids (the next n tokens) through the model, appending their K/V to the cache.

    Returns logits [n, V], or [1, V] for the last position only (decoding needs no more)."""
    n, pos0 = len(ids), cache.n
    H, KVH, hd, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    pos = np.arange(pos0, pos0 + n, dtype=np.int32)                  # [n] absolute positions
    x, h, q, att, proj = buf.x[:n], buf.h[:n], buf.q[:n], buf.att[:n], buf.proj[:n]
    gate, up = buf.gate[:n], buf.up[:n]
    np.take(w.embed_tokens, ids, axis=0, out=x)                       # [n, d]

    for l, lw in enumerate(w.layers):
        # attention: x += o_proj(attention(rope(q), rope(k), v))
        K.rmsnorm(x, lw.input_layernorm, eps, out=h)                  # [n, d]
        k, v = cache.k[l, pos0:pos0 + n], cache.v[l, pos0:pos0 + n]  # [n, KVH*hd] slots in the cache
        K.matmul(h, lw.q_proj, out=q)                                 # [n, H*hd]
        K.matmul(h, lw.k_proj, out=k)                                 # [n, KVH*hd]
        K.matmul(h, lw.v_proj, out=v)                                 # [n, KVH*hd]
        if lw.q_bias is not None:
            q += lw.q_bias; k += lw.k_bias; v += lw.v_bias
        K.rope(q.reshape(n, H, hd), pos, inv_freq)
        K.rope(k.reshape(n, KVH, hd), pos, inv_freq)
        keys = cache.k[l, :pos0 + n].reshape(-1, KVH, hd)             # [t, KVH, hd]
        values = cache.v[l, :pos0 + n].reshape(-1, KVH, hd)           # [t, KVH, hd]
        K.attention(q.reshape(n, H, hd), keys, values, out=att.reshape(n, H, hd),
                    causal=causal, q_pos0=pos0)                       # [n, H, hd]
        K.matmul(att, lw.o_proj, out=proj)                            # [n, d]
        if lw.o_bias is not None:
            proj += lw.o_bias
        x += proj

        # MLP: x += down_proj(silu(gate_proj(x)) * up_proj(x))
        K.rmsnorm(x, lw.post_attention_layernorm, eps, out=h)         # [n, d]
        K.matmul(h, lw.gate_proj, out=gate)                           # [n, f]
        K.matmul(h, lw.up_proj, out=up)                               # [n, f]
        K.silu_mul(gate, up, out=gate)                                # [n, f]
        K.matmul(gate, lw.down_proj, out=proj)                        # [n, d]
        x += proj

    cache.n = pos0 + n
    x = x[-1:] if last_only else x
    out = K.rmsnorm(x, w.norm, eps)                                   # [n or 1, d]
    return K.matmul(out, w.lm_head)                                   # [n or 1, V]
