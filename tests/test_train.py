"""The corpus reader (tinydiff/training/corpus.py) and the trainer (tinydiff/training/train.py and its
parts: settings, data, losses, torch_llama) on a tiny config: the loss falls, a resumed run equals
an uninterrupted one, the export reads back with the right tensor names and shapes, the mdm mask
rate is t, the block objective predicts what block decoding computes. Trainer tests need torch."""
import csv
import json
import os
import random
import re

import numpy as np
import pytest

from tinydiff.errors import UsageError
from tinydiff.training import corpus, losses, train
from tinydiff.training import data as train_data
from tinydiff.training import settings as train_settings

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "tinystories")
WORDS = ("Once upon a time there was a little girl named Lily . She loved to play with her big red "
         "ball , One day Tom went to the park and saw a dog . They were happy").split()


# ---------------------------------------------------------------------------------------------
# corpus

def test_repair_mojibake():
    bad = "â€œHi,â€\x9d she said. Tomâ€™s â€˜catâ€™ â€” big â€“ small â€¦ onâ€Š/â€Šoff â€œEnd.â€\n"
    good = "“Hi,” she said. Tom’s ‘cat’ — big – small … on\u200a/\u200aoff “End.”\n"
    assert corpus.repair_mojibake(bad) == good


def test_split_stories_endoftext():
    text = "\nOne.  \nTwo lines.\n<|endoftext|>\n\nSecond story.\n<|endoftext|>\nCut in the mid"
    assert corpus.split_stories(text) == ["One.\nTwo lines.", "Second story."]
    assert corpus.split_stories("A.<|endoftext|>B.<|endoftext|>\n") == ["A.", "B."]


def test_split_stories_blank_lines():
    text = ("Spot ran.\n\nThe end.\n\nOnce upon a time, a cat.\n\nIt sat.\n\n"
            "Tom and Mia were best friends. They played.\n\nOnce there was a dog.\n\n")
    assert corpus.split_stories(text) == [
        "Spot ran.\nThe end.", "Once upon a time, a cat.\nIt sat.",
        "Tom and Mia were best friends. They played.", "Once there was a dog."]


def test_split_stories_by_who_is_in_them():
    """A paragraph that opens on a character the story has not named starts a story; one that
    names the story's own characters, opens otherwise, or names no one continues it. A name is a
    word the text capitalises inside a sentence somewhere ('said Sara', 'named Tim')."""
    text = ("Once upon a time, a girl named Sue had a kite.\n\nOne day, the kite flew away and Sue cried.\n\n"
            "Sara liked to help her mom, and Mom said Sara was kind.\n\n"            # new: Sara, not yet named
            "Sara stirred the soup.\n\n"                                           # Sara's own story goes on
            "One day, a little boy named Tim found a rock.\n\n"                      # new: Tim
            "But then, Max came running to Tim.\n\n"                              # opens on 'But': goes on
            "In the barn, there was a horse named Sam, said Tim.\n\n"               # opens on 'In': goes on
            "The End.\n\n")
    stories = corpus.split_stories(text)
    assert [s.split("\n")[0][:12] for s in stories] == ["Once upon a ", "Sara liked t", "One day, a l"]
    assert stories[2].endswith("The End.") and len(stories[2].split("\n")) == 4
    assert corpus.split_paragraphs(stories) == [p for p in text.split("\n\n") if p]


@pytest.mark.skipif(not os.path.isdir(DATA), reason="needs ../shared/data/tinystories")
def test_the_validation_prefix_splits_into_about_its_900_stories():
    stories = corpus.load_stories([os.path.join(DATA, "v1-valid-prefix.txt")])
    assert len(stories) == 945 and len(corpus.split_paragraphs(stories)) == 4356
    assert stories[0].startswith("Spot. Spot saw the shiny car") and stories[1].startswith("Once upon a time, in a big")


def test_read_text_errors(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"ok \xff\xfe")
    (tmp_path / "empty.txt").write_bytes(b" \n")
    with pytest.raises(UsageError, match="invalid UTF-8 at byte 3"):
        corpus.read_text(tmp_path / "bad.txt")
    with pytest.raises(UsageError, match="no text"):
        corpus.read_text(tmp_path / "empty.txt")
    with pytest.raises(UsageError, match="cannot read"):
        corpus.read_text(tmp_path / "missing.txt")


def test_overlap():
    assert corpus.overlap(["a", "b"], ["b", "c", "b"]) == 2


# ---------------------------------------------------------------------------------------------
# trainer

def write_corpus(folder, n, seed):
    rng = random.Random(seed)
    stories = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 60))) for _ in range(n)]
    path = folder / f"stories{seed}.txt"
    path.write_text("\n<|endoftext|>\n".join(stories) + "\n<|endoftext|>\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    return write_corpus(folder, 300, 0), write_corpus(folder, 40, 1)


def run(data, out, *extra, objective="ar"):
    argv = ["--objective", objective, "--data", data[0], "--val", data[1], "--out", str(out),
            "--vocab-size", "300", "--dim", "32", "--layers", "2", "--heads", "4", "--kv-heads", "2",
            "--hidden", "64", "--seq-len", "32", "--batch", "4", "--lr", "1e-2", "--warmup", "5",
            "--tokens", "3840", "--eval-every", "10", "--eval-tokens", "512", "--threads", "1",
            "--export-dtype", "f32", *extra]
    p = __import__("argparse").ArgumentParser()
    train_settings.add_train_arguments(p)
    return train.run_train(p.parse_args(argv))


def log_rows(out):
    with open(os.path.join(out, "log.csv"), newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def ar_run(data, tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("runs") / "ar"
    run(data, out)
    return out


def test_loss_decreases(ar_run):
    rows = log_rows(ar_run)
    assert [int(r["step"]) for r in rows] == [0, 10, 20, 30]
    val = [float(r["val_loss"]) for r in rows]
    assert val[-1] < val[0] - 1.0
    assert float(rows[-1]["train_loss"]) < float(rows[1]["train_loss"])


def test_resume_matches_uninterrupted(ar_run, data, tmp_path):
    torch = pytest.importorskip("torch")
    out = tmp_path / "ar"
    run(data, out, "--stop-after", "13")
    assert int(log_rows(out)[-1]["step"]) == 10
    run(data, out, "--resume")
    strip = [{k: v for k, v in r.items() if k != "elapsed_s"} for r in log_rows(out)]
    assert strip == [{k: v for k, v in r.items() if k != "elapsed_s"} for r in log_rows(ar_run)]
    a = torch.load(os.path.join(ar_run, "checkpoint.pt"), weights_only=False)
    b = torch.load(os.path.join(out, "checkpoint.pt"), weights_only=False)
    assert a["step"] == b["step"] == 30
    for name, t in a["model"].items():
        assert torch.equal(t, b["model"][name]), name


def test_resume_bf16_with_short_phase(data, tmp_path):
    """The other code paths (bf16 autocast, mdm masks, the short-window phase) resume exactly too."""
    torch = pytest.importorskip("torch")
    extra = ("--precision", "bf16", "--short-steps", "4", "--short-len", "8", "--tokens", "1280")
    run(data, tmp_path / "a", *extra, objective="mdm")
    run(data, tmp_path / "b", *extra, "--stop-after", "3", objective="mdm")
    run(data, tmp_path / "b", *extra, "--resume", objective="mdm")
    a = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.equal(t, b[name]) for name, t in a.items())


def expected_shapes(layers, d, hd, heads, kv, f, vocab):
    shapes = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                       p + "self_attn.q_proj.weight": (heads * hd, d), p + "self_attn.k_proj.weight": (kv * hd, d),
                       p + "self_attn.v_proj.weight": (kv * hd, d), p + "self_attn.o_proj.weight": (d, heads * hd),
                       p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                       p + "mlp.down_proj.weight": (d, f)})
    return shapes


def test_export_reads_back(ar_run):
    from tinydiff.formats.safetensors import load_checkpoint
    model = os.path.join(ar_run, "model")
    assert sorted(os.listdir(model)) == ["config.json", "model.safetensors", "tokenizer.json"]
    cfg = json.load(open(os.path.join(model, "config.json")))
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["tie_word_embeddings"] is True and "is_causal" not in cfg
    tok = json.load(open(os.path.join(model, "tokenizer.json")))
    assert cfg["vocab_size"] == len(tok["model"]["vocab"]) == 300
    assert cfg["eos_token_id"] == tok["model"]["vocab"]["<|endoftext|>"]
    ck = load_checkpoint(model)
    want = expected_shapes(2, 32, 8, 4, 2, 64, 300)
    assert {n: ck.shape(n) for n in ck.names} == want
    assert all(ck.dtype(n) == "F32" for n in ck.names)
    best = min(float(r["val_loss"]) for r in log_rows(ar_run))
    assert best == pytest.approx(float(log_rows(ar_run)[-1]["val_loss"]))  # the last was best here


def test_export_matches_transformers(ar_run):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tinydiff.formats.safetensors import load_checkpoint
    model = os.path.join(ar_run, "model")
    cfg = json.load(open(os.path.join(model, "config.json")))
    hf = transformers.LlamaForCausalLM.from_pretrained(model).eval()
    ours = train.build_model(torch, cfg)
    ck = load_checkpoint(model)
    ours.load_state_dict({n: torch.from_numpy(np.array(ck.f32(n))) for n in ck.names})
    ids = torch.randint(0, 298, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf(ids).logits
        got = ours.logits(ours.hidden(ids, causal=True))
    assert torch.allclose(got, want, atol=1e-4)


def test_mdm_run_and_config(data, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "mdm"
    run(data, out, "--tokens", "1280", objective="mdm")
    cfg = json.load(open(os.path.join(out, "model", "config.json")))
    tok = json.load(open(os.path.join(out, "model", "tokenizer.json")))
    assert cfg["is_causal"] is False and cfg["mask_token_id"] == tok["model"]["vocab"]["<|mask|>"]
    val = [float(r["val_loss"]) for r in log_rows(out)]
    assert all(np.isfinite(val)) and val[-1] < val[0]


def test_mlm15_corrupts_as_bert_does():
    torch = pytest.importorskip("torch")
    x = torch.randint(0, 50, (64, 1000), generator=torch.Generator().manual_seed(0))
    xm, chosen = losses.mlm_corrupt(torch, x, 99, 50, torch.Generator().manual_seed(1))
    n = chosen.sum().item()
    assert abs(n / x.numel() - 0.15) < 0.005
    masked, changed = (xm == 99) & chosen, (xm != x) & (xm != 99) & chosen
    assert abs(masked.sum().item() / n - 0.8) < 0.01
    assert abs(changed.sum().item() / n - 0.1 * 49 / 50) < 0.01          # a random id may be the same one
    assert torch.equal(xm[~chosen], x[~chosen])


def test_mlm15_run_and_config(data, tmp_path):
    pytest.importorskip("torch")
    run(data, tmp_path / "bert", objective="mlm15")
    cfg = json.loads((tmp_path / "bert" / "model" / "config.json").read_text())
    assert cfg["is_causal"] is False and "mask_token_id" in cfg and "block_size" not in cfg
    val = [float(r["val_loss"]) for r in log_rows(tmp_path / "bert")]
    assert val[-1] < val[0] - 1.0


def test_mdm_mask_rate():
    torch = pytest.importorskip("torch")
    x = torch.zeros((3, 20000), dtype=torch.int64)
    t = torch.tensor([0.1, 0.5, 0.9])
    xm, m = losses.mdm_mask(torch, x, t, 7, torch.Generator().manual_seed(0))
    assert torch.equal(xm == 7, m)
    assert torch.allclose(m.double().mean(1), t.double(), atol=0.01)


def test_mask_rates_cover_the_range():
    torch = pytest.importorskip("torch")
    t = losses.mask_rates(torch, 8, torch.Generator().manual_seed(1)).sort().values
    assert t.min() >= losses.MDM_EPS and t.max() < 1
    assert torch.allclose(t[1:] - t[:-1], torch.full((7,), (1 - losses.MDM_EPS) / 8), atol=1e-6)


def test_pack_epoch_starts_at_story_starts():
    stories = [np.arange(100 * i, 100 * i + n) for i, n in enumerate([5, 12, 3, 30, 7, 9])]
    seqs = train_data.pack_epoch(stories, 10, seed=0, epoch=0)
    starts = {int(s[0]) for s in stories}
    assert seqs.shape[1] == 10 and all(int(row[0]) in starts for row in seqs)
    assert not np.array_equal(seqs, train_data.pack_epoch(stories, 10, seed=0, epoch=1))


def test_pack_epoch_paragraph_starts():
    """--paragraph-starts 1: every story starts right after one of its newlines (one with none
    starts at its start), still packed whole from there; 0 packs as before."""
    NL, EOT_ = 99, 98
    stories = [np.array([1, 2, NL, 3, 4, NL, 5, EOT_]), np.array([6, 7, EOT_]), np.array([8, NL, 9, 9, 9, EOT_])]
    plain = train_data.pack_epoch(stories, 4, seed=0, epoch=0)
    assert np.array_equal(plain, train_data.pack_epoch(stories, 4, seed=0, epoch=0, paragraph_starts=0.0, newline=NL))
    cut = train_data.pack_epoch(stories, 4, seed=0, epoch=0, paragraph_starts=0.999999, newline=NL).ravel().tolist()
    heads = {(3, 4, NL, 5, EOT_), (5, EOT_), (6, 7, EOT_), (9, 9, 9, EOT_)}
    pieces, piece = [], []
    for t in cut:                                           # the packed stream back into its stories
        piece.append(t)
        if t == EOT_:
            pieces.append(tuple(piece))
            piece = []
    assert pieces and all(p in heads for p in pieces)
    assert 1 not in cut and 8 not in cut                    # no story kept its first paragraph


def test_pack_epoch_unit_ends():
    """--unit-ends 1: every sequence is seq_len tokens of the epoch's stories joined whole, ending
    where a story ends (its EOT) or a paragraph ends (a newline follows in the story); 0 packs as before."""
    NL, EOT_ = 99, 98
    stories = [np.array([1, 2, NL, 3, 4, NL, 5, EOT_]), np.array([6, 7, EOT_]), np.array([8, NL, 9, 9, 9, EOT_]),
               np.array([10, 11, 12, NL, 13, EOT_])]
    plain = train_data.pack_epoch(stories, 4, seed=0, epoch=0)
    assert np.array_equal(plain, train_data.pack_epoch(stories, 4, seed=0, epoch=0, newline=NL, unit_ends=0.0,
                                                       eot=EOT_))
    for epoch in range(5):
        order = np.random.default_rng([0, epoch]).permutation(len(stories))
        stream = np.concatenate([stories[i] for i in order]).tolist()
        rows = train_data.pack_epoch(stories, 4, seed=0, epoch=epoch, newline=NL, unit_ends=0.999999, eot=EOT_)
        assert len(rows) == len(plain)
        for row in rows.tolist():
            at = [i for i in range(len(stream) - 3) if stream[i:i + 4] == row]
            assert at, row                                   # a piece of the joined stories
            assert any(row[-1] == EOT_ or (stream[i + 4:i + 5] == [NL] and row[-1] != NL) for i in at)
            assert row[-1] != NL


def test_unit_ends_run_records_it_and_a_resume_must_keep_it(data, tmp_path):
    pytest.importorskip("torch")
    run(data, tmp_path / "u", "--unit-ends", "0.5", "--tokens", "1280", "--stop-after", "5", objective="mdm")
    assert json.load(open(tmp_path / "u" / "args.json"))["unit_ends"] == 0.5
    with pytest.raises(UsageError, match=r"--resume: --unit-ends 0.25 differs from the run's 0.5"):
        run(data, tmp_path / "u", "--unit-ends", "0.25", "--tokens", "1280", "--resume", objective="mdm")
    run(data, tmp_path / "u", "--tokens", "1280", "--resume", objective="mdm")
    assert [int(r["step"]) for r in log_rows(tmp_path / "u")] == [0, 10]


def test_unit_end_positions_and_val_windows():
    NL, EOT_ = 99, 98
    stream = np.array([1, 2, NL, 3, 4, EOT_, 5, NL, NL, 6, 7, 8, EOT_, 9, 10, 11, 12, 13, 14, EOT_])
    ends = train_data.unit_end_positions(stream, EOT_, NL)
    assert ends.tolist() == [1, 5, 6, 12, 19]
    assert np.array_equal(train_data.val_windows(stream, 5, 20), stream[:20].reshape(4, 5))
    w = train_data.val_windows(stream, 5, 20, unit_ends=0.5, eot=EOT_, newline=NL)
    # windows 1 and 3 of 0..3 move back to the last unit end inside them; 0 and 2 stay
    assert w.tolist() == [stream[0:5].tolist(), stream[2:7].tolist(), stream[10:15].tolist(), stream[15:20].tolist()]


def test_regularised_run_resumes_exactly_and_refuses_other_settings(data, tmp_path):
    torch = pytest.importorskip("torch")
    extra = ("--dropout", "0.1", "--input-mask", "0.1", "--tokens", "1280")
    run(data, tmp_path / "a", *extra)
    run(data, tmp_path / "b", *extra, "--stop-after", "3")
    with pytest.raises(UsageError, match=r"--resume: --dropout 0.2 differs from the run's 0.1"):
        run(data, tmp_path / "b", *extra[2:], "--dropout", "0.2", "--resume")
    run(data, tmp_path / "b", *extra[2:], "--resume")         # the dropout left out: the run's own, args.json's
    a = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.equal(t, b[name]) for name, t in a.items())
    plain = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)
    run(data, tmp_path / "c", "--tokens", "1280")
    other = torch.load(tmp_path / "c" / "checkpoint.pt", weights_only=False)["model"]
    assert not all(torch.equal(t, other[name]) for name, t in plain["model"].items())   # they did something


@pytest.mark.parametrize("extra,words", [
    (("--dropout", "1"), "--dropout must be in [0, 1)"), (("--input-mask", "-0.1"), "--input-mask must be in"),
    (("--paragraph-starts", "2"), "--paragraph-starts must be in"), (("--unit-ends", "1"), "--unit-ends must be in"),
    (("--unit-ends", "0.5"), "--unit-ends is for the bidirectional objectives"),
])
def test_regulariser_flags_are_checked(data, tmp_path, extra, words):
    with pytest.raises(UsageError, match=re.escape(words)):
        run(data, tmp_path / "x", *extra)


def test_input_mask_is_for_the_ar_objective(data, tmp_path):
    with pytest.raises(UsageError, match="--input-mask is a regulariser of the ar objective"):
        run(data, tmp_path / "x", "--input-mask", "0.1", objective="mdm")


def test_lr_schedule():
    assert train.lr_at(0, 100, 1.0, 10) == pytest.approx(0.1)
    assert train.lr_at(10, 100, 1.0, 10) == pytest.approx(1.0)
    assert train.lr_at(100, 100, 1.0, 10) == pytest.approx(0.1)


def test_refuses_existing_out(data, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "x"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="already exists"):
        run(data, out)
    with pytest.raises(UsageError, match="no checkpoint"):
        run(data, out, "--resume")


def test_resume_takes_objective_and_data_from_the_run(data, tmp_path):
    """--resume needs only --out: the objective, data and validation file are the run's own;
    without --resume they are required, in one line."""
    pytest.importorskip("torch")
    p = __import__("argparse").ArgumentParser()
    train_settings.add_train_arguments(p)
    with pytest.raises(UsageError, match="--data is required"):
        train.run_train(p.parse_args(["--objective", "ar", "--val", data[1], "--out", str(tmp_path / "y")]))
    assert not (tmp_path / "y").exists()
    run(data, tmp_path / "x", "--stop-after", "10", "--tokens", "2560", objective="mdm")
    train.run_train(p.parse_args(["--out", str(tmp_path / "x"), "--resume", "--threads", "1"]))
    assert [int(r["step"]) for r in log_rows(tmp_path / "x")] == [0, 10, 20]


def test_without_torch_says_how_to_install(data, tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(UsageError, match=r"pip install 'tinydiff\[train\]'"):
        run(data, tmp_path / "x")
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------------------------
# the block objective (block diffusion)

@pytest.fixture(scope="module")
def block_run(data, ar_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "block"
    run(data, out, "--tokens", "1280", "--block-size", "4", "--init", str(ar_run / "model"), objective="block")
    return out


def test_block_run_starts_from_its_init_and_says_what_it_is(block_run, ar_run):
    cfg = json.load(open(os.path.join(block_run, "model", "config.json")))
    assert (cfg["is_causal"], cfg["block_size"], cfg["shift_logits"]) == (False, 4, True)
    assert cfg["hidden_size"] == json.load(open(os.path.join(ar_run, "model", "config.json")))["hidden_size"]
    val = [float(r["val_loss"]) for r in log_rows(block_run)]
    assert all(np.isfinite(val))
    import tinydiff
    m = tinydiff.load(str(block_run / "model"))
    assert m.config.block_size == 4 and m.config.shifted_logits
    assert len(m.denoise_ids([5, 6, 7, 8], 8, steps=8, eos="keep")) == 8


def test_the_block_objective_predicts_as_block_decoding_does(block_run):
    """What the trainer's pass over [noisy ; clean] predicts for a masked block equals what the
    sampler computes for it after a causal prefill: the model is trained on what it is run on."""
    import torch

    import tinydiff
    from tinydiff.decoding.diffusion import block_logits
    folder = str(block_run / "model")
    cfg = json.load(open(os.path.join(folder, "config.json")))
    net = train.build_model(torch, cfg)
    train.load_init(torch, net, folder)
    L, b, lo = 16, 4, 8
    x = torch.randint(0, cfg["vocab_size"] - 2, (1, L), generator=torch.Generator().manual_seed(0))
    xt = x.clone()
    xt[0, lo:lo + b] = cfg["mask_token_id"]
    pos = torch.arange(L)
    with torch.no_grad():
        h = net.hidden(torch.cat([xt, x], dim=1), losses.block_attention(torch, L, b), torch.cat([pos, pos]))
        src = torch.where(pos % b == 0, L + pos - 1, pos - 1)[lo:lo + b]
        want = net.logits(h[0, src]).numpy()                                  # [b, V]
    t = tinydiff.load(folder).transformer
    state = t.state(L)
    last = t.forward(x[:, :lo].numpy(), state, 0, last_only=True)              # the prompt, causally
    got = block_logits(t, xt.numpy(), state, lo, lo + b, last)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_a_shifted_mdm_from_an_ar_model_predicts_as_tinydiff_reads_it(data, ar_run, tmp_path):
    """--objective mdm --shift-logits --init AR: the trainer's prediction for a masked position
    (row i-1) equals the logits tinydiff gives that position (Dream's shift in canvas_logits)."""
    import torch

    import tinydiff
    from tinydiff.engine.masks import BIDIRECTIONAL
    out = tmp_path / "mdm"
    run(data, out, "--tokens", "1280", "--shift-logits", "--init", str(ar_run / "model"), objective="mdm")
    folder = str(out / "model")
    cfg = json.load(open(os.path.join(folder, "config.json")))
    assert (cfg["is_causal"], cfg["shift_logits"]) == (False, True) and "block_size" not in cfg
    net = train.build_model(torch, cfg)
    train.load_init(torch, net, folder)
    x = torch.randint(0, cfg["vocab_size"] - 2, (1, 16), generator=torch.Generator().manual_seed(0))
    x[0, [3, 4, 9]] = cfg["mask_token_id"]
    with torch.no_grad():
        want = net.logits(net.hidden(x, causal=False))[0, [2, 3, 8]].float().numpy()   # the rows before them
    got = tinydiff.load(folder).logits(x[0].tolist(), mask=BIDIRECTIONAL)[[3, 4, 9]]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    with pytest.raises(UsageError, match="--shift-logits is a choice of the mdm objective"):
        run(data, tmp_path / "x", "--shift-logits")


def test_curves_put_runs_on_one_axis_in_epochs_and_bits_per_byte(data, ar_run, tmp_path, capsys):
    """tinydiff curves: x = training tokens / the training stories' tokens, y = validation nats
    per token / ln 2 / the validation windows' bytes per token, read back from the run's data."""
    import argparse

    from tinydiff.training import curves
    run(data, tmp_path / "bert", "--tokens", "1280", objective="mlm15")
    enc = __import__("tinydiff.formats.bpe", fromlist=["BPE"]).BPE(json.load(open(ar_run / "tokenizer.json")))
    train_tokens = sum(len(enc.encode(s)) + 1 for s in corpus.load_stories([data[0]]))
    eot = train_data.EOT
    windows = train_data.val_windows(np.array(enc.encode(eot.join(corpus.load_stories([data[1]])) + eot)), 32, 512)
    bpt = len(enc.decode(windows.ravel().tolist()).encode()) / windows.size
    rows = log_rows(ar_run)
    want = [(int(r["tokens"]) / train_tokens, float(r["val_loss"]) / np.log(2) / bpt) for r in rows]
    np.testing.assert_allclose(curves.run_curve(str(ar_run)), want, rtol=1e-12)
    p = argparse.ArgumentParser()
    curves.add_curves_arguments(p)
    curves.run_curves(p.parse_args([str(ar_run), str(ar_run), "--label", "ar", "--label", "again",
                                    "-o", str(tmp_path / "c.svg")]))
    svg = (tmp_path / "c.svg").read_text()
    assert svg.count("<polyline") == 2 and 'class="again"' in svg
    assert f"best {min(y for _, y in want):.4f} bits per byte" in capsys.readouterr().out
    with pytest.raises(UsageError, match="per chosen token"):
        curves.run_curve(str(tmp_path / "bert"))


def test_curves_continue_a_run_started_from_another_runs_export(data, ar_run, tmp_path, monkeypatch):
    """--init RUN/model of the same objective: the curve's epochs go on from the export's (the best
    evaluation's tokens); from another objective's export they start at 0. A relative --init is
    found from the run's own folder too (as the shipped stages keep theirs)."""
    from tinydiff.training import curves
    run(data, tmp_path / "m1", "--tokens", "1280", objective="mdm")
    run(data, tmp_path / "m2", "--tokens", "1280", "--unit-ends", "0.5", "--init", str(tmp_path / "m1" / "model"),
        objective="mdm")
    first, second = curves.run_curve(str(tmp_path / "m1")), curves.run_curve(str(tmp_path / "m2"))
    best = min(log_rows(tmp_path / "m1"), key=lambda r: float(r["val_loss"]))
    assert first[0][0] == 0 and second[0][0] == pytest.approx(first[[r["step"] for r in log_rows(
        tmp_path / "m1")].index(best["step"])][0])
    assert second[0][0] > 0 and [x for x, _ in second] == sorted(x for x, _ in second)
    settings = json.loads((tmp_path / "m2" / "args.json").read_text())
    (tmp_path / "m2" / "args.json").write_text(json.dumps(dict(settings, init="../m1/model")))
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")                 # where ../m1/model is no folder
    assert curves.run_curve(str(tmp_path / "m2")) == second
    run(data, tmp_path / "m3", "--tokens", "1280", "--init", str(ar_run / "model"), objective="mdm")
    assert curves.run_curve(str(tmp_path / "m3"))[0][0] == 0


def test_curves_refuse_what_is_not_a_run(tmp_path):
    from tinydiff.training import curves
    with pytest.raises(UsageError, match="cannot read"):
        curves.run_curve(str(tmp_path))
    (tmp_path / "args.json").write_text("{}")
    with pytest.raises(UsageError, match="args.json has no 'objective'; is it a tinydiff train run folder"):
        curves.run_curve(str(tmp_path))


def handmade_run(data, out, objective="mdm"):
    """A run folder as tinydiff train leaves it (args.json, tokenizer.json, log.csv), made without torch."""
    from tinydiff.formats import bpe
    out.mkdir()
    settings = {"objective": objective, "data": [data[0]], "val": data[1], "seq_len": 32, "eval_tokens": 512,
                "unit_ends": 0.0, "init": None}
    (out / "args.json").write_text(json.dumps(settings))
    bpe.save_tokenizer_json(bpe.train_bpe(corpus.load_stories([data[0]]), 300, [train_data.EOT, train_data.MASK]),
                            out / "tokenizer.json")
    (out / "log.csv").write_text("step,tokens,lr,train_loss,val_loss,elapsed_s\n0,0,0.001,,5.5,1\n"
                                 "10,1280,0.01,4.0,3.5,2\n20,2560,0.01,3.0,3.0,3\n", encoding="utf-8")
    return out


def edit_json(name, **fields):
    def edit(out):
        obj = json.loads((out / name).read_text())
        (out / name).write_text(json.dumps(dict(obj, **fields)))
    return edit


def write(name, content):
    def edit(out):
        (out / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return edit


def tokenizer_without_mask(out):
    obj = json.loads((out / "tokenizer.json").read_text())
    obj["added_tokens"] = [t for t in obj["added_tokens"] if t["content"] != train_data.MASK]
    (out / "tokenizer.json").write_text(json.dumps(obj))


LOG_HEAD = "step,tokens,lr,train_loss,val_loss,elapsed_s\n"


@pytest.mark.parametrize("damage,words", [
    (write("log.csv", b"step,tokens,val_loss\n0,0,5.5\n\xff\xfe,\xec\n"), "log.csv: invalid UTF-8 at byte"),
    (write("log.csv", LOG_HEAD + "0,0,0.001,,5.5,1\n10,abc,0.01,4.0,3.5,2\n"),
     "log.csv: line 3: 'tokens' should be a count of tokens, got 'abc'"),
    (write("log.csv", LOG_HEAD + "0,-5,0.001,,5.5,1\n"), "log.csv: line 2: 'tokens' should be a count"),
    (write("log.csv", "step,-tokens,lr,train_loss,val_loss,elapsed_s\n0,0,0.001,,5.5,1\n"),
     "log.csv: no 'tokens' column in its header"),
    (write("log.csv", LOG_HEAD + "0,0,0.001,,nan,1\n"), "log.csv: line 2: 'val_loss' should be a loss"),
    (write("log.csv", LOG_HEAD + "0,0,0.001,,x,1\n"), "log.csv: line 2: 'val_loss' should be a loss"),
    (edit_json("args.json", seq_len=0), "args.json: field 'seq_len' should be a positive whole number, got 0"),
    (edit_json("args.json", seq_len="x"), "args.json: field 'seq_len' should be a positive whole number, got \"x\""),
    (edit_json("args.json", eval_tokens=1.5), "args.json: field 'eval_tokens' should be a positive whole number"),
    (edit_json("args.json", unit_ends="x"), "args.json: field 'unit_ends' should be a share in [0, 1), got \"x\""),
    (edit_json("args.json", unit_ends=1), "args.json: field 'unit_ends' should be a share in [0, 1)"),
    (edit_json("args.json", val=None), "args.json: field 'val' should be a validation file, got null"),
    (edit_json("args.json", data="stories.txt"), "args.json: field 'data' should be a list of training files"),
    (edit_json("args.json", objective="gpt"), "args.json: field 'objective' should be one of ar, mdm"),
    (edit_json("args.json", init=5), "args.json: field 'init' should be a model folder or null, got 5"),
    (edit_json("args.json", init="."), "args.json: field 'init' leads back to"),
    (write("args.json", b'{"objective": "\xff"}'), "args.json: invalid UTF-8 at byte 15"),
    (write("args.json", "{"), "args.json: not valid JSON"),
    (write("args.json", "[1, 2]"), "args.json: not a JSON object"),
    (write("tokenizer.json", "{}"), "tokenizer.json: field 'model' should be the BPE model, got null"),
    (write("tokenizer.json", "[]"), "tokenizer.json: not a JSON object"),
    (edit_json("tokenizer.json", model={"type": "BPE", "vocab": [], "merges": []}),
     "tokenizer.json: field 'model.vocab' should map token strings to ids"),
    (tokenizer_without_mask, "tokenizer.json: has no special token <|mask|>"),
])
def test_curves_name_the_damaged_file_of_a_run(data, tmp_path, monkeypatch, capsys, damage, words):
    """tinydiff curves on a run folder with a damaged file: one line naming the file (and the
    field, the line), exit status 1 (a ModelError), no picture; the undamaged folder draws."""
    from tinydiff import cli
    out = handmade_run(data, tmp_path / "run")
    monkeypatch.chdir(out)                           # where an --init of "." is the run itself
    assert cli.main(["curves", "-o", str(tmp_path / "ok.svg"), str(out)]) == 0
    capsys.readouterr()
    damage(out)
    assert cli.main(["curves", "-o", str(tmp_path / "c.svg"), str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"tinydiff: error: {out}") and words in err and err.count("\n") == 1, err
    assert not (tmp_path / "c.svg").exists()


RUN_FLAGS = ("--objective", "ar", "--vocab-size", "300", "--dim", "32", "--layers", "2", "--heads", "4",
             "--seq-len", "32", "--batch", "4", "--eval-tokens", "512")


@pytest.mark.parametrize("extra,words", [
    (("--vocab-size", "0"), "--vocab-size 0 leaves no room for the 256 bytes and the 2 special tokens"),
    (("--vocab-size", "10"), "--vocab-size 10 leaves no room for the 256 bytes"),
    (("--seed", "-1"), "--seed must be from 0 to 2**32 - 1, got -1"),
    (("--seed", str(2**32)), "--seed must be from 0 to 2**32 - 1"),
    (("--lr", "inf"), "--lr must be positive and finite, got inf"),
    (("--lr", "0"), "--lr must be positive and finite"),
    (("--tokens", "inf"), "--tokens must be positive and finite"),
    (("--weight-decay", "nan"), "--weight-decay must be 0 or more and finite, got nan"),
    (("--weight-decay", "-1"), "--weight-decay must be 0 or more"),
    (("--warmup", "-1"), "--warmup must be 0 or more, got -1"),
    (("--checkpoint-minutes", "-1"), "--checkpoint-minutes must be 0 or more, got -1.0"),
    (("--checkpoint-minutes", "nan"), "--checkpoint-minutes must be 0 or more, got nan"),
    (("--stop-after", "-1"), "--stop-after must be 0 or more, got -1"),
    (("--threads", "0"), "--threads must be between 1 and"),
    (("--threads", "100000"), "--threads must be between 1 and"),
    (("--block-size", "0"), "--block-size is a setting of the block objective; ar has no blocks"),
    (("--block-size", "8"), "--block-size is a setting of the block objective; ar has no blocks"),
    (("--objective", "mdm", "--block-size", "4"), "--block-size is a setting of the block objective; mdm has"),
    (("--objective", "block", "--block-size", "0"), "--block-size must be positive, got 0"),
    (("--objective", "block", "--block-size", "5"), "--block-size 5 must divide --seq-len 32"),
    (("--dim", "0"), "--dim must be positive"),
    (("--heads", "3"), "--dim 32 must split into --heads 3 heads of even size"),
])
def test_bad_train_flags_are_refused_before_the_run_folder_is_made(data, tmp_path, monkeypatch, capsys, extra,
                                                                   words):
    """Each a one-line UsageError (exit 2) before torch is imported (here it cannot be) and before
    --out is made, so the corrected command runs in the same folder."""
    from tinydiff import cli
    monkeypatch.setitem(__import__("sys").modules, "torch", None)      # makes `import torch` fail
    out = tmp_path / "run"
    assert cli.main(["train", "--data", data[0], "--val", data[1], "--out", str(out), *RUN_FLAGS, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tinydiff: error: ") and words in err and err.count("\n") == 1, err
    assert not out.exists()


def test_a_refused_force_keeps_the_old_run(data, tmp_path, monkeypatch):
    """--force clears the old run's files only once the new flags pass."""
    monkeypatch.setitem(__import__("sys").modules, "torch", None)
    out = tmp_path / "run"
    out.mkdir()
    (out / "args.json").write_text("{}")
    with pytest.raises(UsageError, match="--lr must be positive"):
        run(data, out, "--force", "--lr", "inf")
    with pytest.raises(UsageError, match="--dim must be positive"):
        run(data, out, "--force", "--dim", "0")
    assert (out / "args.json").read_text() == "{}"


def test_block_size_defaults_to_8_for_the_block_objective_only(data, tmp_path):
    p = __import__("argparse").ArgumentParser()
    train_settings.add_train_arguments(p)
    base = ["--data", data[0], "--val", data[1], "--out", str(tmp_path / "run")]
    assert train_settings.settle_settings(p.parse_args([*base, "--objective", "block"])).block_size == 8
    assert train_settings.settle_settings(p.parse_args([*base, "--objective", "ar"])).block_size is None
    assert not (tmp_path / "run").exists()


def test_init_with_a_bad_config_is_one_line(data, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"hidden_size": "x", "num_hidden_layers": 2}))
    with pytest.raises(UsageError, match="field 'hidden_size' should be a positive whole number, got 'x'"):
        run(data, tmp_path / "run", "--init", str(tmp_path / "m"))
    assert not (tmp_path / "run").exists()


def test_block_size_must_divide_the_sequence(data, tmp_path):
    pytest.importorskip("torch")
    with pytest.raises(UsageError, match="--block-size 5 must divide --seq-len 32"):
        run(data, tmp_path / "b", "--block-size", "5", objective="block")
