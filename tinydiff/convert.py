"""`tinydiff convert`: a Hugging Face checkpoint folder written as a GGUF file (or a GGUF file in
another type: requantize.py, as llama-quantize).

It writes what llama.cpp's convert_hf_to_gguf.py plus llama-quantize would: matrices in the chosen
type, vectors f32, f16 for a q8_0/q4_0 matrix whose rows are not whole 32-weight blocks (the
converter's own fallback), and the folder's chat template, if it has one. The llama-quantize file
types beyond those (q4_1, q5_0, q5_1, q4_k_m, q4_k_s, q5_k_m, q5_k_s, q6_k; q4_k, q5_k their
aliases) give each matrix llama-quantize's type for it (formats/mixes.py: Q6_K for the tied
embedding, attn_v and ffn_down where it spends more bits, Q5_0 for Q4_K rows of 576, ...). The conventions (names,
keys, the Q/K permutation) are gguf_model.py's, which reads such files back. The file is written
under a temporary name and renamed into place, so an output that is a symlink is written through to
its target, and one that is not a regular file (a device, FIFO, socket, directory) is refused before
anything is written, never replaced by a file.
"""
import os
import stat

from .engine.gguf_model import ARCHITECTURES, HF_ARCHITECTURES, permute_rows
from .errors import UsageError
from .formats import mixes, quant
from .formats.files import fail
from .formats.gguf import QUANTIZATION_VERSION, Planned, write_gguf
from .requantize import is_gguf, requantize

CONVERTER_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")   # every matrix this type, as convert_hf_to_gguf.py


def convert(src, out, wtype="f16", allow_requantize=False):
    """Writes the Hugging Face checkpoint folder src as the GGUF file out, as llama.cpp's
    convert_hf_to_gguf.py plus llama-quantize would: matrices (the token embedding too) in wtype,
    vectors (norms, biases) in f32. A q8_0/q4_0 matrix whose rows are not whole 32-weight blocks is
    stored as f16, as llama.cpp's converter falls back. Returns the names of those tensors.

    GGUF has one eos_token_id: of several EOS ids (config.json's and generation_config.json's), the
    first is it, and two more are kept as llama.cpp's eot_token_id / eom_token_id (_more_stops),
    which load back into the stop set; a fourth would be lost.

    A GGUF file src is requantized as llama-quantize does (requantize.py; a block-type tensor only
    with allow_requantize); then the return value is {type: tensor count}."""
    from .engine.config import load_config
    from .engine.weights import refuse_unused
    from .formats.chat_template import load_chat_template
    from .formats.safetensors import load_checkpoint
    from .formats.tokenizer import Tokenizer
    wtype = mixes.canonical(wtype)
    if is_gguf(src):
        return requantize(src, _output_path(out), wtype, allow_requantize)
    if allow_requantize:
        raise UsageError("--allow-requantize is for a GGUF input: a Hugging Face folder's weights are not quantized")
    if not os.path.isdir(src):
        fail(src, "not a Hugging Face model folder (config.json, *.safetensors, tokenizer.json) or a GGUF file")
    out = _output_path(out)     # before the checkpoint is read: a refusal costs nothing
    cfg = load_config(src)
    if cfg.model_type not in HF_ARCHITECTURES:  # Gemma 2: read, not written
        fail(src, f"convert does not write {cfg.model_type} models yet ({', '.join(HF_ARCHITECTURES)})")
    arch = HF_ARCHITECTURES[cfg.model_type]
    if arch == "gemma3":
        _check_gemma3(cfg, src)
    ckpt = load_checkpoint(src)
    refuse_unused(cfg, ckpt)
    tok_path = os.path.join(src, "tokenizer.json")
    tok = Tokenizer.from_file(tok_path)
    if tok.vocab_size > cfg.vocab_size:
        fail(src, f"tokenizer.json has {tok.vocab_size} tokens but the model's vocab_size is {cfg.vocab_size}")
    metadata = {**_config_metadata(cfg, arch, wtype, os.path.basename(os.path.abspath(src))),
                **tok.gguf_metadata(cfg.vocab_size, tok_path), **_special_tokens(cfg, tok, tok_path)}
    template = load_chat_template(src)
    if template is not None:    # as convert_hf_to_gguf.py carries it
        metadata["tokenizer.chat_template"] = ("string", template.source)
    tensors, fallbacks = _tensor_plans(cfg, ckpt, arch, wtype)
    write_gguf(out, metadata, tensors)
    return fallbacks


def _output_path(out):
    """The path to write out as: a symlink's target, since write_gguf's rename would replace the
    link itself; refused unless it is a regular file or nothing yet, since the rename would turn
    a device or FIFO into a regular file (and a directory cannot be written at all)."""
    out = os.fspath(out)
    path = os.path.realpath(out) if os.path.islink(out) else out
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:   # a new file, or a dangling link's target: created
        return path
    if not stat.S_ISREG(mode):
        where = out if path == out else f"{out} (-> {path})"
        raise UsageError(f"{where} is not a regular file ({_kind(mode)}): convert writes a new file")
    return path


def _kind(mode):
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "another kind of file"


def _config_metadata(cfg, arch, wtype, name):
    a = arch + "."
    meta = {
        "general.architecture": ("string", arch), "general.name": ("string", name),
        "general.file_type": ("uint32", mixes.file_type(wtype)),
        "general.quantization_version": ("uint32", QUANTIZATION_VERSION),
        a + "vocab_size": ("uint32", cfg.vocab_size),
        a + "context_length": ("uint32", cfg.max_position_embeddings),
        a + "embedding_length": ("uint32", cfg.hidden_size),
        a + "block_count": ("uint32", cfg.num_hidden_layers),
        a + "feed_forward_length": ("uint32", cfg.intermediate_size),
        a + "rope.dimension_count": ("uint32", cfg.head_dim),
        a + "attention.head_count": ("uint32", cfg.num_attention_heads),
        a + "attention.head_count_kv": ("uint32", cfg.num_key_value_heads),
        a + "rope.freq_base": ("float32", cfg.rope_theta),
        a + "attention.layer_norm_rms_epsilon": ("float32", cfg.rms_norm_eps),
    }
    if cfg.head_dim != cfg.hidden_size // cfg.num_attention_heads or arch == "gemma3":   # Gemma3Model: always
        meta[a + "attention.key_length"] = meta[a + "attention.value_length"] = ("uint32", cfg.head_dim)
    if not cfg.causal:
        meta[a + "attention.causal"] = ("bool", False)
    if not ARCHITECTURES[arch].causal or cfg.shifted_logits != ARCHITECTURES[arch].shifted:
        meta["diffusion.shift_logits"] = ("bool", cfg.shifted_logits)
    if cfg.block_size is not None:
        meta["tinydiff.block_size"] = ("uint32", cfg.block_size)
    if cfg.rope_scaling[:1] == ("linear",):
        meta[a + "rope.scaling.type"] = ("string", "linear")
        meta[a + "rope.scaling.factor"] = ("float32", cfg.rope_scaling[1])
    if arch == "gemma3" and cfg.layer_windows:   # as Gemma3Model.set_gguf_parameters writes them
        meta[a + "attention.sliding_window"] = ("uint32", max(cfg.layer_windows))
        meta[a + "rope.freq_base_swa"] = ("float32", cfg.local_rope_theta)
    if arch == "gemma3" and cfg.final_logit_softcapping:
        meta[a + "final_logit_softcapping"] = ("float32", cfg.final_logit_softcapping)
    return meta


def _check_gemma3(cfg, src):
    """What a gemma3 GGUF cannot say, refused rather than written as another model: llama.cpp fixes
    the windowed layers (all but every sixth), one window, and q.k's scale 1/sqrt(head_dim)."""
    import numpy as np
    pattern = tuple(bool(w) for w in cfg.layer_windows)
    if pattern and (pattern != tuple(i % 6 != 5 for i in range(cfg.num_hidden_layers)) or len(set(cfg.layer_windows) - {0}) > 1):
        fail(src, "convert writes Gemma 3's sliding windows only in its own pattern (one window, every "
                  "sixth layer global), which is all llama.cpp's gemma3 reads")
    if cfg.attention_scale is not None and not np.isclose(cfg.attention_scale, 1 / np.sqrt(cfg.head_dim), rtol=1e-6):
        fail(src, f"query_pre_attn_scalar {cfg.attention_scale ** -2:g} is not head_dim {cfg.head_dim}: llama.cpp's "
                  "gemma3 scales q.k by 1/sqrt(head_dim) and has no key for another scale")


def _special_tokens(cfg, tok, where):
    """BOS/EOS/mask ids, and whether encoding adds BOS/EOS (the tokenizer's template)."""
    if len(tok.prefix_ids) > 1 or len(tok.suffix_ids) > 1:
        fail(where, "the post-processor adds more than one token before or after the text, which "
                     "GGUF's add_bos_token / add_eos_token cannot say")
    bos = tok.prefix_ids[0] if tok.prefix_ids else cfg.bos_token_id
    eos = tok.suffix_ids[0] if tok.suffix_ids else (cfg.eos_token_ids or (tok.eos_id,))[0]
    k = "tokenizer.ggml."
    meta = {k + "add_bos_token": ("bool", bool(tok.prefix_ids)), k + "add_eos_token": ("bool", bool(tok.suffix_ids))}
    for key, i in (("bos_token_id", bos), ("eos_token_id", eos), ("mask_token_id", cfg.mask_token_id),
                   *_more_stops(cfg, tok, eos)):
        if i is not None:
            meta[k + key] = ("uint32", i)
    return meta


def _more_stops(cfg, tok, eos):
    """The config's other EOS ids (Llama 3: <|eot_id|>, <|eom_id|> after <|end_of_text|>) as
    llama.cpp's end-of-turn and end-of-message keys: <|eom_id|> as eom, the first other as eot,
    then a second other as eom if no <|eom_id|> took it."""
    others = [i for i in cfg.eos_token_ids if i != eos]
    named = next((i for i in others if tok.id_to_token(i) == "<|eom_id|>"), None)
    rest = [i for i in others if i != named] + [None, None]
    return (("eot_token_id", rest[0]), ("eom_token_id", named if named is not None else rest[1]))


def _rope_freqs(cfg):
    """Llama 3.1's RoPE scaling as llama.cpp's converter stores it: the factor each frequency is
    divided by ([hd/2] f32), which gguf_model.py reads back as rope_scaling "freq_factors"."""
    import dataclasses

    import numpy as np

    from .engine.transformer import rope_inv_freq
    plain, scaled = rope_inv_freq(dataclasses.replace(cfg, rope_scaling=())), rope_inv_freq(cfg)
    # a blended frequency divided by its float32 factor at load can land an ulp from the
    # checkpoint's (no float32 factor hits it exactly): the logits differ by ~1e-6
    return (plain.astype(np.float64) / scaled).astype(np.float32)


def _tensor_plans(cfg, ckpt, arch, wtype):
    """{GGUF name: Planned} in llama.cpp's order, and the names stored as f16 instead of wtype."""
    from .engine.weights import GGUF_NAMES, checkpoint_names, layer_tensors, stored_norm
    hf_names = checkpoint_names(cfg)
    d, V = cfg.hidden_size, cfg.vocab_size
    layer = layer_tensors(cfg)
    fields = [("embed_tokens", "", (V, d))]
    fields += [(t.name, i, t.shape(cfg)) for i in range(cfg.num_hidden_layers) for t in layer]
    fields += [("norm", "", (d,))] + ([] if cfg.tie_word_embeddings else [("lm_head", "", (V, d))])
    heads = {t.name: t.permuted_heads(cfg) for t in layer if t.permuted_heads} if ARCHITECTURES[arch].permuted else {}
    plans, fallbacks = {}, []
    if cfg.rope_scaling[:1] == ("llama3",):   # first, as llama.cpp's converter writes it
        plans["rope_freqs.weight"] = _rope_freqs(cfg)
    named = [((GGUF_NAMES["layer"].format(i=i) if i != "" else "") + GGUF_NAMES[field],
              (hf_names["layer"].format(i=i) if i != "" else "") + hf_names[field], field, shape)
             for field, i, shape in fields]
    mix = None if wtype in CONVERTER_TYPES else mixes.types({g: s for g, _, _, s in named}, wtype, cfg.num_hidden_layers)
    for gguf_name, hf, field, shape in named:
        t = "f32" if len(shape) == 1 else wtype if mix is None else mix[gguf_name]
        if t in ("q8_0", "q4_0") and shape[-1] % quant.QK:
            t = "f16"
            fallbacks.append(gguf_name)

        def make(hf=hf, shape=shape, t=t, n_head=heads.get(field), field=field):
            w = stored_norm(cfg, field, ckpt.expect(hf, shape))   # Gemma's norms as 1 + w, as its converter
            return quant.quantize(permute_rows(w, n_head) if n_head else w, t)
        plans[gguf_name] = Planned(t, shape, make)
    return plans, fallbacks
