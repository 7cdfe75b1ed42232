"""The models shipped in weights/: installed with the package, used when no -m is given, and trained."""
import os
import subprocess
import sys

import numpy as np
import pytest

import tinydiff
from tinydiff.engine.transformer import MATRICES
from tinydiff.formats import quant
from tinydiff.model import default_model_path

TESTS = os.path.dirname(os.path.abspath(__file__))
STORY = "Once upon a time, there was a little girl named Lily. She liked to play in the park with her dog."


def installed(*code_or_argv, module=False):
    """Runs Python in tests/, so the installed package answers, not the source folder: stdout."""
    argv = [sys.executable, "-m", "tinydiff", *code_or_argv] if module else [sys.executable, "-c", *code_or_argv]
    p = subprocess.run(argv, capture_output=True, timeout=120, cwd=TESTS)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.decode()


@pytest.fixture(scope="module")
def ar():
    return tinydiff.load(default_model_path("ar"))


@pytest.fixture(scope="module")
def mdm():
    return tinydiff.load(default_model_path("diffusion"))


def test_the_installed_package_carries_both_models():
    paths = installed("from tinydiff.model import default_model_path as d; print(d('ar')); print(d('diffusion'))")
    ar_path, mdm_path = paths.split()
    assert os.path.basename(ar_path) == "stories5m-ar" and os.path.basename(mdm_path) == "stories5m-mdm"
    for path in (ar_path, mdm_path):
        assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "loss.svg"} <= set(os.listdir(path))


def test_generate_without_a_model_uses_the_shipped_ar_model(ar):
    out = installed("generate", "-p", "Once upon a time", "-n", "16", "--temp", "0", module=True)
    assert out == "Once upon a time" + ar.generate("Once upon a time", 16, temperature=0) + "\n"


def test_diffusion_mode_without_a_model_uses_the_shipped_diffusion_model(mdm):
    out = installed("generate", "--mode", "diffusion", "-p", "Once upon a time", "-n", "16", module=True)
    assert out == "Once upon a time" + mdm.denoise("Once upon a time", gen_length=16) + "\n"


def test_the_two_models_are_twins(ar, mdm):
    assert ar.config.causal and not mdm.config.causal and mdm.config.mask_token_id == 2047
    assert ar.parameter_count() == mdm.parameter_count() == 5_344_512
    assert ar.tokenizer.encode(STORY) == mdm.tokenizer.encode(STORY)


def test_the_diffusion_model_reads_its_matrices_in_panels(ar, mdm):
    """Every pass of a masked-diffusion model has many rows: its matrices are put in the GEMM's
    panels at load (the head with the embedding it is tied to), the AR twin's stay rows."""
    w = mdm.weights
    assert {quant.type_of(getattr(lw, name)) for lw in w.layers for name in MATRICES} == {"bf16p"}
    assert quant.type_of(w.lm_head) == "bf16p" and w.embed_tokens is w.lm_head
    assert {quant.type_of(getattr(lw, name)) for lw in ar.weights.layers for name in MATRICES} == {"bf16"}
    assert mdm.weight_bytes()[0] == {"bf16p": 2 * 5_344_512 - 2 * 256 * 13, "f32": 4 * 256 * 13}


def test_the_ar_model_predicts_a_simple_story(ar):
    """A uniform guess costs ln 2048 = 7.6 nats a token; the trained model about 1 on this story."""
    ids = ar.tokenizer.encode(STORY, add_special_tokens=False)
    logits = ar.logits(ids).astype(np.float64)                                   # [n, V]
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    assert -np.mean([logp[i - 1, ids[i]] for i in range(1, len(ids))]) < 2.0


def test_the_diffusion_model_fills_in_a_simple_story(mdm):
    text = mdm.infill("Once upon a [MASK], there was a little [MASK] named Lily.")
    assert "time" in text and "girl" in text


def test_the_block_model_is_the_ar_twin_adapted_and_decodes_block_by_block():
    bd = tinydiff.load("stories5m-bd")
    assert (bd.config.block_size, bd.config.shifted_logits, bd.config.causal) == (8, True, False)
    assert bd.parameter_count() == tinydiff.load("stories5m-ar").parameter_count()
    prompt = bd.encode_prompt("Once upon a time")
    items = list(bd.denoise_steps(prompt, 16, steps=16))
    spans = {s.span for s in items[:-1]}
    assert spans <= {(len(prompt), len(prompt) + 8), (len(prompt) + 8, len(prompt) + 16)}   # its config's blocks
    text = bd.denoise("Once upon a time", 32, steps=32)
    assert text.count(" ") >= 10 and "." in text               # words and a sentence, not masks or noise
