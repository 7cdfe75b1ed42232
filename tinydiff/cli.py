"""The `tinydiff` command. Flags follow llama.cpp's spellings where one exists (-m, -p, -f, -n, -t,
-s, --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n).

A user's mistake is one line on stderr and exit status 2 (usage) or 1 (model files), never a traceback.
"""
import argparse
import sys

from .errors import TinydiffError, UsageError


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line, exit status 2."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")


def _add_model_args(p):
    p.add_argument("-m", "--model", required=True, help="model folder (config.json, *.safetensors, tokenizer.json)")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")


def _add_sampling_args(p):
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="top-k, 0 = off (default 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="top-p, 1 = off (default 0.95)")
    p.add_argument("--min-p", type=float, default=0.05, help="min-p, 0 = off (default 0.05)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty, 1 = off (default 1.0)")
    p.add_argument("--repeat-last-n", type=int, default=64, help="tokens the penalty looks back at (default 64)")
    p.add_argument("-s", "--seed", type=int, default=None, help="random seed (default: fresh each run)")


def build_parser():
    parser = _Parser(prog="tinydiff", description="CPU inference for autoregressive and masked-diffusion LMs")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text from a prompt, streaming to stdout")
    _add_model_args(g)
    g.add_argument("-p", "--prompt", help="the prompt text")
    g.add_argument("-f", "--file", help="read the prompt from a file ('-' = stdin)")
    g.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate (default 128)")
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--truncate", action="store_true", help="drop the start of a prompt too long for the context")
    g.add_argument("--stats", action="store_true", help="print timings to stderr, as llama.cpp does")
    _add_sampling_args(g)
    g.set_defaults(run=cmd_generate)

    i = sub.add_parser("info", help="architecture, parameter count and weight bytes per dtype")
    _add_model_args(i)
    i.set_defaults(run=cmd_info)
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


def load_model(args):
    from .model import load
    return load(args.model, threads=args.threads)


def cmd_generate(args):
    from .generate import Timings
    prompt = read_prompt(args)
    model = load_model(args)
    timings = Timings()
    pieces = model.stream(prompt, args.n_predict, stop=args.stop, temperature=args.temp,
                          top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                          seed=args.seed, truncate=args.truncate, timings=timings)
    out = sys.stdout
    for piece in pieces:
        out.write(piece)
        out.flush()
    out.write("\n")
    if args.stats:
        print(timings.report(), file=sys.stderr)


def cmd_info(args):
    model = load_model(args)
    c = model.config
    print(f"model:        {args.model}")
    print(f"architecture: {c.model_type}, {'causal' if c.causal else 'bidirectional (masked diffusion)'}")
    print(f"layers {c.num_hidden_layers}, hidden {c.hidden_size}, heads {c.num_attention_heads} "
          f"(kv {c.num_key_value_heads}, head_dim {c.head_dim}), mlp {c.intermediate_size}, "
          f"vocab {c.vocab_size}, context {c.max_position_embeddings}")
    print(f"rope_theta {c.rope_theta:g}, rms_norm_eps {c.rms_norm_eps:g}, "
          f"tied embeddings {c.tie_word_embeddings}, qkv bias {c.qkv_bias}")
    print(f"parameters:   {model.parameter_count():,}")
    for dtype, n in sorted(model.stored_bytes.items()):
        print(f"weights {dtype}: {n:,} bytes ({n / 2**20:.2f} MiB)")


def main(argv=None):
    try:
        args = build_parser().parse_args(argv)
        args.run(args)
    except TinydiffError as e:
        print(f"tinydiff: error: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
