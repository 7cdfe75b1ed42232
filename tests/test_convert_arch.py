"""`tinydiff convert` of Qwen 3 and Gemma 3 folders against llama.cpp's convert_hf_to_gguf.py: the
same tensors, bit for bit (Gemma's norms stored as 1 + w, as its converter adds), the keys its
loader reads, and the same logits as the folder; tests/fixtures/arch/<name>/model-f32.gguf is
llama.cpp's file of the same folder (tests/fixtures/arch/README.md says how it was made).
"""
import json
import os
import shutil

import numpy as np
import pytest

import tinydiff
from tinydiff.convert import convert
from tinydiff.errors import ModelError
from tinydiff.formats import mixes
from tinydiff.formats.gguf import open_gguf

ARCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "arch")
IDS = [5, 6, 7, 8, 9, 10, 11, 12]


@pytest.mark.parametrize("name", ("qwen3", "gemma3"))
def test_a_folder_converts_to_llama_cpps_tensors_and_keys(name, tmp_path):
    src, out = os.path.join(ARCH, name), tmp_path / "m.gguf"
    convert(src, out, "f32")
    ours, theirs = open_gguf(out), open_gguf(os.path.join(src, "model-f32.gguf"))
    assert list(ours.tensors) == list(theirs.tensors) or set(ours.tensors) == set(theirs.tensors)
    for n in theirs.tensors:
        assert ours.type_name(n) == theirs.type_name(n) == "F32"
        np.testing.assert_array_equal(ours.raw(n), theirs.raw(n), err_msg=n)
    for k, v in theirs.metadata.items():
        if k.startswith(name + ".") or k in ("general.architecture", "general.file_type"):
            assert ours.metadata[k] == v, k
    model, folder = tinydiff.load(str(out)), tinydiff.load(src)
    np.testing.assert_array_equal(model.logits(IDS), folder.logits(IDS))


def test_gemma3_in_q4_k_m_gets_llama_quantizes_mix(tmp_path):
    src = os.path.join(ARCH, "gemma3")
    convert(src, tmp_path / "f32.gguf", "f32")
    convert(src, tmp_path / "q.gguf", "q4_k_m")
    f32, q = open_gguf(tmp_path / "f32.gguf"), open_gguf(tmp_path / "q.gguf")
    mix = mixes.types({n: f32.shape(n) for n in f32.tensors}, "q4_k_m", 6)
    assert {n: q.type_name(n).lower() for n in mix} == mix
    # rows of 16 fit no block: f16; ffn_down's of 32: Q4_K -> Q5_0, Q6_K -> Q8_0 where use_more_bits
    # (layers 2 and 5 of 6), as `llama-quantize --dry-run model-f32.gguf /dev/null Q4_K_M` says
    assert q.type_name("blk.0.attn_q.weight") == q.type_name("token_embd.weight") == "F16"
    assert [n for n in mix if mix[n] == "q8_0"] == ["blk.2.ffn_down.weight", "blk.5.ffn_down.weight"]
    assert q.type_name("blk.0.ffn_down.weight") == "Q5_0"
    assert q.type_name("blk.0.attn_q_norm.weight") == "F32"


def test_gemma3_windows_llama_cpp_cannot_say_are_refused(tmp_path):
    src = tmp_path / "g"
    shutil.copytree(os.path.join(ARCH, "gemma3"), src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["layer_types"] = ["sliding_attention", "full_attention"] * 3
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="sliding windows only in its own pattern"):
        convert(str(src), tmp_path / "m.gguf", "f32")
    assert not (tmp_path / "m.gguf").exists()
