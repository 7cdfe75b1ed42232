"""The safetensors reader/writer: round trips, zero copy, every malformed-file error, sharded
checkpoints, and fuzzing that no byte pattern gets past the validation."""
import json
import mmap
import os
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinydiff.errors import ModelError
from tinydiff.formats.files import write_atomically
from tinydiff.formats.safetensors import (
    load_checkpoint,
    open_safetensors,
    save_safetensors,
)

F32 = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
F16 = np.array([[0.5, -1.25, 65504.0], [1e-3, 0.0, -0.0]], dtype=np.float16)
# bf16 bit patterns and the float32 each stands for (bf16 is the top 16 bits of an f32)
BF16_BITS = np.array([0x3F80, 0xC000, 0x3F00, 0x4049, 0x7F80, 0x0001, 0x8000], dtype=np.uint16)
BF16_VALUES = np.array([1.0, -2.0, 0.5, 3.140625, np.inf, 2.0**-133, -0.0], dtype=np.float32)


def craft(path, header, data=b"", n=None):
    """A file from parts: header is a JSON-able object or raw bytes; n overrides the length field."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if n is None else n) + text + data)
    return path


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def error(fn, *args):
    with pytest.raises(ModelError) as e:
        fn(*args)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def save_sample(path):
    save_safetensors(path, {"w": F32, "h": F16, "b": BF16_BITS, "s": np.float32(2.5),
                            "e": np.zeros((0, 3), np.float32)},
                     metadata={"format": "pt"}, dtypes={"b": "BF16"})
    return path


# --------------------------------------------------------------------------------------------
# Reading what we wrote


def test_round_trip(tmp_path):
    f = open_safetensors(save_sample(tmp_path / "m.safetensors"))
    assert sorted(f.names) == ["b", "e", "h", "s", "w"]
    assert f.metadata == {"format": "pt"}
    assert [f.dtype(n) for n in "whb"] == ["F32", "F16", "BF16"]
    assert f.shape("w") == (3, 4) and f.shape("s") == () and f.shape("e") == (0, 3)
    np.testing.assert_array_equal(f.f32("w"), F32)
    np.testing.assert_array_equal(f.raw("h"), F16)
    assert f.raw("h").dtype == np.float16
    np.testing.assert_array_equal(f.f32("h"), F16.astype(np.float32))
    assert f.f32("s") == np.float32(2.5) and f.f32("e").shape == (0, 3)


def test_scalars_stay_arrays(tmp_path):
    path = tmp_path / "m.safetensors"
    save_safetensors(path, {"f": np.array(1.5, np.float32), "h": np.array(1.5, np.float16),
                            "b": np.array(0x3FC0, np.uint16)}, dtypes={"b": "BF16"})
    f = open_safetensors(path)
    for name in "fhb":
        a = f.f32(name)
        assert isinstance(a, np.ndarray) and a.shape == () and a.dtype == np.float32 and a == 1.5


def test_bf16_matches_hand_conversion(tmp_path):
    f = open_safetensors(save_sample(tmp_path / "m.safetensors"))
    assert f.raw("b").dtype == np.uint16
    np.testing.assert_array_equal(f.raw("b"), BF16_BITS)
    got = f.f32("b")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), BF16_VALUES.view(np.uint32))  # -0.0 too


def test_f32_is_a_read_only_view_of_the_map(tmp_path):
    f = open_safetensors(save_sample(tmp_path / "m.safetensors"))
    a = f.f32("w")
    base = a
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap)
    assert np.shares_memory(a, f.raw("w"))
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0, 0] = 1.0


def test_writer_aligns_every_tensor(tmp_path):
    # Odd element counts: a naive layout would put the F32 tensor at an odd offset.
    path = tmp_path / "m.safetensors"
    save_safetensors(path, {"a": np.ones(3, np.float16), "bb": np.ones(5, np.float32), "c": np.ones(1, np.uint16)},
                     dtypes={"c": "BF16"})
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    assert (8 + n) % 8 == 0 and raw[8 + n - 1:8 + n] in (b"}", b" ")
    header = json.loads(raw[8:8 + n])
    for name, info in header.items():
        assert info["data_offsets"][0] % (4 if info["dtype"] == "F32" else 2) == 0
    f = open_safetensors(path)
    assert all(f.raw(name).flags.aligned for name in f.names)


def test_writer_replaces_atomically(tmp_path, monkeypatch):
    path = save_sample(tmp_path / "m.safetensors")
    before = path.read_bytes()

    def crash(fd):
        raise OSError("disk on fire")
    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError):
        save_safetensors(path, {"w": np.zeros(4, np.float32)})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.safetensors"]  # the temporary file is gone


@pytest.mark.parametrize("tensors, dtypes", [
    ({"w": np.zeros(2)}, None),                                       # float64
    ({"w": np.zeros(2, np.float32)}, {"w": "BF16"}),                  # bf16 wants uint16 bits
    ({"w": np.zeros(2, np.uint16)}, None),                            # uint16 without BF16
    ({"w": np.zeros(2, np.int64)}, {"w": "I64"}),                     # not a dtype we write
    ({"__metadata__": np.zeros(2, np.float32)}, None),
    ({"w": np.zeros(2, np.float32)}, {"v": "F32"}),
])
def test_writer_rejects(tmp_path, tensors, dtypes):
    with pytest.raises(ValueError):
        save_safetensors(tmp_path / "m.safetensors", tensors, dtypes=dtypes)
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------------------------
# Hand-made files the writer would not produce, but are valid


def test_valid_hand_made_files(tmp_path):
    data = np.arange(4, dtype="<f4").tobytes()
    # the spec allows trailing spaces after the JSON; no __metadata__; an empty tensor at the end
    header = json.dumps({"x": t("F32", [2, 2], 0, 16), "z": t("F16", [0], 16, 16)}).encode() + b"   "
    f = open_safetensors(craft(tmp_path / "a.safetensors", header, data))
    assert f.metadata == {}
    np.testing.assert_array_equal(f.f32("x"), [[0, 1], [2, 3]])
    assert f.raw("z").shape == (0,)
    assert open_safetensors(craft(tmp_path / "b.safetensors", {})).names == []


def test_misaligned_f32_is_copied_aligned(tmp_path):
    # header length 1 mod 4 makes the data section start at an odd address
    header = json.dumps({"x": t("F32", [3], 0, 12)}).encode()
    header += b" " * ((1 - len(header)) % 4)
    f = open_safetensors(craft(tmp_path / "m.safetensors", header, np.array([1, 2, 3], "<f4").tobytes()))
    assert not f.raw("x").flags.aligned
    a = f.f32("x")
    assert a.flags.aligned
    np.testing.assert_array_equal(a, [1, 2, 3])


def test_known_but_unsupported_dtype(tmp_path):
    # A checkpoint may carry an I64 buffer the model never reads: the file opens, the tensor does not.
    path = craft(tmp_path / "m.safetensors", {"pos": t("I64", [2], 0, 16), "w": t("F32", [1], 16, 20)},
                 bytes(20))
    f = open_safetensors(path)
    assert f.dtype("pos") == "I64" and f.shape("pos") == (2,)
    np.testing.assert_array_equal(f.f32("w"), [0])
    for get in (f.raw, f.f32):
        msg = error(get, "pos")
        assert str(path) in msg and "pos" in msg and "dtype I64 not supported" in msg


# --------------------------------------------------------------------------------------------
# Malformed files: each is one ModelError line naming the file, the tensor and the problem

W = t("F32", [2], 0, 8)
BAD = {
    # id: (header (object or bytes), data, length-field override, words the message must contain)
    "short header length": (b"{}", b"", 100, ["runs past the end"]),
    "absurd header length": (b"{}", b"", 2**64 - 1, ["absurd"]),
    "header not utf-8": (b'{"w\xff": 1}', b"", None, ["not valid UTF-8"]),
    "header not json": (b'{"w": ', b"", None, ["not valid JSON"]),
    "header not object": (b"[1, 2]", b"", None, ["not a JSON object"]),
    "duplicate tensor": (b'{"w": 1, "w": 2}', b"", None, ["w", "twice"]),
    "deep nesting": (b"[" * 100000, b"", None, ["not valid JSON"]),
    "metadata not strings": ({"__metadata__": {"a": 1}}, b"", None, ["__metadata__"]),
    "entry not object": ({"w": [1]}, b"", None, ["tensor w", "not an object"]),
    "no dtype": ({"w": {"shape": [2], "data_offsets": [0, 8]}}, bytes(8), None, ["tensor w", "no dtype"]),
    "no shape": ({"w": {"dtype": "F32", "data_offsets": [0, 8]}}, bytes(8), None, ["tensor w", "no shape"]),
    "no offsets": ({"w": {"dtype": "F32", "shape": [2]}}, bytes(8), None, ["tensor w", "no data_offsets"]),
    "dtype not string": ({"w": t(4, [2], 0, 8)}, bytes(8), None, ["tensor w", "dtype"]),
    "unknown dtype": ({"w": t("F99", [2], 0, 8)}, bytes(8), None, ["tensor w", "unknown dtype F99"]),
    "shape not list": ({"w": t("F32", 2, 0, 8)}, bytes(8), None, ["tensor w", "shape"]),
    "negative dim": ({"w": t("F32", [-2], 0, 8)}, bytes(8), None, ["tensor w", "shape"]),
    "float dim": ({"w": t("F32", [2.0], 0, 8)}, bytes(8), None, ["tensor w", "shape"]),
    "bool dim": ({"w": t("F32", [True, 2], 0, 8)}, bytes(8), None, ["tensor w", "shape"]),
    "too many dims": ({"w": t("F32", [1] * 40 + [2], 0, 8)}, bytes(8), None, ["tensor w", "dimensions"]),
    "absurd empty shape": ({"w": t("F32", [2**62, 2**62, 0], 0, 0)}, b"", None, ["tensor w", "absurdly large"]),
    "offsets not pair": ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, bytes(8), None,
                         ["tensor w", "data_offsets"]),
    "negative offset": ({"w": t("F32", [2], -8, 0)}, bytes(8), None, ["tensor w", "data_offsets"]),
    "float offset": ({"w": t("F32", [2], 0, 8.0)}, bytes(8), None, ["tensor w", "data_offsets"]),
    "begin after end": ({"w": t("F32", [0], 8, 0)}, bytes(8), None, ["tensor w", "begin is after end"]),
    "size mismatch": ({"w": t("F32", [3], 0, 8)}, bytes(8), None, ["tensor w", "needs 12 bytes", "hold 8"]),
    "truncated": ({"w": W}, bytes(5), None, ["tensor w", "run past the end", "truncated"]),
    "huge offsets": ({"w": t("F32", [2], 2**70, 2**70 + 8)}, bytes(8), None, ["tensor w", "run past the end"]),
    "overlap": ({"w": W, "v": t("F32", [1], 4, 8)}, bytes(8), None, ["w", "v", "overlap"]),
    "hole": ({"w": W, "v": t("F32", [1], 12, 16)}, bytes(16), None, ["tensor v", "belong to no tensor"]),
    "trailing bytes": ({"w": W}, bytes(12), None, ["4 bytes after", "belong to no tensor"]),
    "name with newline": ({"a\nb": t("F32", [3], 0, 8)}, bytes(8), None, [r"a\nb"]),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_malformed_file(tmp_path, case):
    header, data, n, words = BAD[case]
    path = craft(tmp_path / "bad.safetensors", header, data, n)
    msg = error(open_safetensors, path)
    assert msg.startswith(str(path) + ": ")
    for word in words:
        assert word in msg


@pytest.mark.parametrize("size", [0, 7])
def test_file_too_short(tmp_path, size):
    path = tmp_path / "m.safetensors"
    path.write_bytes(bytes(size))
    assert "too short" in error(open_safetensors, path)


def test_not_a_file(tmp_path):
    assert "file not found" in error(open_safetensors, tmp_path / "nope.safetensors")
    assert "not a regular file" in error(open_safetensors, tmp_path)


# --------------------------------------------------------------------------------------------
# Checkpoints: one file or shards


def shard_folder(tmp_path, weight_map=None):
    """a.safetensors holds x, y; b.safetensors holds z; the index says so unless weight_map is given."""
    save_safetensors(tmp_path / "a.safetensors", {"x": F32, "y": F16})
    save_safetensors(tmp_path / "b.safetensors", {"z": BF16_BITS}, dtypes={"z": "BF16"})
    weight_map = weight_map or {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"}
    index = {"metadata": {"total_size": 123}, "weight_map": weight_map}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return tmp_path


def test_single_file_checkpoint(tmp_path):
    save_sample(tmp_path / "model.safetensors")
    for where in (tmp_path, tmp_path / "model.safetensors"):
        ckpt = load_checkpoint(where)
        assert sorted(ckpt.names) == ["b", "e", "h", "s", "w"] and ckpt.metadata == {"format": "pt"}
        np.testing.assert_array_equal(ckpt.expect("w", (3, 4)), F32)
        np.testing.assert_array_equal(ckpt.f32("b"), BF16_VALUES)


def test_sharded_checkpoint(tmp_path):
    for where in (shard_folder(tmp_path), tmp_path / "model.safetensors.index.json"):
        ckpt = load_checkpoint(where)
        assert sorted(ckpt.names) == ["x", "y", "z"] and "z" in ckpt and "w" not in ckpt
        assert ckpt.metadata == {"total_size": 123}
        assert [ckpt.dtype(n) for n in "xyz"] == ["F32", "F16", "BF16"]
        assert ckpt.shape("y") == F16.shape and ckpt.file("z") == str(tmp_path / "b.safetensors")
        np.testing.assert_array_equal(ckpt.expect("x", [3, 4]), F32)
        np.testing.assert_array_equal(ckpt.raw("y"), F16)
        np.testing.assert_array_equal(ckpt.expect("z", (7,)), BF16_VALUES)


def test_expect_errors(tmp_path):
    ckpt = load_checkpoint(shard_folder(tmp_path))
    index = str(tmp_path / "model.safetensors.index.json")
    assert error(ckpt.expect, "lm_head.weight", (3, 4)) == f"{index}: tensor lm_head.weight missing"
    assert error(ckpt.expect, "x", (np.int64(4), 3)) == f"{tmp_path / 'a.safetensors'}: tensor x has shape (3, 4), expected (4, 3)"
    assert "tensor q missing" in error(ckpt.raw, "q")


def test_folder_without_weights(tmp_path):
    assert "no model.safetensors" in error(load_checkpoint, tmp_path)


def test_index_names_missing_shard(tmp_path):
    shard_folder(tmp_path, {"x": "a.safetensors", "y": "a.safetensors", "z": "c.safetensors"})
    msg = error(load_checkpoint, tmp_path)
    assert "model.safetensors.index.json" in msg and "tensor z" in msg and "c.safetensors is missing" in msg


@pytest.mark.parametrize("weight_map, words", [
    ({"x": "a.safetensors", "y": "b.safetensors", "z": "b.safetensors"}, ["tensor y", "says shard b.safetensors"]),
    ({"x": "a.safetensors", "z": "b.safetensors"}, ["tensor y", "not in weight_map"]),
    ({"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors", "q": "b.safetensors"},
     ["tensor q", "not there"]),
    ({"x": "a.safetensors", "y": "a.safetensors", "z": "../b.safetensors"}, ["tensor z", "not a file name"]),
])
def test_index_disagrees_with_shards(tmp_path, weight_map, words):
    msg = error(load_checkpoint, shard_folder(tmp_path, weight_map))
    assert msg.startswith(str(tmp_path / "model.safetensors.index.json"))
    for word in words:
        assert word in msg


def test_tensor_in_two_shards(tmp_path):
    shard_folder(tmp_path)
    save_safetensors(tmp_path / "b.safetensors", {"z": BF16_BITS, "x": F32}, dtypes={"z": "BF16"})
    msg = error(load_checkpoint, tmp_path)
    assert "tensor x" in msg and "a.safetensors" in msg and "b.safetensors" in msg


@pytest.mark.parametrize("text, words", [
    ("{", ["not valid JSON"]),
    ("[]", ["not a JSON object"]),
    ('{"metadata": {}}', ["weight_map"]),
    ('{"weight_map": {"x": 3}}', ["weight_map"]),
])
def test_bad_index(tmp_path, text, words):
    (tmp_path / "model.safetensors.index.json").write_text(text)
    msg = error(load_checkpoint, tmp_path)
    assert "model.safetensors.index.json" in msg and all(w in msg for w in words)


# --------------------------------------------------------------------------------------------
# Fuzzing: whatever the bytes, a correct load or a ModelError, never another exception


def check_load(path):
    """Opens path; if that succeeds, every tensor must be exactly the bytes the header points at."""
    try:
        f = open_safetensors(path)
    except ModelError as e:
        assert "\n" not in str(e)
        return
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    assert sorted(f.names) == sorted(header)
    for name, info in header.items():
        assert f.dtype(name) == info["dtype"] and f.shape(name) == tuple(info["shape"])
        if info["dtype"] not in ("F32", "F16", "BF16"):
            with pytest.raises(ModelError):
                f.raw(name)
            continue
        begin, end = info["data_offsets"]
        assert f.raw(name).tobytes() == raw[8 + n + begin:8 + n + end]
        a = f.f32(name)
        assert a.dtype == np.float32 and a.shape == tuple(info["shape"])


SAMPLE = None


def sample_bytes(tmp_path_factory):
    global SAMPLE
    if SAMPLE is None:
        SAMPLE = save_sample(tmp_path_factory.mktemp("sample") / "m.safetensors").read_bytes()
    return SAMPLE


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("set"), st.integers(0, 10**6), st.sampled_from(b'0123456789-[]{},:." eE')),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("append"), st.integers(1, 16), st.just(0)),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(mutation, min_size=1, max_size=4))
def test_fuzz_corrupted_file(tmp_path_factory, tmp_path, mutations):
    data = bytearray(sample_bytes(tmp_path_factory))
    for op, pos, value in mutations:
        if op == "flip" and data:
            data[pos % len(data)] ^= value
        elif op == "set" and data:
            data[pos % len(data)] = value
        elif op == "truncate":
            del data[pos % (len(data) + 1):]
        elif op == "append":
            data += bytes(pos)
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(bytes(data))
    check_load(path)


weird = st.one_of(st.integers(-2, 40), st.sampled_from([True, 2.0, None, "3", 2**64, -(2**64), [1]]))
entry = st.fixed_dictionaries({
    "dtype": st.one_of(st.sampled_from(["F32", "F16", "BF16", "I64", "U8", "F99", ""]), weird),
    "shape": st.one_of(st.lists(st.one_of(st.integers(0, 4), weird), max_size=3), weird),
    "data_offsets": st.one_of(st.lists(st.one_of(st.integers(0, 40), weird), min_size=0, max_size=3), weird),
})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.dictionaries(st.sampled_from(["a", "b", "c", "__metadata__"]), entry, max_size=3),
       data_len=st.integers(0, 48))
def test_fuzz_header_fields(tmp_path, header, data_len):
    check_load(craft(tmp_path / "fuzz.safetensors", header, bytes(range(data_len))))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes=st.lists(st.lists(st.integers(0, 5), max_size=3), min_size=1, max_size=5))
def test_fuzz_valid_layouts(tmp_path, shapes):
    # Offsets made to tile the data section exactly always load.
    header, offset = {}, 0
    for i, shape in enumerate(shapes):
        nbytes = 4 * int(np.prod(shape))
        header[f"t{i}"] = t("F32", shape, offset, offset + nbytes)
        offset += nbytes
    path = craft(tmp_path / "ok.safetensors", header, bytes(offset))
    f = open_safetensors(path)
    check_load(path)
    assert all(f.shape(f"t{i}") == tuple(s) for i, s in enumerate(shapes))


# --------------------------------------------------------------------------------------------
# The reference implementation, when installed, agrees with us both ways


def test_reference_implementation_agrees(tmp_path):
    ref = pytest.importorskip("safetensors.numpy")
    tensors = {"w": F32, "h": F16, "s": np.array(2.5, np.float32), "e": np.zeros((0, 3), np.float32)}
    ref.save_file(tensors, str(tmp_path / "ref.safetensors"))
    f = open_safetensors(tmp_path / "ref.safetensors")
    for name, a in tensors.items():
        np.testing.assert_array_equal(f.raw(name), a)
    save_safetensors(tmp_path / "ours.safetensors", tensors)
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    back = ref.load_file(str(tmp_path / "ours.safetensors"))
    for name, a in tensors.items():
        np.testing.assert_array_equal(back[name], a)


# --- a writer killed mid-write --------------------------------------------------------------------

# A writer that stops after its first chunk until it is killed.
SLOW_WRITER = """
import sys, time
from tinydiff.formats.files import write_atomically
def chunks():
    yield b"partial"
    print("writing", flush=True)
    time.sleep(60)
    yield b"never"
write_atomically(sys.argv[1], chunks())
"""


def temporaries(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def kill_mid_write(out, sig):
    child = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(out)], stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(__file__))     # the installed package, not ./tinydiff
    assert child.stdout.readline() == "writing\n"
    assert len(temporaries(out.parent)) == 1
    child.send_signal(sig)
    assert child.wait(timeout=30) == -sig
    return child.pid


def test_sigterm_during_a_write_removes_the_temporary_and_still_ends_the_process(tmp_path):
    out = tmp_path / "model.gguf"
    kill_mid_write(out, signal.SIGTERM)
    assert temporaries(tmp_path) == [] and not out.exists()


def test_after_sigkill_the_next_write_removes_the_dead_writers_temporary(tmp_path):
    out = tmp_path / "model.gguf"
    pid = kill_mid_write(out, signal.SIGKILL)
    left = temporaries(tmp_path)
    assert len(left) == 1 and left[0].startswith(f".model.gguf.{pid}.")   # SIGKILL cannot be caught
    live = tmp_path / f".model.gguf.{os.getpid()}.abcdefgh.tmp"       # a writer still running
    other = tmp_path / f".other.gguf.{pid}.abcdefgh.tmp"              # another output's
    live.write_bytes(b"")
    other.write_bytes(b"")
    write_atomically(out, [b"whole"])
    assert out.read_bytes() == b"whole"
    assert temporaries(tmp_path) == sorted([live.name, other.name])


def test_the_sigterm_handler_is_restored_after_a_write(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    write_atomically(tmp_path / "a", [b"x"])
    with pytest.raises(ZeroDivisionError):
        write_atomically(tmp_path / "b", (1 // 0 for _ in [0]))
    assert signal.getsignal(signal.SIGTERM) is before
    assert temporaries(tmp_path) == []


def test_a_weight_map_entry_that_is_not_a_file_name_is_named(tmp_path):
    """Before: 'weight_map is missing or not an object of shard file names', whichever entry it was."""
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "x.safetensors", "b": 7}}))
    with pytest.raises(ModelError, match=r"weight_map\['b'\] should be a shard file name, got 7"):
        load_checkpoint(tmp_path)
