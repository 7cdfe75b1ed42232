"""SentencePiece vocabularies from GGUF (formats/sentencepiece.py): a small vocabulary made here
(always runs: merges by score, byte fallback, special tokens, the space prefix, BOS/EOS, decoding,
bad files), the merge pinned to a readable reference on random vocabularies, and the two real GGUF
files' vocabularies against llama.cpp and transformers (where the files are installed).

Ground truth for the real files is tests/fixtures/tokenizers/gguf_real_cases.json, made by
tests/fixtures/make_gguf_vocab_reference.py with llama.cpp's llama-tokenize and transformers 5.25.
Where the two disagree, tinydiff follows llama.cpp, which there also does what the model's own
tokenizer does; the tests at the end say which cases and why.
"""
import json
import math
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinydiff.errors import ModelError, UsageError
from tinydiff.formats.gguf import open_gguf, write_gguf
from tinydiff.formats.sentencepiece import SentencePieceTokenizer, spm_merge
from tinydiff.formats.tokenizer import Tokenizer

from real_models import GEMMA3, SMOLLM2, real_model

CASES = os.path.join(os.path.dirname(__file__), "fixtures", "tokenizers", "gguf_real_cases.json")
SMALL_CASES = os.path.join(os.path.dirname(__file__), "fixtures", "tokenizers", "spm_small_llama_cpp.json")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


# --- a small vocabulary, made here ----------------------------------------------------------------

def small_vocab(**flags):
    """tokenizer.ggml.* of a Llama-style SentencePiece vocabulary: <unk> <s> </s>, the 256 byte
    tokens, then pieces whose scores decide the merges, two user-defined and one control token.
    "bc" outscores "ab", so "abc" is "a" + "bc"; "▁abc" (best of all) needs "▁a" + "bc" first."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    for text, score, kind in [("▁", -1.0, NORMAL), ("a", -2.0, NORMAL), ("b", -2.0, NORMAL), ("c", -2.0, NORMAL),
                              ("x", -2.0, NORMAL), ("y", -2.0, NORMAL), ("z", -2.0, NORMAL), ("w", -2.0, NORMAL),
                              ("ab", -5.0, NORMAL), ("bc", -4.0, NORMAL), ("▁a", -3.0, NORMAL), ("▁abc", -0.5, NORMAL),
                              ("aa", -6.0, NORMAL), ("é", -2.0, NORMAL), ("xy", 0.0, USER_DEFINED),
                              ("yzw", 0.0, USER_DEFINED), ("<turn>", 0.0, CONTROL), ("[PAD9]", 0.0, UNUSED)]:
        tokens.append(text)
        scores.append(score)
        types.append(kind)
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}
    meta.update({f"tokenizer.ggml.{k}": v for k, v in flags.items()})
    return meta


def small(**flags):
    return Tokenizer.from_gguf(small_vocab(**flags), "small.gguf")


def pieces(tok, text, **kw):
    return [tok.id_to_token(i) for i in tok.encode(text, **kw)]


def error(fn, *args):
    with pytest.raises(ModelError) as e:
        fn(*args)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_llama_vocabulary_is_a_sentencepiece_tokenizer_read_from_the_file(tmp_path):
    meta = small_vocab()
    kinds = {list: "array[string]", float: "float32", int: "uint32", str: "string", bool: "bool"}
    typed = {k: ("array[float32]" if k.endswith("scores") else "array[int32]" if k.endswith("type") else
                 kinds[type(v)] if not isinstance(v, list) else "array[string]", v) for k, v in meta.items()}
    write_gguf(tmp_path / "v.gguf", typed, {})
    tok = Tokenizer.from_gguf(open_gguf(tmp_path / "v.gguf").metadata, "v.gguf")
    assert isinstance(tok, SentencePieceTokenizer) and tok.vocab_size == len(meta["tokenizer.ggml.tokens"])
    assert tok.encode("abc") == small().encode("abc")


def test_merges_go_by_score_the_leftmost_of_equals():
    tok = small(add_space_prefix=False, add_bos_token=False)
    assert pieces(tok, "abc") == ["a", "bc"]           # bc (-4) before ab (-5)
    assert pieces(tok, "ab") == ["ab"]
    assert pieces(tok, "aaa") == ["aa", "a"]           # two equal pairs: the left one
    assert pieces(tok, " abc") == ["▁abc"]             # ▁a (-3) and bc (-4), then ▁abc
    meta = small_vocab(add_space_prefix=False, add_bos_token=False)
    meta["tokenizer.ggml.scores"][meta["tokenizer.ggml.tokens"].index("ab")] = -3.5
    assert pieces(Tokenizer.from_gguf(meta, "t"), "abc") == ["ab", "c"]


def test_what_the_vocabulary_cannot_spell_falls_back_to_bytes():
    tok = small(add_space_prefix=False, add_bos_token=False)
    assert pieces(tok, "é日") == ["é", "<0xE6>", "<0x97>", "<0xA5>"]
    assert pieces(tok, "\x00q") == ["<0x00>", "<0x71>"]
    assert pieces(tok, "🤖") == ["<0xF0>", "<0x9F>", "<0xA4>", "<0x96>"]
    assert tok.decode(tok.encode("é日🤖 q")) == "é日🤖 q"


def test_the_space_prefix_goes_first_and_after_every_special_token_as_llama_cpp_does():
    """transformers' Metaspace(prepend_scheme="first") puts it only before the very first piece,
    and not when the text already starts with a space; llama.cpp (and SentencePiece's
    add_dummy_prefix) adds it to each fragment after a special token, space or not."""
    tok = small()                                      # add_space_prefix defaults to true
    assert pieces(tok, "abc") == ["<s>", "▁abc"]
    assert pieces(tok, " a") == ["<s>", "▁", "▁a"]
    assert pieces(tok, "<turn>a") == ["<s>", "<turn>", "▁a"]
    assert pieces(tok, "") == ["<s>"]
    assert pieces(tok, "", add_special_tokens=False) == []
    assert pieces(small(add_space_prefix=False), "a<turn>a") == ["<s>", "a", "<turn>", "a"]


def test_bos_and_eos_as_the_file_says():
    assert small().encode("a", add_special_tokens=True) == small().encode("a", add_special_tokens=False)[:0] + \
        [1] + small().encode("a", add_special_tokens=False)
    assert small(add_bos_token=False, add_eos_token=True).encode("a")[-1] == 2
    assert small(add_bos_token=False).encode("a") == small().encode("a", add_special_tokens=False)
    tok = small()
    assert (tok.bos_id, tok.eos_id, tok.prefix_ids, tok.suffix_ids) == (1, 2, [1], [])


def test_special_tokens_in_the_text_are_those_tokens_the_longest_first():
    """llama.cpp cuts out the longest special token first over the whole text, then shorter ones
    in what is left: "xyzw" is "x" + "yzw", where transformers' leftmost-longest match gives
    "xy" + "z" + "w"."""
    tok = small(add_space_prefix=False, add_bos_token=False)
    assert pieces(tok, "xyzw") == ["x", "yzw"]
    assert pieces(tok, "xyxy") == ["xy", "xy"]
    assert pieces(tok, "<s>a</s>") == ["<s>", "a", "</s>"]
    assert pieces(tok, "<unk>") == ["<unk>"]           # unknown-type tokens too, as llama.cpp parses them
    assert pieces(tok, "<turn") == ["<0x3C>", "<0x74>", "<0x75>", "<0x72>", "<0x6E>"]


def test_decoding_spaces_bytes_and_special_tokens():
    tok = small()
    ids = tok.encode("abc <turn>é\x00 a")
    assert tok.decode(ids) == "<s> abc <turn> é\x00 a"           # the prefix spaces are spaces
    assert tok.decode(ids, skip_special_tokens=True) == "abc  é\x00 a"  # the first one dropped
    assert tok.decode_bytes(tok.encode("a", add_special_tokens=False)) == b" a"   # streaming keeps it
    assert tok.decode([tok.token_to_id("<0xE6>"), tok.token_to_id("<0x97>")]) == "\ufffd"
    assert small(add_space_prefix=False).decode(small(add_space_prefix=False).encode(" a  b ")) == "<s> a  b "
    with pytest.raises(UsageError):
        tok.decode([tok.vocab_size])
    assert tok.text([0, tok.vocab_size + 5]) == "<unk>"


def test_a_lone_surrogate_is_the_callers_mistake():
    with pytest.raises(UsageError, match="U\\+D800"):
        small().encode("a\ud800")


@pytest.mark.parametrize("name, flags", [("prefix", {}),
                                         ("noprefix", {"add_space_prefix": False, "add_bos_token": False})])
def test_the_small_vocabulary_gives_llama_cpps_ids(name, flags):
    """llama-tokenize on this vocabulary written as a GGUF (tests/fixtures/make_gguf_vocab_reference.py
    --small): merges, bytes, the space prefix after special tokens, "xyzw" as x + yzw."""
    with open(SMALL_CASES, encoding="utf-8") as f:
        rows = json.load(f)[name]
    tok = small(**flags)
    assert [[text, tok.encode(text)] for text, _ in rows] == rows


# --- the merge pinned to a readable one ----------------------------------------------------------

def merge_by_rereading(text, score):
    """SentencePiece's merge read straight off its definition: while some adjacent pair of pieces
    spells a token, join the best-scoring pair, the leftmost of equals."""
    out = list(text)
    while True:
        best = None
        for i in range(len(out) - 1):
            s = score.get(out[i] + out[i + 1])
            if s is not None and (best is None or s > best[0]):
                best = (s, i)
        if best is None:
            return out
        i = best[1]
        out[i:i + 2] = [out[i] + out[i + 1]]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_heap_merge_is_the_readable_one(data):
    alphabet = "ab▁c"
    words = data.draw(st.lists(st.text(alphabet, min_size=2, max_size=5), max_size=25))
    score = {w: data.draw(st.sampled_from([-3.0, -2.0, -1.0, 0.0, -0.5])) for w in words}
    text = data.draw(st.text(alphabet, max_size=30))
    vocab = {w: i for i, w in enumerate(score)}
    assert spm_merge(text, vocab, list(score.values())) == merge_by_rereading(text, score)


# --- bad vocabularies: one ModelError line naming the key ----------------------------------------

@pytest.mark.parametrize("change, words", [
    (lambda m: m["tokenizer.ggml.scores"].pop(), ["tokenizer.ggml.scores has 276 entries for 277 tokens"]),
    (lambda m: m["tokenizer.ggml.scores"].append(0.0), ["tokenizer.ggml.scores has 278 entries"]),
    (lambda m: m["tokenizer.ggml.token_type"].pop(), ["tokenizer.ggml.token_type has 276 entries"]),
    (lambda m: m.pop("tokenizer.ggml.scores"), ["tokenizer.ggml.scores missing"]),
    (lambda m: m["tokenizer.ggml.scores"].__setitem__(7, math.nan), ["tokenizer.ggml.scores[7] is NaN"]),
    (lambda m: m["tokenizer.ggml.scores"].__setitem__(7, "x"), ["tokenizer.ggml.scores missing or not a list"]),
    (lambda m: m["tokenizer.ggml.token_type"].__setitem__(9, 7), ["tokenizer.ggml.token_type[9] is 7"]),
    (lambda m: m["tokenizer.ggml.tokens"].__setitem__(3 + 0x41, "A"), ["lacks the byte-fallback token <0x41>"]),
    (lambda m: m["tokenizer.ggml.tokens"].__setitem__(4, "<s>"), ["holds '<s>' twice (ids 1 and 4)"]),
    (lambda m: m.__setitem__("tokenizer.ggml.bos_token_id", 5000), ["tokenizer.ggml.bos_token_id 5000 is outside"]),
    (lambda m: m.__setitem__("tokenizer.ggml.add_bos_token", "yes"), ["tokenizer.ggml.add_bos_token missing or not"]),
    (lambda m: m.__setitem__("tokenizer.ggml.model", "bert"), ["tokenizer.ggml.model 'bert' not supported"]),
])
def test_a_bad_vocabulary_is_one_line_naming_the_key(change, words):
    meta = small_vocab()
    change(meta)
    msg = error(Tokenizer.from_gguf, meta, "bad.gguf")
    assert msg.startswith("bad.gguf: ") and all(w in msg for w in words), msg


def test_without_any_byte_token_the_unknown_token_stands_in_and_without_it_the_file_is_refused():
    meta = small_vocab(add_space_prefix=False, add_bos_token=False)
    tokens = meta["tokenizer.ggml.tokens"]
    for b in range(256):
        tokens[3 + b] = f"[b{b}]"
    assert Tokenizer.from_gguf(meta, "t").encode("a日") == [tokens.index("a"), 0]
    del meta["tokenizer.ggml.unknown_token_id"]
    assert "no tokenizer.ggml.unknown_token_id" in error(Tokenizer.from_gguf, meta, "t")


def test_gpt2_vocabularies_name_the_key_too():
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.token_type": [1]}
    assert "tokenizer.ggml.token_type has 1 entries for 2 tokens" in error(Tokenizer.from_gguf, meta, "m.gguf")
    meta["tokenizer.ggml.token_type"] = [1, 1]
    assert "tokenizer.ggml.tokens lacks 'Ā', the token of byte 0x00" in error(Tokenizer.from_gguf, meta, "m.gguf")
    meta["tokenizer.ggml.pre"] = "no-such-pre"
    assert "tokenizer.ggml.pre 'no-such-pre' not supported" in error(Tokenizer.from_gguf, meta, "m.gguf")


def test_mutated_vocabularies_load_and_run_or_fail_in_one_line():
    """A seeded fuzz of the small vocabulary's keys: values of another type, lists cut or grown,
    odd numbers and strings; each one loads and encodes/decodes, or is one ModelError line."""
    rng = random.Random(38)
    odd = [None, -1, 0, 2**31, 1.5, math.nan, math.inf, "", "x", True, [], [1], ["a"]]
    outcomes = set()
    for _ in range(400):
        meta = small_vocab()
        key = rng.choice(list(meta))
        value = meta[key]
        if isinstance(value, list) and rng.random() < 0.7:
            value = list(value)
            op = rng.choice(["cut", "grow", "item"])
            if op == "cut":
                del value[rng.randrange(len(value)):]
            elif op == "grow":
                value.append(rng.choice(value))
            else:
                value[rng.randrange(len(value))] = rng.choice(odd + value[:5])
        else:
            value = rng.choice(odd)
        meta[key] = value
        try:
            tok = Tokenizer.from_gguf(meta, "f.gguf")
        except ModelError as e:
            assert "\n" not in str(e)
            outcomes.add("refused")
            continue
        ids = tok.encode("abc <turn> xyzw é日 \x00")
        tok.decode(ids)
        outcomes.add("ran")
    assert outcomes == {"refused", "ran"}


# --- the real files: llama.cpp's ids, transformers' where it agrees ------------------------------

@pytest.fixture(scope="module")
def cases():
    with open(CASES, encoding="utf-8") as f:
        return json.load(f)


def real_tokenizer(name):
    path = real_model(name)
    return Tokenizer.from_gguf(open_gguf(path).metadata, str(path))


@pytest.mark.parametrize("name", [GEMMA3, SMOLLM2])
def test_the_real_vocabularies_give_llama_cpps_ids_and_decode_back(name, cases):
    tok = real_tokenizer(name)
    rows = cases[name]
    assert len(rows) > 300
    got = [tok.encode(r["text"]) for r in rows]
    wrong = [(r["text"], ids, r["llama_cpp"]) for r, ids in zip(rows, got) if ids != r["llama_cpp"]]
    assert not wrong, f"{len(wrong)} strings differ from llama.cpp, the first: {wrong[0]}"
    for r, ids in zip(rows, got):
        assert tok.decode(ids, skip_special_tokens=True) == r["decoded"]
        if name == GEMMA3 and "\u2581" not in r["text"]:   # no space prefix, byte fallback: every
            assert tok.decode(ids[1:]) == r["text"]          # text but a literal ▁ comes back as it was
    if name == GEMMA3:       # the cases reach the byte fallback and the special tokens
        byte_ids = {tok.token_to_id(f"<0x{b:02X}>") for b in range(256)}
        assert sum(bool(byte_ids & set(ids)) for ids in got) > 10
        assert tok.encode("<start_of_turn>user\n", add_special_tokens=False) == [105, 2364, 107]


@pytest.mark.parametrize("name", [GEMMA3, SMOLLM2])
def test_transformers_gives_the_same_ids_but_where_the_fixture_says(name, cases):
    """transformers' GGUF reader on the same file: equal to llama.cpp on every string but the few
    the fixture records (the next two tests say why tinydiff does not follow it there)."""
    for needed in ("torch", "gguf"):   # transformers reads a GGUF file only with both
        pytest.importorskip(needed)
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer
    path = real_model(name)
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok = real_tokenizer(name)
    for r in cases[name]:
        assert hf.encode(r["text"]) == r.get("transformers", r["llama_cpp"]), r["text"]
        assert tok.decode(r["llama_cpp"]) == hf.decode(r["llama_cpp"])


def test_gemma_space_runs_are_its_user_defined_tokens_as_in_sentencepiece(cases):
    """Gemma's vocabulary holds the runs of 2..31 spaces as user-defined pieces spelled with real
    spaces (ids 138..167). SentencePiece matches user-defined pieces in the raw text, whole, the
    longest first, and so does llama.cpp: 64 spaces are 31 + 31 + 2. transformers respells them
    "▁▁"... and merges them as BPE pairs, giving 16 + 16 + 16 + 16, and turns a literal "▁▁" in the
    text into the two-space token. tinydiff follows llama.cpp (and the model's SentencePiece)."""
    tok = real_tokenizer(GEMMA3)
    differ = {r["text"]: r for r in cases[GEMMA3] if "transformers" in r}
    assert " " * 64 + "x" in differ and "\u2581\u2581" in differ
    assert all(set(t) <= set(" xy\u2581lowerbck") for t in differ)
    assert tok.encode(" " * 64 + "x") == [2, 167, 167, 138, 236781]
    assert tok.encode("\u2581\u2581") == [2, 236743, 236743]


def test_smollm_numbers_are_split_one_by_one_as_llama_cpp_and_its_tokenizer_json_do(cases):
    """SmolLM's pre-tokenizer (llama.cpp's "smollm"; its tokenizer.json's Digits with
    individual_digits) cuts every \\p{N} character out alone, ½ included, so " ½" is " " + "½";
    transformers' GGUF reader uses GPT-2's split alone and keeps " ½" whole."""
    tok = real_tokenizer(SMOLLM2)
    differ = {r["text"] for r in cases[SMOLLM2] if "transformers" in r}
    assert differ == {" ½", "½ ¾ ⅓"}
    assert [tok.id_to_token(i) for i in tok.encode(" ½")] == ["Ġ", "Â½"]


def test_gemmas_turns_are_its_turn_tokens():
    """The file carries no tokenizer.chat_template; Gemma's turns are spelled as below."""
    tok = real_tokenizer(GEMMA3)
    text = "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[:3] == [2, 105, 2364] and ids[-3:] == [105, 4368, 107]    # <bos><start_of_turn>user ... model\n
    assert tok.decode(ids) == text
    assert tok.special_ids >= {0, 1, 2, 3, 105, 106} and 107 not in tok.special_ids    # "\n" is user-defined


@settings(max_examples=200, deadline=None)
@given(st.text("xyzw<turn>/s ab", max_size=40))
def test_the_special_split_covers_the_text(text):
    tok = small(add_space_prefix=False, add_bos_token=False)
    parts = tok.specials.split(text)
    assert "".join(piece for piece, _ in parts) == text
    assert all(piece and (i is None or tok.tokens[i] == piece) for piece, i in parts)
    assert tok.decode(tok.encode(text)) == text


def test_a_model_with_a_sentencepiece_vocabulary_loads_generates_and_streams(tmp_path):
    """The llama fixture rewritten with the small vocabulary (padded to its 320 rows): the prompt
    gets its BOS and space prefix, and the streamed pieces are the generated text."""
    import tinydiff
    from tinydiff.formats.gguf import GGML_TYPES, Planned
    f = open_gguf(os.path.join(os.path.dirname(__file__), "fixtures", "gguf", "llama-gqa-mixed.gguf"))
    meta = {k: (f.value_types[k], v) for k, v in f.metadata.items() if not k.startswith("tokenizer.")}
    vocab = small_vocab()
    extra = 320 - len(vocab["tokenizer.ggml.tokens"])
    vocab["tokenizer.ggml.tokens"] += [f"▁p{i}" for i in range(extra)]
    vocab["tokenizer.ggml.scores"] += [-10.0 - i for i in range(extra)]
    vocab["tokenizer.ggml.token_type"] += [NORMAL] * extra
    for key, value in vocab.items():
        kind = {"scores": "array[float32]", "token_type": "array[int32]", "tokens": "array[string]"}.get(
            key.rsplit(".", 1)[1], "string" if isinstance(value, str) else "uint32")
        meta[key] = (kind, value)
    tensors = {name: Planned(GGML_TYPES[t.type][0].lower(), f.shape(name), lambda a=f.raw(name): a)
               for name, t in f.tensors.items()}
    write_gguf(tmp_path / "spm.gguf", meta, tensors)
    model = tinydiff.load(str(tmp_path / "spm.gguf"))
    assert isinstance(model.tokenizer, SentencePieceTokenizer)
    assert model.encode_prompt("abc") == [1, model.tokenizer.token_to_id("▁abc")]
    new = model.generate_ids(model.encode_prompt("abc xy"), max_new_tokens=8, temperature=0)
    kept = [i for i in new if i not in model.stop_ids and i not in model.tokenizer.special_ids]
    text = model.generate("abc xy", max_new_tokens=8, temperature=0)
    assert text == model.tokenizer.decode_bytes(kept).decode("utf-8", errors="replace") and len(new) > 0


# --- special tokens' text read as text (llama.cpp's parse_special=false) --------------------------

PLAIN_CASES = os.path.join(os.path.dirname(SMALL_CASES), "gguf_no_parse_special.json")


def plain_cases(key):
    with open(PLAIN_CASES, encoding="utf-8") as f:
        return json.load(f)[key]


def test_split_special_tokens_reads_control_tokens_as_text_as_llama_cpp_does():
    """llama-tokenize --no-parse-special on the small vocabulary (make_gguf_vocab_reference.py
    --plain): <turn>, <s> and </s> become their characters, and the text differs from parsing."""
    rows, tok = plain_cases("small"), small()
    assert [[text, tok.encode(text, split_special_tokens=True)] for text, _ in rows] == rows
    assert sum(tok.encode(t, split_special_tokens=True) != tok.encode(t) for t, _ in rows) >= 5


@pytest.mark.parametrize("name", [GEMMA3, SMOLLM2])
def test_the_real_vocabularies_read_special_text_as_llama_cpp_does(name):
    """Both tokenizers (SentencePiece for Gemma, tokenizer.json's BPE for SmolLM2): control tokens'
    text is text; Gemma's user-defined tokens (<unused0>, space runs) still match whole."""
    tok, rows = real_tokenizer(name), plain_cases(name)
    assert len(rows) > 10
    got = [[text, tok.encode(text, split_special_tokens=True)] for text, _ in rows]
    assert got == rows
    assert sum(ids != tok.encode(text) for text, ids in rows) >= 3   # the switch did something
