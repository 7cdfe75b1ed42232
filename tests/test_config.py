import dataclasses
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tinydiff.convert import convert
from tinydiff.engine.config import config_from_dict, load_config
from tinydiff.errors import ModelError
from tinydiff.formats.safetensors import open_safetensors, save_safetensors
from tinydiff.model import Model, load

BASE = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128, vocab_size=300, max_position_embeddings=256)


def cfg(**kw):
    return config_from_dict({**BASE, **kw})


def test_hub_spelling_and_transformers5_spelling_give_the_same_theta():
    hub = cfg(rope_theta=500000.0, rope_scaling=None, torch_dtype="bfloat16")
    v5 = cfg(rope_parameters={"rope_theta": 500000.0, "rope_type": "default"}, dtype="bfloat16")
    assert hub.rope_theta == v5.rope_theta == 500000.0
    assert hub.dtype == v5.dtype == "bfloat16"


def test_defaults_and_derived_sizes():
    c = cfg()
    assert c.head_dim == 16 and c.q_dim == 64 and c.kv_dim == 32
    assert c.rope_theta == 10000.0 and c.causal and not c.qkv_bias
    assert cfg(head_dim=32).q_dim == 128 and cfg(head_dim=None).head_dim == 16
    assert cfg(num_key_value_heads=None).num_key_value_heads == 4
    with pytest.raises(ModelError, match="field 'head_dim' should be positive, got 0"):   # not d / H in its place
        cfg(head_dim=0)


def test_qwen2_has_qkv_bias_and_llama_attention_bias_has_all_four():
    q = cfg(model_type="qwen2")
    assert q.qkv_bias and not q.o_bias
    l = cfg(attention_bias=True)
    assert l.qkv_bias and l.o_bias


def test_eos_may_be_a_list():
    assert cfg(eos_token_id=[5, 7]).eos_token_ids == (5, 7)
    assert cfg(eos_token_id=5).eos_token_ids == (5,)


@pytest.mark.parametrize("kw, field", [
    (dict(model_type="gpt2"), "model_type"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "rope_scaling"),
    (dict(rope_scaling={"type": "dynamic", "factor": 2.0}), "rope_scaling.rope_type 'dynamic' not supported"),
    (dict(rope_scaling={"type": "linear", "factor": 0}), r"rope_scaling.factor should be a positive number"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                        "original_max_position_embeddings": 8192}), "high_freq_factor 1.0 should exceed"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}), "rope_parameters"),
    (dict(model_type="mistral", sliding_window=128), "sliding_window"),
    (dict(model_type="qwen2", use_sliding_window=True, sliding_window=64), "sliding_window"),
    (dict(num_key_value_heads=3), "num_key_value_heads"),
    (dict(hidden_size="64"), "hidden_size"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(mlp_bias=True), "mlp_bias"),
])
def test_what_the_engine_does_not_implement_is_an_error_naming_the_field(kw, field):
    with pytest.raises(ModelError, match=field):
        cfg(**kw)


LLAMA31 = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("kw", [
    dict(rope_theta=500000.0, rope_scaling={"rope_type": "llama3", **LLAMA31}),            # Llama-3.2-1B's config.json
    dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA31}),     # as transformers >= 5 saves it
])
def test_rope_scaling_reads_from_either_spelling(kw):
    c = cfg(**kw)
    assert c.rope_theta == 500000.0 and c.rope_scaling == ("llama3", 32.0, 1.0, 4.0, 8192)
    assert cfg(rope_scaling={"type": "linear", "factor": 2.0}).rope_scaling == ("linear", 2.0)
    assert cfg().rope_scaling == ()


def test_sliding_window_not_in_use_is_accepted():
    assert cfg(model_type="mistral", sliding_window=None).model_type == "mistral"
    assert cfg(model_type="mistral", sliding_window=4096).model_type == "mistral"   # >= context
    assert cfg(model_type="qwen2", use_sliding_window=False, sliding_window=64).qkv_bias


def test_missing_field_and_bad_files(tmp_path):
    with pytest.raises(ModelError, match="missing field 'hidden_size'"):
        config_from_dict({k: v for k, v in BASE.items() if k != "hidden_size"})
    with pytest.raises(ModelError, match="file not found"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="config.json: not valid JSON"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    assert load_config(tmp_path).hidden_size == 64


# --- numbers that make every logit NaN, ids outside the vocabulary ----------------------------

@pytest.mark.parametrize("kw, field", [
    (dict(rms_norm_eps=-1), "rms_norm_eps"),
    (dict(rms_norm_eps=float("nan")), "rms_norm_eps"),
    (dict(rms_norm_eps=float("inf")), "rms_norm_eps"),
    (dict(rms_norm_eps=10**400), "rms_norm_eps"),
    (dict(rope_theta=0), "rope_theta"),
    (dict(rope_theta=-10000.0), "rope_theta"),
    (dict(rope_theta=float("nan")), "rope_theta"),
    (dict(rope_theta=float("inf")), "rope_theta"),
    (dict(rope_theta=10**400), "rope_theta"),
    (dict(rope_parameters={"rope_theta": float("nan")}), "rope_theta"),
    (dict(rope_theta=1e-300), "rope_theta"),       # 0 as a float32
    (dict(rope_theta=1e39), "rope_theta"),         # inf as a float32
    (dict(rms_norm_eps=1e39), "rms_norm_eps"),
])
def test_numbers_that_would_make_logits_nan_are_refused(kw, field):
    with pytest.raises(ModelError, match=field):
        cfg(**kw)


@pytest.mark.parametrize("kw, words", [
    (dict(rms_norm_eps=2147483647), "rms_norm_eps should be in (0, 0.1], got 2147483647"),   # the audit's
    (dict(rms_norm_eps=9.2e18), "rms_norm_eps should be in (0, 0.1], got 9.2e+18"),
    (dict(rms_norm_eps=0.5), "got 0.5"),
    (dict(rms_norm_eps=0), "got 0"),
    (dict(max_position_embeddings=2**63 - 1), f"field 'max_position_embeddings' is {2**63 - 1}, more than"),
    (dict(vocab_size=2**40), "field 'vocab_size' is 1099511627776, more than"),
    (dict(hidden_size=66), "num_attention_heads 4 does not divide hidden_size 66"),
])
def test_numbers_no_model_has_are_refused_naming_the_field_and_value(kw, words):
    """The audit's configurations that loaded and generated (issue 40): each a ModelError line."""
    with pytest.raises(ModelError) as e:
        cfg(**kw)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_edges_of_what_can_be_true_load():
    assert cfg(rms_norm_eps=0.1).rms_norm_eps == 0.1
    assert cfg(max_position_embeddings=2**26).max_position_embeddings == 2**26
    assert cfg(hidden_size=66, head_dim=16).head_dim == 16     # an explicit head size need not divide


@pytest.mark.parametrize("kw, key", [
    (dict(bos_token_id=300), "bos_token_id"),
    (dict(eos_token_id=[5, 300]), "eos_token_id"),
    (dict(eos_token_id=-1), "eos_token_id"),
    (dict(mask_token_id=300), "mask_token_id"),
    (dict(mask_token_id=-5), "mask_token_id"),
])
def test_special_ids_outside_the_vocabulary_are_refused_at_load(kw, key):
    """Before: the model loaded, and denoising or stopping failed later with a UsageError."""
    with pytest.raises(ModelError, match=f"'{key}' is -?\\d+, outside the vocabulary"):
        cfg(**kw)
    assert cfg(**{key: 299}).vocab_size == 300     # the last id is inside


# --- config.json against the weights ------------------------------------------------------------

FIXTURE = Path(__file__).parent / "fixtures" / "hf" / "llama-gqa"


def edited_model(tmp_path, **changes):
    """A copy of the llama-gqa fixture whose config.json has these changes."""
    folder = tmp_path / "model"
    shutil.copytree(FIXTURE, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def test_a_config_with_fewer_layers_than_the_file_is_refused(tmp_path):
    """Before: num_hidden_layers 2 -> 1 ran the first layer alone, a different model."""
    folder = edited_model(tmp_path, num_hidden_layers=1)
    with pytest.raises(ModelError, match=r"model\.layers\.1\..* is not part of a llama model as tinydiff runs it \(nor are 8 more\)"):
        load(folder)
    with pytest.raises(ModelError, match=r"model\.layers\.1\."):
        convert(folder, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


@pytest.mark.parametrize("extra, refused", [
    ("model.layers.0.self_attn.rotary_emb.inv_freq", False),   # old Llama saves: transformers ignores it
    ("model.layers.0.mlp.down_proj.bias", True),
    ("rope_freqs.weight", True),
])
def test_a_tensor_beside_the_model_is_refused_unless_transformers_ignores_it(tmp_path, extra, refused):
    folder = edited_model(tmp_path)
    ckpt = open_safetensors(folder / "model.safetensors")
    tensors = {name: np.array(ckpt.f32(name)) for name in ckpt.names}
    (folder / "model.safetensors").unlink()
    save_safetensors(folder / "model.safetensors", {**tensors, extra: np.ones(8, np.float32)})
    if refused:
        with pytest.raises(ModelError, match=f"tensor {re.escape(extra)} is not part of a llama model"):
            load(folder)
    else:
        assert np.array_equal(load(folder).logits([1, 2]), load(FIXTURE).logits([1, 2]))


def test_a_tied_config_uses_the_embedding_as_transformers_does(tmp_path):
    """tie_word_embeddings with an lm_head.weight in the file: transformers ties the head to the
    embedding (tie_weights overwrites the stored head), so the logits are the embedding's."""
    tied = load(edited_model(tmp_path, tie_word_embeddings=True))
    assert tied.weights.lm_head is tied.weights.embed_tokens
    untied = load(FIXTURE)
    assert not np.array_equal(untied.weights.lm_head, untied.weights.embed_tokens)
    by_hand = Model(untied.config, dataclasses.replace(untied.weights, lm_head=untied.weights.embed_tokens),
                    untied.tokenizer)
    assert np.array_equal(tied.logits([1, 5, 9]), by_hand.logits([1, 5, 9]))


@pytest.mark.parametrize("key", ["model_type", "hidden_act", "rope_scaling"])
def test_a_name_from_the_file_is_shown_on_one_line(key):
    value = {"type": "a\nb"} if key == "rope_scaling" else "a\nb"
    with pytest.raises(ModelError) as err:
        cfg(**{key: value})
    assert "\n" not in str(err.value) and "'a\\nb'" in str(err.value)


# ---------------------------------------------------------------------------------------------
# Qwen 3 and Gemma, read as transformers' Qwen3Config, Gemma2Config and Gemma3TextConfig read them

ARCH = Path(__file__).parent / "fixtures" / "arch"
SMALL = dict(hidden_size=16, num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1,
             intermediate_size=32, vocab_size=320, head_dim=8)


def test_gemma3_from_a_hub_config_json_is_the_model_transformers_5_saves():
    """gemma-3-1b's spelling (transformers 4): rope_theta and rope_local_base_freq at the top,
    sliding_window_pattern instead of layer_types, and no tie_word_embeddings (true for Gemma)."""
    saved = load_config(ARCH / "gemma3")
    hub = config_from_dict(dict(SMALL, model_type="gemma3_text", query_pre_attn_scalar=8, sliding_window=4,
                                sliding_window_pattern=6, rope_theta=1000000.0, rope_local_base_freq=20000.0,
                                rope_scaling=None, max_position_embeddings=256, rms_norm_eps=1e-6,
                                bos_token_id=1, eos_token_id=0, torch_dtype="float32",
                                hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None,
                                attn_logit_softcapping=None))
    assert hub == saved


def test_gemma3s_defaults_are_transformers_own():
    c = config_from_dict({k: v for k, v in dict(SMALL, model_type="gemma3_text").items() if k != "head_dim"})
    assert c.head_dim == 256 and c.tie_word_embeddings and c.max_position_embeddings == 131072
    assert c.rope_theta == 1e6 and c.local_rope_theta == 1e4 and c.layer_windows == (4096,) * 5 + (0,)
    assert c.attention_scale == 256 ** -0.5 and c.hidden_act == "gelu_tanh" and c.final_logit_softcapping is None
    scaled = config_from_dict(dict(SMALL, model_type="gemma3_text", rope_scaling={"rope_type": "linear", "factor": 8.0}))
    assert scaled.rope_scaling == ("linear", 8.0)     # the global layers' (Gemma 3 4B and up); the local stay plain


def test_gemma2_and_qwen3_windows():
    g2 = config_from_dict(dict(SMALL, model_type="gemma2", attn_logit_softcapping=None, sliding_window=16))
    assert g2.layer_windows == (16, 0) * 3 and g2.final_logit_softcapping == 30.0 and g2.local_rope_theta is None
    q3 = dict(SMALL, model_type="qwen3", sliding_window=16, max_window_layers=4)
    assert config_from_dict(q3).layer_windows == ()                           # use_sliding_window false
    assert config_from_dict(dict(q3, use_sliding_window=True)).layer_windows == (0,) * 4 + (16, 16)
    types = ["full_attention", "sliding_attention"] * 3
    assert config_from_dict(dict(q3, use_sliding_window=True, layer_types=types)).layer_windows == (0, 16) * 3
    assert config_from_dict(dict(q3, attention_bias=True)).o_bias      # Qwen 3's bias is on all four


@pytest.mark.parametrize("kw, message", [
    (dict(model_type="gemma3"), "Gemma3ForConditionalGeneration"),
    (dict(model_type="gemma2"), "attn_logit_softcapping 50.0: soft-capped attention"),   # Gemma2Config's default
    (dict(model_type="gemma3_text", attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    (dict(model_type="gemma3_text", use_bidirectional_attention=True), "use_bidirectional_attention"),
    (dict(model_type="gemma3_text", hidden_activation="gelu"), "hidden_activation 'gelu' not supported"),
    (dict(model_type="gemma3_text", layer_types=["full_attention"]), "layer_types should list 6"),
    (dict(model_type="gemma3_text", layer_types=["chunked_attention"] * 6), "layer_types"),
    (dict(model_type="gemma3_text", sliding_window=None), "sliding_window should be a positive integer"),
    (dict(model_type="gemma3_text", sliding_window_pattern=0), "sliding_window_pattern"),
    (dict(model_type="gemma3_text", query_pre_attn_scalar=0), "query_pre_attn_scalar"),
    (dict(model_type="gemma3_text", rope_parameters={"sliding_attention": {"rope_type": "linear", "factor": 2.0},
                                                     "full_attention": {"rope_type": "default"}}),
     "rope_parameters.sliding_attention.rope_type 'linear'"),
    (dict(model_type="gemma3_text", rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 2.0},
                                                     "sliding_attention": {"rope_type": "default"}}),
     "rope_parameters.full_attention.rope_type 'yarn' not supported"),
])
def test_what_gemma_needs_and_tinydiff_lacks_is_refused(kw, message):
    with pytest.raises(ModelError, match=message):
        config_from_dict(dict(SMALL, **kw))


def test_gemma_checkpoints_use_gemmas_names(tmp_path):
    """Gemma's post_attention_layernorm norms the attention's output (ours post_attention_norm);
    its pre_feedforward_layernorm is the MLP's input norm: a Llama-named file is refused."""
    src = ARCH / "gemma3"
    f = open_safetensors(src / "model.safetensors")
    renamed = {n.replace("post_attention_layernorm", "post_attention_norm")
               .replace("pre_feedforward_layernorm", "post_attention_layernorm"): np.array(f.f32(n)) for n in f.names}
    dst = tmp_path / "gemma3"
    shutil.copytree(src, dst)
    save_safetensors(dst / "model.safetensors", renamed)
    with pytest.raises(ModelError, match="post_attention_norm.weight is not part of a gemma3_text model"):
        load(str(dst))
