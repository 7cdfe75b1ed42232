"""Reader for Hugging Face tokenizer.json files that hold a byte-level BPE (GPT-2, Llama-3, Qwen2).

Encoding follows the `tokenizers` pipeline, one step per function below (tokenizer_json.py reads
and checks each part of the file):
  1. cut added tokens (<|endoftext|>, ...) out of the raw text, longest match first;
  2. normalize the text between them (NFC, ...) and cut out added tokens flagged `normalized`;
  3. pre-tokenize each remaining piece: regex split, then UTF-8 bytes -> printable stand-ins;
  4. BPE each pre-token: merge the adjacent pair of lowest rank until none is left;
  5. post-process: add BOS/EOS around the ids as the template says.
Decoding maps tokens back to bytes and decodes UTF-8 with errors='replace'.

The same tokenizer comes from a GGUF file's tokenizer.ggml.* keys (Tokenizer.from_gguf, model
"gpt2"): the file names its pre-tokenizer, and GGUF_PRE gives the tokenizer.json parts for that
name. A GGUF SentencePiece vocabulary (model "llama") is sentencepiece.py's, with the same interface.

The file is checked as it is read: a value of the wrong JSON type is one ModelError line naming the
field ("model.vocab should be an object, got list"); ids must be 0..n-1 where n is what the file
defines (vocab entries + added tokens; the token list in GGUF), checked before anything is sized
by one; no two vocab tokens share an id; without an unk token, every byte has its token.

SentencePiece-style BPE files (Gemma's, Llama 2's): normalizer Replace " " -> "▁" (and Prepend),
BPE byte_fallback (a character the vocab lacks is its <0xXX> byte tokens), decoder Sequence of
Replace, ByteFallback, Fuse, Strip.
Not supported (a ModelError names them): other models (WordPiece, Unigram, ...), other
normalizers/pre-tokenizers/decoders, BPE dropout, subword prefixes/suffixes.
Ignored: offsets, truncation and padding settings, pair templates.
"""
import heapq
import json

from ..errors import ModelError, UsageError, decode_ids, is_integer
from .gguf_vocab import CONTROL, KEY, NORMAL, UNUSED, USER_DEFINED, Vocab
from .pretokenizer import CHAR_TO_BYTE
from .sentencepiece import SentencePieceTokenizer
from .tokenizer_json import (
    _added_entries,
    _AddedTokens,
    _Bad,
    _bpe_tables,
    _decoder,
    _check_ids,
    _get,
    _normalizer,
    _post_processor,
    _pre_tokenizers,
    _quote,
    _Unsupported,
)

BPE_CACHE_SIZE = 1 << 16  # pre-tokens whose BPE result is kept (cleared when full)
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<|startoftext|>", "<bos>")
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "</s>", "<|eot_id|>", "<eos>")

# GGUF (llama.cpp) stores a byte-level BPE as tokenizer.ggml.model "gpt2": the token list, a type
# per token (llama_token_type), the merges as "a b" strings, and tokenizer.ggml.pre, a name for the
# pre-tokenizer whose regexes llama.cpp hard-codes (llama-vocab.cpp). For each name tinydiff
# supports, the tokenizer.json parts that models of that family carry (llama.cpp's regexes are
# rewrites of them; it skips qwen2's NFC, which we keep): (normalizer, pre_tokenizer, BPE
# ignore_merges). A file without the key, or with "default", is taken as GPT-2.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")


def _byte_level(use_regex):
    return {"type": "ByteLevel", "add_prefix_space": False, "use_regex": use_regex}


def _regex_then_bytes(pattern):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}, _byte_level(False)]}


GGUF_PRE = {
    "gpt-2": (None, _byte_level(True), False),
    "llama-bpe": (None, _regex_then_bytes(LLAMA3_PATTERN), True),
    "qwen2": ({"type": "NFC"}, _regex_then_bytes(QWEN2_PATTERN), False),
    "smollm": (None, {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                            _byte_level(True)]}, False),
}


def _canonical(part):
    """A tokenizer.json part with defaults filled in and trim_offsets (offsets only) dropped."""
    if isinstance(part, list):
        return [_canonical(p) for p in part]
    if not isinstance(part, dict):
        return part
    out = {k: _canonical(v) for k, v in part.items() if k != "trim_offsets"}
    if out.get("type") == "ByteLevel":
        out = {"add_prefix_space": True, "use_regex": True, **out}
    if out.get("type") == "Split":
        out.setdefault("invert", False)
    return out


def gguf_pre_name(spec):
    """The tokenizer.ggml.pre name of a tokenizer.json's normalizer + pre-tokenizer (already
    checked by Tokenizer), or None."""
    ours = (_canonical(spec.get("normalizer")), _canonical(spec.get("pre_tokenizer")),
            bool(spec["model"].get("ignore_merges", False)))
    return next((name for name, parts in GGUF_PRE.items()
                 if (_canonical(parts[0]), _canonical(parts[1]), parts[2]) == ours), None)


def bpe_merge(ids, merges):
    """Merge a word's symbols: repeatedly the adjacent pair of lowest rank, leftmost
    first, as tokenizers does. A heap of candidate pairs keeps long words (a 100k-space
    run) at O(n log n); entries made stale by an earlier merge are skipped."""
    ids = list(ids)                          # [n] token id, None once merged away
    n = len(ids)
    nxt = list(range(1, n + 1))              # [n] index of the next live symbol (n = none)
    prv = list(range(-1, n - 1))             # [n] index of the previous live symbol (-1 = none)
    heap = [(*merges[ids[i], ids[i + 1]], i) for i in range(n - 1) if (ids[i], ids[i + 1]) in merges]
    heapq.heapify(heap)                      # entries (rank, merged id, left index)
    while heap:
        rank, new, i = heapq.heappop(heap)
        j = nxt[i]
        if ids[i] is None or j >= n or merges.get((ids[i], ids[j])) != (rank, new):
            continue
        ids[i], ids[j] = new, None
        nxt[i] = nxt[j]
        if nxt[i] < n:
            prv[nxt[i]] = i
        for left, right in ((prv[i], i), (i, nxt[i])):
            if left >= 0 and right < n and (ids[left], ids[right]) in merges:
                heapq.heappush(heap, (*merges[ids[left], ids[right]], left))
    return [t for t in ids if t is not None]


class Tokenizer:
    """A byte-level BPE tokenizer read from a Hugging Face tokenizer.json."""

    def __init__(self, spec, size=None):
        """spec: the parsed tokenizer.json; size: how many ids the file can define (default: its
        vocab entries + added tokens). Prefer from_file, which reports bad files."""
        model = _get(spec, "model", dict, "")
        self.vocab, self.merges = _bpe_tables(model)
        self.ignore_merges = _get(model, "ignore_merges", bool, "model", False)
        unk = _get(model, "unk_token", str, "model", None)
        if unk is not None and unk not in self.vocab:
            raise _Bad(f"model.unk_token {_quote(unk)} is not in model.vocab")
        self.unk_id = self.vocab[unk] if unk else None
        self.fuse_unk = _get(model, "fuse_unk", bool, "model", False)
        self.normalize = _normalizer(spec.get("normalizer"), "normalizer")
        self.pre_tokenizers = _pre_tokenizers(spec.get("pre_tokenizer"), "pre_tokenizer")
        self.decoder = _decoder(spec.get("decoder"))
        # byte fallback: a character the vocab lacks is its UTF-8 bytes as <0xXX> tokens
        self.byte_fallback = _get(model, "byte_fallback", bool, "model", False)
        missing = next((b for b in range(256) if f"<0x{b:02X}>" not in self.vocab), None)
        if self.byte_fallback and unk is None and missing is not None:
            raise _Bad(f"model.vocab lacks <0x{missing:02X}>, which byte_fallback without an unk_token needs")

        entries = _added_entries(spec)
        _check_ids(self.vocab, entries, len(self.vocab) + len(entries) if size is None else size,
                   unk is not None or not self.decoder.byte_level)
        self.raw_added = _AddedTokens([e for e in entries if not e.get("normalized")], None)
        self.norm_added = _AddedTokens([e for e in entries if e.get("normalized")], self.normalize)
        plain = [e for e in entries if not e.get("special")]     # split_special_tokens keeps only these
        self.plain_added = (_AddedTokens([e for e in plain if not e.get("normalized")], None),
                            _AddedTokens([e for e in plain if e.get("normalized")], self.normalize))
        self.added = {e["content"]: e["id"] for e in entries}
        self.special_ids = {e["id"] for e in entries if e.get("special")}

        size = 1 + max([*self.vocab.values(), *self.added.values()], default=-1)
        self.tokens = [None] * size          # [vocab_size] id -> token text, None for holes
        for text, i in self.vocab.items():
            self.tokens[i] = text
        for entry in entries:               # tokenizers shows normalized tokens normalized
            text = entry["content"]
            if entry.get("normalized") and self.normalize:
                text = self.normalize(text)
            self.tokens[entry["id"]] = text
        self.prefix_ids, self.suffix_ids = _post_processor(spec.get("post_processor"), "post_processor")
        bad = next((i for i in self.prefix_ids + self.suffix_ids if not 0 <= i < size), None)
        if bad is not None:
            raise _Bad(f"post_processor adds the id {bad}, outside the vocabulary 0..{size - 1}")
        self.pre_name = gguf_pre_name(spec)  # what GGUF calls the pre-tokenizer, None if it has no name
        self.added_entries = entries
        self._bpe_cache = {}                 # pre-token -> ids
        self._bytes_cache = {}               # id -> bytes

    @classmethod
    def from_file(cls, path):
        """Load a tokenizer.json; any problem with the file raises a one-line ModelError."""
        path = str(path)
        try:
            with open(path, encoding="utf-8") as f:
                spec = json.load(f)
        except OSError as e:
            raise ModelError(f"{path}: cannot read tokenizer: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise ModelError(f"{path}: tokenizer is not UTF-8 text: {e.reason} at byte {e.start}") from None
        except json.JSONDecodeError as e:
            where = f"line {e.lineno} column {e.colno}"
            raise ModelError(f"{path}: tokenizer is not valid JSON: {e.msg} at {where}") from None
        except RecursionError:
            raise ModelError(f"{path}: tokenizer JSON is nested too deeply") from None
        if not isinstance(spec, dict):
            raise ModelError(f"{path}: bad tokenizer: top level is not a JSON object")
        return cls._build(spec, path)

    @classmethod
    def _build(cls, spec, where, size=None):
        try:
            return cls(spec, size)
        except _Unsupported as e:
            raise ModelError(f"{where}: unsupported tokenizer component: {e}") from None
        except _Bad as e:
            raise ModelError(f"{where}: {e}") from None
        except RecursionError:    # Sequences inside Sequences, a thousand deep
            raise ModelError(f"{where}: tokenizer components are nested too deeply") from None

    @classmethod
    def from_gguf(cls, meta, where):
        """The tokenizer a GGUF file's tokenizer.ggml.* keys describe: model "llama" is a
        SentencePiece vocabulary (sentencepiece.py); "gpt2" is the same tokenizer the tokenizer.json
        it was made from gives: control and user-defined tokens are added tokens (special for
        control), unused ones are holes, add_bos_token/add_eos_token the template."""
        v = Vocab(meta, where)
        if v.model() == "llama":
            return SentencePieceTokenizer.from_gguf(meta, where)
        pre = v.get("pre", str, "default")
        pre = "gpt-2" if pre == "default" else pre
        if pre not in GGUF_PRE:
            v.fail(f"{KEY}pre {_quote(pre)} not supported (supported: {', '.join(GGUF_PRE)})")
        tokens = v.tokens()
        types = v.token_types(tokens)
        vocab, added = {}, []
        for i, (text, kind) in enumerate(zip(tokens, types)):
            if kind == UNUSED:
                continue
            vocab.setdefault(text, i)
            if kind in (CONTROL, USER_DEFINED):
                added.append({"id": i, "content": text, "special": kind == CONTROL, "normalized": False})
        normalizer, pre_tokenizer, ignore_merges = GGUF_PRE[pre]
        unk = v.get("unknown_token_id", int, -1)
        missing = next((c for c in CHAR_TO_BYTE if c not in vocab), None)
        if missing is not None and not 0 <= unk < len(tokens):
            v.fail(f"{KEY}tokens lacks {_quote(missing)}, the token of byte 0x{CHAR_TO_BYTE[missing]:02x}, "
                   "which a byte-level BPE needs")
        model = {"type": "BPE", "vocab": vocab, "merges": v.get("merges", list, []), "ignore_merges": ignore_merges,
                 "unk_token": tokens[unk] if 0 <= unk < len(tokens) else None}
        tok = cls._build({"model": model, "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
                          "decoder": {"type": "ByteLevel"}, "added_tokens": added}, where, len(tokens))
        for flag, name, ids in (("add_bos_token", "bos_token_id", tok.prefix_ids),
                                ("add_eos_token", "eos_token_id", tok.suffix_ids)):
            if v.flag(flag, False):
                ids.append(v.token_id(name, len(tokens), None))
        return tok

    def gguf_metadata(self, vocab_size, where):
        """tokenizer.ggml.* {key: (GGUF value type, value)} for this tokenizer, its token list
        padded to vocab_size with unused "[PAD<id>]" as llama.cpp's converter does. What GGUF
        cannot say (a pre-tokenizer llama.cpp has no name for, added-token flags) is an error."""
        if self.pre_name is None:
            raise ModelError(f"{where}: this pre-tokenizer has no tokenizer.ggml.pre name tinydiff knows "
                             f"({', '.join(GGUF_PRE)})")
        for e in self.added_entries:
            flags = [k for k in ("lstrip", "rstrip", "single_word") if e.get(k)]
            if flags or (e.get("normalized") and self.normalize):
                raise ModelError(f"{where}: added token {_quote(e['content'])} is {(flags or ['normalized'])[0]}, "
                                 "which GGUF cannot carry")
        if self.fuse_unk:
            raise ModelError(f"{where}: BPE fuse_unk cannot be carried by GGUF")
        tokens, types, added = [], [], set(self.added.values())
        for i in range(vocab_size):
            text = self.id_to_token(i)
            tokens.append(f"[PAD{i}]" if text is None else text)
            types.append(UNUSED if text is None else NORMAL if i not in added
                         else CONTROL if i in self.special_ids else USER_DEFINED)
        by_id = {i: text for text, i in self.vocab.items()}
        pairs = [(by_id[a], by_id[b]) for (a, b), _ in sorted(self.merges.items(), key=lambda m: m[1][0])]
        spaced = next((p for p in pairs if " " in p[0] + p[1]), None)
        if spaced:   # GGUF spells a merge "a b": a space inside a token would make it ambiguous
            raise ModelError(f"{where}: the merge {_quote(spaced)} has a space inside a token, which GGUF cannot spell")
        merges = [f"{a} {b}" for a, b in pairs]
        meta = {"tokenizer.ggml.model": ("string", "gpt2"), "tokenizer.ggml.pre": ("string", self.pre_name),
                "tokenizer.ggml.tokens": ("array[string]", tokens),
                "tokenizer.ggml.token_type": ("array[int32]", types),
                "tokenizer.ggml.merges": ("array[string]", merges)}
        if self.unk_id is not None:
            meta["tokenizer.ggml.unknown_token_id"] = ("uint32", self.unk_id)
        return meta

    # --- encoding ---

    def encode(self, text, add_special_tokens=True, split_special_tokens=False):
        """Text -> token ids; add_special_tokens puts BOS/EOS as the post-processor says.
        split_special_tokens (transformers' name; llama.cpp's parse_special=false) reads the text
        of a special token as plain text; added tokens that are not special still match."""
        if not isinstance(text, str):
            raise UsageError(f"encode takes text (str), got {type(text).__name__}")
        try:
            ids = self._encode(text, *(self.plain_added if split_special_tokens else (self.raw_added, self.norm_added)))
        except UnicodeEncodeError as e:
            bad = f"U+{ord(e.object[e.start]):04X}"
            raise UsageError(f"text contains {bad}, a lone surrogate that UTF-8 cannot encode") from None
        if add_special_tokens:
            ids = self.prefix_ids + ids + self.suffix_ids
        return ids

    def _encode(self, text, raw_added, norm_added):
        ids = []
        for piece, token in raw_added.split(text):
            if token is not None:
                ids.append(token)
                continue
            if self.normalize:
                piece = self.normalize(piece)
            for sub, sub_token in norm_added.split(piece):
                if sub_token is not None:
                    ids.append(sub_token)
                else:
                    for word in self._pre_tokenize(sub):
                        ids.extend(self._bpe(word))
        return ids

    def _pre_tokenize(self, text):
        pieces = [text]
        for step in self.pre_tokenizers:
            pieces = [out for piece in pieces for out in step(piece)]
        return [p for p in pieces if p]

    def _bpe(self, word):
        ids = self._bpe_cache.get(word)
        if ids is None:
            ids = self._bpe_word(word)
            if len(self._bpe_cache) >= BPE_CACHE_SIZE:
                self._bpe_cache.clear()
            self._bpe_cache[word] = ids
        return ids

    def _bpe_word(self, word):
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        symbols = []
        for c in word:
            i = self.vocab.get(c)
            if i is not None:
                symbols.append(i)
            elif self.byte_fallback and all(f"<0x{b:02X}>" in self.vocab for b in c.encode("utf-8")):
                symbols.extend(self.vocab[f"<0x{b:02X}>"] for b in c.encode("utf-8"))
            elif self.unk_id is not None and not (self.fuse_unk and symbols and symbols[-1] == self.unk_id):
                symbols.append(self.unk_id)
            # tokenizers drops a character it cannot map when there is no unk token
        return bpe_merge(symbols, self.merges)

    # --- decoding ---

    def decode_bytes(self, ids, skip_special_tokens=False):
        """Token ids -> raw UTF-8 bytes, for streaming: a character split across tokens
        comes out whole once its last byte arrives. Unknown ids are skipped, as in
        tokenizers."""
        out = bytearray()
        for i in ids:
            if skip_special_tokens and i in self.special_ids:
                continue
            out += self._token_bytes(i)
        return bytes(out)

    def decode(self, ids, skip_special_tokens=False):
        """Token ids (or one id, as transformers takes it) -> text; bytes that are not valid UTF-8
        become U+FFFD. An id that is not a whole number, or not one of this tokenizer's, is a
        UsageError (decode_bytes, which the decoders use on a model's output, skips those it does
        not know, as tokenizers does)."""
        return self.text(decode_ids(ids, len(self.tokens)), skip_special_tokens)

    def text(self, ids, skip_special_tokens=False):
        """decode() for ids a model produced: an id past the tokenizer's (a padded vocabulary) is
        skipped, as tokenizers skips it."""
        text = self.decode_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")
        for _ in range(self.decoder.strip):   # a SentencePiece file's Strip: its prefix space
            text = text[1:] if text.startswith(" ") else text
        return text

    def _token_bytes(self, i):
        b = self._bytes_cache.get(i)
        if b is None:
            text = self.id_to_token(i) or ""
            # As tokenizers' ByteLevel decoder: a token made only of byte stand-ins maps
            # back to those bytes; any other (an added token like "<|im start|>") is
            # taken as its own UTF-8. A SentencePiece-style decoder: <0xXX> is that byte,
            # any other token its text with "▁" made a space.
            if not self.decoder.byte_level:
                if self.decoder.byte_fallback and len(text) == 6 and text.startswith("<0x") and text.endswith(">") \
                        and all(c in "0123456789ABCDEFabcdef" for c in text[3:5]):
                    b = bytes([int(text[3:5], 16)])
                else:
                    for old, new in self.decoder.replaces:
                        text = text.replace(old, new)
                    b = text.encode("utf-8")
            elif all(c in CHAR_TO_BYTE for c in text):
                b = bytes(CHAR_TO_BYTE[c] for c in text)
            else:
                b = text.encode("utf-8")
            self._bytes_cache[i] = b
        return b

    # --- vocabulary ---

    @property
    def vocab_size(self):
        """Number of ids, added tokens included (largest id + 1)."""
        return len(self.tokens)

    def token_to_id(self, token):
        """Token text -> id, or None; added tokens first, as tokenizers does."""
        i = self.added.get(token)
        return i if i is not None else self.vocab.get(token)

    def id_to_token(self, i):
        """Id -> token text as stored in the vocab (byte stand-ins), or None."""
        return self.tokens[i] if 0 <= i < len(self.tokens) else None  # i may be a numpy int

    @property
    def bos_id(self):
        """BOS: what the post-processor puts first, else a token with a usual BOS name."""
        if self.prefix_ids:
            return self.prefix_ids[0]
        return self._first_named(BOS_NAMES)

    @property
    def eos_id(self):
        """EOS: the first usual EOS name present. A model's config.json (eos_token_id)
        knows better: chat models often end turns with another token (<|im_end|>)."""
        return self._first_named(EOS_NAMES)

    def _first_named(self, names):
        for name in names:
            i = self.token_to_id(name)
            if i is not None:
                return i
        return None
