"""Batch invariance (issue 40): a row's result is the same bits whatever rows come with it.

Every matmul sums a row's products in one order at any number of rows (csrc/matmul.c): f32 in the
few-rows tiles' order, by the tiles or by the lane GEMM; the other types by their dot products'
tiles, or by the int8 GEMM that sums as the X8 kernels do. So a request's logits, and so its tokens
at temperature 0 and with a fixed seed, are the same alone, in a batch of any size, among the
server's other requests, or in a diffusion group. Pinned here on every SIMD level this CPU has:
the kernels over numbers of rows and positions in them (hypothesis), then whole models.
"""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tinydiff
from test_block_formats import blocks
from tinydiff.engine import kernels as K
from tinydiff.formats import kquants, quant
from tinydiff.measure.shapes import stored_as
from tinydiff.serve.scheduler import Scheduler
from tinydiff.decoding.sampling import SamplingParams

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FLOATS = ["f32", "f16", "bf16"]
BLOCKS = ["q8_0", "q4_0"] + list(kquants.FORMATS)


def same_bits(a, b):
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def weights(name, m, k, seed, layout):
    """An [m, k] matrix of type name as a model holds it: rows, interleaved (X8, where this level
    wants it) or the GEMM's panels (masked diffusion)."""
    if name in FLOATS:
        w = np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)
        w = w if name == "f32" else quant.quantize(w, name)
    else:
        w = blocks(name, (m, k // quant.BLOCK[quant.READS[name]]), seed, tame=True)
    return K.interleaved(w, panels=layout == "panels") if layout != "rows" else w


def alone(x, w):
    return np.concatenate([K.matmul(x[i:i + 1], w) for i in range(len(x))])


@pytest.mark.parametrize("layout", ["rows", "load", "panels"])
@pytest.mark.parametrize("name", FLOATS)
@SETTINGS
@given(n=st.integers(1, 80), k=st.integers(1, 300), m=st.sampled_from([1, 7, 32, 45, 64, 96]),
       seed=st.integers(0, 10**6))
def test_a_float_row_is_the_same_in_any_company(level, layout, name, n, k, m, seed):
    """n rows at once give each row's one-row result to the bit, for any k (tails past the vector
    width too) and m (panels cut by the edge), on the tiles (few rows) and the lane GEMM (many)."""
    if layout == "panels" and m % quant.PANEL:
        m = 32 * (m // 32 + 1)
    w = weights(name, m, k, seed, layout)
    x = np.random.default_rng(seed + 1).standard_normal((n, k)).astype(np.float32)
    same_bits(K.matmul(x, w), alone(x, w))


@pytest.mark.parametrize("name", BLOCKS)
@SETTINGS
@given(n=st.integers(1, 70), nb=st.integers(1, 3), m=st.sampled_from([1, 5, 8, 16, 40]), seed=st.integers(0, 10**6))
def test_a_row_against_blocks_is_the_same_in_any_company(level, name, n, nb, m, seed):
    """The block types as a model loads them (Q8_0 and Q4_0 interleaved where the level wants it,
    from 17 rows the int8 GEMM on AVX512_VNNI): each row of n its one-row result to the bit."""
    per = quant.BLOCK[quant.READS[name]]
    w = weights(name, m, nb * max(per, 32), seed, "load")
    x = np.random.default_rng(seed + 1).standard_normal((n, nb * max(per, 32))).astype(np.float32)
    same_bits(K.matmul(x, w), alone(x, w))


@pytest.mark.parametrize("name", ["f32", "bf16", "q8_0", "q4_1", "q4_k"])
def test_several_weights_and_a_residual_are_each_rows_alone(level, name):
    """matmuls (q/k/v in one job) and the residual added to out, at few and many rows: each row
    of each product as that weight's one-row matmul, plus out where out is given."""
    k = 512
    ws = [weights(name, m, k, j, "load") for j, m in enumerate((64, 40, 96))]
    x = np.random.default_rng(3).standard_normal((70, k)).astype(np.float32)
    for n in (3, 20, 70):
        got = K.matmuls(x[:n], ws)
        for w, y in zip(ws, got):
            same_bits(y, alone(x[:n], w))
        out = np.random.default_rng(4).standard_normal((n, 64)).astype(np.float32)
        want = out + alone(x[:n], ws[0])
        K.matmul(x[:n], ws[0], out=out, residual=True)
        same_bits(out, want)


def test_turning_invariance_off_brings_the_gemms_back(batch_variant):
    """Off, many rows go through the GEMMs that sum in their own order (what set_batch_invariant
    says): a row's bits then differ from its one-row result somewhere (on this fixed matrix they do)."""
    w = weights("f32", 96, 576, 1, "rows")
    x = np.random.default_rng(2).standard_normal((40, 576)).astype(np.float32)
    assert not np.array_equal(K.matmul(x, w), alone(x, w))
    K.set_batch_invariant(True)
    same_bits(K.matmul(x, w), alone(x, w))


# -- whole models ----------------------------------------------------------------------------------

PROMPTS = [[5 + i, 6 + 2 * i, 7] + [40 + i] * (i % 5) for i in range(24)]


def fixture_model(weight_type):
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    if weight_type == "f32":
        return model
    return tinydiff.Model(model.config, stored_as(model.weights, weight_type), model.tokenizer)


@pytest.mark.parametrize("weight_type", ["f32", "bf16", "q8_0", "q4_1"])
def test_a_batch_of_24_gives_each_prompt_its_own_bits(level, weight_type):
    """24 sequences at once (past every GEMM threshold) give each prompt's logits to the bit, and
    so its tokens, greedy and seeded, as it gives alone."""
    model = fixture_model(weight_type)
    t = model.transformer
    ids = np.array([p[:3] for p in PROMPTS])
    state = t.state(8, batch=len(ids))
    together = t.forward(ids, state, 0).reshape(len(ids), 3, -1)          # [sequence, position, vocab]
    for i, p in enumerate(ids):
        same_bits(together[i], t.forward(p[None], t.state(8), 0))
    steps = [6 + i % 7 for i in range(len(PROMPTS))]
    assert model.generate_ids(PROMPTS, steps, temperature=0) == [
        model.generate_ids(p, n, temperature=0) for p, n in zip(PROMPTS, steps)]
    seeds = list(range(len(PROMPTS)))
    assert model.generate_ids(PROMPTS, 8, temperature=1.0, top_k=0, seed=seeds) == [
        model.generate_ids(p, 8, temperature=1.0, top_k=0, seed=s) for p, s in zip(PROMPTS, seeds)]


@pytest.mark.parametrize("path, weight_type", [("hf/llama-gqa", "f32"), ("hf/llama-gqa", "q4_1"),
                                               ("arch/gemma3", "f32")])
def test_a_sequences_rows_in_one_pass_are_its_rows_one_at_a_time(level, path, weight_type):
    """A prompt of 90 tokens in one pass (prefill), in two passes (a prefix cached, then the rest)
    and one token a pass (decoding) give every position's logits to the bit: a causal mask's
    queries take one attention kernel however many come together (gemma3: a sliding window of 4)."""
    model = tinydiff.load(os.path.join(os.path.dirname(__file__), "fixtures", path))
    if weight_type != "f32":
        model = tinydiff.Model(model.config, stored_as(model.weights, weight_type), model.tokenizer)
    t = model.transformer
    ids = [(7 * i + 3) % 200 + 5 for i in range(90)]
    whole = t.forward(np.array([ids]), t.state(96), 0)
    state = t.state(96)
    split = np.concatenate([t.forward(np.array([ids[:70]]), state, 0), t.forward(np.array([ids[70:]]), state, 70)])
    state = t.state(96)
    one = np.concatenate([t.forward(np.array([[i]]), state, p) for p, i in enumerate(ids)])
    same_bits(whole, one)
    same_bits(split, one)


def test_the_server_among_many_requests_and_slots_gives_each_its_own_answer(level):
    """The scheduler with 1, 4 and 24 slots, 24 requests at once: each answer is the request's alone."""
    model = fixture_model("bf16")
    solo = [model.generate_ids(p, 10, temperature=0) for p in PROMPTS]
    for slots in (1, 4, 24):
        scheduler = Scheduler(model, slots=slots)
        seqs = [scheduler.submit(p, 10, SamplingParams(temperature=0)) for p in PROMPTS]
        assert [list(s) for s in seqs] == solo


@pytest.mark.parametrize("name", ["stories5m-mdm", "stories5m-bd"])
def test_a_diffusion_group_of_any_size_gives_each_prompt_its_own_answer(name):
    """denoise_together: a group of 1, 3 or 8 prompts, each prompt's answer as alone (the best level)."""
    model = tinydiff.load(name)
    prompts = ["Once upon a time", "The cat", "Tom and Sue went", "One day", "A little bird",
               "The sun was", "Lily liked", "There was a big"]
    solo = [model.denoise(p, 16, steps=8) for p in prompts]
    assert model.denoise(prompts[:3], 16, steps=8) == solo[:3]
    assert model.denoise(prompts, 16, steps=8) == solo


def test_the_flag_turns_it_off_for_the_run_and_a_run_without_it_on_again(capsys):
    """--no-batch-invariant on generate and bench switches the GEMMs back on (set_batch_invariant
    then reports it was off); a run without it is invariant again; info does not take it."""
    from tinydiff.cli import main
    assert main(["generate", "-m", "stories5m-ar", "-p", "Once", "-n", "2", "--temp", "0", "--no-batch-invariant"]) == 0
    assert K.set_batch_invariant(False) is False
    assert main(["generate", "-m", "stories5m-ar", "-p", "Once", "-n", "2", "--temp", "0"]) == 0
    assert K.set_batch_invariant(True) is True
    assert main(["bench", "-m", "stories5m-ar", "-p", "8", "-n", "2", "-r", "1", "--no-roofline",
                 "--no-batch-invariant"]) == 0
    assert K.set_batch_invariant(True) is False
    assert main(["info", "-m", "stories5m-ar", "--no-batch-invariant"]) == 2
    assert "unrecognized arguments: --no-batch-invariant" in capsys.readouterr().err
