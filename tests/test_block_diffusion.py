"""Block diffusion (issue 13): the prompt prefilled causally, then blocks denoised one after the
other, each attending to the cached blocks before it and to itself, its clean K/V cached once."""
import dataclasses
import os

import numpy as np
import pytest

import tinydiff
from tinydiff.errors import UsageError

MODEL = os.path.join(os.path.dirname(__file__), "fixtures", "hf", "llama-gqa")


@pytest.fixture(scope="module")
def ar():
    return tinydiff.load(MODEL)


def as_block_model(ar, shifted=True, mask=319):
    """The AR weights read as a diffusion model: row i predicts position i+1 (shifted, as the AR
    model does), mask = an id the fixture's greedy runs never produce."""
    cfg = dataclasses.replace(ar.config, causal=False, shifted_logits=shifted, mask_token_id=mask)
    return tinydiff.Model(cfg, ar.weights, ar.tokenizer)


def test_block_size_one_with_one_step_a_block_is_greedy_autoregressive_decoding(ar):
    prompt = ar.tokenizer.encode("Once upon a time, there was a")
    want = ar.generate_ids(prompt, 16, temperature=0)
    assert 319 not in want and len(want) == 16
    got = as_block_model(ar).denoise_ids(prompt, 16, block_size=1, steps=16, eos="keep")
    assert got == want


def test_a_block_never_sees_a_later_one(ar):
    """Committed blocks do not depend on how many blocks follow (a full-canvas sampler's do)."""
    m, prompt = as_block_model(ar), ar.tokenizer.encode("Once upon a time")
    short = m.denoise_ids(prompt, 8, block_size=4, steps=8, eos="keep")
    long = m.denoise_ids(prompt, 16, block_size=4, steps=16, eos="keep")
    assert long[:8] == short
    canvas_short = m.denoise_ids(prompt, 8, steps=8, eos="keep")
    canvas_long = m.denoise_ids(prompt, 16, steps=16, eos="keep")
    assert canvas_long[:8] != canvas_short                    # the whole canvas sees every mask


@pytest.mark.parametrize("shifted", [True, False])
def test_each_step_recomputes_its_block_only_and_each_block_is_cached_once(ar, shifted):
    m, prompt = as_block_model(ar, shifted), ar.tokenizer.encode("Once upon a time")
    P = len(prompt)
    items = list(m.denoise_steps(prompt, 12, block_size=4, steps=6, eos="keep"))
    steps, out = items[:-1], items[-1]
    assert [s.span for s in steps] == [(P + 4 * (i // 2), P + 4 * (i // 2) + 4) for i in range(6)]
    assert out.passes == 1 + 6 + 2                            # the prompt, the steps, a clean pass a block
                                                              # that has another after it
    assert sum(out.commits) == 12 and 319 not in out.ids


def test_cfg_runs_both_rows_through_the_block_cache(ar):
    m, prompt = as_block_model(ar), ar.tokenizer.encode("Once upon a time")
    out = m.denoise_result(prompt, 8, block_size=4, steps=8, cfg_scale=1.0, eos="keep")
    assert len(out.ids) == 8 and 319 not in out.ids


@pytest.mark.parametrize("kwargs, words", [
    (dict(block_size=0), "block_size must be"), (dict(block_size=1.5), "block_size must be"),
    (dict(block_size=3), "block_size=3 does not divide gen_length=8"),
    (dict(block_size=4, block_length=4), "cannot be combined with block_length"),
    (dict(block_size=4, cache="dual"), "cannot be combined with cache"),
])
def test_bad_block_sizes_are_usage_errors(ar, kwargs, words):
    with pytest.raises(UsageError, match=words):
        as_block_model(ar).denoise_ids([5, 6, 7], 8, **kwargs)


def test_block_size_refuses_an_infill(ar):
    with pytest.raises(UsageError, match="block_size decodes a continuation"):
        as_block_model(ar).infill([5, 319, 319, 7], block_size=1)


def block_model_dir(tmp_path, **overrides):
    """The llama-gqa fixture as a block-diffusion checkpoint: config.json says so."""
    import json
    import shutil
    dst = tmp_path / "bd"
    shutil.copytree(MODEL, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update({"is_causal": False, "mask_token_id": 319, "block_size": 4, **overrides})
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_the_models_config_decides_the_block_size_and_gguf_keeps_it(tmp_path):
    from tinydiff.convert import convert
    m = tinydiff.load(str(block_model_dir(tmp_path)))
    assert m.config.block_size == 4
    P = len(m.encode_prompt("Once upon a time"))
    spans = [s.span for s in list(m.denoise_steps(m.encode_prompt("Once upon a time"), 8, steps=8))[:-1]]
    assert spans == [(P + 4 * (i // 4), P + 4 * (i // 4) + 4) for i in range(8)]
    convert(str(tmp_path / "bd"), str(tmp_path / "bd.gguf"), "f32")
    assert tinydiff.load(str(tmp_path / "bd.gguf")).config.block_size == 4


def test_a_gguf_block_size_that_disagrees_with_the_model_is_a_model_error(tmp_path):
    """A block size in a causal model's file (config.json, or GGUF's tinydiff.block_size beside
    llama.attention.causal = true) contradicts itself: a model error naming both."""
    from tinydiff.convert import convert
    from tinydiff.errors import ModelError
    from tinydiff.formats import gguf
    convert(str(block_model_dir(tmp_path)), str(tmp_path / "bd.gguf"), "f32")
    data = (tmp_path / "bd.gguf").read_bytes()
    key = b"llama.attention.causal"
    at = data.index(key) + len(key)                  # then the value's type (u32) and the bool itself
    assert gguf.open_gguf(tmp_path / "bd.gguf").metadata["llama.attention.causal"] is False
    (tmp_path / "causal.gguf").write_bytes(data[:at + 4] + b"\x01" + data[at + 5:])
    with pytest.raises(ModelError, match="block_size 4 .* causal"):
        tinydiff.load(str(tmp_path / "causal.gguf"))
    with pytest.raises(ModelError, match="block_size 4 .* causal"):
        tinydiff.load(str(block_model_dir(tmp_path / "c", is_causal=True)))


@pytest.mark.parametrize("bad", [0, 10 ** 6, "4", 2.5])
def test_a_config_block_size_that_is_no_block_is_a_model_error(tmp_path, bad):
    from tinydiff.errors import ModelError
    with pytest.raises(ModelError, match="block_size"):
        tinydiff.load(str(block_model_dir(tmp_path, block_size=bad)))


def test_the_block_elbo_estimator_is_unbiased(ar):
    """Its mean over many draws equals the exact block ELBO: per block, every subset of masked
    positions enumerated, weighted 1 / (l C(m, l)), the block given the clean text before it."""
    import itertools
    import math

    from tinydiff.decoding.diffusion import block_logits
    from tinydiff.training.likelihood import block_masked_losses
    from tinydiff.training.sequences import log_softmax
    m = as_block_model(ar)
    t, canvas, first, b = m.transformer, np.array([5, 17, 42, 9, 77, 3, 120]), 2, 3   # blocks [2,5), [5,7)
    exact = 0.0
    for lo in range(first, len(canvas), b):
        hi = min(lo + b, len(canvas))
        n = hi - lo
        for size in range(1, n + 1):
            for S in itertools.combinations(range(lo, hi), size):
                state = t.state(len(canvas))
                last = t.forward(canvas[None, :lo], state, 0, last_only=True)
                x = canvas.copy()
                x[list(S)] = 319
                lp = log_softmax(block_logits(t, x[None], state, lo, hi, last)[0].astype(np.float64))
                nll = -sum(lp[i - lo, canvas[i]] for i in S)
                exact += nll / size / math.comb(n, size)             # sum over S of nll(S) / (l C(m, l))
    est = block_masked_losses(t, canvas, first, 4000, 319, np.random.default_rng(0), b)
    assert est.mean() == pytest.approx(exact, rel=2e-2)


def test_only_a_whole_canvas_model_gets_the_gemms_panels():
    """A masked-diffusion model's passes all have many rows, so its bf16 matrices are stored in the
    GEMM's panels at load; a block model's passes are a block of rows, which the tiles read from
    the rows (engine/transformer.py many_rows); an AR model's too."""
    from tinydiff.formats import quant
    kinds = {}
    for name in ("stories5m-mdm", "stories5m-bd", "stories5m-ar"):
        m = tinydiff.load(name)
        layer = m.transformer.weights.layers[0]
        kinds[name] = (quant.is_panels(layer.q_proj), quant.is_panels(layer.down_proj))
    assert kinds == {"stories5m-mdm": (True, True), "stories5m-bd": (False, False), "stories5m-ar": (False, False)}
