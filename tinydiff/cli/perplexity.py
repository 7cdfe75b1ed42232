"""`tinydiff perplexity`: llama-perplexity's command, its flags and their checks, and its report.

    tinydiff perplexity -m FILE -f TEXT -c 512 --chunks 4           # [1]6.1234,... Final estimate: PPL = X +/- Y
    tinydiff perplexity -m Q8.gguf -f TEXT --kl-against F32.gguf    # KL(ref || model), Same top p, ...

The flags are llama.cpp's (-m, -f, -c/--ctx-size 512, --chunks -1, -b/--batch-size, -t/--threads);
tinydiff.measure.perplexity says what is measured. KL: llama.cpp's two runs (--kl-divergence-base
FILE, then --kl-divergence) are one here, --kl-against REF naming the reference model itself (a
folder, .gguf file or shipped name), run in the same process on the same chunks; the two llama.cpp
flags are refused with that hint rather than left unknown. Every check (files, flags, both models,
the text's length) is made before the first pass.
"""
import argparse
import sys

import numpy as np

from ..errors import UsageError
from ..measure import perplexity as ppl
from ..model import load
from .flags import add_model_args, load_model


def add_perplexity_arguments(p):
    add_model_args(p)
    p.add_argument("-f", "--file", required=True, help="the text to score (read whole, as UTF-8)")
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="tokens a chunk (default 512)")
    p.add_argument("--chunks", type=int, default=-1, help="score the first N chunks (default -1: all)")
    p.add_argument("-b", "--batch-size", type=int, default=None,
                   help="positions a forward pass: below -c a chunk takes several passes, a multiple of -c "
                        "runs that many chunks side by side (default: -c, one chunk a pass)")
    p.add_argument("--kl-against", default=None, metavar="REF",
                   help="reference model (folder, .gguf or shipped name) run on the same chunks: KL(ref || "
                        "model), top-1 agreement and both perplexities, as llama.cpp's --kl-divergence")
    # llama.cpp's two-run spelling, refused with the hint (--kl-divergence-base FNAME, --kl-divergence)
    for flag in ("--kl-divergence-base", "--save-all-logits"):
        p.add_argument(flag, dest="llama_kl", action=_Named, nargs=1, help=argparse.SUPPRESS)
    p.add_argument("--kl-divergence", dest="llama_kl", action=_Named, nargs=0, help=argparse.SUPPRESS)


class _Named(argparse.Action):
    """Keeps the flag's own spelling, for the message that refuses it."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [option_string])


def read_text(path):
    """The file's text, less one trailing newline (llama.cpp's -f does the same)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise UsageError(f"-f {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"-f {path}: is a folder, not a text file") from None
    except OSError as e:
        raise UsageError(f"-f {path}: cannot read ({e.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"-f {path}: not UTF-8 text (byte {e.start})") from None
    return text[:-1] if text.endswith("\n") else text


def _check_flags(args):
    if getattr(args, "llama_kl", None):
        raise UsageError(f"{args.llama_kl[0]}: tinydiff runs the reference in the same process; give it as "
                         "--kl-against REF (a model folder, .gguf file or shipped name)")
    ppl.check_request(args.ctx_size, args.chunks, args.batch_size)


def cmd_perplexity(args):
    _check_flags(args)
    text = read_text(args.file)
    model = load_model(args)                        # default: the shipped autoregressive model
    ppl.check_model(model, args.ctx_size)
    ref = None
    if args.kl_against is not None:
        ref = load(args.kl_against, threads=args.threads)
        ppl.check_model(ref, args.ctx_size, "--kl-against")
        if ref.config.vocab_size != model.config.vocab_size:
            raise UsageError(f"--kl-against {args.kl_against}: a vocabulary of {ref.config.vocab_size} tokens, "
                             f"the model's has {model.config.vocab_size}; the two must share one")
    tokens = ppl.tokenize(model.tokenizer, text)
    bos = model.tokenizer.bos_id if ppl.adds_bos(model.tokenizer) else None
    chunks = ppl.make_chunks(tokens, args.ctx_size, args.chunks, bos, f"-f {args.file}")
    if ref is not None and ppl.tokenize(ref.tokenizer, text)[:chunks.ids.size] != tokens[:chunks.ids.size]:
        raise UsageError(f"--kl-against {args.kl_against}: its tokenizer reads {args.file} into other tokens; "
                         "the two models must share a vocabulary")
    batch = args.ctx_size if args.batch_size is None else args.batch_size
    n_chunk = len(chunks.ids)
    print(f"perplexity: {args.file}: {chunks.tokens} tokens; {n_chunk} chunks of {args.ctx_size} "
          f"({args.ctx_size - 1 - chunks.first} scored each), batch {batch}, "
          f"{'BOS first' if chunks.bos else 'no BOS'}", file=sys.stderr)
    if ref is None:
        _perplexity(model, chunks, batch)
    else:
        _kl(model, ref, chunks, batch)


def _perplexity(model, chunks, batch):
    clock, nll = ppl.Clock(), np.empty(0)
    for i, chunk in enumerate(ppl.chunk_nll(model, chunks, batch)):
        if i == 0:
            print(clock.eta(ppl.passes(len(chunks.ids), chunks.n_ctx, batch)), file=sys.stderr)
        nll = np.concatenate([nll, chunk])
        print(f"[{i + 1}]{ppl.estimate(nll)[0]:.4f},", end="", flush=True)
    value, se = ppl.estimate(nll)
    print(f"\nFinal estimate: PPL = {value:.4f} +/- {se:.5f}")


def _kl(model, ref, chunks, batch):
    clock, agreement = ppl.Clock(), ppl.Agreement.empty()
    for i, rows in enumerate(ppl.chunk_kl(model, ref, chunks, batch)):
        if i == 0:
            print(clock.eta(ppl.passes(len(chunks.ids), chunks.n_ctx, batch)), file=sys.stderr)
            print(ppl.KL_HEADER)
        agreement.add(rows)
        print(ppl.kl_row(i + 1, agreement), flush=True)
    print("\n" + "\n".join(ppl.kl_summary(agreement)))
