"""Several sequences in one pass: each at its own position, each ending on its own, equal to running alone."""
import json
import os

import numpy as np
import pytest

import tinydiff
from tinydiff.cli import main
from tinydiff.errors import UsageError

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15], [3], [40, 41]]


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-bias", "llama3-rope"])
def test_a_batch_gives_each_prompt_what_it_gives_alone(name):
    model = tinydiff.load(os.path.join(HF, name))
    steps = [10, 4, 12, 7]
    alone = [model.generate_ids(p, n, temperature=0) for p, n in zip(PROMPTS, steps)]
    assert model.generate_ids(PROMPTS, steps, temperature=0) == alone
    seeds = [1, 2, 3, 4]
    alone = [model.generate_ids(p, 9, temperature=1.0, top_k=0, seed=s) for p, s in zip(PROMPTS, seeds)]
    assert model.generate_ids(PROMPTS, 9, temperature=1.0, top_k=0, seed=seeds) == alone


def test_a_sequence_that_ends_leaves_the_batch_and_the_others_go_on():
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    first = model.generate_ids(PROMPTS[0], 12, temperature=0)
    stopping = tinydiff.Model(model.config, model.weights, model.tokenizer)
    stopping.stop_ids = frozenset({first[2]})
    with tinydiff.Ledger() as led:
        out = stopping.generate_ids(PROMPTS[:2], 12, temperature=0)
    assert out[0] == first[:3] and len(out[1]) > 3
    rows = [p["tokens"] for p in led.passes[2:]]             # after the two prefills: the decode steps
    assert rows == [2, 2] + [1] * (len(out[1]) - 3)


def test_a_decode_pass_reads_the_weights_once_for_all_its_sequences():
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    with tinydiff.Ledger() as one:
        model.generate_ids(PROMPTS[0], 4, temperature=0)
    with tinydiff.Ledger() as four:
        model.generate_ids([PROMPTS[0]] * 4, 4, temperature=0)
    single, batched = one.passes[-1], four.passes[-1]
    assert batched["tokens"] == 4 * single["tokens"] == 4

    def matrices(p):   # the weights a pass reads but the embedding rows, one per token
        return p["bytes"]["weights"] - p["by_op"]["embedding"]["bytes"]["weights"]
    assert matrices(batched) == matrices(single) > 0.9 * single["bytes"]["weights"]   # per token: a quarter
    assert batched["by_op"]["embedding"]["bytes"]["weights"] == 4 * single["by_op"]["embedding"]["bytes"]["weights"]
    assert batched["flops"] == 4 * single["flops"]


def test_forward_with_a_start_per_sequence_equals_each_pass_alone():
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    t = model.transformer
    a, b = [5, 6, 7, 8, 9], [10, 11]
    alone = [t.forward(np.array([ids]), t.state(8), 0)[-1] for ids in (a, b)]
    state = t.state(8, batch=3)
    t.forward(np.array([a[:-1]]), state, 0, slots=[2])
    t.forward(np.array([b[:-1]]), state, 0, slots=[0])
    both = t.forward(np.array([[a[-1]], [b[-1]]]), state, [len(a) - 1, len(b) - 1], slots=[2, 0])
    np.testing.assert_allclose(both, np.stack(alone), rtol=0, atol=1e-5)


def test_batch_strings_and_bad_batches():
    model = tinydiff.load("stories5m-ar")
    prompts = ["Once upon a time", "The dog", "Lily"]
    assert model.generate(prompts, 12, temperature=0) == [model.generate(p, 12, temperature=0) for p in prompts]
    with pytest.raises(UsageError, match="seed: 2 values for 3 prompts"):
        model.generate(prompts, 4, seed=[1, 2])
    with pytest.raises(UsageError, match="max_new_tokens: 4 values for 3 prompts"):
        model.generate_ids([[1], [2], [3]], [1, 2, 3, 4])
    with pytest.raises(UsageError, match="the prompt is empty"):
        model.generate_ids([[1], []], 4)
    with pytest.raises(UsageError, match="temperature must be >= 0"):
        model.generate_ids([[1], [2]], 4, temperature=[0.5, -1])
    with pytest.raises(UsageError, match="masked-diffusion model"):
        tinydiff.load("stories5m-mdm").generate_ids([[1], [2]], 4)


def test_bench_batched_decoding(capsys):
    model = os.path.join(HF, "llama-gqa")
    assert main(["bench", "-m", model, "-p", "4", "-n", "3", "--npl", "2,4", "-d", "4x1", "-b", "8x8x8", "-r", "1",
                 "--json", "--no-roofline"]) == 0
    rows = {r["test"]: r for r in json.loads(capsys.readouterr().out)}
    assert {"tg3", "tg3x2", "tg3x4"} <= set(rows)
    d = tinydiff.load(model).config.hidden_size
    # the same matrices read once a pass; only the 3 more sequences' embedding rows (f32) are extra
    assert rows["tg3x4"]["tokens"] == 12 and rows["tg3x4"]["weight_bytes"] - rows["tg3"]["weight_bytes"] == 3 * 3 * d * 4
    assert rows["tg3x4"]["flops"] == 4 * rows["tg3"]["flops"]
    assert main(["bench", "-m", model, "-p", "4", "-n", "3", "--npl", "2", "-d", "4x1", "-b", "8x8x8", "-r", "1",
                 "--no-roofline"]) == 0
    assert f"{model} tg3x2: " in capsys.readouterr().out
    assert main(["bench", "-m", model, "--npl", "0,2"]) == 2
    assert "--npl takes batch sizes 1-1024" in capsys.readouterr().err


def test_bench_repetitions_go_round_the_tests(monkeypatch):
    """Round 1 runs every test once, then round 2: a change of the machine's pace between rounds
    falls on every test alike, and their ratios are taken side by side."""
    from tinydiff.measure import bench as B
    order, real = [], B.prepare

    def spy(model, kind, n, steps, block, rng):
        run = real(model, kind, n, steps, block, rng)
        return lambda: order.append(f"{kind}{n}x{block}") or run()

    monkeypatch.setattr(B, "prepare", spy)
    results = B.bench(tinydiff.load(os.path.join(HF, "llama-gqa")), "m", ["pp4", "tg3", "tg3x2"], repetitions=2)
    assert order == ["pp8x0"] + ["pp4x0", "tg3x1", "tg3x2"] * 2     # the warm-up, then two rounds
    assert [(r.test, len(r.seconds), r.tokens) for r in results] == [("pp4", 2, 4), ("tg3", 2, 3), ("tg3x2", 2, 6)]


# -- masked diffusion ----------------------------------------------------------------------------

PROMPTS_TEXT = ["Once upon a time", "The dog ran", "Lily"]


@pytest.mark.parametrize("name, options", [
    ("stories5m-mdm", dict(steps=8)),
    ("stories5m-mdm", dict(steps=[8, 8, 12], temperature=0.8, seed=[1, 2, 3], cache=[None, "dual", "prefix"],
                           block_length=8)),
    ("stories5m-mdm", dict(steps=16, threshold=0.5, cfg_scale=[0, 1.5, 0])),
    ("stories5m-bd", dict(steps=8)),
])
def test_a_diffusion_batch_gives_each_prompt_what_it_gives_alone(name, options):
    model = tinydiff.load(name)
    lengths = [16, 8, 24] if isinstance(options["steps"], list) else 16
    each = [{k: v[i] if isinstance(v, list) else v for k, v in options.items()} for i in range(3)]
    alone = [model.denoise(p, n, **o) for p, n, o in zip(PROMPTS_TEXT, np.broadcast_to(lengths, 3), each)]
    assert model.denoise(PROMPTS_TEXT, lengths, **options) == alone


def test_a_diffusion_batch_runs_one_pass_a_step_for_all():
    model = tinydiff.load("stories5m-mdm")
    ids = [model.encode_prompt(p) for p in PROMPTS_TEXT]
    with tinydiff.Ledger() as led:
        model.denoise_ids(ids, 8, steps=4, eos="keep")
    assert [p["tokens"] for p in led.passes] == [sum(len(i) + 8 for i in ids)] * 4
    with tinydiff.Ledger() as one:
        model.denoise_ids(ids[0], 8, steps=4, eos="keep")
    assert led.passes[0]["by_op"]["mlp"]["bytes"]["weights"] == one.passes[0]["by_op"]["mlp"]["bytes"]["weights"]


def test_bad_diffusion_batches():
    model = tinydiff.load("stories5m-mdm")
    with pytest.raises(UsageError, match="gen_length: 2 values for 3 prompts"):
        model.denoise(PROMPTS_TEXT, [8, 8])
    with pytest.raises(UsageError, match="on_step follows one run"):
        model.denoise(PROMPTS_TEXT, 8, on_step=print)
    with pytest.raises(UsageError, match="steps=9 is more than gen_length=8"):
        model.denoise(PROMPTS_TEXT, 8, steps=[8, 9, 8])
