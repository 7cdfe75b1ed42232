"""The tokens a denoising canvas is made of: the mask token, and text with [MASK] holes.

mask_token_id finds a model's mask token (config.json's, else a special token with a usual mask
name); parse_holes turns "The [MASK*3] sat." into the ids of a canvas whose holes are mask ids.
Model checks what it is given and builds the canvas from these; diffusion.py only denoises it.
"""
import re

from ..errors import UsageError
from ..formats.files import show

MASK_NAMES = ("<|mask|>", "[MASK]", "<mask>", "<|mdm_mask|>")
HOLE = re.compile(r"\[MASK(?:\*(\d+))?\]")      # [MASK] = one token, [MASK*N] = N tokens


def mask_token_id(config, tokenizer):
    """config.json's mask_token_id, else a special token with a usual mask name, else None."""
    if config.mask_token_id is not None:
        return config.mask_token_id
    for name in MASK_NAMES if tokenizer is not None else ():
        i = tokenizer.token_to_id(name)
        if i is not None and i in getattr(tokenizer, "special_ids", ()):
            return i
    return None


def parse_holes(tokenizer, text, mask_id, n_ctx):
    """Text with [MASK]/[MASK*N] holes -> (ids, where the text's ids start, where they end).

    [MASK] is one token, [MASK*N] is N tokens. The text between holes is tokenized piece by piece and
    never changes, except that one space right before a hole is left to the hole: byte-level BPE
    spells a word with its leading space (" time"), so "a [MASK]" asks for a word after "a", not for
    a word after "a ". The tokenizer's mask token written literally in the text is a hole too."""
    if not isinstance(text, str) or not text:
        raise UsageError("the text to infill is empty")
    bad = re.search(r"\[MASK\*(?!\d+\])[^\]]*\]?", text)
    if bad:
        raise UsageError(f"malformed hole {show(bad.group(0))} at character {bad.start()}: write [MASK] or "
                         "[MASK*N]")
    prefix, suffix = list(tokenizer.prefix_ids), list(tokenizer.suffix_ids)
    ids, at = list(prefix), 0
    for hole in HOLE.finditer(text):
        digits = (hole.group(1) or "1").lstrip("0") or "0"
        n = int(digits) if len(digits) <= 9 else n_ctx + 1        # (Python refuses to read 4300 digits)
        if n == 0:
            raise UsageError(f"empty hole {hole.group(0)} at character {hole.start()}: N must be >= 1")
        if len(ids) + n > n_ctx:
            raise UsageError(f"the holes and text exceed the context of {n_ctx} positions")
        before = text[at:hole.start()]
        before = before[:-1] if before.endswith(" ") and not before.endswith("  ") else before
        ids += tokenizer.encode(before, add_special_tokens=False) + [mask_id] * n
        at = hole.end()
    ids += tokenizer.encode(text[at:], add_special_tokens=False)
    if mask_id not in ids:
        raise UsageError("the text has no hole to fill: mark them with [MASK] or [MASK*N]")
    return ids + suffix, len(prefix), len(ids)
