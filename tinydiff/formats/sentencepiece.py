"""SentencePiece vocabularies from GGUF (tokenizer.ggml.model = "llama": Llama 1/2, Mistral, Gemma),
encoded and decoded as llama.cpp's SPM tokenizer does (llama-vocab.cpp: llm_tokenizer_spm,
tokenizer_st_partition, token_to_piece), in our own words.

Takes the tokenizer.ggml.* keys (gguf_vocab.py reads and checks them): the tokens, a score and a
llama_token_type per token, add_space_prefix (default true), add_bos_token (default true),
add_eos_token (default false), the bos/eos ids (defaults 1 and 2 where in range, as llama.cpp's),
unknown_token_id (used only by a vocabulary without byte tokens, which llama.cpp cannot encode with).

Encoding, one step per function below:
  1. special tokens out first (split_specials): the control, user-defined and unknown-type tokens
     (<start_of_turn>, "\\n\\n", <unk>) written in the text are those tokens, as transformers parses
     them. llama.cpp's order: the longest token first over the whole text, each one's occurrences
     left to right in text no longer token already; among tokens of one length, the lower id first
     (llama.cpp's sort leaves that order unspecified).
  2. each text fragment: with add_space_prefix, a space in front of the first fragment and of any
     fragment right after a special token (llama.cpp does both; transformers only the first, and
     not when the text already starts with a space); then every " " becomes "▁" (U+2581).
  3. merge (spm_merge): start from the fragment's characters and repeatedly join the adjacent pair
     whose concatenation is a token of the highest score, the leftmost of equals.
  4. a final piece that is not a token becomes its UTF-8 bytes, each the token <0xXX> (byte
     fallback); a vocabulary without byte tokens uses its unknown token instead.
  5. add_bos_token / add_eos_token put BOS / EOS around the ids.
Decoding: a normal token's "▁" is a space, a byte token its byte, any other token its text; the
bytes are UTF-8 decoded with U+FFFD for what is not valid. With add_space_prefix, decode() drops
one leading space of the text, as transformers' Strip decoder does (decode_bytes, the streaming
one, keeps it: a reply's first piece " Hello" keeps its space).
"""
import heapq
import re

import numpy as np

from ..errors import ModelError, UsageError, decode_ids, is_integer
from .gguf_vocab import BYTE, CONTROL, NORMAL, UNDEFINED, UNKNOWN, UNUSED, USER_DEFINED, Vocab

SPACE = "\u2581"                          # "▁", SentencePiece's spelling of a space
SPECIAL_TYPES = (CONTROL, USER_DEFINED, UNKNOWN)


def spm_merge(text, vocab, scores):
    """The pieces of text after SentencePiece's merging: start from its characters; while some
    adjacent pair spells a token (vocab: text -> id, scores[id]), join the pair of the highest score,
    the leftmost of equals. A heap keeps it O(n log n); entries made stale by a merge are skipped
    (a pair is still valid while its two pieces are alive and as long as when it was pushed)."""
    n = len(text)
    piece = list(text)                       # [n] the piece starting at i, "" once merged away
    nxt = list(range(1, n + 1))              # [n] start of the next live piece (n = none)
    prv = list(range(-1, n - 1))             # [n] start of the previous live piece (-1 = none)
    heap = []                                # (-score, left start, length of the joined pair)
    for i in range(n - 1):
        t = vocab.get(text[i:i + 2])
        if t is not None:
            heap.append((-scores[t], i, 2))
    heapq.heapify(heap)
    while heap:
        _, i, size = heapq.heappop(heap)
        left = piece[i]
        j = nxt[i]
        if not left or j >= n or len(left) + len(piece[j]) != size:
            continue
        piece[i], piece[j] = left + piece[j], ""
        k = nxt[i] = nxt[j]
        if k < n:
            prv[k] = i
            t = vocab.get(piece[i] + piece[k])
            if t is not None:
                heapq.heappush(heap, (-scores[t], i, size + len(piece[k])))
        p = prv[i]
        if p >= 0:
            t = vocab.get(piece[p] + piece[i])
            if t is not None:
                heapq.heappush(heap, (-scores[t], p, len(piece[p]) + size))
    return [p for p in piece if p]


class _Specials:
    """Finds the special tokens in a text, in llama.cpp's order (step 1 of the module's contract).
    Which ones occur is found by their first two characters (one for one-character tokens), so
    text without them costs one regex scan; then each one present, the longest first, takes its
    occurrences left to right in what is still text, as llama.cpp's partition does."""

    def __init__(self, specials):
        self.ids = dict(specials)                                # text -> id
        self.texts = {i: text for text, i in self.ids.items()}   # id -> text
        groups = {}                                              # first 1-2 chars -> lengths
        for text in self.ids:
            groups.setdefault(text[:2], set()).add(len(text))
        self.groups = {k: sorted(v, reverse=True) for k, v in groups.items()}
        firsts = sorted({text[0] for text in self.ids})
        self.first = re.compile("[" + "".join(re.escape(c) for c in firsts) + "]") if firsts else None

    def split(self, text):
        """[(fragment, None) or (token text, id)] covering text, fragments never empty."""
        present = self._present(text) if self.first else ()
        free, taken = [(0, len(text))], []                       # text not yet token; (start, id)
        for i in sorted(present, key=lambda i: (-len(self.texts[i]), i)):
            token, left = self.texts[i], []
            for start, stop in free:
                at = text.find(token, start, stop)
                while at >= 0:
                    if at > start:
                        left.append((start, at))
                    taken.append((at, i))
                    start = at + len(token)
                    at = text.find(token, start, stop)
                if start < stop:
                    left.append((start, stop))
            free = left
        pieces = [(start, text[start:stop], None) for start, stop in free if stop > start]
        pieces += [(at, self.texts[i], i) for at, i in taken]
        return [(piece, i) for _, piece, i in sorted(pieces, key=lambda p: p[0])]

    def _present(self, text):
        """The ids of the special tokens that occur in text."""
        found, n, seen = set(), len(text), set()
        for m in self.first.finditer(text):
            start = m.start()
            for key in (text[start:start + 2], text[start]):
                lengths = self.groups.get(key)
                if lengths is None or (key, text[start:start + lengths[0]]) in seen:
                    continue
                seen.add((key, text[start:start + lengths[0]]))   # a run of one character: once
                for length in lengths:
                    i = self.ids.get(text[start:start + length]) if start + length <= n else None
                    if i is not None:
                        found.add(i)
        return found


class SentencePieceTokenizer:
    """A GGUF SentencePiece vocabulary; the same interface as tokenizer.Tokenizer."""

    def __init__(self, tokens, scores, types, *, add_space_prefix, bos, eos, unk, add_bos, add_eos, where):
        # llama.cpp names an empty token "[EMPTY_<id>]": it could never be matched
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)] if "" in tokens else tokens
        self.tokens = tokens                                     # [n] id -> token text
        self.types = types                                       # [n] llama_token_type
        self.vocab = dict(zip(tokens, range(len(tokens))))       # token text -> id
        if len(self.vocab) != len(tokens):
            seen = {}
            for i, text in enumerate(tokens):
                if text in seen:
                    raise ModelError(f"{where}: tokenizer.ggml.tokens holds {text!r} twice (ids {seen[text]} and {i})")
                seen[text] = i
        self.scores = scores                                     # [n] id -> merge score
        self.add_space_prefix = add_space_prefix
        self.bos, self.eos, self.unk = bos, eos, unk
        self.prefix_ids = [bos] if add_bos else []
        self.suffix_ids = [eos] if add_eos else []
        kinds = np.asarray(types)
        self.special_ids = set(np.flatnonzero((kinds == CONTROL) | (kinds == UNKNOWN)).tolist())
        self.added = {tokens[i]: i for i in np.flatnonzero(np.isin(kinds, SPECIAL_TYPES)).tolist()}
        self.specials = _Specials(self.added.items())
        self.plain_specials = _Specials((t, i) for t, i in self.added.items() if i not in self.special_ids)
        self.byte_ids = self._byte_tokens(where)                 # [256] byte -> id, or None
        self._bytes_cache = {}                                   # id -> bytes

    @classmethod
    def from_gguf(cls, meta, where):
        """The tokenizer a GGUF file's tokenizer.ggml.* keys describe (model "llama")."""
        v = Vocab(meta, where)
        tokens = v.tokens()
        n = len(tokens)
        types, scores = v.token_types(tokens), v.scores(n)

        def default(i):          # llama.cpp's SPM defaults for BOS and EOS, where they name a token
            return i if i < n else -1
        ids = {name: v.token_id(f"{name}_token_id", n, d) for name, d in
               (("bos", default(1)), ("eos", default(2)), ("unknown", -1))}
        add_bos, add_eos = v.flag("add_bos_token", True), v.flag("add_eos_token", False)
        for flag, name in ((add_bos, "bos"), (add_eos, "eos")):
            if flag and ids[name] < 0:
                v.fail(f"tokenizer.ggml.add_{name}_token is true but tokenizer.ggml.{name}_token_id is not set")
        return cls(tokens, scores, types, add_space_prefix=v.flag("add_space_prefix", True),
                   bos=ids["bos"], eos=ids["eos"], unk=ids["unknown"], add_bos=add_bos, add_eos=add_eos,
                   where=where)

    def _byte_tokens(self, where):
        """The 256 byte-fallback tokens <0x00>..<0xFF>: all of them, or none and an unknown token
        to stand for what the vocabulary cannot spell (SentencePiece without byte fallback)."""
        ids = [self.vocab.get(f"<0x{b:02X}>") for b in range(256)]
        missing = [b for b, i in enumerate(ids) if i is None]
        if not missing:
            return ids
        if len(missing) == 256 and self.unk >= 0:
            return None
        raise ModelError(f"{where}: tokenizer.ggml.tokens lacks the byte-fallback token <0x{missing[0]:02X}> "
                         f"({len(missing)} of the 256 are missing"
                         f"{'' if len(missing) < 256 else ', and there is no tokenizer.ggml.unknown_token_id'})")

    # --- encoding ---

    def encode(self, text, add_special_tokens=True, split_special_tokens=False):
        """Text -> token ids; add_special_tokens puts BOS/EOS as the file says. split_special_tokens
        (llama.cpp's parse_special=false) reads the text of a control or unknown token as plain
        text; user-defined tokens still match, as llama.cpp's partition keeps them."""
        if not isinstance(text, str):
            raise UsageError(f"encode takes text (str), got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            bad = f"U+{ord(e.object[e.start]):04X}"
            raise UsageError(f"text contains {bad}, a lone surrogate that UTF-8 cannot encode") from None
        ids, after_special = [], True
        for piece, token in (self.plain_specials if split_special_tokens else self.specials).split(text):
            if token is not None:
                ids.append(token)
                after_special = True
                continue
            if self.add_space_prefix and after_special:
                piece = " " + piece
            ids.extend(self._fragment(piece.replace(" ", SPACE)))
            after_special = False
        if add_special_tokens:
            ids = self.prefix_ids + ids + self.suffix_ids
        return ids

    def _fragment(self, text):
        ids = []
        for piece in spm_merge(text, self.vocab, self.scores):
            i = self.vocab.get(piece)
            if i is not None:
                ids.append(i)
            elif self.byte_ids is None:
                ids.append(self.unk)
            else:
                ids.extend(self.byte_ids[b] for b in piece.encode("utf-8"))
        return ids

    # --- decoding ---

    def decode_bytes(self, ids, skip_special_tokens=False):
        """Token ids -> raw UTF-8 bytes, for streaming: a character split across byte tokens comes
        out whole once its last byte arrives. Ids outside the vocabulary are skipped."""
        out = bytearray()
        for i in ids:
            if skip_special_tokens and i in self.special_ids:
                continue
            out += self._token_bytes(i)
        return bytes(out)

    def decode(self, ids, skip_special_tokens=False):
        """Token ids (or one id) -> text; an id that is not one of this vocabulary's is a
        UsageError (text(), for a model's output, skips those)."""
        return self.text(decode_ids(ids, len(self.tokens)), skip_special_tokens)

    def text(self, ids, skip_special_tokens=False):
        """decode() for ids a model produced: ids past the vocabulary are skipped."""
        out = self.decode_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")
        return out[1:] if self.add_space_prefix and out.startswith(" ") else out

    def _token_bytes(self, i):
        b = self._bytes_cache.get(i)
        if b is None:
            b = b""
            if 0 <= i < len(self.tokens):
                text, kind = self.tokens[i], self.types[i]
                if kind == BYTE and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text):
                    b = bytes([int(text[3:5], 16)])
                elif kind in (NORMAL, UNUSED):
                    b = text.replace(SPACE, " ").encode("utf-8")
                elif kind != UNDEFINED:      # control, user-defined, unknown: their text
                    b = text.encode("utf-8")
            self._bytes_cache[i] = b
        return b

    # --- vocabulary ---

    @property
    def vocab_size(self):
        return len(self.tokens)

    def token_to_id(self, token):
        """Token text -> id, or None."""
        return self.vocab.get(token)

    def id_to_token(self, i):
        """Id -> token text as stored ("▁the", "<0x0A>"), or None."""
        return self.tokens[i] if 0 <= i < len(self.tokens) else None

    @property
    def bos_id(self):
        return self.bos if self.bos >= 0 else None

    @property
    def eos_id(self):
        return self.eos if self.eos >= 0 else None
