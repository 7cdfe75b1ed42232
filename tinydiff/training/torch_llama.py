"""The PyTorch twin of tinydiff's decoder, for training: a Llama with transformers' tensor names.

Takes a config.json dict (as train.model_config writes it) through LlamaConfig.of. Guarantees a
state_dict keyed as transformers' LlamaForCausalLM (model.embed_tokens, model.layers.N.self_attn.
q_proj ... mlp.down_proj, model.norm; the LM head tied to the embedding, so no lm_head), so an
export loads in tinydiff and, when causal, in transformers. The layer is the one
engine/transformer.py runs: RMSNorm, rotate-half RoPE (theta from the config), attention with
optional GQA, SwiGLU MLP. Shaped as karpathy/nanoGPT's model.py: a config, then one class a part.

torch is imported at the top: this module is imported only inside the functions that train
(train.build_model), so the package imports without torch.
"""
import dataclasses
import math

import torch
from torch import nn
from torch.nn import functional as F


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int                # d
    intermediate_size: int          # the MLP's width
    num_hidden_layers: int
    num_attention_heads: int        # H
    num_key_value_heads: int        # KVH; fewer than H: GQA
    head_dim: int                   # hd
    rms_norm_eps: float
    rope_theta: float
    dropout: float = 0.0            # while training: on the embeddings and each block's two residual writes

    @classmethod
    def of(cls, cfg, dropout=0.0):
        """From a config.json dict: its fields of the same names."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "dropout"]
        return cls(**{k: cfg[k] for k in names}, dropout=dropout)


def rope(x, cos, sin):
    """rotate-half RoPE over the last axis: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class RMSNorm(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.eps = config.rms_norm_eps
        self.weight = nn.Parameter(torch.ones(config.hidden_size))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.n_head, self.n_kv_head, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.q_proj = nn.Linear(d, self.n_head * hd, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv_head * hd, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv_head * hd, bias=False)
        self.o_proj = nn.Linear(self.n_head * hd, d, bias=False)

    def forward(self, x, cos, sin, mask):
        B, L, _ = x.shape
        H, KVH, hd = self.n_head, self.n_kv_head, self.head_dim
        q = self.q_proj(x).view(B, L, H, hd).transpose(1, 2)       # [B, H, L, hd]
        k = self.k_proj(x).view(B, L, KVH, hd).transpose(1, 2)     # [B, KVH, L, hd]
        v = self.v_proj(x).view(B, L, KVH, hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if KVH != H:  # query head h reads kv head h // (H // KVH), as transformers' repeat_kv
            k, v = k.repeat_interleave(H // KVH, dim=1), v.repeat_interleave(H // KVH, dim=1)
        # mask: True causal, False bidirectional, or a bool [L, L] tensor (True = may attend)
        y = (F.scaled_dot_product_attention(q, k, v, is_causal=mask) if isinstance(mask, bool)
             else F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        return self.o_proj(y.transpose(1, 2).reshape(B, L, H * hd))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.input_layernorm = RMSNorm(config)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config)
        self.mlp = MLP(config)
        # not on the attention weights: with it, PyTorch's CPU attention leaves its fused kernel and
        # a step takes ~2x as long
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x, cos, sin, mask):
        x = x + self.drop(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        return x + self.drop(self.mlp(self.post_attention_layernorm(x)))


class Llama(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        # built in this order, which is the order the weights draw from torch's seeded stream
        self.model = nn.ModuleDict({
            "embed_tokens": nn.Embedding(config.vocab_size, config.hidden_size),
            "layers": nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers)),
            "norm": RMSNorm(config)})
        hd = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.drop = nn.Dropout(config.dropout)
        self._init_weights()

    def _init_weights(self):
        """N(0, 0.02) everywhere but the norms, the two projections that write into the residual
        stream scaled by 1/sqrt(2 n_layers) (GPT-2), so the stream's variance does not grow with depth."""
        residual_std = 0.02 / math.sqrt(2 * self.config.num_hidden_layers)
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                continue
            std = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            nn.init.normal_(p, mean=0.0, std=std)

    def hidden(self, ids, causal, pos=None):
        """[B, L] ids -> [B, L, d] final-norm hidden states. causal: True, False or a bool [L, L]
        attention mask; pos: the L positions (default 0..L-1)."""
        pos = torch.arange(ids.shape[1], dtype=torch.float32) if pos is None else pos.to(torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)              # [L, hd]
        cos, sin = emb.cos(), emb.sin()
        x = self.drop(self.model.embed_tokens(ids))
        for layer in self.model.layers:
            x = layer(x, cos, sin, causal)
        return self.model.norm(x)

    def logits(self, h):
        return h @ self.model.embed_tokens.weight.T          # tied LM head
