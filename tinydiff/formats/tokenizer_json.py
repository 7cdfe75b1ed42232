"""A tokenizer.json's parts, each read and checked: its normalizer, pre-tokenizer, post-processor,
BPE tables and added tokens, as tokenizer.Tokenizer builds itself from them.

A value of the wrong JSON type is a _Bad naming the field ("model.vocab should be an object, got
list"); a part tinydiff does not implement is an _Unsupported; Tokenizer turns either into one
ModelError line. Ids must be 0..n-1 where n is what the file defines (vocab entries + added
tokens), checked before anything is sized by one.
"""
import unicodedata

from .files import show
from .pretokenizer import CHAR_TO_BYTE, WHITE_SPACE_CHARS, ByteLevel, Split, compile_regex


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
    if kind == "Replace":       # SentencePiece-style files: " " -> "▁"
        pattern = _get(spec, "pattern", dict, field)
        if "String" not in pattern:
            raise _Unsupported("normalizer Replace with a regex pattern")
        old, new = _get(pattern, "String", str, field + ".pattern"), _get(spec, "content", str, field)
        if not old:
            raise _Bad(f"{field}.pattern.String is empty")
        return lambda text: text.replace(old, new)
    if kind == "Prepend":
        prefix = _get(spec, "prepend", str, field)
        return lambda text: prefix + text if text else text
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


class Decoder:
    """What a tokenizer.json decoder does, in one of the two shapes tinydiff reads: ByteLevel
    (byte_level: tokens spelled in GPT-2's byte alphabet), or SentencePiece's Sequence of Replace
    ("▁" -> " "), ByteFallback (<0xXX> tokens are bytes), Fuse and Strip (after Fuse: leading
    spaces off the whole text)."""

    def __init__(self, byte_level, replaces=(), byte_fallback=False, strip=0):
        self.byte_level, self.replaces, self.byte_fallback, self.strip = byte_level, replaces, byte_fallback, strip


def _decoder(spec):
    kind = _get(_check(spec, dict, "decoder"), "type", str, "decoder") if spec is not None else None
    if kind == "ByteLevel":
        return Decoder(True)
    if kind != "Sequence":
        raise _Unsupported(f"decoder {_quote(kind)} (need ByteLevel, or a Sequence of Replace, ByteFallback, "
                           "Fuse, Strip)")
    replaces, byte_fallback, fused, strip = [], False, False, 0
    for step, name in _items(spec, "decoders", dict, "decoder"):
        kind = _get(step, "type", str, name)
        if kind == "Replace" and not fused:
            pattern = _get(step, "pattern", dict, name)
            if "String" not in pattern or not pattern["String"]:
                raise _Unsupported(f"{name}: Replace without a string pattern")
            replaces.append((_get(pattern, "String", str, name + ".pattern"), _get(step, "content", str, name)))
        elif kind == "ByteFallback" and not fused:
            byte_fallback = True
        elif kind == "Fuse":
            fused = True
        elif kind == "Strip" and fused and _get(step, "content", str, name) == " " and \
                not _get(step, "stop", int, name, 0):
            strip = _get(step, "start", int, name, 0)
        else:
            raise _Unsupported(f"{name}: decoder {_quote(kind)} here")
    return Decoder(False, tuple(replaces), byte_fallback, strip)


def _bpe_tables(model):
    """vocab (str -> id) and merges ((id, id) -> (rank, merged id)) of a BPE model."""
    kind = _get(model, "type", str, "model", "BPE")
    if kind != "BPE":
        raise _Unsupported(f"model type {_quote(kind)} (only byte-level BPE)")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if _get(model, key, str, "model", ""):
            raise _Unsupported(f"BPE {key} {_quote(model[key])}")
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
