"""`tinydiff perplexity`: llama-perplexity's protocol, checked by hand on tiny cases, pinned to
transformers on the fixtures, and its bad input.

Against transformers two ways: the numbers tests/fixtures/make_perplexity_reference.py stored in
fixtures/perplexity/reference.json (computed with transformers; always run), and, where torch and
transformers are importable, the same script's reference() run live on the same cases.
"""
import importlib.util
import json
import math
import pathlib
import re

import numpy as np
import pytest

import tinydiff
from tinydiff.cli import main
from tinydiff.errors import UsageError
from tinydiff.measure import perplexity as ppl

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
HF = FIXTURES / "hf"
TEXT = FIXTURES / "perplexity" / "text.txt"
STORED = json.loads((FIXTURES / "perplexity" / "reference.json").read_text())
CASES = STORED["cases"]


def _maker():
    spec = importlib.util.spec_from_file_location("make_perplexity_reference",
                                                  FIXTURES / "make_perplexity_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKER = _maker()          # imports no torch until reference() is called


def folder(case, tmp_path):
    return MAKER.case_folder(case["model"], case["bos"], tmp_path)


def cli(capsys, *argv):
    """Runs `tinydiff perplexity ARGV`: (the running estimates, PPL, its error, stdout) as printed."""
    assert main(["perplexity", *map(str, argv)]) == 0
    out = capsys.readouterr().out
    running = [float(v) for v in re.findall(r"\[\d+\]([0-9.]+),", out)]
    final = re.search(r"^Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)$", out, re.M)
    return running, float(final[1]), float(final[2]), out


def figures(model, text, n_ctx, chunks, batch=None):
    """(running estimates, PPL, error) at full precision, through the module as the command runs it."""
    tok = model.tokenizer
    c = ppl.make_chunks(ppl.tokenize(tok, text), n_ctx, chunks, tok.bos_id if ppl.adds_bos(tok) else None, "text")
    nll, running = np.empty(0), []
    for chunk in ppl.chunk_nll(model, c, batch or n_ctx):
        nll = np.concatenate([nll, chunk])
        running.append(ppl.estimate(nll)[0])
    return running, *ppl.estimate(nll)


def the_text():
    text = TEXT.read_text(encoding="utf-8")
    return text[:-1] if text.endswith("\n") else text


# -- the rule, by hand -------------------------------------------------------------------------

def test_chunks_by_hand():
    tokens = list(range(100, 120))                      # 20 tokens, n_ctx 8: two whole chunks, 4 left over
    c = ppl.make_chunks(tokens, 8, -1, None, "text")
    assert c.ids.tolist() == [list(range(100, 108)), list(range(108, 116))]
    # first = 4: the logits at positions 4, 5, 6 predict the tokens at 5, 6, 7
    assert c.targets.tolist() == [[105, 106, 107], [113, 114, 115]]
    assert not c.bos and c.tokens == 20
    b = ppl.make_chunks(tokens, 8, 1, 7, "text")        # one chunk asked for; BOS 7 replaces its first token
    assert b.ids.tolist() == [[7, 101, 102, 103, 104, 105, 106, 107]] and b.targets.tolist() == [[105, 106, 107]]
    assert ppl.make_chunks(tokens, 9, 5, 7, "text").targets.tolist() == [[105, 106, 107, 108], [114, 115, 116, 117]]


def test_the_whole_text_is_tokenized_once_with_bos_first_where_the_vocabulary_adds_it(tmp_path):
    plain = tinydiff.load(HF / "llama-gqa").tokenizer
    bos = tinydiff.load(MAKER.with_bos(HF / "llama-gqa", tmp_path / "bos")).tokenizer
    assert not ppl.adds_bos(plain) and ppl.adds_bos(bos) and bos.bos_id == 1
    text = the_text()
    assert ppl.tokenize(plain, text) == plain.encode(text)
    assert ppl.tokenize(bos, text) == [1] + plain.encode(text)


def test_a_text_shorter_than_two_chunks_is_refused_with_its_token_count():
    with pytest.raises(UsageError, match=r"-f story.txt tokenizes to only 15 tokens; .* of 8 needs at least 16"):
        ppl.make_chunks(list(range(15)), 8, -1, None, "-f story.txt")
    assert len(ppl.make_chunks(list(range(16)), 8, -1, None, "x").ids) == 2


def test_estimate_is_llama_cpps_formula():
    nll = np.array([1.0, 2.0, 3.0, 4.0])
    value, se = ppl.estimate(nll)
    assert value == pytest.approx(math.exp(2.5))
    assert se == pytest.approx(math.exp(2.5) * math.sqrt((30 / 4 - 2.5 ** 2) / 3))


@pytest.mark.parametrize("batch", [8, 3, 5, 16, 24])
def test_the_scored_rows_are_the_full_pass_rows_of_the_second_half_however_batched(batch):
    model = tinydiff.load(HF / "llama-gqa")
    tokens = model.tokenizer.encode(the_text())
    c = ppl.make_chunks(tokens, 8, 7, 1, "text")
    got = list(ppl.chunk_logits(model, c, batch))           # batch 16, 24: two or three chunks a pass
    assert len(got) == 7
    for ids, logits in zip(c.ids, got):
        full = model.logits(ids)                            # [8, V]: each chunk alone, one pass
        np.testing.assert_allclose(logits, full[4:7], atol=1e-4 * np.abs(full).max())


# -- against transformers ----------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['model']}-c{c['n_ctx']}{'-bos' if c['bos'] else ''}")
def test_matches_the_numbers_transformers_gave(case, tmp_path, capsys):
    path = folder(case, tmp_path)
    running, value, se = figures(tinydiff.load(path), the_text(), case["n_ctx"], case["chunks_flag"])
    assert len(running) == case["chunks"]
    np.testing.assert_allclose(running, case["running"], rtol=1e-5)
    assert value == pytest.approx(case["ppl"], rel=1e-5) and se == pytest.approx(case["se"], rel=1e-4)
    # and the command prints them so, one decimal place as llama.cpp's %.4f / %.5f
    printed, p, e, _ = cli(capsys, "-m", path, "-f", TEXT, "-c", case["n_ctx"],
                           "--chunks", case["chunks_flag"], "-b", 2 * case["n_ctx"])
    np.testing.assert_allclose(printed, case["running"], atol=6e-5, rtol=1e-6)
    assert abs(p - case["ppl"]) <= 6e-5 + 1e-6 * p and abs(e - case["se"]) <= 6e-6 + 1e-5 * e


def _has_transformers():
    return all(importlib.util.find_spec(m) for m in ("torch", "transformers", "tokenizers"))


@pytest.mark.skipif(not _has_transformers(), reason="torch / transformers not installed: the stored numbers "
                                                    "test stands in (test_matches_the_numbers_transformers_gave)")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['model']}-c{c['n_ctx']}{'-bos' if c['bos'] else ''}")
def test_matches_transformers_run_now(case, tmp_path):
    path = folder(case, tmp_path)
    live = MAKER.reference(path, case["n_ctx"], case["chunks_flag"])
    running, value, se = figures(tinydiff.load(path), the_text(), case["n_ctx"], case["chunks_flag"])
    assert live["tokens"] == case["tokens"] and live["chunks"] == len(running)
    np.testing.assert_allclose(running, live["running"], rtol=1e-5)
    assert value == pytest.approx(live["ppl"], rel=1e-5) and se == pytest.approx(live["se"], rel=1e-4)


# -- KL against a reference model ----------------------------------------------------------------

def test_kl_rows_by_hand():
    rng = np.random.default_rng(0)
    logits, ref = rng.normal(size=(5, 11)).astype(np.float32), rng.normal(size=(5, 11)).astype(np.float32)
    ref[2] = logits[2]                                      # one row where the two agree exactly
    targets = np.array([0, 3, 10, 4, 4])
    nll, ref_nll, kld, dp, same = ppl.kl_rows(logits, ref, targets)
    for r in range(5):
        p = np.exp(ref[r].astype(float)) / np.exp(ref[r].astype(float)).sum()      # reference
        q = np.exp(logits[r].astype(float)) / np.exp(logits[r].astype(float)).sum()
        assert kld[r] == pytest.approx(float((p * np.log(p / q)).sum()), abs=1e-12)
        assert nll[r] == pytest.approx(-math.log(q[targets[r]]))
        assert ref_nll[r] == pytest.approx(-math.log(p[targets[r]]))
        assert dp[r] == pytest.approx(q[targets[r]] - p[targets[r]])
        assert same[r] == (q.argmax() == p.argmax())
    assert kld[2] == pytest.approx(0, abs=1e-15) and same[2]


def test_kl_against_itself_is_zero_and_the_tops_always_agree(capsys):
    m = str(HF / "llama-gqa")
    assert main(["perplexity", "-m", m, "-f", str(TEXT), "-c", "64", "--kl-against", m]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^Mean    KLD:   0\.000000 ±", out, re.M)
    assert re.search(r"^Same top p: 100\.000 ±", out, re.M)
    ppl_q = float(re.search(r"^Mean PPL\(Q\) +: +([0-9.]+)", out, re.M)[1])
    ppl_base = float(re.search(r"^Mean PPL\(base\) +: +([0-9.]+)", out, re.M)[1])
    assert ppl_q == ppl_base == pytest.approx(CASES[0]["ppl"], rel=1e-5)     # the c64 case: all 12 chunks
    assert len(re.findall(r"^ +\d+ +[0-9.]+ ±", out, re.M)) == 12                # a table row a chunk


def test_kl_against_another_model_matches_the_logits_of_both(capsys):
    """bf16 against f32: the same random init, so a small but real KL; the mean is the one the two
    models' full passes give chunk by chunk."""
    model, ref = tinydiff.load(HF / "llama-bf16"), tinydiff.load(HF / "llama-gqa")
    c = ppl.make_chunks(ppl.tokenize(model.tokenizer, the_text()), 32, 4, None, "text")
    expected = []
    for ids, targets in zip(c.ids, c.targets):
        lp = ppl.log_probs(model.logits(ids)[16:31])
        lq = ppl.log_probs(ref.logits(ids)[16:31])
        expected.append((np.exp(lq) * (lq - lp)).sum(axis=1))
    expected = np.concatenate(expected)
    assert main(["perplexity", "-m", str(HF / "llama-bf16"), "-f", str(TEXT), "-c", "32", "--chunks", "4",
                 "--kl-against", str(HF / "llama-gqa")]) == 0
    out = capsys.readouterr().out
    kl = float(re.search(r"^Mean    KLD: +([0-9.]+) ±", out, re.M)[1])
    assert expected.mean() > 1e-3 and kl == pytest.approx(expected.mean(), abs=2e-6)


# -- bad input --------------------------------------------------------------------------------

def error(capsys, *argv):
    status = main(["perplexity", *map(str, argv)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return status, lines[0]


@pytest.mark.parametrize("argv, words", [
    (["-f", "/nonexistent/story.txt"], ["-f /nonexistent/story.txt: no such file"]),
    (["-c", "1024"], ["-c 1024 is more than the 256 positions"]),
    (["-c", "3"], ["-c 3", "at least 4"]),
    (["--chunks", "0"], ["--chunks 0"]),
    (["-c", "64", "-b", "100"], ["-b 100", "multiple"]),
    (["-c", "512"], ["more than the 256 positions"]),
    (["--kl-divergence-base", "base.dat"], ["--kl-divergence-base", "--kl-against REF"]),
    (["--kl-divergence"], ["--kl-divergence", "--kl-against REF"]),
    (["--save-all-logits", "base.dat", "-c", "64"], ["--save-all-logits", "--kl-against REF"]),
    (["-c", "64", "--kl-against", "stories5m-ar"], ["--kl-against", "2048 tokens", "320"]),
    (["-c", "64", "--kl-against", "stories5m-mdm"], ["--kl-against", "causal", "masked-diffusion"]),
    (["-c", "64", "--kl-against", "/nonexistent/ref"], ["/nonexistent/ref"]),
])
def test_usage_errors(capsys, argv, words):
    argv = ["-m", HF / "llama-gqa", "-f", TEXT, *argv] if "-f" not in argv else ["-m", HF / "llama-gqa", *argv]
    status, line = error(capsys, *argv)
    assert status in (1, 2)
    for w in words:
        assert w in line, line


def test_a_text_too_short_names_the_file_and_its_tokens(capsys, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Once upon a time there was a cat.\n")
    status, line = error(capsys, "-m", HF / "llama-gqa", "-f", short, "-c", "64")
    n = len(tinydiff.load(HF / "llama-gqa").tokenizer.encode("Once upon a time there was a cat."))
    assert status == 2 and f"-f {short} tokenizes to only {n} tokens" in line and "at least 128" in line


def test_a_file_that_is_not_utf8_or_is_a_folder(capsys, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"Once upon a time \xff\xfe")
    assert error(capsys, "-m", HF / "llama-gqa", "-f", bad) == (2, f"tinydiff: error: -f {bad}: not UTF-8 text "
                                                                    "(byte 17)")
    assert error(capsys, "-m", HF / "llama-gqa", "-f", tmp_path)[1].endswith("is a folder, not a text file")


def test_a_diffusion_model_is_refused_in_one_line(capsys):
    status, line = error(capsys, "-m", "stories5m-mdm", "-f", TEXT)
    assert status == 2 and "perplexity is for causal (autoregressive) models" in line


def test_one_trailing_newline_is_dropped_as_llama_cpp_does(tmp_path, capsys):
    text = the_text()
    one, none = tmp_path / "one.txt", tmp_path / "none.txt"
    one.write_text(text + "\n\n")                          # llama.cpp drops the last of these two
    none.write_text(text + "\n")
    model = tinydiff.load(HF / "llama-gqa")
    assert model.tokenizer.encode(text + "\n") != model.tokenizer.encode(text)
    for path, kept in ((one, text + "\n"), (none, text)):
        _, value, _, _ = cli(capsys, "-m", HF / "llama-gqa", "-f", path, "-c", "16")
        assert value == pytest.approx(figures(model, kept, 16, -1)[1], abs=6e-5)


# -- the real files, against llama.cpp's figures ------------------------------------------------

def shared_text():
    """../shared/data's TinyStories text (beside the checkout in CI), else /work/shared's."""
    for root in (pathlib.Path(__file__).parents[2] / "shared", pathlib.Path("/work/shared")):
        path = root / "data" / "tinystories" / "v1-valid-prefix.txt"
        if path.exists():
            return path
    pytest.skip("the shared TinyStories text (shared/data/tinystories/v1-valid-prefix.txt) is not here")


# llama-perplexity -m FILE -f v1-valid-prefix.txt -c 512 --chunks 4 -t 2 (llama.cpp 0c1e57098, the Xeon)
LLAMA_CPP_PPL = {"SmolLM2-135M-Instruct.Q4_1.gguf": 6.6413, "gemma-3-270m-q4_k_m.gguf": 6.5239}


@pytest.mark.parametrize("name", sorted(LLAMA_CPP_PPL))
def test_real_files_within_half_a_percent_of_llama_perplexity(name, capsys):
    from real_models import real_model
    path, text = real_model(name), shared_text()
    try:
        tinydiff.load(path)
    except tinydiff.ModelError as e:
        if "not supported" not in str(e):
            raise
        pytest.skip(f"{name} does not load yet: {e}")
    _, value, _, _ = cli(capsys, "-m", path, "-f", text, "-c", 512, "--chunks", 4)
    assert value == pytest.approx(LLAMA_CPP_PPL[name], rel=0.005)



def test_special_token_text_in_the_file_is_read_as_text_as_llama_cpp_reads_it():
    """llama.cpp tokenizes the file with parse_special false: <|endoftext|> there is its
    characters, not the token (test_sentencepiece pins the switch to llama-tokenize's ids)."""
    tok = tinydiff.load(HF / "llama-gqa").tokenizer
    text = the_text().replace("\n\n", "<|endoftext|>")
    assert text.count("<|endoftext|>") > 0
    tokens = ppl.tokenize(tok, text)
    assert 0 not in tokens and tokens == tok.encode(text, add_special_tokens=False, split_special_tokens=True)
    assert tokens != tok.encode(text, add_special_tokens=False)
