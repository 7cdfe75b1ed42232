"""The ledger of real runs against the pencil-and-paper cost model (tinydiff.engine.cost.forward)."""
import dataclasses
import os
import threading

import numpy as np
import pytest

import tinydiff
from tinydiff.engine import cost, layer_c
from tinydiff.engine.config import config_from_dict
from tinydiff.engine.ledger import Ledger
from tinydiff.engine.masks import BIDIRECTIONAL, CAUSAL
from tinydiff.engine.weights import random_weights
from tinydiff.formats import quant
from tinydiff.measure.shapes import stored_as

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")


@pytest.fixture(scope="module", params=["llama-gqa", "qwen2-bias", "llama-tied-headdim"])
def model(request):
    return tinydiff.load(os.path.join(HF, request.param))


@pytest.fixture(scope="module")
def diffusion_model():
    m = tinydiff.load(os.path.join(HF, "llama-gqa"))
    return tinydiff.Model(dataclasses.replace(m.config, causal=False, mask_token_id=2), m.weights, m.tokenizer)


def test_autoregressive_prefill_and_decode_passes_equal_the_cost_model(model):
    ids = model.tokenizer.encode("Once upon a time, there was")
    with Ledger() as led:
        new = model.generate_ids(ids, 6, temperature=0)
    assert len(led.passes) == len(new)                      # the prefill, then one pass per token but the last
    assert led.passes[0] == cost.forward(model.config, len(ids), 0, CAUSAL)
    for i, p in enumerate(led.passes[1:]):
        assert p == cost.forward(model.config, 1, len(ids) + i, CAUSAL)


def test_full_logits_pass_books_the_lm_head_on_every_row(model):
    with Ledger() as led:
        model.logits([5, 6, 7, 8])
    assert led.passes == [cost.forward(model.config, 4, 0, CAUSAL, all_logits=True)]


def test_full_canvas_diffusion_steps_equal_the_cost_model(diffusion_model):
    m = diffusion_model
    ids = m.tokenizer.encode("Once upon a time")
    with Ledger() as led:
        m.denoise_ids(ids, 8, steps=4, eos="keep")
    L = len(ids) + 8
    # the LM head on the masked positions only: 8, 6, 4, 2 as two are committed a step
    assert led.passes == [cost.forward(m.config, L, 0, BIDIRECTIONAL, logit_rows=k) for k in (8, 6, 4, 2)]


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_each_cache_mode_equals_the_cost_model_and_does_less_after_a_blocks_first_step(diffusion_model, cache):
    m = diffusion_model
    ids = m.tokenizer.encode("Once upon a time")
    P, gen, block, steps = len(ids), 12, 4, 6                 # 3 blocks, 2 steps each
    L = P + gen
    with Ledger() as led:
        m.denoise_ids(ids, gen, steps=steps, block_length=block, cache=cache, eos="keep")
    expected = []
    for b in range(gen // block):
        start = P + b * block
        expected.append(cost.forward(m.config, L, 0, BIDIRECTIONAL, logit_rows=4))  # full: refreshes the cache
        if cache == "prefix":                                        # then logits for the 2 still masked
            expected.append(cost.forward(m.config, L - start, start, BIDIRECTIONAL, logit_rows=2))  # block and after
        else:
            expected.append(cost.forward(m.config, block, start, BIDIRECTIONAL, n_kv=L, logit_rows=2))  # the block
    assert led.passes == expected
    full = expected[0]["flops"]
    assert all(p["flops"] < full for p in led.passes[1::2])


def test_guidance_runs_both_rows_in_one_pass(diffusion_model):
    m = diffusion_model
    ids = m.tokenizer.encode("Once upon a time")
    with Ledger() as led:
        m.denoise_ids(ids, 4, steps=2, cfg_scale=1.0, eos="keep")
    assert led.passes == [cost.forward(m.config, len(ids) + 4, 0, BIDIRECTIONAL, batch=2, logit_rows=k) for k in (4, 2)]


def test_decode_reads_every_weight_once_and_prefill_does_not_read_them_more():
    m = tinydiff.load(os.path.join(HF, "llama-gqa"))
    weights = sum(a.nbytes for a in m._arrays()) - m.weights.embed_tokens.nbytes   # untied: rows gathered
    one = cost.forward(m.config, 1, 10, CAUSAL)
    many = cost.forward(m.config, 64, 0, CAUSAL)
    d = m.config.hidden_size * 4
    assert one["bytes"]["weights"] == weights + d
    assert many["bytes"]["weights"] == weights + 64 * d
    assert many["flops"] > 50 * one["flops"]


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "f16"])
def test_quantized_passes_equal_the_cost_model_with_their_real_weight_bytes(model, name):
    """Fractional bytes a weight (34/32 for Q8_0) book whole bytes; a decode step reads every
    matrix's real bytes (nbytes) once, plus one embedding row and the f32 norms and biases."""
    m = tinydiff.Model(model.config, stored_as(model.weights, name), model.tokenizer)
    wb = quant.bytes_per_weight(m.weights.layers[0].q_proj)
    ids = m.tokenizer.encode("Once upon a time")
    with Ledger() as led:
        m.generate_ids(ids, 3, temperature=0)
    assert led.passes[0] == cost.forward(m.config, len(ids), 0, CAUSAL, dtype_bytes=wb)
    for i, p in enumerate(led.passes[1:]):
        assert p == cost.forward(m.config, 1, len(ids) + i, CAUSAL, dtype_bytes=wb)
    arrays = m._arrays()
    read = sum(a.nbytes for a in arrays if a is not m.weights.embed_tokens or a is m.weights.lm_head)
    embed = m.weights.embed_tokens                          # a tied one is repacked with the head
    assert led.passes[1]["bytes"]["weights"] == read + embed.nbytes // quant.rows(embed)
    assert all(isinstance(v, int) for p in led.passes for v in p["bytes"].values())


def test_ledgers_nest_and_each_thread_counts_its_own():
    m = tinydiff.load(os.path.join(HF, "llama-gqa"))
    with Ledger() as outer:
        m.logits([1, 2, 3])
        with Ledger() as inner:
            m.logits([4, 5])
    assert len(outer.passes) == 2 and len(inner.passes) == 1
    assert outer.passes[1] == inner.passes[0]

    seen = {}

    def work(name, n):
        with Ledger() as led:
            for _ in range(n):
                m.logits([1, 2, 3])
        seen[name] = len(led.passes)

    threads = [threading.Thread(target=work, args=(name, n)) for name, n in (("a", 3), ("b", 5))]
    with Ledger() as main:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert seen == {"a": 3, "b": 5} and main.passes == []


def test_total_sums_passes_and_sampling():
    m = tinydiff.load(os.path.join(HF, "llama-gqa"))
    with Ledger() as led:
        m.generate_ids([5, 6, 7], 3, temperature=0)
    t = led.total()
    V = m.config.vocab_size
    assert led.sampling == {"flops": 3 * 5 * V, "bytes": {"weights": 0, "kv_read": 0, "kv_write": 0,
                                                          "activations": 3 * V * 4}}
    assert t["flops"] == sum(p["flops"] for p in led.passes) + led.sampling["flops"]
    assert t["by_op"]["sampling"] == led.sampling
    assert "lm_head" in led.table() and "3 forward passes" in led.table()


# Every variant field of the layer at once (Gemma 3's set, with a window shorter than the passes)
VARIANT = dict(qk_norm=True, sandwich_norms=True, hidden_act="gelu_tanh", layer_windows=(3, 0), local_rope_theta=1e4,
               attention_scale=0.3, embedding_scale=4.0, final_logit_softcapping=20.0, qkv_bias=True, o_bias=True)


@pytest.mark.parametrize("mask", [CAUSAL, BIDIRECTIONAL])
def test_every_variant_of_the_layer_books_what_the_cost_model_says(mask):
    """QK-norm, the blocks' output norms, GELU, per-layer windows, the embedding's scale and the
    logits' soft-capping booked by both bodies (the C layer for short passes, the NumPy loop past
    MAX_LAYER_ROWS) as cost.forward counts them from the config."""
    raw = dict(model_type="llama", hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=48, vocab_size=40, max_position_embeddings=1100)
    cfg = dataclasses.replace(config_from_dict(raw), **VARIANT)
    t = tinydiff.Model(cfg, random_weights(cfg, 1, 0.3), tokenizer=None).transformer
    causal = mask == CAUSAL
    for n, past in ((7, 0), (1, 7), (2, 8), (layer_c.MAX_LAYER_ROWS + 6, 0)):
        state = t.state(1100)
        ids = np.arange(past + n)[None] % 40
        if past:
            t.forward(ids[:, :past], state, 0, mask=mask)
        with Ledger() as led:
            t.forward(ids[:, past:], state, past, mask=mask, last_only=causal)
        assert led.passes == [cost.forward(cfg, n, past, mask)], (n, past)
