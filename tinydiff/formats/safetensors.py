"""Reads and writes safetensors files, from scratch: numpy and the standard library only.

The format (https://github.com/huggingface/safetensors):

    [8 bytes]  N, u64 little-endian
    [N bytes]  UTF-8 JSON object, maybe padded with trailing spaces:
               {"__metadata__": {str: str},                       (optional)
                "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
    [the rest] the data section; offsets are relative to its first byte, tensors are C-order,
               little-endian, and (as the reference reader demands) tile it with no gap or overlap.

The file is memory-mapped read-only and tensors come back as read-only views into the map, so
loading a model costs no copy: a matrix in its stored type (F32, F16, or BF16 as quant.BF16, which
every kernel reads), a vector (norms, biases) widened to float32, which is all the kernels take for
them and costs nothing. A 16 GB bf16 checkpoint takes 16 GB of address space and no more memory
than the pages a pass touches. The header comes from whoever made the file, so everything in it is
checked before an array is built: no header can make us read outside the map, and every problem is
one ModelError line naming the file, the tensor and what is wrong.
"""
import json
import math
import os
from collections import namedtuple

import numpy as np

from . import quant
from .files import TensorTable, check_file, fail, map_file, show, write_atomically

MAX_HEADER = 100_000_000  # the reference reader's limit: a bigger "header" is garbage or an attack
MAX_NDIM = 32             # far beyond any real tensor, and within what every numpy can build
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"

# Bytes per element of every dtype the format defines, in the reference's enum order (which its
# writer sorts by, so the widest tensors come first and every tensor is aligned to its element size).
DTYPE_SIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}
# The dtypes tinydiff reads, and the numpy dtype their bytes are viewed as (numpy has no bf16).
STORAGE = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}

Entry = namedtuple("Entry", "dtype shape begin end")  # shape: tuple; begin/end: data-section offsets


# ---------------------------------------------------------------------------------------------
# One file


class SafeTensors(TensorTable):
    """One safetensors file, mapped read-only. Arrays returned are views into the map (or, for
    F16/BF16 in f32(), converted copies); the map stays alive as long as any of them does."""

    def __init__(self, path, buf, data_start, entries, metadata):
        super().__init__(path, entries)   # name -> Entry, in header order
        self.metadata = metadata          # the "__metadata__" object, {} when absent
        self._buf = buf                   # the mmap
        self._data_start = data_start     # 8 + N: file offset of the data section

    def dtype(self, name):
        """The stored dtype as the file spells it: "F32", "F16", "BF16", ..."""
        return self.entry(name).dtype

    def shape(self, name):
        return self.entry(name).shape

    def raw(self, name):
        """Zero-copy read-only view in the stored dtype; BF16 comes back as its uint16 bit patterns."""
        e = self.entry(name)
        if e.dtype not in STORAGE:
            fail(self.path, f"tensor {show(name)}: dtype {e.dtype} not supported "
                             "(tinydiff reads F32, F16, BF16)")
        storage = STORAGE[e.dtype]
        flat = np.frombuffer(self._buf, dtype=storage, count=(e.end - e.begin) // storage.itemsize,
                             offset=self._data_start + e.begin)
        return flat.reshape(e.shape)

    def stored(self, name):
        """The tensor in its stored weight type (quant.TYPES: f32, f16, bf16), a view of the map."""
        a = self.raw(name)
        a = a.view(quant.BF16) if self.entry(name).dtype == "BF16" else a
        # Writers that follow the reference align every tensor to its element size; a hand-made
        # file may not, and the C kernels want aligned numbers.
        return a if a.flags.aligned else a.copy()

    def f32(self, name):
        """float32: a zero-copy view for F32 (copied only if the file misaligns it), else a converted copy."""
        a = self.raw(name)
        dtype = self.entry(name).dtype
        if dtype == "F16":
            return a.astype(np.float32)
        if dtype == "BF16":  # bf16 is the top half of an f32: shift the bits back into place
            bits = a.astype(np.uint32)
            bits <<= 16  # in place: `bits << 16` would turn a 0-d array into a numpy scalar
            return bits.view(np.float32)
        return self.stored(name)


def open_safetensors(path):
    """Maps and validates one .safetensors file; raises ModelError if anything in it is wrong."""
    path = os.fspath(path)
    buf = map_file(path, 8, "a safetensors header")
    n = int.from_bytes(buf[:8], "little")
    if n > MAX_HEADER:
        fail(path, f"header length {n} is absurd (over {MAX_HEADER} bytes); not a safetensors file?")
    if 8 + n > len(buf):
        fail(path, f"header length {n} runs past the end of the {len(buf)}-byte file; truncated?")
    header = _parse_json(path, buf[8:8 + n], "header")
    metadata = _check_metadata(path, header.pop("__metadata__", None))
    entries = {name: _check_entry(path, name, info) for name, info in header.items()}
    _check_layout(path, entries, len(buf) - 8 - n)
    return SafeTensors(path, buf, 8 + n, entries, metadata)


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs):
    """json object hook: the spec forbids duplicate keys, and json.loads would silently keep the last."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _parse_json(path, data, what):
    """Decodes a JSON object from file bytes; `what` names the part of the file in messages."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        fail(path, f"{what} is not valid UTF-8 (byte {e.start})")
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        fail(path, f"{what} has the key {show(e.args[0])} twice")
    except (ValueError, RecursionError) as e:  # RecursionError: absurdly deep nesting
        fail(path, f"{what} is not valid JSON: {show(e)}")
    if not isinstance(obj, dict):
        fail(path, f"{what} is not a JSON object")
    return obj


def _check_metadata(path, metadata):
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        fail(path, "__metadata__ is not an object of strings")
    return metadata


def _is_count(x):
    return type(x) is int and x >= 0  # not isinstance: JSON true/false arrive as bool, a subclass of int


def _check_entry(path, name, info):
    where = f"tensor {show(name)}"
    if not isinstance(info, dict):
        fail(path, f"{where}: entry is not an object")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in info:
            fail(path, f"{where}: no {key}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str):
        fail(path, f"{where}: dtype is not a string")
    if dtype not in DTYPE_SIZE:
        fail(path, f"{where}: unknown dtype {show(dtype)}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        fail(path, f"{where}: shape is not a list of non-negative integers")
    if len(shape) > MAX_NDIM:
        fail(path, f"{where}: shape has {len(shape)} dimensions (at most {MAX_NDIM})")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        fail(path, f"{where}: data_offsets is not [begin, end] with non-negative integers")
    begin, end = offsets
    if begin > end:
        fail(path, f"{where}: data_offsets [{show(begin)}, {show(end)}]: begin is after end")
    size = DTYPE_SIZE[dtype]
    if _too_big(shape, size):
        fail(path, f"{where}: shape {show(tuple(shape))} is absurdly large")
    nbytes = math.prod(shape) * size
    if nbytes != end - begin:
        fail(path, f"{where}: shape {tuple(shape)} {dtype} needs {nbytes} bytes "
                    f"but data_offsets [{show(begin)}, {show(end)}] hold {show(end - begin)}")
    return Entry(dtype, tuple(shape), begin, end)


def _too_big(shape, size):
    """True if the shape, zeros ignored, spans over 2**62 bytes: numpy refuses to build such a
    shape even when a zero dimension makes it empty (and no real file can hold it otherwise)."""
    n = size
    for d in shape:
        n *= max(d, 1)
        if n > 2**62:
            return True
    return False


def _check_layout(path, entries, data_len):
    """The tensors must tile the data section exactly, as the reference reader demands: sorted by
    offset each starts where the previous one ended, and the last ends at the end of the file. So a
    truncated file, an overlap, a hole and trailing bytes are all caught here."""
    prev, prev_end = None, 0
    for name, e in sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end)):
        where = f"tensor {show(name)}"
        if e.end > data_len:
            fail(path, f"{where}: data_offsets [{e.begin}, {e.end}] run past the end of the "
                        f"{data_len}-byte data section; truncated?")
        if e.begin < prev_end:
            fail(path, f"tensors {show(prev)} and {show(name)} overlap in the data section")
        if e.begin > prev_end:
            fail(path, f"data section bytes [{prev_end}, {e.begin}) before {where} belong to no tensor")
        prev, prev_end = name, e.end
    if prev_end != data_len:
        fail(path, f"{data_len - prev_end} bytes after the last tensor's data belong to no tensor")


# ---------------------------------------------------------------------------------------------
# A checkpoint: one file, or shards named by an index


class Checkpoint(TensorTable):
    """All the tensors of a model, from one file or several shards, with SafeTensors' methods.
    metadata: the single file's "__metadata__", or the index's "metadata" for a sharded checkpoint."""

    def __init__(self, path, files, owner, metadata):
        super().__init__(path, owner)     # path: the .safetensors file or the index; name -> its SafeTensors
        self.files = files                # [SafeTensors], one per shard
        self.metadata = metadata

    def file(self, name):
        """Path of the file holding the tensor, for messages."""
        return self.entry(name).path

    def dtype(self, name):
        return self.entry(name).dtype(name)

    def shape(self, name):
        return self.entry(name).shape(name)

    def raw(self, name):
        return self.entry(name).raw(name)

    def f32(self, name):
        return self.entry(name).f32(name)

    def stored(self, name):
        return self.entry(name).stored(name)

    def expect(self, name, shape):
        """The tensor after checking it exists with this shape: a matrix in its stored type (never
        widened, as gguf.py's expect), a vector as float32."""
        f = self.entry(name)
        got, want = f.shape(name), tuple(int(d) for d in shape)
        if got != want:
            fail(f.path, f"tensor {show(name)} has shape {got}, expected {want}")
        return f.f32(name) if len(want) == 1 else f.stored(name)


def load_checkpoint(path):
    """A model folder (model.safetensors, or model.safetensors.index.json and its shards), a
    .safetensors file, or an index file."""
    path = os.fspath(path)
    if os.path.isdir(path):
        # Like transformers: the single file wins when both are present.
        if os.path.exists(os.path.join(path, SINGLE)):
            return _load_single(os.path.join(path, SINGLE))
        if os.path.exists(os.path.join(path, INDEX)):
            return _load_sharded(os.path.join(path, INDEX))
        fail(path, f"no {SINGLE} or {INDEX} in this folder")
    if path.endswith(".index.json"):
        return _load_sharded(path)
    return _load_single(path)


def _load_single(path):
    f = open_safetensors(path)
    return Checkpoint(path, [f], {name: f for name in f.names}, f.metadata)


def _read_index(path):
    check_file(path)
    if os.path.getsize(path) > MAX_HEADER:
        fail(path, f"index is over {MAX_HEADER} bytes")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail(path, f"cannot read: {e.strerror}")
    index = _parse_json(path, data, "index")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        fail(path, "weight_map is missing or not an object of shard file names")
    bad = next((name for name, shard in weight_map.items() if not isinstance(shard, str)), None)
    if bad is not None:
        fail(path, f"weight_map[{show(repr(bad))}] should be a shard file name, got {show(repr(weight_map[bad]))}")
    metadata = index.get("metadata", {})
    if not isinstance(metadata, dict):
        fail(path, "metadata is not an object")
    return weight_map, metadata


def _load_sharded(index_path):
    weight_map, metadata = _read_index(index_path)
    folder = os.path.dirname(index_path)
    shards = {}  # shard file name -> SafeTensors, in the index's order
    for name, shard in weight_map.items():
        if shard in shards:
            continue
        # A bare file name only: the index must not send us to read files outside the folder.
        if shard in ("", ".", "..") or os.path.basename(shard) != shard:
            fail(index_path, f"tensor {show(name)}: shard {show(shard)} is not a file name in the folder")
        shard_path = os.path.join(folder, shard)
        if not os.path.exists(shard_path):
            fail(index_path, f"tensor {show(name)}: shard {show(shard)} is missing")
        shards[shard] = open_safetensors(shard_path)
    owner = _check_shards(index_path, weight_map, shards)
    return Checkpoint(index_path, list(shards.values()), owner, metadata)


def _check_shards(index_path, weight_map, shards):
    """Each tensor in exactly one shard, the one the index names; returns name -> SafeTensors."""
    owner = {}
    for f in shards.values():
        for name in f.names:
            if name in owner:
                fail(f.path, f"tensor {show(name)} is also in {show(owner[name].path)}")
            owner[name] = f
    for name, f in owner.items():
        shard = os.path.basename(f.path)
        if name not in weight_map:
            fail(index_path, f"tensor {show(name)} is in shard {show(shard)} but not in weight_map")
        if weight_map[name] != shard:
            fail(index_path, f"tensor {show(name)}: weight_map says shard {show(weight_map[name])} "
                              f"but it is in {show(shard)}")
    for name, shard in weight_map.items():
        if name not in owner:
            fail(index_path, f"tensor {show(name)}: weight_map says shard {show(shard)} but it is not there")
    return owner


# ---------------------------------------------------------------------------------------------
# Writing


def save_safetensors(path, tensors, metadata=None, dtypes=None):
    """Writes {name: array} to path, laid out like the reference writer (widest dtype first, header
    padded to 8 bytes, so every tensor is aligned to its element size) and readable by it.

    float32 arrays are stored as F32, float16 as F16; for BF16 pass the bit patterns as a uint16
    array and dtypes={name: "BF16"}. The file is written under a temporary name in the same folder
    and renamed into place, so a crash never leaves a half-written file at path.
    """
    dtypes = dict(dtypes or {})
    unknown = set(dtypes) - set(tensors)
    if unknown:
        raise ValueError(f"dtypes names tensors not given: {sorted(unknown)}")
    metadata = dict(metadata or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ValueError("metadata must map strings to strings")
    items = sorted((_to_storage(name, a, dtypes.get(name)) for name, a in tensors.items()),
                   key=lambda item: (-list(DTYPE_SIZE).index(item[1]), item[0]))

    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, a in items:
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)  # so the data section starts 8-aligned

    write_atomically(path, [len(text).to_bytes(8, "little"), text] +
                      [a.reshape(-1).view(np.uint8) for _, _, a in items])


def _to_storage(name, a, dtype):
    """(name, dtype, contiguous little-endian array) for one tensor to write."""
    if not isinstance(name, str) or name == "__metadata__":
        raise ValueError(f"bad tensor name {name!r}")
    a = np.asarray(a)
    if dtype is None:
        dtype = {"f4": "F32", "f2": "F16"}.get(a.dtype.str[1:])
    if dtype not in STORAGE or a.dtype.str[1:] != STORAGE[dtype].str[1:]:
        raise ValueError(f"tensor {name}: cannot store a {a.dtype} array as {dtype} "
                         "(F32 takes float32, F16 float16, BF16 uint16 bit patterns)")
    return name, dtype, np.asarray(a, dtype=STORAGE[dtype], order="C")  # keeps 0-d arrays 0-d
