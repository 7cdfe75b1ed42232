"""`tinydiff eval` (tinydiff/training/evaluate.py and its metric modules): every number checked
against a direct computation from model.logits on the fixture models, and every bad input one line."""
import argparse
import itertools
import json
import math
import os
import shutil

import numpy as np
import pytest

import tinydiff
from tinydiff.engine.masks import BIDIRECTIONAL
from tinydiff.errors import ModelError, UsageError
from tinydiff.formats.safetensors import load_checkpoint, save_safetensors
from tinydiff.training import agreement, evaluate, infill, judge, likelihood, sequences

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
AR = os.path.join(HF, "llama-gqa")
OTHER = os.path.join(HF, "llama-tied-headdim")        # same tokenizer, other weights
EOT, MASK = 0, 2                                      # the fixtures' <|endoftext|>; a mask id for the MDM

STORIES = ["Once upon a time, a cat sat on the mat.",
           "Tom had a big red ball. He liked it.\nThe end.",
           "Once there was a café where “naïve” dogs ate crème brûlée — every day."]


@pytest.fixture(scope="module")
def ar():
    return tinydiff.load(AR)


@pytest.fixture(scope="module")
def mdm_dir(tmp_path_factory):
    """llama-gqa read bidirectionally, with a mask token: a masked-diffusion model folder."""
    dst = tmp_path_factory.mktemp("mdm") / "mdm"
    shutil.copytree(AR, dst)
    cfg = json.load(open(dst / "config.json"))
    json.dump({**cfg, "is_causal": False, "mask_token_id": MASK}, open(dst / "config.json", "w"))
    return str(dst)


@pytest.fixture(scope="module")
def mdm(mdm_dir):
    return tinydiff.load(mdm_dir)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "valid.txt"
    path.write_text("".join(s + "\n<|endoftext|>\n" for s in STORIES), encoding="utf-8")
    return str(path)


def log_probs(logits):
    x = logits.astype(np.float64)
    return x - x.max(1, keepdims=True) - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))


def encode(model, text):
    return model.tokenizer.encode(text, add_special_tokens=False)


def story_ids(model, stories, k):
    """(ids, first scored index): the previous story's last 64 tokens, EOT, story k, EOT."""
    tail = encode(model, stories[k - 1])[-64:] if len(stories) > 1 else []
    return tail + [EOT] + encode(model, stories[k]) + [EOT], len(tail) + 1


def nll_by_hand(model, ids, first=1):
    """-sum log p(ids[i] | ids[:i]) for i >= first, one unbatched causal pass."""
    lp = log_probs(model.logits(ids[:-1]))
    return -sum(lp[i - 1, ids[i]] for i in range(first, len(ids)))


# ---------------------------------------------------------------------------------------------
# autoregressive NLL

def test_data_file_is_read_into_the_stories_by_corpus(data):
    assert tinydiff.training.evaluate.corpus.load_stories([data]) == STORIES


def test_ar_nll_equals_the_direct_computation(ar):
    r = likelihood.ar_likelihood(ar, STORIES)          # three lengths: one padded batch
    seqs = [story_ids(ar, STORIES, k) for k in range(3)]
    assert r.stories == 3 and r.tokens == sum(len(ids) - first for ids, first in seqs)
    assert r.nats == pytest.approx(sum(nll_by_hand(ar, ids, first) for ids, first in seqs), rel=1e-5)
    assert r.nats_per_token == pytest.approx(r.nats / r.tokens)
    first_two = likelihood.ar_likelihood(ar, STORIES, limit=2)   # story 0 keeps the file's last story as context
    assert first_two.nats == pytest.approx(sum(nll_by_hand(ar, ids, first) for ids, first in seqs[:2]), rel=1e-5)


def test_a_story_is_given_the_previous_storys_tail_and_an_end_of_text(ar):
    long = "Once upon a time there was a big dog. " * 10
    seqs = sequences.story_seqs(ar, [long, "The end."])
    tail = encode(ar, long)[-sequences.PREV_CONTEXT:]
    assert seqs[1].ids.tolist() == tail + [EOT] + encode(ar, "The end.") + [EOT]
    assert seqs[1].first == len(tail) + 1 == 65
    assert seqs[0].ids[:seqs[0].first].tolist() == encode(ar, "The end.") + [EOT]
    only = sequences.story_seqs(ar, ["The end."])[0]
    assert only.ids.tolist() == [EOT] + encode(ar, "The end.") + [EOT] and only.first == 1


def test_bits_per_byte_counts_utf8_bytes_and_one_per_end_of_text(ar):
    r = likelihood.ar_likelihood(ar, STORIES[2:])
    assert r.bytes == len(STORIES[2].encode("utf-8")) + 1 > len(STORIES[2]) + 1     # é ï û “ ” — are 2-3 bytes
    assert r.bits_per_byte == pytest.approx(r.nats / math.log(2) / r.bytes)


def test_windows_score_every_token_once_with_half_a_context_before_it():
    assert sequences.windows(10, 1, 16) == [(0, 1, 10)]
    assert sequences.windows(300, 1, 256) == [(0, 1, 256), (128, 256, 300)]
    for n, first, ctx in itertools.product([5, 17, 64, 65, 200], [1, 3], [4, 7, 16, 64]):
        w = sequences.windows(n, first, ctx)
        assert [f for _, f, _ in w] == [first] + [e for _, _, e in w[:-1]] and w[-1][2] == n
        for a, f, e in w:
            assert 0 <= a < f < e <= n and e - a <= ctx
            assert a == 0 or f - a >= ctx - ctx // 2


def test_a_story_longer_than_the_context_is_scored_in_sliding_windows(ar):
    story = "Once upon a time there was a girl who liked to run and jump. " * 8
    ids, _ = story_ids(ar, [story], 0)              # one story: [EOT] story [EOT]
    n, ctx = len(ids), ar.config.max_position_embeddings
    assert ctx < n <= 1.5 * ctx
    # by hand: positions 1..255 from the pass over ids[0:255], the rest given the 128 before them
    first = -log_probs(ar.logits(ids[:ctx - 1]))
    second = -log_probs(ar.logits(ids[ctx // 2:n - 1]))
    expected = (sum(first[i - 1, ids[i]] for i in range(1, ctx))
                + sum(second[i - 1 - ctx // 2, ids[i]] for i in range(ctx, n)))
    r = likelihood.ar_likelihood(ar, [story])
    assert r.tokens == n - 1
    assert r.nats == pytest.approx(expected, rel=1e-5)


def test_standard_error_over_stories(ar):
    nats, tokens = np.array([10.0, 30.0, 20.0]), np.array([10, 10, 20])
    r = 60 / 40
    expected = math.sqrt(((nats - r * tokens) ** 2).sum() * 3 / 2) / 40
    assert likelihood.ratio_se(nats, tokens) == pytest.approx(expected)
    assert math.isnan(likelihood.ratio_se(nats[:1], tokens[:1]))


# ---------------------------------------------------------------------------------------------
# masked diffusion ELBO

def exact_elbo(model, canvas, first):
    """sum over l of 1/l * mean over l-subsets S of sum_{i in S} -log p(x_i | x with S masked): the
    expectation the estimator draws from, enumerated. Also returns {S: that sum} for other checks."""
    m = len(canvas) - first
    losses = {}
    for l in range(1, m + 1):
        for S in itertools.combinations(range(first, len(canvas)), l):
            x = np.array(canvas)
            x[list(S)] = MASK
            lp = log_probs(model.logits(x, mask=BIDIRECTIONAL))
            losses[S] = -sum(lp[i, canvas[i]] for i in S)
    total = sum(v / len(S) / math.comb(m, len(S)) for S, v in losses.items())
    return total, losses


def test_stratified_count_estimator_is_unbiased_on_a_three_token_sequence(mdm):
    canvas = np.array([EOT, 100, 200, 300])
    exact, _ = exact_elbo(mdm, canvas, 1)
    losses = likelihood.masked_losses(mdm.transformer, canvas, 1, 3000, MASK, np.random.default_rng(0))
    se = losses.std() / math.sqrt(len(losses))       # iid formula: overstates stratified noise
    assert abs(losses.mean() - exact) < 4 * se
    assert se < 0.02 * exact


class VisibleCounter:
    """A stand-in denoiser over 4 tokens whose guess of token 1 sharpens with every visible 1: the
    loss of a masked position depends strongly on how many are masked, so a wrong weight or a
    non-uniform mask count shows as bias (the random fixture barely notices the masks)."""

    def state(self, n_ctx, batch=1, rows=None):
        return None

    def canvas_logits(self, x, state):
        logits = np.zeros(x.shape + (4,), np.float32)              # [B, L, 4]
        logits[..., 1] = 2.0 * (x == 1).sum(axis=1)[:, None]
        return logits

    def logits(self, ids, mask=BIDIRECTIONAL):
        return self.canvas_logits(np.asarray([ids]), None)[0]


def test_estimator_is_unbiased_when_the_loss_depends_on_the_mask_count():
    model, canvas = VisibleCounter(), np.array([EOT, 1, 1, 1])
    exact, losses = exact_elbo(model, canvas, 1)
    assert losses[(1,)] < 0.1 < 1.3 < losses[(1, 2, 3)] / 3      # one mask vs all masked, per token
    est = likelihood.masked_losses(model, canvas, 1, 3000, MASK, np.random.default_rng(0))
    assert est.mean() == pytest.approx(exact, rel=2e-3)


def test_count_form_has_the_expectation_of_the_trainers_bernoulli_t_bound(mdm):
    """E_t[(1/t) sum_S t^|S| (1-t)^(m-|S|) loss(S)] (each token masked with probability t, as the
    trainer draws it) equals the count form, integrated exactly by Gauss-Legendre."""
    canvas = np.array([EOT, 100, 200, 300])
    exact, losses = exact_elbo(mdm, canvas, 1)
    t, w = np.polynomial.legendre.leggauss(8)
    t, w = (t + 1) / 2, w / 2                        # nodes and weights on [0, 1]
    integrand = sum(v * t ** (len(S) - 1) * (1 - t) ** (3 - len(S)) for S, v in losses.items())
    assert (w * integrand).sum() == pytest.approx(exact, rel=1e-12)


def test_one_pass_masks_stratified_uniform_counts_of_the_scored_positions_only(mdm, monkeypatch):
    seen = []
    real = mdm.transformer.canvas_logits
    monkeypatch.setattr(mdm.transformer, "canvas_logits", lambda x, *a: seen.append(x.copy()) or real(x, *a))
    canvas = np.arange(10, 30)
    likelihood.masked_losses(mdm.transformer, canvas, 5, 30, MASK, np.random.default_rng(1))
    x = seen[0]                                       # [K, L]: all K = 30 copies in one pass
    assert x.shape == (30, 20)
    assert (x[:, :5] == canvas[:5]).all() and ((x == MASK) | (x == canvas)).all()
    counts = (x == MASK).sum(1)                       # m = 15 scored positions: each count twice
    assert counts.tolist() == [c for c in range(1, 16) for _ in range(2)]


def test_monte_carlo_error_shrinks_with_more_draws(mdm):
    few = likelihood.mdm_likelihood(mdm, STORIES, k=4, seed=0)
    many = likelihood.mdm_likelihood(mdm, STORIES, k=64, seed=0)
    assert many.mc_se < 0.5 * few.mc_se
    seqs = [story_ids(mdm, STORIES, k) for k in range(3)]
    assert few.tokens == many.tokens == sum(len(ids) - first for ids, first in seqs)
    assert few.bytes == many.bytes == likelihood.ar_likelihood(tinydiff.load(AR), STORIES).bytes
    assert many.nats_per_token == pytest.approx(few.nats_per_token, abs=4 * few.mc_se)


def test_mdm_eval_is_deterministic_given_the_seed(mdm):
    a, b = (likelihood.mdm_likelihood(mdm, STORIES[:1], k=4, seed=3) for _ in range(2))
    assert a.nats == b.nats


# ---------------------------------------------------------------------------------------------
# --against

def test_kl_of_a_model_against_itself_is_zero_and_top1_agrees(ar):
    d = agreement.against(ar, ar, STORIES).as_dict()
    assert d["kl_mean"] == 0 and d["kl_max"] == 0 and d["top1_agreement"] == 1
    assert d["model_nats_per_token"] == d["ref_nats_per_token"]


def test_kl_against_another_model_equals_the_direct_computation(ar):
    other = tinydiff.load(OTHER)
    r = agreement.against(ar, other, STORIES[:1])
    ids, _ = story_ids(ar, STORIES[:1], 0)
    lp, lq = log_probs(ar.logits(ids[:-1])), log_probs(other.logits(ids[:-1]))
    kl = (np.exp(lq) * (lq - lp)).sum(1)
    np.testing.assert_allclose(r.kl, kl, rtol=1e-5, atol=1e-9)
    assert r.same_top1.mean() == (lp.argmax(1) == lq.argmax(1)).mean()
    assert r.model_nats == pytest.approx(nll_by_hand(ar, ids), rel=1e-5)
    assert r.ref_nats == pytest.approx(nll_by_hand(other, ids), rel=1e-5)


# ---------------------------------------------------------------------------------------------
# --judge

def test_unigram_entropy(mdm, ar):
    assert judge.unigram_entropy([5] * 20) == 0.0
    assert judge.unigram_entropy([1, 2]) == 1.0
    assert judge.unigram_entropy([1, 2, 3, 4, 1, 2, 3, 4]) == 2.0
    repetitive = sequences.Seq(np.array([5, 6] + [7] * 30 + [EOT]), 2)     # "the the the ..." then EOS
    row = judge.judge_row(mdm, ar, [repetitive], {})
    assert row.entropy == 0.0 and row.tokens == 31
    assert row.repeats == pytest.approx(26 / 27)                         # 27 4-grams of 7s, all but one seen


def test_repeated_ngrams():
    assert judge.repeated_ngrams([1, 2, 3, 4, 5, 6]) == 0.0 and judge.repeated_ngrams([1, 2, 3]) == 0.0
    assert judge.repeated_ngrams([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(1 / 5)   # (1,2,3,4) again
    assert judge.repeated_ngrams([1, 2, 1, 2, 1, 2], n=2) == pytest.approx(3 / 5)


def test_judge_perplexity_is_exp_of_the_mean_nll_by_hand(mdm, ar):
    rows = judge.generative_perplexity(mdm, ar, 3, 8, steps=[4, 8], thresholds=[None, 0.5], temps=[1.0],
                                          seed=7)
    assert [(r.setting["steps"], r.setting["threshold"]) for r in rows] == [(4, None), (4, 0.5), (8, None), (8, 0.5)]
    for r in rows:
        nats = tokens = 0
        for i, s in enumerate(r.samples):
            prompt = encode(mdm, judge.OPENINGS[i])
            assert s.ids[:s.first].tolist() == prompt and 1 <= len(s.ids) - s.first <= 8
            nats += nll_by_hand(ar, s.ids.tolist(), s.first)
            tokens += len(s.ids) - s.first
        assert r.tokens == tokens
        assert r.perplexity == pytest.approx(math.exp(nats / tokens), rel=1e-5)
        gen = [[t for t in s.ids[s.first:] if t != EOT] for s in r.samples]
        assert r.entropy == pytest.approx(np.mean([judge.unigram_entropy(g) if g else 0 for g in gen]))
    assert rows[0].passes == 4 and rows[2].passes == 8       # one pass per step without a threshold


def test_samples_from_nothing(mdm, ar):
    """--from-nothing: a bidirectional model fills an all-mask canvas, a causal one continues the
    end-of-text; each sample is scored after an end-of-text."""
    samples, passes = judge.from_nothing(mdm, 2, 6, seed=3, temperature=1.0)
    assert passes == 6 and all(s.first == 1 and s.ids[0] == EOT and len(s.ids) == 7 for s in samples)
    assert all(MASK not in s.ids[1:] for s in samples)
    assert samples[1].ids[1:].tolist() == mdm.infill([MASK] * 6, seed=4, temperature=1.0)
    samples, _ = judge.from_nothing(ar, 2, 6, seed=3, temperature=1.0)
    want = ar.generate_ids([EOT], 6, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=4)
    assert samples[1].ids.tolist() == [EOT] + want
    rows = judge.generative_perplexity(ar, ar, 2, 6, temps=[1.0], seed=3, nothing=True)
    assert rows[0].tokens == sum(len(s.ids) - 1 for s in samples)


def test_judged_samples_take_the_repetition_penalty(mdm, ar):
    """The penalty reaches every sample: each equals the same run of the model with it, and (the
    tiny fixtures loop) the penalised samples differ from the plain ones."""
    rows = [judge.generative_perplexity(mdm, ar, 2, 8, temps=[0.0], seed=3, repeat_penalty=rp)[0] for rp in (1, 3)]
    for i, s in enumerate(rows[1].samples):
        want = mdm.denoise_ids(encode(mdm, judge.OPENINGS[i]), 8, temperature=0.0, seed=3 + i, repeat_penalty=3)
        assert s.ids[s.first:].tolist() == want
    assert [s.ids.tolist() for s in rows[0].samples] != [s.ids.tolist() for s in rows[1].samples]
    nothing = judge.generative_perplexity(ar, ar, 1, 6, temps=[0.0], seed=3, nothing=True, repeat_penalty=3)[0]
    assert nothing.samples[0].ids.tolist() == [EOT] + ar.generate_ids([EOT], 6, temperature=0.0, repeat_penalty=3,
                                                                      repeat_last_n=64)


def test_judged_samples_take_the_gap_on_the_rows_with_a_rule(mdm, ar):
    plain, spaced = judge.generative_perplexity(mdm, ar, 2, 8, thresholds=[None, 0.2], temps=[1.0], seed=3, gap=2)
    for i, (a, b) in enumerate(zip(plain.samples, spaced.samples)):
        prompt = encode(mdm, judge.OPENINGS[i])
        assert a.ids[a.first:].tolist() == mdm.denoise_ids(prompt, 8, temperature=1.0, seed=3 + i)
        assert b.ids[b.first:].tolist() == mdm.denoise_ids(prompt, 8, temperature=1.0, seed=3 + i, threshold=0.2, gap=2)


def test_reference_row_scores_the_held_out_story_starts(mdm, ar):
    r = judge.reference_row(mdm, ar, STORIES, 5)
    ids = [(encode(mdm, s) + [EOT])[:4 + 5] for s in STORIES]
    assert r.tokens == 15
    assert r.perplexity == pytest.approx(math.exp(sum(nll_by_hand(ar, i, 4) for i in ids) / 15), rel=1e-5)


# ---------------------------------------------------------------------------------------------
# --infill

def test_infill_by_hand():
    """The holes: round(rate * n) of each paragraph's n tokens (at least one), seeded; a causal
    model fills them left to right from what is left of each, a bidirectional one by Model.infill.
    The shipped twins, so that some holes come back right."""
    texts = ["Once upon a time, there was a little girl named Lily. She liked to play with her ball.",
             "Tom had a big red ball. He liked to play with it in the park."]
    for model in (tinydiff.load("stories5m-ar"), tinydiff.load("stories5m-mdm")):
        EOT, MASK = 2046, 2047                               # the shipped tokenizer's
        holes, correct = infill.infill_accuracy(model, texts, 0.3, seed=5)
        want_holes = want_correct = 0
        for i, text in enumerate(texts):
            ids = np.array([EOT] + encode(model, text))
            n = len(ids) - 1
            k = max(1, round(0.3 * n))
            where = 1 + np.sort(np.random.default_rng([5, i]).choice(n, size=k, replace=False))
            if model.config.causal:
                out = ids.copy()
                for h in where:
                    out[h] = int(np.argmax(model.logits(out[:h].tolist())[-1]))
            else:
                canvas = ids.copy()
                canvas[where] = MASK
                out = np.array(model.infill(canvas.tolist()))
                assert (out[np.setdiff1d(np.arange(len(ids)), where)] == ids[np.setdiff1d(np.arange(len(ids)),
                                                                                        where)]).all()
            want_holes, want_correct = want_holes + k, want_correct + int((out[where] == ids[where]).sum())
        assert (holes, correct) == (want_holes, want_correct) and 0 < correct < holes


def test_infill_command(data, mdm_dir, capsys):
    run("-m", AR, "--data", data, "--infill", "0.15,0.5", "--json")
    d = json.loads(capsys.readouterr().out)
    assert [r["rate"] for r in d["rows"]] == [0.15, 0.5] and d["paragraphs"] == 4
    assert all(0 <= r["correct"] <= r["holes"] and r["accuracy"] == r["correct"] / r["holes"] for r in d["rows"])
    run("-m", mdm_dir, "--data", data, "--infill", "0.5")
    out = capsys.readouterr().out
    assert "infill at 50%:" in out and "holes given back exactly" in out and "Model.infill" in out


# ---------------------------------------------------------------------------------------------
# the command

def run(*argv):
    p = argparse.ArgumentParser()
    evaluate.add_eval_arguments(p)
    return evaluate.run_eval(p.parse_args([str(a) for a in argv]))


# ---------------------------------------------------------------------------------------------
# the bigram baseline

def test_kneser_ney_bigram_is_a_distribution_in_every_context():
    train = np.array([0, 1, 2, 1, 2, 3, 0, 1, 3, 0], np.int64)
    V = 6                                                   # tokens 4 and 5 never occur; context 5 never seen
    prob = likelihood.kneser_ney_bigram(train, V)
    w = np.arange(V)
    for v in range(V):
        p = prob(np.full(V, v), w)
        assert p.sum() == pytest.approx(1.0) and (p > 0).all()
    # by hand: c(1,.) = 3, seen pairs (1,2) x2 and (1,3); N1+(. .) = 6 distinct pairs; N1+(. 2) = 1
    p_cont_2 = (1 + 1) / (6 + V)
    assert prob(np.array([1]), np.array([2]))[0] == pytest.approx((2 - 0.75) / 3 + 0.75 * 2 / 3 * p_cont_2)


def test_bigram_baseline_scores_the_same_tokens_and_bytes_as_the_model(ar, data, capsys):
    base = likelihood.bigram_likelihood(ar, STORIES, STORIES)
    exact = likelihood.ar_likelihood(ar, STORIES)
    assert (base.tokens, base.bytes) == (exact.tokens, exact.bytes)
    # counted on the very stories it scores, the bigram knows them far better than a random model
    assert base.nats_per_token < exact.nats_per_token
    run("-m", AR, "--bigram", data, "--data", data, "--json", "--unit", "story")
    d = json.loads(capsys.readouterr().out)
    assert d["bound"] == "bigram NLL" and d["nats"] == pytest.approx(base.nats)


def test_command_ar_report_and_json(data, capsys):
    run("-m", AR, "--data", data, "--unit", "story")
    out = capsys.readouterr().out
    assert "3 stories" in out and "bits per byte" in out and "exact NLL" in out
    run("-m", AR, "--data", data, "--json", "--max-stories", 2, "--unit", "story")
    d = json.loads(capsys.readouterr().out)
    assert d["stories"] == d["first_stories"] == 2 and d["bound"] == "exact NLL" and d["unit"] == "story"
    assert d["nats"] == pytest.approx(likelihood.ar_likelihood(tinydiff.load(AR), STORIES, 2).nats)


def test_paragraphs_are_scored_each_alone_after_an_end_of_text(ar, data, capsys):
    """The default unit: the second story's two lines are two sequences, each [EOT] line, with no
    end-of-text scored after a paragraph and no byte counted for one."""
    paragraphs = ["Once upon a time, a cat sat on the mat.", "Tom had a big red ball. He liked it.", "The end.",
                  STORIES[2]]
    seqs = sequences.story_seqs(ar, paragraphs, unit="paragraph")
    assert [s.first for s in seqs] == [1] * 4 and all(s.ids[0] == EOT and EOT not in s.ids[1:] for s in seqs)
    r = likelihood.ar_likelihood(ar, paragraphs, unit="paragraph")
    assert r.bytes == sum(len(p.encode()) for p in paragraphs) and r.stories == 4
    alone = [likelihood.ar_likelihood(ar, [p], unit="paragraph").nats for p in paragraphs]
    assert r.nats == pytest.approx(sum(alone))                   # no paragraph sees another
    run("-m", AR, "--data", data, "--json")
    d = json.loads(capsys.readouterr().out)
    assert (d["unit"], d["stories"], d["first_stories"]) == ("paragraph", 4, 3)
    assert d["nats"] == pytest.approx(r.nats) and d["bytes"] == r.bytes
    run("-m", AR, "--data", data, "--max-stories", 2)
    assert "the first 2 of 3 stories, 3 paragraphs" in capsys.readouterr().out


def test_command_mdm_elbo(mdm_dir, data, capsys):
    run("-m", mdm_dir, "--data", data, "--samples-per-seq", 4, "--json", "--unit", "story")
    d = json.loads(capsys.readouterr().out)
    assert d["bound"] == "ELBO" and d["samples_per_seq"] == 4 and d["stories"] == 3 and d["mc_se"] > 0
    run("-m", mdm_dir, "--data", data, "--samples-per-seq", 4)
    assert "upper bound" in capsys.readouterr().out


def test_command_judge_sweep_and_against(mdm_dir, data, capsys):
    run("-m", mdm_dir, "--judge", AR, "--samples", 2, "--gen-length", 8, "--steps", "4,8",
        "--threshold", "none,0.9", "--data", data, "--json")
    d = json.loads(capsys.readouterr().out)
    assert [(r["steps"], r["threshold"]) for r in d["rows"]] == [
        (4, None), (4, 0.9), (8, None), (8, 0.9), ("held-out text", None)]
    assert all(r["perplexity"] > 1 and len(r["texts"]) == 2 for r in d["rows"])
    run("-m", mdm_dir, "--judge", AR, "--samples", 2, "--gen-length", 8, "--steps", 4)
    assert "judge ppl" in capsys.readouterr().out
    run("-m", mdm_dir, "--judge", AR, "--samples", 2, "--gen-length", 8, "--steps", 8, "--entropy-bound", "none,50",
        "--json")
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["threshold"], r["entropy_bound"]) for r in rows] == [(None, None), (None, 50.0)]
    assert rows[0]["passes_per_sample"] == 8 and rows[1]["passes_per_sample"] == 1   # a bound no step reaches
    run("-m", AR, "--against", OTHER, "--data", data)
    assert "KL(ref || model)" in capsys.readouterr().out


@pytest.fixture
def wide_vocab(tmp_path):
    """llama-gqa with 10 unused rows added to its vocabulary: loads, but its vocabulary differs."""
    dst = tmp_path / "wide"
    shutil.copytree(AR, dst)
    ckpt = load_checkpoint(AR)
    tensors = {k: np.array(ckpt.f32(k)) for k in ckpt.names}
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        tensors[k] = np.concatenate([tensors[k], np.zeros((10, tensors[k].shape[1]), np.float32)])
    save_safetensors(str(dst / "model.safetensors"), tensors)
    cfg = json.load(open(dst / "config.json"))
    json.dump({**cfg, "vocab_size": cfg["vocab_size"] + 10}, open(dst / "config.json", "w"))
    return str(dst)


@pytest.fixture
def no_mask_dir(tmp_path):
    dst = tmp_path / "nomask"
    shutil.copytree(AR, dst)
    cfg = json.load(open(dst / "config.json"))
    json.dump({**cfg, "is_causal": False}, open(dst / "config.json", "w"))
    return str(dst)


def test_bad_input_is_one_line_naming_what_is_wrong(tmp_path, data, mdm_dir, wide_vocab, no_mask_dir):
    (tmp_path / "empty.txt").write_bytes(b"\n \n")
    (tmp_path / "latin1.txt").write_bytes("Once upon a time, a caf\xe9.".encode("latin-1"))
    cases = [
        (UsageError, "cannot read", ["-m", AR, "--data", tmp_path / "missing.txt"]),
        (UsageError, "no text", ["-m", AR, "--data", tmp_path / "empty.txt"]),
        (UsageError, "invalid UTF-8 at byte 23", ["-m", AR, "--data", tmp_path / "latin1.txt"]),
        (UsageError, "needs the held-out text: --data", ["-m", AR]),
        (UsageError, "--max-stories must be >= 1, got 0", ["-m", AR, "--data", data, "--max-stories", 0]),
        (UsageError, "--samples-per-seq must be >= 1", ["-m", mdm_dir, "--data", data, "--samples-per-seq", 0]),
        (UsageError, "-s/--seed must be >= 0, got -5", ["-m", mdm_dir, "--data", data, "-s", -5]),
        (UsageError, "an autoregressive model's likelihood is exact", ["-m", AR, "--data", data,
                                                                     "--samples-per-seq", 4]),
        (UsageError, "this evaluation would ignore it", ["-m", mdm_dir, "--judge", AR, "--samples-per-seq", 4]),
        (UsageError, "--samples must be >= 1, got 0", ["-m", mdm_dir, "--judge", AR, "--samples", 0]),
        (UsageError, "--samples must be >= 1, got -2", ["-m", mdm_dir, "--judge", AR, "--samples", -2]),
        (UsageError, "not an autoregressive model", ["-m", mdm_dir, "--judge", mdm_dir, "--samples", 2]),
        (UsageError, "is autoregressive", ["-m", AR, "--judge", AR, "--samples", 2]),
        (UsageError, "vocabulary of 330 tokens, but the model's has 320",
         ["-m", mdm_dir, "--judge", wide_vocab, "--samples", 2]),
        (UsageError, "vocabulary of 330 tokens, but the model's has 320",
         ["-m", AR, "--against", wide_vocab, "--data", data]),
        (UsageError, "compares autoregressive models", ["-m", mdm_dir, "--against", AR, "--data", data]),
        (UsageError, "one of --judge", ["-m", mdm_dir, "--against", AR, "--judge", AR]),
        (UsageError, "give --threshold or --entropy-bound, not both",
         ["-m", mdm_dir, "--judge", AR, "--threshold", "0.9", "--entropy-bound", "1"]),
        (UsageError, "entropy_bound must be >= 0", ["-m", mdm_dir, "--judge", AR, "--entropy-bound", "-1"]),
        (UsageError, "--gap 2: give N >= 1 with --threshold", ["-m", mdm_dir, "--judge", AR, "--gap", "2"]),
        (UsageError, "--gap -1", ["-m", mdm_dir, "--judge", AR, "--threshold", "0.5", "--gap", "-1"]),
        (UsageError, "--repeat-penalty must be > 0", ["-m", mdm_dir, "--judge", AR, "--repeat-penalty", "0"]),
        (UsageError, "--repeat-penalty must be > 0", ["-m", mdm_dir, "--judge", AR, "--repeat-penalty", "inf"]),
        (UsageError, "--gap is a setting of the samples --judge", ["-m", mdm_dir, "--data", data, "--gap", "2"]),
        (UsageError, "--repeat-penalty is a setting", ["-m", AR, "--data", data, "--repeat-penalty", "1.2"]),
        (UsageError, "--temp is a setting of the samples --judge scores; without --judge it would be ignored",
         ["-m", mdm_dir, "--data", data, "--temp", "0"]),
        (UsageError, "--from-nothing is a setting", ["-m", mdm_dir, "--infill", "0.15", "--data", data,
                                                     "--from-nothing"]),
        (ModelError, "neither causal nor with a mask token", ["-m", no_mask_dir, "--data", data]),
        (ModelError, "not a model folder", ["-m", tmp_path / "nowhere", "--data", data]),
    ]
    for error, words, argv in cases:
        with pytest.raises(error) as e:
            run(*argv)
        assert words in str(e.value) and "\n" not in str(e.value), (argv, str(e.value))


def test_sweep_lists_parse_none_and_reject_garbage():
    p = argparse.ArgumentParser()
    evaluate.add_eval_arguments(p)
    args = p.parse_args(["--steps", "16,32", "--threshold", "none,0.9", "--temp", "0,1"])
    assert args.steps == [16, 32] and args.threshold == [None, 0.9] and args.temp == [0.0, 1.0]
    with pytest.raises(SystemExit):
        p.parse_args(["--steps", "16,x"])
