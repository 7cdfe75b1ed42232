"""What csrc promises beyond the results' accuracy: the row functions of every weight type on every
SIMD path (quant_isa.h), plain C's summation order, rope past its stack buffer, and the
out-of-memory rule (internal.h: -1 and MemoryError, outputs as documented, never an abort)."""
import os
import platform
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tinydiff.engine import kernels as K
from tinydiff.engine import reference as R
from tinydiff.formats import quant

TYPES = ["f16", "bf16", "q8_0", "q4_0"]


def data(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", TYPES)
def test_weights_to_f32_exact_on_every_path(level, name):
    """The embedding look-up widens rows with the type's to_float: bit for bit the dequantized
    weights on every path, tails past the last vector (k = 101) and f16 subnormals included."""
    k = 160 if name in ("q8_0", "q4_0") else 101
    w = data(11, 9, k)
    w[1] *= 1e-6                           # f16 subnormals
    w[2, :40] = 0
    w[2, 40:50] = -0.0
    table = quant.quantize(w, name)
    ids = np.arange(9)[::-1].copy()
    out = K.embedding(table, ids, np.empty((9, k), np.float32))
    want = quant.dequantize(table)[ids].astype(np.float32)
    assert out.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def sequential_sum(terms):
    """float32 sum term after term from 0, as plain C's loop adds them"""
    s = np.float32(0)
    for t in terms.astype(np.float32):
        s = np.float32(s + t)
    return s


def four_chains_sum(terms):
    """float32 terms summed as plain C's f32 tiles sum them: chain l over terms l, l + 4, ..., the
    four chains halved, then the terms past the last multiple of 4 one by one."""
    kv = len(terms) // 4 * 4
    chains = [sequential_sum(terms[l:kv:4]) for l in range(4)]
    total = (chains[0] + chains[2]) + (chains[1] + chains[3])
    for t in terms[kv:]:
        total = np.float32(total + t)
    return total


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="plain C on x86-64 has no FMA to fuse")
@pytest.mark.parametrize("name", TYPES)
def test_plain_c_sums_in_ggml_reference_order(name):
    """Plain C's order, to the bit: 16-bit weights widened and summed as f32's tiles sum (matmul_isa.h:
    four chains of products, k mod 4 each, then (0 + 2) + (1 + 3), then the tail term by term); for
    the block types, quant_isa.h keeps ggml's reference order, each block's exact int32 dot product times
    d_w * d_x, those summed block after block."""
    best = K.simd()
    K._set_simd("c")
    try:
        x, w = data(12, 1, 224), data(13, 5, 224)
        q = quant.quantize(w, name)
        got = K.matmul(x, q)[0]
    finally:
        K._set_simd(best)
    if name in ("f16", "bf16"):
        wf = quant.dequantize(q).astype(np.float32)
        want = [four_chains_sum(wf[j] * x[0]) for j in range(5)]
    else:
        xq = quant.quantize(x, "q8_0")[0]
        qs = q["qs"].astype(np.int64)
        wq = qs if name == "q8_0" else np.concatenate([(qs & 15) - 8, (qs >> 4) - 8], axis=-1)  # [5, blocks, 32]
        want = []
        for j in range(5):
            sumi = (wq[j] * xq["qs"]).sum(-1).astype(np.float32)                           # exact int32
            scale = q["d"][j].astype(np.float32) * xq["d"].astype(np.float32)
            want.append(sequential_sum(sumi * scale))
    assert got.tolist() == np.array(want, np.float32).tolist()


@pytest.mark.parametrize("hd", [130, 258, 300])
def test_rope_past_the_stack_chunk(level, hd):
    """rope's cos and sin go through a 64-pair stack buffer: head sizes past it (and not a multiple
    of it) rotate every pair, as HF does; rope_qk is rope on q and on k."""
    inv_freq = (1.0 / 10000 ** (np.arange(0, hd, 2) / hd)).astype(np.float32)
    pos = np.array([0, 5, 4095])
    q, k = data(hd, 3, 4, hd), data(hd + 1, 3, 2, hd)
    want_q, want_k = R.rope(q.copy(), pos, inv_freq), R.rope(k.copy(), pos, inv_freq)
    q1, k1 = K.rope(q.copy(), pos, inv_freq), K.rope(k.copy(), pos, inv_freq)
    np.testing.assert_allclose(q1, want_q, rtol=1e-5, atol=1e-5 * np.abs(want_q).max())
    np.testing.assert_allclose(k1, want_k, rtol=1e-5, atol=1e-5 * np.abs(want_k).max())
    K.rope_qk(q, k, pos, inv_freq)
    assert q.tobytes() == q1.tobytes() and k.tobytes() == k1.tobytes()


OUT_OF_MEMORY = """
import resource
import numpy as np
from tinydiff.engine import kernels as K
from tinydiff.formats import quant
K._set_simd({level!r})
x = np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32)
w = {{"f32": np.ones((2048, 4096), np.float32), "q8_0": quant.quantize(np.ones((64, 4096), np.float32), "q8_0")}}
y = np.full((4096, 2048), 7.0, np.float32)
y2 = y.copy()
K.matmul(x[:20], w["q8_0"])                      # the pool and its threads are up
fields = open("/proc/self/status").read().split("VmSize:")[1].split()
resource.setrlimit(resource.RLIMIT_AS, (int(fields[0]) * 1024 + (8 << 20),) * 2)  # 8 MiB more, no more
for name, out in (("f32", y), ("q8_0", y[:, :64].copy())):
    K.set_batch_invariant(name != "f32")          # f32 many rows: the GEMM's temporary (invariant: none)
    try:
        K.matmul(x, w[name], out=out, residual=True)  # a 32 MiB temporary, or 22-85 MiB of scratch
    except MemoryError as e:
        assert out.min() == out.max() == 7.0, name + ": out was written"  # (no 8 MiB mask)
        print(name, "MemoryError:", e)
K.set_batch_invariant(True)                       # the lane GEMM's 64 MiB of scratch: the tiles instead
K.matmul(x, w["f32"], out=y2, residual=True)
print("f32-invariant", y2[5, 7] == np.float32(7.0) + K.matmul(x[5], w["f32"][:8])[7])
"""


@pytest.mark.parametrize("level_", K.SIMD_LEVELS[1:])
def test_out_of_memory_raises_and_leaves_out_untouched(level_):
    """With the address space capped: matmul's accumulate temporary (f32, batch invariance off) and
    its x scratch (Q8_0) cannot be had; each call raises MemoryError with one line and leaves out as
    it was. Invariant, the f32 lane GEMM's scratch cannot be had either: the tiles, which need none,
    give the same numbers instead."""
    if level_ not in K.SIMD_LEVELS[: K.SIMD_LEVELS.index(K.simd()) + 1]:
        pytest.skip(f"no {level_} on this CPU")
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(OUT_OF_MEMORY.format(level=level_))],
                         capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(__file__))  # so the child imports the installed package
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["f32", "q8_0", "f32-invariant"], run.stdout
    assert lines[2] == "f32-invariant True"
    assert "products added to out" in lines[0] and "matmul: no memory for x [4096,4096]" in lines[1]
