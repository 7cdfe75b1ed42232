"""A diffusion model's generation_config.json holds its denoising defaults (issue 39 point 2), and
`tinydiff compare --sweep` is how the shipped ones were chosen."""
import json
import os
import shutil
import xml.dom.minidom

import pytest
from test_cli import assert_one_line_error, run

import tinydiff
from tinydiff.engine.config import with_generation_config
from tinydiff.errors import ModelError
from tinydiff.model import shipped_models
from tinydiff.training import sweep
from tinydiff.training.compare import Row
from tinydiff.training.judge import JudgeRow

PROMPT = "Once upon a time"


def copy_of(tmp_path, name, generation, folder="m"):
    """A copy of a shipped model whose generation_config.json is `generation` (None: none at all)."""
    out = tmp_path / folder
    shutil.copytree(shipped_models()[name], out)
    if (out / "generation_config.json").exists():
        (out / "generation_config.json").unlink()
    if generation is not None:
        (out / "generation_config.json").write_text(json.dumps(generation))
    return str(out)


def test_the_files_rule_and_penalty_are_the_defaults_and_a_run_overrides_them(tmp_path):
    plain = tinydiff.load(copy_of(tmp_path, "stories5m-mdm", None, "plain"))
    model = tinydiff.load(copy_of(tmp_path, "stories5m-mdm", {"threshold": 0.1, "gap": 4, "repetition_penalty": 1.2,
                                                              "do_sample": False}))
    assert dict(model.config.denoising_defaults) == {"threshold": 0.1, "gap": 4, "repeat_penalty": 1.2,
                                                     "temperature": 0.0}
    ids = model.tokenizer.encode(PROMPT)
    by_rule = plain.denoise_result(ids, 32, threshold=0.1, gap=4, repeat_penalty=1.2)
    got = model.denoise_result(ids, 32)
    assert got.ids == by_rule.ids and got.passes == by_rule.passes
    assert by_rule.passes < plain.denoise_result(ids, 32).passes == 32     # the rule changed the run
    # a run naming its own plan drops the file's rule and gap (a factor beside its threshold is no error)
    assert model.denoise_ids(ids, 32, steps=16) == plain.denoise_ids(ids, 32, steps=16, repeat_penalty=1.2)
    assert model.denoise_ids(ids, 32, factor=1.0) == plain.denoise_ids(ids, 32, factor=1.0, repeat_penalty=1.2)
    assert model.denoise_ids(ids, 32, repeat_penalty=1.0) == plain.denoise_ids(ids, 32, threshold=0.1, gap=4)
    # the command line reads them the same way
    status, out, err = run("generate", "-m", model.path, "-p", PROMPT, "-n", "32", "--no-display-prompt")
    assert status == 0, err
    assert out == model.text(got.ids) + "\n"


def test_a_block_models_default_blocks_give_way_to_a_runs_and_to_an_infill(tmp_path):
    model = tinydiff.load(copy_of(tmp_path, "stories5m-bd", {"block_size": 16, "threshold": 0.7}))
    ids = model.tokenizer.encode(PROMPT)
    steps = [s for s in model.denoise_steps(ids, 32) if hasattr(s, "span")]
    assert {s.span[1] - s.span[0] for s in steps} == {16}                 # every step works on a block of 16
    assert model.denoise_ids(ids, 32, block_size=8) == model.denoise_ids(ids, 32, block_size=8, threshold=0.7)
    model.denoise_ids(ids, 32, block_length=8)                            # not "block_size and block_length"
    assert "[MASK]" not in model.infill("Once upon a [MASK*4] there was")  # an infill's blocks: block_length's


@pytest.mark.parametrize("generation, words", [
    ({"threshold": 2}, "threshold must be in (0, 1]"),
    ({"remasking": "loudest"}, "remasking must be one of"),
    ({"gap": 3}, "gap spaces the picks of an adaptive rule"),
    ({"threshold": 0.5, "factor": 1.0}, "give at most one of threshold, factor"),
])
def test_a_bad_denoising_default_is_a_model_error_naming_the_file(tmp_path, generation, words):
    with pytest.raises(ModelError, match="generation_config.json: " + words.replace("(", r"\(").replace("[", r"\[")):
        tinydiff.load(copy_of(tmp_path, "stories5m-mdm", generation))
    status, _, err = run("generate", "-m", str(tmp_path / "m"), "-p", PROMPT, "-n", "8")
    assert_one_line_error(status, err, 1, "generation_config.json")


def test_an_autoregressive_model_reads_no_denoising_defaults(tmp_path):
    model = tinydiff.load(copy_of(tmp_path, "stories5m-ar", {"threshold": 0.5, "repetition_penalty": 1.1}))
    assert model.config.denoising_defaults == ()
    assert dict(model.config.sampling_defaults)["repeat_penalty"] == 1.1


@pytest.mark.parametrize("name", ["stories5m-mdm", "stories5m-bd"])
def test_the_shipped_diffusion_models_defaults_are_the_sweeps_keys(name):
    """The shipped file holds what sweep.generation_config writes: Options' names, transformers' for
    the sampling ones, every one checked at load."""
    path = os.path.join(shipped_models()[name], "generation_config.json")
    raw = json.load(open(path))
    model = tinydiff.load(name)
    assert model.config.denoising_defaults, f"{path} sets no denoising default"
    keys = set(raw) - {"do_sample", "repetition_penalty", "temperature", "eos_token_id", "bos_token_id"}
    assert keys <= set(dict(model.config.denoising_defaults))


# -- the sweep ----------------------------------------------------------------------------------

def row(label, tokens, passes, seconds, perplexity, repeats):
    import math
    judged = JudgeRow({}, [], [], math.log(perplexity) * tokens, tokens, 4.0, repeats, 0.0, 0.0)
    return Row(label, tokens, passes, 0.0, 0.0, 0.0, seconds, judged)


def test_the_pick_is_the_fastest_within_the_quality_rule_else_the_best_quality_says_so():
    refs = {p: sweep.Setting("autoregressive", {}, row("ar", 100, 100, 0.1, 4.0, 0.05)) for p in sweep.PENALTIES}
    fast_bad = sweep.Setting("block", {"block_size": 8, "threshold": 0.3}, row("a", 100, 25, 0.02, 9.0, 0.02))
    loops = sweep.Setting("block", {"block_size": 8, "threshold": 0.5}, row("b", 100, 40, 0.03, 4.5, 0.30))
    good = sweep.Setting("block", {"block_size": 8, "threshold": 0.7}, row("c", 100, 60, 0.05, 4.9, 0.05))
    slow = sweep.Setting("block", {"block_size": 8, "steps": 100}, row("d", 100, 110, 0.09, 4.2, 0.01))
    fixed2 = sweep.Setting("block", {"block_size": 8, "steps": 50}, row("e", 100, 50, 0.01, 4.1, 0.01))
    best, met, why = sweep.pick("block", refs, [fast_bad, loops, good, slow, fixed2], 100)
    assert best is good and met and why.startswith("pick for block diffusion") and "1.23x the AR twin's" in why
    best, met, why = sweep.pick("block", refs, [fast_bad, loops], 100)
    assert best is fast_bad and not met and "none meets the rule" in why   # the loop's rep4 rules it out


def test_a_picks_generation_config_reads_back_as_its_options(tmp_path):
    s = sweep.Setting("block", {"block_size": 16, "threshold": 0.7, "gap": 1, "repeat_penalty": 1.2})
    (tmp_path / "generation_config.json").write_text(sweep.generation_config(s, 0.0))
    cfg = with_generation_config(tinydiff.load("stories5m-bd").config, str(tmp_path / "generation_config.json"))
    assert dict(cfg.denoising_defaults) == {"block_size": 16, "threshold": 0.7, "gap": 1, "repeat_penalty": 1.2,
                                            "temperature": 0.0}


def test_the_grid_names_every_knob_and_each_setting_once():
    for kind, n_blocks in (("masked", 1), ("block", len(sweep.BLOCK_SIZES))):
        settings = sweep.grid(kind, 64)
        assert len(settings) == len(sweep.PENALTIES) * n_blocks * len(sweep.RULES[kind])
        assert len({s.label for s in settings}) == len(settings)
        assert all(("steps" in s.options) != ("threshold" in s.options) for s in settings)
    assert {s.options.get("block_size") for s in sweep.grid("block", 64)} == set(sweep.BLOCK_SIZES)


def test_compare_sweep_runs_picks_and_plots(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "PENALTIES", (1.0, 1.3))
    monkeypatch.setattr(sweep, "BLOCK_SIZES", (8,))
    monkeypatch.setattr(sweep, "RULES", {"masked": [(1, None), (None, (0.5, 4))], "block": [(1, None), (None, (0.5, 0))]})
    from tinydiff.cli import main
    plot = tmp_path / "sweep.svg"
    assert main(["compare", "--sweep", "-n", "8", "--samples", "1", "-t", "1", "--temp", "0", "--plot", str(plot)]) \
        in (0, None)
    doc = xml.dom.minidom.parse(str(plot))
    assert len([c for c in doc.getElementsByTagName("circle") if c.getAttribute("class") == "point"]) == 2 + 4 + 4
    status, _, err = run("compare", "--sweep", "--threshold", "0.5", "-n", "8")
    assert_one_line_error(status, err, 2, "--sweep")
