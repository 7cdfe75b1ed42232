"""A GGUF file as tinydiff's Config, Weights and Tokenizer (the file itself: gguf.py).

Model conventions are llama.cpp's (gguf-py constants.py, convert_hf_to_gguf.py and src/models/):
  - keys: general.architecture (llama, qwen2, qwen3, gemma3; llada and dream, llama.cpp's
    masked-diffusion models), {arch}.context_length, .embedding_length, .block_count, .feed_forward_length,
    .attention.head_count, .attention.head_count_kv, .attention.key_length (head_dim),
    .rope.freq_base, .attention.layer_norm_rms_epsilon, .attention.causal; diffusion.shift_logits;
    tinydiff.block_size (tinydiff's own key, uint32: a block-diffusion model's block size, which
    llama.cpp has no key for; config.json's "block_size");
    tokenizer.ggml.* for the tokenizer (tokenizer.py, Tokenizer.from_gguf).
  - tensors: token_embd, blk.N.attn_norm / attn_q / attn_k / attn_v / attn_output / ffn_norm /
    ffn_gate / ffn_up / ffn_down, output_norm, output (absent when tied): weights.GGUF_NAMES;
    Qwen 3 and Gemma 3 add attn_q_norm / attn_k_norm, Gemma 3 post_attention_norm / post_ffw_norm.
  - Gemma 3 (llama.cpp's llama_model_gemma3): the converter stores each norm as 1 + w, so the
    weights are used as they are (norm_offset 0; from config.json it is 1). Most of the layer is
    fixed by the architecture, not by keys: GELU-tanh, the embedding times sqrt(d), q scaled by
    1/sqrt(head_dim) (1/sqrt(d / heads) for the 62-layer 27B, as llama.cpp says: the converter
    writes no query_pre_attn_scalar). With {arch}.attention.sliding_window > 0, layer i is windowed
    unless i % 6 == 5 ({arch}.attention.sliding_window_pattern, a period or one bool per layer,
    overrides the 6), and the windowed layers rotate with {arch}.rope.freq_base_swa (10000 if
    absent), unscaled. {arch}.final_logit_softcapping soft-caps the logits. gemma2 is refused:
    llama.cpp soft-caps its attention scores (50 unless the file says otherwise), which tinydiff's
    layer does not do.
  - End of generation: the EOS, EOT and EOM ids, and the tokens llama.cpp's vocabulary loader takes
    for end-of-generation by their text (<end_of_turn>, <|im_end|>, ...: END_TOKENS), as
    llama-cli stops at them.
  - llama.cpp's "llama" RoPE rotates adjacent pairs where Hugging Face rotates the two halves of a
    head, so its converter permutes the rows of attn_q and attn_k (weights and biases) within each
    head. tinydiff undoes that at load (our RoPE is HF's) and redoes it when writing. Qwen 2 and 3,
    Gemma 3 and Dream files are not permuted: llama.cpp runs those architectures with HF's RoPE.
  - Masked-diffusion models with a Llama layout (config.json "is_causal": false, "mask_token_id")
    are written as architecture "llama" with llama.attention.causal = false and
    tokenizer.ggml.mask_token_id: llama.cpp's own keys for those two facts (its LLaDA converter
    writes them), rather than tinydiff-only keys, so the file says what the model is to any reader.
  - RoPE scaling: {arch}.rope.scaling.type "linear" with .rope.scaling.factor; Llama 3.1's
    scaling as llama.cpp's converter writes it, the tensor rope_freqs.weight [hd/2] holding the
    factor each frequency is divided by. Other scaling types are errors naming the key.
  - Loading refuses a tensor it would not use (a layer too many, a bias, ...; weights.load_weights):
    ignoring one would run a different model.
"""
from collections import namedtuple

import numpy as np

from ..formats import quant
from ..formats.files import fail, show
from ..formats.gguf import GGML_TYPES, INT_TYPES, open_gguf
from ..formats.gguf_vocab import END_TOKENS

Arch = namedtuple("Arch", "permuted causal shifted")
# The architectures tinydiff runs: whether llama.cpp's converter permutes their Q/K rows, and
# their defaults for {arch}.attention.causal and diffusion.shift_logits (llama.cpp's LLaDA and
# Dream are masked-diffusion models with the Llama and the Qwen2 layout).
ARCHITECTURES = {"llama": Arch(True, True, False), "qwen2": Arch(False, True, False),
                 "qwen3": Arch(False, True, False), "gemma3": Arch(False, True, False),
                 "llada": Arch(True, False, False), "dream": Arch(False, False, True)}
# Hugging Face model_type -> GGUF architecture, as llama.cpp's converter maps them (Mistral's
# layout is Llama's), for the families `tinydiff convert` writes
HF_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3",
                    "llada": "llada", "Dream": "dream"}


def load_gguf(path):
    """(Config, Weights, Tokenizer, stored bytes per type, ChatTemplate or None) of a GGUF model file."""
    from ..formats.tokenizer import Tokenizer
    f, config, weights = load_gguf_model(path)
    tokenizer = Tokenizer.from_gguf(f.metadata, show(path))
    return config, weights, tokenizer, f.stored_bytes(), chat_template_of(f, config, tokenizer, path)


def load_gguf_model(path):
    """(the open GGUFFile, Config, Weights) of a GGUF model file: the model without its vocabulary."""
    f = open_gguf(path)
    config = config_from_gguf(f)
    return f, config, gguf_weights(config, f)


def gguf_weights(config, table):
    """The Weights of a table of GGUF-named tensors (the file, or anything with its .path, .names
    and .expect), the Q/K rows of a permuted architecture put back in HF's order."""
    from .weights import GGUF_NAMES, layer_tensors, load_weights
    weights = load_weights(config, table, GGUF_NAMES)
    if ARCHITECTURES[config.model_type].permuted:   # back to HF's row order, which our RoPE expects
        permuted = [t for t in layer_tensors(config) if t.permuted_heads]
        for lw in weights.layers:
            for t in permuted:
                setattr(lw, t.name, permute_rows(getattr(lw, t.name), t.permuted_heads(config), True))
    return weights


def chat_template_of(f, config, tokenizer, path):
    """tokenizer.chat_template, with the BOS and EOS the file names as its bos_token / eos_token."""
    from ..formats.chat_template import ChatTemplate
    source = f.metadata.get("tokenizer.chat_template")
    if source is None:
        return None
    if not isinstance(source, str):
        fail(path, f"tokenizer.chat_template should be a string, got {type(source).__name__}")
    named = {"bos_token": config.bos_token_id, "eos_token": (config.eos_token_ids or (None,))[0]}
    tokens = {name: tokenizer.id_to_token(i) for name, i in named.items() if i is not None}
    return ChatTemplate(source, tokens, f"{show(path)}: tokenizer.chat_template")


def permute_rows(w, n_head, undo=False):
    """llama.cpp's permute(w, n_head): within each head, row (half h, pair i) moves to (pair i,
    half h), which makes HF's rotate-half RoPE llama.cpp's adjacent-pair one. A row permutation,
    so it applies as well to block-quantized rows and to biases. None stays None."""
    if w is None:
        return None
    split = (n_head, w.shape[0] // n_head // 2, 2) if undo else (n_head, 2, w.shape[0] // n_head // 2)
    return np.ascontiguousarray(w.reshape(*split, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


# Config's size fields as a GGUF file spells them (after "<arch>."), for check_shapes' messages
GGUF_KEYS = {"hidden_size": "embedding_length", "num_hidden_layers": "block_count",
             "num_attention_heads": "attention.head_count", "num_key_value_heads": "attention.head_count_kv",
             "head_dim": "attention.key_length", "intermediate_size": "feed_forward_length",
             "vocab_size": "vocab_size", "max_position_embeddings": "context_length"}


def config_from_gguf(f):
    """The Config that a GGUF file's metadata describes; anything the engine does not implement
    (RoPE scaling other than linear and llama3, partial RoPE, sliding windows but Gemma 3's,
    experts) is an error naming the key."""
    from .config import MAX_RMS_NORM_EPS, Config, check_shapes, usable_rms_norm_eps, usable_rope_theta
    meta, kinds = f.metadata, f.value_types

    def get(key, kind, default=None):
        if key not in meta:
            if default is None:
                fail(f.path, f"metadata key {key} missing")
            return default
        value, stored = meta[key], kinds[key]
        ok = {int: stored in INT_TYPES, float: stored in INT_TYPES + ("float32", "float64"),
              bool: stored == "bool", str: stored == "string"}[kind]
        if not ok:
            fail(f.path, f"metadata {key} should be {kind.__name__}, got {stored} {show(value)}")
        return kind(value)

    arch = get("general.architecture", str)
    if arch == "gemma2":
        fail(f.path, "architecture gemma2 not supported: llama.cpp soft-caps its attention scores "
                     "(gemma2.attn_logit_softcapping, 50 if absent), which tinydiff's layer does not do")
    if arch not in ARCHITECTURES:
        fail(f.path, f"architecture {show(arch)} not supported (supported: {', '.join(ARCHITECTURES)})")
    a, defaults = arch + ".", ARCHITECTURES[arch]
    _check_unsupported(f, a, arch, get)
    d = get(a + "embedding_length", int)
    n_heads = get(a + "attention.head_count", int)
    if a + "attention.key_length" not in meta and n_heads > 0 and d % n_heads:
        fail(f.path, f"{a}attention.head_count {n_heads} does not divide {a}embedding_length {d} "
                     f"(and no {a}attention.key_length)")
    head_dim = get(a + "attention.key_length", int, 0) or (d // n_heads if n_heads else 0)
    if get(a + "attention.value_length", int, head_dim) != head_dim:
        fail(f.path, f"{a}attention.value_length differs from the key length {head_dim}: not supported")
    if get(a + "rope.dimension_count", int, head_dim) != head_dim:
        fail(f.path, f"{a}rope.dimension_count {meta[a + 'rope.dimension_count']} is not the head size "
                      f"{head_dim}: partial RoPE is not supported")
    theta, eps = get(a + "rope.freq_base", float, 10000.0), get(a + "attention.layer_norm_rms_epsilon", float)
    if not usable_rope_theta(theta):
        fail(f.path, f"{a}rope.freq_base should be a positive float32 number, got {theta}")
    if not usable_rms_norm_eps(eps):
        fail(f.path, f"{a}attention.layer_norm_rms_epsilon should be in (0, {MAX_RMS_NORM_EPS}], got {eps}")
    vocab = _vocab_size(f, a, get)
    tok = "tokenizer.ggml."
    ids = {key: get(tok + key, int, -1) for key in ("bos_token_id", "eos_token_id", "eot_token_id",
                                                    "eom_token_id", "mask_token_id")}
    for key, i in ids.items():
        if i >= vocab:
            fail(f.path, f"{tok}{key} {i} is outside the vocabulary of {vocab} tokens")
    counts = {}
    for t in f.tensors.values():
        if len(t.ne) == 2:
            counts[GGML_TYPES[t.type][0]] = counts.get(GGML_TYPES[t.type][0], 0) + 1
    cfg = Config(
        model_type=arch,
        hidden_size=d,
        num_hidden_layers=get(a + "block_count", int),
        num_attention_heads=n_heads,
        num_key_value_heads=get(a + "attention.head_count_kv", int, n_heads),
        head_dim=head_dim,
        intermediate_size=get(a + "feed_forward_length", int),
        vocab_size=vocab,
        max_position_embeddings=get(a + "context_length", int),
        rope_theta=theta,
        rope_scaling=_rope_scaling(f, a, get, head_dim),
        rms_norm_eps=eps,
        tie_word_embeddings="output.weight" not in f,
        qkv_bias="blk.0.attn_q.bias" in f,
        o_bias="blk.0.attn_output.bias" in f,
        causal=get(a + "attention.causal", bool, defaults.causal),
        shifted_logits=get("diffusion.shift_logits", bool, defaults.shifted),
        bos_token_id=ids["bos_token_id"] if ids["bos_token_id"] >= 0 else None,
        eos_token_ids=tuple(dict.fromkeys([*(ids[k] for k in ("eos_token_id", "eot_token_id", "eom_token_id")
                                             if ids[k] >= 0), *_end_tokens(meta)])),
        mask_token_id=ids["mask_token_id"] if ids["mask_token_id"] >= 0 else None,
        block_size=get("tinydiff.block_size", int, 0) or None,
        dtype=max(counts, key=counts.get).lower() if counts else "f32",
        **_variants(f, a, arch, get, d, n_heads, head_dim),
    )
    check_shapes(cfg, show(f.path), {field: a + key for field, key in GGUF_KEYS.items()})
    return cfg


def _variants(f, a, arch, get, d, n_heads, head_dim):
    """The Config fields of the layer's variants that llama.cpp fixes for the architecture (the
    module docstring says which and why)."""
    if arch == "qwen3":
        return dict(qk_norm=True)
    if arch != "gemma3":
        return {}
    n_layers = get(a + "block_count", int)
    window = get(a + "attention.sliding_window", int, 0)
    windowed = _swa_layers(f, a, get, n_layers) if window > 0 else [False] * n_layers
    local = get(a + "rope.freq_base_swa", float, 10000.0)
    cap = get(a + "final_logit_softcapping", float, 0.0)
    if not (0 < local < float("inf") and 0 <= cap < float("inf")):
        fail(f.path, f"{a}rope.freq_base_swa {local} or final_logit_softcapping {cap} is not a usable number")
    return dict(hidden_act="gelu_tanh", qk_norm=True, sandwich_norms=True,
                layer_windows=tuple(window if w else 0 for w in windowed) if any(windowed) else (),
                local_rope_theta=local if any(windowed) else None,
                attention_scale=float(np.float32(1) / np.sqrt(np.float32(d // n_heads if n_layers == 62 else head_dim))),
                embedding_scale=float(np.sqrt(np.float32(d))), final_logit_softcapping=cap or None)


def _swa_layers(f, a, get, n_layers):
    """Which layers are windowed: {arch}.attention.sliding_window_pattern as one bool per layer, or
    a period n (every layer but each n-th; llama.cpp's set_swa_pattern), 6 if absent (Gemma 3's)."""
    key = a + "attention.sliding_window_pattern"
    pattern = f.metadata.get(key, 6)
    if isinstance(pattern, list):
        if len(pattern) != n_layers or f.value_types[key] != "array[bool]":
            fail(f.path, f"{key} should hold one bool per layer ({n_layers}), got {len(pattern)} "
                          f"{f.value_types[key]}")
        return [bool(w) for w in pattern]
    n = get(key, int, 6)
    return [n == 0 or i % n < n - 1 for i in range(n_layers)]


def _end_tokens(meta):
    """The ids of the vocabulary's END_TOKENS."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        return []
    ends = set(END_TOKENS)
    return [i for i, t in enumerate(tokens) if t in ends]


def _rope_scaling(f, a, get, head_dim):
    """Config.rope_scaling from llama.cpp's spelling: rope.scaling.type linear with
    rope.scaling.factor (or the older rope.scale_linear), or Llama 3.1's scaling as the tensor
    rope_freqs.weight [hd/2], the factor each frequency is divided by ("freq_factors")."""
    kind = get(a + "rope.scaling.type", str, "none")
    linear = get(a + "rope.scale_linear", float, 1.0)
    if kind not in ("none", "linear"):
        fail(f.path, f"{a}rope.scaling.type {show(kind)} is not supported (none, linear; llama3 as rope_freqs.weight)")
    if kind == "linear" or linear != 1.0:
        factor = get(a + "rope.scaling.factor", float, linear) if kind == "linear" else linear
        if not 0 < factor < float("inf"):
            fail(f.path, f"{a}rope.scaling.factor {factor} should be a positive number")
        return ("linear", factor)
    if "rope_freqs.weight" not in f:
        return ()
    factors = quant.dequantize(f.raw("rope_freqs.weight"))
    if factors.shape != (head_dim // 2,) or not (np.isfinite(factors) & (factors > 0)).all():
        fail(f.path, f"rope_freqs.weight should hold {head_dim // 2} positive numbers (one per RoPE frequency), "
                      f"got shape {factors.shape}")
    return ("freq_factors", *factors.tolist())


def _check_unsupported(f, a, arch, get):
    for key in ("attention.sliding_window", "expert_count"):
        if get(a + key, int, 0) and not (arch == "gemma3" and key == "attention.sliding_window"):
            fail(f.path, f"{a}{key} {f.metadata[a + key]}: not supported")


def _vocab_size(f, a, get):
    """The token list's length (llama.cpp's n_vocab), else the embedding's rows."""
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    n = len(tokens) if isinstance(tokens, list) else f.shape("token_embd.weight")[0]
    if get(a + "vocab_size", int, n) != n:
        fail(f.path, f"{a}vocab_size {f.metadata[a + 'vocab_size']} differs from the {n} tokens of "
                      "tokenizer.ggml.tokens")
    return n
