"""The one-call decoder layer (csrc/layer.c, engine/layer_c.py) against forward's loop of kernel
calls (Transformer.layers): bit for bit.

Transformer.forward takes the C layer for passes that fit its buffers (a decode step of one
sequence or of a batch, a block, canvases, with a paged cache or not); forward_seqs with
body=Transformer.layers runs the per-kernel loop. Both must give the same logits and leave the same
KV cache, on every SIMD path and weight type, for every variant of the layer (CONFIGS: QK-norm,
the blocks' output norms, GELU, per-layer windows and RoPE bases, the scales and soft-capping)."""
import dataclasses

import numpy as np
import pytest

from tinydiff.engine import layer_c, transformer
from tinydiff.engine.config import Config, config_from_dict
from tinydiff.engine.ledger import Ledger
from tinydiff.engine.masks import BIDIRECTIONAL, CAUSAL, block_causal
from tinydiff.engine.weights import NORMS, random_weights
from tinydiff.formats import quant
from tinydiff.measure.shapes import stored_as
from tinydiff.model import Model

BASE = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, vocab_size=50, max_position_embeddings=64, rms_norm_eps=1e-5)
CONFIGS = {"llama gqa": BASE,
           "llama attention_bias": {**BASE, "attention_bias": True},   # q/k/v and o biases
           "qwen2": {**BASE, "model_type": "qwen2", "num_key_value_heads": 1},
           # rows of 10 and 17 blocks: the dot products' 8-block groups, leftover pairs and odd block
           "llama wide": {**BASE, "hidden_size": 320, "num_attention_heads": 5, "num_key_value_heads": 1,
                          "intermediate_size": 544},
           # the layer's variants, as Config fields (what a family's config.json sets): each alone, then
           # all of Gemma 3's at once; windows shorter than the spans below, and than a block of keys
           "qwen3 qk-norm": {**BASE, "qk_norm": True},
           "sandwich norms": {**BASE, "sandwich_norms": True, "attention_bias": True},
           "gelu-tanh": {**BASE, "hidden_act": "gelu_tanh"},
           "windows": {**BASE, "layer_windows": (3, 0), "local_rope_theta": 500.0, "rope_theta": 1e6},
           "scales and soft-capping": {**BASE, "attention_scale": 0.3, "embedding_scale": 8.0,
                                       "final_logit_softcapping": 5.0},
           "gemma 3": {**BASE, "num_hidden_layers": 3, "qk_norm": True, "sandwich_norms": True,
                       "hidden_act": "gelu_tanh", "layer_windows": (2, 70, 0), "local_rope_theta": 1e4,
                       "rope_theta": 1e6, "attention_scale": 0.25, "embedding_scale": 8.0,
                       "final_logit_softcapping": 30.0, "norm_offset": 1.0}}
VARIANTS = {f.name for f in dataclasses.fields(Config)} - {"rope_theta"} - set(BASE) - {"attention_bias"}


def model(name, weight_type):
    raw = {k: v for k, v in CONFIGS[name].items() if k not in VARIANTS}
    cfg = dataclasses.replace(config_from_dict(raw), **{k: v for k, v in CONFIGS[name].items() if k in VARIANTS})
    w = random_weights(cfg, seed=3, std=0.3)
    rng = np.random.default_rng(5)
    for lw in w.layers if set(CONFIGS[name]) & VARIANTS else ():   # norms not all ones: one read in the
        for field in NORMS:                                         # wrong place shows
            if getattr(lw, field) is not None:
                setattr(lw, field, (1 + 0.3 * rng.standard_normal(getattr(lw, field).shape)).astype(np.float32))
    w = stored_as(w, weight_type if weight_type != "mixed" else "f32")
    if weight_type == "mixed":  # as GGUF files mix them: each matrix of its own type
        types = dict(q_proj="q8_0", k_proj="f16", v_proj="q4_0", o_proj="bf16", gate_proj="q4_0", up_proj="q8_0")
        w.layers = [dataclasses.replace(lw, **{f: quant.quantize(getattr(lw, f), t) for f, t in types.items()})
                    for lw in w.layers]
    return Model(cfg, w, tokenizer=None)


def loop(t, ids, state, start, kv_len=None, mask=CAUSAL, last_only=False, slots=None):
    """forward's pass by the per-kernel loop."""
    return t.forward_seqs(transformer.Seqs(ids, start, kv_len, slots), state, mask, last_only, body=t.layers)


def run(m, ids, prefill, one_call):
    """Logits of each decode step after a prefill, and the cache they leave."""
    t = m.transformer
    state = t.state(32, rows=prefill)
    t.forward(ids[:, :prefill], state, 0)
    logits = []
    for i in range(prefill, ids.shape[1]):
        if one_call:
            logits.append(t.forward(ids[:, i:i + 1], state, i))
        else:
            logits.append(loop(t, ids[:, i:i + 1], state, i))
    return np.array(logits), state.cache


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("weight_type", ["f32", "f16", "bf16", "q8_0", "q4_0", "mixed"])
def test_the_c_layer_decoding_is_forward_bit_for_bit(name, weight_type, level):
    m = model(name, weight_type)
    ids = np.random.default_rng(0).integers(0, 50, size=(1, 12))
    ref, ref_cache = run(m, ids, 5, one_call=False)
    got, cache = run(m, ids, 5, one_call=True)
    assert np.isfinite(ref).all() and ref.std() > 0.1
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(cache.k, ref_cache.k)
    np.testing.assert_array_equal(cache.v, ref_cache.v)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("weight_type", ["f32", "q8_0", "q4_0", "mixed"])
def test_a_few_positions_in_one_call_are_forward_bit_for_bit(name, weight_type, level):
    """Blocks of positions (a short prompt, a block of block diffusion, a whole diffusion canvas)
    under every mask, the span read against more keys than it writes: csrc/layer.c against the
    per-kernel loop (the GEMM and the tiled attention from 16 and 2 rows on)."""
    m = model(name, weight_type)
    t = m.transformer
    ids = np.random.default_rng(1).integers(0, 50, size=(1, 200))
    for n, mask, extra in [(2, CAUSAL, 0), (5, BIDIRECTIONAL, 3), (8, block_causal(4), 0), (3, block_causal(2), 5),
                           (40, BIDIRECTIONAL, 0), (150, CAUSAL, 2)]:
        runs = []
        for one_call in (False, True):
            state = t.state(200)
            loop(t, ids[:, :8], state, 0)                                       # a prefix, the same way
            span = ids[:, 8:8 + n]
            logits = (t.forward(span, state, 8, kv_len=8 + n + extra, mask=mask) if one_call
                      else loop(t, span, state, 8, 8 + n + extra, mask))
            runs.append((logits, state.cache.k.copy(), state.cache.v.copy()))
        (ref, ref_k, ref_v), (got, k, v) = runs
        assert np.isfinite(ref).all() and ref.shape == (n, 50)
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(k, ref_k)
        np.testing.assert_array_equal(v, ref_v)


@pytest.mark.parametrize("weight_type", ["f32", "q8_0", "q4_0", "mixed"])
@pytest.mark.parametrize("paged", [False, True])
def test_a_batch_in_one_call_is_forward_bit_for_bit(weight_type, paged, level):
    """Decode steps of sequences at their own positions, some steps for a subset of the State's
    (slots), then ragged canvases (a list of ids) under a bidirectional mask; in a cache of its
    own per sequence or in pages of a shared pool (tables not in order): one C call a layer for
    all of them against the per-kernel loop, logits and caches."""
    t = model("llama wide", weight_type).transformer
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 50, size=(1, n)) for n in (3, 9, 5, 14)]
    steps = [([0, 1, 2, 3], rng.integers(0, 50, size=(4, 1))), ([0, 1, 3], rng.integers(0, 50, size=(3, 1))),
             ([0, 1, 2, 3], rng.integers(0, 50, size=(4, 1)))]
    canvases = [rng.integers(0, 50, n) for n in (6, 2, 11)]
    runs = []
    for one_call in (False, True):
        state = t.state(32, batch=4, pages=4 * 2 if paged else None)
        if paged:
            state.cache.tables = {i: np.array(pages) for i, pages in enumerate([[7, 0], [1, 6], [5, 2], [3, 4]])}
        logits = [loop(t, p, state, 0, slots=[i]) for i, p in enumerate(prompts)]
        done = [p.shape[1] for p in prompts]
        for slots, ids in steps:
            start = [done[i] for i in slots]
            logits.append(t.forward(ids, state, start, slots=slots, last_only=True) if one_call
                          else loop(t, ids, state, start, last_only=True, slots=slots))
            for i in slots:
                done[i] += 1
        logits.append(t.forward(canvases, state, 20, kv_len=[26, 22, 31], mask=BIDIRECTIONAL) if one_call
                      else loop(t, canvases, state, 20, [26, 22, 31], BIDIRECTIONAL))
        runs.append((logits, state.cache.k.copy(), state.cache.v.copy()))
    (ref, ref_k, ref_v), (got, k, v) = runs
    assert all(np.isfinite(a).all() for a in ref) and ref[-1].shape == (19, 50)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(k, ref_k)
    np.testing.assert_array_equal(v, ref_v)


@pytest.mark.parametrize("paged", [False, True])
def test_one_query_sequences_share_one_attention_job_bit_for_bit(paged, level):
    """layer.c runs the attention of every one-query sequence of a pass as one job and any
    longer one alone: a prompt joining 69 decoding sequences (continuous batching), at
    their own positions, against the per-kernel loop."""
    t = model("llama gqa", "f32").transformer
    rng = np.random.default_rng(5)
    B = 70
    prompts = [rng.integers(0, 50, size=(1, 1 + i % 5)) for i in range(B - 1)]
    ids = [rng.integers(0, 50, 1) for _ in prompts]
    ids.insert(30, rng.integers(0, 50, 6))                      # a new prompt among them, in slot B-1
    slots = list(range(30)) + [B - 1] + list(range(30, B - 1))
    start = [prompts[i].shape[1] if i < B - 1 else 0 for i in slots]
    runs = []
    for one_call in (False, True):
        state = t.state(8, batch=B, pages=B if paged else None)
        if paged:
            state.cache.tables = {i: np.array([(37 * i) % B]) for i in range(B)}
        for i, p in enumerate(prompts):
            loop(t, p, state, 0, slots=[i])
        logits = (t.forward(ids, state, start, slots=slots) if one_call
                  else loop(t, ids, state, start, slots=slots))
        runs.append((logits, state.cache.k.copy(), state.cache.v.copy()))
    (ref, ref_k, ref_v), (got, k, v) = runs
    assert ref.shape == (B - 1 + 6, 50) and np.isfinite(ref).all()
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(k, ref_k)
    np.testing.assert_array_equal(v, ref_v)


def test_a_page_table_outside_the_pool_is_refused_before_any_c_reads_it():
    t = model("llama gqa", "f32").transformer
    state = t.state(8, pages=2)
    state.cache.tables = {0: np.array([2])}
    with pytest.raises(ValueError, match=r"page table \[2\] outside a pool of 2 pages"):
        t.forward(np.array([[1]]), state, 0)


def test_decode_books_what_forward_books():
    m = model("llama attention_bias", "q8_0")
    ids = np.random.default_rng(1).integers(0, 50, size=(1, 8))
    with Ledger() as ref:
        run(m, ids, 4, one_call=False)
    with Ledger() as got:
        run(m, ids, 4, one_call=True)
    assert got.passes == ref.passes
    assert len(got.passes) == 5 and got.passes[1]["by_op"]["attention"]["flops"] > 0


def test_decode_position_outside_the_cache_is_refused():
    m = model("llama gqa", "f32")
    with pytest.raises(ValueError, match="position 4 is outside the cache's 4 slots"):
        m.transformer.forward(np.array([[1]]), m.transformer.state(4, rows=1), 4)


def test_a_weight_of_the_wrong_shape_is_refused_before_any_c_reads_it():
    m = model("llama gqa", "q8_0")
    lw = m.weights.layers[1]
    m.weights.layers[1] = dataclasses.replace(lw, down_proj=np.ascontiguousarray(lw.down_proj[:, :-1]))  # a block short
    with pytest.raises(ValueError, match=r"down_proj is \(64, 64\), the config wants \(64, 96\)"):
        Model(m.config, m.weights, tokenizer=None)


def test_a_cache_or_buffers_of_another_model_are_refused():
    m, other = model("llama gqa", "f32"), model("qwen2", "f32")     # qwen2 here: 1 kv head, not 2
    with pytest.raises(ValueError, match="made by another Transformer"):
        m.transformer.forward(np.array([[1]]), other.transformer.state(8), 0)
    with pytest.raises(ValueError, match="KV cache"):
        layer_c.Scratch(m.config, transformer.Buffers(m.config, 1), transformer.KVCache(other.config, 8))
    small = dataclasses.replace(m.config, intermediate_size=32)
    with pytest.raises(ValueError, match="buffers of another model"):
        layer_c.Scratch(m.config, transformer.Buffers(small, 1), transformer.KVCache(m.config, 8))


def test_weights_that_do_not_fit_the_config_are_refused():
    m = model("llama gqa", "f32")
    with pytest.raises(ValueError, match="the weights have 2 layers, the config 1"):
        Model(dataclasses.replace(m.config, num_hidden_layers=1), m.weights, tokenizer=None)
    lw = m.weights.layers[0]
    m.weights.layers[0] = dataclasses.replace(lw, q_proj=lw.q_proj[0].copy())     # 1-D
    with pytest.raises(ValueError, match=r"q_proj is \(64,\)"):
        Model(m.config, m.weights, tokenizer=None)


@pytest.mark.parametrize("part", ["cache", "buffer"])
def test_a_cache_or_buffer_c_cannot_write_as_float32_is_refused(part):
    m = model("llama gqa", "f32")
    cache, buf = transformer.KVCache(m.config, 8), transformer.Buffers(m.config, 1)
    if part == "cache":
        cache.k = cache.k.astype(np.float16)
    else:
        buf.gate.flags.writeable = False
    with pytest.raises(ValueError, match="must be a writable C-contiguous float32 array"):
        layer_c.Scratch(m.config, buf, cache)


def test_a_few_positions_book_what_the_loop_books():
    t = model("llama attention_bias", "q8_0").transformer
    ids = np.random.default_rng(2).integers(0, 50, size=(1, 12))
    ledgers = []
    for one_call in (False, True):
        state = t.state(16)
        with Ledger() as led:
            if one_call:
                t.forward(ids[:, 4:9], state, 4, kv_len=12, mask=block_causal(4))
            else:
                loop(t, ids[:, 4:9], state, 4, 12, block_causal(4))
        ledgers.append(led.passes)
    assert ledgers[0] == ledgers[1] and ledgers[0][0]["tokens"] == 5
