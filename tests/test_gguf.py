"""GGUF: tinydiff's reader and writer against three independent sources of GGUF files, and every
kind of malformed file.

  - `tinydiff convert` round trips: HF fixture -> GGUF -> the same logits (f32 exactly);
  - a GGUF built here byte by byte with struct from the format description (ggml docs/gguf.md),
    Q/K permuted as llama.cpp's converter does, against transformers' logits;
  - tests/fixtures/gguf/llama-gqa-mixed.gguf, written by llama.cpp's own gguf-py
    (tests/fixtures/make_gguf.py), and, where `gguf` is installed, our files read by gguf-py.

Until the kernels take f16/bf16/q8_0/q4_0 weights as stored, models of those types are checked
through `widened`: the same weights dequantized to f32, which is what the stored bytes mean.
"""
import json
import os
import shutil
import stat
import struct
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tinydiff
from tinydiff.convert import convert
from tinydiff.engine import kernels
from tinydiff.engine.gguf_model import permute_rows
from tinydiff.engine.masks import BIDIRECTIONAL
from tinydiff.engine.transformer import rope_inv_freq
from tinydiff.engine.weights import GGUF_NAMES, HF_NAMES, LayerWeights, Weights
from tinydiff.errors import ModelError, UsageError
from tinydiff.formats import quant
from tinydiff.formats.gguf import open_gguf, write_gguf
from tinydiff.formats.safetensors import load_checkpoint, save_safetensors
from tinydiff.formats.tokenizer import GGUF_PRE, Tokenizer
from tinydiff.model import Model

try:  # only the tests that read our files with llama.cpp's own library need it
    import gguf
except ImportError:
    gguf = None
needs_gguf = pytest.mark.skipif(gguf is None, reason="needs llama.cpp's gguf-py (pip install gguf)")

HERE = os.path.dirname(os.path.abspath(__file__))
HF = os.path.join(HERE, "fixtures", "hf")
MODELS = sorted(d for d in os.listdir(HF) if os.path.isdir(os.path.join(HF, d)))
MIXED = os.path.join(HERE, "fixtures", "gguf", "llama-gqa-mixed.gguf")
TOKENIZERS = os.path.join(HERE, "fixtures", "tokenizers")
TYPES = ["f16", "bf16", "q8_0", "q4_0"]


def reference(name):
    with open(os.path.join(HF, name, "reference.json")) as f:
        return json.load(f)


def transformers_logits(name, i):
    return np.load(os.path.join(HF, name, f"logits_{i}.npy"), allow_pickle=False)


def error(fn, *args):
    with pytest.raises(ModelError) as e:
        fn(*args)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def widened(model):
    """The model with every weight dequantized to float32: what the stored bytes stand for."""
    w = model.weights

    def f32(a):
        return None if a is None else quant.dequantize(a)

    layers = [LayerWeights(**{k: f32(v) for k, v in vars(lw).items()}) for lw in w.layers]
    embed = f32(w.embed_tokens)
    lm_head = embed if w.lm_head is w.embed_tokens else f32(w.lm_head)
    return Model(model.config, Weights(embed, layers, f32(w.norm), lm_head), model.tokenizer)


def rounded(model, wtype):
    """The HF model with each matrix rounded through `wtype` as convert stores it (f16 when its
    rows are not whole blocks), vectors untouched: the float32 numbers a GGUF of it holds."""
    def f(a):
        if a is None or a.ndim == 1:
            return a
        t = "f16" if wtype in ("q8_0", "q4_0") and a.shape[-1] % quant.QK else wtype
        return quant.dequantize(quant.quantize(a, t))

    w = model.weights
    layers = [LayerWeights(**{k: f(v) for k, v in vars(lw).items()}) for lw in w.layers]
    embed = f(w.embed_tokens)
    lm_head = embed if w.lm_head is w.embed_tokens else f(w.lm_head)
    return Model(model.config, Weights(embed, layers, w.norm, lm_head), model.tokenizer)


def native(wtype):
    """True once kernels.matmul and kernels.embedding compute with weights stored as wtype."""
    w = quant.quantize(np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32), wtype)
    x, table = np.ones((1, 32), np.float32), quant.dequantize(w)
    try:
        y = kernels.matmul(x, w)
        rows = kernels.embedding(w, np.ones(1, np.int64), np.empty((1, 32), np.float32))
    except Exception:
        return False
    return np.allclose(y, x @ table.T, rtol=1e-2, atol=1e-2) and np.array_equal(rows, table[1:])


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(fixture name, type) -> path of its converted GGUF, made once."""
    folder, made = tmp_path_factory.mktemp("gguf"), {}

    def get(name, wtype):
        if (name, wtype) not in made:
            made[name, wtype] = str(folder / f"{name}-{wtype}.gguf")
            convert(os.path.join(HF, name), made[name, wtype], wtype)
        return made[name, wtype]
    return get


# ---------------------------------------------------------------------------------------------
# Round trips through `convert`


@pytest.mark.parametrize("name", MODELS)
def test_a_round_trip_in_the_stored_type_gives_the_safetensors_logits_exactly(name, converted):
    # both files keep their matrices in the stored type (f32, or bf16 for llama-bf16), so the same
    # kernels run on the same numbers
    stored = "bf16" if name.endswith("bf16") else "f32"
    ours, hf = tinydiff.load(converted(name, stored)), tinydiff.load(os.path.join(HF, name))
    ref = reference(name)
    for ids in ref["input_ids"]:
        if name == "llama3-rope":   # GGUF keeps Llama 3.1's scaling as float32 divisors: an ulp apart
            np.testing.assert_allclose(ours.logits(ids), hf.logits(ids), rtol=0, atol=1e-5)
        else:
            np.testing.assert_array_equal(ours.logits(ids), hf.logits(ids))
    assert ours.generate_ids(ref["prompt_ids"], 20, temperature=0) == hf.generate_ids(ref["prompt_ids"], 20, temperature=0)
    assert ours.tokenizer.encode(ref["prompt_text"]) == ref["prompt_ids"]
    assert ours.tokenizer.tokens == hf.tokenizer.tokens
    assert ours.parameter_count() == hf.parameter_count()
    assert ours.config.tie_word_embeddings == hf.config.tie_word_embeddings
    assert ours.config.eos_token_ids == hf.config.eos_token_ids and ours.config.bos_token_id == hf.config.bos_token_id


def test_matrices_stay_in_their_stored_type_and_views_of_the_file(converted, level):
    """Views of the map, but on the AVX2 path and AVX-512 with VNNI, where the matrices are repacked
    at load for their kernels (kernels.interleaved: a copy in the same bytes); the embedding always
    stays a view."""
    model = tinydiff.load(converted("llama-gqa", "q8_0"))
    lw = model.weights.layers[0]
    if level == "avx2" or (level == "avx512" and "avx512_vnni" in kernels.simd_extensions()):
        assert lw.v_proj.dtype == quant.Q8_0X8 and lw.v_proj.shape == (32 // 8, 64 // quant.QK)
        assert lw.v_proj.flags.owndata
    else:
        assert lw.v_proj.dtype == quant.Q8_0 and lw.v_proj.shape == (32, 64 // quant.QK)
        assert not lw.v_proj.flags.writeable                 # a view of the read-only map, not a copy
    assert model.weights.embed_tokens.dtype == quant.Q8_0 and not model.weights.embed_tokens.flags.writeable
    assert lw.input_layernorm.dtype == np.float32
    assert model.stored_bytes == {"Q8_0": 121856, "F32": 1280}


@pytest.mark.parametrize("wtype", TYPES)
@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-bias", "llama-tied-headdim"])
def test_other_types_store_exactly_what_quant_quantize_makes(name, wtype, converted):
    ours, hf = tinydiff.load(converted(name, wtype)), tinydiff.load(os.path.join(HF, name))
    for mine, theirs in zip(ours.weights.layers, hf.weights.layers):
        for field, a in vars(theirs).items():
            if a is None:
                continue
            b = getattr(mine, field)
            if quant.is_interleaved(b):     # repacked at load for the X8 kernels: the file's blocks inside
                b = quant.deinterleave(b)
            want = a if a.ndim == 1 else quant.quantize(a, wtype)
            assert b.dtype == want.dtype and b.tobytes() == want.tobytes(), field
    ids = reference(name)["input_ids"][0]
    np.testing.assert_array_equal(widened(ours).logits(ids), rounded(hf, wtype).logits(ids))
    assert ours.parameter_count() == hf.parameter_count()


# How far each type's rounding moves these fixtures' logits from transformers' (f32), as a fraction
# of the largest logit. The fixtures' weights are N(0, 0.2), 10x the usual, so that errors show:
# measured 0.15% (f16, 11-bit mantissa), 1-2% (bf16, 8 bits), 4-6.5% (q8_0: 8 bits relative to each
# block's largest weight). Each bound is about twice the worst measured. q4_0 (3 bits) moves them
# by 40-80%: only the exact test above says anything about it on models this small and this random.
TOLERANCE = {"f16": 5e-3, "bf16": 4e-2, "q8_0": 0.13}


@pytest.mark.parametrize("wtype", list(TOLERANCE))
@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-bias", "llama-tied-headdim"])
def test_other_types_stay_close_to_transformers(name, wtype, converted):
    model = widened(tinydiff.load(converted(name, wtype)))
    for i, ids in enumerate(reference(name)["input_ids"]):
        expected = transformers_logits(name, i)
        assert np.abs(model.logits(ids) - expected).max() <= TOLERANCE[wtype] * np.abs(expected).max()


@pytest.mark.parametrize("wtype", TYPES)
def test_stored_types_run_natively_as_their_float32_values(wtype, converted):
    if not native(wtype):
        pytest.skip(f"the kernels do not take {wtype} weights yet")
    model = tinydiff.load(converted("llama-gqa", wtype))
    # As ggml's, the kernels round the activations to the dot product's type (f16, bf16; Q8_0 for
    # both block types), which moves the logits about as much as rounding the weights did.
    bound = TOLERANCE["q8_0" if wtype == "q4_0" else wtype]
    for ids in (reference("llama-gqa")["input_ids"][0], list(range(2, 202))):   # matvec and GEMM sizes
        expected = widened(model).logits(ids)
        assert np.abs(model.logits(ids) - expected).max() <= bound * np.abs(expected).max(), len(ids)


def test_rows_that_are_not_whole_blocks_fall_back_to_f16(tmp_path):
    """hidden 48: every matrix whose rows are 48 weights long is stored f16, as llama.cpp's
    converter does; ffn_down (rows of 64) and the embedding... have rows of 48 too."""
    src = tmp_path / "odd"
    src.mkdir()
    cfg = dict(model_type="llama", hidden_size=48, intermediate_size=64, num_hidden_layers=1,
               num_attention_heads=2, num_key_value_heads=1, vocab_size=320, max_position_embeddings=64,
               rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=0)
    (src / "config.json").write_text(json.dumps(cfg))
    shutil.copy(os.path.join(HF, "llama-gqa", "tokenizer.json"), src / "tokenizer.json")
    rng = np.random.default_rng(0)
    shapes = {"model.embed_tokens.weight": (320, 48), "model.norm.weight": (48,)}
    for name, shape in dict(input_layernorm=(48,), q_proj=(48, 48), k_proj=(24, 48), v_proj=(24, 48),
                            o_proj=(48, 48), post_attention_layernorm=(48,), gate_proj=(64, 48),
                            up_proj=(64, 48), down_proj=(48, 64)).items():
        shapes["model.layers.0." + HF_NAMES[name]] = shape
    save_safetensors(src / "model.safetensors",
                     {k: (rng.standard_normal(s) * 0.2).astype(np.float32) for k, s in shapes.items()})
    status, _, err = run("convert", "-m", str(src), "--type", "q4_0", "-o", str(tmp_path / "odd.gguf"))
    assert status == 0 and "stored as f16" in err
    f = open_gguf(tmp_path / "odd.gguf")
    assert f.type_name("blk.0.ffn_down.weight") == "Q4_0"
    assert f.type_name("blk.0.attn_q.weight") == f.type_name("token_embd.weight") == "F16"
    ours, hf = tinydiff.load(str(tmp_path / "odd.gguf")), tinydiff.load(str(src))
    np.testing.assert_array_equal(widened(ours).logits([5, 6, 7]), rounded(hf, "q4_0").logits([5, 6, 7]))


def test_a_masked_diffusion_model_round_trips(tmp_path):
    src = tmp_path / "mdm"
    shutil.copytree(os.path.join(HF, "llama-gqa"), src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "is_causal": False, "mask_token_id": 2}))
    convert(str(src), str(tmp_path / "mdm.gguf"), "f32")
    f = open_gguf(tmp_path / "mdm.gguf")
    assert f.metadata["llama.attention.causal"] is False and f.metadata["tokenizer.ggml.mask_token_id"] == 2
    ours, hf = tinydiff.load(str(tmp_path / "mdm.gguf")), tinydiff.load(str(src))
    assert not ours.config.causal and ours.config.mask_token_id == 2
    ids = reference("llama-gqa")["input_ids"][0]
    np.testing.assert_array_equal(ours.logits(ids, mask=BIDIRECTIONAL), hf.logits(ids, mask=BIDIRECTIONAL))
    assert ours.denoise_ids(ids, 8, steps=4) == hf.denoise_ids(ids, 8, steps=4)


def test_an_output_that_is_not_a_regular_file_is_refused_and_a_symlink_written_through(tmp_path):
    """The write renames a temporary into place, which would replace a FIFO (or a device) with a
    regular file and a symlink with the file instead of writing its target."""
    src = os.path.join(HF, "mistral")     # the smallest fixture
    fifo, folder = tmp_path / "fifo.gguf", tmp_path / "folder.gguf"
    os.mkfifo(fifo)
    folder.mkdir()
    for out, kind in ((fifo, "a FIFO"), (folder, "a directory")):
        with pytest.raises(UsageError) as e:
            convert(src, str(out), "q4_0")
        assert str(out) in str(e.value) and f"not a regular file ({kind})" in str(e.value)
        assert "\n" not in str(e.value)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.listdir(folder) == []
    assert sorted(os.listdir(tmp_path)) == ["fifo.gguf", "folder.gguf"]     # no temporary left
    link, real = tmp_path / "link.gguf", tmp_path / "real.gguf"
    os.symlink(real, link)
    for _ in range(2):      # the target new, then the target there
        convert(src, str(link), "q4_0")
        assert os.path.islink(link) and os.readlink(link) == str(real)
        assert tinydiff.load(str(real)).config.num_hidden_layers == tinydiff.load(src).config.num_hidden_layers
    assert sorted(os.listdir(tmp_path)) == ["fifo.gguf", "folder.gguf", "link.gguf", "real.gguf"]


def test_llada_and_dream_become_llama_cpps_masked_diffusion_architectures(tmp_path):
    from test_diffusion_models import write_llada
    write_llada(os.path.join(HF, "llama-gqa"), str(tmp_path / "llada"), mask_token_id=2)
    dream = tmp_path / "dream"
    shutil.copytree(os.path.join(HF, "qwen2-bias"), dream)
    cfg = json.loads((dream / "config.json").read_text())
    (dream / "config.json").write_text(json.dumps({**cfg, "model_type": "Dream", "mask_token_id": 2}))
    for name, arch, shifted in (("llada", "llada", False), ("dream", "dream", True)):
        convert(str(tmp_path / name), str(tmp_path / f"{name}.gguf"), "f32")
        f = open_gguf(tmp_path / f"{name}.gguf")
        assert f.metadata["general.architecture"] == arch and f.metadata[f"{arch}.attention.causal"] is False
        assert f.metadata["diffusion.shift_logits"] is shifted and f.metadata["tokenizer.ggml.mask_token_id"] == 2
        ours, hf = tinydiff.load(str(tmp_path / f"{name}.gguf")), tinydiff.load(str(tmp_path / name))
        assert not ours.config.causal and ours.config.shifted_logits is shifted
        ids = reference("llama-gqa")["input_ids"][0]
        np.testing.assert_array_equal(ours.logits(ids, mask=BIDIRECTIONAL), hf.logits(ids, mask=BIDIRECTIONAL))


def test_permutation_is_llama_cpps_and_undone_by_its_inverse():
    w = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)       # 2 heads of 8 rows
    llama_cpp = w.reshape(2, 2, 4, 3).swapaxes(1, 2).reshape(16, 3)  # convert_hf_to_gguf's permute
    np.testing.assert_array_equal(permute_rows(w, 2), llama_cpp)
    np.testing.assert_array_equal(permute_rows(llama_cpp, 2, undo=True), w)
    q = quant.quantize(np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32), "q4_0")
    assert permute_rows(permute_rows(q, 2), 2, undo=True).tobytes() == q.tobytes()


# ---------------------------------------------------------------------------------------------
# A GGUF made here, byte by byte, from the format description alone


GGML = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 8, "BF16": 30, "Q4_K": 12}
VALUE = {"u8": (0, "<B"), "u32": (4, "<I"), "i32": (5, "<i"), "f32": (6, "<f"), "bool": (7, "<?"),
         "str": (8, None), "arr": (9, None), "u64": (10, "<Q")}


def gstr(text):
    b = text.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gvalue(kind, value):
    code, fmt = VALUE[kind]
    if kind == "str":
        return struct.pack("<I", code) + gstr(value)
    if kind == "arr":
        inner, items = value
        body = b"".join(gvalue(inner, v)[4:] for v in items)      # elements carry no type code
        return struct.pack("<IIQ", code, VALUE[inner][0], len(items)) + body
    return struct.pack("<I", code) + struct.pack(fmt, value)


def gguf_bytes(kvs, tensors, version=3, n_tensors=None, n_kv=None, alignment=32):
    """kvs: [(key, kind, value)]; tensors: [(name, ggml type, ne, data bytes)], laid out in order."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                len(kvs) if n_kv is None else n_kv)
    out += b"".join(gstr(k) + gvalue(kind, v) for k, kind, v in kvs)
    data = b""
    for name, code, ne, raw in tensors:
        out += gstr(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, GGML[code] if isinstance(code, str) else code,
                                        len(data))
        data += raw + bytes(-len(raw) % alignment)
    return out + bytes(-len(out) % alignment) + data


def llama_cpp_permute(weights, n_head, n_head_kv):
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def hf_as_gguf(name):
    """(kvs, tensors) for an f32 HF fixture, as llama.cpp's converter lays it out."""
    cfg = json.loads(open(os.path.join(HF, name, "config.json")).read())
    tok = json.loads(open(os.path.join(HF, name, "tokenizer.json"), encoding="utf-8").read())
    d, n_head, n_kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or d // n_head
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(cfg["vocab_size"])]
    special = {e["id"] for e in tok["added_tokens"] if e["special"]}
    kvs = [("general.architecture", "str", "llama"), ("general.name", "str", name),
           ("llama.context_length", "u32", cfg["max_position_embeddings"]), ("llama.embedding_length", "u32", d),
           ("llama.block_count", "u32", cfg["num_hidden_layers"]),
           ("llama.feed_forward_length", "u32", cfg["intermediate_size"]),
           ("llama.rope.dimension_count", "u32", head_dim), ("llama.attention.head_count", "u32", n_head),
           ("llama.attention.head_count_kv", "u32", n_kv),
           ("llama.rope.freq_base", "f32", cfg["rope_parameters"]["rope_theta"]),
           ("llama.attention.layer_norm_rms_epsilon", "f32", cfg["rms_norm_eps"]),
           ("llama.attention.key_length", "u32", head_dim), ("llama.attention.value_length", "u32", head_dim),
           ("tokenizer.ggml.model", "str", "gpt2"), ("tokenizer.ggml.pre", "str", "gpt-2"),
           ("tokenizer.ggml.tokens", "arr", ("str", tokens)),
           ("tokenizer.ggml.token_type", "arr", ("i32", [3 if i in special else 1 for i in range(len(tokens))])),
           ("tokenizer.ggml.merges", "arr", ("str", [" ".join(m) for m in tok["model"]["merges"]])),
           ("tokenizer.ggml.bos_token_id", "u32", cfg["bos_token_id"]),
           ("tokenizer.ggml.eos_token_id", "u32", cfg["eos_token_id"])]
    ckpt = load_checkpoint(os.path.join(HF, name))
    short = {"input_layernorm": "attn_norm", "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
             "o_proj": "attn_output", "post_attention_layernorm": "ffn_norm", "gate_proj": "ffn_gate",
             "up_proj": "ffn_up", "down_proj": "ffn_down"}
    tensors = [("token_embd.weight", "model.embed_tokens.weight")]
    for i in range(cfg["num_hidden_layers"]):
        tensors += [(f"blk.{i}.{s}.weight", f"model.layers.{i}.{HF_NAMES[field]}") for field, s in short.items()]
    tensors += [("output_norm.weight", "model.norm.weight")]
    if not cfg["tie_word_embeddings"]:
        tensors += [("output.weight", "lm_head.weight")]
    out = []
    for gname, hname in tensors:
        w = ckpt.f32(hname)
        if gname.endswith("attn_q.weight"):
            w = llama_cpp_permute(w, n_head, n_head)
        if gname.endswith("attn_k.weight"):
            w = llama_cpp_permute(w, n_head, n_kv)
        out.append((gname, "F32", list(reversed(w.shape)), np.ascontiguousarray(w, "<f4").tobytes()))
    return kvs, out


@pytest.fixture(scope="module")
def handmade(tmp_path_factory):
    """The handmade GGUF of llama-tied-headdim (explicit head_dim, tied LM head)."""
    path = tmp_path_factory.mktemp("handmade") / "model.gguf"
    path.write_bytes(gguf_bytes(*hf_as_gguf("llama-tied-headdim")))
    return str(path)


def test_a_handmade_gguf_gives_transformers_logits(handmade):
    model, hf = tinydiff.load(handmade), tinydiff.load(os.path.join(HF, "llama-tied-headdim"))
    assert model.config.head_dim == 32 and model.config.tie_word_embeddings
    for i, ids in enumerate(reference("llama-tied-headdim")["input_ids"]):
        expected = transformers_logits("llama-tied-headdim", i)
        got = model.logits(ids)
        assert np.abs(got - expected).max() <= 1e-3 * np.abs(expected).max()
        np.testing.assert_array_equal(got, hf.logits(ids))


def test_version_2_reads_as_version_3(tmp_path):
    kvs, tensors = hf_as_gguf("mistral")
    path = tmp_path / "v2.gguf"
    path.write_bytes(gguf_bytes(kvs, tensors, version=2))
    ids = reference("mistral")["input_ids"][0]
    np.testing.assert_array_equal(tinydiff.load(str(path)).logits(ids),
                                  tinydiff.load(os.path.join(HF, "mistral")).logits(ids))


def test_a_custom_alignment(tmp_path):
    kvs, tensors = hf_as_gguf("mistral")
    path = tmp_path / "a64.gguf"
    path.write_bytes(gguf_bytes(kvs + [("general.alignment", "u32", 64)], tensors, alignment=64))
    assert open_gguf(path).alignment == 64
    tinydiff.load(str(path))


# ---------------------------------------------------------------------------------------------
# The file llama.cpp's gguf-py wrote (tests/fixtures/make_gguf.py)


def test_llama_cpps_file_holds_what_quant_quantize_makes():
    f, hf = open_gguf(MIXED), load_checkpoint(os.path.join(HF, "llama-gqa"))
    types = {"token_embd": "Q8_0", "attn_q": "Q4_0", "attn_k": "Q8_0", "attn_v": "BF16", "attn_output": "F16",
             "ffn_gate": "Q4_0", "ffn_up": "Q8_0", "ffn_down": "F32", "output": "F16"}
    for i in range(2):
        for field in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
            gname = f"blk.{i}." + GGUF_NAMES[field]
            w = hf.f32(f"model.layers.{i}." + HF_NAMES[field])
            w = permute_rows(w, {"q_proj": 4, "k_proj": 2}[field]) if field in ("q_proj", "k_proj") else w
            t = types[gname.split(".")[2]]
            assert f.type_name(gname) == t
            assert f.raw(gname).tobytes() == quant.quantize(w, t.lower()).tobytes(), gname


def test_llama_cpps_file_loads_as_the_model_it_was_made_from():
    model, hf = tinydiff.load(MIXED), tinydiff.load(os.path.join(HF, "llama-gqa"))
    assert model.config.dtype == "q8_0" and model.config.num_key_value_heads == 2
    assert model.stored_bytes.keys() == {"F32", "F16", "BF16", "Q8_0", "Q4_0"}
    ref = reference("llama-gqa")
    assert model.tokenizer.encode(ref["prompt_text"]) == ref["prompt_ids"]
    assert model.tokenizer.tokens == hf.tokenizer.tokens
    # the same float32 numbers as the HF weights rounded through each tensor's type
    w = hf.weights
    types = dict(q_proj="q4_0", k_proj="q8_0", v_proj="bf16", o_proj="f16", gate_proj="q4_0", up_proj="q8_0")
    layers = [LayerWeights(**{k: quant.dequantize(quant.quantize(v, types[k])) if k in types else v
                              for k, v in vars(lw).items()}) for lw in w.layers]
    rounded_hf = Model(hf.config, Weights(quant.dequantize(quant.quantize(w.embed_tokens, "q8_0")), layers, w.norm,
                                          w.lm_head.astype(np.float16).astype(np.float32)), hf.tokenizer)
    for ids in ref["input_ids"]:
        np.testing.assert_array_equal(widened(model).logits(ids), rounded_hf.logits(ids))


@needs_gguf
@pytest.mark.parametrize("wtype", ["f32"] + TYPES)
def test_gguf_py_reads_our_files(wtype, converted):
    path = converted("qwen2-bias", wtype)
    ours, theirs = open_gguf(path), gguf.GGUFReader(path)
    assert [t.name for t in theirs.tensors] == ours.names
    for t in theirs.tensors:
        assert t.tensor_type.name == ours.type_name(t.name)
        assert list(t.shape) == list(reversed(ours.shape(t.name)))
        assert t.data.tobytes() == ours.raw(t.name).tobytes()
    fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert fields.keys() == ours.metadata.keys()
    for key, value in ours.metadata.items():
        assert fields[key] == pytest.approx(value) if isinstance(value, float) else fields[key] == value, key
    assert fields["general.architecture"] == "qwen2" and fields["qwen2.attention.head_count_kv"] == 2
    assert fields["general.file_type"] == {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2}[wtype]


@needs_gguf
def test_our_writer_writes_gguf_pys_bytes(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 64)).astype(np.float32), "b": np.float16([1, 2, 3]),
               "c": quant.quantize(rng.standard_normal((2, 64)).astype(np.float32), "q8_0")}
    w = gguf.GGUFWriter(str(tmp_path / "theirs.gguf"), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 1e4)
    w.add_bool("llama.attention.causal", False)
    w.add_array("tokenizer.ggml.tokens", ["a", "bé", "c"])
    w.add_array("tokenizer.ggml.token_type", [1, 3, 1])
    w.add_tensor("a", tensors["a"])
    w.add_tensor("b", tensors["b"])
    w.add_tensor("c", tensors["c"].view(np.uint8).reshape(2, -1), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    write_gguf(tmp_path / "ours.gguf", {
        "general.architecture": ("string", "llama"), "llama.block_count": ("uint32", 2),
        "llama.rope.freq_base": ("float32", 1e4), "llama.attention.causal": ("bool", False),
        "tokenizer.ggml.tokens": ("array[string]", ["a", "bé", "c"]),
        "tokenizer.ggml.token_type": ("array[int32]", [1, 3, 1])}, tensors)
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "theirs.gguf").read_bytes()


def test_metadata_of_every_value_type_round_trips(tmp_path):
    meta = {"u8": ("uint8", 255), "i8": ("int8", -128), "u16": ("uint16", 65535), "i16": ("int16", -32768),
            "u32": ("uint32", 2**32 - 1), "i32": ("int32", -2**31), "f32": ("float32", 0.5), "t": ("bool", True),
            "s": ("string", "héllo"), "u64": ("uint64", 2**64 - 1), "i64": ("int64", -2**63),
            "f64": ("float64", 0.1), "as": ("array[string]", ["x", ""]), "af": ("array[float32]", [1.5, -2.0]),
            "ab": ("array[bool]", [True, False]), "aa": ("array[array[int32]]", [[1, 2], [3]]),
            "e": ("array[uint8]", [])}
    write_gguf(tmp_path / "m.gguf", meta, {})
    f = open_gguf(tmp_path / "m.gguf")
    assert f.metadata == {k: v for k, (_, v) in meta.items()}
    assert f.value_types == {k: t for k, (t, _) in meta.items()}


def test_the_writer_leaves_no_half_written_file(tmp_path):
    def boom():
        raise RuntimeError("disk on fire")
    from tinydiff.formats.gguf import Planned
    with pytest.raises(RuntimeError):
        write_gguf(tmp_path / "m.gguf", {}, {"x": Planned("f32", (4,), boom)})
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# The tokenizer from tokenizer.ggml.*


CASES = json.loads(open(os.path.join(TOKENIZERS, "cases.json"), encoding="utf-8").read())


@pytest.mark.parametrize("name, pre", [("gpt2", "gpt-2"), ("llama3", "llama-bpe"), ("qwen2", "qwen2")])
def test_a_gguf_tokenizer_is_the_tokenizer_json_one(name, pre):
    hf = Tokenizer.from_file(os.path.join(TOKENIZERS, f"{name}.json"))
    assert hf.pre_name == pre
    meta = {k: v for k, (_, v) in hf.gguf_metadata(hf.vocab_size + 3, "t").items()}
    meta["tokenizer.ggml.add_bos_token"] = bool(hf.prefix_ids)
    if hf.prefix_ids:
        meta["tokenizer.ggml.bos_token_id"] = hf.prefix_ids[0]
    tok = Tokenizer.from_gguf(meta, "t")
    assert tok.tokens == hf.tokens and tok.special_ids == hf.special_ids
    for case in CASES[name]:
        assert tok.encode(case["text"]) == case["ids"]
        assert tok.encode(case["text"], add_special_tokens=False) == case["ids_plain"]
        assert tok.decode(case["ids"]) == case["decoded"]


@pytest.mark.parametrize("bos", [-5, 1000])
def test_a_bos_the_template_adds_must_be_a_token(bos):
    """Before: a negative id was put before every prompt, a UsageError blaming the caller later."""
    hf = Tokenizer.from_file(os.path.join(TOKENIZERS, "gpt2.json"))
    meta = {k: v for k, (_, v) in hf.gguf_metadata(hf.vocab_size, "t").items()}
    meta.update({"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.bos_token_id": bos})
    assert f"tokenizer.ggml.bos_token_id {bos} is outside the 1000 tokens" in error(Tokenizer.from_gguf, meta, "m.gguf")


def test_smollm_digits_are_split_one_by_one(tmp_path):
    spec = json.loads(open(os.path.join(TOKENIZERS, "gpt2.json"), encoding="utf-8").read())
    spec["pre_tokenizer"] = GGUF_PRE["smollm"][1]
    hf = Tokenizer(spec)
    assert hf.pre_name == "smollm" and hf._pre_tokenize("ab 1234x") == ["ab", "Ġ", "1", "2", "3", "4", "x"]
    tok = Tokenizer.from_gguf({k: v for k, (_, v) in hf.gguf_metadata(hf.vocab_size, "t").items()}, "t")
    for case in CASES["gpt2"]:
        assert tok.encode(case["text"]) == hf.encode(case["text"])


def test_a_pre_tokenizer_gguf_has_no_name_for_is_refused():
    hf = Tokenizer.from_file(os.path.join(TOKENIZERS, "legacy.json"))
    assert hf.pre_name is None
    assert "tokenizer.ggml.pre name" in error(hf.gguf_metadata, hf.vocab_size, "legacy.json")


def test_unknown_pre_tokenizer_and_tokenizer_model_are_refused():
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "deepseek-llm", "tokenizer.ggml.tokens": ["a"]}
    assert "'deepseek-llm' not supported" in error(Tokenizer.from_gguf, meta, "m.gguf")
    assert "'bert' not supported" in error(Tokenizer.from_gguf, {**meta, "tokenizer.ggml.model": "bert"}, "m.gguf")


# ---------------------------------------------------------------------------------------------
# Bad files: one ModelError line each


@pytest.fixture(scope="module")
def base():
    """The mistral fixture (the smallest) as handmade (kvs, tensors)."""
    return hf_as_gguf("mistral")


def write(tmp_path, data, name="m.gguf"):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def load_error(path):
    return error(tinydiff.load, path)


def test_the_base_file_is_fine(tmp_path, base):
    tinydiff.load(write(tmp_path, gguf_bytes(*base)))


def test_unknown_tensor_type(tmp_path, base):
    kvs, tensors = base
    tensors = [(n, 99 if n == "blk.0.ffn_up.weight" else t, ne, raw) for n, t, ne, raw in tensors]
    msg = load_error(write(tmp_path, gguf_bytes(kvs, tensors)))
    assert "blk.0.ffn_up.weight" in msg and "unknown tensor type 99" in msg


def test_a_type_tinydiff_does_not_compute_with(tmp_path, base):
    kvs, tensors = base
    ne = [256, 1]
    tensors = [(n, "Q4_K", ne, bytes(144)) if n == "blk.0.ffn_up.weight" else (n, t, e, r) for n, t, e, r in tensors]
    msg = load_error(write(tmp_path, gguf_bytes(kvs, tensors)))
    assert "blk.0.ffn_up.weight" in msg and ("Q4_K not supported" in msg or "shape" in msg)


def test_unsupported_architecture(tmp_path, base):
    kvs, tensors = base
    kvs = [("general.architecture", "str", "falcon")] + kvs[1:]
    assert "architecture falcon not supported" in load_error(write(tmp_path, gguf_bytes(kvs, tensors)))


def test_truncated_tensor_data(tmp_path, base):
    data = gguf_bytes(*base)
    msg = load_error(write(tmp_path, data[:-1000]))
    assert "output.weight" in msg and "truncated" in msg


def test_a_file_cut_inside_the_header(tmp_path, base):
    assert "truncated" in load_error(write(tmp_path, gguf_bytes(*base)[:3000]))


@pytest.mark.parametrize("lie", [1, -1, 10**6, 2**63])
def test_a_tensor_count_that_lies(tmp_path, base, lie):
    kvs, tensors = base
    load_error(write(tmp_path, gguf_bytes(kvs, tensors, n_tensors=max(0, len(tensors) + lie) % 2**64)))


def test_a_metadata_count_that_lies(tmp_path, base):
    kvs, tensors = base
    load_error(write(tmp_path, gguf_bytes(kvs, tensors, n_kv=len(kvs) + 1)))
    load_error(write(tmp_path, gguf_bytes(kvs, tensors, n_kv=len(kvs) - 1)))


def test_string_length_beyond_the_file(tmp_path, base):
    kvs, tensors = base
    data = gguf_bytes(kvs, tensors)
    key = gstr("general.name")
    at = data.index(key) + len(key) + 4                  # the value's length field
    data = data[:at] + struct.pack("<Q", 2**40) + data[at + 8:]
    msg = load_error(write(tmp_path, data))
    assert "general.name" in msg and "string length 1099511627776" in msg and "past the end" in msg


def test_an_array_longer_than_the_file(tmp_path, base):
    kvs, tensors = base
    data = gguf_bytes(kvs, tensors)
    key = gstr("tokenizer.ggml.token_type")
    at = data.index(key) + len(key) + 8                  # after value type and element type
    data = data[:at] + struct.pack("<Q", 2**62) + data[at + 8:]
    assert "cannot fit" in load_error(write(tmp_path, data))


def test_dims_that_do_not_match_the_metadata(tmp_path, base):
    kvs, tensors = base
    kvs = [(k, kind, 48 if k == "llama.embedding_length" else v) for k, kind, v in kvs]
    msg = load_error(write(tmp_path, gguf_bytes(kvs, tensors)))
    assert "token_embd.weight has shape (320, 32), expected (320, 48)" in msg


def test_a_tensor_with_too_few_bytes_for_its_dims(tmp_path, base):
    kvs, tensors = base
    tensors = [(n, t, [ne[0] * 2] + ne[1:] if n == "output.weight" else ne, raw) for n, t, ne, raw in tensors]
    msg = load_error(write(tmp_path, gguf_bytes(kvs, tensors)))
    assert "output.weight" in msg


def test_rows_that_are_not_whole_blocks(tmp_path, base):
    kvs, tensors = base
    tensors = [(n, "Q8_0", [40, 1], bytes(34)) if n == "blk.0.ffn_up.weight" else (n, t, e, r)
               for n, t, e, r in tensors]
    assert "not whole Q8_0 blocks" in load_error(write(tmp_path, gguf_bytes(kvs, tensors)))


@pytest.mark.parametrize("edit, words", [
    (lambda d: b"GGUG" + d[4:], ["not a GGUF file"]),
    (lambda d: d[:4] + struct.pack("<I", 1) + d[8:], ["version 1 not supported"]),
    (lambda d: d[:4] + struct.pack(">I", 3) + d[8:], ["big-endian"]),
    (lambda d: d[:20], ["too short"]),
])
def test_not_a_readable_gguf(tmp_path, base, edit, words):
    msg = load_error(write(tmp_path, edit(gguf_bytes(*base))))
    assert all(w in msg for w in words), msg


def test_bad_alignment(tmp_path, base):
    kvs, tensors = base
    assert "power of two" in load_error(write(tmp_path, gguf_bytes(kvs + [("general.alignment", "u32", 48)], tensors)))
    assert "power of two" in load_error(write(tmp_path, gguf_bytes(kvs + [("general.alignment", "u64", 32)], tensors)))


def test_overlapping_and_misaligned_tensors(tmp_path, base):
    kvs, tensors = base
    data = gguf_bytes(kvs, tensors)
    name = gstr("blk.0.attn_norm.weight")
    at = data.index(name) + len(name) + 4 + 8 + 4      # n_dims, ne[0], type -> the offset
    offset = struct.unpack_from("<Q", data, at)[0]
    assert "not a multiple of the alignment" in load_error(
        write(tmp_path, data[:at] + struct.pack("<Q", offset + 4) + data[at + 8:]))
    assert "ends at" in load_error(write(tmp_path, data[:at] + struct.pack("<Q", 0) + data[at + 8:]))


def type_field(data, name):
    """The byte offset of a tensor info's ggml type in a file's header."""
    n_dims_at = data.index(gstr(name)) + len(gstr(name))
    return n_dims_at + 4 + 8 * struct.unpack_from("<I", data, n_dims_at)[0]


@pytest.mark.parametrize("name, code", [("blk.0.attn_q.weight", "Q4_0"), ("blk.1.ffn_gate.weight", "Q8_0"),
                                        ("output_norm.weight", "BF16"), ("output.weight", "F16")])
def test_a_tensor_whose_type_was_changed_to_a_smaller_one_is_refused_by_name(tmp_path, base, name, code):
    """The audit's case (issue 40): the type field rewritten, so the tensor covers fewer bytes than
    it did; ggml requires each offset to be the running padded size, which the gap breaks."""
    data = gguf_bytes(*base)
    at = type_field(data, name)
    msg = load_error(write(tmp_path, data[:at] + struct.pack("<I", GGML[code]) + data[at + 4:]))
    assert f"before it, {name}, ends at" in msg or f"the last tensor, {name}," in msg, msg


def test_an_alignment_the_data_was_not_laid_out_with_is_refused(tmp_path, base):
    """general.alignment 16 in a file laid out with 32: the data section starts 16 bytes early
    (where the header's end allows) and every tensor is shifted; a file where the two agree on
    everything is the same file, and loads as it."""
    kvs, tensors = base
    refused = 0
    for extra in range(32):     # header lengths of every residue mod 32
        data = gguf_bytes(kvs + [("general.alignment", "u32", 32), ("x.pad", "str", "a" * extra)], tensors)
        at = data.index(gstr("general.alignment")) + len(gstr("general.alignment")) + 4
        path = write(tmp_path, data[:at] + struct.pack("<I", 16) + data[at + 4:])
        try:
            mutant = tinydiff.load(path)
        except ModelError as e:
            assert "\n" not in str(e) and "general.alignment" in str(e)
            refused += 1
            continue
        same = tinydiff.load(write(tmp_path, data, "same.gguf"))
        assert np.array_equal(mutant.logits([1, 2, 3]), same.logits([1, 2, 3]))
    assert refused >= 8


def test_bytes_after_the_last_tensor_are_refused_but_a_missing_last_padding_is_not(tmp_path, base):
    data = gguf_bytes(*base)
    for garbage in (bytes(32), b"x", bytes(4096)):
        msg = load_error(write(tmp_path, data + garbage))
        assert "after the last tensor, output.weight," in msg
    last = base[1][-1][3]
    pad = -len(last) % 32
    tinydiff.load(write(tmp_path, data[:len(data) - pad] if pad else data))


def test_duplicate_keys_and_tensors(tmp_path, base):
    kvs, tensors = base
    assert "appears twice" in load_error(write(tmp_path, gguf_bytes(kvs + kvs[:1], tensors)))
    assert "appears twice" in load_error(write(tmp_path, gguf_bytes(kvs, tensors + tensors[:1])))


def test_bad_bool_and_unknown_value_type(tmp_path, base):
    kvs, tensors = base
    data = gguf_bytes(kvs + [("llama.attention.causal", "u8", 7)], tensors)
    key = gstr("llama.attention.causal")
    at = data.index(key) + len(key)
    assert "neither 0 nor 1" in load_error(write(tmp_path, data[:at] + struct.pack("<I", 7) + data[at + 4:]))
    assert "unknown value type 13" in load_error(write(tmp_path, data[:at] + struct.pack("<I", 13) + data[at + 4:]))


@pytest.mark.parametrize("kv, words", [
    (("llama.rope.scaling.type", "str", "yarn"), ["rope.scaling.type yarn is not supported"]),
    (("llama.rope.dimension_count", "u32", 4), ["partial RoPE"]),
    (("llama.attention.sliding_window", "u32", 64), ["sliding_window"]),
    (("llama.expert_count", "u32", 8), ["expert_count"]),
    (("llama.block_count", "str", "two"), ["block_count should be int"]),
    (("llama.rope.freq_base", "f32", -1.0), ["freq_base"]),
    (("llama.attention.layer_norm_rms_epsilon", "f32", 2147483647.0), ["layer_norm_rms_epsilon should be in"]),
    (("llama.context_length", "u64", 2**63 - 1), [f"llama.context_length is {2**63 - 1}, more than"]),
    (("llama.attention.head_count_kv", "u32", 3), ["not a multiple"]),
    (("tokenizer.ggml.eos_token_id", "u32", 320), ["outside the vocabulary"]),
    (("llama.vocab_size", "u32", 999), ["vocab_size 999"]),
    (("tokenizer.ggml.pre", "str", "falcon"), ["'falcon' not supported"]),
])
def test_metadata_tinydiff_cannot_honour(tmp_path, base, kv, words):
    kvs, tensors = base
    kvs = [x for x in kvs if x[0] != kv[0]] + [kv]
    msg = load_error(write(tmp_path, gguf_bytes(kvs, tensors)))
    assert all(w in msg for w in words), msg


def test_a_tensor_the_model_does_not_use(tmp_path, base):
    kvs, tensors = base
    msg = load_error(write(tmp_path, gguf_bytes(kvs, tensors + [("blk.9.attn_norm.weight", "F32", [4], bytes(16))])))
    assert "blk.9.attn_norm.weight is not part of a llama model" in msg


@pytest.mark.parametrize("values, words", [([1.0, 0.0, 1.0, 1.0], "should hold 4 positive numbers"),
                                           ([1.0, 2.0, 3.0], "got shape (3,)")])
def test_rope_freqs_must_be_one_positive_divisor_per_frequency(tmp_path, base, values, words):
    kvs, tensors = base
    raw = np.array(values, np.float32).tobytes()
    assert words in load_error(write(tmp_path, gguf_bytes(kvs, tensors + [("rope_freqs.weight", "F32", [len(values)], raw)])))


def test_rope_freqs_divide_the_frequencies_as_llama_cpp_applies_them(tmp_path, base):
    kvs, tensors = base
    plain = tinydiff.load(write(tmp_path, gguf_bytes(kvs, tensors), "plain.gguf"))
    raw = np.array([1.0, 1.5, 4.0, 8.0], np.float32).tobytes()   # the mistral fixture: head size 8
    scaled = tinydiff.load(write(tmp_path, gguf_bytes(kvs, tensors + [("rope_freqs.weight", "F32", [4], raw)])))
    assert scaled.config.rope_scaling == ("freq_factors", 1.0, 1.5, 4.0, 8.0)
    np.testing.assert_array_equal(rope_inv_freq(scaled.config), rope_inv_freq(plain.config) / np.float32([1, 1.5, 4, 8]))
    assert not np.array_equal(scaled.logits([5, 6, 7, 8]), plain.logits([5, 6, 7, 8]))


def test_a_missing_required_key(tmp_path, base):
    kvs, tensors = base
    kvs = [x for x in kvs if x[0] != "llama.feed_forward_length"]
    assert "llama.feed_forward_length missing" in load_error(write(tmp_path, gguf_bytes(kvs, tensors)))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A valid file and where its header ends (the data section starts)."""
    data = gguf_bytes(*hf_as_gguf("mistral"))
    path = tmp_path_factory.mktemp("fuzz") / "m.gguf"
    path.write_bytes(data)
    return data, open_gguf(path).data_start


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_flipped_header_bytes_load_or_raise_model_error(small, tmp_path, data):
    raw, header_end = small
    raw = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, header_end - 1))] = data.draw(st.integers(0, 255))
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(bytes(raw))
    try:
        tinydiff.load(str(path))
    except ModelError as e:
        assert "\n" not in str(e)


# ---------------------------------------------------------------------------------------------
# The command line


def run(*argv):
    """`python -m tinydiff` in tests/, so it imports the installed package: (status, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", "tinydiff", *argv], capture_output=True, timeout=120, cwd=HERE)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def one_line(status, _, err, expected_status, *words):
    assert status == expected_status, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert all(w in err for w in words), err


def test_convert_then_generate_and_info_from_the_gguf(tmp_path):
    out = str(tmp_path / "m.gguf")
    status, stdout, _ = run("convert", "-m", os.path.join(HF, "llama-gqa"), "--type", "q8_0", "-o", out)
    assert status == 0 and out in stdout
    status, stdout, _ = run("info", "-m", out)
    assert status == 0 and "weights Q8_0: 121,856 bytes" in stdout and "weights F32: 1,280 bytes" in stdout
    assert f"parameters:   {tinydiff.load(os.path.join(HF, 'llama-gqa')).parameter_count():,}" in stdout
    f32 = str(tmp_path / "f32.gguf")
    assert run("convert", "-m", os.path.join(HF, "llama-gqa"), "--type", "f32", "-o", f32)[0] == 0
    expected = run("generate", "-m", os.path.join(HF, "llama-gqa"), "-p", "Once upon", "-n", "8", "--temp", "0")
    assert run("generate", "-m", f32, "-p", "Once upon", "-n", "8", "--temp", "0") == expected


def test_convert_usage_errors(tmp_path):
    one_line(*run("convert", "-m", os.path.join(HF, "llama-gqa"), "--type", "q2_k", "-o", "x.gguf"), 2, "q2_k", "q4_k_m")
    one_line(*run("convert", "-m", os.path.join(HF, "llama-gqa"), "--type", "f16",
                  "-o", str(tmp_path / "no" / "such" / "m.gguf")), 2, "cannot write")
    one_line(*run("convert", "--type", "f16", "-o", "x.gguf"), 2, "-m")


def test_convert_model_errors(tmp_path):
    one_line(*run("convert", "-m", str(tmp_path / "nope"), "-o", str(tmp_path / "m.gguf")), 1, "nope")
    src = tmp_path / "gemma"
    shutil.copytree(os.path.join(HF, "qwen2-bias"), src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "model_type": "gemma"}))
    one_line(*run("convert", "-m", str(src), "-o", str(tmp_path / "m.gguf")), 1, "model_type 'gemma'")
    assert not os.path.exists(tmp_path / "m.gguf")


def test_bad_gguf_on_the_command_line(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(100))
    one_line(*run("info", "-m", str(path)), 1, "m.gguf", "version 0")


def test_check_tensors_counts_a_gguf_block_whose_scale_is_nan_which_load_refuses(tmp_path, capsys):
    from tinydiff.model import check_tensors
    path = tmp_path / "m.gguf"
    convert(os.path.join(HF, "mistral"), path, "q8_0")
    f = open_gguf(path)
    name = "blk.1.ffn_down.weight"
    at = f.data_start + f.entry(name).offset + 34 * 3          # the scale d of its 4th block
    n_blocks, per_row = f.raw(name).size, f.raw(name).shape[1]
    data = bytearray(path.read_bytes())
    data[at:at + 2] = struct.pack("<H", 0x7E00)                 # f16 NaN
    path.write_bytes(bytes(data))
    assert check_tensors(path) == [(name, "Q8_0", n_blocks, 1)]
    assert f"block {list(divmod(3, per_row))}" in load_error(str(path))
    from tinydiff.cli import main
    assert main(["info", "--check-tensors", "-m", str(path)]) == 1
    assert f"tensor {name} (Q8_0): 1 of its {n_blocks:,} blocks NaN or inf" in capsys.readouterr().out
