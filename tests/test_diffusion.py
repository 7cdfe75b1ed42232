"""The masked-diffusion sampler, pinned with hand-built models whose logits are known.

A Fake model returns, for every canvas position, a distribution chosen by the test (it may depend
on the canvas), so which positions each step commits can be worked out by hand. The cache tests
also run a real tinydiff model (the llama-gqa fixture used bidirectionally, with "!" as the mask).
"""
import dataclasses
import io
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest

import tinydiff
from tinydiff.decoding import diffusion as D
from tinydiff.decoding import sampling as S
from tinydiff.decoding.canvas import parse_holes
from tinydiff.decoding.diffusion import Denoised, Step
from tinydiff.decoding.visual import MASK_CHAR, LiveView
from tinydiff.engine import kernels as K
from tinydiff.errors import UsageError

V, MASK, EOS = 16, 15, 14
PROMPT = [1, 2, 3]
P = len(PROMPT)
FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "hf", "llama-gqa")


# -- hand-built models --------------------------------------------------------------------------

def logits_of(probs):
    """Logits whose softmax is `probs` [..., V]; impossible tokens (the mask among them) get -1e4."""
    probs = np.asarray(probs, np.float64)
    return np.where(probs > 0, np.log(np.maximum(probs, 1e-300)), -1e4)


def peaked(token, conf):
    """A distribution giving `token` probability conf, the rest spread over the other non-mask tokens."""
    p = np.full(V, (1 - conf) / (V - 2))
    p[token], p[MASK] = conf, 0.0
    return p


class Fake:
    """A stand-in Transformer: rows(canvas_row [L]) -> probabilities [L, V]; records every canvas_logits call."""

    def __init__(self, rows, n_ctx=64, mask_id=MASK, stop_ids=(EOS,), tokenizer=None):
        self.config = SimpleNamespace(mask_token_id=mask_id, vocab_size=V, max_position_embeddings=n_ctx,
                                      causal=False, block_size=None,
                                      eos_token_ids=tuple(stop_ids))
        self.rows, self.tokenizer, self.calls, self.weights = rows, tokenizer, [], None
        self.pool = K.ThreadPool(1)                                    # where the sampler's kernels run

    def state(self, n_ctx, batch=1, rows=None):
        return None

    def canvas_logits(self, canvas, state, start=0, end=None, want=None):
        end = canvas.shape[1] if end is None else end
        self.calls.append((start, end, canvas.copy()))
        rows = np.arange(start, end) if want is None else np.asarray(want)
        return np.stack([logits_of(self.rows(row)) for row in canvas])[:, rows].astype(np.float32)


def api(transformer):
    """The public Model around a (stand-in) transformer."""
    return tinydiff.Model.of(transformer, transformer.tokenizer)


class Letters:
    """A tokenizer: 'a' is id 4, 'b' 5, ...; EOS decodes as '$'."""
    special_ids = {EOS, MASK}
    eos_id = EOS
    prefix_ids = suffix_ids = []

    def encode(self, text, add_special_tokens=True):
        return [ord(c) - ord("a") + 4 for c in text]

    def decode(self, ids):
        return "".join("$" if i == EOS else "#" if i == MASK else chr(ord("a") + i - 4) for i in ids)

    text = decode

    def token_to_id(self, token):
        return {"<|mdm_mask|>": MASK}.get(token)


def table(confs, tokens=None):
    """A model ignoring the canvas: position P+i prefers tokens[i] (default 4) with confidence confs[i]."""
    tokens = tokens or [4] * len(confs)

    def rows(row):
        out = np.stack([peaked(5, 0.9)] * len(row))
        for i, (t, c) in enumerate(zip(tokens, confs)):
            out[P + i] = peaked(t, c)
        return out
    return Fake(rows)


def explicit(dists):
    """Position P+i has exactly the distribution dists[i] ({token: prob})."""
    def rows(row):
        out = np.stack([peaked(5, 0.9)] * len(row))
        for i, d in enumerate(dists):
            out[P + i] = 0
            for t, p in d.items():
                out[P + i, t] = p
        return out
    return Fake(rows)


def run(model, ids=PROMPT, **opts):
    """(steps, result) of one run."""
    items = list(api(model).denoise_steps(ids, **opts))
    assert all(isinstance(s, Step) for s in items[:-1]) and isinstance(items[-1], Denoised)
    return items[:-1], items[-1]


def order(steps):
    return [s.new.tolist() for s in steps]


# -- how many per step ------------------------------------------------------------------------------

def test_uniform_schedule_spreads_the_remainder_over_the_first_steps():
    steps, out = run(table([0.9] * 10), gen_length=10, steps=4)
    assert out.commits == [3, 3, 2, 2] and out.passes == 4
    assert [len(s.new) for s in steps] == [3, 3, 2, 2]
    steps, out = run(table([0.9] * 8), gen_length=8, steps=4, block_length=4)   # 2 steps per block
    assert out.commits == [2, 2, 2, 2]


def test_timestep_schedule_is_dreams_one_minus_s_over_t():
    # t = linspace(1, 1e-3, 5) = 1, .75025, .5005, .25075, .001
    # masked 10 -> int(10 * (1 - .75025/1)) = 2; 8 -> int(8 * .33289) = 2; 6 -> int(6 * .49900) = 2; last: 4
    steps, out = run(table([0.9] * 10), gen_length=10, steps=4, schedule="timestep")
    assert out.commits == [2, 2, 2, 4]
    t = np.linspace(1, 1e-3, 5)
    masked = 10
    for s, n in enumerate(out.commits[:-1]):
        assert n == int(masked * (1 - t[s + 1] / t[s]))
        masked -= n


def test_steps_default_to_one_token_per_step():
    _, out = run(table([0.9] * 5), gen_length=5)
    assert out.commits == [1] * 5


# -- which positions ----------------------------------------------------------------------------

def test_low_confidence_commits_the_most_probable_first():
    steps, _ = run(table([0.5, 0.9, 0.3, 0.7]), gen_length=4)
    assert order(steps) == [[P + 1], [P + 3], [P + 0], [P + 2]]


def test_entropy_commits_the_least_uncertain_first():
    # a: {.6, .4} H=.673; b: {.7, .1, .1, .1} H=.940; c: {.9, .1} H=.325
    dists = [{4: .6, 5: .4}, {6: .7, 7: .1, 8: .1, 9: .1}, {10: .9, 11: .1}]
    steps, _ = run(explicit(dists), gen_length=3, remasking="entropy")
    assert order(steps) == [[P + 2], [P + 0], [P + 1]]
    steps, _ = run(explicit(dists), gen_length=3, remasking="low_confidence")   # by top prob: c, b, a
    assert order(steps) == [[P + 2], [P + 1], [P + 0]]


def test_margin_is_top1_minus_top2():
    # d: {.5, .5} top .5, margin 0; e: {.45, .11 x 5} top .45, margin .34
    dists = [{4: .5, 5: .5}, {6: .45, 7: .11, 8: .11, 9: .11, 10: .11, 11: .11}]
    assert order(run(explicit(dists), gen_length=2, remasking="margin")[0]) == [[P + 1], [P + 0]]
    assert order(run(explicit(dists), gen_length=2, remasking="low_confidence")[0]) == [[P + 0], [P + 1]]


def test_random_remasking_depends_on_the_seed_only():
    orders = {tuple(map(tuple, order(run(table([0.9] * 6), gen_length=6, remasking="random", seed=s)[0])))
              for s in range(8)}
    assert len(orders) > 1
    a = order(run(table([0.9] * 6), gen_length=6, remasking="random", seed=3)[0])
    assert a == order(run(table([0.9] * 6), gen_length=6, remasking="random", seed=3)[0])


def test_alg_temp_draws_positions_without_replacement():
    confs = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    firsts = {run(table(confs), gen_length=6, alg_temp=0.5, seed=s)[0][0].new[0] for s in range(30)}
    assert len(firsts) > 1                          # not always the top one
    steps, _ = run(table(confs), gen_length=6, alg_temp=1e-6, seed=0)   # near 0: the top-k order
    assert order(steps) == [[P + i] for i in range(6)]
    steps, _ = run(table(confs), gen_length=6, steps=2, alg_temp=2.0, seed=1)
    assert sorted(sum(order(steps), [])) == list(range(P, P + 6))       # each position exactly once


# -- adaptive rules -----------------------------------------------------------------------------

def test_threshold_commits_all_confident_and_never_stalls():
    _, out = run(table([0.95, 0.5, 0.92, 0.3, 0.99, 0.1]), gen_length=6, threshold=0.9)
    assert out.commits == [3, 1, 1, 1]
    _, out = run(table([0.3] * 6), gen_length=6, threshold=0.9)          # nothing reaches it: one per pass
    assert out.commits == [1] * 6 and out.passes == 6


def test_threshold_with_a_step_cap_finishes_the_block_at_the_cap():
    _, out = run(table([0.95, 0.5, 0.92, 0.3, 0.99, 0.1]), gen_length=6, steps=2, threshold=0.9)
    assert out.commits == [3, 3] and out.passes == 2


def test_gap_keeps_one_steps_commits_apart_the_most_confident_first():
    steps, out = run(table([0.9] * 4), gen_length=4, threshold=0.5, gap=1)
    assert order(steps) == [[P, P + 2], [P + 1, P + 3]]                 # ties: leftmost first
    assert run(table([0.9] * 4), gen_length=4, threshold=0.5)[1].commits == [4]
    # .95 at P+1 goes first and blocks P..P+3 (within 2); P+4 is 3 away
    steps, _ = run(table([0.9, 0.95, 0.9, 0.9, 0.9]), gen_length=5, threshold=0.5, gap=2)
    assert order(steps)[0] == [P + 1, P + 4]
    assert sorted(sum(order(steps), [])) == list(range(P, P + 5))       # every position, once


def test_gap_never_holds_back_a_blocks_last_step():
    _, out = run(table([0.9] * 6), gen_length=6, steps=2, threshold=0.5, gap=3)
    assert out.commits == [2, 4]                                        # the cap: the rest at once


def test_factor_rule_takes_the_largest_n_with_c_n_at_least_1_minus_f_over_n_plus_1():
    # sorted .99, .9, .8, .5 with factor 1: n=2 needs .667 (ok), n=3 .75 (ok), n=4 .8 (.5 fails) -> 3.
    # Fast-dLLM's code would commit all 4 here (only the last fails); the rule says 3.
    _, out = run(table([0.8, 0.99, 0.5, 0.9]), gen_length=4, factor=1.0)
    assert out.commits == [3, 1]


def test_entropy_bound_commits_while_sum_minus_max_stays_under_the_bound():
    # entropies 0, 0, ln2, ln2, ln4
    dists = [{4: 1.0}, {5: .5, 6: .5}, {7: .25, 8: .25, 9: .25, 10: .25}, {11: 1.0}, {12: .5, 13: .5}]
    steps, out = run(explicit(dists), gen_length=5, entropy_bound=0.7)
    assert out.commits == [4, 1]                       # 0+0+ln2 - ln2 = 0 ok, + ln2 = .693 ok, + ln4 no
    assert steps[1].new.tolist() == [P + 2]
    _, out = run(explicit(dists), gen_length=5, entropy_bound=0.0)
    assert out.commits == [3, 1, 1]


# -- tokens ---------------------------------------------------------------------------------------

def test_temperature_zero_is_greedy_and_ignores_the_seed():
    dists = [{4: .4, 5: .35, 6: .25}] * 5
    outs = {tuple(run(explicit(dists), gen_length=5, seed=s)[1].ids) for s in range(5)}
    assert outs == {(4,) * 5}


def test_gumbel_noise_is_drawn_per_position():
    same = [{4: .5, 5: .5}] * 8                      # every position has the same distribution
    outs = [run(explicit(same), gen_length=8, steps=1, temperature=1.0, seed=s)[1].ids for s in range(10)]
    assert any(len(set(o)) == 2 for o in outs)       # shared noise would give all-equal rows
    assert outs[3] == run(explicit(same), gen_length=8, steps=1, temperature=1.0, seed=3)[1].ids


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_step_chooses_as_the_numpy_rules_say(temperature):
    """_predict over rows in several 4 MiB chunks (2^17 tokens: 4 rows a chunk) against the rules
    in plain NumPy: argmax, or Gumbel-max with rng.gumbel's noise, the banned token never, and
    p[token] = softmax(z)[token] in float64 as the confidence."""
    V, m = 2**17, 9
    logits = np.random.default_rng(1).standard_normal((1, m, V)).astype(np.float32) * 3
    o = D.Options(temperature=temperature, seed=5)
    tokens, conf, _ = D._predict(logits, o, np.random.default_rng(5), [7], np.arange(m), np.zeros(m, np.int64),
                                 np.zeros(m, bool))
    z = logits[0].astype(np.float64)
    z[:, 7] = -np.inf
    rng = np.random.default_rng(5)
    want = [np.argmax(row) if temperature == 0 else S.gumbel_max(row[None], temperature, rng)[0] for row in z]
    np.testing.assert_array_equal(tokens, want)
    p = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(conf, (p / p.sum(-1, keepdims=True))[np.arange(m), want], rtol=1e-13)


@pytest.mark.parametrize("last_n, want", [(64, 6), (3, 6), (2, 4), (0, 4)])
def test_repeat_penalty_discourages_a_token_already_on_the_canvas_within_last_n(last_n, want):
    """Position 3 prefers 4 (p .5, logit -0.69) to 6 (p .45, -0.80); 4 is in the prompt at
    position 0: a penalty of 2 makes its logit -1.39, so 6 wins, unless position 0 is further
    than last_n (or last_n = 0: off)."""
    m = explicit([{4: .5, 6: .45, 7: .05}])
    ids = run(m, ids=[4, 2, 3], gen_length=1, repeat_penalty=2.0, repeat_last_n=last_n)[1].ids
    assert ids == [want]
    assert run(m, ids=[4, 2, 3], gen_length=1)[1].ids == [4]            # no penalty: the likeliest


def test_repeat_penalty_looks_at_known_tokens_on_both_sides():
    """An infill's hole at position 1 with 4 given to its right at position 3 (and committed
    positions count as given ones): 4 is penalised, 6 drawn."""
    m = Fake(lambda row: np.stack([peaked(5, 0.9)] + [probabilities({4: .5, 6: .45, 7: .05})] * (len(row) - 1)))
    canvas = [1, MASK, 2, 4]
    fixed = np.array([True, False, True, True])
    out = api(m).denoise_result(canvas, fixed=fixed, eos="suppress", repeat_penalty=2.0)
    assert out.canvas.tolist() == [1, 6, 2, 4]
    assert api(m).denoise_result(canvas, fixed=fixed, eos="suppress").canvas.tolist() == [1, 4, 2, 4]


def probabilities(d):
    p = np.zeros(V)
    for t, q in d.items():
        p[t] = q
    return p


def test_sampling_follows_the_tempered_distribution():
    m = explicit([{4: .8, 5: .2}] * 50)
    m.config.max_position_embeddings = 64
    share = lambda T: np.mean([np.mean(np.array(run(m, gen_length=50, steps=1, temperature=T, seed=s)[1].ids) == 4)
                               for s in range(8)])
    assert 0.72 < share(1.0) < 0.88                 # p = .8
    assert 0.90 < share(0.5) < 0.98                 # .8^2 / (.8^2 + .2^2) = .941


def test_top_k_and_top_p_limit_the_draw():
    m = explicit([{4: .4, 5: .3, 6: .2, 7: .1}] * 20)
    def drawn(**kw):
        return {t for s in range(10) for t in run(m, gen_length=20, steps=1, temperature=1.0, seed=s, **kw)[1].ids}
    assert drawn() == {4, 5, 6, 7}
    assert drawn(top_k=2) == {4, 5}
    assert drawn(top_p=0.6) == {4, 5}                # .4 < .6, then .7 reaches it
    assert drawn(top_p=0.35) == {4}


# -- guidance ---------------------------------------------------------------------------------------

def guided_model():
    """The token at P depends on whether the prompt is visible: cond prefers 4 a little, uncond prefers 4 more."""
    def rows(row):
        out = np.zeros((len(row), V))
        out[:, 5] = 1.0
        if row[0] == MASK:                           # the unconditional row: logits 3: 0.0, 4: 1.5
            out[P] = 0
            out[P, 3], out[P, 4] = math.exp(0.0), math.exp(1.5)
        else:                                        # conditional: 3: 1.0, 4: 1.2
            out[P] = 0
            out[P, 3], out[P, 4] = math.exp(1.0), math.exp(1.2)
        return out / out.sum(axis=1, keepdims=True)
    return Fake(rows)


def test_cfg_uses_un_plus_s_plus_1_times_cond_minus_un_in_one_batched_pass():
    m = guided_model()
    assert run(m, gen_length=1)[1].ids == [4]                      # no guidance: cond alone
    m.calls.clear()
    assert run(m, gen_length=1, cfg_scale=1.0)[1].ids == [3]       # 3: 0 + 2(1 - 0) = 2; 4: 1.5 + 2(-.3) = .9
    (start, end, canvas), = m.calls                                # one pass, both rows
    assert canvas.shape == (2, P + 1)
    assert canvas[0, :P].tolist() == PROMPT and (canvas[1, :P] == MASK).all()
    np.testing.assert_allclose(D.cfg_logits(np.array([1.0, 1.2]), np.array([0.0, 1.5]), 1.0), [2.0, 0.9])


def test_cfg_unconditional_row_sees_the_committed_tokens():
    m = table([0.9, 0.8])
    run(m, gen_length=2, cfg_scale=0.5)
    second = m.calls[1][2]
    assert second[1, P] == second[0, P] == 4 and (second[1, :P] == MASK).all()


# -- caches ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("cache, later", [(None, None), ("prefix", "to_end"), ("dual", "block")])
def test_cache_modes_recompute_the_right_spans(cache, later):
    m = table([0.9] * 8)
    steps, _ = run(m, gen_length=8, block_length=4, steps=8, cache=cache)
    L = P + 8
    spans = [(s, e) for s, e, _ in m.calls]
    expect = []
    for b in range(2):
        lo, hi = P + 4 * b, P + 4 * b + 4
        rest = {None: (0, L), "to_end": (lo, L), "block": (lo, hi)}[later]
        expect += [(0, L)] + [rest] * 3                              # the first step of a block is full
    assert spans == expect == [s.span for s in steps]


def real_model():
    m = tinydiff.load(FIXTURE)
    return tinydiff.Model(dataclasses.replace(m.config, mask_token_id=2, causal=False), m.weights, m.tokenizer)


class Recorder:
    """A real model's transformer whose canvas passes are recorded: (start, end, canvas, logits)."""

    def __init__(self, model):
        self.model, self.calls = model.transformer, []
        self.config, self.tokenizer, self.weights = model.config, model.tokenizer, model.weights
        self.pool = model.pool

    def state(self, n_ctx, batch=1, rows=None):
        return self.model.state(n_ctx, batch, rows)

    def canvas_logits(self, canvas, state, start=0, end=None, want=None):
        out = self.model.canvas_logits(canvas, state, start, end, want)
        self.calls.append((start, canvas.shape[1] if end is None else end, canvas.copy(), out.copy(), want))
        return out


@pytest.fixture(scope="module")
def model():
    return real_model()


@pytest.mark.parametrize("cfg_scale", [0.0, 1.0])
def test_cached_first_step_of_every_block_equals_the_uncached_pass(model, cfg_scale):
    prompt = model.tokenizer.encode("The cat sat on")
    L = len(prompt) + 16
    plain = Recorder(model)
    run(plain, prompt, gen_length=16, block_length=8, steps=8, cfg_scale=cfg_scale)
    work = {}
    for cache in ("prefix", "dual"):
        rec = Recorder(model)
        run(rec, prompt, gen_length=16, block_length=8, steps=8, cache=cache, cfg_scale=cfg_scale)
        firsts = [c for c in rec.calls if (c[0], c[1]) == (0, L)]
        assert len(firsts) == 2                                        # one per block
        np.testing.assert_array_equal(firsts[0][3], plain.calls[0][3])  # block 0: same canvas, same logits
        for _, _, canvas, logits, want in firsts:                     # every block: as a fresh full pass
            fresh = model.transformer.canvas_logits(canvas, model.transformer.state(L, len(canvas)), want=want)
            np.testing.assert_array_equal(logits, fresh)               # the rows that can change
        later = [c for c in rec.calls if (c[0], c[1]) != (0, L)]
        assert later and all(e - s < L for s, e, *_ in later)
        work[cache] = sum(e - s for s, e, *_ in rec.calls)
    assert work["dual"] < work["prefix"] < L * len(plain.calls)


# -- EOS --------------------------------------------------------------------------------------------

def eos_model():
    """Four blocks of 2; the second position of block 1 (generated index 3) prefers EOS."""
    return table([0.9] * 8, tokens=[4, 4, 4, EOS, 4, 4, 4, 4])


def test_eos_stop_skips_the_remaining_blocks():
    steps, out = run(eos_model(), gen_length=8, block_length=2, steps=8)
    assert out.passes == 4 and out.passes_saved == 4                # blocks 2, 3: 2 steps each
    assert out.ids == [4, 4, 4, EOS]
    assert out.canvas[P + 3:].tolist() == [EOS] * 5                 # everything after the EOS is EOS
    assert max(s.block for s in steps) == 1


def test_eos_keep_runs_everything_and_suppress_never_emits_eos():
    _, out = run(eos_model(), gen_length=8, block_length=2, steps=8, eos="keep")
    assert out.passes == 8 and out.passes_saved == 0 and out.ids == [4, 4, 4, EOS, 4, 4, 4, 4]
    _, out = run(eos_model(), gen_length=8, block_length=2, steps=8, eos="suppress")
    assert EOS not in out.ids and len(out.ids) == 8


def test_text_ends_before_the_first_eos():
    m = eos_model()
    m.tokenizer = Letters()
    assert api(m).denoise("bcd", gen_length=8, block_length=2, steps=8) == "aaa"
    assert api(m).denoise("bcd", gen_length=8, block_length=2, steps=8, eos="keep") == "aaa"


# -- degenerate and structural --------------------------------------------------------------------

def test_block_length_one_decodes_strictly_left_to_right():
    confs = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7]           # later positions more confident
    steps, out = run(table(confs), gen_length=6, block_length=1, steps=6)
    assert order(steps) == [[P + i] for i in range(6)] and out.passes == 6
    steps, _ = run(table(confs), gen_length=6)       # one block: the most confident (last) first
    assert order(steps)[0] == [P + 5]


@pytest.mark.parametrize("opts", [
    dict(), dict(block_length=2, steps=3), dict(threshold=0.5, block_length=3), dict(factor=0.5, block_length=2),
    dict(entropy_bound=0.3, block_length=6), dict(temperature=1.0, block_length=2, seed=1, cache="dual"),
    dict(schedule="timestep", steps=3, block_length=2, remasking="margin", cache="prefix"),
    dict(remasking="random", cfg_scale=2.0, block_length=3, steps=2, seed=0),
])
def test_only_the_current_block_is_committed_and_the_prompt_never_changes(opts):
    m = table([0.5, 0.9, 0.3, 0.95, 0.7, 0.6])
    steps, out = run(m, gen_length=6, **opts)
    block_length = opts.get("block_length", 6)
    done = set()
    for s in steps:
        lo = P + s.block * block_length
        assert all(lo <= p < lo + block_length for p in s.new)
        assert not done & set(s.new.tolist())
        done |= set(s.new.tolist())
        assert s.canvas[:P].tolist() == PROMPT and s.committed.sum() == P + len(done)
    assert done == set(range(P, P + 6)) and len(out.ids) == 6 and MASK not in out.ids


def test_infill_fills_only_the_holes():
    m = Fake(lambda row: np.stack([peaked(7, 0.9)] * len(row)))      # prefers 7 everywhere, given tokens too
    ids = [MASK, 1, MASK, 2, 3, MASK, MASK]
    items = list(api(m).denoise_steps(ids, fixed=np.array(ids) != MASK, block_length=2, steps=4, cache="dual",
                                      eos="keep"))
    assert items[-1].ids == [7, 1, 7, 2, 3, 7, 7]
    assert [s.span for s in items[:-1]] == [(0, 7), (0, 3), (0, 7), (5, 7)]   # blocks: holes 2 at a time
    assert api(m).infill(ids) == [7, 1, 7, 2, 3, 7, 7]


def test_infill_text_keeps_every_given_token(model):
    tok = model.tokenizer
    text = "The [MASK*3] sat on the [MASK]."
    ids, first, last = parse_holes(tok, text, 2, 256)
    assert ids.count(2) == 4
    filled = model.infill(ids)
    assert all(f == i for f, i in zip(filled, ids) if i != 2) and 2 not in filled
    out = model.infill(text)
    assert out == tok.decode(filled[first:last])
    assert out.startswith("The") and " sat on the" in out and out.endswith(".")
    assert tok.decode(ids[first:ids.index(2)]) == "The"             # the space before a hole is the hole's
    assert " sat on the mat" in model.infill("[MASK*2] sat on the mat[MASK]")   # holes at both ends


# -- the live view -----------------------------------------------------------------------------------

class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_live_view_redraws_in_a_terminal_and_prints_only_text_otherwise():
    m = table([0.9, 0.8, 0.7])
    m.tokenizer = Letters()
    for stream, live in ((Terminal(), True), (io.StringIO(), False)):
        view = LiveView(m.tokenizer, stream, start=P)
        text = api(m).denoise("bcd", gen_length=3, on_step=view.on_step)
        view.finish(text)
        out = stream.getvalue()
        if live:
            assert MASK_CHAR * 2 in out and "\x1b[1;32ma" in out and "\x1b[J" in out
            assert out.endswith("aaa\n")
        else:
            assert out == "aaa\n"


def test_live_view_never_writes_control_characters_from_the_model():
    tok = SimpleNamespace(text=lambda ids: "x\x1b[2Jy\tz")
    stream = Terminal()
    view = LiveView(tok, stream)
    view.on_step(0, np.array([4, 5]), np.array([True, True]))
    assert "\x1b[2J" not in stream.getvalue() and "x\ufffd[2Jy z" in stream.getvalue()


# -- bad input: one line each, never a hang ----------------------------------------------------------

def no_mask_model():
    m = table([0.9])
    m.config.mask_token_id = None
    return m


@pytest.mark.parametrize("opts, match", [
    (dict(gen_length=0), "gen_length must be"),
    (dict(gen_length=-3), "gen_length must be"),
    (dict(gen_length=2.5), "gen_length must be"),
    (dict(gen_length=4, steps=0), "steps must be"),
    (dict(gen_length=4, steps=5), "more than gen_length=4"),
    (dict(gen_length=8, block_length=3), "does not divide gen_length=8"),
    (dict(gen_length=8, block_length=2, steps=6), "not a multiple of the 4 blocks"),
    (dict(gen_length=4, threshold=0.0), "threshold must be in"),
    (dict(gen_length=4, threshold=1.5), "threshold must be in"),
    (dict(gen_length=4, threshold=float("nan")), "threshold must be in"),
    (dict(gen_length=62), "exceeds the context of 64"),
    (dict(gen_length=4, remasking="confidence"), "remasking must be one of"),
    (dict(gen_length=4, schedule="cosine"), "schedule must be one of"),
    (dict(gen_length=4, cache="both"), "cache must be one of"),
    (dict(gen_length=4, eos="ignore"), "eos must be one of"),
    (dict(gen_length=4, cfg_scale=-1.0), "cfg_scale must be"),
    (dict(gen_length=4, temperature=-0.1), "temperature must be"),
    (dict(gen_length=4, top_p=0.0), "top_p must be"),
    (dict(gen_length=4, repeat_penalty=0.0), "repeat_penalty must be"),
    (dict(gen_length=4, repeat_penalty=float("inf")), "repeat_penalty must be"),
    (dict(gen_length=4, threshold=0.5, gap=-1), "gap must be"),
    (dict(gen_length=4, gap=1), "gap spaces the picks"),
    (dict(gen_length=4, repeat_last_n=-1), "repeat_last_n must be"),
    (dict(gen_length=4, threshold=0.9, factor=1.0), "at most one of"),
    (dict(gen_length=4, threshold=0.9, remasking="entropy"), "remasking='entropy'"),
    (dict(gen_length=4, entropy_bound=0.5, schedule="timestep"), "cannot be combined"),
    (dict(gen_length=4, factor=1.0, alg_temp=0.5), "cannot be combined"),
])
def test_bad_options_are_one_line_usage_errors(opts, match):
    with pytest.raises(UsageError, match=match) as e:
        api(table([0.9] * 8)).denoise_ids(PROMPT, **opts)
    assert "\n" not in str(e.value)


def test_bad_inputs_are_one_line_usage_errors():
    m = table([0.9] * 4)
    m.tokenizer = Letters()
    cases = [
        (lambda: api(m).denoise_ids([], gen_length=4), "the prompt is empty"),
        (lambda: api(m).denoise("", gen_length=4), "the prompt is empty"),
        (lambda: api(m).denoise_ids([1, MASK, 3], gen_length=4), "contains the mask token"),
        (lambda: api(m).denoise_ids([1, 99], gen_length=4), "outside the vocabulary"),
        (lambda: api(no_mask_model()).denoise_ids(PROMPT, gen_length=4), "has no mask token"),
        (lambda: api(m).infill("ab[MASK*0]c"), r"empty hole \[MASK\*0\]"),
        (lambda: api(m).infill("ab[MASK*x]c"), "malformed hole"),
        (lambda: api(m).infill("abc"), "no hole"),
        (lambda: api(m).infill("a[MASK*99]"), "exceed the context"),
        (lambda: api(m).infill([1, 2, 3]), "nothing to fill"),
        (lambda: api(m).infill([1, MASK, 3], eos="stop"), "eos='stop'"),
    ]
    for call, match in cases:
        with pytest.raises(UsageError, match=match) as e:
            call()
        assert "\n" not in str(e.value)


def test_mask_token_found_among_the_tokenizers_special_tokens():
    m = no_mask_model()
    m.tokenizer = Letters()
    assert api(m).mask_id == MASK
    assert api(m).denoise_ids(PROMPT, gen_length=1) == [4]
