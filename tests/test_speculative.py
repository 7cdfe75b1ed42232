"""Speculative decoding (decoding/speculative.py): the same tokens as plain decoding, fewer passes, booked honestly.

Exactness needs each row of a k+1-row verify pass to be computed as a 1-row pass computes it: the f32
kernels do so up to 15 rows (the GEMM starts at 16), so the f32 fixtures run with draft_max <= 8 and
their sampled output is compared token for token with plain sampling at the same seed. The shipped
models are bf16 (a GEMM from 4 rows: logits equal to the last bits only), so there the test is greedy.
"""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import tinydiff
from tinydiff.cli import main
from tinydiff.decoding.generate import Timings
from tinydiff.decoding.sampling import SamplingParams, distribution, penalize
from tinydiff.decoding.speculative import NgramDrafter
from tinydiff.engine import cost
from tinydiff.engine.masks import CAUSAL

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
REPETITIVE = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]       # prompt lookup finds drafts here
PLAIN = [40, 41, 3, 100]


def speculate(model, ids, n, draft, draft_max=8, **sampling):
    """(the new ids, the run's speculative.Counts)."""
    timings = Timings()
    out = list(model.generate_tokens(ids, n, draft=draft, draft_max=draft_max, timings=timings, **sampling))
    return out, timings.speculation


def test_prompt_lookup_drafts_what_followed_the_latest_longest_match():
    d = NgramDrafter(ngram_max=3, ngram_min=1)
    assert d.draft([1, 2, 3, 4, 9, 2, 3, 5, 7, 2, 3], 2) == [5, 7]        # "2 3" last seen before 5 7
    assert d.draft([1, 2, 3, 4, 9, 1, 2, 3], 4) == [4, 9, 1, 2]          # the 3-gram beats the later "3"
    assert d.draft([1, 2, 3], 4) == [] and d.draft([4], 4) == []         # no earlier occurrence
    assert d.draft([7, 7, 7], 3) == [7]                                   # the tokens that exist after it
    assert NgramDrafter(3, 2).draft([1, 2, 3, 4, 9, 2, 8, 3], 4) == []    # a 1-token match drafts nothing


def _lookup_by_definition(h, k, lo, hi):
    """Prompt lookup as its definition reads: for n = hi..lo, the latest earlier n-gram equal to the last n."""
    for n in range(min(hi, len(h) - 1), lo - 1, -1):
        hits = [i for i in range(len(h) - n) if h[i:i + n] == h[len(h) - n:]]
        if hits:
            return h[hits[-1] + n:hits[-1] + n + k]
    return []


def test_prompt_lookup_equals_its_definition_on_random_histories():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        h = rng.integers(0, int(rng.integers(2, 6)), int(rng.integers(1, 40))).tolist()
        lo = int(rng.integers(1, 4))
        hi = lo + int(rng.integers(0, 3))
        k = int(rng.integers(1, 6))
        assert NgramDrafter(hi, lo).draft(h, k) == _lookup_by_definition(h, k, lo, hi), (h, k, lo, hi)


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-bias", "llama3-rope", "mistral"])
def test_greedy_and_sampled_output_equal_plain_decoding_token_for_token(name):
    model = tinydiff.load(os.path.join(HF, name))
    drafter = tinydiff.load(os.path.join(HF, "llama-tied-headdim"))      # same vocabulary, other weights
    runs = [dict(temperature=0), dict(temperature=0.9, top_k=0, seed=3),
            dict(temperature=1.3, top_k=20, top_p=0.9, min_p=0.02, repeat_penalty=1.3, repeat_last_n=6, seed=5)]
    drafted = accepted = 0
    for sampling in runs:
        for ids in (REPETITIVE, PLAIN):
            plain = model.generate_ids(ids, 40, **sampling)
            for draft in ("ngram", drafter, model):
                out, counts = speculate(model, ids, 40, draft, **sampling)
                assert out == plain, (draft, sampling, ids)
                drafted, accepted = drafted + counts.drafted, accepted + counts.accepted
    assert 0 < accepted < drafted                                         # drafts taken and drafts refused


@pytest.mark.parametrize("draft", ["ngram", "stories5m-bd", "stories5m-ar"])
def test_the_shipped_models_greedy_output_is_plain_greedy_decodings(draft):
    ar = tinydiff.load("stories5m-ar")
    ids = ar.encode_prompt("Lily had a red ball. Lily had a red ball. Lily had a red ball. Lily had a")
    for prompt in (ids, ar.encode_prompt("The dog ran")):
        plain = ar.generate_ids(prompt, 80, temperature=0)
        out, counts = speculate(ar, prompt, 80, draft, temperature=0)
        assert out == plain
    assert counts.drafted > 0 and counts.rounds < 80


def test_a_block_diffusion_drafter_proposes_blocks_and_some_are_taken():
    ar = tinydiff.load("stories5m-ar")
    ids = ar.encode_prompt("Once upon a time, there was a little girl named Lily.")
    out, counts = speculate(ar, ids, 60, "stories5m-bd", temperature=0)
    assert out == ar.generate_ids(ids, 60, temperature=0)
    assert 2 * (counts.rounds - 1) <= counts.draft_passes <= 2 * counts.rounds   # a catch-up and a block pass a round
    assert 0 < counts.accepted < counts.drafted and counts.emitted == len(out) - 1


def _wilson_hilferty_z(chi2, df):
    """The chi-square statistic as a standard normal z (Wilson-Hilferty): p < 1e-4 is z > 3.719."""
    return ((chi2 / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))


def _chi2(counts, probs):
    """(statistic, degrees of freedom) of observed counts against probs, cells expected < 5 pooled."""
    n = sum(counts.values())
    small = [c for c in probs if probs[c] * n < 5]
    obs = [counts.get(c, 0) for c in probs if c not in small] + [sum(counts.get(c, 0) for c in small)]
    exp = [probs[c] * n for c in probs if c not in small] + [sum(probs[c] for c in small) * n]
    pairs = [(o, e) for o, e in zip(obs, exp) if e > 0]
    assert sum(counts.get(c, 0) for c in counts if c not in probs) == 0   # nothing outside the support
    return sum((o - e) ** 2 / e for o, e in pairs), len(pairs) - 1


def _exact_joint(model, prompt, params, n=3):
    """{(t1, .., tn): probability} of plain sampling's first n tokens, from the model's logits."""
    joint = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for seq, pr in joint.items():
            z = model.logits(prompt + list(seq))[-1]
            p = distribution(penalize(z, prompt + list(seq), params.repeat_penalty, params.repeat_last_n), params)
            for t in np.flatnonzero(p):
                nxt[seq + (int(t),)] = pr * p[t]
        joint = nxt
    return joint


def test_sampled_speculation_draws_from_plain_samplings_distribution():
    """The joint distribution of the first three tokens (the second and third from verify rounds)
    over 3000 seeds, against the exact one from the logits: chi-square, threshold p < 1e-4 (z > 3.719),
    so a correct sampler fails for about 1 seed set in 10,000 (these seeds give z = -0.57); the seeds
    are fixed, so the test is deterministic. The same statistic refuses the distribution at
    temperature 0.7 (z = 13.6; the same support: top-k 4 chooses before the temperature): it can tell."""
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    prompt = [5, 6, 7, 5, 6]
    params = dict(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0, repeat_penalty=1.5, repeat_last_n=64)
    spec = model.speculator(model, 2)                                    # its own argmax: taken with p(argmax)
    counts, drafted, accepted = {}, 0, 0
    for seed in range(3000):
        out, c = speculate(model, prompt, 3, spec, seed=seed, **params)
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
        drafted, accepted = drafted + c.drafted, accepted + c.accepted
    assert 0.1 * drafted < accepted < 0.9 * drafted                      # both branches of the rule ran
    exact = _exact_joint(model, prompt, SamplingParams(**params))
    assert _wilson_hilferty_z(*_chi2(counts, exact)) < 3.719
    wrong = _exact_joint(model, prompt, SamplingParams(**{**params, "temperature": 0.7}))
    assert _wilson_hilferty_z(*_chi2(counts, wrong)) > 3.719


def test_the_ledger_books_a_verify_pass_as_k_plus_one_rows_and_counts_the_drafts():
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    drafter = tinydiff.load(os.path.join(HF, "llama-tied-headdim"))
    with tinydiff.Ledger() as led:
        out, counts = speculate(model, REPETITIVE, 30, drafter, draft_max=4, temperature=0)
    verify = [p for p in led.passes if p.get("role") == "verify"]
    draft = [p for p in led.passes if p.get("role") == "draft"]
    assert len(verify) == counts.rounds and len(draft) == counts.draft_passes > 0
    assert led.speculative == {"rounds": counts.rounds, "drafted": counts.drafted, "accepted": counts.accepted}
    pos = len(REPETITIVE)                                                # the first verify pass: token 1 at pos - 1 + 1
    first = {k: v for k, v in verify[0].items() if k != "role"}
    assert first == cost.forward(model.config, first["tokens"], pos, CAUSAL, all_logits=True)
    assert sum(p["tokens"] for p in verify) == counts.rounds + counts.drafted   # the newest token + its drafts
    assert "speculative:" in led.table() and f"{counts.drafted - counts.accepted} rejected" in led.table()


def test_generate_with_a_draft_prints_the_same_text_and_its_counts(capsys):
    args = ["generate", "-m", os.path.join(HF, "llama-gqa"), "-p", "a b a b a b", "-n", "24", "--temp", "0"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--draft", "ngram", "--draft-max", "6", "--stats"]) == 0
    out = capsys.readouterr()
    assert out.out == plain
    assert "verify passes" in out.err and "tokens per verify pass" in out.err


@pytest.mark.parametrize("argv, words", [
    (["--draft", "ngram", "--draft-max", "0"], ["--draft-max", "1..255", "got 0"]),
    (["--draft", "ngram", "--draft-max", "256"], ["--draft-max", "got 256"]),
    (["--draft", "/no/such/model"], ["--draft /no/such/model", "no such"]),
    (["--draft", "stories5m-ar"], ["vocabulary", "stories5m-ar", "llama-gqa"]),
    (["--draft-max", "4"], ["--draft-max", "--draft"]),
    (["--draft", "ngram", "--draft-ngram-min", "0"], ["--draft-ngram-min", "got 0"]),
    (["--draft", "ngram", "--draft-ngram-min", "5"], ["min <= max", "got 5 and 4"]),
    (["--draft", "stories5m-ar", "--draft-ngram-max", "2"], ["--draft-ngram-max", "--draft ngram"]),
])
def test_bad_draft_flags_are_one_line_usage_errors(capsys, argv, words):
    assert main(["generate", "-m", os.path.join(HF, "llama-gqa"), "-p", "a b", "-n", "4"] + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err


def test_a_draft_for_a_diffusion_model_is_a_one_line_usage_error(capsys):
    assert main(["generate", "-m", "stories5m-mdm", "-p", "a", "-n", "4", "--draft", "ngram"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--draft" in err[0] and "diffusion" in err[0]
    with pytest.raises(tinydiff.UsageError, match="autoregressive"):
        tinydiff.load("stories5m-mdm").speculator("ngram")


def test_the_cli_errors_print_no_traceback():
    p = subprocess.run([sys.executable, "-m", "tinydiff", "generate", "-m", os.path.join(HF, "llama-gqa"), "-p", "a",
                        "--draft", "stories5m-ar"], capture_output=True, timeout=120, cwd=os.path.dirname(__file__))
    assert p.returncode == 2 and b"Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_a_chat_with_a_drafter_answers_as_without_one(tmp_path):
    from test_chat import with_template
    from tinydiff.chat import Chat
    model = tinydiff.load(with_template(tmp_path))
    answers = []
    for draft in (None, model.speculator("ngram", 4), model.speculator(tinydiff.load(os.path.join(HF, "mistral")))):
        chat = Chat(model, system="Be brief.")
        answers.append(["".join(chat.send(text, 20, temperature=0, **({"draft": draft} if draft else {})))
                        for text in ("hello there", "and again hello there")])
    assert answers[0] == answers[1] == answers[2]


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_served_requests_speculating_in_their_slots_get_what_they_get_alone(draft):
    from tinydiff.serve.scheduler import Scheduler
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    spec = model.speculator("ngram" if draft == "ngram" else model, 4)
    scheduler = Scheduler(model, slots=3, speculator=spec)
    prompts = [REPETITIVE, [8, 9, 10], [3], [7] * 9, PLAIN, [60, 61]]
    steps = [20, 5, 12, 30, 9, 1]
    seqs = [scheduler.submit(p, n, SamplingParams(temperature=0.8, top_k=0, seed=i))
            for i, (p, n) in enumerate(zip(prompts, steps))]
    assert [list(s) for s in seqs] == [model.generate_ids(p, n, temperature=0.8, top_k=0, seed=i)
                                       for i, (p, n) in enumerate(zip(prompts, steps))]
    assert scheduler.steps < scheduler.generated - len(prompts)          # some passes gave more than one token


def test_cost_books_the_verify_and_draft_passes_as_what_they_are(capsys, monkeypatch):
    from tinydiff.measure import roofline
    machine = roofline.Roofline(mem_gbs=10.0, llc_gbs=40.0, peak_gflops=100.0, balance=10.0, llc_balance=2.5,
                                cpu="test cpu", threads=1, simd="c", when="now")
    monkeypatch.setattr(roofline, "load_or_measure", lambda threads=None, remeasure=False: machine)   # measure nothing
    model = os.path.join(HF, "llama-gqa")
    assert main(["cost", "-m", model, "-n", "12", "-p", "a b a b", "--draft", os.path.join(HF, "mistral"),
                 "--draft-max", "3"]) == 0
    out = capsys.readouterr().out
    note = next(line for line in out.splitlines() if line.startswith("  autoregressive, --draft mistral k=3:"))
    assert "1 prefill, " in note and " verify (" in note and " draft passes; " in note and "rejected" in note
    assert main(["cost", "-m", model, "--draft-max", "3"]) == 2
    assert "--draft-max tunes --draft" in capsys.readouterr().err


def test_the_server_with_a_drafter_answers_as_without_one(capsys):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient
    from tinydiff.serve.server import make_app
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    spec = model.speculator(tinydiff.load(os.path.join(HF, "mistral")), 4)
    client = TestClient(make_app(model, "plain", slots=2, speculator=spec))
    for body in ({"prompt": [5, 6, 7, 5, 6], "max_tokens": 20, "temperature": 0},
                 {"prompt": "a b a b", "max_tokens": 16, "temperature": 0.9, "top_k": 0, "seed": 4}):
        r = client.post("/v1/completions", json=body)
        ids = body["prompt"] if isinstance(body["prompt"], list) else model.encode_prompt(body["prompt"])
        sampling = {k: v for k, v in body.items() if k in ("temperature", "top_k", "seed")}
        assert r.status_code == 200
        assert r.json()["choices"][0]["text"] == model.text(model.generate_ids(ids, body["max_tokens"], **sampling))
    assert main(["serve", "-m", os.path.join(HF, "llama-gqa"), "--draft-max", "3"]) == 2
    assert "--draft-max tunes --draft" in capsys.readouterr().err
    assert main(["serve", "-m", os.path.join(HF, "llama-gqa"), "--draft", "stories5m-ar"]) == 2
    assert "vocabulary" in capsys.readouterr().err
