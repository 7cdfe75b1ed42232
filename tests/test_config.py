import json

import pytest

from tinydiff.engine.config import config_from_dict, load_config
from tinydiff.errors import ModelError

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
    assert cfg(head_dim=32).q_dim == 128
    assert cfg(num_key_value_heads=None).num_key_value_heads == 4


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
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling"),
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
