"""Chat: templates on a model, the conversation kept in the KV cache, `tinydiff chat`, generation_config.json."""
import json
import os
import shutil

import pytest
from test_cli import assert_one_line_error, run

import tinydiff
from tinydiff.chat import Chat
from tinydiff.errors import ModelError, UsageError
from tinydiff.formats.chat_template import ChatTemplate

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
ALTERNATE = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
             "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
             "{% endif %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] ")


def with_template(tmp_path, template=CHATML, src="llama-gqa", generation=None, name="chat"):
    """A copy of a fixture model with a chat template (and a generation_config.json if given)."""
    out = tmp_path / name
    shutil.copytree(os.path.join(HF, src), out, ignore=shutil.ignore_patterns("*.npy"))
    json.dump({"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"},
              open(out / "tokenizer_config.json", "w"))
    if generation is not None:
        json.dump(generation, open(out / "generation_config.json", "w"))
    return str(out)


def common_prefix(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_the_template_renders_the_conversation_and_its_ids_add_no_bos(tmp_path):
    model = tinydiff.load(with_template(tmp_path))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = model.render_chat(messages)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert model.render_chat(messages, add_generation_prompt=False).endswith("Hi<|im_end|>\n")
    assert model.chat_ids(messages) == model.tokenizer.encode(text, add_special_tokens=False)


def test_a_later_turn_prefills_only_what_the_cache_does_not_hold_and_answers_as_a_fresh_chat(tmp_path):
    model = tinydiff.load(with_template(tmp_path))
    chat = Chat(model, system="Be brief.")
    first = "".join(chat.send("Hello there", 10, temperature=0))
    ids1, cached = chat.ids, list(chat.cached)
    assert chat.last_prefill == len(ids1) and len(cached) == len(ids1) + 9   # the last new token never ran
    with tinydiff.Ledger() as led:
        second = "".join(chat.send("And then?", 10, temperature=0))
    reused = common_prefix(chat.ids, cached)
    assert reused >= len(ids1)                  # the whole first prompt at least
    assert chat.last_prefill == len(chat.ids) - reused == led.passes[0]["tokens"]
    assert sum(p["tokens"] for p in led.passes) == chat.last_prefill + 9
    assert first == model.chat(chat.messages[:2], 10, temperature=0)
    assert second == model.chat(chat.messages[:-1], 10, temperature=0)
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant", "user", "assistant"]
    chat.reset()
    assert chat.messages == [{"role": "system", "content": "Be brief."}] and chat.cached == []


def test_an_answer_cut_short_is_kept_as_far_as_it_went(tmp_path):
    model = tinydiff.load(with_template(tmp_path))
    chat = Chat(model)
    pieces = chat.send("Tell me a story", 20, temperature=0)
    said = next(pieces) + next(pieces)
    pieces.close()
    assert chat.messages[-1] == {"role": "assistant", "content": said}
    after = "".join(chat.send("Go on", 8, temperature=0))
    assert after == model.chat(chat.messages[:-1], 8, temperature=0)


def test_a_turn_that_fails_leaves_the_conversation_as_it_was(tmp_path):
    model = tinydiff.load(with_template(tmp_path, ALTERNATE))
    chat = Chat(model, n_ctx=64)
    "".join(chat.send("Hi", 4, temperature=0))
    kept = [dict(m) for m in chat.messages]
    with pytest.raises(UsageError, match="exceed the context of 64 positions"):
        chat.send("a long question " * 20, 4)
    assert chat.messages == kept
    chat.messages.append({"role": "user", "content": "two users in a row"})
    with pytest.raises(UsageError, match="the chat template refuses this conversation: Conversation roles must alternate"):
        chat.send("Hi again", 4)
    chat.messages.pop()
    assert "".join(chat.send("Bye", 4, temperature=0)) == model.chat(chat.messages[:-1], 4, temperature=0)


@pytest.mark.parametrize("messages, words", [
    ([], "non-empty list"),
    ([{"role": "robot", "content": "beep"}], "message 0 has role 'robot'"),
    ([{"role": "user"}], "message 0 must be a dict with 'role' and 'content'"),
    ([{"role": "user", "content": 3}], "message 0: content must be text"),
])
def test_bad_messages_are_usage_errors(tmp_path, messages, words):
    model = tinydiff.load(with_template(tmp_path))
    with pytest.raises(UsageError, match=words):
        model.chat_ids(messages)


def test_a_model_without_a_template_cannot_chat():
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    with pytest.raises(UsageError, match="has no chat template"):
        Chat(model)


def test_a_template_that_does_not_compile_stops_a_chat_not_the_model(tmp_path):
    model = tinydiff.load(with_template(tmp_path, "{% for m in messages %}"))
    assert len(model.generate_ids([5, 6], 3, temperature=0)) == 3
    with pytest.raises(ModelError, match=r"tokenizer_config.json: the chat template does not compile \(line 1\)"):
        Chat(model)


def test_a_new_turn_ends_an_answer_still_being_read(tmp_path):
    model = tinydiff.load(with_template(tmp_path))
    chat = Chat(model)
    first = chat.send("Hello", 10, temperature=0)
    said = next(first)
    second = "".join(chat.send("Again", 6, temperature=0))
    first.close()                             # too late to change anything
    assert chat.messages == [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": said},
                             {"role": "user", "content": "Again"}, {"role": "assistant", "content": second}]
    assert second == model.chat(chat.messages[:3], 6, temperature=0)


def test_an_answer_stopped_before_its_first_piece_leaves_no_turn(tmp_path):
    model = tinydiff.load(with_template(tmp_path))
    chat = Chat(model, system="S")
    chat.send("Hello", 10, temperature=0)     # never read
    chat.reset()
    assert chat.messages == [{"role": "system", "content": "S"}]
    pieces = chat.send("Hello", 10, temperature=0)
    pieces.close()
    assert chat.messages == [{"role": "system", "content": "S"}]


def test_the_template_travels_into_gguf(tmp_path):
    from tinydiff.convert import convert
    folder = with_template(tmp_path)
    convert(folder, str(tmp_path / "m.gguf"), "f32")
    gguf, hf = tinydiff.load(str(tmp_path / "m.gguf")), tinydiff.load(folder)
    messages = [{"role": "user", "content": "Hi"}]
    assert gguf.chat_template.source == CHATML
    assert gguf.chat_ids(messages) == hf.chat_ids(messages)


def test_chat_refuses_mode_ar_on_a_diffusion_model(tmp_path):
    from test_diffusion_models import write_llada
    folder = tmp_path / "llada"
    write_llada(os.path.join(HF, "llama-gqa"), str(folder), mask_token_id=2)
    json.dump({"chat_template": CHATML}, open(folder / "tokenizer_config.json", "w"))
    status, _, err = run("chat", "-m", str(folder), "--mode", "ar")
    assert_one_line_error(status, err, 2, "is a masked-diffusion model", "--mode diffusion")


def test_a_diffusion_model_answers_on_a_canvas_after_the_history(tmp_path):
    from test_diffusion_models import write_llada
    folder = tmp_path / "llada"
    write_llada(os.path.join(HF, "llama-gqa"), str(folder), mask_token_id=2)
    json.dump({"chat_template": CHATML}, open(folder / "tokenizer_config.json", "w"))
    model = tinydiff.load(str(folder))
    chat = Chat(model)
    steps = []
    answer = "".join(chat.send("Hi", 8, steps=4, on_step=lambda *s: steps.append(s[0])))
    assert steps == [0, 1, 2, 3]
    assert answer == model.chat([{"role": "user", "content": "Hi"}], 8, steps=4)


# -- tinydiff chat --------------------------------------------------------------------------------

def test_chat_answers_each_line_resets_and_survives_a_turn_that_fails(tmp_path):
    folder = with_template(tmp_path)
    model = tinydiff.load(folder)
    one = model.chat([{"role": "user", "content": "Hello"}], 6, temperature=0)
    status, out, err = run("chat", "-m", folder, "-n", "6", "--temp", "0", "-c", "80",
                           stdin=("Hello\n" + "too long " * 20 + "\n/reset\nHello\n/exit\nnever read\n").encode())
    assert status == 0 and "Traceback" not in err
    assert out.split("\n")[:-1] == [one, "(the conversation is forgotten)", one]
    assert err.count("tinydiff: error:") == 1 and "exceed the context of 80 positions" in err


def test_a_converted_gguf_keeps_every_eos_id_as_a_stop(tmp_path):
    from tinydiff.convert import convert
    folder = with_template(tmp_path, generation={"eos_token_id": [0, 5, 6]})
    convert(folder, str(tmp_path / "m.gguf"), "f32")
    assert tinydiff.load(str(tmp_path / "m.gguf")).stop_ids == tinydiff.load(folder).stop_ids >= {0, 5, 6}


def test_chat_flags_are_checked(tmp_path):
    folder = with_template(tmp_path)
    status, _, err = run("chat", "-m", folder, "-n", "0")
    assert_one_line_error(status, err, 2, "-n/--n-predict must be >= 1")
    status, _, err = run("chat", "-m", os.path.join(HF, "llama-gqa"))
    assert_one_line_error(status, err, 2, "has no chat template")
    status, _, err = run("chat", "-m", folder, "--steps", "4")
    assert_one_line_error(status, err, 2, "--steps is a flag of masked diffusion")
    status, _, err = run("chat", "-m", folder, "-c", "0")
    assert_one_line_error(status, err, 2, "context must be an integer in 1..")
    status, _, err = run("chat", "-m", folder, "--chat-template-file", str(tmp_path / "nope.jinja"))
    assert_one_line_error(status, err, 2, "nope.jinja: cannot read")


def test_chat_template_file_replaces_the_models(tmp_path):
    folder = with_template(tmp_path)
    (tmp_path / "t.jinja").write_text(ALTERNATE)
    model = tinydiff.load(folder)
    model.chat_template = ChatTemplate(ALTERNATE)
    expected = model.chat([{"role": "user", "content": "Hi"}], 5, temperature=0)
    status, out, err = run("chat", "-m", folder, "-n", "5", "--temp", "0", "--chat-template-file",
                           str(tmp_path / "t.jinja"), stdin=b"Hi\n")
    assert status == 0, err
    assert out.splitlines() == [expected]


# -- generation_config.json -------------------------------------------------------------------------

def test_generation_config_eos_ids_join_the_stop_set(tmp_path):
    plain = tinydiff.load(os.path.join(HF, "llama-gqa"))
    first = plain.generate_ids([5, 6, 7], 8, temperature=0)
    model = tinydiff.load(with_template(tmp_path, generation={"eos_token_id": [0, first[2]]}))
    assert first[2] in model.stop_ids and plain.stop_ids <= model.stop_ids
    assert model.generate_ids([5, 6, 7], 8, temperature=0) == first[:3]


def test_generation_config_sampling_is_the_default_and_a_flag_overrides_it(tmp_path):
    greedy = tinydiff.load(with_template(tmp_path, generation={"do_sample": False}, name="greedy"))
    assert dict(greedy.config.sampling_defaults) == {"temperature": 0.0}
    plain = tinydiff.load(os.path.join(HF, "llama-gqa"))
    want = plain.generate_ids([5, 6, 7], 8, temperature=0)
    assert greedy.generate_ids([5, 6, 7], 8, seed=1) == greedy.generate_ids([5, 6, 7], 8, seed=2) == want
    sampled = tinydiff.load(with_template(tmp_path, generation={"do_sample": True, "temperature": 0.6, "top_p": 0.9},
                                          name="sampled"))
    assert dict(sampled.config.sampling_defaults) == {"temperature": 0.6, "top_k": 50, "top_p": 0.9, "min_p": 0.0}
    penalised = tinydiff.load(with_template(tmp_path, generation={"repetition_penalty": 1.05}, name="penalised"))
    assert dict(penalised.config.sampling_defaults) == {"repeat_penalty": 1.05, "repeat_last_n": 256}
    assert sampled.generate_ids([5, 6, 7], 8, temperature=0) == want
    status, out, _ = run("generate", "-m", os.path.join(tmp_path, "greedy"), "-p", "Hi", "-n", "6", "-s", "3",
                         "--no-display-prompt")
    assert out == plain.generate("Hi", 6, temperature=0) + "\n"
    status, out2, _ = run("generate", "-m", os.path.join(tmp_path, "greedy"), "-p", "Hi", "-n", "6", "-s", "3",
                          "--temp", "5", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--no-display-prompt")
    assert out2 == plain.generate("Hi", 6, temperature=5, top_k=0, top_p=1, min_p=0, seed=3) + "\n"


@pytest.mark.parametrize("generation, words", [
    ({"do_sample": "yes"}, "field 'do_sample' should be true or false"),
    ({"do_sample": True, "temperature": "hot"}, "field 'temperature' should be a number a sampler takes"),
    ({"do_sample": True, "top_p": 0}, "field 'top_p' should be a number a sampler takes, got 0"),
    ({"repetition_penalty": -1}, "field 'repetition_penalty' should be a number a sampler takes"),
    ({"eos_token_id": 10 ** 6}, "field 'eos_token_id' is 1000000, outside the vocabulary"),
])
def test_a_bad_generation_config_is_a_model_error_naming_the_field(tmp_path, generation, words):
    with pytest.raises(ModelError, match=r"generation_config.json: " + words):
        tinydiff.load(with_template(tmp_path, generation=generation))


def test_ctrl_c_stops_the_answer_and_keeps_it_and_the_chat_goes_on(tmp_path, monkeypatch, capsys):
    import argparse

    from tinydiff import cli
    model = tinydiff.load(with_template(tmp_path))
    chat = Chat(model)
    generate = chat._generate

    def interrupted(*args):          # the answer's first two pieces, then Ctrl-C
        pieces = generate(*args)
        yield next(pieces)
        yield next(pieces)
        raise KeyboardInterrupt

    monkeypatch.setattr(chat, "_generate", interrupted)
    cli._answer(chat, "Hello", argparse.Namespace(n_predict=10, visual=False), {"temperature": 0})
    said = capsys.readouterr().out
    assert said.endswith("\n") and chat.messages[-1] == {"role": "assistant", "content": said[:-1]}
    monkeypatch.undo()
    cli._answer(chat, "Go on", argparse.Namespace(n_predict=5, visual=False), {"temperature": 0})
    assert capsys.readouterr().out == model.chat(chat.messages[:-1], 5, temperature=0) + "\n"


def test_chat_with_a_diffusion_model_and_visual_prints_each_answer(tmp_path):
    from test_diffusion_models import write_llada
    folder = tmp_path / "llada"
    write_llada(os.path.join(HF, "llama-gqa"), str(folder), mask_token_id=2)
    json.dump({"chat_template": CHATML}, open(folder / "tokenizer_config.json", "w"))
    model = tinydiff.load(str(folder))
    first = model.chat([{"role": "user", "content": "Hi"}], 8, steps=4)
    second = model.chat([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": first},
                         {"role": "user", "content": "More"}], 8, steps=4)
    status, out, err = run("chat", "-m", str(folder), "-n", "8", "--steps", "4", "--visual", stdin=b"Hi\nMore\n")
    assert status == 0, err
    assert out == first + "\n" + second + "\n"
