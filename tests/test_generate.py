"""The Python API of autoregressive generation, on a small transformers-made checkpoint."""
import dataclasses
import os
import threading

import numpy as np
import pytest

import tinydiff
from tinydiff.errors import UsageError

MODEL = os.path.join(os.path.dirname(__file__), "fixtures", "hf", "llama-gqa")


@pytest.fixture(scope="module")
def model():
    return tinydiff.load(MODEL)


def test_stream_pieces_join_to_generate(model):
    pieces = list(model.stream("Once upon a time", 16, temperature=0))
    assert len(pieces) > 1
    assert "".join(pieces) == model.generate("Once upon a time", 16, temperature=0)


def test_generate_returns_only_the_completion_decoded_from_generate_ids(model):
    ids = model.tokenizer.encode("Once upon a time")
    new = model.generate_ids(ids, 10, temperature=0)
    assert len(new) == 10
    assert model.generate("Once upon a time", 10, temperature=0) == model.tokenizer.decode(new)


def test_seed_makes_sampling_reproducible(model):
    a = model.generate("The cat", 20, temperature=1.0, seed=5)
    assert a == model.generate("The cat", 20, temperature=1.0, seed=5)
    others = {model.generate("The cat", 20, temperature=1.0, seed=s) for s in range(6, 10)}
    assert others != {a}


def test_stop_string_cuts_the_completion(model):
    full = model.generate("Once upon a time", 20, temperature=0)
    stop = full[5:8]
    assert model.generate("Once upon a time", 20, temperature=0, stop=[stop]) == full[:full.find(stop)]


def test_generation_stops_at_eos(model):
    # the same model, told that the token greedy decoding produces third is an EOS
    ids = model.tokenizer.encode("Once upon a time")
    new = model.generate_ids(ids, 10, temperature=0)
    stopper = tinydiff.Model(dataclasses.replace(model.config, eos_token_ids=(new[2],)),
                             model.weights, model.tokenizer)
    assert stopper.generate_ids(ids, 10, temperature=0) == new[:3]
    assert stopper.generate("Once upon a time", 10, temperature=0) == model.tokenizer.decode(new[:2])


def test_context_overflow_is_an_error_or_explicit_truncation(model):
    ids = list(range(2, 252))                               # 250 tokens; context is 256
    with pytest.raises(UsageError, match="exceed the context of 256"):
        model.generate_ids(ids, 10, temperature=0)
    out = model.generate_ids(ids, 10, temperature=0, truncate=True)
    assert out == model.generate_ids(ids[4:], 10, temperature=0)


@pytest.mark.parametrize("call", [
    lambda m: m.generate("", 5),
    lambda m: m.generate_ids([], 5),
    lambda m: m.generate("hi", 0),
    lambda m: m.generate("hi", 5, temperature=-1),
    lambda m: m.generate_ids([10**6], 5),
    lambda m: m.logits([]),
])
def test_bad_arguments_raise_usage_errors(model, call):
    with pytest.raises(UsageError):
        call(model)


def test_two_threads_generating_at_once_equal_one_after_the_other(model):
    prompts = ["Once upon a time", "The little dog"]
    sequential = [model.generate(p, 24, temperature=0.9, seed=1) for p in prompts]
    results = [None, None]

    def work(i):
        results[i] = model.generate(prompts[i], 24, temperature=0.9, seed=1)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == sequential


def test_thread_count_does_not_change_the_logits(model):
    ids = model.tokenizer.encode("Once upon a time, there was a little")
    before = model.pool.threads
    try:
        model.pool.threads = 1
        one = model.logits(ids)
        model.pool.threads = tinydiff.engine.kernels.physical_cores()
        many = model.logits(ids)
    finally:
        model.pool.threads = before
    np.testing.assert_allclose(one, many, rtol=0, atol=1e-5)


def test_a_request_is_checked_by_the_model_and_decodes_as_generate_ids(model):
    from tinydiff.decoding.generate import decode_tokens
    request = model.request([5, 6, 7], 8, model.sampling_params(temperature=0))
    tokens = list(decode_tokens(model.transformer, request))
    assert tokens == request.new == model.generate_ids([5, 6, 7], 8, temperature=0)
    assert request.finish_reason in ("stop", "length")
    with pytest.raises(UsageError, match="exceed the context of 8 positions"):
        model.request([5, 6, 7], 6, n_ctx=8)
    with pytest.raises(UsageError, match="params must be a decoding.sampling.SamplingParams"):
        model.request([5, 6, 7], 2, {"temperature": 0})
