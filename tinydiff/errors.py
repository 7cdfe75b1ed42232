"""The two kinds of error a user can cause, each printed by the CLI as one line.

UsageError: the request is wrong (an empty prompt, -n 0, a negative temperature); exit status 2.
ModelError: the model files are wrong (missing, truncated, a header that lies); exit status 1.
Messages name what is wrong and where: the file, the tensor, the flag. is_integer and is_number
say what a caller's value must be before it is compared (a string compared to 0 is a TypeError).
"""
import dataclasses
import numbers


class TinydiffError(Exception):
    exit_status = 1


class UsageError(TinydiffError, ValueError):
    exit_status = 2


class ModelError(TinydiffError):
    exit_status = 1


class NonFiniteLogits(ModelError):
    """A pass gave NaN logits (or -inf everywhere): the weights hold a NaN or an inf, most likely.
    The CLI names the tensors (model.check_tensors) after the message."""


def check_all(checks):
    """Raises a UsageError with the message of the first (ok, message) that is not ok."""
    for ok, message in checks:
        if not ok:
            raise UsageError(message)


def from_keywords(cls, what, keywords):
    """cls(**keywords) for an options dataclass, an unknown name being a UsageError that lists the
    known ones (`what` names the kind: "denoising option", ...)."""
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = [name for name in keywords if name not in known]
    if unknown:
        raise UsageError(f"unknown {what} {unknown[0]!r}; known: {', '.join(known)}")
    return cls(**keywords)


def is_integer(x):
    """A whole number given as one (numpy's included), not a bool and not 1.0."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def decode_ids(ids, vocab_size):
    """What decode() takes, as a list: token ids (or one id, as transformers takes it), each a whole
    number below vocab_size; else a UsageError naming the first that is not."""
    if is_integer(ids):
        ids = [ids]
    elif not hasattr(ids, "__iter__") or isinstance(ids, (str, bytes)):
        raise UsageError(f"decode takes token ids (a list of integers, or one), got {type(ids).__name__}")
    ids = list(ids)
    bad = next((i for i in ids if not is_integer(i) or not 0 <= i < vocab_size), None)
    if bad is not None:
        raise UsageError(f"decode: {bad!r} is not a token id of this tokenizer (0..{vocab_size - 1})")
    return ids


def is_number(x):
    """A real number (int or float, numpy's included), not a bool; NaN fails every range check."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)
