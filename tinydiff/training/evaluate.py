"""`tinydiff eval`: the command: its flags and their checks, which metric runs, and the reports.

    tinydiff eval -m AR_DIR  --data valid.txt                 # exact NLL: nats/token, bits/byte
    tinydiff eval -m MDM_DIR --data valid.txt --samples-per-seq 8   # ELBO (upper bound on the NLL)
    tinydiff eval -m MDM_DIR --judge AR_DIR --samples 32 --steps 32,64,128 --threshold none,0.9
    tinydiff eval -m Q8_DIR  --against F32_DIR --data valid.txt       # KL(ref || model), top-1 agreement
    tinydiff eval -m AR_DIR  --bigram train.txt --data valid.txt      # the baseline: a bigram, same tokens
    tinydiff eval -m MDM_DIR --infill 0.15,0.5 --data valid.txt       # holes given back exactly

Each metric has its module, whose docstring says exactly what it computes: sequences.py (what is
scored: paragraphs or stories, windows longer than the context), likelihood.py (the exact NLL,
the ELBO, the block ELBO, the bigram baseline, their standard errors), agreement.py (--against),
infill.py (--infill), judge.py (--judge). Takes the parsed flags (add_eval_arguments); prints a
report, or with --json the same numbers as JSON; a bad flag or model is one UsageError or ModelError.
"""
import json
import math
import time

from ..decoding import diffusion
from ..errors import UsageError
from . import corpus
from .agreement import against
from .infill import infill_accuracy
from .judge import OPENINGS, generative_perplexity, reference_row
from .likelihood import ar_likelihood, bigram_likelihood, mdm_likelihood
from .sequences import mask_token

UNITS = ("paragraph", "story")
PLURAL = {"paragraph": "paragraphs", "story": "stories"}
MDM_DEFAULT_STORIES = 300   # x ~250 tokens x K=8 copies: ~1.5 minutes on 2 cores
ELBO_DRAWS = 8              # mask draws per story, K (--samples-per-seq)


# ---------------------------------------------------------------------------------------------
# Arguments

def _list_of(kind, allow_none=False):
    """argparse type for a comma list: '16,32' -> [16, 32]; 'none' -> None where allowed."""
    def parse(text):
        return [None if allow_none and item.strip().lower() == "none" else kind(item) for item in text.split(",")]
    parse.__name__ = f"comma list of {kind.__name__}"      # argparse names the type in its message
    return parse


def add_eval_arguments(p):
    p.add_argument("-m", "--model", default=None, help="model folder (default: the shipped AR model; "
                                                       "with --judge the shipped diffusion model)")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--data", default=None, help="held-out text (stories split by <|endoftext|> or blank lines)")
    p.add_argument("--max-stories", type=int, default=None,
                   help=f"score the first N stories (default: all; masked diffusion: {MDM_DEFAULT_STORIES})")
    p.add_argument("--unit", default="paragraph", choices=UNITS,
                   help="score each paragraph alone after an end-of-text (as published tiny-model evaluations "
                        "do), or each story with the end of the one before as context (default paragraph)")
    p.add_argument("--samples-per-seq", type=int, default=None,
                   help=f"masked diffusion: mask draws K per story (default {ELBO_DRAWS})")
    p.add_argument("-s", "--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the report")
    p.add_argument("--against", default=None, metavar="REF_DIR",
                   help="reference model: KL(ref || model) and top-1 agreement on --data")
    p.add_argument("--infill", type=_list_of(float), default=None, metavar="RATES",
                   help="infill accuracy: hide these shares of each paragraph's tokens (comma list, e.g. "
                        "0.15,0.5) and count the holes the model gives back exactly")
    p.add_argument("--bigram", nargs="+", default=None, metavar="TRAIN",
                   help="score --data with a Kneser-Ney bigram counted on these training files instead "
                        "(the model gives only its tokenizer): the baseline")
    g = p.add_argument_group("generative perplexity (--judge)")
    g.add_argument("--judge", default=None, metavar="AR_DIR", help="autoregressive model that scores the samples")

    def setting(flag, **kw):                                        # one of the settings of the samples it scores
        action = g.add_argument(flag, **kw)
        JUDGE_SETTINGS[action.dest] = (flag, action.default)

    setting("--samples", type=int, default=16, help="samples per setting (default 16)")
    setting("--gen-length", type=int, default=128, help="tokens per sample (default 128)")
    setting("--steps", type=_list_of(int), default=[None],
            help="denoising steps, comma list (default: one per token)")
    setting("--threshold", type=_list_of(float, allow_none=True), default=[None],
            help="Fast-dLLM threshold, comma list, 'none' = off (default none)")
    setting("--entropy-bound", type=_list_of(float, allow_none=True), default=[None],
            help="EB-sampler's entropy bound, comma list, 'none' = off (default none; not with --threshold)")
    setting("--temp", type=_list_of(float), default=[1.0],
            help="sampling temperature, comma list (default 1: the model's own distribution)")
    setting("--block", type=int, default=None, help="block length (default: one block)")
    setting("--remask", default="low_confidence", choices=diffusion.REMASKING,
            help="which positions a step commits first (default low_confidence)")
    setting("--gap", type=int, default=0,
            help="positions one step commits are more than N apart (with --threshold or --entropy-bound; "
                 "default 0)")
    setting("--repeat-penalty", type=float, default=1.0,
            help="repetition penalty of every row, 1 = off (default 1; the tokens within 64 positions)")
    setting("--from-nothing", action="store_true",
            help="write each sample from nothing instead of a story opening: a bidirectional model "
                 "fills an all-mask canvas, an autoregressive one continues <|endoftext|>")


JUDGE_SETTINGS = {}     # dest -> (flag, default): refused without --judge, which alone reads them


# ---------------------------------------------------------------------------------------------
# The command

def _load(path, threads, what):
    from ..model import default_model_path, load
    return load(path or default_model_path(what), threads=threads)


def _read_stories(args):
    if args.data is None:
        raise UsageError("eval needs the held-out text: --data FILE")
    return corpus.load_stories([args.data])


def _same_vocabulary(model, other, flag, path, probe):
    if model.config.vocab_size != other.config.vocab_size:
        raise UsageError(f"{flag} {path}: vocabulary of {other.config.vocab_size} tokens, but the model's has "
                         f"{model.config.vocab_size}; the two must share a tokenizer")
    if model.tokenizer.encode(probe, add_special_tokens=False) != \
            other.tokenizer.encode(probe, add_special_tokens=False):
        raise UsageError(f"{flag} {path}: its tokenizer splits the text differently from the model's")


def _check_args(args):
    for flag, value in (("--max-stories", args.max_stories), ("--samples-per-seq", args.samples_per_seq),
                        ("--samples", args.samples), ("--gen-length", args.gen_length)):
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if sum(x is not None for x in (args.judge, args.against, args.bigram, args.infill)) > 1:
        raise UsageError("give one of --judge, --against, --bigram and --infill")
    if args.threshold != [None] and args.entropy_bound != [None]:
        raise UsageError("give --threshold or --entropy-bound, not both (a step commits by one rule)")
    if args.samples_per_seq is not None and (args.judge or args.against or args.infill or args.bigram):
        raise UsageError("--samples-per-seq is the masked-diffusion ELBO's: this evaluation would ignore it")
    if args.seed < 0:
        raise UsageError(f"-s/--seed must be >= 0, got {args.seed}")
    if not 0 < args.repeat_penalty < float("inf"):
        raise UsageError(f"--repeat-penalty must be > 0 and finite, got {args.repeat_penalty:g}")
    given = [flag for dest, (flag, default) in JUDGE_SETTINGS.items() if getattr(args, dest, default) != default]
    if args.judge is None and given:
        raise UsageError(f"{given[0]} is a setting of the samples --judge scores; without --judge it would be ignored")
    if args.gap < 0 or args.gap and args.threshold == [None] and args.entropy_bound == [None]:
        raise UsageError(f"--gap {args.gap}: give N >= 1 with --threshold or --entropy-bound (it spaces their picks)")
    for rate in args.infill or ():
        if not 0 < rate < 1:
            raise UsageError(f"--infill: each rate must be in (0, 1), got {rate:g}")


def run_eval(args):
    _check_args(args)
    if args.judge:
        return _run_judge(args)
    model = _load(args.model, args.threads, "ar")
    if args.samples_per_seq is not None and model.config.causal:
        raise UsageError("--samples-per-seq is the masked-diffusion ELBO's: an autoregressive model's likelihood "
                         "is exact and would ignore it")
    if args.against:
        return _run_against(args, model)
    if args.infill:
        return _run_infill(args, model)
    stories = _read_stories(args)
    default = None if model.config.causal or args.bigram else MDM_DEFAULT_STORIES   # the ELBO takes its time
    texts, limit = _units(args, stories, default)
    if args.bigram:
        result = bigram_likelihood(model, corpus.load_stories(args.bigram), texts, limit, args.unit)
    elif model.config.causal:
        result = ar_likelihood(model, texts, limit, args.unit)
    else:
        result = mdm_likelihood(model, texts, args.samples_per_seq or ELBO_DRAWS, args.seed, limit, args.unit)
    scored = len(stories[:args.max_stories or default])
    _print(args, {"model": model.path, "unit": args.unit, "stories_in_file": len(stories), "first_stories": scored,
                  **result.as_dict()}, lambda: likelihood_report(model, args, result, scored, len(stories)))


def _units(args, stories, default_stories):
    """(texts, limit): the first --max-stories stories (else default_stories; None: all), as their
    paragraphs or whole (--unit); whole stories keep the rest of the list, which lends the first one
    its context (the file's last story)."""
    n = args.max_stories or default_stories
    if args.unit == "paragraph":
        return corpus.split_paragraphs(stories[:n]), None
    return stories, n


def _run_infill(args, model):
    if not model.config.causal:
        mask_token(model)
    stories = _read_stories(args)
    n = args.max_stories or MDM_DEFAULT_STORIES
    paragraphs = corpus.split_paragraphs(stories[:n])
    rows = []
    for rate in args.infill:
        t0 = time.perf_counter()
        holes, correct = infill_accuracy(model, paragraphs, rate, args.seed)
        rows.append({"rate": rate, "holes": holes, "correct": correct, "accuracy": correct / holes,
                     "seconds": time.perf_counter() - t0})
    _print(args, {"model": model.path, "stories": len(stories[:n]), "paragraphs": len(paragraphs), "rows": rows},
           lambda: infill_report(model, args, len(stories[:n]), len(paragraphs), rows))


def infill_report(model, args, stories, paragraphs, rows):
    how = ("left to right, each hole from what is left of it" if model.config.causal else
           "Model.infill: one token a step, the most confident first, greedy")
    lines = [f"model: {model.path} ({how})",
             f"data:  {args.data}: the paragraphs of the first {stories} stories ({paragraphs}), each alone"]
    for r in rows:
        p = r["accuracy"]
        se = math.sqrt(p * (1 - p) / r["holes"])
        lines.append(f"infill at {100 * r['rate']:g}%: {r['correct']:,} of {r['holes']:,} holes given back exactly, "
                     f"{100 * p:.1f} ± {100 * se:.1f}%  ({r['seconds']:.0f} s)")
    return "\n".join(lines)


def _run_against(args, model):
    ref = _load(args.against, args.threads, "ar")
    for m in (model, ref):
        if not m.config.causal:
            raise UsageError(f"--against compares autoregressive models; {m.path} is masked diffusion")
    stories = _read_stories(args)
    _same_vocabulary(model, ref, "--against", args.against, stories[0])
    result = against(model, ref, *_units(args, stories, None), args.unit)
    scored = len(stories[:args.max_stories])
    _print(args, {"model": model.path, "reference": ref.path, "unit": args.unit, "stories": scored,
                  **result.as_dict()}, lambda: against_report(model, ref, scored, args.unit, result.as_dict()))


def _run_judge(args):
    model = _load(args.model, args.threads, "diffusion")
    judge = _load(args.judge, args.threads, "ar")
    if model.config.causal and not args.from_nothing:
        raise UsageError(f"--judge scores masked-diffusion samples; {model.path} is autoregressive (its samples "
                         f"from nothing: add --from-nothing; after the openings: tinydiff compare)")
    if model.config.causal and (args.steps != [None] or args.threshold != [None] or args.entropy_bound != [None]
                                or args.block is not None):
        raise UsageError("--steps, --threshold, --entropy-bound and --block are diffusion settings; the model is "
                         "autoregressive")
    if not judge.config.causal:
        raise UsageError(f"--judge {args.judge}: not an autoregressive model (config.json says is_causal false)")
    _same_vocabulary(model, judge, "--judge", args.judge, " ".join(OPENINGS))
    if not model.config.causal:
        mask_token(model)
    rows = generative_perplexity(model, judge, args.samples, args.gen_length, args.steps, args.threshold,
                                 args.temp, args.seed, args.block, args.remask, args.from_nothing, args.entropy_bound,
                                 args.repeat_penalty, args.gap)
    if args.data:
        rows.append(reference_row(model, judge, _read_stories(args)[:args.samples], args.gen_length))
    _print(args, {"model": model.path, "judge": judge.path, "gen_length": args.gen_length,
                  "repeat_penalty": args.repeat_penalty, "gap": args.gap, "rows": [r.as_dict() for r in rows]},
           lambda: judge_report(model, judge, args, rows))


def _print(args, data, report):
    print(json.dumps(_no_nan(data), indent=1) if args.json else report())


def _no_nan(x):
    """NaN (a standard error from one story or one draw) as null: JSON has no NaN."""
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_no_nan(v) for v in x]
    return None if isinstance(x, float) and math.isnan(x) else x


# ---------------------------------------------------------------------------------------------
# Reports

def _pm(se):
    """' ± se', or ' ± n/a' when there is no spread to measure (one story, one draw)."""
    return " ± n/a" if math.isnan(se) else f" ± {se:.4f}"


def likelihood_report(model, args, r, stories, available):
    kind = "autoregressive" if model.config.causal else "masked diffusion"
    what = (f"Kneser-Ney bigram counted on {' '.join(args.bigram)}, tokenized by {model.path}" if args.bigram
            else f"{model.path} ({kind}, {model.parameter_count():,} parameters)")
    units = PLURAL[args.unit]
    how = ("each paragraph alone after an end-of-text" if args.unit == "paragraph" else
           "each story and its end-of-text, after the end of the one before")
    extra = "" if args.unit == "paragraph" else " (+1 per end-of-text)"
    lines = [f"model:  {what}",
             f"data:   {args.data}: the first {stories} of {available} stories, {r.stories} {units}; "
             f"{r.tokens:,} tokens scored ({how}); {r.bytes:,} UTF-8 bytes{extra}"]
    if "ELBO" in r.bound:
        lines.append(f"bound:  {r.bound}, an upper bound on the NLL; K={r.samples_per_seq} stratified mask counts "
                     f"per {args.unit} (LLaDA); Monte Carlo part of the se:{_pm(r.mc_se)} nats/token")
    lines += [f"{r.bound}: {r.nats_per_token:.4f}{_pm(r.se)} nats/token (se over {units}), "
              f"perplexity {math.exp(r.nats_per_token):.3f}",
              f"bits per byte: {r.bits_per_byte:.4f}{_pm(r.to_bits_per_byte(r.se))}",
              f"time:   {r.seconds:.1f} s"]
    return "\n".join(lines)


def against_report(model, ref, stories, unit, d):
    return "\n".join([
        f"model:     {model.path}",
        f"reference: {ref.path}",
        f"data:      {stories} stories (scored by {unit}), {d['tokens']:,} next-token predictions, "
        f"{d['bytes']:,} bytes",
        f"model:     {d['model_nats_per_token']:.4f} nats/token, {d['model_bits_per_byte']:.4f} bits/byte",
        f"reference: {d['ref_nats_per_token']:.4f} nats/token, {d['ref_bits_per_byte']:.4f} bits/byte",
        f"KL(ref || model): mean {d['kl_mean']:.4g} ± {d['kl_se']:.2g} nats, median {d['kl_median']:.4g}, "
        f"99% {d['kl_p99']:.4g}, max {d['kl_max']:.4g}",
        f"same top-1: {100 * d['top1_agreement']:.3f} ± {100 * d['top1_se']:.3f} %"])


def judge_report(model, judge, args, rows):
    lines = [f"model: {model.path}", f"judge: {judge.path}",
             f"{args.samples} samples per row, gen_length {args.gen_length}, " +
             ("from nothing (an all-mask canvas, or <|endoftext|> for an AR model)" if args.from_nothing else
              f"openings cycled from {', '.join(repr(o) for o in OPENINGS)}") +
             (f"; repetition penalty {args.repeat_penalty:g} (the tokens within 64 positions)"
              if args.repeat_penalty != 1 else "") +
             (f"; a step's commits more than {args.gap} apart (rows with a rule)" if args.gap else ""),
             f"{'steps':>13} {'threshold':>9} {'ebound':>6} {'temp':>5} {'passes':>7} {'tokens':>7} {'judge ppl':>9} "
             f"{'entropy':>7} {'rep4':>5} {'seconds':>7}"]
    for r in rows:
        s = r.setting
        th = "-" if s["threshold"] is None else f"{s['threshold']:g}"
        eb = "-" if s["entropy_bound"] is None else f"{s['entropy_bound']:g}"
        temp = "-" if s["temperature"] is None else f"{s['temperature']:g}"
        lines.append(f"{s['steps']:>13} {th:>9} {eb:>6} {temp:>5} {r.passes:>7.1f} {r.tokens:>7} {r.perplexity:>9.3f} "
                     f"{r.entropy:>7.3f} {r.repeats:>5.3f} {r.seconds:>7.1f}")
    lines.append("entropy: bits per token of each sample's unigram distribution, averaged over samples; rep4: "
                 "the share of a sample's 4-grams it had already written (loops), averaged over samples")
    return "\n".join(lines)
