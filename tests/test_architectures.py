"""Gemma 3, Gemma 2 and Qwen 3 against implementations that are not ours.

  - tests/fixtures/arch/<name>: tiny random models saved by transformers, its logits and greedy
    continuations, and for gemma3 and qwen3 the GGUF llama.cpp's convert_hf_to_gguf.py writes of
    the same folder (tests/fixtures/make_arch_reference.py). Both layouts give transformers' numbers.
  - The real files (tests/real_models.py: Gemma 3 270M Q4_K_M and SmolLM2 135M Q4_1), where they
    are installed: against what transformers computed from the same files
    (tests/fixtures/real/*.json, made by tests/fixtures/make_real_reference.py with transformers'
    GGUF loader, which dequantizes them; stored, so these tests need no torch). Their tensors are
    dequantized by llama.cpp's gguf-py here (the same values transformers used) where it is
    installed, so the architecture is checked in float32 whatever block formats tinydiff reads;
    the files as stored are checked where tinydiff reads all their block formats.
"""
import dataclasses
import json
import os

import numpy as np
import pytest

import tinydiff
from tinydiff.engine.config import load_config
from tinydiff.engine.gguf_model import config_from_gguf, gguf_weights
from tinydiff.engine.transformer import Seqs, rope_inv_freq
from tinydiff.errors import ModelError
from tinydiff.formats.files import TensorTable
from tinydiff.formats.gguf import open_gguf, write_gguf
from tinydiff.model import Model

from real_models import GEMMA3, SMOLLM2, real_model

HERE = os.path.dirname(__file__)
ARCH = os.path.join(HERE, "fixtures", "arch")
REAL = os.path.join(HERE, "fixtures", "real")
MODELS = ["gemma3", "gemma2", "qwen3"]
LAYOUTS = [(name, "hf") for name in MODELS] + [("gemma3", "gguf"), ("qwen3", "gguf")]


def reference(name):
    with open(os.path.join(ARCH, name, "reference.json")) as f:
        return json.load(f)


def path(name, layout):
    return os.path.join(ARCH, name, "model-f32.gguf" if layout == "gguf" else "")


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda p: "-".join(p))
def fixture(request):
    name, layout = request.param
    return tinydiff.load(path(name, layout)), reference(name), name


def expected_logits(name, i):
    return np.load(os.path.join(ARCH, name, reference(name)["logits_files"][i]), allow_pickle=False)


def test_the_fixtures_exercise_what_they_are_for():
    g3, g2, q3 = (load_config(os.path.join(ARCH, n)) for n in MODELS)
    assert g3.layer_windows == (4, 4, 4, 4, 4, 0) and g3.local_rope_theta == 20000.0 and g3.rope_theta == 1e6
    assert g3.qk_norm and g3.sandwich_norms and g3.norm_offset == 1 and g3.hidden_act == "gelu_tanh"
    assert g3.embedding_scale == 4.0 and g3.attention_scale == 8 ** -0.5 and g3.tie_word_embeddings
    assert g2.layer_windows == (3, 0, 3, 0) and g2.local_rope_theta is None and not g2.qk_norm
    assert g2.final_logit_softcapping == 2.0 and g2.attention_scale == 12 ** -0.5 and g2.head_dim == 8
    assert q3.qk_norm and q3.head_dim == 16 != q3.hidden_size // q3.num_attention_heads
    assert not (q3.sandwich_norms or q3.layer_windows or q3.tie_word_embeddings) and q3.norm_offset == 0
    for name in MODELS:                  # sequences longer than the windows: they cut some keys
        assert max(map(len, reference(name)["input_ids"])) > 4


def test_logits_match_transformers(fixture):
    model, ref, name = fixture
    for i, ids in enumerate(ref["input_ids"]):
        expected = expected_logits(name, i)
        got = model.logits(ids)
        assert got.shape == expected.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=0, atol=2e-5 * np.abs(expected).max())


def test_the_numpy_layers_match_transformers_too(fixture):
    """The readable loop (Transformer.layers), not only csrc/layer.c, gives transformers' logits."""
    model, ref, name = fixture
    ids = np.array([ref["input_ids"][2]])
    t = model.transformer
    got = t.forward_seqs(Seqs(ids, 0, None, None), t.state(ids.shape[1]), body=t.layers)
    np.testing.assert_allclose(got, expected_logits(name, 2), rtol=0, atol=2e-5 * np.abs(got).max())


def test_greedy_generation_matches_transformers_generate(fixture):
    """20 new tokens past a 16-token prompt: the KV cache's windowed layers keep cutting keys."""
    model, ref, name = fixture
    for case in ref["greedy"]:
        assert model.generate_ids(case["prompt_ids"], case["max_new_tokens"], temperature=0) == case["output_ids"]


def test_rope_frequencies_of_each_layer_are_transformers_own(fixture):
    model, ref, name = fixture
    cfg = model.config
    for l in range(cfg.num_hidden_layers):
        kind = "sliding_attention" if cfg.window(l) and "sliding_attention" in ref["inv_freq"] else "full_attention"
        np.testing.assert_array_max_ulp(rope_inv_freq(cfg, l), np.array(ref["inv_freq"][kind], np.float32), maxulp=2)


# each variant, undone, moves the logits far from transformers': the fixtures test it (Gemma 3's
# query_pre_attn_scalar is its head_dim, as llama.cpp assumes: another scale stands for it)
VARIANTS = {
    "gemma3": [dict(layer_windows=(1000,) * 5 + (0,)), dict(local_rope_theta=None), dict(embedding_scale=1.0),
               dict(attention_scale=0.5), dict(qk_norm=False)],
    "gemma2": [dict(final_logit_softcapping=None), dict(attention_scale=None), dict(layer_windows=())],
    "qwen3": [dict(qk_norm=False)],
}


@pytest.mark.parametrize("name, change", [(n, c) for n, cs in VARIANTS.items() for c in cs],
                         ids=lambda v: v if isinstance(v, str) else ",".join(v))
def test_each_variant_is_needed_to_match(name, change):
    model = tinydiff.load(path(name, "hf"))
    weights = model.weights
    if change.get("qk_norm") is False:      # the layer norms q and k where it has their weights
        weights = dataclasses.replace(weights, layers=[dataclasses.replace(lw, q_norm=None, k_norm=None)
                                                       for lw in weights.layers])
    other = Model(dataclasses.replace(model.config, **change), weights, model.tokenizer)
    expected = expected_logits(name, 0)
    assert np.abs(other.logits(reference(name)["input_ids"][0]) - expected).max() > 1e-2 * np.abs(expected).max()


@pytest.mark.parametrize("name", ["gemma3", "qwen3"])
def test_the_gguf_describes_the_same_model_as_config_json(name):
    """llama.cpp's converter writes Gemma's norms as 1 + w, which our config.json path folds in at
    load: the same f32 numbers either way."""
    hf, gguf = tinydiff.load(path(name, "hf")), tinydiff.load(path(name, "gguf"))
    same = ("num_hidden_layers", "hidden_size", "head_dim", "num_key_value_heads", "rope_theta", "rope_scaling",
            "hidden_act", "qk_norm", "sandwich_norms", "layer_windows", "local_rope_theta", "embedding_scale",
            "final_logit_softcapping", "tie_word_embeddings", "bos_token_id", "eos_token_ids")
    assert {k: getattr(gguf.config, k) for k in same} == {k: getattr(hf.config, k) for k in same}
    assert gguf.config.scale == pytest.approx(hf.config.scale, rel=1e-7)
    assert gguf.config.norm_offset == 0 and hf.config.norm_offset == (1 if name == "gemma3" else 0)
    for a, b in zip(gguf.weights.layers, hf.weights.layers):
        for field, w in vars(b).items():
            if w is not None:
                np.testing.assert_array_equal(np.asarray(getattr(a, field)), np.asarray(w), err_msg=field)


# ---------------------------------------------------------------------------------------------
# GGUF metadata llama.cpp reads for Gemma 3, and what is refused


def rewritten(tmp_path, name, change, drop=()):
    """The fixture's GGUF with metadata changed ({key: (type, value)}) or dropped."""
    f = open_gguf(path(name, "gguf"))
    meta = {k: (f.value_types[k], v) for k, v in f.metadata.items() if k not in drop}
    out = tmp_path / f"{name}.gguf"
    write_gguf(out, {**meta, **change}, {n: np.array(f.raw(n)) for n in f.names})
    return open_gguf(out)


def test_gemma3_windows_follow_llama_cpps_keys(tmp_path):
    assert config_from_gguf(rewritten(tmp_path, "gemma3", {}, drop=["gemma3.attention.sliding_window"])
                            ).layer_windows == ()
    pattern = rewritten(tmp_path, "gemma3", {"gemma3.attention.sliding_window_pattern": ("uint32", 2)})
    assert config_from_gguf(pattern).layer_windows == (4, 0, 4, 0, 4, 0)
    bools = [True, False, False, True, True, False]
    per_layer = rewritten(tmp_path, "gemma3", {"gemma3.attention.sliding_window_pattern": ("array[bool]", bools)})
    assert config_from_gguf(per_layer).layer_windows == (4, 0, 0, 4, 4, 0)
    base = config_from_gguf(rewritten(tmp_path, "gemma3", {}, drop=["gemma3.rope.freq_base_swa"]))
    assert base.local_rope_theta == 10000.0                       # llama.cpp's default for Gemma 3
    capped = rewritten(tmp_path, "gemma3", {"gemma3.final_logit_softcapping": ("float32", 30.0)})
    assert config_from_gguf(capped).final_logit_softcapping == 30.0


@pytest.mark.parametrize("change, message", [
    ({"general.architecture": ("string", "gemma2")}, "architecture gemma2 not supported: llama.cpp soft-caps"),
    ({"gemma3.attention.sliding_window_pattern": ("array[bool]", [True, False])}, "one bool per layer"),
    ({"gemma3.rope.freq_base_swa": ("float32", -1.0)}, "freq_base_swa"),
])
def test_bad_gemma3_metadata_is_one_line_naming_the_key(tmp_path, change, message):
    with pytest.raises(ModelError, match=message):
        config_from_gguf(rewritten(tmp_path, "gemma3", change))


def test_a_window_outside_gemma3_is_still_refused(tmp_path):
    with pytest.raises(ModelError, match="qwen3.attention.sliding_window 8: not supported"):
        config_from_gguf(rewritten(tmp_path, "qwen3", {"qwen3.attention.sliding_window": ("uint32", 8)}))


def test_llama_cpps_end_of_generation_tokens_stop_generation(tmp_path):
    """llama.cpp ends generation at tokens it knows by their text (<end_of_turn>, <|im_end|>, ...)
    whatever the file's EOS id says: Gemma's files name <eos>, and its turns end <end_of_turn>."""
    assert config_from_gguf(open_gguf(path("qwen3", "gguf"))).eos_token_ids == (0,)   # <|endoftext|>, the EOS
    tokens = open_gguf(path("qwen3", "gguf")).metadata["tokenizer.ggml.tokens"]
    tokens = tokens[:7] + ["<end_of_turn>"] + tokens[8:]
    f = rewritten(tmp_path, "qwen3", {"tokenizer.ggml.tokens": ("array[string]", tokens)})
    assert config_from_gguf(f).eos_token_ids == (0, 7)


# ---------------------------------------------------------------------------------------------
# The real files


class Dequantized(TensorTable):
    """A GGUF file's tensors as float32, dequantized by gguf-py (gguf.quants.dequantize)."""

    def __init__(self, file):
        gguf = pytest.importorskip("gguf", reason="dequantizing the real files needs llama.cpp's gguf-py")
        reader = gguf.GGUFReader(str(file))
        super().__init__(str(file), {t.name: t for t in reader.tensors})
        self._dequantize = gguf.quants.dequantize

    def expect(self, name, shape):
        t = self.entry(name)
        a = self._dequantize(t.data, t.tensor_type).astype(np.float32)
        return a.reshape(tuple(int(d) for d in shape))


def real_reference(name):
    with open(os.path.join(REAL, name.split(".")[0] + ".json")) as f:
        return json.load(f)


def real_f32_model(name):
    file = real_model(name)
    config = config_from_gguf(open_gguf(file))
    weights = gguf_weights(config, Dequantized(file))
    return Model(dataclasses.replace(config, eos_token_ids=()), weights, None)


def log_softmax(x):
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compared(model, ref):
    """Over the stored positions: (max |log-prob difference| on transformers' 16 most likely tokens,
    top-1 agreement, mean KL in nats over those 16 and the rest as one outcome)."""
    diffs, agree, kls = [], [], []
    for p in ref["prompts"]:
        t = model.transformer                # the LM head on the stored rows alone: 262144 tokens a row
        ours = log_softmax(t.forward(np.array([p["ids"]]), t.state(len(p["ids"])), 0,
                                     out_rows=np.array(p["rows"])))         # [rows, V]
        ids, theirs = np.array(p["top_ids"]), np.array(p["top_logprobs"])     # [rows, 16]
        mine = np.take_along_axis(ours, ids, 1)
        diffs.append(np.abs(mine - theirs).max())
        agree.extend(ours.argmax(-1) == ids[:, 0])
        pt, pm = np.exp(theirs), np.exp(mine)
        rest_t, rest_m = np.maximum(1 - pt.sum(1), 1e-12), np.maximum(1 - pm.sum(1), 1e-12)
        kls.extend((pt * (theirs - mine)).sum(1) + rest_t * np.log(rest_t / rest_m))
    return max(diffs), float(np.mean(agree)), float(np.mean(kls))


@pytest.mark.parametrize("name", [GEMMA3, SMOLLM2])
def test_a_real_file_in_float32_gives_transformers_logits_and_greedy_runs(name):
    """The file's tensors dequantized as transformers dequantizes them: what is left is float32
    order. 700-token prompt included: Gemma's windowed layers cut keys past 512."""
    model, ref = real_f32_model(name), real_reference(name)
    diff, agree, kl = compared(model, ref)
    assert diff < 2e-3 and agree == 1.0 and kl < 1e-6, (diff, agree, kl)
    for case in ref["greedy"]:
        assert model.generate_ids(case["prompt_ids"], len(case["new_ids"]), temperature=0) == case["new_ids"]


@pytest.mark.parametrize("name", [GEMMA3, SMOLLM2])
def test_a_real_file_as_stored_stays_within_the_activation_quantizations_error(name):
    """The issue's bound for the quantized file, where tinydiff reads all its block formats
    (formats/quant.py): mean KL <= 0.02 nats, top-1 agreement >= 0.9 against transformers."""
    file = real_model(name)
    try:
        model = tinydiff.load(str(file))
    except ModelError as e:
        pytest.skip(f"tinydiff does not read this file yet: {e}")
    model = Model(dataclasses.replace(model.config, eos_token_ids=()), model.weights, None)
    _, agree, kl = compared(model, real_reference(name))
    assert kl <= 0.02 and agree >= 0.9, (kl, agree)
