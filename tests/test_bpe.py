"""The BPE trainer (tinydiff/formats/bpe.py): a valid tokenizer.json that round-trips text and that
tinydiff's reader and the `tokenizers` library (where installed) encode exactly as we do."""
import json
import os
import random

import pytest

from tinydiff.formats import bpe
from tinydiff.training import corpus

SPECIALS = ["<|endoftext|>", "<|mask|>"]
DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "tinystories")

SYLLABLES = "ba be bo da di do ka ki ku la li lo ma me mo na ni no pa pe po ra re ro sa se so ta te to".split()
PUNCT = [".", ",", "!", "?", "’s", " “Hi!”", ";"]
TRICKY = [
    "",
    "Once upon a time, there was a little girl named Lily.",
    "Lily said, “Can you help me?” Tom’s dog — a big one — ran… away!",
    "  two  spaces\n\nnew paragraph\n trailing  ",
    "don't I'LL we've 12345 3.14 a_b ñandú café 日本語 👍",
    "hi<|endoftext|>there<|mask|> <|mask|><|endoftext|>",
    "\t\x00\r\n",
]


def stories(n=200, seed=0):
    """Made-up stories: words of 1-4 syllables, some capitalised, some punctuation, two paragraphs."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(300)]

    def sentence():
        w = [rng.choice(words) for _ in range(rng.randint(3, 12))]
        return " ".join(w).capitalize() + rng.choice(PUNCT)

    return [" ".join(sentence() for _ in range(rng.randint(1, 4))) + "\n" + sentence() for _ in range(n)]


@pytest.fixture(scope="module")
def tok():
    return bpe.train_bpe(stories(), 400, SPECIALS)


def test_layout(tok):
    vocab = tok["model"]["vocab"]
    assert len(vocab) == 400 and sorted(vocab.values()) == list(range(400))
    for b in range(256):
        assert vocab[bpe.BYTE_CHAR[b]] == b
    assert [(t["id"], t["content"], t["special"]) for t in tok["added_tokens"]] == [
        (398, "<|endoftext|>", True), (399, "<|mask|>", True)]
    assert tok["pre_tokenizer"] == {"type": "ByteLevel", "add_prefix_space": False,
                                    "trim_offsets": True, "use_regex": True}
    assert tok["decoder"]["type"] == "ByteLevel" and tok["model"]["type"] == "BPE"
    for a, b in tok["model"]["merges"]:
        assert a in vocab and b in vocab and a + b in vocab
    assert len(tok["model"]["merges"]) >= 400 - 256 - 2


def test_deterministic(tok):
    assert bpe.train_bpe(stories(), 400, SPECIALS) == tok


def test_round_trip_and_compression(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    bpe.save_tokenizer_json(tok, path)
    enc = bpe.BPE(json.loads(path.read_text(encoding="utf-8")))
    for text in TRICKY + stories(20, seed=1):
        assert enc.decode(enc.encode(text)) == text
    assert enc.encode("a<|endoftext|>b<|mask|>")[-3:] == [398, enc.encode("b")[0], 399]
    text = "\n".join(stories(50))  # text like the training text: merges pay
    assert len(enc.encode(text)) < len(text.encode("utf-8")) / 2.5


def test_vocab_too_small():
    with pytest.raises(ValueError):
        bpe.train_bpe(["abc"], 257, SPECIALS)


def test_gpt2_byte_map():
    assert len(set(bpe.BYTE_CHAR.values())) == 256
    assert bpe.BYTE_CHAR[ord(" ")] == "Ġ" and bpe.BYTE_CHAR[ord("\n")] == "Ċ" and bpe.BYTE_CHAR[ord("A")] == "A"


def test_tinydiff_reader_agrees(tok):
    from tinydiff.formats.tokenizer import Tokenizer
    ours, reader = bpe.BPE(tok), Tokenizer(tok)
    for text in TRICKY + stories(20, seed=3):
        assert reader.encode(text, add_special_tokens=False) == ours.encode(text)
        assert reader.decode(ours.encode(text)) == text


def test_tokenizers_library_agrees(tok):
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer.from_str(json.dumps(tok))
    ours = bpe.BPE(tok)
    for text in TRICKY + stories(20, seed=4):
        assert hf.encode(text, add_special_tokens=False).ids == ours.encode(text)
        assert hf.decode(ours.encode(text), skip_special_tokens=False) == text


@pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "v1-valid-prefix.txt")), reason="no TinyStories data")
def test_tokenizers_library_agrees_on_validation_text():
    tokenizers = pytest.importorskip("tokenizers")
    train = corpus.load_stories([os.path.join(DATA, "v1-train-first2MiB-cased.txt")])
    tok = bpe.train_bpe(train, 1024, SPECIALS)
    text = "<|endoftext|>".join(corpus.load_stories([os.path.join(DATA, "v1-valid-prefix.txt")]))
    ids = bpe.BPE(tok).encode(text)
    assert tokenizers.Tokenizer.from_str(json.dumps(tok)).encode(text, add_special_tokens=False).ids == ids
