"""Chat templates rendered as transformers' apply_chat_template renders them, byte for byte.

The templates are five real models' (tests/fixtures/chat/<name>/tokenizer_config.json; its README
says where each comes from); expected.json holds transformers' renderings of the same
conversations (tests/fixtures/make_chat_reference.py).
"""
import json
import os
import re

import pytest

from tinydiff.errors import ModelError, UsageError
from tinydiff.formats.chat_template import ChatTemplate, load_chat_template

CHAT = os.path.join(os.path.dirname(__file__), "fixtures", "chat")
EXPECTED = json.load(open(os.path.join(CHAT, "expected.json"), encoding="utf-8"))
CASES = [(name, i) for name, cases in sorted(EXPECTED["cases"].items()) for i in range(len(cases))]


def test_every_template_is_tested():
    assert set(EXPECTED["cases"]) == {"smollm2", "llama3", "qwen2.5", "llada", "dream", "layout"}


@pytest.mark.parametrize("name, i", CASES)
def test_rendering_equals_transformers(name, i):
    case = EXPECTED["cases"][name][i]
    template = load_chat_template(os.path.join(CHAT, name))
    got = template.render(case["messages"], case["add_generation_prompt"], **EXPECTED["variables"])
    assert got == case["text"]


def test_special_tokens_come_from_the_config_and_nulls_are_left_out():
    assert load_chat_template(os.path.join(CHAT, "qwen2.5")).special_tokens == {
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    assert load_chat_template(os.path.join(CHAT, "llama3")).special_tokens == {
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


def test_a_jinja_file_wins_over_tokenizer_config_and_named_templates_use_default(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ eos_token }}"}],
         "eos_token": {"content": "</s>", "special": True}}))
    assert load_chat_template(str(tmp_path)).render([{"role": "user", "content": "x"}]) == "D</s>"
    (tmp_path / "chat_template.jinja").write_text("J{{ messages[0]['content'] }}")
    assert load_chat_template(str(tmp_path)).render([{"role": "user", "content": "x"}]) == "Jx"


@pytest.mark.parametrize("config, words", [
    ({"chat_template": [{"name": "tool_use", "template": "T"}]}, "no 'default'"),
    ({"chat_template": 3}, "chat_template should be a string"),
    ({"chat_template": "x", "bos_token": 5}, "bos_token should be a string"),
])
def test_bad_template_files_are_model_errors(tmp_path, config, words):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=words):
        load_chat_template(str(tmp_path))


@pytest.mark.parametrize("source, error, words", [
    ("{{ messages.__class__.__mro__[1].__subclasses__() }}", ModelError, "the sandbox forbids"),
    ("{{ 1 / 0 }}", ModelError, "the chat template fails: ZeroDivisionError"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", ModelError, "RecursionError"),
    ("{{ raise_exception('Only user and assistant roles are supported!') }}", UsageError,
     "refuses this conversation: Only user and assistant roles are supported!"),
    ("{% for m in messages %}", ModelError, "does not compile (line 1)"),
])
def test_a_template_that_fails_is_one_line_naming_it(source, error, words):
    t = ChatTemplate(source, where="t.jinja")
    with pytest.raises(error, match=re.escape("t.jinja: ") + ".*" + re.escape(words)):
        t.render([{"role": "user", "content": "x"}])


def test_transformers_generation_tag_renders_its_body():
    t = ChatTemplate("{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}")
    assert t.render([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]) == "<a><b>"


def test_special_tokens_map_fills_what_tokenizer_config_leaves_out(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ bos_token }}{{ eos_token }}",
                                                                "eos_token": "</s>"}))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"bos_token": {"content": "<s>"}, "eos_token": "<e>"}))
    assert load_chat_template(str(tmp_path)).render([{"role": "user", "content": "x"}]) == "<s></s>"


def test_tojson_does_not_escape_html_as_transformers_does_not():
    t = ChatTemplate("{{ messages[0] | tojson }}")
    assert t.render([{"role": "user", "content": "<b>é</b>"}]) == '{"role": "user", "content": "<b>é</b>"}'
