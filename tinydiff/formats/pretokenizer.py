"""Pre-tokenizers for byte-level BPE: the regex scanner and the byte <-> character map.

tokenizer.json regexes are written for Oniguruma (what `tokenizers` runs) and use
\\p{L}, \\p{N}, ... which Python's `re` lacks. translate() rewrites such a pattern into
plain `re` syntax with every Unicode class spelled out as explicit code point ranges,
built once from `unicodedata`. Both engines backtrack and try alternatives left to
right, so the rewritten pattern finds the same matches.

Unicode version: Python 3.11's unicodedata is Unicode 14; `tokenizers` may be built on a
newer one. Characters assigned after Unicode 14 (general category Cn here) can therefore
land in a different class than in `tokenizers`, e.g. a new letter that \\p{L} misses.
"""
import re
import sys
import unicodedata
from functools import lru_cache

# The pattern `tokenizers` uses for ByteLevel(use_regex=True), i.e. GPT-2's.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Oniguruma's (and Rust's) \s is the Unicode White_Space property. Python's \s also
# counts \x1c-\x1f as space, so spell the property out. It is small and frozen.
WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
               (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
               (0x3000, 0x3000)]
WHITE_SPACE_CHARS = frozenset(chr(c) for lo, hi in WHITE_SPACE for c in range(lo, hi + 1))


@lru_cache(maxsize=None)
def _categories():
    """General category ('Lu', 'Nd', ...) -> list of (first, last) code point ranges.
    One pass over all of Unicode (~0.3 s), done only when a pattern needs a class."""
    ranges = {}
    start, prev = 0, "Cc"  # U+0000
    for cp in range(1, sys.maxunicode + 1):
        cat = unicodedata.category(chr(cp))
        if cat != prev:
            ranges.setdefault(prev, []).append((start, cp - 1))
            start, prev = cp, cat
    ranges.setdefault(prev, []).append((start, sys.maxunicode))
    return ranges


def _property(name):
    """\\p{name} as ranges: a general category, one letter ('L') or two ('Lu')."""
    cats = _categories()
    names = [c for c in cats if c == name or (len(name) == 1 and c[0] == name)]
    if not names:
        raise ValueError(f"unsupported regex property \\p{{{name}}}")
    return sorted(r for c in names for r in cats[c])


def _complement(ranges):
    out, nxt = [], 0
    for lo, hi in sorted(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    if nxt <= sys.maxunicode:
        out.append((nxt, sys.maxunicode))
    return out


# Escapes whose meaning differs between Oniguruma and Python: name -> ranges thunk.
_CLASS_ESCAPES = {"s": lambda: WHITE_SPACE, "S": lambda: _complement(WHITE_SPACE)}
# Oniguruma's \w (hence \b) follows neither Python's nor the general categories: it
# takes some No characters (², ½) and not others (①). Refuse rather than guess.
_REFUSED_ESCAPES = "wWbB"


def _class_escape(pattern, i):
    """Parse the escape after the backslash at pattern[i-1]. Returns (ranges, next index),
    ranges None when the escape means the same in Python and is copied as is."""
    c = pattern[i]
    if c in "pP":
        if pattern.startswith("{", i + 1):
            end = pattern.index("}", i)
            name, nxt = pattern[i + 2:end], end + 1
        else:
            name, nxt = pattern[i + 1], i + 2
        negate = (c == "P") != name.startswith("^")  # \p{^L} is \P{L}
        ranges = _property(name.lstrip("^"))
        return (_complement(ranges) if negate else ranges), nxt
    if c in _CLASS_ESCAPES:
        return _CLASS_ESCAPES[c](), i + 1
    if c in _REFUSED_ESCAPES:
        raise ValueError(f"unsupported regex escape \\{c}")
    if c == "x" and pattern.startswith("{", i + 1):  # \x{263A}
        end = pattern.index("}", i)
        cp = int(pattern[i + 2:end], 16)
        return [(cp, cp)], end + 1
    return None, i + 1


def _class_body(ranges):
    esc = "\\U%08x".__mod__
    return "".join(esc(lo) if lo == hi else f"{esc(lo)}-{esc(hi)}" for lo, hi in ranges)


def translate(pattern):
    """Rewrite an Oniguruma regex into Python `re` syntax, classes expanded."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            ranges, nxt = _class_escape(pattern, i + 1)
            if ranges is None:
                out.append(pattern[i:nxt])
            elif in_class:
                out.append(_class_body(ranges))
            else:
                out.append(f"[{_class_body(ranges)}]")
            i = nxt
            continue
        if c == "[" and not in_class:
            in_class = True
            start = i + 2 if pattern.startswith("[^", i) else i + 1
            if pattern.startswith("]", start):  # a leading ']' is a literal
                start += 1
            out.append(pattern[i:start].replace("]", "\\]"))
            i = start
            continue
        if c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


@lru_cache(maxsize=None)
def compile_regex(pattern):
    """Compile an Oniguruma pattern; ValueError (with the pattern) if it cannot be."""
    try:
        return re.compile(translate(pattern))
    except (re.error, ValueError) as e:
        raise ValueError(f"cannot compile regex {pattern!r}: {e}") from None


# --- splitting --------------------------------------------------------------

def _find_matches(regex, text, invert):
    """(start, end, is_match) spans covering text, as tokenizers' Pattern::find_matches."""
    spans, prev = [], 0
    for m in regex.finditer(text):
        start, end = m.span()
        if start != prev:
            spans.append((prev, start, invert))
        spans.append((start, end, not invert))
        prev = end
    if prev != len(text):
        spans.append((prev, len(text), invert))
    return spans


def _join(spans, joins):
    """Spans (start, end, is_match) -> (start, end), a span joining the one before it where
    joins(the one before is a match, this one is a match)."""
    out, prev_match = [], False
    for start, end, is_match in spans:
        if joins(prev_match, is_match) and out:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
        prev_match = is_match
    return out


def _merge_matches(spans):
    """MergedWithPrevious: a match joins the span before it, unless that was a match too."""
    return _join(spans, lambda prev, this: this and not prev)


def _contiguous(spans):
    """Contiguous: neighbouring spans of the same kind become one."""
    return _join(spans, lambda prev, this: this == prev)


def _merged_with_next(spans):
    """MergedWithNext is MergedWithPrevious run from the right."""
    mirrored = [(-end, -start, m) for start, end, m in reversed(spans)]
    return [(-end, -start) for start, end in reversed(_merge_matches(mirrored))]


_BEHAVIORS = {
    "Isolated": lambda spans: [(s, e) for s, e, _ in spans],
    "Removed": lambda spans: [(s, e) for s, e, m in spans if not m],
    "MergedWithPrevious": _merge_matches,
    "MergedWithNext": _merged_with_next,
    "Contiguous": _contiguous,
}


class Split:
    """Split pre-tokenizer: cut a piece at the matches of a pattern."""

    def __init__(self, regex, behavior, invert=False):
        if behavior not in _BEHAVIORS:
            raise ValueError(f"unsupported Split behavior {behavior!r}")
        self.regex, self.behave, self.invert = regex, _BEHAVIORS[behavior], invert

    def __call__(self, text):
        spans = self.behave(_find_matches(self.regex, text, self.invert))
        return [text[s:e] for s, e in spans if e > s]


# --- byte level -------------------------------------------------------------

def _bytes_to_chars():
    """GPT-2's reversible byte -> printable character map: printable Latin-1 bytes stand
    for themselves, the other 68 (controls, space, ...) take U+0100 onwards."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = [], 0x100
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(extra))
            extra += 1
    return chars


BYTE_TO_CHAR = _bytes_to_chars()                          # [256] str
CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
_LATIN1_TO_CHAR = dict(enumerate(BYTE_TO_CHAR))          # for str.translate


def to_byte_chars(text):
    """UTF-8 bytes of text, each shown as its printable stand-in (what BPE vocabs hold).
    surrogateescape gives back the raw bytes of non-UTF-8 command-line arguments."""
    return text.encode("utf-8", "surrogateescape").decode("latin-1").translate(_LATIN1_TO_CHAR)


class ByteLevel:
    """ByteLevel pre-tokenizer: optional prefix space, optional GPT-2 regex split, then
    bytes -> printable characters. trim_offsets only concerns offsets, which we skip."""

    def __init__(self, add_prefix_space=True, use_regex=True):
        self.add_prefix_space = add_prefix_space
        self.split = Split(compile_regex(GPT2_PATTERN), "Isolated") if use_regex else None

    def __call__(self, text):
        if self.add_prefix_space and not text.startswith(" "):
            text = " " + text
        pieces = self.split(text) if self.split else [text]
        return [to_byte_chars(p) for p in pieces]
