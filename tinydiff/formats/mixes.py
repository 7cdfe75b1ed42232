"""llama-quantize's mixes: the type each tensor of a GGUF file gets for a file type (`--type`).

types(tensors, ftype, n_layer) takes the file's tensors {GGUF name: shape} and a file type of
FTYPES (llama-quantize's names in lower case: q4_k_m, q6_k, ...; q4_k and q5_k are its aliases for
q4_k_m and q5_k_m) and returns {name: type} (quant.py's names, "q4_k", "f16", ...) for every tensor
llama-quantize would quantize; the others (vectors, norms) are absent and stay as stored. The
rules are llama.cpp's src/llama-quant.cpp (0c1e57098) for dense models, restated:

  - quantized: matrices (2-D or more) whose name ends in "weight", but norms and a few small tables
    (tensor_allows_quantization); a float file type (f32, f16, bf16) stores them all in that type.
  - the output matrix, and the token embedding when it is also the output (no output.weight):
    Q6_K, or Q8_0 where a row is not a whole block of the file's type or the type is Q8_0.
  - attn_v (and fused attn_qkv): Q6_K in Q4_K_M and Q5_K_M where use_more_bits(i, n) (the first
    and last eighth of the layers, and every third between), Q5_K in the first 4 layers of Q4_K_S.
  - ffn_down: Q6_K where use_more_bits in Q4_K_M and Q5_K_M, Q5_K in the first eighth in Q4_K_S.
  - everything else: the file type's own type (FTYPES).
  - a row not a whole block of the chosen type: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; a 32-block
    type, or a fallback whose block does not fit either, -> F16 (tensor_type_fallback).
The counters (i of use_more_bits) run in llama.cpp's order: tensors outside blk.N first, then by
layer, by name within one. Not restated: the Falcon, mixture-of-experts and 70B-model special
cases, --imatrix (Q4_0/Q5_0's ffn_down), --pure and the per-tensor overrides.
"""
import re

from ..errors import UsageError
from . import quant

# llama_ftype: name -> (number stored as general.file_type, the tensors' default type)
FTYPES = {"f32": (0, "f32"), "f16": (1, "f16"), "bf16": (32, "bf16"), "q8_0": (7, "q8_0"),
          "q4_0": (2, "q4_0"), "q4_1": (3, "q4_1"), "q5_0": (8, "q5_0"), "q5_1": (9, "q5_1"),
          "q4_k_s": (14, "q4_k"), "q4_k_m": (15, "q4_k"), "q5_k_s": (16, "q5_k"), "q5_k_m": (17, "q5_k"),
          "q6_k": (18, "q6_k")}
ALIASES = {"q4_k": "q4_k_m", "q5_k": "q5_k_m"}          # llama-quantize's Q4_K and Q5_K
CHOICES = (*FTYPES, *ALIASES)
FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}
FLOATS = ("f32", "f16", "bf16")
# substrings of names llama-quantize never quantizes (tensor_allows_quantization), dense models'
NOT_QUANTIZED = ("_norm.weight", "ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj",
                 "ssm_conv1d", "attn_rel_b.weight", "position_embd", "token_types.weight")
_LAYER = re.compile(r"blk\.(\d+)\.")


def canonical(ftype):
    """The FTYPES name of a --type (its alias resolved); a UsageError naming the choices."""
    name = ALIASES.get(ftype.lower(), ftype.lower())
    if name not in FTYPES:
        raise UsageError(f"unknown --type {ftype!r}; choose one of {', '.join(CHOICES)}")
    return name


def file_type(ftype):
    """general.file_type as llama.cpp numbers it (llama_ftype)."""
    return FTYPES[canonical(ftype)][0]


def quantized(name, shape):
    """Whether llama-quantize quantizes this tensor at all."""
    return len(shape) >= 2 and name.endswith("weight") and not any(s in name for s in NOT_QUANTIZED)


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _category(name):
    """tensor_get_category: the first of these that the name matches."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"), ("attn_v.weight", "attn_v"),
                     ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
                     ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down")):
        if key in name:
            return cat
    return "other"


def _order(name):
    m = _LAYER.match(name)
    return (int(m.group(1)) if m else -1, name)


def block(t):
    return quant.BLOCK.get(quant.READS[t], 1)


def fallback(t, columns):
    """tensor_type_fallback: a type whose blocks fit a row of `columns` weights."""
    if columns % block(t) == 0:
        return t
    t = FALLBACK.get(t, t)
    return t if columns % block(t) == 0 else "f16"


def types(tensors, ftype, n_layer):
    """{name: type} for the tensors {name: shape (numpy order, a row's length last)} that
    llama-quantize quantizes as file type ftype (FTYPES or an alias), n_layer the block count."""
    ftype = canonical(ftype)
    default = FTYPES[ftype][1]
    names = sorted((n for n, s in tensors.items() if quantized(n, s)), key=_order)
    if default in FLOATS:
        return {n: default for n in names}
    cats = {n: _category(n) for n in names}
    tied = "output.weight" not in tensors
    n_v = sum(c == "attn_v" for c in cats.values())
    i_v = i_down = 0
    out = {}
    for n in names:
        cat, cols, t = cats[n], tensors[n][-1], default
        if cat == "output" or (tied and cat == "token_embd"):
            t = "q8_0" if cols % block(default) or default == "q8_0" else "q6_k"
        elif cat == "attn_v":
            if ftype in ("q4_k_m", "q5_k_m") and use_more_bits(i_v, n_v):
                t = "q6_k"
            elif ftype == "q4_k_s" and i_v < 4:
                t = "q5_k"
            i_v += 1
        elif cat == "ffn_down":
            if ftype in ("q4_k_m", "q5_k_m") and use_more_bits(i_down, n_layer):
                t = "q6_k"
            elif ftype == "q4_k_s" and i_down < n_layer // 8:
                t = "q5_k"
            i_down += 1
        out[n] = fallback(t, cols)
    return out
