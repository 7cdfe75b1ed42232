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

from ..errors import ModelError, UsageError, is_integer, is_number
from ..formats import bpe
from . import corpus
from . import data as trainer  # the trainer's own reading of its data

COLORS = ("#1f5fa8", "#b3261e", "#2e7d32", "#8e24aa", "#ef6c00", "#546e7a", "#6d4c41", "#00838f")


def add_curves_arguments(p):
    p.add_argument("runs", nargs="+", help="run folders of tinydiff train")
    p.add_argument("-o", "--output", required=True, help="the .svg to write")
    p.add_argument("--label", action="append", default=None, help="a name for each run, in order (default: its folder)")


OBJECTIVES = ("ar", "mdm", "block", "mlm15")


def run_curve(out):
    """[(epochs, validation bits per byte)] of the run folder `out`, from its log.csv."""
    path = os.path.join(out, "args.json")
    settings = _read_settings(path)
    missing = [k for k in ("objective", "data", "val", "seq_len", "eval_tokens") if k not in settings]
    if missing:
        raise UsageError(f"{out}: args.json has no {missing[0]!r}; is it a tinydiff train run folder?")
    _check_settings(settings, path)
    if settings["objective"] == "mlm15":
        raise UsageError(f"{out}: an mlm15 run's loss is per chosen token, not a bound on the text")
    rows = _log_rows(out)                       # the run's own files first, then its data
    if not rows:
        raise UsageError(f"{out}: log.csv holds no validation loss yet")
    before = _tokens_before(settings, out)
    enc = _read_tokenizer(os.path.join(out, "tokenizer.json"))
    train_ids, val_ids = trainer.encode_data(enc, corpus.load_stories(settings["data"]),
                                             corpus.load_stories([settings["val"]]))
    train_tokens = sum(map(len, train_ids))
    windows = trainer.val_windows(val_ids, settings["seq_len"], settings["eval_tokens"],
                                  settings.get("unit_ends") or 0.0, enc.specials[trainer.EOT], trainer.newline_id(enc))
    bytes_per_token = len(enc.decode(windows.ravel().tolist()).encode("utf-8")) / windows.size
    return [((before + tokens) / train_tokens, val / math.log(2) / bytes_per_token) for tokens, val in rows]


def _check_settings(settings, path):
    """The fields of a run's args.json that curves reads, each what tinydiff train writes; a
    ModelError naming the file and the field otherwise."""
    def bad(key, what):
        return ModelError(f"{path}: field {key!r} should be {what}, got {json.dumps(settings[key])}")
    if settings["objective"] not in OBJECTIVES:
        raise bad("objective", "one of " + ", ".join(OBJECTIVES))
    data = settings["data"]
    if not isinstance(data, list) or not data or not all(isinstance(f, str) and f for f in data):
        raise bad("data", "a list of training files")
    if not isinstance(settings["val"], str) or not settings["val"]:
        raise bad("val", "a validation file")
    for key in ("seq_len", "eval_tokens"):
        if not is_integer(settings[key]) or settings[key] <= 0:
            raise bad(key, "a positive whole number")
    unit_ends = settings.get("unit_ends")
    if unit_ends is not None and not (is_number(unit_ends) and 0 <= unit_ends < 1):
        raise bad("unit_ends", "a share in [0, 1)")
    _check_init(settings, path)


def _check_init(settings, path):
    if settings.get("init") is not None and not isinstance(settings["init"], str):
        raise ModelError(f"{path}: field 'init' should be a model folder or null, got {json.dumps(settings['init'])}")


def _read_tokenizer(path):
    """bpe.BPE of the run's tokenizer.json, checked first for what BPE reads."""
    obj = _read_json(path)
    problem = trainer.tokenizer_problem(obj)
    if problem:
        raise ModelError(f"{path}: {problem}")
    return bpe.BPE(obj)


def _log_rows(out):
    """[(training tokens, validation loss)] of the rows of out/log.csv that hold a validation loss
    (a last row cut short by a run still writing it is left out); a ModelError naming the file,
    the line and the column for anything tinydiff train does not write."""
    path = os.path.join(out, "log.csv")
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            missing = [k for k in ("tokens", "val_loss") if k not in (reader.fieldnames or ("tokens", "val_loss"))]
            if missing:
                raise ModelError(f"{path}: no {missing[0]!r} column in its header")
            return [_log_row(r, path, reader.line_num) for r in reader if r.get("val_loss")]
    except OSError as e:
        raise UsageError(f"{out}: cannot read log.csv ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ModelError(f"{path}: invalid UTF-8 at byte {e.start}") from None
    except csv.Error as e:
        raise ModelError(f"{path}: not a CSV file ({e})") from None


def _log_row(r, path, line):
    tokens, val = r["tokens"], r["val_loss"]
    try:
        n = int(tokens)
    except (TypeError, ValueError):
        n = -1
    if n < 0:
        raise ModelError(f"{path}: line {line}: 'tokens' should be a count of tokens, got {tokens!r}")
    try:
        loss = float(val)
    except ValueError:
        loss = math.nan
    if not 0 <= loss < math.inf:
        raise ModelError(f"{path}: line {line}: 'val_loss' should be a loss in nats per token, got {val!r}")
    return n, loss


def _tokens_before(settings, out, seen=()):
    """Training tokens of the same objective before the run in folder `out` when it continues
    another (--init from a run's export, RUN/model, or from a folder that keeps its run's args.json
    and log.csv): the tokens at the evaluation whose model was exported (the best), and those before
    that run. A relative --init is found from here or, failing that, from `out` (shipped runs keep
    theirs that way, so that they chain from any folder)."""
    init = settings.get("init")
    if not init:
        return 0
    seen = seen or (os.path.realpath(out),)
    if not os.path.exists(init):
        init = os.path.join(out, init)
    for folder in (init, os.path.dirname(os.path.normpath(init))):
        if os.path.exists(os.path.join(folder, "args.json")) and os.path.exists(os.path.join(folder, "log.csv")):
            path = os.path.join(folder, "args.json")
            if os.path.realpath(folder) in seen:
                raise ModelError(f"{os.path.join(out, 'args.json')}: field 'init' leads back to {folder}, "
                                 f"a run already in its chain")
            prev = _read_settings(path)
            _check_init(prev, path)
            rows = _log_rows(folder)
            if prev.get("objective") != settings.get("objective") or not rows:
                return 0
            best = min(rows, key=lambda r: r[1])
            return best[0] + _tokens_before(prev, folder, seen + (os.path.realpath(folder),))
    return 0


def _read_settings(path):
    """A run's args.json: a JSON object."""
    settings = _read_json(path)
    if not isinstance(settings, dict):
        raise ModelError(f"{path}: not a JSON object")
    return settings


def _read_json(path):
    """The JSON in the file at path: a file that is not there or not readable is a UsageError (the
    folder named is not a run), one that is not UTF-8 JSON a ModelError (a run's file is damaged)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ModelError(f"{path}: invalid UTF-8 at byte {e.start}") from None
    except ValueError as e:
        raise ModelError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise ModelError(f"{path}: JSON nested too deeply") from None


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
