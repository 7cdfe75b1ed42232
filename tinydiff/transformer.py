"""The transformer: one forward pass you can read top to bottom.

Three plain structures, as in llama2.c: the Config (config.py), the Weights (weights.py, views of
the memory-mapped checkpoint) and the run state: a KVCache that lives as long as one generation and
the scratch Buffers one forward pass writes into, allocated once and reused for every token.

Shapes: n = positions in this pass, t = positions in the cache after it, d = hidden_size,
H/KVH = query/key-value heads, hd = head_dim, f = intermediate_size, V = vocab_size.
"""
import numpy as np

from . import kernels as K
from . import ledger
from .masks import CAUSAL


def rope_inv_freq(cfg):
    """RoPE's inverse frequencies, computed in float32 exactly as transformers does."""
    exponent = np.arange(0, cfg.head_dim, 2, dtype=np.float32) / np.float32(cfg.head_dim)
    return (np.float32(1.0) / np.float32(cfg.rope_theta) ** exponent).astype(np.float32)  # [hd/2]


class KVCache:
    """Keys (after RoPE) and values of B sequences, n_ctx position slots each, for every layer."""

    def __init__(self, cfg, n_ctx, batch=1):
        shape = (cfg.num_hidden_layers, batch, n_ctx, cfg.kv_dim)
        self.k = np.zeros(shape, np.float32)   # [L, B, ctx, KVH*hd]
        self.v = np.zeros(shape, np.float32)   # [L, B, ctx, KVH*hd]


class Buffers:
    """Scratch activations for up to n_max rows (batch x positions) per pass."""

    def __init__(self, cfg, n_max):
        self.n_max = n_max
        self.x = np.zeros((n_max, cfg.hidden_size), np.float32)           # [Bn, d] residual stream
        self.h = np.zeros((n_max, cfg.hidden_size), np.float32)           # [Bn, d] normed input of a block
        self.q = np.zeros((n_max, cfg.q_dim), np.float32)                 # [Bn, H*hd]
        self.k = np.zeros((n_max, cfg.kv_dim), np.float32)                # [Bn, KVH*hd]
        self.v = np.zeros((n_max, cfg.kv_dim), np.float32)                # [Bn, KVH*hd]
        self.att = np.zeros((n_max, cfg.q_dim), np.float32)               # [Bn, H*hd] attention output
        self.gate = np.zeros((n_max, cfg.intermediate_size), np.float32)  # [Bn, f]
        self.up = np.zeros((n_max, cfg.intermediate_size), np.float32)    # [Bn, f]


def forward(cfg, w, inv_freq, ids, cache, buf, start, kv_len=None, mask=CAUSAL, last_only=False):
    """Runs ids [B, n] (B sequences, the tokens at positions start..start+n-1 of each) through the model.

    Their keys and values go into cache slots start..start+n-1; attention reads slots 0..kv_len-1
    (default: up to the last new position) under mask (masks.py). Autoregressive decoding
    appends (start = positions so far); a diffusion step with a cache recomputes a span of the canvas
    and reads the cached rest. Returns logits [B*n, V], or [B, V] for each sequence's last position.
    """
    B, n = ids.shape
    kv_len = start + n if kv_len is None else kv_len
    H, KVH, hd, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    pos = np.tile(np.arange(start, start + n, dtype=np.int64), B)       # [Bn] positions, for RoPE
    x, h, q, k, v = buf.x[:B * n], buf.h[:B * n], buf.q[:B * n], buf.k[:B * n], buf.v[:B * n]
    att, gate, up = buf.att[:B * n], buf.gate[:B * n], buf.up[:B * n]
    ledger.begin_pass(tokens=B * n)
    K.embedding(w.embed_tokens, ids.reshape(-1), out=x)               # [Bn, d]

    for l, lw in enumerate(w.layers):
        # attention: x += o_proj(attention(rope(q), rope(k), v))
        K.rmsnorm(x, lw.input_layernorm, eps, out=h, op="norm")       # [Bn, d]
        K.matmuls(h, (lw.q_proj, lw.k_proj, lw.v_proj), (q, k, v), op="matmul")  # [Bn, H*hd], 2x [Bn, KVH*hd]
        if lw.q_bias is not None:
            K.add_bias(q, lw.q_bias, op="matmul")
            K.add_bias(k, lw.k_bias, op="matmul")
            K.add_bias(v, lw.v_bias, op="matmul")
        K.rope_qk(q.reshape(B * n, H, hd), k.reshape(B * n, KVH, hd), pos, inv_freq, op="rope")
        K.store(cache.k[l, :, start:start + n], k.reshape(B, n, -1))  # [B, n, KVH*hd] into the cache
        K.store(cache.v[l, :, start:start + n], v.reshape(B, n, -1))
        for b in range(B):
            rows = slice(b * n, (b + 1) * n)
            K.attention(q[rows].reshape(n, H, hd),
                        cache.k[l, b, :kv_len].reshape(kv_len, KVH, hd),  # [t, KVH, hd]
                        cache.v[l, b, :kv_len].reshape(kv_len, KVH, hd),
                        out=att[rows].reshape(n, H, hd), mask=mask, q_pos0=start,
                        op="attention")                               # [n, H, hd]
        K.matmul(att, lw.o_proj, out=x, op="matmul", residual=True)   # x += [Bn, d]
        if lw.o_bias is not None:
            K.add_bias(x, lw.o_bias, op="matmul")

        # MLP: x += down_proj(silu(gate_proj(x)) * up_proj(x))
        K.rmsnorm(x, lw.post_attention_layernorm, eps, out=h, op="norm")  # [Bn, d]
        K.matmuls(h, (lw.gate_proj, lw.up_proj), (gate, up), op="mlp")  # 2x [Bn, f]
        K.silu_mul(gate, up, out=gate, op="mlp")                      # [Bn, f]
        K.matmul(gate, lw.down_proj, out=x, op="mlp", residual=True)  # x += [Bn, d]

    if last_only:
        x = x.reshape(B, n, -1)[:, -1]                                # [B, d]
    out = K.rmsnorm(x, w.norm, eps, op="norm")                        # [Bn or B, d]
    return K.matmul(out, w.lm_head, op="lm_head")                     # [Bn or B, V]


def decode(cfg, w, layers, inv_freq, token, cache, buf, pos):
    """forward() for one new token of one sequence at position pos: an autoregressive decode step.

    The same layers, each one C call (csrc/layer.c is forward's loop body above, kernel for kernel,
    bit for bit): with one row, the Python around ~11 kernel calls a layer would cost a small model
    a third of its time. layers: a kernels.DecodeLayer per layer. Returns logits [1, V]."""
    run = K.DecodeRun(cfg, buf, cache, inv_freq)
    x = buf.x[:1]                                                     # [1, d] residual stream
    ledger.begin_pass(tokens=1)
    K.embedding(w.embed_tokens, token, out=x)                        # [1, d]
    for l, layer in enumerate(layers):
        K.decode_layer(layer, run, l, pos)                            # x += layer l  [1, d]
    out = K.rmsnorm(x, w.norm, cfg.rms_norm_eps, op="norm")          # [1, d]
    return K.matmul(out, w.lm_head, op="lm_head")                     # [1, V]
