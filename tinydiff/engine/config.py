"""The model's hyperparameters, read from a Hugging Face config.json.

Names follow the checkpoint's keys (hidden_size, num_attention_heads, ...) so a reader can put
config.json beside this file. Two spellings exist in the wild: hub checkpoints mostly carry
`rope_theta`, `rope_scaling`, `torch_dtype` at top level; files saved by transformers >= 5 carry
`rope_parameters` and `dtype`. Both are read. Anything the engine does not implement (a RoPE
scaling type, sliding-window attention in use, another activation) is an error naming the field:
never a silently different model. A generation_config.json beside config.json adds its EOS ids to
the stop set and, if it says do_sample, its sampling settings as the model's defaults.
"""
import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import Optional

from ..errors import ModelError
from ..formats.files import show

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "llada", "Dream")


@dataclass(frozen=True)
class Config:
    model_type: str                  # "llama" | "mistral" | "qwen2" | "llada" | "Dream"
    hidden_size: int                 # d: width of the residual stream
    num_hidden_layers: int           # L
    num_attention_heads: int         # H: query heads
    num_key_value_heads: int         # KVH: key/value heads (H % KVH == 0; GQA when KVH < H)
    head_dim: int                    # hd: explicit in some configs, else d // H
    intermediate_size: int           # f: width of the SwiGLU MLP
    vocab_size: int                  # V
    max_position_embeddings: int     # the context length the model was trained for
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool        # LM head = embedding matrix
    qkv_bias: bool                   # q/k/v projections carry a bias (qwen2, llama attention_bias)
    o_bias: bool                     # output projection carries a bias (llama attention_bias)
    causal: bool = True              # False: a masked-diffusion model (bidirectional attention)
    shifted_logits: bool = False     # Dream, or config.json "shift_logits": row i predicts position i+1
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple = ()        # generation stops at any of these
    mask_token_id: Optional[int] = None
    block_size: Optional[int] = None  # block diffusion: attention causal across blocks of this many positions
    dtype: str = "float32"           # as stored, informational
    sampling_defaults: tuple = ()    # (name, value) pairs of SamplingParams from generation_config.json
    # () plain RoPE; ("linear", factor); ("llama3", factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings): Llama 3.1's frequency-dependent scaling; ("freq_factors",
    # f0, f1, ...): the same as a GGUF stores it, a divisor per frequency (transformer.py)
    rope_scaling: tuple = ()
    # How the layer varies between families: data the NumPy layer (transformer.py), the C layer
    # (csrc/layer.c) and the cost model (cost.py) all read; no layer tests a model_type.
    hidden_act: str = "silu"         # the gated MLP's act(gate) * up: "silu" (Llama, Qwen) | "gelu_tanh" (Gemma)
    norm_offset: float = 0.0         # RMSNorm scales by offset + w: 1 for Gemma's (1 + w), folded into w at load
    qk_norm: bool = False            # RMSNorm over each head of q and k before RoPE (Qwen 3, Gemma 3)
    sandwich_norms: bool = False     # the attention's and the MLP's outputs are normed before the residual (Gemma)
    layer_windows: tuple = ()        # per layer, the keys a query sees back (p - j < w), 0 all; () no window
    local_rope_theta: Optional[float] = None  # the windowed layers' RoPE base, unscaled (Gemma 3); None: rope_theta
    attention_scale: Optional[float] = None   # q.k's scale; None: 1/sqrt(hd) (Gemma: query_pre_attn_scalar^-0.5)
    embedding_scale: float = 1.0     # the embedding rows times this (Gemma: sqrt(d))
    final_logit_softcapping: Optional[float] = None  # logits -> cap * tanh(logits / cap) (Gemma 2)

    def window(self, layer):
        """The attention window of layer `layer` (0: every key the mask allows)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def scale(self):
        """The scale of q.k in attention."""
        return 1.0 / math.sqrt(self.head_dim) if self.attention_scale is None else self.attention_scale

    @property
    def q_dim(self):
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self):
        return self.num_key_value_heads * self.head_dim


def load_config(path):
    """Reads config.json at `path` (a file, or a folder holding one), and the folder's
    generation_config.json if there is one (with_generation_config)."""
    if os.path.isdir(path):
        return with_generation_config(load_config(os.path.join(path, "config.json")),
                                      os.path.join(path, "generation_config.json"))
    raw = _read_object(path)
    return config_from_dict(raw, where=path)


# generation_config.json's sampling fields, as transformers reads them: the SamplingParams field
# each sets, transformers' default once it samples, and the values it may take
SAMPLING_FIELDS = {"temperature": ("temperature", 1.0, lambda v: v >= 0),
                   "top_k": ("top_k", 50, lambda v: v >= 0 and v == int(v)),
                   "top_p": ("top_p", 1.0, lambda v: 0 < v <= 1),
                   "min_p": ("min_p", 0.0, lambda v: 0 <= v <= 1)}


def with_generation_config(cfg, path):
    """cfg with generation_config.json's EOS ids added to its own and its sampling defaults.

    As transformers' generate reads the file: do_sample true samples with the file's temperature,
    top_k, top_p, min_p (transformers' defaults for those it leaves out: 1.0, 50, 1.0, off);
    do_sample false is greedy (temperature 0); repetition_penalty applies either way, to the
    whole sequence as transformers applies it (repeat_last_n = the context). A file that does not
    say do_sample (most hold only token ids) leaves tinydiff's own defaults, llama.cpp's, in place.
    The sampler applies them in llama.cpp's order (sampling.py): temperature after top-k, top-p
    and min-p, where transformers applies it first, so a file's top_p keeps more tokens here."""
    if not os.path.isfile(path):
        return cfg
    raw = _read_object(path)
    eos = cfg.eos_token_ids + tuple(i for i in _token_ids(raw, "eos_token_id", path) if i not in cfg.eos_token_ids)
    do_sample = raw.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ModelError(f"{path}: field 'do_sample' should be true or false, got {_quote(do_sample)}")
    sampling = {"temperature": 0.0} if do_sample is False else {}
    for key, (ours, default, ok) in SAMPLING_FIELDS.items() if do_sample else ():
        sampling[ours] = _sampling_value(raw, key, default, ok, path)
    if raw.get("repetition_penalty") is not None:
        sampling["repeat_penalty"] = _sampling_value(raw, "repetition_penalty", 1.0, lambda v: v > 0, path)
        sampling["repeat_last_n"] = cfg.max_position_embeddings
    sampling = {k: int(v) if k == "top_k" else v for k, v in sampling.items()}
    cfg = dataclasses.replace(cfg, eos_token_ids=eos, sampling_defaults=tuple(sampling.items()))
    _check_token_ids(cfg, path)
    return cfg


def _sampling_value(raw, key, default, ok, path):
    value = raw.get(key)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ModelError(f"{path}: field '{key}' should be a number a sampler takes, got {_quote(value)}")
    return float(value)


def _read_object(path):
    """The JSON object in the file at path."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ModelError(f"{path}: file not found") from None
    except OSError as e:
        raise ModelError(f"{path}: cannot read: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise ModelError(f"{path}: JSON nested too deeply") from None
    if not isinstance(raw, dict):
        raise ModelError(f"{path}: not a JSON object")
    return raw


def config_from_dict(raw, where="config.json"):
    def get(key, kind, default=None, required=False):
        value = raw.get(key)
        if value is None:
            value = default
        if value is None:
            if required:
                raise ModelError(f"{where}: missing field '{key}'")
            return None
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = _as_float(value, key, where)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ModelError(f"{where}: field '{key}' should be {kind.__name__}, got {_quote(value)}")
        return value

    model_type = get("model_type", str, required=True)
    if model_type == "llada":
        raw = _llada_as_hf(raw, where)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(f"{where}: model_type {_quote(model_type)} not supported "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ModelError(f"{where}: hidden_act {_quote(act)} not supported (only silu)")
    if raw.get("mlp_bias"):
        raise ModelError(f"{where}: mlp_bias true not supported")
    _check_sliding_window(raw, model_type, where)

    d = get("hidden_size", int, required=True)
    n_heads = get("num_attention_heads", int, required=True)
    n_kv = get("num_key_value_heads", int, n_heads)
    head_dim = get("head_dim", int, None)                     # given (0 too: check_shapes refuses it), or d / H
    head_dim = head_dim if head_dim is not None else d // n_heads if n_heads else 0
    cfg = Config(
        model_type=model_type,
        hidden_size=d,
        num_hidden_layers=get("num_hidden_layers", int, required=True),
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv,
        head_dim=head_dim,
        intermediate_size=get("intermediate_size", int, required=True),
        vocab_size=get("vocab_size", int, required=True),
        max_position_embeddings=get("max_position_embeddings", int, 2048),
        rope_theta=_rope_theta(raw, where),
        rope_scaling=_rope_scaling(raw, where),
        rms_norm_eps=_rms_norm_eps(get("rms_norm_eps", float, 1e-6), where),
        tie_word_embeddings=get("tie_word_embeddings", bool, False),
        qkv_bias=model_type in ("qwen2", "Dream") or bool(raw.get("attention_bias", False)),
        o_bias=model_type == "llama" and bool(raw.get("attention_bias", False)),
        causal=get("is_causal", bool, model_type not in ("llada", "Dream")),
        shifted_logits=get("shift_logits", bool, model_type == "Dream"),
        bos_token_id=_token_id(raw, "bos_token_id", where),
        eos_token_ids=_token_ids(raw, "eos_token_id", where),
        mask_token_id=_token_id(raw, "mask_token_id", where),
        block_size=get("block_size", int, None),
        dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
    )
    check_shapes(cfg, where)
    _check_token_ids(cfg, where)
    return cfg


def _check_token_ids(cfg, where):
    """Special ids inside the vocabulary: one outside would fail only later, blaming the caller."""
    V = cfg.vocab_size
    for key, ids in (("bos_token_id", [cfg.bos_token_id]), ("eos_token_id", cfg.eos_token_ids),
                     ("mask_token_id", [cfg.mask_token_id])):
        bad = next((i for i in ids if i is not None and not 0 <= i < V), None)
        if bad is not None:
            raise ModelError(f"{where}: field '{key}' is {bad}, outside the vocabulary (0..{V - 1})")


def _llada_as_hf(raw, where):
    """LLaDA's config.json (OLMo's key names) spelled the Hugging Face way."""
    unsupported = [k for k in ("include_bias", "scale_logits", "input_emb_norm", "attention_layer_norm")
                   if raw.get(k)]
    if unsupported:
        raise ModelError(f"{where}: {unsupported[0]} true is not supported (LLaDA's Llama block only)")
    if raw.get("activation_type", "silu") != "silu":
        raise ModelError(f"{where}: activation_type {_quote(raw['activation_type'])} not supported (only silu)")
    if raw.get("layer_norm_type", "rms") != "rms":
        raise ModelError(f"{where}: layer_norm_type {_quote(raw['layer_norm_type'])} not supported (only rms)")
    renamed = dict(hidden_size="d_model", num_hidden_layers="n_layers", num_attention_heads="n_heads",
                   num_key_value_heads="n_kv_heads", intermediate_size="mlp_hidden_size",
                   max_position_embeddings="max_sequence_length", tie_word_embeddings="weight_tying",
                   attention_bias="include_qkv_bias")
    hf = {**raw, **{ours: raw.get(theirs) for ours, theirs in renamed.items()}}
    hf["vocab_size"] = raw.get("embedding_size") or raw.get("vocab_size")   # embedding_size is the real one
    hf["rms_norm_eps"] = raw.get("rms_norm_eps", 1e-5)
    return hf


def _rope_blocks(raw, where):
    """config.json's rope_parameters (transformers >= 5) and rope_scaling (older) objects."""
    params, scaling = raw.get("rope_parameters") or {}, raw.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise ModelError(f"{where}: rope_parameters/rope_scaling should be objects")
    return (("rope_parameters", params), ("rope_scaling", scaling))


# The RoPE scaling types tinydiff implements, and the fields each reads (transformers'
# modeling_rope_utils: _compute_linear_scaling_rope_parameters, _compute_llama3_parameters)
ROPE_SCALING = {"linear": ("factor",),
                "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def _rope_scaling(raw, where):
    """The RoPE scaling as Config.rope_scaling holds it, from either spelling."""
    for field, block in _rope_blocks(raw, where):
        kind = block.get("rope_type", block.get("type", "default"))
        if kind == "default":
            continue
        if not isinstance(kind, str) or kind not in ROPE_SCALING:
            raise ModelError(f"{where}: {field}.rope_type {_quote(kind)} not supported "
                             f"(default, {', '.join(ROPE_SCALING)})")
        values = []
        for key in ROPE_SCALING[kind]:
            value = block.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < FLOAT32_MAX:
                raise ModelError(f"{where}: {field}.{key} should be a positive number, got {_quote(value)}")
            values.append(value)
        if kind == "llama3" and not values[2] > values[1]:
            raise ModelError(f"{where}: {field}.high_freq_factor {values[2]} should exceed low_freq_factor {values[1]}")
        return (kind, *values)
    return ()


def _rope_theta(raw, where):
    """rope_theta, from either spelling."""
    params = dict(_rope_blocks(raw, where))["rope_parameters"]
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ModelError(f"{where}: rope_theta should be a positive number, got {_quote(theta)}")
    theta = _as_float(theta, "rope_theta", where)
    if not usable_rope_theta(theta):
        raise ModelError(f"{where}: rope_theta should be a positive float32 number, got {theta!r}")
    return theta


# The RoPE table and RMSNorm are computed in float32: a value that is 0, negative, NaN, or not a
# float32 (0 or inf once rounded, or subnormal, whose powers overflow) makes every logit NaN or
# every rotation void.
FLOAT32_TINY, FLOAT32_MAX = 1.1754943508222875e-38, 3.4028234663852886e38


def usable_rope_theta(theta):
    return FLOAT32_TINY <= theta <= FLOAT32_MAX


def usable_rms_norm_eps(eps):
    return 0 <= eps <= FLOAT32_MAX


def _quote(value):
    """A value from the file as messages show it: repr (one line, quoted), cut if long."""
    return show(repr(value))


def _as_float(value, key, where):
    """A JSON number as a float; an integer too big for one (1e400 spelled out) is an error."""
    try:
        return float(value)
    except OverflowError:
        raise ModelError(f"{where}: field '{key}' is too large a number") from None


def _rms_norm_eps(eps, where):
    """RMSNorm divides by sqrt(mean(x^2) + eps): a negative or NaN eps makes logits NaN."""
    if not usable_rms_norm_eps(eps):
        raise ModelError(f"{where}: rms_norm_eps should be a float32 number >= 0, got {eps!r}")
    return eps


def _check_sliding_window(raw, model_type, where):
    window = raw.get("sliding_window")
    in_use = window is not None and (model_type == "mistral" or raw.get("use_sliding_window", False))
    max_pos = raw.get("max_position_embeddings", 2048)
    if in_use and isinstance(window, int) and isinstance(max_pos, int) and window < max_pos:
        raise ModelError(f"{where}: sliding_window={window} is in use (< max_position_embeddings="
                         f"{max_pos}); sliding-window attention is not implemented")


def _token_ids(raw, key, where):
    """Special token ids; HF allows one id or a list (Llama 3 has several EOS ids)."""
    value = raw.get(key)
    values = value if isinstance(value, list) else [] if value is None else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelError(f"{where}: field '{key}' should be an integer or a list of them, got {_quote(value)}")
    return tuple(values)


def _token_id(raw, key, where):
    ids = _token_ids(raw, key, where)
    return ids[0] if ids else None


def check_shapes(cfg, where):
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings"):
        if getattr(cfg, key) <= 0:
            raise ModelError(f"{where}: field '{key}' should be positive, got {getattr(cfg, key)}")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ModelError(f"{where}: num_attention_heads={cfg.num_attention_heads} is not a multiple "
                         f"of num_key_value_heads={cfg.num_key_value_heads}")
    if cfg.head_dim % 2:
        raise ModelError(f"{where}: head_dim={cfg.head_dim} must be even for RoPE")
    if cfg.block_size is not None and not 1 <= cfg.block_size <= cfg.max_position_embeddings:
        raise ModelError(f"{where}: field 'block_size' is {cfg.block_size}, not a block of 1.."
                         f"{cfg.max_position_embeddings} positions")
    if cfg.block_size is not None and cfg.causal:    # a block model attends both ways inside a block
        raise ModelError(f"{where}: block_size {cfg.block_size} is a block-diffusion model's, but the model "
                         f"says its attention is causal")
