"""The commands that run a model for a user: generate, chat, infill and serve.

Each checks every flag before it prints anything (a UsageError, exit 2), then writes the text to
stdout as it comes; --stats goes to stderr.
"""
import os
import sys

import numpy as np

from ..chat import Chat
from ..decoding.diffusion import to_the_end
from ..decoding.generate import Timings, cut_at_stop
from ..decoding.visual import LiveView
from ..errors import ModelError, TinydiffError, UsageError
from ..formats.chat_template import ChatTemplate
from .flags import (
    ar_sampling,
    checked_seed,
    diffusion_options,
    diffusion_sampling,
    load_model,
    refuse_other_modes_flags,
    speculator,
)


def cmd_generate(args):
    prompt = read_prompt(args)
    seed = checked_seed(args.seed)
    model = load_model(args)
    mode = args.mode or ("ar" if model.config.causal else "diffusion")
    refuse_other_modes_flags(args, mode)
    if mode == "diffusion":
        return run_diffusion(args, model, prompt, seed=seed, echo=args.display_prompt)
    timings = Timings()
    pieces = model.stream(prompt, args.n_predict, stop=args.stop, **ar_sampling(args), seed=seed,
                          truncate=args.truncate, timings=timings, draft=speculator(args, model))   # checked: nothing printed yet
    if args.display_prompt:
        _write(prompt)
    for piece in pieces:
        _write(piece)
    _write("\n")
    if args.stats:
        print(timings.report(), file=sys.stderr)


def read_prompt(args):
    """-p's text, or -f's file ('-' or nothing given on a pipe: stdin), read as UTF-8."""
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
        data = sys.stdin.buffer.read() if args.file == "-" else _read_bytes(args.file)
    except OSError as e:
        raise UsageError(f"{where}: cannot read ({e.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{where}: invalid UTF-8 at byte {e.start}") from None


def _read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def _write(text):
    sys.stdout.write(text)
    sys.stdout.flush()


def cmd_infill(args):
    seed = checked_seed(args.seed)
    model = load_model(args)
    run_diffusion(args, model, args.prompt, infill=True, seed=seed)


def run_diffusion(args, model, prompt, infill=False, seed=None, echo=False):
    """Denoises the prompt's answer (or its holes, infill) and prints it, redrawn live with --visual."""
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
    seed = checked_seed(args.seed)
    model = load_model(args)
    mode = args.mode or ("ar" if model.config.causal else "diffusion")
    refuse_other_modes_flags(args, mode)
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
        spec = speculator(args, model, chat.n_ctx)
        options.update({"draft": spec} if spec else {})
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
    try:   # here, not at the top: starlette and uvicorn are the [serve] extra, and --help needs neither
        from ..serve.server import serve
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
    spec = speculator(args, model, args.ctx_size)
    name = os.path.basename(os.path.normpath(model.path))
    draft = f", drafts: {spec.name}" if spec else ""
    print(f"tinydiff serve: {name} on http://{args.host}:{args.port}/v1 ({args.slots} slots{draft})", file=sys.stderr,
          flush=True)
    serve(model, name, args.host, args.port, args.slots, args.ctx_size, args.api_key, spec)
