"""tinydiff.formats.tokenizer against Hugging Face `tokenizers`.

The fixtures in tests/fixtures/tokenizers/ (made by tests/fixtures/make_tokenizer_fixtures.py)
hold four small trained tokenizers shaped like GPT-2, Llama-3, Qwen2 and a Roberta-like one
with "a b" merges, plus the ids and decodes `tokenizers` gave for tricky texts. Those tests
run everywhere. Where `tokenizers` is installed, property tests also compare the two on
random text.
"""
import json
import unicodedata
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinydiff.errors import ModelError, UsageError
from tinydiff.formats.pretokenizer import Split, compile_regex
from tinydiff.formats.tokenizer import Tokenizer, bpe_merge

try:  # only the comparison tests need it; tinydiff itself never imports it
    import tokenizers as hf
except ImportError:
    hf = None
needs_hf = pytest.mark.skipif(hf is None, reason="needs the Hugging Face tokenizers library")

FIXTURES = Path(__file__).parent / "fixtures" / "tokenizers"
CASES = json.loads((FIXTURES / "cases.json").read_text(encoding="utf-8"))
NAMES = sorted(CASES)
ALL_CASES = [pytest.param(name, case, id=f"{name}-{i}") for name in NAMES for i, case in enumerate(CASES[name])]


@lru_cache(maxsize=None)
def load(name):
    return Tokenizer.from_file(FIXTURES / f"{name}.json")


def spec(name):
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


def write(tmp_path, obj):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


# --- recorded cases -----------------------------------------------------------

@pytest.mark.parametrize("name,case", ALL_CASES)
def test_encode_matches_recorded(name, case):
    tok = load(name)
    assert tok.encode(case["text"]) == case["ids"]
    assert tok.encode(case["text"], add_special_tokens=False) == case["ids_plain"]


@pytest.mark.parametrize("name,case", ALL_CASES)
def test_decode_matches_recorded(name, case):
    tok = load(name)
    assert tok.decode(case["ids"]) == case["decoded"]
    assert tok.decode(case["ids"], skip_special_tokens=True) == case["decoded_skip"]


LOSSLESS = {"gpt2": lambda s: s, "llama3": lambda s: s, "qwen2": lambda s: unicodedata.normalize("NFC", s)}


@pytest.mark.parametrize("name", sorted(LOSSLESS))
@settings(max_examples=200, deadline=None)
@given(text=st.text(st.characters(exclude_categories=("Cs",))))
def test_round_trip(name, text):
    tok = load(name)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == LOSSLESS[name](text)


def test_skip_special_tokens():
    tok = load("qwen2")
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert tok.token_to_id("<|im_start|>") in ids
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_special_tokens_matched_even_without_add_special_tokens():
    tok = load("gpt2")
    eot = tok.token_to_id("<|endoftext|>")
    assert tok.encode("a<|endoftext|>b", add_special_tokens=False).count(eot) == 1


def test_llama3_template_adds_bos_only():
    tok = load("llama3")
    ids = tok.encode("Hello")
    assert ids[0] == tok.bos_id == tok.token_to_id("<|begin_of_text|>")
    assert ids[1:] == tok.encode("Hello", add_special_tokens=False)
    assert tok.eos_id == tok.token_to_id("<|end_of_text|>")


def test_properties():
    gpt2, qwen2, legacy = load("gpt2"), load("qwen2"), load("legacy")
    assert gpt2.vocab_size == 1000 and gpt2.bos_id is None and gpt2.eos_id == gpt2.token_to_id("<|endoftext|>")
    assert qwen2.bos_id is None and qwen2.eos_id == qwen2.token_to_id("<|endoftext|>")
    assert qwen2.special_ids == {qwen2.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    assert legacy.vocab_size == max(e["id"] for e in spec("legacy")["added_tokens"]) + 1
    assert (legacy.bos_id, legacy.eos_id) == (legacy.token_to_id("<s>"), legacy.token_to_id("</s>"))
    assert legacy.token_to_id("stop") not in legacy.special_ids
    for i in (0, 5, 300, 999):
        assert gpt2.token_to_id(gpt2.id_to_token(i)) == i
    assert gpt2.id_to_token(1000) is None and gpt2.id_to_token(-1) is None
    assert gpt2.token_to_id("no such token") is None


def test_decode_bytes_streams_across_token_boundaries():
    tok = load("gpt2")
    text = "鏞𐹾 ok"  # characters the fixture has no merges for: one token per byte
    ids = tok.encode(text)
    pieces = [tok.decode_bytes([i]) for i in ids]
    assert b"".join(pieces) == tok.decode_bytes(ids) == text.encode("utf-8")
    assert pieces[0] == "鏞".encode("utf-8")[:1]
    assert tok.decode(ids[:1]) == "\ufffd"


def test_unknown_ids_are_skipped_in_a_models_output_and_refused_from_a_caller():
    tok = load("gpt2")
    assert tok.text([tok.token_to_id("a"), 10**6, tok.token_to_id("b")]) == "ab"       # as tokenizers does
    with pytest.raises(UsageError, match="not a token id"):
        tok.decode([tok.token_to_id("a"), 10**6])


def test_non_utf8_argv_bytes_survive():
    """Python hands invalid UTF-8 in argv over as surrogate escapes; they become raw bytes."""
    tok = load("gpt2")
    assert tok.decode_bytes(tok.encode("a\udcff")) == b"a\xff"


def test_lone_surrogate_is_a_usage_error():
    with pytest.raises(UsageError, match=r"U\+D800"):
        load("gpt2").encode("a\ud800b")


def test_numpy_ids_decode():
    tok = load("gpt2")
    ids = tok.encode("hello world")
    assert tok.decode(np.array(ids)) == tok.decode(ids) == "hello world"
    assert tok.id_to_token(np.int64(ids[0])) == tok.id_to_token(ids[0])


def test_long_runs_encode():
    """A single pre-token of 100k characters goes through the heap merge loop."""
    tok = load("gpt2")
    for text in (" " * 100_000, "7" * 100_000):
        assert tok.decode(tok.encode(text)) == text


# --- post-processors, by editing a fixture ------------------------------------

@pytest.mark.parametrize("processor,expect", [
    ({"type": "BertProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]}, ([0], [2])),
    ({"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]}, ([0], [2])),
    ({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                               {"Sequence": {"id": "A", "type_id": 0}},
                                               {"SpecialToken": {"id": "</s>", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]},
                         "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}, ([0], [2])),
    ({"type": "Sequence", "processors": [{"type": "ByteLevel"},
                                         {"type": "BertProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]}]}, ([0], [2])),
    ({"type": "ByteLevel"}, ([], [])),
    (None, ([], [])),
])
def test_post_processors(tmp_path, processor, expect):
    obj = spec("legacy")
    obj["post_processor"] = processor
    tok = Tokenizer.from_file(write(tmp_path, obj))
    plain = tok.encode("hello there", add_special_tokens=False)
    assert tok.encode("hello there") == expect[0] + plain + expect[1]


# --- pieces -------------------------------------------------------------------

def test_bpe_merge_lowest_rank_leftmost_first():
    a, b, ab, abb = 0, 1, 2, 3
    merges = {(a, b): (0, ab), (ab, b): (1, abb), (b, b): (2, 9)}
    assert bpe_merge([a, b, b], merges) == [abb]       # (a b) first, then (ab b)
    assert bpe_merge([b, b, b], merges) == [9, b]      # leftmost pair first
    assert bpe_merge([], merges) == []


def test_regex_classes_follow_unicode_not_python():
    assert compile_regex(r"\s+").findall("a\x1c\x1fb\x85\u3000c") == ["\x85\u3000"]  # \x1c-\x1f are not space
    assert compile_regex(r"\S+").findall("a\x1cb c") == ["a\x1cb", "c"]
    assert compile_regex(r"\p{L}+").findall("é日本x1ª") == ["é日本x", "ª"]
    assert compile_regex(r"\p{N}+").findall("x12½Ⅷ٣y") == ["12½Ⅷ٣"]
    assert compile_regex(r"[^\s\p{L}\p{N}]+").findall("a!?\u00a0€b") == ["!?", "€"]
    assert compile_regex(r"\P{L}+").findall("ab12 c") == ["12 "]
    assert compile_regex(r"\pN\x{263A}").findall("1☺") == ["1☺"]
    assert compile_regex(r"[]a]+").findall("]a]b") == ["]a]"]


# Expected pieces recorded from tokenizers' Split pre-tokenizer.
@pytest.mark.parametrize("pattern,behavior,invert,text,expect", [
    (r"\d", "MergedWithNext", False, "ab12cd3", ["ab", "1", "2cd", "3"]),
    (r"\d", "MergedWithPrevious", False, "ab12cd3", ["ab1", "2", "cd3"]),
    (r"\p{N}", "Contiguous", False, "ab12cd3", ["ab", "12", "cd", "3"]),
    (r"\-", "Removed", True, "a-b--c", ["-", "-", "-"]),
    (r"\-", "Removed", False, "a-b--c", ["a", "b", "c"]),
    (r"\-", "Isolated", False, "a-b--c", ["a", "-", "b", "-", "-", "c"]),
])
def test_split_behaviors(pattern, behavior, invert, text, expect):
    assert Split(compile_regex(pattern), behavior, invert)(text) == expect


# --- bad files ----------------------------------------------------------------

def assert_one_line_error(path, *words):
    with pytest.raises(ModelError) as err:
        Tokenizer.from_file(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    for word in words:
        assert word in message
    return message


def test_missing_file(tmp_path):
    assert_one_line_error(tmp_path / "nope.json", "cannot read")


def test_corrupt_json(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text((FIXTURES / "gpt2.json").read_text(encoding="utf-8")[:5000], encoding="utf-8")
    assert_one_line_error(path, "not valid JSON")


def test_not_utf8(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(b'{"model": "\xff"}')
    assert_one_line_error(path, "UTF-8")


@pytest.mark.parametrize("field,value,word", [
    ("model", {"type": "WordPiece", "vocab": {}, "unk_token": "[UNK]"}, "WordPiece"),
    ("model", {"type": "Unigram", "vocab": []}, "Unigram"),
    ("normalizer", {"type": "Replace", "pattern": {"Regex": "a"}, "content": "b"}, "regex"),
    ("normalizer", {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Strip"}]}, "Strip"),
    ("pre_tokenizer", {"type": "Metaspace", "replacement": "_"}, "Metaspace"),
    ("pre_tokenizer", {"type": "Split", "pattern": {"Regex": r"\p{Han}+"}, "behavior": "Isolated",
                       "invert": False}, "Han"),
    ("pre_tokenizer", {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways",
                       "invert": False}, "Sideways"),
    ("decoder", {"type": "WordPiece", "prefix": "##"}, "WordPiece"),
    ("decoder", None, "decoder"),
    ("post_processor", {"type": "Weird"}, "Weird"),
])
def test_unsupported_component(tmp_path, field, value, word):
    obj = spec("gpt2")
    obj[field] = value
    assert_one_line_error(write(tmp_path, obj), word)


@pytest.mark.parametrize("edit,word", [
    (lambda m: m.update(dropout=0.1), "dropout"),
    (lambda m: m.update(continuing_subword_prefix="##"), "continuing_subword_prefix"),
    (lambda m: m["merges"].append(["zz", "q"]), "zz"),
    (lambda m: m["merges"].append("a b c"), "not a pair"),
    (lambda m: m.pop("vocab"), "vocab"),
])
def test_bad_bpe_model(tmp_path, edit, word):
    obj = spec("gpt2")
    edit(obj["model"])
    assert_one_line_error(write(tmp_path, obj), word)


def test_top_level_not_an_object(tmp_path):
    assert_one_line_error(write(tmp_path, [1, 2]), "not a JSON object")


# --- ids and JSON types the file gets wrong -----------------------------------

@pytest.mark.parametrize("big", [2**63, 2**40, 2**28, 1001])
def test_id_beyond_the_file_is_refused_before_anything_is_sized_by_it(tmp_path, big):
    obj = spec("gpt2")          # 1000 vocab entries + 1 added token: ids 0..1000 at most
    obj["added_tokens"][0]["id"] = big
    message = assert_one_line_error(write(tmp_path, obj), str(big), "outside")
    assert obj["added_tokens"][0]["content"] in message


@pytest.mark.parametrize("edit,words", [
    (lambda m: m["vocab"].update(a=-1), ["-1", "'a'"]),
    (lambda m: m["vocab"].update(a=m["vocab"]["b"]), ["to both"]),
    (lambda m: m["vocab"].pop("~"), ["'~'", "0x7e"]),
])
def test_bad_vocabulary_is_refused(tmp_path, edit, words):
    """Before: encode("a") == [-1], "ab" decoded as "bb", encode("~") == []."""
    obj = spec("gpt2")
    obj["merges"] = []
    obj["model"]["merges"] = [m for m in obj["model"]["merges"] if "a" not in m and "~" not in m]
    edit(obj["model"])
    assert_one_line_error(write(tmp_path, obj), *words)


def test_post_processor_id_outside_the_vocabulary(tmp_path):
    obj = spec("llama3")
    obj["post_processor"] = {"type": "RobertaProcessing", "cls": ["<s>", 5000], "sep": ["</s>", 1]}
    assert_one_line_error(write(tmp_path, obj), "post_processor", "5000")


@pytest.mark.parametrize("depth", [100_000, 400])
def test_json_nested_too_deeply_is_one_line(tmp_path, depth):
    """Before: a RecursionError traceback (from json for 100k brackets, from our Sequence walk for 400)."""
    obj = spec("gpt2")
    step = {"type": "NFC"}
    for _ in range(min(depth, 400)):
        step = {"type": "Sequence", "normalizers": [step]}
    obj["normalizer"] = step
    path = write(tmp_path, obj) if depth == 400 else tmp_path / "tokenizer.json"
    if depth != 400:
        path.write_text('{"model": ' + "[" * depth + "]" * depth + "}")
    assert_one_line_error(path, "nested too deeply")


def _paths(obj, path=()):
    """Every (path, value) in a tokenizer.json, a few items of each long list or object."""
    yield path, obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else []
    for n, (key, value) in enumerate(items):
        if n < 3 or len(obj) < 8:
            yield from _paths(value, path + (key,))


SPECS = {name: spec(name) for name in ("gpt2", "llama3", "qwen2", "legacy")}
PATHS = [(name, path) for name, obj in SPECS.items() for path, _ in _paths(obj) if path]
WRONG = [None, 0, -1, 2**64, 1.5, True, "", "x", "a\nb", [], [1, "a"], {}, {"type": "ByteLevel"}]
PYTHON_WORDS = ("NoneType", "has no attribute", "subscriptable", "not iterable", "unhashable",
                "object of type", "argument", "index out of range", "invalid literal")


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(PATHS), st.sampled_from(WRONG))
def test_any_wrong_json_type_is_one_line_naming_the_field(tmp_path_factory, where, value):
    """Every value of every tokenizer.json swapped for another JSON type: the file loads, or
    the error names the field (before: 'bad tokenizer: 'NoneType' object has no attribute ...')."""
    name, path = where
    obj = json.loads(json.dumps(SPECS[name]))
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    target = write(tmp_path_factory.mktemp("t"), obj)
    try:
        Tokenizer.from_file(target).encode("Hello <s> world ~ 123")
    except ModelError as e:
        message = str(e)
        assert "\n" not in message and str(target) in message
        assert not any(w in message for w in PYTHON_WORDS), message
        keys = [k for k in path if isinstance(k, str)]
        assert any(k in message for k in keys) or "model.vocab" in message or "merge" in message, message


# --- against tokenizers, where installed --------------------------------------

# Pieces that random text rarely hits: special tokens, contractions, whitespace kinds,
# normalization cases. Characters are limited to those assigned in Unicode 14 (Python
# 3.11's unicodedata), since `tokenizers` may know newer ones (see pretokenizer.py).
FRAGMENTS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<s>", "</s>", "<mask>",
             "stop", "STOP", "ñandú", "Café", " ", "  ", "\n", "\r\n", "\t", "'s", "'LL", "'ſ", "123456",
             "e\u0301", "ΟΣ", "\x1c", "\u00a0", "\u3000", "\x85", "\x00", "İ", "ﬁ", "①", "👨‍👩‍👧"]
CHARS = st.characters(exclude_categories=("Cs", "Cn"))
TEXTS = st.lists(st.one_of(st.text(CHARS, max_size=8), st.sampled_from(FRAGMENTS)), max_size=12).map("".join)


@lru_cache(maxsize=None)
def reference(path):
    return hf.Tokenizer.from_file(str(path))


def assert_same(ours, ref, text):
    for special in (True, False):
        assert ours.encode(text, add_special_tokens=special) == ref.encode(text, add_special_tokens=special).ids
    ids = ref.encode(text).ids
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)


@needs_hf
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=300, deadline=None)
@given(text=TEXTS)
def test_same_as_tokenizers(name, text):
    assert_same(load(name), reference(FIXTURES / f"{name}.json"), text)


@needs_hf
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=100, deadline=None)
@given(text=st.text(CHARS))
def test_same_as_tokenizers_plain_text(name, text):
    assert_same(load(name), reference(FIXTURES / f"{name}.json"), text)


@needs_hf
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_decode_random_ids_same_as_tokenizers(name, data):
    """Random ids cut characters apart: both must replace the same broken bytes."""
    ours, ref = load(name), reference(FIXTURES / f"{name}.json")
    ids = data.draw(st.lists(st.integers(0, ours.vocab_size - 1), max_size=20))
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)


SPLIT_PATTERNS = [{"Regex": r"\s+|\p{P}"}, {"Regex": r"\p{N}"}, {"Regex": r"[\p{Lu}\p{Lt}]\p{Ll}*|\P{L}"},
                  {"String": "a"}, {"String": " "}]
BEHAVIORS = ["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"]


@needs_hf
@pytest.mark.parametrize("pattern", SPLIT_PATTERNS, ids=lambda p: repr(p))
@pytest.mark.parametrize("behavior", BEHAVIORS)
@pytest.mark.parametrize("invert", [False, True])
def test_split_same_as_tokenizers(tmp_path, pattern, behavior, invert):
    obj = spec("gpt2")
    obj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]}
    path = write(tmp_path, obj)
    ours, ref = Tokenizer.from_file(path), hf.Tokenizer.from_file(str(path))
    words = ["a", " ", "aa", "  ", "1", "12", ".", "Ab", "x²", "e\u0301", "_", "日本", "ΣΑ"]

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.one_of(st.text(CHARS, max_size=4), st.sampled_from(words)), max_size=10).map("".join))
    def check(text):
        assert ours.encode(text) == ref.encode(text).ids

    check()


# --- SentencePiece-style tokenizer.json (Gemma's, Llama 2's): byte fallback, ▁ for spaces -------

SPM_CASES = json.loads((FIXTURES / "spm_json_cases.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["gemma", "llama2"])
def test_sentencepiece_style_files_match_tokenizers(name):
    """Made by tests/fixtures/make_spm_json_fixtures.py with `tokenizers`: a BPE with byte_fallback,
    normalizer Replace " " -> "▁" (Llama 2: Prepend "▁" first), decoder Replace, ByteFallback,
    Fuse (Llama 2: Strip one leading space)."""
    tok = Tokenizer.from_file(FIXTURES / f"{name}.json")
    byte_ids = {tok.token_to_id(f"<0x{b:02X}>") for b in range(256)}
    assert any(byte_ids & set(case["ids"]) for case in SPM_CASES[name])   # the fallback is exercised
    for case in SPM_CASES[name]:
        assert tok.encode(case["text"]) == case["ids"], case["text"]
        assert tok.encode(case["text"], add_special_tokens=False) == case["ids_plain"]
        assert tok.decode(case["ids"]) == case["decoded"]
        assert tok.decode(case["ids"], skip_special_tokens=True) == case["decoded_skip"]


def test_byte_fallback_without_unk_needs_every_byte_token(tmp_path):
    obj = spec("gemma")
    obj["model"]["unk_token"] = None
    del obj["model"]["vocab"]["<0x41>"]
    assert_one_line_error(write(tmp_path, obj), "<0x41>", "byte_fallback")


@pytest.mark.parametrize("decoder, word", [
    ({"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "ByteFallback"}]}, "ByteFallback"),
    ({"type": "Sequence", "decoders": [{"type": "Strip", "content": " ", "start": 1, "stop": 0}]}, "Strip"),
    ({"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"Regex": "x"}, "content": " "}]}, "Replace"),
])
def test_decoder_sequences_tinydiff_does_not_read_are_refused(tmp_path, decoder, word):
    obj = spec("gemma")
    obj["decoder"] = decoder
    assert_one_line_error(write(tmp_path, obj), word)
