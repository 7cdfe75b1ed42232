"""Fuzzing the model files: whatever bytes a model folder or a GGUF file holds, loading it and
running it ends in a clean error (one line, exit 1 or 2) or a run, never a traceback, a signal or
a hang.

For each format (safetensors: header and data; GGUF; config.json; tokenizer.json; the sharded
index; and a GGUF file of the block formats beyond Q8_0 and Q4_0, made here: every matrix of another
one of them, random blocks with small scales) a seeded loop mutates the fixtures in tests/fixtures/:
bit flips and huge numbers (biased to the header, or for the block formats to the blocks' scales:
NaN, inf, huge), truncations, deletions, insertions; for JSON (a safetensors header too), values
swapped for another type, huge or non-finite numbers, deleted keys and items; for GGUF, the file
rewritten with a metadata value at the edge of its type or of another type, a key or a tensor gone.
Each mutant is loaded and run (logits, a 3-token greedy generation, a decode) by a worker process
that takes a batch of mutants and reports on each one; a mutant that kills or hangs the worker,
or raises something other than a TinydiffError (a warning included), is then run alone through the
real command line (`tinydiff generate`) in its own process, and the test fails on what that run
shows: a traceback, a signal, a hang, an exit status other than 0, 1, 2, an error of more than one
line, or a run that printed a warning. (tokenizer.json files fuzzed alone have no command: there
the worker's word is the verdict.)

A mutant that loads is held to its fixture too (against_base, the oracle): one whose weight bytes
are the fixture's (a header flip, a rewritten metadata value) must give the fixture's weights, type
for type and bit for bit, and one with the fixture's config and weights must give its logits; a
difference has to come from weight bytes or a hyperparameter that changed. (A GGUF whose tensor
type or alignment was changed under the same bytes loaded with other logits before the layout
check; this is what would catch its kind.)

300 mutants per format by default (2400 in all, ~15 s on two cores); `pytest --long` runs 2000 per format. The seed is fixed
(TINYDIFF_FUZZ_SEED changes it), so a failure reproduces.

Run as a script, this file is the worker: `python test_fuzz.py MUTANTS.json START`.
"""
import json
import os
import random
import select
import struct
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
HF = FIXTURES / "hf"
GGUF = FIXTURES / "gguf" / "llama-gqa-mixed.gguf"
SEED = int(os.environ.get("TINYDIFF_FUZZ_SEED", "0"))
COUNT, LONG_COUNT = 300, 2000      # mutants per format: in CI, and with --long
TIMEOUT = 20                       # seconds one mutant may take before it counts as a hang
ENV = {**os.environ, "TINYDIFF_THREADS": "1"}   # two workers share two cores


# --- mutations ------------------------------------------------------------------------------------

HUGE = [2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30, 10**400]
JSON_VALUES = [None, True, False, 0, -1, 1, 1.5, -0.0, float("nan"), float("inf"), -float("inf"), 1e308, 1e-300, 5e-324,
               "", "x", "\u0000\n", [], [1, "a"], [[[]]], {}, {"type": "ByteLevel"}, {"": None}] + HUGE


def mutate_bytes(data, rng, hot):
    """One byte-level change to data, made in its first `hot` bytes (the header) four times in five."""
    n = len(data)
    pos = lambda: rng.randrange(min(hot, n) if rng.random() < 0.8 else n)   # noqa: E731
    out = bytearray(data)
    kind = rng.choice(["flip", "flip", "huge", "truncate", "delete", "insert", "zero"])
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            i = pos()
            out[i] ^= 1 << rng.randrange(8)
    elif kind == "huge":                 # a length, count, offset or dimension gone wild
        i = pos() & ~3
        big = rng.choice([h for h in HUGE if h < 2**64]) if rng.random() < 0.7 else rng.getrandbits(64)
        out[i:i + 8] = struct.pack("<Q", big)
    elif kind == "truncate":
        del out[pos():]
    elif kind == "delete":
        i = pos()
        del out[i:i + rng.randint(1, 64)]
    elif kind == "insert":
        i = pos()
        out[i:i] = rng.randbytes(rng.randint(1, 16))
    else:
        i, k = pos(), rng.randint(1, 16)
        out[i:i + k] = bytes(len(out[i:i + k]))
    return bytes(out)


def paths(doc, rng, path=()):
    """Paths into a JSON document, every key of small containers and a sample of big ones."""
    yield path
    if isinstance(doc, dict):
        keys = list(doc)
    elif isinstance(doc, list):
        keys = list(range(len(doc)))
    else:
        return
    for key in keys if len(keys) <= 40 else rng.sample(keys, 12):
        yield from paths(doc[key], rng, path + (key,))


def mutate_json(doc, rng):
    """One change to a parsed JSON document: a value of another type, a huge or non-finite number,
    a number nudged, a deleted key or item, a duplicated item."""
    doc = json.loads(json.dumps(doc))
    where = rng.choice([p for p in paths(doc, rng) if p])
    parent = doc
    for key in where[:-1]:
        parent = parent[key]
    key, value = where[-1], parent[where[-1]]
    kind = rng.choice(["swap", "swap", "number", "delete", "duplicate"])
    if kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
        parent[key] = rng.choice([value + 1, value - 1, -value, value * 1000, 0, value + 2**32])
    elif kind == "delete":
        del parent[key]
    elif kind == "duplicate" and isinstance(parent, list):
        parent.insert(key, value)
    else:
        parent[key] = rng.choice(JSON_VALUES)
    return doc


def mutate_json_text(text, rng):
    """A JSON file mutated: usually as a document, sometimes as bytes (broken syntax, bad UTF-8),
    now and then nested absurdly deep."""
    if rng.random() < 0.15:
        return mutate_bytes(text, rng, len(text))
    if rng.random() < 0.03:         # nesting deeper than any recursive reader goes
        depth = rng.choice([300, 3000, 100_000])
        return text.replace(b"{", b'{"deep": ' + b"[" * depth + b"]" * depth + b", ", 1)
    return json.dumps(mutate_json(json.loads(text), rng), ensure_ascii=rng.random() < 0.5).encode()


def mutate_safetensors(data, rng):
    """The header as JSON (shapes, offsets, dtypes) or the file as bytes (length prefix, data)."""
    n = int.from_bytes(data[:8], "little")
    if rng.random() < 0.5:
        header = json.dumps(mutate_json(json.loads(data[8:8 + n]), rng)).encode()
        return len(header).to_bytes(8, "little") + header + data[8 + n:]
    return mutate_bytes(data, rng, 8 + n)


INT_RANGES = {"uint8": (0, 2**8), "int8": (-2**7, 2**7), "uint16": (0, 2**16), "int16": (-2**15, 2**15),
              "uint32": (0, 2**32), "int32": (-2**31, 2**31), "uint64": (0, 2**64), "int64": (-2**63, 2**63)}


def gguf_value(kind, value, rng):
    """Another value of the same GGUF type: an edge of its range, a neighbour, a special float."""
    if kind in INT_RANGES:
        lo, hi = INT_RANGES[kind]
        return rng.choice([v for v in (0, 1, -1, value + 1, value - 1, 2 * value, lo, hi - 1, 2**31 - 1)
                           if lo <= v < hi])
    if kind.startswith("float"):
        return rng.choice([0.0, -1.0, float("nan"), float("inf"), -float("inf"), 1e-45, 3e38, value * 2])
    if kind == "bool":
        return not value
    if kind == "string":
        return rng.choice(["", "x", "a\nb", "llama", "qwen2", "dream", "llada", "gpt2", "llama-bpe", value * 2])
    items = list(value)                               # an array
    inner = kind[6:-1]
    op = rng.choice(["cut", "drop", "repeat", "item"])
    if op == "cut":
        return items[:rng.randrange(len(items) + 1)]
    i = rng.randrange(len(items)) if items else 0
    if op == "drop" and items:
        del items[i]
    elif op == "repeat" and items:
        items.insert(i, items[i])
    elif items and not inner.startswith("array"):
        items[i] = gguf_value(inner, items[i], rng)
    return items


def mutate_gguf_semantics(path, rng, base=GGUF):
    """A GGUF fixture rewritten with one metadata value changed (same type, or another), a key
    or a tensor dropped, or a tensor renamed: what byte flips rarely reach. True if every tensor
    was kept as it was."""
    from tinydiff.formats.gguf import GGML_TYPES, Planned, open_gguf, write_gguf
    f = open_gguf(base)
    meta = {k: (f.value_types[k], v) for k, v in f.metadata.items() if k != "general.alignment"}
    tensors = {name: Planned(GGML_TYPES[t.type][0].lower(), f.shape(name), lambda a=f.raw(name): a)
               for name, t in f.tensors.items()}
    op = rng.choice(["value", "value", "value", "retype", "delete", "tensor"])
    key = rng.choice(list(meta))
    kind, value = meta[key]
    if op == "value":
        meta[key] = (kind, gguf_value(kind, value, rng))
    elif op == "retype" and not kind.startswith("array"):
        other = rng.choice(["uint32", "int32", "uint64", "float32", "string", "bool"])
        meta[key] = (other, {"string": str(value), "bool": bool(value)}.get(other, 7 if other != "float32" else 7.0))
    elif op == "delete":
        del meta[key]
    else:
        name = rng.choice(list(tensors))
        planned = tensors.pop(name)
        if rng.random() < 0.5:
            tensors[name.replace("blk.1", "blk.7").replace("weight", "bias")] = planned
    write_gguf(path, meta, tensors)
    return op != "tensor"


# The block formats beyond Q8_0 and Q4_0, a matrix each, in a llama model of hidden size 256 (the
# K-quants' rows are whole super-blocks): the vocabulary and rope settings of the GGUF fixture.
BLOCK_TYPES = {"token_embd": "q6_k", "output": "q4_k",
               "blk.0": {"attn_q": "q4_k", "attn_k": "q5_k", "attn_v": "q6_k", "attn_output": "q3_k",
                         "ffn_gate": "q2_k", "ffn_up": "iq4_xs", "ffn_down": "q8_k"},
               "blk.1": {"attn_q": "q4_1", "attn_k": "q5_0", "attn_v": "q5_1", "attn_output": "iq4_nl",
                         "ffn_gate": "q4_k", "ffn_up": "q5_k", "ffn_down": "q6_k"}}


def block_formats_gguf(path):
    """Writes the fixture of the block formats: every matrix random blocks of its type (BLOCK_TYPES),
    scales small enough that activations stay finite, norms ones."""
    import numpy as np

    from tinydiff.formats import quant
    from tinydiff.formats.gguf import open_gguf, write_gguf
    rng = np.random.default_rng(SEED)
    f = open_gguf(GGUF)
    d, ff, vocab = 256, 512, f.metadata["llama.vocab_size"]
    meta = {k: (f.value_types[k], v) for k, v in f.metadata.items() if k != "general.alignment"}
    meta.update({"llama.embedding_length": ("uint32", d), "llama.feed_forward_length": ("uint32", ff),
                 "llama.rope.dimension_count": ("uint32", 64), "general.file_type": ("uint32", 15)})
    shapes = {"attn_q": (d, d), "attn_k": (d // 2, d), "attn_v": (d // 2, d), "attn_output": (d, d),
              "ffn_gate": (ff, d), "ffn_up": (ff, d), "ffn_down": (d, ff)}

    def matrix(name, rows, cols):
        dt = quant.READS[name]
        w = rng.integers(0, 256, (rows, cols // quant.BLOCK[dt] * dt.itemsize), dtype=np.uint8).view(dt)
        for field in quant.SCALES[dt]:
            w[field] = rng.normal(0, 1e-3 if dt.itemsize > 40 else 2e-2, w[field].shape)
        return w

    tensors = {"token_embd.weight": matrix(BLOCK_TYPES["token_embd"], vocab, d)}
    for layer in ("blk.0", "blk.1"):
        tensors[f"{layer}.attn_norm.weight"] = np.ones(d, np.float32)
        tensors[f"{layer}.ffn_norm.weight"] = np.ones(d, np.float32)
        for part, name in BLOCK_TYPES[layer].items():
            tensors[f"{layer}.{part}.weight"] = matrix(name, *shapes[part])
    tensors["output_norm.weight"] = np.ones(d, np.float32)
    tensors["output.weight"] = matrix(BLOCK_TYPES["output"], vocab, d)
    write_gguf(path, meta, tensors)
    return path


def mutate_block_scales(data, rng, base):
    """One block's scale in the block-formats fixture set to NaN, inf, a huge or a tiny number."""
    import numpy as np

    from tinydiff.formats import quant
    from tinydiff.formats.gguf import open_gguf
    f = open_gguf(base)
    name = rng.choice([n for n in f.tensors if quant.SCALES.get(f.raw(n).dtype)])
    a, t = f.raw(name), f.entry(name)
    field = rng.choice(quant.SCALES[a.dtype])
    i = rng.randrange(a.size)
    at = f.data_start + t.offset + i * a.dtype.itemsize + a.dtype.fields[field][1]
    width = a.dtype.fields[field][0].itemsize
    value = rng.choice([np.nan, np.inf, -np.inf] + ([6e4, 6e-8] if width == 2 else [3e38, 1e-38]))
    out = bytearray(data)
    out[at:at + width] = np.array(value, "<f2" if width == 2 else "<f4").tobytes()
    return bytes(out)


# format -> (the fixture folders or files it starts from, the file mutated, how)
FORMATS = {
    "safetensors": (["llama-gqa", "llama-bf16", "qwen2-bias"], "model.safetensors", mutate_safetensors),
    "gguf": ([GGUF.name], None, None),
    "gguf block formats": (["block-formats.gguf"], None, None),    # made by block_formats_gguf
    "config": (["llama-gqa", "qwen2-bias", "mistral", "llama-tied-headdim"], "config.json", mutate_json_text),
    "tokenizer": (["llama-gqa", "qwen2-bias"], "tokenizer.json", mutate_json_text),
    "index": (["llama-sharded"], "model.safetensors.index.json", mutate_json_text),
    # the richer tokenizers of test_tokenizer.py (templates, Split, normalizers, added-token flags),
    # loaded alone: no model has their 1000 tokens
    "tokenizer alone": (["gpt2.json", "llama3.json", "qwen2.json", "legacy.json", "gemma.json", "llama2.json"], None,
                        mutate_json_text),
}


def make_mutants(fmt, count, folder, seed):
    """count mutants of one format written under folder: model folders (links to the fixture's
    files but the mutated one), GGUF files or tokenizer.json files. folder/bases.json gets, for
    each, the fixture it came from and whether its weight bytes are the fixture's (the oracle)."""
    rng = random.Random(f"{seed}-{fmt}")
    bases, name, mutate = FORMATS[fmt]
    start = None                                   # the GGUF file the mutants start from
    if fmt == "gguf":
        start = GGUF
    elif fmt == "gguf block formats":
        start = block_formats_gguf(folder / "block-formats.gguf")
    if start:
        from tinydiff.formats.gguf import open_gguf
        data, hot = start.read_bytes(), open_gguf(start).data_start
    mutants, oracle = [], {}
    for i in range(count):
        if start:
            path = folder / f"{fmt.replace(' ', '-')}-{i}.gguf"
            if start != GGUF and rng.random() < 0.3:
                path.write_bytes(mutate_block_scales(data, rng, start))
            elif rng.random() < 0.5:
                path.write_bytes(mutate_bytes(data, rng, hot))
                oracle[str(path)] = [str(start), header_only(data, path.read_bytes(), hot)]
            else:
                oracle[str(path)] = [str(start), mutate_gguf_semantics(path, rng, start)]
        elif fmt == "tokenizer alone":
            path = folder / f"tokenizer-{i}.json"
            path.write_bytes(mutate((FIXTURES / "tokenizers" / rng.choice(bases)).read_bytes(), rng))
        else:
            base = HF / rng.choice(bases)
            path = folder / f"{fmt}-{i}"
            path.mkdir()
            for f in base.iterdir():
                if f.name != name:
                    (path / f.name).symlink_to(f)
            original = (base / name).read_bytes()
            mutant = mutate(original, rng)
            (path / name).write_bytes(mutant)
            oracle[str(path)] = [str(base), fmt == "safetensors" and same_data(original, mutant)]
        mutants.append(str(path))
    (folder / "bases.json").write_text(json.dumps(oracle))
    return mutants


def header_only(original, mutant, hot):
    """Whether mutant differs from original only in its first hot bytes (the header), at the same length."""
    return len(mutant) == len(original) and mutant[hot:] == original[hot:]


def same_data(original, mutant):
    """Whether a mutated safetensors file still ends in the original's data section, whatever
    became of the header before it (a rewritten JSON header, a flipped byte in it)."""
    data = original[8 + int.from_bytes(original[:8], "little"):]
    return len(mutant) >= len(data) and mutant[len(mutant) - len(data):] == data


# --- the worker: a batch of mutants in one process ------------------------------------------------

def run_one(path):
    """Load and run one model as the command line would; what happened, as a short string."""
    import numpy as np

    from tinydiff.errors import TinydiffError
    from tinydiff.model import load
    try:
        if path.endswith(".json"):
            return run_tokenizer(path)
        model = load(path, threads=1)
        ids = model.encode_prompt("Once upon a time")
        logits = model.logits(ids)
        assert logits.shape == (len(ids), model.config.vocab_size)
        wrong = against_base(path, model, ids, logits)
        if wrong:
            return f"wrong: {wrong}"
        if model.config.causal:
            new = model.generate_ids(ids, max_new_tokens=3, temperature=0)
        else:
            new = model.denoise_ids(ids, gen_length=4, steps=2)
        model.tokenizer.decode(np.asarray(new).tolist())
        return "ok"
    except TinydiffError as e:
        return "clean" if "\n" not in str(e) else f"multi-line error: {e!r}"
    except Exception as e:      # noqa: BLE001 -- what the fuzzer looks for
        return f"raised {type(e).__name__}: {str(e)[:300]}"


_BASES = {}     # fixture path -> (config, weights' fingerprint, ids, logits), once a worker


def fingerprint(model):
    """Each weight array of a loaded model as (type, shape, digest of its bytes), in field order."""
    import hashlib

    import numpy as np
    w = model.weights
    arrays = [w.embed_tokens, w.norm, w.lm_head] + [a for layer in w.layers for a in vars(layer).values()]
    return [None if a is None else (str(a.dtype), a.shape, hashlib.sha1(np.ascontiguousarray(a).view(np.uint8)).digest())
            for a in arrays]


def against_base(path, model, ids, logits):
    """The oracle for a mutant that loads: a file whose weight bytes are its fixture's must give
    the fixture's weights, and a model of the fixture's config and weights the fixture's logits
    (any difference must come from weight bytes, or a hyperparameter, that changed); None if so."""
    import numpy as np

    from tinydiff.model import load
    bases = json.loads((Path(path).parent / "bases.json").read_text())
    if path not in bases:
        return None
    base, same_bytes = bases[path]
    if base not in _BASES:
        ref = load(base, threads=1)
        ref_ids = ref.encode_prompt("Once upon a time")
        _BASES[base] = (ref.config, fingerprint(ref), ref_ids, ref.logits(ref_ids))
    config, weights, ref_ids, ref_logits = _BASES[base]
    mine = fingerprint(model)
    if same_bytes and mine != weights:
        changed = sum(a != b for a, b in zip(mine, weights)) + abs(len(mine) - len(weights))
        return f"only the header changed, yet {changed} weight arrays differ from the fixture's"
    if model.config == config and mine == weights and list(ids) == list(ref_ids) and not np.array_equal(logits, ref_logits):
        return "the fixture's config and weights, yet other logits"
    return None


def run_tokenizer(path):
    from tinydiff.formats.tokenizer import Tokenizer
    tok = Tokenizer.from_file(path)
    ids = tok.encode("Hello <s> wörld <|im_start|> stop 123 ~\n")
    tok.decode(ids + [tok.vocab_size, 0])
    return "ok"


def worker(mutants_file, start):
    warnings.simplefilter("error")    # a numpy overflow or NaN warning is a suspect for the CLI run
    mutants = json.loads(Path(mutants_file).read_text())
    for i in range(start, len(mutants)):
        print(f"start {i}", flush=True)
        print(json.dumps([i, run_one(mutants[i])]), flush=True)


def run_batch(mutants):
    """{index: outcome} for every mutant, one worker process for all of them; a mutant that kills
    or hangs the worker is recorded as such and the worker restarted after it."""
    outcomes, start = {}, 0
    listing = Path(mutants[0]).parent / f"{Path(mutants[0]).name}.list.json"
    listing.write_text(json.dumps(mutants))
    while start < len(mutants):
        proc = subprocess.Popen([sys.executable, __file__, str(listing), str(start)], env=ENV,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        current = start
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
            if not ready:
                proc.kill()
                outcomes[current] = "hang"
                break
            line = proc.stdout.readline()
            if not line:
                code = proc.wait()
                if current < len(mutants) and current not in outcomes:
                    outcomes[current] = f"worker died: exit {code}"
                break
            if line.startswith("start "):
                current = int(line.split()[1])
            else:
                i, outcome = json.loads(line)
                outcomes[i] = outcome
        proc.wait()
        proc.stdout.close()
        start = current + 1
    return outcomes


def run_cli(path):
    """The verdict of the real command line on one mutant: None if clean, else what went wrong."""
    cmd = [sys.executable, "-m", "tinydiff.cli", "generate", "-m", path, "-p", "Once upon a time",
           "-n", "3", "--temp", "0"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=ENV,
                           cwd=os.path.dirname(os.path.abspath(__file__)))   # the installed package
    except subprocess.TimeoutExpired:
        return "hang"
    err = r.stderr.strip()
    if r.returncode < 0:
        return f"signal {-r.returncode}"
    if "Traceback" in err or r.returncode not in (0, 1, 2):
        return f"exit {r.returncode}: {err[-500:]}"
    if r.returncode and len(err.splitlines()) != 1:
        return f"exit {r.returncode} with {len(err.splitlines())} lines: {err[-500:]}"
    if r.returncode == 0 and "Warning" in err:
        return f"a run with warnings: {err[-500:]}"
    return None


def fuzz(fmt, count, folder, seed=SEED):
    """The mutants of one format that the command line does not handle cleanly: {path: what}."""
    mutants = make_mutants(fmt, count, folder, seed)
    halves = [mutants[:len(mutants) // 2], mutants[len(mutants) // 2:]]
    with ThreadPoolExecutor(2) as pool:        # two workers, one per core
        results = list(pool.map(run_batch, halves))
    suspects = [half[i] for half, outcomes in zip(halves, results)
                for i, outcome in outcomes.items() if outcome not in ("ok", "clean")]
    if fmt == "tokenizer alone":   # no command runs a tokenizer alone: the worker's word is the verdict
        return {path: outcome for half, outcomes in zip(halves, results)
                for i, outcome in outcomes.items() if outcome not in ("ok", "clean") for path in [half[i]]}
    wrong = {half[i]: outcome for half, outcomes in zip(halves, results)
             for i, outcome in outcomes.items() if outcome.startswith("wrong: ")}
    return {**wrong, **{path: verdict for path in suspects if path not in wrong and (verdict := run_cli(path)) is not None}}


# --- the tests ----------------------------------------------------------------------------------

if __name__ != "__main__":
    import pytest

    @pytest.mark.parametrize("fmt", list(FORMATS))
    def test_every_mutant_loads_and_runs_or_fails_cleanly(fmt, tmp_path, request):
        count = LONG_COUNT if request.config.getoption("--long") else COUNT
        failures = fuzz(fmt, count, tmp_path)
        shown = "\n".join(f"{Path(p).name}: {what}" for p, what in list(failures.items())[:10])
        assert not failures, f"{len(failures)} of {count} {fmt} mutants (seed {SEED}):\n{shown}"

    def test_mutations_change_the_files(tmp_path):
        """The fuzzer is not fuzzing nothing: every mutant differs from its fixture, and a few
        hundred mutants include both kinds of outcome."""
        mutants = make_mutants("config", 30, tmp_path, SEED)
        originals = {(HF / b / "config.json").read_bytes() for b in FORMATS["config"][0]}
        assert all((Path(m) / "config.json").read_bytes() not in originals for m in mutants)
        outcomes = run_batch(mutants)
        assert set(outcomes) == set(range(30))
        assert "clean" in outcomes.values() and "ok" in outcomes.values()

    def test_the_oracle_finds_weights_or_logits_a_header_change_should_not_have_moved(tmp_path):
        """A file said to hold its fixture's weight bytes but whose data changed, and the fixture's
        model giving other logits: both are named; the fixture itself passes."""
        from tinydiff.formats.gguf import open_gguf
        from tinydiff.model import load
        data = bytearray(GGUF.read_bytes())
        f = open_gguf(GGUF)
        data[f.data_start + f.entry("output_norm.weight").offset] ^= 0x40
        (tmp_path / "m.gguf").write_bytes(bytes(data))
        (tmp_path / "same.gguf").write_bytes(GGUF.read_bytes())
        (tmp_path / "bases.json").write_text(json.dumps({str(tmp_path / "m.gguf"): [str(GGUF), True],
                                                         str(tmp_path / "same.gguf"): [str(GGUF), True]}))
        for name in ("m.gguf", "same.gguf"):
            model = load(tmp_path / name)
            ids = model.encode_prompt("Once upon a time")
            logits = model.logits(ids)
            found = against_base(str(tmp_path / name), model, ids, logits)
            if name == "m.gguf":
                assert found == "only the header changed, yet 1 weight arrays differ from the fixture's"
            else:
                assert found is None
                assert against_base(str(tmp_path / name), model, ids, logits + 1) == (
                    "the fixture's config and weights, yet other logits")

    def test_a_crash_in_the_worker_is_recorded_and_the_batch_goes_on(tmp_path, monkeypatch):
        """A worker killed by a signal on one mutant: that mutant is recorded, the others still run."""
        mutants = make_mutants("config", 3, tmp_path, SEED)
        monkeypatch.setitem(ENV, "TINYDIFF_FUZZ_CRASH", mutants[1])
        outcomes = run_batch(mutants)
        assert outcomes[1].startswith("worker died") and set(outcomes) == {0, 1, 2}


if __name__ == "__main__":
    if os.environ.get("TINYDIFF_FUZZ_CRASH"):   # for the test of the harness itself
        _run_one = run_one

        def run_one(path):
            if path == os.environ["TINYDIFF_FUZZ_CRASH"]:
                os.kill(os.getpid(), 11)
            return _run_one(path)
    worker(sys.argv[1], int(sys.argv[2]))
