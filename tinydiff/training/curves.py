"""`tinydiff curves`: the validation loss of several training runs against epochs, on one axis, in
bits per byte (Prabhudesai et al. 2025's figure: AR against masked diffusion as the data repeats).

    tinydiff curves runs/ar runs/mdm -o twins.svg

A run folder is what `tinydiff train` writes (args.json, tokenizer.json, log.csv). Its log gives
validation nats per token at each evaluation; its args.json names the training and validation
files, which are read again (from where they were) to turn tokens into epochs (training tokens
seen / tokens in the training stories) and nats per token into bits per byte (the validation
windows' tokens / their UTF-8 bytes). A run started (--init) from another run's export of the
same objective continues its curve: its epochs count from that export's. An AR run's curve is its
exact NLL, a masked-diffusion run's its ELBO, a block run's its block ELBO plus the clean half's
next-token loss (an upper bound twice over, drawn for the shape of the curve); an mlm15 run's loss
is per chosen token, no bound on the text, and is refused.
"""
import csv
import json
import math
import os

from ..errors import UsageError
from ..formats import bpe
from . import corpus

COLORS = ("#1f5fa8", "#b3261e", "#2e7d32", "#8e24aa", "#ef6c00", "#546e7a", "#6d4c41", "#00838f")


def add_curves_arguments(p):
    p.add_argument("runs", nargs="+", help="run folders of tinydiff train")
    p.add_argument("-o", "--output", required=True, help="the .svg to write")
    p.add_argument("--label", action="append", default=None, help="a name for each run, in order (default: its folder)")


def run_curve(out):
    """[(epochs, validation bits per byte)] of the run folder `out`, from its log.csv."""
    settings = _read_json(os.path.join(out, "args.json"))
    missing = [k for k in ("objective", "data", "val", "seq_len", "eval_tokens") if k not in settings]
    if missing:
        raise UsageError(f"{out}: args.json has no {missing[0]!r}; is it a tinydiff train run folder?")
    if settings["objective"] == "mlm15":
        raise UsageError(f"{out}: an mlm15 run's loss is per chosen token, not a bound on the text")
    from . import train  # the trainer's own reading of its data
    enc = bpe.BPE(_read_json(os.path.join(out, "tokenizer.json")))
    train_ids, val_ids = train.encode_data(enc, corpus.load_stories(settings["data"]),
                                           corpus.load_stories([settings["val"]]))
    train_tokens = sum(map(len, train_ids))
    windows = train.val_windows(val_ids, settings["seq_len"], settings["eval_tokens"], settings.get("unit_ends", 0.0),
                                enc.specials[train.EOT], train.newline_id(enc))
    bytes_per_token = len(enc.decode(windows.ravel().tolist()).encode("utf-8")) / windows.size
    rows = _log_rows(out)
    if not rows:
        raise UsageError(f"{out}: log.csv holds no validation loss yet")
    before = _tokens_before(settings, out)
    return [((before + int(r["tokens"])) / train_tokens, float(r["val_loss"]) / math.log(2) / bytes_per_token)
            for r in rows]


def _log_rows(out):
    try:
        with open(os.path.join(out, "log.csv"), newline="") as f:
            return [r for r in csv.DictReader(f) if r.get("val_loss")]
    except OSError as e:
        raise UsageError(f"{out}: cannot read log.csv ({e.strerror})") from None


def _tokens_before(settings, out, depth=0):
    """Training tokens of the same objective before the run in folder `out` when it continues
    another (--init from a run's export, RUN/model, or from a folder that keeps its run's args.json
    and log.csv): the tokens at the evaluation whose model was exported (the best), and those before
    that run. A relative --init is found from here or, failing that, from `out` (shipped runs keep
    theirs that way, so that they chain from any folder)."""
    init = settings.get("init")
    if not init or depth > 32:
        return 0
    if not os.path.exists(init):
        init = os.path.join(out, init)
    for folder in (init, os.path.dirname(os.path.normpath(init))):
        if os.path.exists(os.path.join(folder, "args.json")) and os.path.exists(os.path.join(folder, "log.csv")):
            prev = _read_json(os.path.join(folder, "args.json"))
            rows = _log_rows(folder)
            if prev.get("objective") != settings.get("objective") or not rows:
                return 0
            best = min(rows, key=lambda r: float(r["val_loss"]))
            return int(best["tokens"]) + _tokens_before(prev, folder, depth + 1)
    return 0


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: cannot read ({e})") from None


def run_curves(args):
    from ..measure.plot import check_plot_path, curves_svg
    check_plot_path(args.output, png=False)
    labels = args.label or [os.path.basename(os.path.normpath(r)) for r in args.runs]
    if len(labels) != len(args.runs):
        raise UsageError(f"curves: {len(labels)} --label for {len(args.runs)} runs")
    series = [(label, COLORS[i % len(COLORS)], run_curve(run)) for i, (label, run) in enumerate(zip(labels, args.runs))]
    curves_svg(series, "validation loss against epochs of the training data", "epochs",
               "validation bits per byte", args.output)
    for label, _, points in series:
        best = min(points, key=lambda p: p[1])
        print(f"{label}: {len(points)} evaluations to epoch {points[-1][0]:.1f}; best {best[1]:.4f} bits per byte "
              f"at epoch {best[0]:.1f}")
    print(f"plot: {args.output}")
