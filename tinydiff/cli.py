"""The `tinydiff` command. Flags follow llama.cpp's spellings where one exists (-m, -p, -f, -n, -t,
-s, --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n).

A user's mistake is one line on stderr and exit status 2 (usage) or 1 (model files), never a traceback.
"""
import argparse
import os
import sys

import numpy as np

from .errors import ModelError, TinydiffError, UsageError


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line, exit status 2."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")


def _add_model_args(p):
    p.add_argument("-m", "--model", default=None,
                   help="model folder (config.json, *.safetensors, tokenizer.json), .gguf file or shipped "
                        "model name (tinydiff models); default: the shipped model for the mode")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")


def _add_sampling_args(p):
    p.add_argument("--temp", type=float, default=None,
                   help="temperature; 0 = greedy (default 0.8; masked diffusion: 0). Autoregressive: a model "
                        "whose generation_config.json sets do_sample (or a repetition penalty) gives its own values "
                        "as defaults (engine/config.py says how); a flag overrides each")
    p.add_argument("--top-k", type=int, default=None, help="top-k, 0 = off (default 40; masked diffusion: 0)")
    p.add_argument("--top-p", type=float, default=None, help="top-p, 1 = off (default 0.95; masked diffusion: 1)")
    p.add_argument("--min-p", type=float, default=None, help="min-p, 0 = off (default 0.05; autoregressive only)")
    p.add_argument("--repeat-penalty", type=float, default=None,
                   help="repetition penalty, 1 = off (default 1.0)")
    p.add_argument("--repeat-last-n", type=int, default=None,
                   help="tokens the penalty looks back at, 0 = off (default 64; masked diffusion: the known "
                        "tokens this near a masked position, on either side)")
    p.add_argument("-s", "--seed", type=int, default=None, help="random seed (default or -1: fresh each run)")


def _add_diffusion_args(p, visual=True):
    """A flag for each field of diffusion.Options that names one; None is spelled "none" here only."""
    from .decoding.diffusion import Options
    d = p.add_argument_group("masked diffusion")
    for f in Options.flagged():
        kw = {k: v for k, v in f.metadata.items() if k != "flag"}
        if "choices" in kw:
            kw["choices"] = ["none" if c is None else c for c in kw["choices"]]
        default = "none" if "choices" in kw and f.default is None else f.default
        help = kw.pop("help") + ("" if default is None else f" (default {default})")
        if "choices" not in kw:
            kw["metavar"] = "N" if kw["type"] is int else "X"
        d.add_argument(f.metadata["flag"], dest=f.name, default=None, help=help, **kw)
    if visual:
        d.add_argument("--visual", action="store_true", help="redraw the canvas in place as it denoises")


def diffusion_options(args):
    """The denoising keywords the flags set: only those given, "none" read as None."""
    from .decoding.diffusion import Options
    given = {f.name: getattr(args, f.name) for f in Options.flagged() if getattr(args, f.name) is not None}
    return {name: None if value == "none" else value for name, value in given.items()}


def _add_decoding_args(p):
    """--mode, then the sampling and denoising flags: how generate and chat decode."""
    p.add_argument("--mode", choices=["ar", "diffusion"], default=None,
                   help="autoregressive or masked diffusion (default: what the model was trained for)")
    _add_sampling_args(p)
    _add_diffusion_args(p)


def build_parser():
    from . import __version__
    parser = _Parser(prog="tinydiff", description="CPU inference for autoregressive and masked-diffusion LMs")
    parser.add_argument("--version", action="version", version=f"tinydiff {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text from a prompt, streaming to stdout")
    _add_model_args(g)
    g.add_argument("-p", "--prompt", help="the prompt text")
    g.add_argument("-f", "--file", help="read the prompt from a file ('-' = stdin)")
    g.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate (default 128)")
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--truncate", action="store_true",
                   help="drop the start of a prompt too long for the context (autoregressive only)")
    g.add_argument("--no-display-prompt", dest="display_prompt", action="store_false",
                   help="print only the completion, not the prompt before it")
    g.add_argument("--stats", action="store_true", help="print timings to stderr, as llama.cpp does")
    _add_decoding_args(g)
    g.set_defaults(run=cmd_generate)

    c = sub.add_parser("chat", help="talk with an instruct model through its chat template (/reset, /exit)")
    _add_model_args(c)
    c.add_argument("--system", default=None, help="system message")
    c.add_argument("-n", "--n-predict", type=int, default=256, help="tokens per answer at most (default 256)")
    c.add_argument("-c", "--ctx-size", type=int, default=None,
                   help="positions the conversation may take (default: the model's context, at most 4096)")
    c.add_argument("--chat-template-file", default=None,
                   help="a Jinja chat template to use instead of the model's")
    _add_decoding_args(c)
    c.set_defaults(run=cmd_chat)

    v = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs the [serve] extra)")
    _add_model_args(v)
    v.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    v.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    v.add_argument("--slots", type=int, default=4, help="requests decoded at once (default 4)")
    v.add_argument("-c", "--ctx-size", type=int, default=None,
                   help="positions per request, prompt and answer (default: the model's context, at most 4096)")
    v.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    v.set_defaults(run=cmd_serve)

    f = sub.add_parser("infill", help="fill the [MASK] / [MASK*N] holes of a text (masked-diffusion models)")
    _add_model_args(f)
    f.add_argument("-p", "--prompt", required=True, help='text with holes, e.g. "The [MASK*3] sat on the mat."')
    f.add_argument("--stats", action="store_true", help="print forward passes and time per step to stderr")
    f.add_argument("--temp", type=float, default=None, help="temperature; 0 = greedy (default 0)")
    f.add_argument("-s", "--seed", type=int, default=None, help="random seed")
    f.add_argument("--repeat-penalty", type=float, default=None, help="repetition penalty, 1 = off (default 1.0)")
    f.add_argument("--repeat-last-n", type=int, default=None,
                   help="the known tokens this near a hole are penalised, on either side (default 64)")
    _add_diffusion_args(f)
    f.set_defaults(run=cmd_infill)

    b = sub.add_parser("bench", help="llama-bench style speed tests (pp, tg, and dd / bd for diffusion)")
    b.add_argument("-m", "--model", action="append", default=None, help="model folder or .gguf file (repeatable)")
    b.add_argument("--shape", action="append", default=None,
                   help="a real model shape with random weights (default without -m: all of them)")
    b.add_argument("-p", "--n-prompt", type=int, action="append", default=None, help="pp test sizes (default 512)")
    b.add_argument("-n", "--n-gen", type=int, action="append", default=None, help="tg test sizes (default 128)")
    b.add_argument("-d", "--diffusion", action="append", default=None,
                   help="dd tests as LxS: canvas L for S steps (default 256x4)")
    b.add_argument("-b", "--block-diffusion", action="append", default=None,
                   help="bd tests as NxBxS: N tokens in blocks of B, S steps a block (default 128x8x2)")
    b.add_argument("--type", default=None,
                   help="weight types to run each model in, quantized in memory, e.g. f32,q8_0,q4_0 "
                        "(default: as loaded); the t/s of each type is also given as a ratio to the first")
    b.add_argument("--npl", default=None, metavar="B1,B2,...",
                   help="sequences decoded as one batch in the tg tests, as llama-batched-bench's -npl "
                        "(e.g. 1,2,4,8,16; tg alone always runs too)")
    b.add_argument("-r", "--repetitions", type=int, default=3, help="repetitions of each test (default 3)")
    b.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    b.add_argument("--json", action="store_true", help="print JSON instead of the table")
    b.add_argument("--no-roofline", action="store_true", help="skip the roofline measurement (no %% column)")
    b.set_defaults(run=cmd_bench)

    c = sub.add_parser("cost", help="AR decoding and masked diffusion side by side: bytes, FLOPs, time")
    c.add_argument("-m", "--model", action="append", default=None,
                   help="model folder or .gguf file; give an AR and a diffusion model "
                        "(default: the two shipped models)")
    c.add_argument("-p", "--prompt", default="Once upon a time", help="the prompt (default 'Once upon a time')")
    c.add_argument("-n", "--n-predict", type=int, default=64, help="tokens to generate (default 64)")
    c.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    _add_diffusion_args(c, visual=False)
    c.add_argument("--type", default=None, metavar="T1,T2,...",
                   help="also run with the matrices stored as these weight types (f32,f16,bf16,q8_0,q4_0), "
                        "quantized in memory: bytes per token fall with the type, a large step's time much less")
    c.add_argument("--plot", default=None, help="draw the runs on the roofline into FILE.svg (or .png)")
    c.set_defaults(run=cmd_cost)

    cm = sub.add_parser("compare", help="AR, masked diffusion and block diffusion on the same openings: "
                                       "cost per token and judged quality")
    cm.add_argument("--ar", default="stories5m-ar", help="the AR model, also the judge (default stories5m-ar)")
    cm.add_argument("--mdm", default="stories5m-mdm", help="the masked-diffusion model ('none': leave out)")
    cm.add_argument("--bd", default="stories5m-bd", help="the block-diffusion model ('none': leave out)")
    cm.add_argument("-n", "--n-predict", type=int, default=64, help="tokens a sample (default 64)")
    cm.add_argument("--samples", type=int, default=8, help="samples a setting (default 8)")
    cm.add_argument("--temp", type=float, default=1.0, help="temperature of every setting (default 1)")
    cm.add_argument("--threshold", type=float, default=None,
                    help="also decode each diffusion model by this confidence threshold (Fast-dLLM)")
    cm.add_argument("--gap", type=int, default=0, help="with --threshold: a step's commits more than N apart")
    cm.add_argument("--repeat-penalty", type=float, default=1.0,
                    help="repetition penalty of every setting, 1 = off (default 1; the tokens within 64 positions)")
    cm.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    cm.add_argument("--plot", default=None, help="draw ms per token against judged perplexity into FILE.svg")
    cm.set_defaults(run=cmd_compare)

    r = sub.add_parser("roofline", help="measure this machine: memory and cache bandwidth, peak FLOP/s")
    r.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    r.add_argument("--remeasure", action="store_true", help="measure again instead of reading the cache")
    r.set_defaults(run=cmd_roofline)

    t = sub.add_parser("train", help="train a small model, autoregressive or masked diffusion (needs .[train])")
    from .training.train import add_train_arguments
    add_train_arguments(t)
    t.set_defaults(run=cmd_train)

    cv = sub.add_parser("curves", help="validation bits per byte against epochs of training runs, on one axis (SVG)")
    from .training.curves import add_curves_arguments, run_curves
    add_curves_arguments(cv)
    cv.set_defaults(run=run_curves)

    e = sub.add_parser("eval", help="held-out bits per byte (AR exact, MDM ELBO), judge perplexity, KL --against")
    from .training.evaluate import add_eval_arguments, run_eval
    add_eval_arguments(e)
    e.set_defaults(run=run_eval)

    ms = sub.add_parser("models", help="the models that ship with tinydiff: names for -m, and their folders")
    ms.set_defaults(run=cmd_models)

    i = sub.add_parser("info", help="architecture, parameter count and weight bytes per dtype")
    _add_model_args(i)
    i.set_defaults(run=cmd_info)

    v = sub.add_parser("convert", help="write a Hugging Face model folder as a GGUF file (llama.cpp's format)")
    v.add_argument("-m", "--model", required=True, help="Hugging Face model folder")
    v.add_argument("--type", default="f16", choices=["f32", "f16", "bf16", "q8_0", "q4_0"],
                   help="type of the weight matrices; norms stay f32 (default f16)")
    v.add_argument("-o", "--output", required=True, help="the .gguf file to write")
    v.set_defaults(run=cmd_convert)
    return parser


def read_prompt(args):
    if args.prompt is not None and args.file is not None:
        raise UsageError("give the prompt with -p or -f, not both")
    if args.prompt is not None:
        return args.prompt
    if args.file is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("no prompt: give -p TEXT, -f FILE, or pipe it on stdin")
        args.file = "-"
    where = "stdin" if args.file == "-" else args.file
    try:
        data = sys.stdin.buffer.read() if args.file == "-" else open(args.file, "rb").read()
    except OSError as e:
        raise UsageError(f"{where}: cannot read ({e.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{where}: invalid UTF-8 at byte {e.start}") from None


def _or(value, default):
    """A flag's value, or the default of the mode it is used in (AR and diffusion differ)."""
    return default if value is None else value


def load_model(args):
    from .model import default_model_path, load
    if args.model == "":
        raise UsageError("-m/--model is empty: give a model folder, a .gguf file or a shipped model's name")
    if "" in (getattr(args, "stop", None) or []):
        raise UsageError("--stop \"\": a stop string must not be empty (it would end every answer at once)")
    path = args.model or default_model_path("diffusion" if getattr(args, "mode", None) == "diffusion"
                                            or args.command == "infill" else "ar")
    return load(path, threads=args.threads)


def ar_sampling(args):
    """The sampling flags given; the model's defaults (generation_config.json, else llama.cpp's) fill the rest."""
    given = dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                 repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n)
    return {name: value for name, value in given.items() if value is not None}


def diffusion_sampling(args, seed):
    """The token choice of a denoising run: LLaDA's greedy defaults, unless a flag says otherwise
    (infill has no --top-k / --top-p: the defaults)."""
    return dict(temperature=_or(args.temp, 0.0), seed=seed, top_k=_or(getattr(args, "top_k", None), 0),
                top_p=_or(getattr(args, "top_p", None), 1.0),
                repeat_penalty=_or(getattr(args, "repeat_penalty", None), 1.0),
                repeat_last_n=_or(getattr(args, "repeat_last_n", None), 64))


def cmd_generate(args):
    from .decoding.generate import Timings
    prompt = read_prompt(args)
    seed = _seed(args.seed)
    model = load_model(args)
    mode = args.mode or ("ar" if model.config.causal else "diffusion")
    _refuse_other_modes_flags(args, mode)
    if mode == "diffusion":
        return run_diffusion(args, model, prompt, seed=seed, echo=args.display_prompt)
    timings = Timings()
    pieces = model.stream(prompt, args.n_predict, stop=args.stop, **ar_sampling(args), seed=seed,
                          truncate=args.truncate, timings=timings)   # checked: nothing printed yet
    if args.display_prompt:
        _write(prompt)
    for piece in pieces:
        _write(piece)
    _write("\n")
    if args.stats:
        print(timings.report(), file=sys.stderr)


def _write(text):
    sys.stdout.write(text)
    sys.stdout.flush()


def _seed(seed):
    """-s: a seed >= 0, or -1 (llama.cpp's spelling) / none for a fresh one each run."""
    if seed is not None and seed < -1:
        raise UsageError(f"-s/--seed must be >= 0, or -1 for a random seed; got {seed}")
    return None if seed == -1 else seed


# flags that only one mode reads: given in the other, they are refused rather than ignored
AR_ONLY = {"truncate": "--truncate", "min_p": "--min-p"}


def _refuse_other_modes_flags(args, mode):
    from .decoding.diffusion import Options
    if mode == "diffusion":
        given = [flag for name, flag in AR_ONLY.items() if getattr(args, name, None) not in (None, False)]
    else:
        given = [f.metadata["flag"] for f in Options.flagged()
                 if getattr(args, f.name) is not None] + (["--visual"] if args.visual else [])
    if given:
        other = "masked diffusion" if mode == "ar" else "autoregressive decoding"
        this = "autoregressive" if mode == "ar" else "masked diffusion"
        raise UsageError(f"{given[0]} is a flag of {other}; this run is {this} (--mode {mode})")


def run_diffusion(args, model, prompt, infill=False, seed=None, echo=False):
    from .decoding.diffusion import to_the_end
    from .decoding.generate import cut_at_stop
    from .decoding.visual import LiveView
    options = {**diffusion_options(args), **diffusion_sampling(args, seed)}
    if infill:
        ids, first, last = model.holes(prompt)
        options.setdefault("eos", "suppress")
        options.update(fixed=np.asarray(ids) != model.mask_id)
        start = 0
    else:
        ids = model.encode_prompt(prompt)
        options.update(gen_length=args.n_predict)
        start = len(ids)
    steps = model.denoise_steps(ids, **options)         # every check made: nothing printed yet
    view = LiveView(model.tokenizer, sys.stdout, start=start,
                    given=options.get("fixed")) if args.visual else None
    if echo:
        _write(prompt + ("\n" if view and view.live else ""))   # the live view redraws whole lines
    result = to_the_end(steps, view.on_step if view else None)
    # an infill's given text is the user's, an EOS in it included (Model.infill's); an answer ends at its EOS
    text = model.tokenizer.text(result.canvas[first:last].tolist()) if infill else model.text(result.ids)
    text = cut_at_stop(text, getattr(args, "stop", None))
    if view:
        view.finish(text)
    else:
        print(text)
    if args.stats:
        print(f"forward passes: {result.passes} ({result.passes_saved} saved by EOS), "
              f"{result.tokens_per_pass:.2f} tokens committed per pass, "
              f"{result.seconds / max(result.passes, 1) * 1e3:.2f} ms per step, "
              f"{result.seconds:.2f} s in all", file=sys.stderr)


def cmd_chat(args):
    """Reads a line, answers it, until /exit or the end of input. Ctrl-C stops an answer (kept as
    far as it went) and the loop goes on; a turn's error is printed and the conversation kept."""
    from .chat import Chat
    seed = _seed(args.seed)
    model = load_model(args)
    mode = args.mode or ("ar" if model.config.causal else "diffusion")
    _refuse_other_modes_flags(args, mode)
    if mode == "ar" and not model.config.causal:
        raise UsageError(f"{model.path} is a masked-diffusion model (bidirectional attention): chat with "
                         "--mode diffusion")
    if args.n_predict < 1:
        raise UsageError(f"-n/--n-predict must be >= 1, got {args.n_predict}")
    if args.chat_template_file:
        model.chat_template = _template_file(args.chat_template_file, model)
    chat = Chat(model, system=args.system, n_ctx=args.ctx_size)
    sys.stdin.reconfigure(errors="replace")   # a stray byte in what is typed is a character, not a crash
    # every flag checked before the first line is read, as generate checks them (a turn's errors are the text's)
    if mode == "diffusion":
        options = {**diffusion_options(args), **diffusion_sampling(args, seed)}
        probe = [1 if model.mask_id == 0 else 0]                # any id but the mask
        model.denoise_steps(probe, args.n_predict, **options)  # checked, never run (a masked model's too)
    else:
        options = {**ar_sampling(args), "seed": seed}
        model.sampling_params(**options)
    if args.n_predict >= chat.n_ctx:
        raise UsageError(f"-n/--n-predict {args.n_predict} leaves no room for a message in a context of "
                         f"{chat.n_ctx} positions")
    while True:
        line = _read_line("> ")
        if line is None or line.strip() == "/exit":
            return
        if line.strip() == "/reset":
            chat.reset()
            print("(the conversation is forgotten)")
        elif line.strip():
            _answer(chat, line.rstrip("\n"), args, options)


def _answer(chat, text, args, options):
    from .decoding.visual import LiveView
    view = None
    try:
        on_step = (lambda *step: view.on_step(*step)) if args.visual else None
        pieces = chat.send(text, args.n_predict, **({"on_step": on_step} if on_step else {}), **options)
        if args.visual:
            view = LiveView(chat.model.tokenizer, sys.stdout, start=len(chat.ids))
            view.finish("".join(pieces))
            return
        for piece in pieces:
            _write(piece)
        _write("\n")
    except TinydiffError as e:   # this turn's: the conversation goes on without it
        print(f"tinydiff: error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        _write("\n")


def _read_line(prompt):
    """A line of the user's (None at the end of input), with a prompt when a person types."""
    if sys.stdin.isatty():
        try:
            return input(prompt)
        except EOFError:
            _write("\n")
            return None
    line = sys.stdin.readline()
    return line or None


def _template_file(path, model):
    from .formats.chat_template import ChatTemplate
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--chat-template-file {path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        return ChatTemplate(source, model.chat_template.special_tokens if model.chat_template else
                            _special_tokens_of(model), path).compiled()
    except ModelError as e:   # the caller's file, not the model's: a usage error (exit 2)
        raise UsageError(str(e)) from None


def _special_tokens_of(model):
    """bos_token / eos_token for a template given on the command line to a model without one: the
    tokenizer's text of the model's BOS and first EOS."""
    tok, cfg = model.tokenizer, model.config
    ids = {"bos_token": cfg.bos_token_id if cfg.bos_token_id is not None else tok.bos_id,
           "eos_token": cfg.eos_token_ids[0] if cfg.eos_token_ids else tok.eos_id}
    return {name: tok.id_to_token(i) for name, i in ids.items() if i is not None}


def cmd_serve(args):
    try:
        from .serve.server import serve
    except ImportError as e:
        raise UsageError(f"tinydiff serve needs the [serve] extra (pip install 'tinydiff[serve]'): {e}") from None
    if args.slots < 1:
        raise UsageError(f"--slots must be >= 1, got {args.slots}")
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    model = load_model(args)
    limit = model.config.max_position_embeddings
    if args.ctx_size is not None and not 1 <= args.ctx_size <= limit:
        raise UsageError(f"-c/--ctx-size must be in 1..{limit} (the model's context), got {args.ctx_size}")
    name = os.path.basename(os.path.normpath(model.path))
    print(f"tinydiff serve: {name} on http://{args.host}:{args.port}/v1 ({args.slots} slots)", file=sys.stderr, flush=True)
    serve(model, name, args.host, args.port, args.slots, args.ctx_size, args.api_key)


def cmd_infill(args):
    seed = _seed(args.seed)
    model = load_model(args)
    run_diffusion(args, model, args.prompt, infill=True, seed=seed)


def cmd_bench(args):
    from .measure.bench import (
        HEADER,
        as_json,
        batch_ratios,
        bench,
        block_ratios,
        check_fits,
        parse_test,
        type_ratios,
        weight_bandwidth,
    )
    from .measure.shapes import SHAPES, random_model, shape_config
    from .measure.table import stored_as
    from .model import load, model_path, set_threads
    if args.threads is not None:
        set_threads(args.threads)
    if args.repetitions < 1:
        raise UsageError(f"bench: repetitions must be >= 1, got {args.repetitions}")
    for spec in _bench_tests(args, None):
        parse_test(spec)                                  # every mistake before anything runs
    for path in args.model or []:
        if not os.path.exists(model_path(path)):
            raise ModelError(f"{path}: no such model folder, .gguf file or shipped model (tinydiff models)")
    unknown = [s for s in args.shape or [] if s not in SHAPES]
    if unknown:
        raise UsageError(f"bench: unknown shape '{unknown[0]}' (known: {', '.join(SHAPES)})")
    types = _weight_types(args.type, "bench")
    loaded = [(path, load(path, threads=args.threads)) for path in args.model or []]  # mapped: every check first
    shapes = args.shape or ([] if args.model else list(SHAPES))
    for n_ctx in [m.config.max_position_embeddings for _, m in loaded] + [
            shape_config(name).max_position_embeddings for name in shapes]:
        for spec in _bench_tests(args, n_ctx):
            check_fits(spec, n_ctx)
    roofline = None if args.no_roofline else _roofline(args.threads)
    models = [(path, lambda m=model: m) for path, model in loaded]
    models += [(name, lambda n=name: random_model(n)) for name in shapes]
    results = []
    if not args.json:
        print(HEADER)
    for name, make in models:
        model = make()
        tests = _bench_tests(args, model.config.max_position_embeddings)
        for wtype in types:
            label = f"{name} {wtype}" if wtype else name
            for r in bench(stored_as(model, wtype), label, tests, args.repetitions, roofline):
                results.append(r)
                if not args.json:
                    print(r.row(), flush=True)
    if args.json:
        print(as_json(results))
        return
    for lines in (weight_bandwidth(results, roofline), batch_ratios(results, roofline), block_ratios(results),
                  type_ratios(results, types) if len(types) > 1 else ""):
        if lines:
            print("\n" + lines)


def _bench_tests(args, n_ctx):
    """The test specs: the ones asked for, else llama-bench's defaults (pp512, tg128, and dd256x4,
    bd128x8x2) made to fit a context of n_ctx positions (None: as they are)."""
    fit = (lambda n: n) if n_ctx is None else (lambda n: min(n, n_ctx - 1))   # tg and bd read one more
    batches = sorted({1, *_npl(args.npl)})
    return ([f"pp{n}" for n in args.n_prompt or [fit(512)]]
            + [f"tg{n}" if b == 1 else f"tg{n}x{b}" for n in args.n_gen or [fit(128)] for b in batches]
            + [f"dd{d}" for d in args.diffusion or [f"{fit(256)}x4"]]
            + [f"bd{b}" for b in args.block_diffusion or [f"{fit(128) // 8 * 8}x8x2"]])


def _npl(text):
    """--npl 1,2,4,8: the batch sizes, each 1..MAX_SEQUENCES."""
    from .measure.bench import MAX_SEQUENCES
    if text is None:
        return []
    try:
        sizes = [int(v) for v in text.split(",")]
    except ValueError:
        sizes = [0]
    if not sizes or min(sizes) < 1 or max(sizes) > MAX_SEQUENCES:
        raise UsageError(f"bench: --npl takes batch sizes 1-{MAX_SEQUENCES} separated by commas, got '{text}'")
    return sizes


def _weight_types(text, command="cost"):
    """[None] (the models as loaded), or the --type list checked against tinydiff.formats.quant's names."""
    from .formats.quant import TYPES
    if text is None:
        return [None]
    types = [t.strip() for t in text.split(",")]
    for t in types:
        if t not in TYPES:
            raise UsageError(f"{command}: unknown weight type {t!r} in --type; choose from {', '.join(TYPES)}")
    return types


def cmd_cost(args):
    import dataclasses

    from .measure import table as cost_table
    from .model import default_model_path, load, set_threads
    if args.threads is not None:
        set_threads(args.threads)
    if args.n_predict < 1:
        raise UsageError(f"cost: the number of tokens to generate must be >= 1, got {args.n_predict}")
    if args.plot:
        from .measure.plot import check_plot_path
        check_plot_path(args.plot)                         # before minutes of measuring, not after
    paths = args.model or [default_model_path("ar"), default_model_path("diffusion")]
    models = [load(p, threads=args.threads) for p in paths]
    ar = next((m for m in models if m.config.causal), None)
    dm = next((m for m in models if m.config.mask_token_id is not None), None)
    if ar is None and dm is None:
        raise UsageError("cost: give a causal model, a masked-diffusion model, or both with -m")
    unused = [p for p, m in zip(paths, models) if m is not ar and m is not dm]
    if unused:   # one of each kind is set side by side
        raise UsageError(f"cost: {unused[0]} would not be measured: give at most one causal model and one "
                         "masked-diffusion model")
    if dm is None:      # costs depend on the shape alone; what a step commits needs a trained model
        print("note: no masked-diffusion model given: diffusion runs use the AR weights read "
              "bidirectionally, so their costs are real but their commits per pass are not", file=sys.stderr)
        dm = type(ar)(dataclasses.replace(ar.config, causal=False, mask_token_id=ar.config.vocab_size - 1),
                      ar.weights, ar.tokenizer)
    roofline = _roofline(args.threads)
    runs = []
    for wtype in _weight_types(args.type):
        prefix = f"{wtype} " if wtype else ""
        if ar is not None:
            m = cost_table.stored_as(ar, wtype)
            ids = m.encode_prompt(args.prompt)
            runs.append(cost_table.measure(prefix + "autoregressive, greedy", roofline,
                                           lambda m=m, ids=ids: m.generate_ids(ids, args.n_predict, temperature=0)))
        m = cost_table.stored_as(dm, wtype)
        ids = m.encode_prompt(args.prompt)
        for setting in cost_table.diffusion_settings(args.n_predict, diffusion_options(args))[:1 if wtype else None]:
            runs.append(cost_table.measure(prefix + cost_table.describe(setting), roofline,
                                           lambda s=setting, m=m, ids=ids: m.denoise_ids(
                                               ids, args.n_predict, **{"eos": "keep", **s})))
    print(cost_table.table(runs, roofline))
    if args.plot:
        from .measure.plot import roofline_svg
        points = [(r.label, r.flops / len(r.passes), r.bytes / len(r.passes), r.seconds / len(r.passes))
                  for r in runs]
        points += cost_table.canvas_points(dm, [64, 256, 1024])
        roofline_svg(roofline, points, args.plot)
        print(f"roofline plot: {args.plot}")


def cmd_compare(args):
    from .measure.plot import check_plot_path, tradeoff_svg
    from .model import load
    from .training.compare import compare, table
    if args.n_predict < 1 or args.samples < 1:
        raise UsageError("compare: -n and --samples must be >= 1")
    if not 0 < args.repeat_penalty < float("inf"):
        raise UsageError(f"compare: --repeat-penalty must be > 0 and finite, got {args.repeat_penalty:g}")
    if args.threshold is not None and not 0 < args.threshold <= 1:
        raise UsageError(f"compare: --threshold must be in (0, 1], got {args.threshold:g}")
    if args.gap < 0 or args.gap and args.threshold is None:
        raise UsageError(f"compare: --gap {args.gap}: give N >= 1 with --threshold (it spaces its picks)")
    if args.plot:
        check_plot_path(args.plot)                         # before minutes of measuring, not after
    ar = load(args.ar, threads=args.threads)
    if not ar.config.causal:
        raise UsageError(f"compare: --ar {args.ar} is not an autoregressive model")
    mdm, bd = (None if name == "none" else load(name, threads=args.threads) for name in (args.mdm, args.bd))
    for flag, m in (("--mdm", mdm), ("--bd", bd)):
        if m is not None and (m.config.causal or (flag == "--bd") != bool(m.config.block_size)):
            raise UsageError(f"compare: {flag} {m.path} is not a {'block' if flag == '--bd' else 'masked'}-"
                             "diffusion model")
    roofline = _roofline(args.threads)
    rows = compare(ar, mdm, bd, ar, args.n_predict, args.samples, args.temp, roofline, args.repeat_penalty,
                   args.threshold, args.gap)
    print(table(rows, roofline, args.n_predict, args.samples, args.temp, args.repeat_penalty))
    if args.plot:
        tradeoff_svg([(r.label, r.seconds / r.tokens * 1e3, r.judged.perplexity) for r in rows], args.plot)
        print(f"plot: {args.plot}")


def _roofline(threads, remeasure=False):
    from .measure.roofline import load_or_measure
    return load_or_measure(threads, remeasure=remeasure)


def cmd_roofline(args):
    from .measure.roofline import report
    from .model import set_threads
    if args.threads is not None:
        set_threads(args.threads)
    print(report(_roofline(args.threads, args.remeasure)))


def cmd_train(args):
    from .training.train import run_train
    run_train(args)


def cmd_convert(args):
    from .convert import convert
    from .model import model_path
    try:
        fallbacks = convert(model_path(args.model), args.output, args.type)
    except OSError as e:
        raise UsageError(f"{args.output}: cannot write ({e.strerror})") from None
    if fallbacks:   # llama.cpp's converter does the same, with the same warning
        print(f"note: {len(fallbacks)} matrices with rows that are not whole {args.type} blocks of 32 are "
              f"stored as f16 ({', '.join(fallbacks[:3])}{', ...' if len(fallbacks) > 3 else ''})", file=sys.stderr)
    print(f"wrote {args.output}")


def cmd_models(args):
    from .model import DEFAULT_MODELS, shipped_models
    defaults = {name: mode for mode, name in DEFAULT_MODELS.items()}
    for name, path in shipped_models().items():
        note = f"  (default for --mode {defaults[name]})" if name in defaults else ""
        print(f"{name:16s} {path}{note}")


def cmd_info(args):
    model = load_model(args)
    c = model.config
    print(f"model:        {model.path}")
    print(f"architecture: {c.model_type}, {'causal' if c.causal else 'bidirectional (masked diffusion)'}")
    print(f"layers {c.num_hidden_layers}, hidden {c.hidden_size}, heads {c.num_attention_heads} "
          f"(kv {c.num_key_value_heads}, head_dim {c.head_dim}), mlp {c.intermediate_size}, "
          f"vocab {c.vocab_size}, context {c.max_position_embeddings}")
    kind = c.rope_scaling[0] if c.rope_scaling else None
    scaling = f" ({'llama3 (rope_freqs)' if kind == 'freq_factors' else kind} scaling)" if kind else ""
    print(f"rope_theta {c.rope_theta:g}{scaling}, rms_norm_eps {c.rms_norm_eps:g}, "
          f"tied embeddings {c.tie_word_embeddings}, qkv bias {c.qkv_bias}")
    print(f"parameters:   {model.parameter_count():,}")
    for dtype, n in sorted(model.stored_bytes.items()):
        print(f"weights {dtype}: {n:,} bytes ({n / 2**20:.2f} MiB)")
    by_type, mapped = model.weight_bytes()
    print("run as:       " + ", ".join(f"{t} {n / 2**20:.2f} MiB" for t, n in sorted(by_type.items()))
          + f"; {mapped / 2**20:.2f} MiB of it mapped from the file, {(sum(by_type.values()) - mapped) / 2**20:.2f} MiB in memory")


def main(argv=None):
    try:
        args = build_parser().parse_args(argv)
        args.run(args)
        sys.stdout.flush()          # a write error surfaces here, not in the interpreter's exit
    except TinydiffError as e:
        print(f"tinydiff: error: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        return 130
    except MemoryError as e:        # a KV cache or buffer the machine cannot give
        print(f"tinydiff: error: out of memory{': ' + str(e) if str(e) else ''} (a smaller -c, -n or model?)",
              file=sys.stderr)
        return 1
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except OSError as e:            # stdout on a full disk (> /dev/full), a vanished file
        _quiet_stdout()
        print(f"tinydiff: error: {e.filename + ': ' if e.filename else ''}{e.strerror or e}", file=sys.stderr)
        return 1
    return 0


def _quiet_stdout():
    """Points stdout at /dev/null, so the interpreter's last flush of what could not be written
    does not print a traceback on exit (Python's documented way for a broken pipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
