"""A decoder layer's tensors, declared once (engine/weights.py LAYER_TENSORS), and the layer's
variants as Config fields: the loaders, the C layer, the cost model and convert read the one table,
and no file of the layer tests an architecture's name."""
import dataclasses
import os
import re

import numpy as np
import pytest

import tinydiff
from tinydiff.engine import weights as W
from tinydiff.engine.config import load_config
from tinydiff.errors import ModelError
from tinydiff.formats.safetensors import load_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")


def test_the_table_names_every_field_of_a_layer_and_each_layout_has_a_key_for_it():
    fields = [f.name for f in dataclasses.fields(W.LayerWeights)]
    assert [t.name for t in W.LAYER_TENSORS] == fields
    for names in (W.HF_NAMES, W.GGUF_NAMES):
        assert set(fields) <= set(names)
    assert len(set(W.GGUF_NAMES.values())) == len(W.GGUF_NAMES)      # no two fields share a key


def test_a_config_flag_makes_the_loader_read_its_tensors_and_refuse_them_without_it():
    """qk_norm set: q_norm / k_norm are read (their shape checked); unset, a file holding them is refused."""
    path = os.path.join(HF, "llama-gqa")
    cfg, ckpt = load_config(path), load_checkpoint(path)
    with pytest.raises(ModelError, match="q_norm"):
        W.load_weights(dataclasses.replace(cfg, qk_norm=True), ckpt)   # the fixture has none: missing
    hd = cfg.head_dim
    extra = {f"model.layers.{i}.self_attn.{n}.weight": np.full(hd, 0.5 + i, np.float32)
             for i in range(cfg.num_hidden_layers) for n in ("q_norm", "k_norm")}
    more = _Plus(ckpt, extra)
    w = W.load_weights(dataclasses.replace(cfg, qk_norm=True), more)
    assert all((lw.q_norm == 0.5 + i).all() and lw.k_norm.shape == (hd,) for i, lw in enumerate(w.layers))
    with pytest.raises(ModelError, match="q_norm.weight.*is not part of"):
        W.load_weights(cfg, more)


def test_a_norm_offset_is_folded_into_every_norm_weight_at_load():
    """Gemma's RMSNorm scales by 1 + w: the loader stores 1 + w in f32 (computed as HF computes
    1.0 + weight.float()), so both bodies and the cost model see a plain RMSNorm."""
    path = os.path.join(HF, "llama-gqa")
    cfg, ckpt = load_config(path), load_checkpoint(path)
    plain, offset = W.load_weights(cfg, ckpt), W.load_weights(dataclasses.replace(cfg, norm_offset=1.0), ckpt)
    assert np.array_equal(offset.norm, (np.float32(1) + plain.norm).astype(np.float32))
    for a, b in zip(plain.layers, offset.layers):
        assert np.array_equal(b.input_layernorm, np.float32(1) + a.input_layernorm)
        assert np.array_equal(b.post_attention_layernorm, np.float32(1) + a.post_attention_layernorm)
        assert np.shares_memory(b.q_proj, a.q_proj)                    # matrices untouched: the same map


def test_random_weights_have_the_tensors_the_config_says():
    cfg = load_config(os.path.join(HF, "llama-gqa"))
    cfg = dataclasses.replace(cfg, qk_norm=True, sandwich_norms=True)
    lw = W.random_weights(cfg).layers[0]
    assert all(getattr(lw, t.name).shape == t.shape(cfg) for t in W.layer_tensors(cfg))
    assert lw.q_bias is None and lw.o_bias is None


def test_no_file_of_the_layer_tests_an_architecture():
    """The layer's variants are data: the NumPy layer, the C layer and the cost model never look at
    model_type or a family's name."""
    files = ["tinydiff/engine/transformer.py", "tinydiff/engine/layer_c.py", "tinydiff/engine/cost.py",
             "csrc/layer.c"]
    for f in files:
        text = open(os.path.join(ROOT, f), encoding="utf-8").read()
        assert "model_type" not in text, f
        assert not re.search(r"""["'](llama|qwen\d?|gemma\d?|llada|dream|mistral)["'](?!s\b)""", text, re.I), f


class _Plus:
    """A checkpoint with more tensors (names -> f32 arrays) than the file holds."""

    def __init__(self, ckpt, extra):
        self.ckpt, self.extra, self.path = ckpt, extra, ckpt.path
        self.names = list(ckpt.names) + list(extra)

    def expect(self, name, shape):
        if name in self.extra:
            assert self.extra[name].shape == tuple(shape)
            return self.extra[name]
        return self.ckpt.expect(name, shape)


def test_the_model_of_a_table_driven_load_runs():
    m = tinydiff.load(os.path.join(HF, "qwen2-bias"))
    assert m.weights.layers[0].q_bias is not None and m.weights.layers[0].q_norm is None
    assert np.isfinite(m.logits([1, 2, 3])).all()
