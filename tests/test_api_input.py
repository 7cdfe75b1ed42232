"""The Python API's bad input (a tester's findings): a UsageError naming what is wrong, never
numpy's or Python's own exception from deep inside, never an argument silently ignored or read as
something else."""
import json
import os
import shutil
import struct

import numpy as np
import pytest

import tinydiff
from tinydiff.chat import Chat
from tinydiff.cli import main
from tinydiff.decoding.diffusion import _apart
from tinydiff.engine.masks import block_causal
from tinydiff.errors import ModelError, UsageError
from tinydiff.model import model_path

MODEL = os.path.join(os.path.dirname(__file__), "fixtures", "hf", "llama-gqa")


@pytest.fixture(scope="module")
def ar():
    return tinydiff.load(MODEL)


@pytest.fixture(scope="module")
def mdm():
    return tinydiff.load("stories5m-mdm")


@pytest.mark.parametrize("ids", [[[1, 2], 3], [[1, 2], "ab"], iter([[1, 2], [4]]), [range(1, 3), range(4, 5)],
                                 [1, True], [np.True_, 1], {1: 0, 2: 0}, {1, 2}, bytearray(b"ab")])
def test_token_ids_that_are_not_a_flat_list_of_integers(ar, ids):
    with pytest.raises(UsageError, match="token ids|sequence of token ids|got a string"):
        ar.generate_ids(ids, max_new_tokens=2)


@pytest.mark.parametrize("kw, words", [(dict(truncate="no"), "truncate must be True or False"),
                                       (dict(timings=5), "timings must be")])
def test_generation_keywords_of_the_wrong_kind(ar, kw, words):
    with pytest.raises(UsageError, match=words):
        ar.generate_ids([1, 2], max_new_tokens=2, **kw)


@pytest.mark.parametrize("stop", [5, [5]])
def test_a_batch_checks_its_stop_strings_before_it_runs(ar, stop):
    with pytest.raises(UsageError, match="stop must be a string or a list of strings"):
        ar.generate(["Once", "The"], 2, stop=stop)


def test_text_takes_ids_of_the_vocabulary(ar):
    for ids in ([1.5], "abc", [99999]):
        with pytest.raises(UsageError):
            ar.text(ids)
    assert ar.text([]) == ""


def test_diffusion_callbacks_and_options_nothing_reads(mdm):
    with pytest.raises(UsageError, match="on_step must be a function"):
        mdm.denoise("Once", gen_length=8, steps=4, on_step=5)
    for kw in (dict(gen_length=50), dict(fixed=[True])):
        with pytest.raises(UsageError, match="infill takes no"):
            mdm.infill("The [MASK*3] sat on the mat.", **kw)


def test_a_hole_count_too_long_to_read_and_a_long_malformed_hole(mdm):
    with pytest.raises(UsageError, match="exceed the context"):
        mdm.infill("a [MASK*" + "9" * 5000 + "]")
    with pytest.raises(UsageError, match="malformed hole") as e:
        mdm.infill("[MASK*1" + "1" * 100000)
    assert len(str(e.value)) < 400


def test_a_gap_wider_than_the_canvas_is_the_canvas():
    """gap=10**15 allocated a mask sized by the gap (a MemoryError); any gap past the canvas keeps
    the first pick alone, as the canvas's width does."""
    chosen, positions = np.array([2, 0, 1]), np.array([3, 5, 9])
    assert _apart(chosen, positions, 10**15, 12).tolist() == _apart(chosen, positions, 12, 12).tolist() == [2]


def test_a_temperature_too_small_to_divide_by_is_greedy(mdm):
    """1e-310 sent every score to inf and argmax(inf + noise) to the first token id; the limit of a
    vanishing temperature is the argmax, and that is what it gives."""
    greedy = mdm.denoise_ids([1, 2, 3], gen_length=8, steps=4, temperature=0)
    assert mdm.denoise_ids([1, 2, 3], gen_length=8, steps=4, temperature=1e-310, seed=0) == greedy
    plain = mdm.denoise_ids([1, 2, 3], gen_length=8, steps=4)
    assert mdm.denoise_ids([1, 2, 3], gen_length=8, steps=4, alg_temp=1e-310, seed=0) == plain


def test_a_hole_count_with_leading_zeros_and_an_infinite_temperature(mdm, ar):
    assert mdm.infill("Once [MASK*0000000003] time") == mdm.infill("Once [MASK*3] time")
    with pytest.raises(UsageError, match="empty hole"):
        mdm.infill("Once [MASK*0000000000] time")
    with pytest.raises(UsageError, match="temperature must be >= 0 and finite"):
        ar.generate_ids([1, 2], 2, temperature=float("inf"))
    with pytest.raises(UsageError, match="alg_temp must be >= 0 and finite"):
        mdm.denoise_ids([1, 2], 8, steps=4, alg_temp=float("inf"))


def test_a_mask_block_out_of_range():
    for b in (-1, 10**20, 1.5, True):
        with pytest.raises(UsageError, match="block must be a whole number"):
            block_causal(b)


def test_chat_arguments(ar):
    with pytest.raises(UsageError, match="Chat takes a tinydiff Model"):
        Chat("stories5m-ar")
    with pytest.raises(UsageError, match="variables must be a dict"):
        ar.chat([{"role": "user", "content": "Hi"}], 4, variables=5)
    with pytest.raises(UsageError, match="'messages' is the conversation's own"):
        ar.chat([{"role": "user", "content": "Hi"}], 4, variables={"messages": []})
    with pytest.raises(UsageError, match="'messages' is the conversation's own"):
        Chat(ar, messages=1)


def test_threads_as_numpy_integers():
    assert tinydiff.load(MODEL, threads=np.int64(1)).pool.threads == 1


def with_nan_weights(name, folder):
    """A copy of a shipped model in folder whose first down_proj holds 32 bf16 NaNs."""
    shutil.copytree(model_path(name), folder)
    path = os.path.join(folder, "model.safetensors")
    data = bytearray(open(path, "rb").read())
    n = struct.unpack("<Q", data[:8])[0]
    entry = json.loads(data[8:8 + n])["model.layers.0.mlp.down_proj.weight"]
    assert entry["dtype"] == "BF16"
    at = 8 + n + entry["data_offsets"][0]
    data[at:at + 64] = b"\xc0\x7f" * 32
    open(path, "wb").write(bytes(data))
    return folder


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_diffusion_model_whose_logits_are_nan_is_a_model_error(tmp_path, temperature):
    """A NaN in the weights reaches every logit: the run stops with a ModelError (the CLI's exit 1),
    where it left the holes as masks and exited 0 (with NumPy's RuntimeWarning at a temperature)."""
    model = tinydiff.load(with_nan_weights("stories5m-mdm", tmp_path / "nan"))
    with pytest.raises(ModelError, match="NaN or -inf everywhere at a masked position"):
        model.denoise("Once upon", 8, steps=8, temperature=temperature)


def test_check_tensors_names_each_tensor_holding_nan_or_inf(tmp_path, capsys):
    """llama.cpp's --check-tensors: `info --check-tensors` names the tensor, with the count, and
    exits 1; on the unmutated model it says every tensor is finite and goes on to the info."""
    from tinydiff.model import check_tensors
    folder = with_nan_weights("stories5m-ar", tmp_path / "nan")
    assert check_tensors(folder) == [("model.layers.0.mlp.down_proj.weight", "BF16",
                                      tinydiff.load(folder).weights.layers[0].down_proj.size, 32)]
    assert check_tensors("stories5m-ar") == []
    assert main(["info", "--check-tensors", "-m", str(folder)]) == 1
    out, err = capsys.readouterr()
    assert "tensor model.layers.0.mlp.down_proj.weight (BF16): 32 of its" in out
    assert err.count("\n") == 1 and "1 tensor hold NaN or inf (model.layers.0.mlp.down_proj.weight)" in err
    assert main(["info", "--check-tensors", "-m", "stories5m-ar"]) == 0
    assert "every tensor finite" in capsys.readouterr().out


def test_the_error_of_a_nan_pass_names_the_tensor(tmp_path, capsys):
    folder = with_nan_weights("stories5m-ar", tmp_path / "nan")
    assert main(["generate", "-m", str(folder), "-p", "Once", "-n", "4"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NaN or inf in model.layers.0.mlp.down_proj.weight (32 of" in err, err


def test_check_tensors_counts_the_blocks_of_a_block_type_whose_scale_is_not_finite():
    from tinydiff.formats import quant
    w = quant.quantize(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32), "q8_0")
    assert quant.nonfinite_count(w) == 0
    w["d"][1, 0], w["d"][3, 1] = np.inf, np.nan
    assert quant.nonfinite_count(w) == 2
    x = np.ones(10, np.float32)
    x[[2, 5]] = [np.inf, -np.nan]
    assert quant.nonfinite_count(x) == 2 == quant.nonfinite_count(x.astype(np.float16))
    assert quant.nonfinite_count(quant.quantize(x, "bf16")) == 2


def test_decode_takes_one_id_as_transformers_does(ar):
    tok = ar.tokenizer
    assert tok.decode(5) == tok.decode([5]) and tok.decode(np.int64(7)) == tok.decode([7])
    for bad in ("ab", b"ab", None, 1.5):
        with pytest.raises(UsageError, match="decode takes token ids"):
            tok.decode(bad)
