"""tinydiff against Hugging Face transformers, on the fixtures tests/fixtures/make_reference.py made.

Each fixture folder is a small random model saved by save_pretrained, with transformers' logits for
fixed inputs and its greedy generate(do_sample=False) output (with its KV cache).
"""
import dataclasses
import json
import os

import numpy as np
import pytest

import tinydiff
from tinydiff.engine import kernels as K
from tinydiff.engine.transformer import rope_inv_freq

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
MODELS = sorted(d for d in os.listdir(HF) if os.path.isdir(os.path.join(HF, d)))


def reference(name):
    with open(os.path.join(HF, name, "reference.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module", params=MODELS)
def fixture(request):
    return tinydiff.load(os.path.join(HF, request.param)), reference(request.param), request.param


def test_there_are_fixtures_for_each_layout():
    assert {"llama-gqa", "llama-tied-headdim", "qwen2-bias", "llama-bf16", "llama-sharded", "llama3-rope",
            "llama-linear-rope"} <= set(MODELS)


def test_logits_match_transformers(fixture):
    model, ref, name = fixture
    for ids, fname in zip(ref["input_ids"], ref["logits_files"]):
        expected = np.load(os.path.join(HF, name, fname), allow_pickle=False)
        got = model.logits(ids)
        assert got.shape == expected.shape and got.dtype == np.float32
        scale = np.abs(expected).max()
        assert np.abs(got - expected).max() <= 1e-3 * scale, name


def test_rope_frequencies_are_transformers_own(fixture):
    model, ref, name = fixture
    # within two float32 ulps: NumPy's and torch's pow (each within an ulp or so) round theta ** (i / hd) apart
    np.testing.assert_array_max_ulp(rope_inv_freq(model.config), np.array(ref["inv_freq"], np.float32), maxulp=2)


@pytest.mark.parametrize("name", ["llama3-rope", "llama-linear-rope"])
def test_rope_scaling_changes_the_logits_it_is_tested_on(name):
    model, ref = tinydiff.load(os.path.join(HF, name)), reference(name)
    plain = tinydiff.Model(dataclasses.replace(model.config, rope_scaling=()), model.weights, model.tokenizer)
    expected = np.load(os.path.join(HF, name, ref["logits_files"][-1]), allow_pickle=False)
    assert np.abs(plain.logits(ref["input_ids"][-1]) - expected).max() > 1e-2 * np.abs(expected).max()


def test_greedy_generation_matches_transformers_generate(fixture):
    model, ref, name = fixture
    for case in ref["greedy"]:
        got = model.generate_ids(case["prompt_ids"], case["max_new_tokens"], temperature=0)
        assert got == case["output_ids"], name


def test_decoding_with_the_cache_equals_full_forward_passes(fixture):
    model, ref, _ = fixture
    ids = ref["greedy"][0]["prompt_ids"]
    new = model.generate_ids(ids, 8, temperature=0)
    full = model.logits(ids + new[:-1])                       # [n + 7, V]
    assert list(np.argmax(full[len(ids) - 1:], axis=-1)) == new


def test_prompt_text_encodes_to_the_recorded_ids(fixture):
    model, ref, _ = fixture
    assert model.tokenizer.encode(ref["prompt_text"]) == ref["prompt_ids"]
