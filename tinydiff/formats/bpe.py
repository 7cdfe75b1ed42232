"""Byte-level BPE: trains a vocabulary on text and writes it as a Hugging Face tokenizer.json.

The format is GPT-2's: text is cut into pre-tokens by GPT-2's regex, each pre-token's UTF-8 bytes
are spelled with GPT-2's byte-to-unicode alphabet (so every byte is a printable character), and
merges join adjacent symbols, the lowest-ranked merge first. Token ids: 0..255 are the bytes
themselves, then one id per merge in the order learnt, then the special tokens.

    obj = train_bpe(stories, 2048, ["<|endoftext|>", "<|mask|>"])
    save_tokenizer_json(obj, "tokenizer.json")
    ids = BPE(obj).encode("Once upon a time")

Training counts adjacent pairs over the distinct pre-tokens (a few tens of thousands for
TinyStories) weighted by how often each occurs, and after each merge updates only the words that
held the merged pair; a lazy max-heap finds the next pair. 3.5 MB of text trains in seconds.
"""
import heapq
import json
import os
import re
import tempfile
from collections import Counter

# GPT-2's pre-tokenizer regex, `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`,
# in the standard library's `re`, which has no \p{..}: a letter is [^\W\d_], a number \d. The two
# agree on English text; they can differ on rare characters (Unicode numerics that are not digits,
# like ½, count as letters here). The tokenizer.json names the real regex (ByteLevel use_regex), so
# this only decides how the training text is counted, never how a reader splits text.
PRETOKEN = re.compile(r"'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    """GPT-2's map from each byte to a printable character: printable Latin-1 bytes map to
    themselves, the other 68 to U+0100 onwards in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_CHAR = bytes_to_unicode()
CHAR_BYTE = {c: b for b, c in BYTE_CHAR.items()}


def _split_specials(text, specials):
    """[(piece, is_special)] with every special token cut out, longest match first."""
    if not specials:
        return [(text, False)]
    pattern = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
    out, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            out.append((text[pos:m.start()], False))
        out.append((m.group(0), True))
        pos = m.end()
    if pos < len(text):
        out.append((text[pos:], False))
    return out


def _word_counts(texts, specials):
    counts = Counter()
    for text in texts:
        for piece, special in _split_specials(text, specials):
            if not special:
                counts.update(PRETOKEN.findall(piece))
    return counts


def _pairs(word):
    return zip(word, word[1:])


def train_bpe(texts, vocab_size, special_tokens):
    """tokenizer.json content (a dict) for a byte-level BPE of `vocab_size` ids in all:
    256 bytes + merges + the special tokens, which get the last ids in the order given."""
    n_target = vocab_size - len(special_tokens)
    if n_target < 256:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for the 256 bytes and {len(special_tokens)} specials")
    words, freqs = [], []                       # words[i]: list of token ids, seen freqs[i] times
    for w, n in _word_counts(texts, special_tokens).items():
        words.append(list(w.encode("utf-8")))
        freqs.append(n)

    strings = [BYTE_CHAR[b] for b in range(256)]   # id -> its byte-level string
    ids = {s: i for i, s in enumerate(strings)}
    pair_count, where = Counter(), {}               # pair -> weighted count; pair -> {word index}
    for i, w in enumerate(words):
        for p in _pairs(w):
            pair_count[p] += freqs[i]
            where.setdefault(p, set()).add(i)
    # Max-heap on count; ties go to the smaller (left id, right id), so training is deterministic.
    # Entries go stale when counts change: an entry is used only if its count is still current.
    heap = [(-n, p) for p, n in pair_count.items()]
    heapq.heapify(heap)

    merges = []
    while len(strings) < n_target and heap:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg or -neg <= 0:
            continue
        a, b = pair
        s = strings[a] + strings[b]
        if s not in ids:       # two merge paths can spell the same string: one id serves both
            ids[s] = len(strings)
            strings.append(s)
        new = ids[s]
        merges.append((strings[a], strings[b]))
        changed = Counter()
        for i in where.pop(pair):
            w, f = words[i], freqs[i]
            for p in _pairs(w):
                changed[p] -= f
            merged, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    merged.append(new)
                    j += 2
                else:
                    merged.append(w[j])
                    j += 1
            words[i] = merged
            for p in _pairs(merged):
                changed[p] += f
                where.setdefault(p, set()).add(i)
        del pair_count[pair]
        for p, d in changed.items():
            if p == pair or d == 0:
                continue
            pair_count[p] += d
            if pair_count[p] > 0:
                heapq.heappush(heap, (-pair_count[p], p))

    vocab = {s: i for i, s in enumerate(strings)}
    added = []
    for tok in special_tokens:
        vocab[tok] = len(vocab)
        added.append({"id": vocab[tok], "content": tok, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": [list(m) for m in merges]},
    }


def save_tokenizer_json(obj, path):
    """Writes the dict as JSON under a temporary name and renames it into place."""
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class BPE:
    """Encodes and decodes with a tokenizer.json made by train_bpe: what the trainer needs to turn
    its corpus into ids. (tinydiff.formats.tokenizer reads any byte-level tokenizer.json; this one knows
    only the layout train_bpe writes.)"""

    def __init__(self, obj):
        model = obj["model"]
        self.vocab = model["vocab"]
        self.strings = {i: s for s, i in self.vocab.items()}
        self.rank = {tuple(m): r for r, m in enumerate(model["merges"])}
        self.specials = {t["content"]: t["id"] for t in obj["added_tokens"]}
        self.cache = {}

    def _word(self, word):
        """ids of one pre-token: repeatedly apply the lowest-ranked merge present."""
        if word in self.cache:
            return self.cache[word]
        syms = [BYTE_CHAR[b] for b in word.encode("utf-8")]
        while len(syms) > 1:
            ranked = [(self.rank.get(p, 1 << 62), k) for k, p in enumerate(_pairs(syms))]
            r, k = min(ranked)
            if r == 1 << 62:
                break
            syms[k:k + 2] = [syms[k] + syms[k + 1]]
        ids = [self.vocab[s] for s in syms]
        self.cache[word] = ids
        return ids

    def encode(self, text):
        out = []
        for piece, special in _split_specials(text, self.specials):
            if special:
                out.append(self.specials[piece])
            else:
                for w in PRETOKEN.findall(piece):
                    out += self._word(w)
        return out

    def decode(self, ids):
        data = bytearray()
        for i in ids:
            s = self.strings[i]
            if s in self.specials:
                data += s.encode("utf-8")
            else:
                data += bytes(CHAR_BYTE[c] for c in s)
        return data.decode("utf-8", errors="replace")
