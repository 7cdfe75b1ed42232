"""`tinydiff bench`'s kp tests (issue 39 point 1): one forward pass of K rows after a cached prompt of
64 positions, 32 of them a repetition (fewer on a large model), booked pass by pass; the -k flag, its
defaults and refusals, and the summary lines in decode steps and against the roofline. Timings are
never asserted."""
import json
import shutil

import numpy as np
import pytest
from test_cli import MODEL, assert_one_line_error, fixed_roofline, run  # noqa: F401 (fixed_roofline: a fixture)

import tinydiff
from tinydiff.cli import main
from tinydiff.engine import cost
from tinydiff.engine.ledger import Ledger
from tinydiff.engine.masks import BIDIRECTIONAL, CAUSAL, block_causal
from tinydiff.errors import UsageError
from tinydiff.formats import quant
from tinydiff.measure.bench import (
    HEADER,
    KP_PASSES,
    KP_PROMPT,
    KP_READ,
    Result,
    bench,
    check_fits,
    kp_passes,
    kp_ratios,
    parse_test,
    prepare,
)
from tinydiff.measure.roofline import predict_seconds

BD = "stories5m-bd"       # a shipped block-diffusion model: bidirectional inside a block


@pytest.mark.parametrize("spec, k", [("kp1", 1), ("kp8", 8), ("kp32", 32), ("kp100", 100)])
def test_parse_test_takes_a_kp_spec(spec, k):
    assert parse_test(spec) == ("kp", k, KP_PASSES, 0)


@pytest.mark.parametrize("spec", ["kp0", "kp", "kp-1", "kp2x3", "kpx", "kp 4"])
def test_parse_test_refuses_a_bad_kp_spec_naming_it_and_the_form(spec):
    with pytest.raises(UsageError) as e:
        parse_test(spec)
    assert f"'{spec}'" in str(e.value) and "kp8" in str(e.value) and "\n" not in str(e.value)


def test_check_fits_counts_the_prompt():
    assert check_fits("kp192", 256) == ("kp", 192, KP_PASSES, 0)          # 64 + 192 = 256 positions
    with pytest.raises(UsageError, match=r"kp193 exceeds a model's context of 256 \(64 prompt positions \+ 193\)"):
        check_fits("kp193", 256)


@pytest.mark.parametrize("path, mask", [(MODEL, CAUSAL), (BD, BIDIRECTIONAL)])
def test_a_repetition_is_32_passes_of_k_rows_booked_as_cost_forward_has_them(path, mask):
    """The prompt is cached before the ledger opens; then each pass computes the K rows at positions
    64.. (causal, or all K seeing each other and the prompt) with the LM head on every row."""
    model = tinydiff.load(path)
    assert model.config.causal == (mask == CAUSAL)
    wb = quant.bytes_per_weight(model.weights.layers[0].q_proj)          # the shipped model's are bf16
    for k in (1, 4):
        run_ = prepare(model, "kp", k, KP_PASSES, 0, np.random.default_rng(0))
        with Ledger() as led:
            assert run_() == KP_PASSES * k
        assert led.passes == [cost.forward(model.config, k, KP_PROMPT, mask, wb, all_logits=True)] * KP_PASSES


def test_the_bidirectional_pass_is_the_block_step_s():
    """For a block model the K rows are one block after the prompt: the pairs BIDIRECTIONAL lets
    through over the 64 + K slots are block_causal(K)'s (the decoder's block mask) exactly."""
    for k in (1, 2, 8, 32):
        assert BIDIRECTIONAL.pairs(k, KP_PROMPT + k, KP_PROMPT) == block_causal(k).pairs(k, KP_PROMPT + k, KP_PROMPT)
        assert BIDIRECTIONAL.pairs(k, KP_PROMPT + k, KP_PROMPT) == k * (KP_PROMPT + k)


def test_bench_results_of_kp_tests(fixed_roofline):
    model = tinydiff.load(MODEL)
    kp1, kp4 = bench(model, "m", ["kp1", "kp4"], repetitions=2, roofline=fixed_roofline)
    for r, k in ((kp1, 1), (kp4, 4)):
        one = cost.forward(model.config, k, KP_PROMPT, CAUSAL, all_logits=True)
        assert (r.test, r.passes, r.tokens, len(r.seconds)) == (f"kp{k}", KP_PASSES, KP_PASSES * k, 2)
        assert r.flops == KP_PASSES * one["flops"] and r.bytes == KP_PASSES * sum(one["bytes"].values())
        assert r.weight_bytes == KP_PASSES * one["bytes"]["weights"]
        assert r.roofline_seconds == predict_seconds(r.flops, r.bytes, fixed_roofline)
    assert kp4.flops > 3 * kp1.flops                                      # 4 rows of arithmetic a pass
    assert kp4.weight_bytes - kp1.weight_bytes == KP_PASSES * 3 * model.config.hidden_size * 4   # 3 embedding rows more


def test_a_large_model_runs_fewer_passes_a_repetition(fixed_roofline, monkeypatch):
    """32 passes while they read at most KP_READ bytes of weights, else as many as do (at least one):
    bench's Results say how many ran, and a pass's cost stays one pass's."""
    class Sized:                                                          # weight_bytes is all kp_passes reads
        def __init__(self, n):
            self.n = n

        def weight_bytes(self):
            return {"f32": self.n}, 0
    assert [kp_passes(Sized(n)) for n in (1, KP_READ // 32, KP_READ // 5, KP_READ, 10 * KP_READ)] == [32, 32, 5, 1, 1]
    model = tinydiff.load(MODEL)
    monkeypatch.setattr("tinydiff.measure.bench.KP_READ", sum(model.weight_bytes()[0].values()) * 3)
    (r,) = bench(model, "m", ["kp2"], repetitions=1, roofline=fixed_roofline)
    one = cost.forward(model.config, 2, KP_PROMPT, CAUSAL, all_logits=True)
    assert (r.passes, r.tokens, r.flops) == (3, 6, 3 * one["flops"])


def test_kp_ratios_divide_by_kp1_and_the_roofline():
    """The summary's figures from made-up Results: a pass's time is a repetition's mean over its passes."""
    from tinydiff.measure.bench import Result
    r1 = Result("m", 1, 1, "kp1", 32, [0.032, 0.032], 1, 1, passes=32, roofline_seconds=0.016)
    r8 = Result("m", 1, 1, "kp8", 256, [0.064, 0.096], 1, 1, passes=32, roofline_seconds=0.020)
    tg = Result("m", 1, 1, "tg8", 8, [0.01], 1, 1, passes=8)
    assert kp_ratios([tg, r1, r8]).splitlines() == [
        "m kp1: 1 ms a pass, 2.00x the roofline's time",
        "m kp8: 2.5 ms a pass, 2.50 decode steps (kp1's time), 4.00x the roofline's time"]
    r8.roofline_seconds = 0.0                                             # --no-roofline
    assert kp_ratios([r8]) == "m kp8: 2.5 ms a pass"                      # no kp1: no decode steps either


def test_cli_prints_kp_rows_and_their_summary(capsys, fixed_roofline):
    skip = ["-p", "0", "-n", "0", "-d", "0", "-b", "0"]                  # no pp, tg, dd, bd test
    assert main(["bench", "-m", MODEL, *skip, "-k", "1", "-k", "4", "-r", "1"]) == 0
    out = capsys.readouterr().out
    assert [row.split("|")[4].strip() for row in out.splitlines()[2:] if row.startswith("|")] == ["kp1", "kp4"]
    one = next(l for l in out.splitlines() if l.startswith(f"{MODEL} kp1: "))
    four = next(l for l in out.splitlines() if l.startswith(f"{MODEL} kp4: "))
    assert one.endswith("x the roofline's time") and "decode steps" not in one and " ms a pass, " in one
    assert " ms a pass, " in four and " decode steps (kp1's time), " in four and four.endswith("x the roofline's time")
    for test, line in (("kp1", one), ("kp4", four)):                      # x-roofline: 1 / the table's share
        share = next(row for row in out.splitlines() if row.startswith("|") and row.split("|")[4].strip() == test)
        pct = float(share.split("|")[8].strip().rstrip("%"))
        assert float(line.split(", ")[-1].split("x ")[0]) == pytest.approx(100 / pct, rel=0.02)
    assert main(["bench", "-m", MODEL, *skip, "-k", "2", "-r", "1", "--no-roofline"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith(f"{MODEL} kp2: "))
    assert line.endswith(" ms a pass")                                    # no kp1, no roofline


def test_cli_json_has_the_kp_rows(capsys, fixed_roofline):
    assert main(["bench", "-m", MODEL, "-p", "0", "-n", "0", "-d", "0", "-b", "0", "-k", "3", "-r", "2", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["test"] == "kp3" and row["passes"] == KP_PASSES and row["tokens"] == 3 * KP_PASSES
    assert len(row["seconds"]) == 2 and row["roofline_seconds"] > 0


def test_default_kp_tests_are_those_that_fit_the_context(capsys, fixed_roofline, tmp_path):
    """Without -k: kp1 .. kp32 on a context of 256; on one of 80, kp1 .. kp16; -k 0 runs none."""
    def tests(*argv):
        assert main(["bench", *argv, "-p", "0", "-n", "0", "-d", "0", "-b", "0", "-r", "1", "--json"]) == 0
        return [r["test"] for r in json.loads(capsys.readouterr().out)]
    assert tests("-m", MODEL) == ["kp1", "kp2", "kp4", "kp8", "kp16", "kp32"]
    small = tmp_path / "small"
    shutil.copytree(MODEL, small)
    config = small / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "max_position_embeddings": 80}))
    assert tests("-m", str(small)) == ["kp1", "kp2", "kp4", "kp8", "kp16"]
    assert tests("-m", MODEL, "-k", "0", "-n", "2") == ["tg2"]


def test_a_k_past_the_context_is_one_line_exit_2_before_anything_runs():
    status, out, err = run("bench", "-m", MODEL, "-k", "1", "-k", "200", "-r", "1", "--no-roofline")   # context 256
    assert_one_line_error(status, err, 2, "kp200 exceeds a model's context of 256", "64 prompt positions")
    assert out == ""
    status, _, err = run("bench", "-m", MODEL, "-k", "-3", "-r", "1", "--no-roofline")
    assert_one_line_error(status, err, 2, "'kp-3'", "kp8")

    status, out, err = run("bench", "-m", MODEL, "-p", "0", "-n", "0", "-d", "0", "-b", "0", "-k", "0", "--no-roofline")
    assert_one_line_error(status, err, 2, "every test kind is 0", "no test to run")
    assert out == ""


@pytest.mark.parametrize("seconds", [[1.0, 1.0], [1e-3, 2e-3], [1e-4, 2e-4]])
def test_a_row_keeps_the_headers_columns_at_any_rate(seconds):
    """Each cell of a row ends where the header's column does, for rates and spreads from tens of
    t/s to hundreds of thousands (a kp32 pass of a 5M model is tens of thousands, its spread
    thousands)."""
    r = Result("stories5m-ar", 5_300_000, 2, "kp32", 32, seconds, 10**8, 10**7, 10**7, 1, 1e-4)
    header = HEADER.splitlines()[0]
    bars = [i for i, c in enumerate(header) if c == "|"]
    assert [i for i, c in enumerate(r.row()) if c == "|"] == bars, (header, r.row())
