"""The model side of masked diffusion: bidirectional logits, and checkpoints in LLaDA's and Dream's layouts.

Bidirectional logits are checked against transformers run with an all-True attention mask. The
LLaDA and Dream checkpoints are the transformers fixtures rewritten in those layouts (their own
names, their own config keys), so the same numbers must come out.
"""
import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

import tinydiff
from tinydiff.engine.masks import BIDIRECTIONAL, block_causal
from tinydiff.engine.weights import HF_NAMES, LLADA_NAMES
from tinydiff.errors import ModelError
from tinydiff.formats.safetensors import load_checkpoint, save_safetensors

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")


def reference(name):
    with open(os.path.join(HF, name, "reference.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-bias", "llama-tied-headdim"])
def test_bidirectional_logits_match_transformers_without_its_causal_mask(name):
    ref = reference(name)
    expected = np.load(os.path.join(HF, name, ref["bidirectional_logits_file"]), allow_pickle=False)
    got = tinydiff.load(os.path.join(HF, name)).logits(ref["input_ids"][0], mask=BIDIRECTIONAL)
    assert np.abs(got - expected).max() <= 1e-3 * np.abs(expected).max()


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-bias", "llama-tied-headdim"])
def test_block_causal_logits_match_transformers_with_a_4d_block_mask(name):
    """Blocks of 5 over 16 ids (the last block cut short): query i sees key j iff j // 5 <= i // 5,
    as a 4D boolean attention mask tells transformers (fixtures/make_reference.py)."""
    ref = reference(name)
    expected = np.load(os.path.join(HF, name, ref["block_causal_logits_file"]), allow_pickle=False)
    got = tinydiff.load(os.path.join(HF, name)).logits(ref["input_ids"][0], mask=block_causal(ref["block_size"]))
    assert np.abs(got - expected).max() <= 1e-4
    causal = np.load(os.path.join(HF, name, ref["logits_files"][0]), allow_pickle=False)
    assert np.abs(expected - causal).max() > 1e-2           # the mask matters: not the causal logits


def rename_to_llada(hf_key, n_layers):
    """The LLaDA key of a Hugging Face Llama key."""
    for field in ("embed_tokens", "norm", "lm_head"):
        if hf_key == HF_NAMES[field]:
            return LLADA_NAMES[field]
    for i in range(n_layers):
        prefix = HF_NAMES["layer"].format(i=i)
        if hf_key.startswith(prefix):
            field = next(f for f, k in HF_NAMES.items() if prefix + k == hf_key)
            return LLADA_NAMES["layer"].format(i=i) + LLADA_NAMES[field]
    raise KeyError(hf_key)


def write_llada(src, dst, mask_token_id=2):
    cfg = json.load(open(os.path.join(src, "config.json")))
    ckpt = load_checkpoint(src)
    tensors = {rename_to_llada(k, cfg["num_hidden_layers"]): np.array(ckpt.f32(k)) for k in ckpt.names}
    os.makedirs(dst)
    save_safetensors(os.path.join(dst, "model.safetensors"), tensors)
    llada = dict(model_type="llada", architectures=["LLaDAModelLM"], d_model=cfg["hidden_size"],
                 n_layers=cfg["num_hidden_layers"], n_heads=cfg["num_attention_heads"],
                 n_kv_heads=cfg["num_key_value_heads"], mlp_hidden_size=cfg["intermediate_size"],
                 embedding_size=cfg["vocab_size"], vocab_size=cfg["vocab_size"] - 3,
                 max_sequence_length=cfg["max_position_embeddings"], rms_norm_eps=cfg["rms_norm_eps"],
                 rope_theta=cfg["rope_parameters"]["rope_theta"], weight_tying=cfg["tie_word_embeddings"],
                 mask_token_id=mask_token_id, eos_token_id=0, activation_type="silu", block_type="llama",
                 include_bias=False, include_qkv_bias=False, layer_norm_type="rms", rope=True)
    json.dump(llada, open(os.path.join(dst, "config.json"), "w"))
    shutil.copy(os.path.join(src, "tokenizer.json"), dst)


def as_diffusion_model(model):
    """The model read as a masked-diffusion one, as a LLaDA or Dream file is: its matrices in the
    GEMM's panels (transformer.interleaved), so that its logits are computed the same way, to the bit."""
    return tinydiff.Model(dataclasses.replace(model.config, causal=False, mask_token_id=2), model.weights,
                          model.tokenizer)


def test_llada_layout_gives_the_llama_models_bidirectional_logits(tmp_path):
    src = os.path.join(HF, "llama-gqa")
    write_llada(src, tmp_path / "llada")
    llada = tinydiff.load(str(tmp_path / "llada"))
    assert not llada.config.causal and llada.config.mask_token_id == 2
    ids = reference("llama-gqa")["input_ids"][0]
    llama = as_diffusion_model(tinydiff.load(src))
    np.testing.assert_array_equal(llada.logits(ids, mask=BIDIRECTIONAL), llama.logits(ids, mask=BIDIRECTIONAL))


def test_llada_config_that_the_engine_does_not_implement_is_an_error(tmp_path):
    write_llada(os.path.join(HF, "llama-gqa"), tmp_path / "llada")
    cfg = json.load(open(tmp_path / "llada" / "config.json"))
    json.dump({**cfg, "include_bias": True}, open(tmp_path / "llada" / "config.json", "w"))
    with pytest.raises(ModelError, match="include_bias"):
        tinydiff.load(str(tmp_path / "llada"))


def test_dream_rows_are_shifted_so_row_i_is_the_token_at_position_i(tmp_path):
    src = os.path.join(HF, "qwen2-bias")
    dst = tmp_path / "dream"
    shutil.copytree(src, dst)
    cfg = json.load(open(dst / "config.json"))
    json.dump({**cfg, "model_type": "Dream", "architectures": ["DreamModel"], "mask_token_id": 2},
              open(dst / "config.json", "w"))
    dream = tinydiff.load(str(dst))
    ids = reference("qwen2-bias")["input_ids"][0]
    plain = as_diffusion_model(tinydiff.load(src)).logits(ids, mask=BIDIRECTIONAL)  # row i predicts i+1
    shifted = dream.logits(ids, mask=BIDIRECTIONAL)
    np.testing.assert_array_equal(shifted[1:], plain[:-1])
    np.testing.assert_array_equal(shifted[0], plain[0])


def test_canvas_logits_of_a_span_read_the_rest_from_the_cache():
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    canvas = np.array([reference("llama-gqa")["input_ids"][0]] * 2)  # [2, 16]
    t = model.transformer
    state = t.state(canvas.shape[1], batch=2)
    full = t.canvas_logits(canvas, state)                               # fills every slot
    span = t.canvas_logits(canvas, state, start=5, end=9)              # same canvas: same K/V
    np.testing.assert_allclose(span, full[:, 5:9], rtol=0, atol=1e-5)
    changed = canvas.copy()
    changed[:, 12] = 7                                                  # outside the span, not recomputed
    np.testing.assert_allclose(t.canvas_logits(changed, state, 5, 9), span, rtol=0, atol=1e-5)
