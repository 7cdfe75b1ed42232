"""`tinydiff convert -m IN.gguf`: a GGUF file stored anew in another file type, as llama-quantize
does (llama.cpp src/llama-quant.cpp).

Every key of the input's metadata is copied, general.file_type set to the new type's llama_ftype
number and general.quantization_version to 2. Each tensor gets the type llama-quantize's mix gives
it (formats/mixes.py); one it does not quantize (vectors, norms), or whose type does not change,
is copied byte for byte; the others are quantized from their float32 values (a stored block type
dequantized first). As llama-quantize, a tensor already in a block type is requantized only with
allow_requantize (its errors add up); without it the file is refused before anything is written.
Any architecture: only the tensor names matter (blk.N., attn_v, ffn_down, output, token_embd).
"""
import numpy as np

from .errors import UsageError
from .formats import mixes, quant
from .formats.files import fail
from .formats.gguf import QUANTIZATION_VERSION, Planned, open_gguf, write_gguf

FLOAT_TYPES = ("F32", "F16", "BF16")


def plan(f, ftype, allow_requantize=False):
    """{name: (stored type, new type)} for the GGUFFile f as file type ftype, in f's tensor order;
    new type None where the tensor is copied. A UsageError if a block-type tensor would be requantized."""
    shapes = {name: f.shape(name) for name in f.tensors}
    layers = f.metadata.get(f"{f.metadata.get('general.architecture')}.block_count", 0)
    chosen = mixes.types(shapes, ftype, int(layers))
    out = {}
    for name in f.tensors:
        stored = f.type_name(name).lower()
        new = chosen.get(name)
        if new == stored:
            new = None
        if new is not None and stored.upper() not in FLOAT_TYPES and not allow_requantize:
            raise UsageError(f"{f.path}: tensor {name} is {stored.upper()}: requantizing from it to "
                             f"{new.upper()} is disabled; pass --allow-requantize (the errors add up)")
        out[name] = (stored, new)
    return out


def requantize(src, out, ftype, allow_requantize=False):
    """Writes the GGUF file src as file type ftype (mixes.CHOICES) at out. Returns {new type: count}."""
    f = open_gguf(src)
    ftype = mixes.canonical(ftype)
    plans = plan(f, ftype, allow_requantize)
    metadata = {k: (f.value_types[k], v) for k, v in f.metadata.items() if k != "general.alignment"}
    metadata["general.file_type"] = ("uint32", mixes.file_type(ftype))
    metadata["general.quantization_version"] = ("uint32", QUANTIZATION_VERSION)
    tensors, counts = {}, {}
    for name, (stored, new) in plans.items():
        t = new or stored
        counts[t] = counts.get(t, 0) + 1
        if t not in quant.READS:
            fail(src, f"tensor {name}: type {stored.upper()} cannot be copied (tinydiff reads "
                      f"{', '.join(n.upper() for n in quant.READS)})")
        tensors[name] = Planned(t, f.shape(name), _maker(f, name, new))
    write_gguf(out, metadata, tensors, alignment=f.alignment)
    return counts


def _maker(f, name, new):
    if new is None:
        return lambda: f.raw(name)

    def make():
        w = quant.dequantize(f.raw(name))
        w = np.asarray(w, np.float32).reshape(-1, w.shape[-1])       # 3-D tensors as their rows
        return quant.quantize(w, new).reshape(*f.shape(name)[:-1], -1)
    return make


def is_gguf(path):
    """Whether path is a file that starts as a GGUF file does."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"GGUF"
    except (IsADirectoryError, FileNotFoundError, PermissionError):
        return False

