"""What a new user meets first: the shipped models by name, --version, the prompt echoed, flags of
the other mode refused rather than ignored, and every mistake with the API one UsageError line."""
import os

import numpy as np
import pytest
from test_cli import MODEL, assert_one_line_error, llada_dir, run  # noqa: F401 (llada_dir: a fixture)

import tinydiff
from tinydiff.engine.ledger import Ledger
from tinydiff.errors import UsageError
from tinydiff.model import shipped_models

# -- the shipped models by name ------------------------------------------------------------------

def test_models_lists_the_shipped_models_with_their_folders():
    status, out, _ = run("models")
    assert status == 0
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()}
    assert set(rows) >= {"stories5m-ar", "stories5m-mdm"}
    assert all(os.path.isfile(os.path.join(path, "config.json")) for path in rows.values())


def test_a_shipped_model_loads_by_name_in_the_api_and_every_command(tmp_path):
    assert tinydiff.load("stories5m-mdm").path == shipped_models()["stories5m-mdm"]
    status, out, _ = run("info", "-m", "stories5m-ar")
    assert status == 0 and "stories5m-ar" in out
    status, out, _ = run("generate", "-m", "stories5m-ar", "-p", "Once", "-n", "3", "--temp", "0")
    assert status == 0 and out.startswith("Once")
    status, _, err = run("convert", "-m", "stories5m-ar", "--type", "q8_0", "-o", str(tmp_path / "ar.gguf"))
    assert status == 0, err
    assert tinydiff.load(str(tmp_path / "ar.gguf")).config.num_hidden_layers == 6


def test_version():
    status, out, _ = run("--version")
    assert status == 0 and out.strip() == f"tinydiff {tinydiff.__version__}"


# -- the prompt, the seed, the output ------------------------------------------------------------

def test_seed_minus_one_is_a_fresh_seed_and_below_is_refused():
    status, out, _ = run("generate", "-m", MODEL, "-p", "Once", "-n", "4", "-s", "-1")
    assert status == 0 and out.startswith("Once")
    assert_one_line_error(*run("generate", "-m", MODEL, "-p", "Once", "-s", "-2")[::2], 2, "-s/--seed")


def test_a_full_disk_is_one_line_and_status_1():
    with open("/dev/full", "wb") as full:
        import subprocess
        import sys
        p = subprocess.run([sys.executable, "-m", "tinydiff", "generate", "-m", MODEL, "-p", "Once", "-n", "4"],
                           stdout=full, stderr=subprocess.PIPE, cwd=os.path.dirname(__file__), timeout=120)
    assert_one_line_error(p.returncode, p.stderr.decode(), 1, "No space left on device")


# -- a flag of the other mode --------------------------------------------------------------------

@pytest.mark.parametrize("flags, word", [
    (["--truncate"], "--truncate"), (["--min-p", "0.1"], "--min-p"),
])
def test_autoregressive_flags_are_refused_in_diffusion(llada_dir, flags, word):  # noqa: F811
    status, out, err = run("generate", "-m", llada_dir, "-p", "Once", "-n", "4", *flags)
    assert_one_line_error(status, err, 2, word, "masked diffusion")
    assert out == ""                                            # refused before the prompt is echoed


@pytest.mark.parametrize("flags, word", [
    (["--steps", "2"], "--steps"), (["--cache", "dual"], "--cache"), (["--cache", "none"], "--cache"),
    (["--visual"], "--visual"), (["--block", "2"], "--block"), (["--remask", "margin"], "--remask"),
])
def test_diffusion_flags_are_refused_in_autoregressive_mode(flags, word):
    status, out, err = run("generate", "-m", MODEL, "-p", "Once", "-n", "4", *flags)
    assert_one_line_error(status, err, 2, word, "autoregressive")
    assert out == ""


def test_stop_strings_cut_a_diffusion_completion(llada_dir):  # noqa: F811
    model = tinydiff.load(llada_dir)
    full = model.denoise("Once upon a time", 12, steps=6, block_length=4)
    stop = full.strip()[len(full.strip()) // 2:][:2]          # two characters from its second half
    status, out, _ = run("generate", "-m", llada_dir, "-p", "Once upon a time", "-n", "12", "--steps", "6",
                         "--block", "4", "--no-display-prompt", "--stop", stop)
    assert status == 0 and out == full[:full.index(stop)] + "\n"


def test_diffusion_on_an_autoregressive_model_names_its_mode():
    for argv in (["generate", "--mode", "diffusion", "-p", "Once"], ["infill", "-p", "The [MASK] sat."]):
        status, out, err = run(*argv, "-m", "stories5m-ar")
        assert_one_line_error(status, err, 2, "autoregressive model")
        assert out == ""
    with pytest.raises(UsageError, match="autoregressive model"):
        tinydiff.load("stories5m-ar").denoise("Once", 8)


# -- measuring: a bad path fails first, the defaults fit the model --------------------------------

def test_cost_refuses_a_plot_it_cannot_write_before_measuring(tmp_path):
    for bad, word in ((tmp_path / "x.pdf", ".svg or .png"), (tmp_path / "no" / "x.svg", "cannot write")):
        status, out, err = run("cost", "-m", MODEL, "-n", "2", "--plot", str(bad))
        assert_one_line_error(status, err, 2, word)
        assert out == ""                                        # no table: nothing was measured


def test_bench_refuses_a_missing_model_before_its_header():
    status, out, err = run("bench", "-m", "/nonexistent/model", "-r", "1", "--no-roofline")
    assert_one_line_error(status, err, 1, "/nonexistent/model")
    assert out == ""


def test_bench_defaults_fit_a_short_context():
    status, out, err = run("bench", "-m", MODEL, "-r", "1", "--no-roofline", "-t", "1")   # context 256
    assert status == 0, err
    assert [row.split("|")[4].strip() for row in out.splitlines()[2:5]] == ["pp255", "tg128", "dd255x4"]


# -- the API: every mistake one UsageError line --------------------------------------------------

@pytest.fixture(scope="module")
def model():
    return tinydiff.load(MODEL)


@pytest.mark.parametrize("call, words", [
    (lambda m: m.generate("Once", 4, seed=1.5), "seed"),
    (lambda m: m.generate("Once", 4, seed=-1), "seed"),
    (lambda m: m.generate("Once", 4, top_k=1.5), "top_k"),
    (lambda m: m.generate("Once", 4, temperature="hot"), "temperature"),
    (lambda m: m.generate("Once", 1.5), "integer"),
    (lambda m: m.generate("Once", 4, tempreature=0.5), "unknown sampling option 'tempreature'"),
    (lambda m: m.generate_ids([1, 2], 4, top_p=0), "top_p"),
    (lambda m: m.logits([2 ** 64]), "integers"),
    (lambda m: m.logits([2 ** 63]), "outside the vocabulary"),
    (lambda m: m.logits("hello"), "string"),
    (lambda m: m.logits(None), "NoneType"),
    (lambda m: m.logits(np.ones((2, 3), np.int64)), "flat"),
    (lambda m: m.logits([1.5]), "integers"),
    (lambda m: m.logits([]), "empty"),
    (lambda m: m.logits([1, 2], mask="x"), "AttentionMask"),
    (lambda m: tinydiff.load(5), "int"),
])
def test_api_mistakes_are_one_usage_error_line(model, call, words):
    with pytest.raises(UsageError, match=words) as e:
        call(model)
    assert "\n" not in str(e.value)


def test_denoise_mistakes_are_usage_errors_before_anything_is_allocated(llada_dir):  # noqa: F811
    mdm = tinydiff.load(llada_dir)
    for kwargs, words in ((dict(gen_length=10 ** 9), "exceeds the context"), (dict(gen_length=1.5), "gen_length"),
                          (dict(gen_length=8, steps_=2), "unknown denoising option 'steps_'"),
                          (dict(gen_length=8, cache="none"), "cache must be one of")):
        with pytest.raises(UsageError, match=words):
            mdm.denoise_ids([4, 5, 6], **kwargs)


def test_a_ledger_is_entered_and_left_once():
    led = Ledger()
    with led:
        with pytest.raises(UsageError, match="already open"):
            led.__enter__()
    with pytest.raises(UsageError, match="not open"):
        led.__exit__(None, None, None)


# -- found by reading the refactor (issue 11's review) ----------------------------------------

def test_cost_takes_every_denoising_flag_and_none_is_the_default_spread():
    status, out, err = run("cost", "-m", MODEL, "-n", "8", "-t", "1", "--eos", "keep", "--steps", "4")
    assert status == 0, err
    assert "diffusion steps=4 eos=keep" in out
    status, out, err = run("cost", "-m", MODEL, "-n", "8", "-t", "1", "--cache", "none")
    assert status == 0, err
    assert "diffusion steps=8" in out and "diffusion steps=2" in out      # the spread, as without the flag


@pytest.mark.parametrize("bad", [2.0, True, None, "x", 10 ** 6, 0])
def test_a_models_thread_count_is_checked_as_load_checks_it(model, bad):
    with pytest.raises(UsageError, match="threads"):
        model.pool.threads = bad


def test_masks_are_checked_where_they_enter(model):
    with pytest.raises(UsageError, match="AttentionMask"):
        model.logits([1, 2], mask=None)
    with pytest.raises(ValueError, match="AttentionMask"):
        tinydiff.cost.forward(model.config, 16, 0, True)


def test_the_public_modules_import_by_their_old_names():
    import tinydiff.cost
    from tinydiff.masks import BIDIRECTIONAL
    assert tinydiff.cost.forward(tinydiff.load(MODEL).config, 4, 0, BIDIRECTIONAL)["flops"] > 0


def test_model_of_takes_a_transformer(model):
    assert tinydiff.Model.of(model, model.tokenizer).generate("Once", 4, temperature=0) == \
        model.generate("Once", 4, temperature=0)
    for bad in (None, "x"):
        with pytest.raises(UsageError, match="Model.of takes a Transformer"):
            tinydiff.Model.of(bad)


def test_stop_is_a_string_or_a_list_of_them(model):
    full = model.generate("Once upon a time", 12, temperature=0)
    stop = full[len(full) // 2:][:2]
    assert model.generate("Once upon a time", 12, temperature=0, stop=stop) == full[:full.index(stop)]
    with pytest.raises(UsageError, match="stop must be"):
        model.generate("Once", 4, stop=5)


def test_a_row_with_no_finite_logit_is_a_model_error():
    from tinydiff.decoding.sampling import Sampler, SamplingParams
    from tinydiff.errors import ModelError
    for row in (np.full(5, -np.inf, np.float32), np.array([1.0, np.nan, 2.0], np.float32)):
        for temperature in (0.0, 1.0):
            with pytest.raises(ModelError, match="NaN or -inf"):
                Sampler(SamplingParams(temperature=temperature, seed=1, top_p=0.9))(row, [])


def test_the_tokenizer_refuses_what_is_not_text_or_its_ids(model):
    tok = model.tokenizer
    for call, words in ((lambda: tok.decode([1.5]), "1.5"),
                        (lambda: tok.decode([tok.vocab_size + 5]), "not a token id"),
                        (lambda: tok.decode([-1]), "not a token id"), (lambda: tok.encode(None), "NoneType")):
        with pytest.raises(UsageError, match=words):
            call()
    assert tok.text([tok.vocab_size + 5]) == ""                # a model's padded id: skipped, as tokenizers does


def test_a_cache_without_blocks_skips_the_prompt_after_the_first_step(llada_dir):  # noqa: F811
    """--cache dual (or prefix) with one block is not a no-op: later steps leave the prompt cached."""
    mdm = tinydiff.load(llada_dir)
    prompt = mdm.encode_prompt("Once upon a time")
    P, L = len(prompt), len(prompt) + 8
    for cache in ("dual", "prefix"):
        spans = [s.span for s in list(mdm.denoise_steps(prompt, 8, steps=4, cache=cache))[:-1]]
        assert spans == [(0, L), (P, L), (P, L), (P, L)]


# -- tinydiff compare (issue 13) ------------------------------------------------------------------

def test_compare_runs_the_three_shipped_models_and_draws_the_tradeoff(tmp_path):
    import xml.dom.minidom
    plot = tmp_path / "tradeoff.svg"
    status, out, err = run("compare", "-n", "8", "--samples", "2", "-t", "1", "--plot", str(plot))
    assert status == 0, err
    rows = [line for line in out.splitlines() if line.startswith(("autoregressive", "masked", "block"))]
    assert [r.split("  ")[0] for r in rows] == [
        "autoregressive", "masked diffusion, 1 token a step", "masked diffusion, 2 tokens a step",
        "block diffusion, 1 token a step", "block diffusion, 2 tokens a step", "block diffusion, 4 tokens a step"]
    passes_per_token = [float(r.split()[-9]) for r in rows]
    assert passes_per_token[0] == 1.0 and passes_per_token[2] == 0.5        # AR one a token; MDM two a step
    assert all(0 <= float(r.split()[-1]) < 1 for r in rows)                 # rep4, a share
    assert len(xml.dom.minidom.parse(str(plot)).getElementsByTagName("circle")) == 6


def test_compare_adds_a_threshold_row_for_each_diffusion_model():
    status, out, err = run("compare", "--bd", "none", "-n", "16", "--samples", "2", "-t", "1", "--threshold", "0.1",
                           "--gap", "4")
    assert status == 0, err
    rows = [line for line in out.splitlines() if line.startswith(("autoregressive", "masked"))]
    assert rows[-1].startswith("masked diffusion, threshold 0.1, gap 4 ")
    assert float(rows[-1].split()[-9]) <= 1.0                               # at most one pass a token
    for argv, words in ((["--gap", "2"], "--gap 2"), (["--threshold", "0"], "--threshold"),
                        (["--repeat-penalty", "0"], "--repeat-penalty")):
        status, out, err = run("compare", "-n", "8", "--samples", "1", *argv)
        assert_one_line_error(status, err, 2, words)


def test_compare_refuses_a_model_of_the_wrong_kind_before_measuring(tmp_path):
    status, out, err = run("compare", "--bd", "stories5m-mdm", "-n", "8", "--samples", "1")
    assert_one_line_error(status, err, 2, "stories5m-mdm", "block-diffusion")
    assert out == ""
    status, out, err = run("compare", "-n", "8", "--plot", str(tmp_path / "x.pdf"))
    assert_one_line_error(status, err, 2, ".svg or .png")
