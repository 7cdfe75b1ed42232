"""Reader for Hugging Face tokenizer.json files that hold a byte-level BPE (GPT-2, Llama-3, Qwen2).

Encoding follows the `tokenizers` pipeline, one step per function below:
  1. cut added tokens (<|endoftext|>, ...) out of the raw text, longest match first;
  2. normalize the text between them (NFC, ...) and cut out added tokens flagged `normalized`;
  3. pre-tokenize each remaining piece: regex split, then UTF-8 bytes -> printable stand-ins;
  4. BPE each pre-token: merge the adjacent pair of lowest rank until none is left;
  5. post-process: add BOS/EOS around the ids as the template says.
Decoding maps tokens back to bytes and decodes UTF-8 with errors='replace'.

The same tokenizer comes from a GGUF file's tokenizer.ggml.* keys (Tokenizer.from_gguf): the
file names its pre-tokenizer, and GGUF_PRE gives the tokenizer.json parts for that name.

The file is checked as it is read: a value of the wrong JSON type is one ModelError line naming the
field ("model.vocab should be an object, got list"); ids must be 0..n-1 where n is what the file
defines (vocab entries + added tokens; the token list in GGUF), checked before anything is sized
by one; no two vocab tokens share an id; without an unk token, every byte has its token.

Not supported (a ModelError names them): other models (WordPiece, Unigram, ...), other
normalizers/pre-tokenizers/decoders, byte_fallback, BPE dropout, subword prefixes/suffixes.
Ignored: offsets, truncation and padding settings, pair templates.
"""
import heapq
import json
import unicodedata

from ..errors import ModelError, UsageError, is_integer
from .files import show
from .pretokenizer import (
    CHAR_TO_BYTE,
    WHITE_SPACE_CHARS,
    ByteLevel,
    Split,
    compile_regex,
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
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
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


class _Unsupported(ValueError):
    """A component we do not implement; becomes a ModelError naming the file."""


class _Bad(ValueError):
    """A malformed field ("model.vocab should be an object, got list"); becomes a ModelError
    naming the file."""


# --- reading fields -----------------------------------------------------------
# The file comes from whoever made it: every value is checked for its JSON type where it is read,
# so a bad file is one line naming the field, not a Python error from deep inside.

_KIND_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer",
               bool: "true or false", float: "a number", (str, list): "a string or a list"}
_MISSING = object()


def _json_type(value):
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "integer",
             float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _check(value, kind, field):
    """value, if it is JSON of this kind (float: any number); else _Bad naming the field."""
    ok = isinstance(value, (int, float) if kind is float else kind)
    if isinstance(value, bool) and kind is not bool:
        ok = False
    if not ok:
        raise _Bad(f"{field} should be {_KIND_NAMES[kind]}, got {_json_type(value)}")
    return value


def _quote(text):
    """A token as it is named in messages: quoted, escaped, cut if long."""
    return show(repr(text))


def _get(obj, key, kind, field, default=_MISSING):
    """obj[key] checked to be of kind; null counts as absent, as serde's Option does."""
    name = f"{field}.{key}" if field else key
    value = obj.get(key)
    if value is None:
        if default is _MISSING:
            raise _Bad(f"{name} missing")
        return default
    return _check(value, kind, name)


def _items(obj, key, kind, field):
    """obj[key], a list whose items are each of kind: [(item, its field name)]."""
    name = f"{field}.{key}"
    return [(_check(v, kind, f"{name}[{i}]"), f"{name}[{i}]") for i, v in enumerate(_get(obj, key, list, field))]


# --- loading the components ---------------------------------------------------

def _normalizer(spec, field):
    """tokenizer.json normalizer -> function str -> str (None for no normalizer)."""
    if spec is None:
        return None
    kind = _get(_check(spec, dict, field), "type", str, field)
    if kind == "Sequence":
        steps = [_normalizer(s, name) for s, name in _items(spec, "normalizers", dict, field)]

        def sequence(text):
            for step in steps:
                text = step(text)
            return text
        return sequence
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return lambda text: unicodedata.normalize(kind, text)
    if kind == "Lowercase":
        return _lowercase
    raise _Unsupported(f"normalizer {_quote(kind)}")


def _lowercase(text):
    """Lowercase char by char, as Rust does: str.lower() would make a word-final Σ a ς."""
    return "σ".join(part.lower() for part in text.split("Σ"))


def _pre_tokenizers(spec, field):
    """tokenizer.json pre_tokenizer -> list of functions piece -> list of pieces."""
    if spec is None:
        return []
    kind = _get(_check(spec, dict, field), "type", str, field)
    if kind == "Sequence":
        return [p for s, name in _items(spec, "pretokenizers", dict, field) for p in _pre_tokenizers(s, name)]
    if kind == "ByteLevel":
        return [ByteLevel(_get(spec, "add_prefix_space", bool, field, True),
                          _get(spec, "use_regex", bool, field, True))]
    if kind == "Split":
        pattern = _get(spec, "pattern", dict, field)
        if "Regex" in pattern:
            text = _get(pattern, "Regex", str, field + ".pattern")
        else:
            text = _escape_literal(_get(pattern, "String", str, field + ".pattern"))
        behavior, invert = _get(spec, "behavior", str, field), _get(spec, "invert", bool, field, False)
        try:
            return [Split(compile_regex(text), behavior, invert)]
        except ValueError as e:
            raise _Bad(f"{field}: {e}") from None
    if kind == "Digits":  # Rust's char::is_numeric is \p{N}
        each = _get(spec, "individual_digits", bool, field, False)
        return [Split(compile_regex(r"\p{N}"), "Isolated" if each else "Contiguous")]
    raise _Unsupported(f"pre_tokenizer {_quote(kind)}")


def _escape_literal(text):
    """A literal string as an Oniguruma pattern (every non-alphanumeric char escaped)."""
    return "".join(c if c.isalnum() else "\\" + c for c in text)


def _post_processor(spec, field):
    """tokenizer.json post_processor -> (prefix ids, suffix ids) put around a single
    sequence when add_special_tokens=True."""
    if spec is None:
        return [], []
    kind = _get(_check(spec, dict, field), "type", str, field)
    if kind == "ByteLevel":  # only trims offsets
        return [], []
    if kind in ("RobertaProcessing", "BertProcessing"):
        return [_token_pair(spec, "cls", field)], [_token_pair(spec, "sep", field)]
    if kind == "TemplateProcessing":
        specials = _get(spec, "special_tokens", dict, field, {})
        prefix, suffix, seen_a = [], [], False
        for item, name in _items(spec, "single", dict, field):
            if "Sequence" in item:
                seen_a = True
                continue
            token = _get(_get(item, "SpecialToken", dict, name), "id", str, name + ".SpecialToken")
            if not isinstance(specials.get(token), dict):
                raise _Bad(f"{name} names the special token {token!r}, which {field}.special_tokens lacks")
            ids = [i for i, _ in _items(specials[token], "ids", int, f"{field}.special_tokens[{token!r}]")]
            (suffix if seen_a else prefix).extend(ids)
        return prefix, suffix
    if kind == "Sequence":  # each processor wraps the output of the one before
        prefix, suffix = [], []
        for step, name in _items(spec, "processors", dict, field):
            pre, suf = _post_processor(step, name)
            prefix, suffix = pre + prefix, suffix + suf
        return prefix, suffix
    raise _Unsupported(f"post_processor {_quote(kind)}")


def _token_pair(spec, key, field):
    """The id of a RobertaProcessing cls/sep entry, ["<s>", 0]."""
    pair = _get(spec, key, list, field)
    if len(pair) != 2:
        raise _Bad(f"{field}.{key} should be a [token, id] pair, got {len(pair)} items")
    return _check(pair[1], int, f"{field}.{key}[1]")


def _check_decoder(spec):
    kind = _get(_check(spec, dict, "decoder"), "type", str, "decoder") if spec is not None else None
    if kind != "ByteLevel":
        raise _Unsupported(f"decoder {_quote(kind)} (need ByteLevel)")


def _bpe_tables(model):
    """vocab (str -> id) and merges ((id, id) -> (rank, merged id)) of a BPE model."""
    kind = _get(model, "type", str, "model", "BPE")
    if kind != "BPE":
        raise _Unsupported(f"model type {_quote(kind)} (only byte-level BPE)")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if _get(model, key, str, "model", ""):
            raise _Unsupported(f"BPE {key} {_quote(model[key])}")
    if _get(model, "byte_fallback", bool, "model", False):
        raise _Unsupported("BPE byte_fallback")
    if _get(model, "dropout", float, "model", 0):
        raise _Unsupported("BPE dropout")
    vocab = _get(model, "vocab", dict, "model")
    for text, i in vocab.items():
        _check(i, int, f"model.vocab[{_quote(text)}]")
    merges = {}
    for rank, (merge, name) in enumerate(_items(model, "merges", (str, list), "model")):
        pair = merge.split(" ") if isinstance(merge, str) else merge  # "a b" or ["a", "b"]
        if len(pair) != 2 or not all(isinstance(t, str) for t in pair):
            raise _Bad(f"{name} {_quote(merge)} is not a pair of tokens")
        a, b = pair
        missing = next((t for t in (a, b, a + b) if t not in vocab), None)
        if missing is not None:
            raise _Bad(f"{name} {_quote(merge)} uses {_quote(missing)}, which is not in model.vocab")
        merges[vocab[a], vocab[b]] = (rank, vocab[a + b])
    return vocab, merges


def _added_entries(spec):
    """added_tokens, each checked: an id, a non-empty content, boolean flags."""
    if spec.get("added_tokens") is None:
        return []
    entries = []
    for entry, name in _items(spec, "added_tokens", dict, ""):
        _check(entry.get("id"), int, name + ".id")
        if not _get(entry, "content", str, name):
            raise _Bad(f"{name}.content is empty")
        for flag in ("special", "normalized", "lstrip", "rstrip", "single_word"):
            _get(entry, flag, bool, name, False)
        entries.append(entry)
    return entries


def _check_ids(vocab, entries, bound, has_unk):
    """Every id in 0..bound-1 (bound: what the file can define; checked before anything is sized
    by an id), no two vocab tokens sharing one, and, without an unk token, every byte stand-in
    present: byte-level BPE spells any text with them, and a missing one would drop text silently."""
    owner = {}
    for text, i in [*vocab.items(), *((e["content"], e["id"]) for e in entries)]:
        if not 0 <= i < bound:
            raise _Bad(f"token {_quote(text)} has id {i}, outside 0..{bound - 1} (the file defines {bound} tokens)")
    for text, i in vocab.items():
        if i in owner:
            raise _Bad(f"model.vocab gives id {i} to both {_quote(owner[i])} and {_quote(text)}")
        owner[i] = text
    missing = next((c for c in CHAR_TO_BYTE if c not in vocab), None)
    if missing is not None and not has_unk:
        raise _Bad(f"model.vocab lacks {_quote(missing)}, the token of byte 0x{CHAR_TO_BYTE[missing]:02x}, "
                   "which a byte-level BPE needs")


# --- added tokens -------------------------------------------------------------

def _is_word_char(c):
    """Rust regex's \\w, which tokenizers uses for single_word: alphabetic, marks, decimal
    digits, connectors, joiners. (Letters and Nl stand in for the Alphabetic property.)"""
    cat = unicodedata.category(c)
    return cat[0] in "LM" or cat in ("Nd", "Nl", "Pc") or c in "\u200c\u200d"


class _AddedTokens:
    """Tokens matched verbatim in the text before BPE sees it, longest match first,
    with tokenizers' lstrip/rstrip/single_word rules."""

    def __init__(self, entries, normalize):
        self.by_text = {}  # text as matched -> entry
        for entry in entries:
            text = entry["content"]
            if entry.get("normalized") and normalize:
                text = normalize(text)
            self.by_text[text] = entry
        self.regex = None
        if self.by_text:
            alternatives = sorted(self.by_text, key=len, reverse=True)  # longest first
            self.regex = compile_regex("|".join(map(_escape_literal, alternatives)))

    def split(self, text):
        """text -> list of (piece, id): id is the token's id for an added token, None for
        the text between them (which is never empty)."""
        if self.regex is None:
            return [(text, None)]
        out, pos = [], 0
        for m in self.regex.finditer(text):
            entry, start, stop = self.by_text[m.group()], m.start(), m.end()
            if entry.get("single_word") and not self._single_word(text, start, stop):
                continue
            if entry.get("lstrip"):  # swallow spaces before, unless a previous token did
                while start > pos and text[start - 1] in WHITE_SPACE_CHARS:
                    start -= 1
            if entry.get("rstrip"):
                while stop < len(text) and text[stop] in WHITE_SPACE_CHARS:
                    stop += 1
            if pos < start:
                out.append((text[pos:start], None))
            out.append((text[start:stop], entry["id"]))
            pos = stop
        if pos < len(text):
            out.append((text[pos:], None))
        return out

    @staticmethod
    def _single_word(text, start, stop):
        """A single_word token must not touch word characters on either side."""
        return ((start == 0 or not _is_word_char(text[start - 1])) and
                (stop == len(text) or not _is_word_char(text[stop])))


# --- BPE ----------------------------------------------------------------------

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
        _check_decoder(spec.get("decoder"))

        entries = _added_entries(spec)
        _check_ids(self.vocab, entries, len(self.vocab) + len(entries) if size is None else size, unk is not None)
        self.raw_added = _AddedTokens([e for e in entries if not e.get("normalized")], None)
        self.norm_added = _AddedTokens([e for e in entries if e.get("normalized")], self.normalize)
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
        """The tokenizer a GGUF file's tokenizer.ggml.* keys describe, the same one the
        tokenizer.json it was made from gives: control and user-defined tokens are added tokens
        (special for control), unused ones are holes, add_bos_token/add_eos_token the template."""
        key = "tokenizer.ggml."

        def get(name, kind, default=None):
            value = meta.get(key + name, default)
            ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
            if kind is list and ok:
                item = str if name in ("tokens", "merges") else int
                ok = all(isinstance(v, item) and not isinstance(v, bool) for v in value)
            if value is None or not ok:
                raise ModelError(f"{where}: {key}{name} missing or not a {'list' if kind is list else kind.__name__}")
            return value

        if get("model", str, "") != "gpt2":
            raise ModelError(f"{where}: {key}model {_quote(meta.get(key + 'model'))} not supported "
                             "(only 'gpt2', a byte-level BPE)")
        pre = get("pre", str, "default")
        pre = "gpt-2" if pre == "default" else pre
        if pre not in GGUF_PRE:
            raise ModelError(f"{where}: {key}pre {_quote(pre)} not supported (supported: {', '.join(GGUF_PRE)})")
        tokens = get("tokens", list)
        types = get("token_type", list, [NORMAL] * len(tokens))
        if len(types) != len(tokens):
            raise ModelError(f"{where}: {key}token_type has {len(types)} entries for {len(tokens)} tokens")
        vocab, added = {}, []
        for i, (text, kind) in enumerate(zip(tokens, types)):
            if kind == UNUSED:
                continue
            vocab.setdefault(text, i)
            if kind in (CONTROL, USER_DEFINED):
                added.append({"id": i, "content": text, "special": kind == CONTROL, "normalized": False})
        normalizer, pre_tokenizer, ignore_merges = GGUF_PRE[pre]
        unk = get("unknown_token_id", int, -1)
        model = {"type": "BPE", "vocab": vocab, "merges": get("merges", list, []), "ignore_merges": ignore_merges,
                 "unk_token": tokens[unk] if 0 <= unk < len(tokens) else None}
        tok = cls._build({"model": model, "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
                          "decoder": {"type": "ByteLevel"}, "added_tokens": added}, where, len(tokens))
        for flag, name, ids in (("add_bos_token", "bos_token_id", tok.prefix_ids),
                                ("add_eos_token", "eos_token_id", tok.suffix_ids)):
            if meta.get(key + flag) is True:
                ids.append(get(name, int))
                if not 0 <= ids[-1] < len(tokens):
                    raise ModelError(f"{where}: {key}{name} {ids[-1]} is outside the {len(tokens)} tokens")
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

    def encode(self, text, add_special_tokens=True):
        """Text -> token ids; add_special_tokens puts BOS/EOS as the post-processor says."""
        if not isinstance(text, str):
            raise UsageError(f"encode takes text (str), got {type(text).__name__}")
        try:
            ids = self._encode(text)
        except UnicodeEncodeError as e:
            bad = f"U+{ord(e.object[e.start]):04X}"
            raise UsageError(f"text contains {bad}, a lone surrogate that UTF-8 cannot encode") from None
        if add_special_tokens:
            ids = self.prefix_ids + ids + self.suffix_ids
        return ids

    def _encode(self, text):
        ids = []
        for piece, token in self.raw_added.split(text):
            if token is not None:
                ids.append(token)
                continue
            if self.normalize:
                piece = self.normalize(piece)
            for sub, sub_token in self.norm_added.split(piece):
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
        if is_integer(ids):
            ids = [ids]
        elif not hasattr(ids, "__iter__") or isinstance(ids, (str, bytes)):
            raise UsageError(f"decode takes token ids (a list of integers, or one), got {type(ids).__name__}")
        ids = list(ids)
        bad = next((i for i in ids if not is_integer(i) or not 0 <= i < len(self.tokens)), None)
        if bad is not None:
            raise UsageError(f"decode: {bad!r} is not a token id of this tokenizer (0..{len(self.tokens) - 1})")
        return self.text(ids, skip_special_tokens)

    def text(self, ids, skip_special_tokens=False):
        """decode() for ids a model produced: an id past the tokenizer's (a padded vocabulary) is
        skipped, as tokenizers skips it."""
        return self.decode_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")

    def _token_bytes(self, i):
        b = self._bytes_cache.get(i)
        if b is None:
            text = self.id_to_token(i) or ""
            # As tokenizers' ByteLevel decoder: a token made only of byte stand-ins maps
            # back to those bytes; any other (an added token like "<|im start|>") is
            # taken as its own UTF-8.
            if all(c in CHAR_TO_BYTE for c in text):
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
