import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tinydiff.decoding import sampling as S
from tinydiff.decoding.generate import _split_at_stop, stream_text
from tinydiff.decoding.sampling import Sampler, SamplingParams, distribution, penalize
from tinydiff.errors import UsageError


def params(**kw):
    return SamplingParams(**{"top_k": 0, "top_p": 1.0, "min_p": 0.0, **kw})


def sampler(**kw):
    return Sampler(params(**kw))


def test_greedy_is_argmax_and_ignores_the_seed():
    logits = np.array([0.1, 3.0, -1.0, 2.9], np.float32)
    picks = {sampler(temperature=0, seed=s)(logits, []) for s in range(20)}
    assert picks == {1}


def test_same_seed_same_draws_different_seed_different_draws():
    logits = np.zeros(1000, np.float32)
    s1, s2, s3 = sampler(temperature=1.0, seed=7), sampler(temperature=1.0, seed=7), sampler(temperature=1.0, seed=8)
    draws1 = [s1(logits, []) for _ in range(50)]
    assert draws1 == [s2(logits, []) for _ in range(50)]
    assert draws1 != [s3(logits, []) for _ in range(50)]


def test_top_k_keeps_only_the_k_best():
    logits = np.array([5.0, 4.0, 3.0, 2.0, 1.0], np.float32)
    s = sampler(temperature=5.0, top_k=2, seed=0)
    assert {s(logits, []) for _ in range(300)} == {0, 1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    probs = distribution(np.log(p).astype(np.float32), params(temperature=1.0, top_p=0.8))
    assert list(np.flatnonzero(probs)) == [0, 1]
    np.testing.assert_allclose(probs[:2], [0.5 / 0.8, 0.3 / 0.8], rtol=1e-6)


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    probs = distribution(np.log(p).astype(np.float32), params(temperature=1.0, min_p=0.2))
    assert list(np.flatnonzero(probs)) == [0, 1, 2]          # 0.05 < 0.2 * 0.5


def test_temperature_sharpens_the_distribution():
    logits = np.log(np.array([0.6, 0.4])).astype(np.float32)
    hot = distribution(logits, params(temperature=2.0))
    cold = distribution(logits, params(temperature=0.5))
    assert hot[0] < 0.6 < cold[0]
    np.testing.assert_allclose(cold[0], 0.36 / (0.36 + 0.16), rtol=1e-5)


def test_draw_frequencies_follow_the_probabilities():
    logits = np.log(np.array([0.7, 0.2, 0.1])).astype(np.float32)
    s = sampler(temperature=1.0, seed=1)
    counts = np.bincount([s(logits, []) for _ in range(4000)], minlength=3) / 4000
    np.testing.assert_allclose(counts, [0.7, 0.2, 0.1], atol=0.03)


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    logits = np.array([2.0, -2.0, 1.9, 0.0], np.float32)
    s = sampler(temperature=0, repeat_penalty=2.0)
    out = penalize(logits, [0, 1, 1], 2.0, 64)
    np.testing.assert_allclose(out, [1.0, -4.0, 1.9, 0.0])
    assert s(logits, [0]) == 2
    assert logits[0] == 2.0                     # the caller's row is not modified


@pytest.mark.parametrize("penalty", [1e-320, 1e-40, 1e30, 1e300])
def test_a_penalty_past_floats_range_keeps_the_logits_finite(penalty):
    """HF's rule on float32 logits overflows (5 / 1e-40 = inf, and 0 x float32(1e300) = 0 x inf =
    NaN), which left nothing to sample from: the results stop at the type's largest number, zeros
    stay zero, and every temperature still draws."""
    logits = np.array([5.0, -3.0, 0.0, 1.0], np.float32)
    out = penalize(logits, [0, 1, 2], penalty, 64)
    assert out.dtype == np.float32 and np.isfinite(out).all() and out[2] == 0 and out[3] == 1
    assert (out[0] > 1) == (penalty < 1) and (out[1] < -3) == (penalty > 1)
    for temperature in (0, 0.7):
        assert 0 <= sampler(temperature=temperature, repeat_penalty=penalty, seed=1)(logits, [0, 1, 2]) < 4
    z = logits[None].astype(np.float64)
    near = S.penalize_near(z.copy(), np.array([3]), np.array([0, 1, 2, 3]), np.array([1, 1, 1, 0], bool), penalty, 4)
    assert np.isfinite(near).all() and near[0, 2] == 0 and near[0, 3] == 1


def test_repeat_last_n_limits_the_look_back():
    logits = np.array([2.0, 1.9], np.float32)
    s = sampler(temperature=0, repeat_penalty=2.0, repeat_last_n=1)
    assert s(logits, [0, 1]) == 0               # only token 1 is penalised


@pytest.mark.parametrize("last_n", [0, 1, 3, 100])
def test_penalize_near_is_penalize_with_the_known_tokens_near_each_row(last_n):
    """Row r of penalize_near equals penalize() given, as history, the tokens at known canvas
    positions within last_n of positions[r], on either side."""
    rng = np.random.default_rng(3)
    L, V = 40, 12
    canvas, known = rng.integers(0, V, L), rng.random(L) < 0.5
    positions = np.flatnonzero(~known)
    z = rng.standard_normal((len(positions), V))
    out = S.penalize_near(z.copy(), positions, canvas, known, 1.7, last_n)
    for r, j in enumerate(positions):
        near = [int(canvas[p]) for p in range(L) if known[p] and abs(p - j) <= last_n]
        np.testing.assert_array_equal(out[r], penalize(z[r], near, 1.7, len(near)))
    if last_n == 100:                                   # every known token reaches every row
        assert (out != z).sum() == len(positions) * len(np.unique(canvas[known]))


@pytest.mark.parametrize("kw", [dict(temperature=-0.1), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5),
                                dict(min_p=-0.1), dict(repeat_penalty=0.0), dict(repeat_penalty=float("inf")),
                                dict(repeat_last_n=-1)])
def test_bad_sampling_parameters_are_usage_errors(kw):
    with pytest.raises(UsageError):
        SamplingParams(**kw)


@given(st.text(max_size=30), st.lists(st.text(min_size=1, max_size=4), max_size=3))
@settings(max_examples=300, deadline=None)
@example("100", ["0", "100"])    # overlapping stops: the one complete first wins
def test_stop_strings_cut_exactly_before_the_first_stop(text, stops):
    # feed the text one character at a time, as tokens would arrive
    pieces, pending = [], ""
    for ch in text:
        piece, pending, stopped = _split_at_stop(pending + ch, stops)
        pieces.append(piece)
        if stopped:
            break
    else:
        pieces.append(_split_at_stop(pending, stops, final=True)[0])
    # generation halts as soon as a stop string is complete (as llama.cpp's does), so the cut is at
    # the first stop found in the shortest prefix that holds one: with stops "0" and "100", "100"
    # never completes, since "10" already holds "0"
    end = next((e for e in range(len(text) + 1) if any(s in text[:e] for s in stops)), None)
    expected = text if end is None else text[:min(i for i in (text[:end].find(s) for s in stops) if i >= 0)]
    assert "".join(pieces) == expected


class ByteTokenizer:
    """One token per byte: splits multi-byte characters across tokens."""
    special_ids = {256}

    def decode_bytes(self, ids):
        return bytes(ids)


def test_stream_text_keeps_utf8_characters_whole_across_tokens():
    text = "héllo 日本 🙂!"
    pieces = list(stream_text(ByteTokenizer(), list(text.encode()), stop_ids={999}, stop_strings=None))
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_stream_text_stops_at_eos_and_skips_special_tokens():
    ids = list(b"ab") + [256] + list(b"cd") + [999] + list(b"ef")
    assert "".join(stream_text(ByteTokenizer(), ids, {999}, None)) == "abcd"
    assert "".join(stream_text(ByteTokenizer(), list(b"one. two"), {999}, ["."])) == "one"
