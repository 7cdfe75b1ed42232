"""GGUF, llama.cpp's single-file model format: a reader and a writer of the container, from the
format description (ggml docs/gguf.md) with numpy and the standard library only.

    u32 magic "GGUF" | u32 version (3; 2 has the same layout) | u64 tensor_count | u64 kv_count
    kv_count     x  string key, u32 value_type, value
    tensor_count x  string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset
    zero padding to general.alignment (default 32)
    tensor data: tensor i at data_start + offset_i, offset_i the sizes of tensors 0..i-1 each
                 padded to the alignment (ggml's gguf.cpp requires it); the file ends there

Little-endian throughout. string = u64 byte length + UTF-8; array = u32 element type + u64 count +
the elements. ne[0] is the fastest-varying dimension (a row's length), so a numpy shape is ne
reversed. A block type stores each row of k weights as k/32 (or k/256) blocks, so its array is
[..., k/32] of quant.Q8_0, quant.Q4_0, ... ([..., k/256] of kquants.Q4_K, ...): byte for byte
ggml's layout, a view of the mapped file.

The reader checks everything before it builds an array: every length and count against the file
size, the alignment, each tensor's type, dims and byte range, and that the tensors tile the data
section as ggml lays it out (no gap, no bytes after the last); no file can make it read outside the
map. A block tensor whose float scales hold a NaN or an infinity is refused when it is read
(llama.cpp's ggml_validate_row_data checks the same), one vectorised pass over its scale fields.
Every problem is one ModelError line naming the file and what is wrong.

gguf_model.py maps a file to tinydiff's Config and Weights, convert.py writes one from a Hugging
Face folder.
"""
import math
import os
import struct
from collections import namedtuple

import numpy as np

from . import quant
from .files import TensorTable, fail, map_file, show, write_atomically

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4              # GGML_MAX_DIMS
MAX_NAME = 64             # the spec's limit on a tensor name, in bytes
MAX_NESTING = 3           # arrays of arrays: the spec allows them, nobody needs them deep
QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION: the block layouts used here

# gguf_metadata_value_type: code -> (name, struct format; None for string and array)
VALUE_TYPES = {
    0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"),
    4: ("uint32", "<I"), 5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<B"),
    8: ("string", None), 9: ("array", None), 10: ("uint64", "<Q"), 11: ("int64", "<q"),
    12: ("float64", "<d"),
}
VALUE_CODES = {name: code for code, (name, _) in VALUE_TYPES.items()}
INT_TYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64")

# ggml_type: code -> (name, weights per block, bytes per block), for every type a GGUF file may
# hold (gguf-py's GGML_QUANT_SIZES), so any file's byte ranges can be checked.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}
# The ones tinydiff computes with (every type llama.cpp writes for dense models but the IQ2/IQ3/IQ1
# grids, the ternary TQ types and the FP4 ones); quant.py names them in lower case.
STORAGE = tuple(name.upper() for name in quant.READS)
GGML_CODES = {GGML_TYPES[code][0]: code for code in GGML_TYPES}

TensorInfo = namedtuple("TensorInfo", "name type ne offset nbytes")  # type: ggml code; ne: dims as stored


def _pad(n, alignment):
    return -n % alignment


# ---------------------------------------------------------------------------------------------
# Reading


class GGUFFile(TensorTable):
    """One GGUF file, mapped read-only. metadata: key -> value (int, float, bool, str or list);
    value_types: key -> "uint32", "string", "array[string]", ...; arrays come back as views into
    the map (F32 and F16 as float32/float16, the rest as quant.py's dtypes)."""

    def __init__(self, path, buf, version, metadata, value_types, tensors, alignment, data_start):
        super().__init__(path, tensors)   # name -> TensorInfo, in file order
        self.tensors = tensors
        self.version = version
        self.metadata = metadata
        self.value_types = value_types
        self.alignment = alignment
        self.data_start = data_start      # file offset of the data section
        self._buf = buf

    def type_name(self, name):
        """"F32", "Q8_0", ... as llama.cpp spells ggml types."""
        return GGML_TYPES[self.entry(name).type][0]

    def shape(self, name):
        """The numpy shape in weights (ne reversed), whatever the storage type."""
        return tuple(reversed(self.entry(name).ne))

    def raw(self, name, checked=True):
        """A read-only view of the tensor in its stored type: [..., k] for F32/F16/BF16, [..., k/32]
        or [..., k/256] blocks for the block types; refused if a block's scales are not finite
        (unless not `checked`: check_tensors counts them)."""
        t = self.entry(name)
        type_name, block, _ = GGML_TYPES[t.type]
        if type_name not in STORAGE:
            fail(self.path, f"tensor {show(name)}: type {type_name} not supported "
                             f"(tinydiff reads {', '.join(STORAGE)})")
        dtype = quant.READS[type_name.lower()]
        shape = self.shape(name)
        shape = shape[:-1] + (shape[-1] // block,) if shape else shape
        a = np.frombuffer(self._buf, dtype=dtype, count=t.nbytes // dtype.itemsize,
                          offset=self.data_start + t.offset).reshape(shape)
        bad = quant.nonfinite_scale(a) if checked else None
        if bad is not None:
            fail(self.path, f"tensor {show(name)}: block {list(bad)} of its {type_name} blocks has a scale that is "
                             "NaN or infinite")
        return a if a.flags.aligned else a.copy()   # a custom alignment below 4 can misalign floats

    def expect(self, name, shape):
        """The tensor after checking it exists with this shape: a matrix in its stored type (never
        widened), a vector (norms, biases) as float32, which is all the kernels take for them."""
        got, want = self.shape(name), tuple(int(d) for d in shape)
        if got != want:
            fail(self.path, f"tensor {show(name)} has shape {got}, expected {want}")
        a = self.raw(name)
        return quant.dequantize(a) if len(want) == 1 else a

    def stored_bytes(self):
        """Bytes of the tensors per ggml type name."""
        total = {}
        for t in self.tensors.values():
            name = GGML_TYPES[t.type][0]
            total[name] = total.get(name, 0) + t.nbytes
        return total


class _Reader:
    """A cursor over the mapped file that checks every read against its end."""

    def __init__(self, path, buf):
        self.path, self.buf, self.pos, self.size = path, buf, 0, len(buf)

    def fail(self, what):
        fail(self.path, what)

    def take(self, n, what):
        if n > self.size - self.pos:
            self.fail(f"{what} at byte {self.pos} needs {n} bytes but the file ends at {self.size}; truncated?")
        start, self.pos = self.pos, self.pos + n
        return start

    def scalar(self, fmt, what):
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what):
        n = self.scalar("<Q", f"{what}'s length")
        if n > self.size - self.pos:
            self.fail(f"{what}: string length {n} at byte {self.pos - 8} runs past the end of the "
                      f"{self.size}-byte file")
        start = self.take(n, what)
        try:
            return bytes(self.buf[start:start + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(f"{what}: string at byte {start} is not valid UTF-8 (byte {start + e.start})")

    def value(self, code, what, depth=0):
        """One metadata value of type `code` -> (value, type name)."""
        if code not in VALUE_TYPES:
            self.fail(f"{what}: unknown value type {code}")
        name, fmt = VALUE_TYPES[code]
        if name == "string":
            return self.string(what), name
        if name == "array":
            return self.array(what, depth)
        v = self.scalar(fmt, what)
        if name == "bool":
            if v > 1:
                self.fail(f"{what}: bool value {v} is neither 0 nor 1")
            v = bool(v)
        return v, name

    def array(self, what, depth):
        if depth >= MAX_NESTING:
            self.fail(f"{what}: arrays nested over {MAX_NESTING} deep")
        code = self.scalar("<I", f"{what}'s element type")
        n = self.scalar("<Q", f"{what}'s length")
        if code not in VALUE_TYPES:
            self.fail(f"{what}: unknown array element type {code}")
        name, fmt = VALUE_TYPES[code]
        least = 8 if name == "string" else 12 if name == "array" else struct.calcsize(fmt)
        if n > (self.size - self.pos) // least:   # before looping: a lying count fails here, fast
            self.fail(f"{what}: array of {n} {name} values at byte {self.pos - 12} cannot fit in the "
                      f"{self.size}-byte file; truncated?")
        if fmt is not None and name != "bool":
            values = np.frombuffer(self.buf, np.dtype(fmt), n, self.take(n * least, what)).tolist()
            return values, f"array[{name}]"
        items = [self.value(code, f"{what}[{i}]", depth + 1) for i in range(n)]
        inner = items[0][1] if items else name
        return [v for v, _ in items], f"array[{inner}]"


def open_gguf(path):
    """Maps and validates a GGUF file (version 2 or 3, little-endian)."""
    path = os.fspath(path)
    r = _Reader(path, map_file(path, 24, "a GGUF header"))
    if bytes(r.buf[:4]) != MAGIC:
        r.fail(f"not a GGUF file (starts with {bytes(r.buf[:4])!r}, expected {MAGIC!r})")
    r.pos = 4
    version = r.scalar("<I", "version")
    if version not in (2, 3):
        if version & 0xFFFF == 0 and version >> 16:       # a byte-swapped small number
            r.fail("big-endian GGUF files are not supported")
        r.fail(f"GGUF version {version} not supported (only 2 and 3)")
    n_tensors = r.scalar("<Q", "tensor count")
    n_kv = r.scalar("<Q", "metadata count")
    # the smallest metadata entry is 13 bytes, the smallest tensor info 24: a count that lies
    # about more than the file can hold fails here, before any loop or allocation
    if n_kv > r.size // 13 or n_tensors > r.size // 24 or n_kv * 13 + n_tensors * 24 > r.size - r.pos:
        r.fail(f"{n_tensors} tensors and {n_kv} metadata entries cannot fit in the {r.size}-byte file")
    metadata, value_types = _read_metadata(r, n_kv)
    alignment = _alignment(r, metadata, value_types)
    tensors = _read_tensor_infos(r, n_tensors, alignment)
    data_start = r.pos + _pad(r.pos, alignment)
    if data_start > r.size:
        r.fail(f"the data section would start at byte {data_start}, past the end of the {r.size}-byte file")
    if any(r.buf[r.pos:data_start]):
        r.fail(f"bytes {r.pos}..{data_start} after the tensor infos are not zero padding; "
               f"is the tensor count ({n_tensors}) right?")
    _check_data_ranges(r, tensors, data_start, alignment)
    return GGUFFile(path, r.buf, version, metadata, value_types, tensors, alignment, data_start)


def _read_metadata(r, n_kv):
    metadata, value_types = {}, {}
    for i in range(n_kv):
        key = r.string(f"metadata key {i}")
        if key in metadata:
            r.fail(f"metadata key {show(key)} appears twice")
        code = r.scalar("<I", f"metadata {show(key)}'s type")
        metadata[key], value_types[key] = r.value(code, f"metadata {show(key)}")
    return metadata, value_types


def _alignment(r, metadata, value_types):
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    a = metadata["general.alignment"]
    if value_types["general.alignment"] != "uint32" or a == 0 or a & (a - 1):
        r.fail(f"general.alignment should be a uint32 power of two, got {value_types['general.alignment']} {a!r}")
    return a


def _read_tensor_infos(r, n_tensors, alignment):
    tensors = {}
    for i in range(n_tensors):
        name = r.string(f"tensor {i}'s name")
        where = f"tensor {show(name)}"
        if len(name.encode("utf-8")) > MAX_NAME:
            r.fail(f"{where}: name longer than {MAX_NAME} bytes")
        if name in tensors:
            r.fail(f"{where} appears twice")
        n_dims = r.scalar("<I", f"{where}'s n_dims")
        if n_dims > MAX_DIMS:
            r.fail(f"{where}: {n_dims} dimensions (at most {MAX_DIMS})")
        ne = tuple(r.scalar("<Q", f"{where}'s dimensions") for _ in range(n_dims))
        code = r.scalar("<I", f"{where}'s type")
        offset = r.scalar("<Q", f"{where}'s offset")
        if code not in GGML_TYPES:
            r.fail(f"{where}: unknown tensor type {code}")
        type_name, block, size = GGML_TYPES[code]
        if ne and ne[0] % block:
            r.fail(f"{where}: rows of {ne[0]} weights are not whole {type_name} blocks of {block}")
        n = 1
        for d in ne:
            n *= d
        if any(d >= 2**63 for d in ne) or n // block * size >= 2**63:
            r.fail(f"{where}: dimensions {list(ne)} are absurdly large")
        if offset % alignment:
            r.fail(f"{where}: offset {offset} is not a multiple of the alignment {alignment}")
        tensors[name] = TensorInfo(name, code, ne, offset, n // block * size)
    return tensors


def _check_data_ranges(r, tensors, data_start, alignment):
    """The data section as ggml's gguf.cpp lays it out and checks it: tensor i at the padded size of
    tensors 0..i-1 (so no gap, overlap or reordering hides bytes a changed type or shape no longer
    covers), and the file ends where the last tensor's padding does (or where its data does, for a
    writer that leaves the last padding out): bytes after it are refused."""
    data_len, end, prev = r.size - data_start, 0, None
    for t in tensors.values():
        if t.offset != end:
            before = f"the tensor before it, {show(prev.name)}, ends at {end}" if prev else "the first should be at 0"
            r.fail(f"tensor {show(t.name)}: offset {t.offset}, but {before} (padded to {alignment}); "
                   "a wrong type, shape or general.alignment?")
        if t.nbytes > data_len - t.offset:
            r.fail(f"tensor {show(t.name)}: data [{t.offset}, {t.offset + t.nbytes}) runs past the end of "
                   f"the {data_len}-byte data section; truncated?")
        end, prev = t.offset + t.nbytes + _pad(t.nbytes, alignment), t
    if prev is not None and data_len > end:
        r.fail(f"{data_len - end} bytes after the last tensor, {show(prev.name)}, which ends at {end} of the "
               f"{data_len}-byte data section; a wrong type, shape or general.alignment?")


# ---------------------------------------------------------------------------------------------
# Writing


# A tensor to write without holding it in memory first: its quant.py type name ("q8_0"), its shape
# in weights, and a function that makes the array when it is written.
Planned = namedtuple("Planned", "type shape make")


def _plan(a):
    """An array as a Planned tensor."""
    a = np.asarray(a)
    shape = a.shape[:-1] + (quant.columns(a),) if a.ndim else a.shape
    return Planned(quant.type_of(a), shape, lambda: a)


def _nbytes(p):
    _, block, size = GGML_TYPES[GGML_CODES[p.type.upper()]]
    return math.prod(p.shape) // block * size


def write_gguf(path, metadata, tensors, alignment=DEFAULT_ALIGNMENT):
    """Writes a GGUF v3 file: metadata {key: (value type, value)} in order, value types named as
    VALUE_TYPES ("uint32", "string", "array[string]", ...); tensors {name: array or Planned} in a
    tinydiff weight type, each at an aligned offset. Written under a temporary name in the same
    folder, then renamed into place: a crash never leaves a half-written file at path."""
    metadata = dict(metadata)
    if alignment != DEFAULT_ALIGNMENT:
        metadata["general.alignment"] = ("uint32", alignment)
    plans = {name: t if isinstance(t, Planned) else _plan(t) for name, t in tensors.items()}
    header = [MAGIC, struct.pack("<IQQ", 3, len(plans), len(metadata))]
    for key, (kind, value) in metadata.items():
        header += [_string(key), _value(kind, value, with_type=True)]
    offset = 0
    for name, p in plans.items():
        ne = list(reversed(p.shape))
        header += [_string(name), struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, GGML_CODES[p.type.upper()], offset)]
        offset += _nbytes(p) + _pad(_nbytes(p), alignment)
    head = b"".join(header)
    write_atomically(path, _chunks(head + bytes(_pad(len(head), alignment)), plans, alignment))


def _chunks(head, plans, alignment):
    yield head
    for name, p in plans.items():
        a = np.ascontiguousarray(p.make())
        if quant.type_of(a) != p.type or a.nbytes != _nbytes(p):
            raise ValueError(f"tensor {name}: made {a.dtype} {a.shape}, planned {p.type} {p.shape}")
        yield a.reshape(-1).view(np.uint8)
        yield bytes(_pad(a.nbytes, alignment))


def _string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(kind, value, with_type=False):
    """The bytes of one metadata value (preceded by its type code when with_type)."""
    if kind.startswith("array[") and kind.endswith("]"):
        inner = kind[6:-1]
        body = struct.pack("<IQ", VALUE_CODES["array" if inner.startswith("array[") else inner], len(value))
        if inner in ("string", "bool") or inner.startswith("array["):
            body += b"".join(_value(inner, v) for v in value)
        else:
            body += np.asarray(value, dtype=VALUE_TYPES[VALUE_CODES[inner]][1]).tobytes()
        code = VALUE_CODES["array"]
    else:
        code = VALUE_CODES[kind]
        body = _string(value) if kind == "string" else struct.pack(VALUE_TYPES[code][1], value)
    return (struct.pack("<I", code) if with_type else b"") + body
