"""A GGUF file's vocabulary keys (tokenizer.ggml.*), read and checked for both kinds of vocabulary
tinydiff builds: "gpt2" (byte-level BPE, tokenizer.py) and "llama" (SentencePiece, sentencepiece.py).

What llama.cpp's converter writes (gguf-py's constants, llama-vocab.cpp reads them):
  tokens       array[string]   one per id; no two alike (llama.cpp refuses a duplicate)
  token_type   array[int32]    llama_token_type per id (below); absent: all NORMAL
  scores       array[float32]  SentencePiece only: the merge priority of each token
  merges       array[string]   BPE only: "a b", in rank order
  bos/eos/unknown_token_id, add_bos_token, add_eos_token, add_space_prefix
Every problem is one ModelError line naming the file and the key (and the index, for an entry).
As llama.cpp's loader does, a token whose text is one of CONTROL_TEXTS (end-of-turn, end-of-text,
fill-in-the-middle markers) is a control token whatever its token_type says: such text is read as
text when special tokens are not parsed, and skipped by decode's skip_special_tokens.
"""
import math

from ..errors import ModelError
from .files import show

KEY = "tokenizer.ggml."
# llama_token_type: 0 undefined, 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = range(7)
MODELS = ("gpt2", "llama")
# The texts llama-vocab.cpp's load makes end-of-generation tokens whatever the ids say ("auto-detect
# special tokens by text"), and with the end-of-turn and fill-in-the-middle ones, control tokens.
# (llama.cpp makes only the first it meets of each FIM kind control; all of them are here.)
END_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<｜end▁of▁sentence｜>", "[e~[")
CONTROL_TEXTS = frozenset(END_TOKENS + (
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
    "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
    "▁<MID>", "<|code_middle|>", "<|middle|>", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"))


class Vocab:
    """Checked reads of one file's tokenizer.ggml.* keys; `where` names the file in messages."""

    def __init__(self, meta, where):
        self.meta, self.where = meta, where

    def fail(self, what):
        raise ModelError(f"{self.where}: {what}")

    def get(self, name, kind, default=None):
        """tokenizer.ggml.<name>, checked to be of kind (a list: of strings for tokens and merges,
        of numbers for scores, of integers otherwise); default when absent, an error when None."""
        value = self.meta.get(KEY + name, default)
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is list and ok:   # item types by set(map(type)): C speed for 262k tokens
            item = {str} if name in ("tokens", "merges") else {int, float} if name == "scores" else {int}
            ok = set(map(type, value)) <= item
        if value is None or not ok:
            what = {list: "a list", str: "a string", int: "an integer", bool: "true or false"}[kind]
            self.fail(f"{KEY}{name} missing or not {what}")
        return value

    def model(self):
        model = self.get("model", str, "")
        if model not in MODELS:
            self.fail(f"{KEY}model {show(repr(model))} not supported (supported: {', '.join(MODELS)})")
        return model

    def tokens(self):
        return self.get("tokens", list)

    def per_token(self, name, n, default):
        """A list with one entry per token (token_type, scores): exactly n, or the default."""
        values = self.get(name, list, default)
        if len(values) != n:
            self.fail(f"{KEY}{name} has {len(values)} entries for {n} tokens")
        return values

    def token_types(self, tokens):
        """token_type, one per token, with CONTROL_TEXTS made control."""
        n = len(tokens)
        types = list(self.per_token("token_type", n, [NORMAL] * n))
        if types and not UNDEFINED <= min(types) <= max(types) <= BYTE:
            bad = next(i for i, t in enumerate(types) if not UNDEFINED <= t <= BYTE)
            self.fail(f"{KEY}token_type[{bad}] is {types[bad]}, not a llama_token_type (0..6)")
        for i in (i for i, t in enumerate(tokens) if t in CONTROL_TEXTS):
            types[i] = CONTROL
        return types

    def scores(self, n):
        scores = self.per_token("scores", n, None)
        if any(map(math.isnan, scores)):   # a NaN has no place in the merge order
            self.fail(f"{KEY}scores[{next(i for i, s in enumerate(scores) if math.isnan(s))}] is NaN")
        return scores

    def token_id(self, name, n, default=-1):
        """tokenizer.ggml.<name> (an id) or default; an id outside the n tokens is an error."""
        i = self.get(name, int, default)
        if i != default and not 0 <= i < n:
            self.fail(f"{KEY}{name} {i} is outside the {n} tokens")
        return i

    def flag(self, name, default):
        return self.get(name, bool, default)
