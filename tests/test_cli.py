"""The command line, and every kind of bad input a user can give it: one line, the right exit status."""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

import tinydiff
from tinydiff.cli import main
from tinydiff.engine import kernels
from tinydiff.engine.masks import BIDIRECTIONAL, CAUSAL

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
MODEL = os.path.join(HF, "llama-gqa")


def run(*argv, stdin=b""):
    """Runs `python -m tinydiff` in a subprocess: (exit status, stdout, stderr).

    It runs in tests/, so it imports the installed package, not the source folder beside it."""
    p = subprocess.run([sys.executable, "-m", "tinydiff", *argv], input=stdin, capture_output=True, timeout=120,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def assert_one_line_error(status, err, expected_status, *words):
    assert status == expected_status, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tinydiff: error: ") and not lines[0].startswith("tinydiff: error: tinydiff"), lines[0]
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture
def model_copy(tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(MODEL, dst)
    return dst


def test_generate_streams_the_same_text_as_the_api(capsys):
    expected = tinydiff.load(MODEL).generate("Once upon a time", 12, temperature=0)
    assert main(["generate", "-m", MODEL, "-p", "Once upon a time", "-n", "12", "--temp", "0"]) == 0
    assert capsys.readouterr().out == "Once upon a time" + expected + "\n"          # the prompt echoed first
    assert main(["generate", "-m", MODEL, "-p", "Once upon a time", "-n", "12", "--temp", "0",
                 "--no-display-prompt"]) == 0
    assert capsys.readouterr().out == expected + "\n"


def test_seeded_sampling_is_reproducible_and_stats_go_to_stderr(capsys):
    argv = ["generate", "-m", MODEL, "-p", "Once", "-n", "16", "--temp", "1.0", "-s", "3", "--stats"]
    main(argv)
    first = capsys.readouterr()
    main(argv)
    second = capsys.readouterr()
    assert first.out == second.out
    assert "prompt eval:" in first.err and "tokens/s" in first.err and "time to first token" in first.err


def test_prompt_from_stdin_and_file(tmp_path):
    status, out_stdin, _ = run("generate", "-m", MODEL, "-n", "4", "--temp", "0", stdin="Once upon".encode())
    assert status == 0
    (tmp_path / "p.txt").write_text("Once upon", encoding="utf-8")
    status, out_file, _ = run("generate", "-m", MODEL, "-n", "4", "--temp", "0", "-f", str(tmp_path / "p.txt"))
    assert status == 0 and out_file == out_stdin and out_file.strip()


def test_info_prints_architecture_parameters_and_bytes(capsys):
    assert main(["info", "-m", MODEL]) == 0
    out = capsys.readouterr().out
    model = tinydiff.load(MODEL)
    assert f"{model.parameter_count():,}" in out
    assert "llama" in out and "weights F32" in out and "heads 4 (kv 2" in out
    assert f"run as:       f32 {sum(model.weight_bytes()[0].values()) / 2**20:.2f} MiB" in out


def test_info_says_a_bf16_checkpoint_runs_in_bf16_from_the_file(capsys):
    assert main(["info", "-m", os.path.join(HF, "llama-bf16")]) == 0
    out = capsys.readouterr().out
    run_as = next(line for line in out.splitlines() if line.startswith("run as:"))
    assert "bf16 0.22 MiB" in run_as and "0.22 MiB of it mapped from the file" in run_as


# -- bad input: usage errors exit 2 ------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["-p", ""], ["prompt is empty"]),
    (["-p", "hi", "-n", "0"], ["must be >= 1", "0"]),
    (["-p", "hi", "--temp", "-1"], ["temperature", "-1"]),
    (["-p", "hi", "--top-p", "2"], ["top_p"]),
    (["-p", "hi", "-n", "abc"], ["n-predict", "abc"]),
    (["-p", "hi", "-n", "300"], ["context of 256"]),
    (["-p", "hi", "--stop", ""], ["stop string must not be empty"]),
])
def test_usage_errors_are_one_line_with_status_2(argv, words):
    status, _, err = run("generate", "-m", MODEL, *argv)
    assert_one_line_error(status, err, 2, *words)


def test_an_empty_model_name_is_refused_not_the_default(capsys):
    assert main(["generate", "-m", "", "-p", "Once", "-n", "2"]) == 2
    assert "-m/--model is empty" in capsys.readouterr().err


@pytest.mark.parametrize("flags, words", [
    (["--temp", "-1"], ["temperature must be >= 0"]),
    (["--top-p", "5"], ["top_p"]),
    (["-n", "100000"], ["leaves no room for a message"]),
])
def test_chat_checks_its_flags_before_the_first_line(tmp_path, flags, words):
    """A bad flag is one usage error before anything is read (it was an error for every line typed,
    then exit 0); a template that renders nothing is a usage error, not a traceback."""
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    status, out, err = run("chat", "-m", MODEL, "--chat-template-file", str(template), "-n", "4", *flags,
                           stdin=b"hi\nhello\n")
    assert_one_line_error(status, err, 2, *words)
    assert out == ""
    template.write_text("")
    status, _, err = run("chat", "-m", MODEL, "--chat-template-file", str(template), "-n", "4", stdin=b"hi\n")
    assert status == 0 and "renders the conversation as nothing" in err and "Traceback" not in err
    template.write_text("{% for m in messages %")
    status, _, err = run("chat", "-m", MODEL, "--chat-template-file", str(template), stdin=b"hi\n")
    assert_one_line_error(status, err, 2, str(template))       # the caller's file: a usage error


def test_invalid_utf8_on_stdin():
    status, _, err = run("generate", "-m", MODEL, "-n", "4", stdin=b"Once \xff\xfe upon")
    assert_one_line_error(status, err, 2, "stdin", "invalid UTF-8", "byte 5")


def test_more_threads_than_cores():
    status, _, err = run("generate", "-m", MODEL, "-p", "hi", "-t", str(kernels.physical_cores() + 1))
    assert_one_line_error(status, err, 2, "threads", "cores")


@pytest.mark.parametrize("value", ["abc", "0", "999"])
def test_bad_thread_count_in_the_environment(value, monkeypatch):
    monkeypatch.setenv("TINYDIFF_THREADS", value)
    status, _, err = run("generate", "-m", MODEL, "-p", "hi")
    assert_one_line_error(status, err, 2, "TINYDIFF_THREADS", value)


@pytest.mark.parametrize("value", ["sse9", "avx512x"])
def test_bad_simd_path_in_the_environment(value, monkeypatch):
    monkeypatch.setenv("TINYDIFF_SIMD", value)
    status, _, err = run("generate", "-m", MODEL, "-p", "hi")
    assert_one_line_error(status, err, 2, "TINYDIFF_SIMD", value)


def test_unknown_command_and_flag():
    status, _, err = run("frobnicate")
    assert_one_line_error(status, err, 2, "frobnicate")
    status, _, err = run("generate", "-m", MODEL, "-p", "hi", "--bogus")
    assert_one_line_error(status, err, 2, "--bogus")


# -- bad input: model errors exit 1 ------------------------------------------------------------

def test_missing_model_folder(tmp_path):
    status, _, err = run("generate", "-m", str(tmp_path / "nope"), "-p", "hi")
    assert_one_line_error(status, err, 1, "nope")


def test_truncated_weights_file(model_copy):
    path = model_copy / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    status, _, err = run("generate", "-m", str(model_copy), "-p", "hi")
    assert_one_line_error(status, err, 1, "model.safetensors")


def rewrite_header(path, edit):
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    edit(header)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


def test_header_that_lies_about_a_shape(model_copy):
    name = "model.layers.0.mlp.up_proj.weight"
    rewrite_header(model_copy / "model.safetensors", lambda h: h[name].update(shape=[64, 128]))
    status, _, err = run("info", "-m", str(model_copy))
    assert_one_line_error(status, err, 1, "model.safetensors", name)


def test_weights_of_the_wrong_shape_for_the_config(model_copy):
    cfg = json.loads((model_copy / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (model_copy / "config.json").write_text(json.dumps(cfg))
    status, _, err = run("info", "-m", str(model_copy))
    assert_one_line_error(status, err, 1, "gate_proj", "expected (96, 64)")


def test_unknown_dtype(model_copy):
    name = "model.norm.weight"
    rewrite_header(model_copy / "model.safetensors", lambda h: h[name].update(dtype="Q9"))
    status, _, err = run("info", "-m", str(model_copy))
    assert_one_line_error(status, err, 1, "model.safetensors", "Q9")


def test_missing_tokenizer(model_copy):
    os.remove(model_copy / "tokenizer.json")
    status, _, err = run("info", "-m", str(model_copy))
    assert_one_line_error(status, err, 1, "tokenizer.json")


def test_corrupt_config(model_copy):
    (model_copy / "config.json").write_text('{"model_type": "llama", ')
    status, _, err = run("info", "-m", str(model_copy))
    assert_one_line_error(status, err, 1, "config.json")


# -- masked diffusion from the command line ------------------------------------------------------

@pytest.fixture(scope="module")
def llada_dir(tmp_path_factory):
    from test_diffusion_models import write_llada
    path = tmp_path_factory.mktemp("llada") / "model"
    write_llada(MODEL, str(path), mask_token_id=2)
    return str(path)


def test_diffusion_generate_prints_the_denoised_completion_and_stats(llada_dir):
    model = tinydiff.load(llada_dir)
    expected = model.denoise("Once upon a time", 12, steps=6, block_length=4)
    status, out, err = run("generate", "-m", llada_dir, "-p", "Once upon a time", "-n", "12", "--steps", "6",
                           "--block", "4", "--stats", "--no-display-prompt")
    assert status == 0 and out == expected + "\n"
    assert "forward passes: 6" in err and "2.00 tokens committed per pass" in err


def test_diffusion_generate_passes_the_repetition_penalty(llada_dir):
    model = tinydiff.load(llada_dir)
    penalised = model.denoise("Once upon a time", 12, repeat_penalty=3.0, repeat_last_n=8)
    assert penalised != model.denoise("Once upon a time", 12)             # the fixture's greedy text repeats
    status, out, _ = run("generate", "-m", llada_dir, "-p", "Once upon a time", "-n", "12", "--repeat-penalty", "3",
                         "--repeat-last-n", "8", "--no-display-prompt")
    assert status == 0 and out == penalised + "\n"
    assert run("generate", "-m", llada_dir, "-p", "Once", "-n", "4", "--repeat-last-n", "-1")[0] == 2


def test_infill_takes_the_repetition_penalty(llada_dir):
    model = tinydiff.load(llada_dir)
    ids, first, last = model.holes("Once upon[MASK*6] there was")
    want = model.tokenizer.text(model.denoise_result(ids, fixed=np.asarray(ids) != model.mask_id, eos="suppress",
                                                     repeat_penalty=3.0, repeat_last_n=4).canvas[first:last].tolist())
    status, out, _ = run("infill", "-m", llada_dir, "-p", "Once upon[MASK*6] there was", "--repeat-penalty", "3",
                         "--repeat-last-n", "4")
    assert status == 0 and out == want + "\n"


def test_infill_keeps_the_given_text(llada_dir):
    status, out, _ = run("infill", "-m", llada_dir, "-p", "Once upon[MASK*3] there was")
    assert status == 0 and out.startswith("Once upon") and out.rstrip("\n").endswith(" there was")


def test_infill_keeps_given_text_after_an_end_of_text(llada_dir):
    """The given text is the user's, an EOS in it too (Model.infill's answer); the CLI cut it there."""
    text = "Once upon a [MASK*2]. The end.<|endoftext|>Later [MASK*2] x"
    want = tinydiff.load(llada_dir).infill(text, seed=1)
    status, out, _ = run("infill", "-m", llada_dir, "-p", text, "-s", "1")
    assert status == 0 and out == want + "\n" and out.rstrip("\n").endswith(" x")


def test_visual_falls_back_to_plain_text_when_not_a_terminal(llada_dir):
    plain = run("generate", "-m", llada_dir, "-p", "Once", "-n", "8")
    visual = run("generate", "-m", llada_dir, "-p", "Once", "-n", "8", "--visual")
    assert visual == plain


@pytest.mark.parametrize("argv, words", [
    (["generate", "-p", "Once", "--mode", "ar"], ["masked-diffusion model"]),
    (["generate", "-p", "Once", "-n", "8", "--block", "3"], ["block"]),
    (["generate", "-p", "Once", "-n", "8", "--threshold", "1.5"], ["threshold"]),
    (["generate", "-p", "Once", "-n", "8", "--steps", "0"], ["steps"]),
    (["infill", "-p", "The [MASK*0] cat"], ["MASK*0"]),
    (["generate", "-p", "Once", "-n", "8", "--cfg", "inf"], ["cfg_scale must be >= 0 and finite"]),
    (["generate", "-p", "Once", "-n", "8", "--factor", "inf"], ["factor must be > 0 and finite"]),
    (["generate", "-p", "Once", "-n", "8", "--entropy-bound", "inf"], ["entropy_bound must be >= 0 and finite"]),
])
def test_diffusion_usage_errors(llada_dir, argv, words):
    status, _, err = run(*argv[:1], "-m", llada_dir, *argv[1:])
    assert_one_line_error(status, err, 2, *words)


def test_model_without_mask_token_cannot_denoise():
    status, _, err = run("generate", "-m", MODEL, "-p", "Once", "--mode", "diffusion", "-n", "8")
    assert_one_line_error(status, err, 2, "mask")


# -- bench, cost, roofline ---------------------------------------------------------------------------

@pytest.fixture
def fixed_roofline(monkeypatch):
    """A made-up machine (10 GB/s, 100 GFLOP/s), so the tests measure nothing."""
    from tinydiff.measure import roofline
    machine = roofline.Roofline(mem_gbs=10.0, llc_gbs=40.0, peak_gflops=100.0, balance=10.0, llc_balance=2.5,
                                cpu="test cpu", threads=1, simd="c", when="now")
    monkeypatch.setattr(roofline, "load_or_measure", lambda threads=None, remeasure=False: machine)
    return machine


def test_bench_json_has_each_test_with_its_ledger_costs(capsys, fixed_roofline):
    assert main(["bench", "-m", MODEL, "-p", "16", "-n", "4", "-d", "16x2", "-b", "16x8x2", "-k", "2", "-r", "2",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in rows] == ["pp16", "tg4", "dd16x2", "bd16x8x2", "kp2"]
    model = tinydiff.load(MODEL)
    pp, tg, dd, bd, kp = rows
    cost = tinydiff.cost.forward
    assert pp["flops"] == cost(model.config, 16, 0, CAUSAL)["flops"]
    assert tg["flops"] == sum(cost(model.config, 1, i, CAUSAL)["flops"] for i in range(1, 5))
    assert dd["flops"] == 2 * cost(model.config, 16, 0, BIDIRECTIONAL)["flops"]
    # the one-token prompt; then per block of 8, two steps seeing the cache and the block, the LM
    # head on the block's masked positions (8, then 4)
    blocks = [cost(model.config, 8, lo, BIDIRECTIONAL, logit_rows=k)["flops"] for lo in (1, 9) for k in (8, 4)]
    blocks.append(cost(model.config, 8, 1, CAUSAL)["flops"])        # the first block's clean pass; the last has none
    scored = tinydiff.cost.sampling(2 * (8 + 4), model.config.vocab_size)[0]   # each step's masked rows
    assert bd["flops"] == cost(model.config, 1, 0, CAUSAL)["flops"] + sum(blocks) + scored and bd["tokens"] == 16
    # 32 passes of 2 rows after the 64 cached positions, every row's logits
    assert kp["flops"] == 32 * cost(model.config, 2, 64, CAUSAL, all_logits=True)["flops"] and kp["tokens"] == 64
    assert all(len(r["seconds"]) == 2 and r["roofline_seconds"] > 0 for r in rows)


def test_bench_table_and_bad_test_spec(capsys, fixed_roofline):
    assert main(["bench", "-m", MODEL, "-p", "8", "-n", "8", "-d", "8x1", "-b", "8x4x2", "-r", "1"]) == 0
    out = capsys.readouterr().out
    assert "pp8" in out and "tg8" in out and "dd8x1" in out and "bd8x4x2" in out and "%" in out
    line = next(l for l in out.splitlines() if l.startswith(f"{MODEL} bd8x4x2:"))   # 2 blocks: 6 passes in all
    assert "2 tokens a step, 1.33 a pass; ms per token" in line and "x tg8's" in line
    line = next(l for l in out.splitlines() if "weights read at" in l)   # the decode test's weight bandwidth
    gbs = float(line.split("weights read at ")[1].split()[0])
    assert line.startswith(f"{MODEL} tg8:") and f"{gbs / 10.0:.0%} of the memory's 10.0 GB/s" in line
    assert main(["bench", "-m", MODEL, "-p", "8", "-d", "8y1"]) == 2
    assert "8y1" in capsys.readouterr().err
    for bad in ("8x4", "10x4x2", "8x2x4", "8x0x1"):                      # too few parts, N % B, S > B, B = 0
        assert main(["bench", "-m", MODEL, "-p", "8", "-b", bad]) == 2
        assert bad in capsys.readouterr().err
    assert main(["bench", "-m", MODEL, "-p", "8", "-d", "8x9"]) == 2      # more steps than positions
    assert "8x9" in capsys.readouterr().err
    assert main(["bench", "-m", MODEL, "-p", "8", "--npl", "1,2000"]) == 2
    assert "batch sizes 1-1024" in capsys.readouterr().err


def test_bench_checks_every_model_before_running_any(capsys, fixed_roofline, tmp_path):
    """A test too long for the second model's context is refused before the first model runs."""
    small = tmp_path / "small"
    shutil.copytree(MODEL, small)
    cfg = json.load(open(small / "config.json"))
    json.dump({**cfg, "max_position_embeddings": 64}, open(small / "config.json", "w"))
    assert main(["bench", "-m", MODEL, "-m", str(small), "-p", "8", "-n", "4", "-d", "100x2", "-b", "8x8x1",
                 "-r", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "dd100x2 exceeds a model's context of 64" in captured.err


def test_bench_runs_each_weight_type_and_gives_ratios(capsys, fixed_roofline):
    assert main(["bench", "-m", MODEL, "-p", "8", "-n", "2", "-d", "8x1", "-b", "8x8x1", "-k", "0", "-r", "1", "--type",
                 "f32,q8_0", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["model"].split()[-1], r["test"]) for r in rows] == [
        (t, test) for t in ("f32", "q8_0") for test in ("pp8", "tg2", "dd8x1", "bd8x8x1")]
    f32_tg, q8_tg = rows[1], rows[5]
    assert q8_tg["flops"] == f32_tg["flops"] and q8_tg["bytes"] < 0.5 * f32_tg["bytes"]
    assert main(["bench", "-m", MODEL, "-p", "8", "-n", "2", "-d", "8x1", "-b", "8x8x1", "-r", "1", "--type",
                 "f32,q4_0"]) == 0
    out = capsys.readouterr().out
    assert "tg2: q4_0" in out and "x the f32 t/s" in out
    assert main(["bench", "-m", MODEL, "--type", "q3"]) == 2
    assert "bench: unknown weight type 'q3'" in capsys.readouterr().err


def test_cost_prints_ar_and_diffusion_rows_and_draws_the_plot(capsys, fixed_roofline, tmp_path, llada_dir):
    svg = tmp_path / "roofline.svg"
    assert main(["cost", "-m", MODEL, "-m", llada_dir, "-n", "8", "--plot", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "autoregressive" in out and "diffusion steps=8" in out and "diffusion steps=2" in out
    assert "balance 10.0 FLOP/byte" in out
    import xml.etree.ElementTree as ET
    text = " ".join(t.text or "" for t in ET.parse(svg).iter() if t.tag.endswith("text"))
    assert "autoregressive" in text and "canvas 64" in text
    assert main(["cost", "-m", MODEL, "-m", llada_dir, "-m", MODEL, "-n", "8"]) == 2    # one of each kind
    assert "would not be measured" in capsys.readouterr().err


def test_cost_by_weight_type_reads_fewer_bytes_per_token(capsys, fixed_roofline, llada_dir):
    assert main(["cost", "-m", MODEL, "-m", llada_dir, "-n", "8", "--type", "f32,f16,q8_0"]) == 0
    rows = {line[:44].strip(): line.split() for line in capsys.readouterr().out.splitlines()}
    mb_token = {t: float(rows[f"{t} autoregressive, greedy"][-6]) for t in ("f32", "f16", "q8_0")}
    assert mb_token["f32"] > mb_token["f16"] > mb_token["q8_0"]                  # the weights shrink
    gflop = {t: rows[f"{t} diffusion steps=8"][-8] for t in ("f32", "f16", "q8_0")}
    assert len(set(gflop.values())) == 1                                         # the arithmetic does not
    assert main(["cost", "-m", MODEL, "--type", "q5_k"]) == 2
    assert "unknown weight type 'q5_k'" in capsys.readouterr().err


def test_roofline_command_reports_the_machine(capsys, fixed_roofline):
    assert main(["roofline"]) == 0
    out = capsys.readouterr().out
    assert "10.0 GB/s" in out and "100.0 GFLOP/s" in out


def test_perplexity_prints_llama_cpps_lines_and_refuses_bad_input_in_one_line(tmp_path):
    text = os.path.join(os.path.dirname(__file__), "fixtures", "perplexity", "text.txt")
    status, out, err = run("perplexity", "-m", MODEL, "-f", text, "-c", "64", "--chunks", "3")
    assert status == 0, err
    lines = out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("[1]") and lines[0].count(",") == 3
    assert lines[1].startswith("Final estimate: PPL = ") and " +/- " in lines[1]
    for argv, words in ((["-f", str(tmp_path / "none.txt")], ["none.txt: no such file"]),
                        (["-f", text, "-c", "1024"], ["-c 1024", "256 positions"]),
                        (["-f", text, "-c", "abc"], ["-c/--ctx-size", "invalid int"]),
                        (["-c", "64"], ["-f/--file"])):
        status, _, err = run("perplexity", "-m", MODEL, *argv)
        assert_one_line_error(status, err, 2, *words)
