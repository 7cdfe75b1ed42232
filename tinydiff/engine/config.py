"""The model's hyperparameters, read from a Hugging Face config.json.

Names follow the checkpoint's keys (hidden_size, num_attention_heads, ...) so a reader can put
config.json beside this file. Two spellings exist in the wild: hub checkpoints mostly carry
`rope_theta`, `rope_scaling`, `torch_dtype` at top level; files saved by transformers >= 5 carry
`rope_parameters` and `dtype`. Both are read. Anything the engine does not implement (a RoPE
scaling type, sliding-window attention in use, another activation) is an error naming the field:
never a silently different model. A generation_config.json beside config.json adds its EOS ids to
the stop set and, if it says do_sample, its sampling settings as the model's defaults; a
masked-diffusion model's file may also hold its denoising defaults (DENOISING_KEYS).

The families whose layer differs from Llama's (Qwen 3, Gemma 2, Gemma 3) are read as transformers'
Qwen3Config, Gemma2Config and Gemma3TextConfig read them (_family): their defaults for keys a
file leaves out (a Gemma config.json rarely says tie_word_embeddings, which is true), their
per-layer attention types (layer_types, or the older sliding_window_pattern) and the RoPE bases
of each, as Config fields the layer reads.
"""
import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import Optional

from ..errors import ModelError
from ..formats.files import show

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "llada", "Dream")
GEMMA = ("gemma2", "gemma3_text")
# config.json's activation -> Config.hidden_act (transformers' ACT2FN names; gelu_pytorch_tanh is
# GELU's tanh approximation, which Gemma's MLP uses)
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
# transformers' defaults for keys a Gemma config.json may leave out (Gemma2Config, Gemma3TextConfig),
# where they differ from the ones config_from_dict falls back on for every family
FAMILY_DEFAULTS = {
    "gemma2": dict(head_dim=256, tie_word_embeddings=True, max_position_embeddings=8192, query_pre_attn_scalar=256,
                   sliding_window=4096, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                   hidden_activation="gelu_pytorch_tanh", num_key_value_heads=4),
    "gemma3_text": dict(head_dim=256, tie_word_embeddings=True, max_position_embeddings=131072,
                        query_pre_attn_scalar=256, sliding_window=4096, hidden_activation="gelu_pytorch_tanh",
                        rope_theta=1000000.0, rope_local_base_freq=10000.0, num_key_value_heads=4),
    "qwen3": dict(head_dim=128, max_position_embeddings=32768),
}


@dataclass(frozen=True)
class Config:
    model_type: str                  # SUPPORTED_MODEL_TYPES; a GGUF file's architecture (gguf_model.py)
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
    denoising_defaults: tuple = ()   # (name, value) pairs of decoding.diffusion.Options from it (not causal)
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


# generation_config.json keys a masked-diffusion model's decoder reads as its defaults, named as the
# Options fields they set (decoding.diffusion; Dream's file spells steps, eps and alg_temp so too):
# the commit rule and its tuning, which Model checks when it loads them
DENOISING_KEYS = ("steps", "block_length", "block_size", "remasking", "threshold", "factor", "entropy_bound", "gap", "schedule",
                  "eps", "alg_temp", "cfg_scale", "cache", "eos", "repeat_last_n")


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
    denoising = () if cfg.causal else _denoising_defaults(raw, sampling)
    cfg = dataclasses.replace(cfg, eos_token_ids=eos, sampling_defaults=tuple(sampling.items()),
                              denoising_defaults=denoising)
    _check_token_ids(cfg, path)
    return cfg


def _denoising_defaults(raw, sampling):
    """A diffusion model's denoising defaults: its DENOISING_KEYS, and the sampling ones as its decoder
    names them (min_p it has not; a repetition penalty covers the repeat_last_n positions either side
    of a hole, 64 unless the file says, not the whole context as in AR decoding)."""
    out = {k: raw[k] for k in DENOISING_KEYS if raw.get(k) is not None}
    out.update({k: v for k, v in sampling.items() if k in ("temperature", "top_k", "top_p", "repeat_penalty")})
    return tuple(sorted(out.items()))


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
    if model_type == "gemma3":
        raise ModelError(f"{where}: model_type 'gemma3' (Gemma3ForConditionalGeneration, with its vision tower) "
                         "not supported: tinydiff runs the text model alone (model_type gemma3_text, Gemma3ForCausalLM)")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(f"{where}: model_type {_quote(model_type)} not supported "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    raw = {**FAMILY_DEFAULTS.get(model_type, {}), **raw}
    act_key = "hidden_activation" if model_type in GEMMA else "hidden_act"   # what each family's MLP reads
    act = raw.get(act_key, "silu")
    if act not in ACTIVATIONS:
        raise ModelError(f"{where}: {act_key} {_quote(act)} not supported ({', '.join(ACTIVATIONS)})")
    if raw.get("mlp_bias"):
        raise ModelError(f"{where}: mlp_bias true not supported")
    if model_type not in FAMILY_DEFAULTS:
        _check_sliding_window(raw, model_type, where)

    d = get("hidden_size", int, required=True)
    n_heads = get("num_attention_heads", int, required=True)
    n_kv = get("num_key_value_heads", int, n_heads)
    head_dim = get("head_dim", int, None)                     # given (0 too: check_shapes refuses it), or d / H
    if head_dim is None and n_heads > 0 and d % n_heads:
        raise ModelError(f"{where}: num_attention_heads {n_heads} does not divide hidden_size {d} (and no head_dim)")
    head_dim = head_dim if head_dim is not None else d // n_heads if n_heads else 0
    n_layers = get("num_hidden_layers", int, required=True)
    attention_bias = bool(raw.get("attention_bias", False))
    cfg = Config(
        model_type=model_type,
        hidden_size=d,
        num_hidden_layers=n_layers,
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
        qkv_bias=model_type in ("qwen2", "Dream") or attention_bias,
        # Llama and the families after Qwen 2 put the bias on all four projections
        o_bias=model_type in ("llama", "qwen3", *GEMMA) and attention_bias,
        causal=get("is_causal", bool, model_type not in ("llada", "Dream")),
        shifted_logits=get("shift_logits", bool, model_type == "Dream"),
        bos_token_id=_token_id(raw, "bos_token_id", where),
        eos_token_ids=_token_ids(raw, "eos_token_id", where),
        mask_token_id=_token_id(raw, "mask_token_id", where),
        block_size=get("block_size", int, None),
        dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
        hidden_act=ACTIVATIONS[act],
        **_family(raw, model_type, n_layers, d, where, get),
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


def _family(raw, model_type, n_layers, d, where, get):
    """The Config fields of the layer's variants as the family's transformers model reads its
    config.json: Qwen 3 norms q and k per head; Gemma 2 and 3 scale the embedding by sqrt(d) and
    their norms by 1 + w, norm both blocks' outputs, scale q.k by query_pre_attn_scalar^-0.5
    and window some layers (layer_types); Gemma 3 also norms q and k and gives its windowed layers
    their own RoPE base; Gemma 2's logits may be soft-capped. Gemma 2's attention scores are
    soft-capped as well (attn_logit_softcapping, on in every released Gemma 2), which tinydiff's
    layer does not do: such a config is refused, not run without it."""
    if model_type not in FAMILY_DEFAULTS:
        return {}
    windows = _layer_windows(raw, model_type, n_layers, where)
    if model_type == "qwen3":
        return dict(qk_norm=True, layer_windows=windows)
    if raw.get("attn_logit_softcapping") is not None:
        raise ModelError(f"{where}: attn_logit_softcapping {_quote(raw['attn_logit_softcapping'])}: soft-capped "
                         "attention scores are not implemented (Gemma 2's; Gemma 3 has none)")
    if raw.get("use_bidirectional_attention"):
        raise ModelError(f"{where}: use_bidirectional_attention true (an embedding model's) is not supported")
    scalar = get("query_pre_attn_scalar", float)
    cap = get("final_logit_softcapping", float)
    if scalar is None or not 0 < scalar < FLOAT32_MAX or (cap is not None and not 0 < cap < FLOAT32_MAX):
        raise ModelError(f"{where}: query_pre_attn_scalar {scalar!r} and final_logit_softcapping {cap!r} "
                         "should be positive numbers")
    return dict(norm_offset=1.0, qk_norm=model_type == "gemma3_text", sandwich_norms=True,
                layer_windows=windows, attention_scale=scalar ** -0.5, embedding_scale=math.sqrt(d),
                final_logit_softcapping=cap,
                local_rope_theta=_local_rope_theta(raw, where) if model_type == "gemma3_text" else None)


# the attention types of config.json's layer_types that tinydiff runs
LAYER_TYPES = ("full_attention", "sliding_attention")


def _layer_windows(raw, model_type, n_layers, where):
    """Config.layer_windows from layer_types (transformers >= 4.53), or, where a file has none,
    the pattern transformers derives: Gemma 3 windows all but every sliding_window_pattern-th layer
    (6), Gemma 2 every other one from the first, Qwen 3 the layers from max_window_layers on when
    use_sliding_window says so. A window is sliding_window keys (p - j < w, transformers'
    sliding_window_overlay)."""
    window = raw.get("sliding_window")
    if model_type == "qwen3" and not raw.get("use_sliding_window"):
        window = None                                   # Qwen3Config sets it to None then
    types = raw.get("layer_types")
    if types is None:
        pattern = raw.get("sliding_window_pattern", raw.get("_sliding_window_pattern", 6))
        if model_type == "gemma2":
            pattern = 2
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise ModelError(f"{where}: sliding_window_pattern should be a positive integer, got {_quote(pattern)}")
        first = raw.get("max_window_layers", 28)
        types = ["sliding_attention" if (window is not None and i >= first if model_type == "qwen3"
                                         else (i + 1) % pattern) else "full_attention" for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or any(t not in LAYER_TYPES for t in types):
        raise ModelError(f"{where}: layer_types should list {n_layers} of {', '.join(LAYER_TYPES)}, got {_quote(types)}")
    if "sliding_attention" not in types or (window is None and model_type == "qwen3"):
        return ()                                       # Qwen 3: a sliding layer without a window sees all
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ModelError(f"{where}: sliding_window should be a positive integer for layer_types' "
                         f"sliding_attention layers, got {_quote(window)}")
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def _rope_blocks(raw, where, layer_type="full_attention"):
    """config.json's rope_parameters (transformers >= 5) and rope_scaling (older) objects. A model
    whose layers differ (Gemma 3) has rope_parameters per layer type: the global layers' are read
    here, with any rope_scaling an older file gives them."""
    params, scaling = raw.get("rope_parameters") or {}, raw.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise ModelError(f"{where}: rope_parameters/rope_scaling should be objects")
    if any(t in params for t in LAYER_TYPES):
        block = params.get(layer_type) or {}
        if not isinstance(block, dict):
            raise ModelError(f"{where}: rope_parameters.{layer_type} should be an object")
        return ((f"rope_parameters.{layer_type}", block),
                ("rope_scaling", scaling if layer_type == "full_attention" else {}))
    return (("rope_parameters", params), ("rope_scaling", scaling))


def _local_rope_theta(raw, where):
    """Gemma 3's windowed layers' RoPE base: rope_parameters.sliding_attention.rope_theta, or the
    older rope_local_base_freq; their RoPE is never scaled (transformers' Gemma3RotaryEmbedding)."""
    field, block = _rope_blocks(raw, where, "sliding_attention")[0]
    if block.get("rope_type", "default") != "default":
        raise ModelError(f"{where}: {field}.rope_type {_quote(block['rope_type'])} not supported (default)")
    theta = block.get("rope_theta", raw.get("rope_local_base_freq"))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not usable_rope_theta(float(theta)):
        raise ModelError(f"{where}: the sliding layers' rope_theta should be a positive float32 number, got {_quote(theta)}")
    return float(theta)


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
    params = _rope_blocks(raw, where)[0][1]
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


# RMSNorm's eps is a guard against dividing by zero, 1e-5 or 1e-6 in every real model: one above
# 0.1 swamps mean(x^2) and the norm no longer normalises (the audit's 2147483647 loaded and gave
# nonsense); 0 would divide by zero on a zero row.
MAX_RMS_NORM_EPS = 0.1
# The largest dimension the kernels index with 32-bit ints, and the longest context a Config may
# claim (2^26 positions; the longest real one, Llama 4 Scout's, is 10M): beyond either, a number
# is not a model's but a corrupt file's.
MAX_DIM, MAX_POSITIONS = 2**31 - 1, 2**26


def usable_rms_norm_eps(eps):
    return 0 < eps <= MAX_RMS_NORM_EPS


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
        raise ModelError(f"{where}: rms_norm_eps should be in (0, {MAX_RMS_NORM_EPS}], got {eps!r}")
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


def check_shapes(cfg, where, keys=None):
    """Sizes that can be true of a model: positive, within MAX_DIM (the context within
    MAX_POSITIONS), whole head groups, an even head size. keys: the names the source spells the
    fields with (a GGUF file's keys), for the messages; default config.json's."""
    keys = keys or {}
    for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings"):
        value, top = getattr(cfg, field), MAX_POSITIONS if field == "max_position_embeddings" else MAX_DIM
        key = keys.get(field, f"field '{field}'")
        if value <= 0:
            raise ModelError(f"{where}: {key} should be positive, got {value}")
        if value > top:
            raise ModelError(f"{where}: {key} is {value}, more than any model's ({top})")
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
