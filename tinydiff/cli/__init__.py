"""The `tinydiff` command: main() parses the arguments and runs the subcommand they name.

A user's mistake is one line on stderr and exit status 2 (usage) or 1 (model files), never a
traceback; so are running out of memory and a stdout that cannot be written (exit 1). A closed
pipe on stdout ends the run quietly (exit 0), Ctrl-C with 130.

parser.py holds the flags of every subcommand, flags.py the groups several share; generate.py the
commands that run a model for a user (generate, chat, infill, serve), tools.py those that measure,
describe or convert one (bench, cost, compare, roofline, models, info, convert); perplexity.py
`tinydiff perplexity`, with its flags (llama-perplexity's).
"""
import os
import sys

from ..errors import NonFiniteLogits, TinydiffError
from .generate import _answer  # noqa: F401 (tests/test_chat.py drives one chat turn through cli._answer)
from .parser import build_parser


def main(argv=None):
    args = None
    try:
        args = build_parser().parse_args(argv)
        args.run(args)
        sys.stdout.flush()          # a write error surfaces here, not in the interpreter's exit
    except NonFiniteLogits as e:    # which tensors, as `info --check-tensors` finds them
        print(f"tinydiff: error: {e}{_nonfinite_tensors(args)}", file=sys.stderr)
        return e.exit_status
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


def _nonfinite_tensors(args):
    """'; blk.0.attn_q.weight holds NaN or inf (3 of 4096)...' for the model the run used."""
    from ..model import check_tensors
    from .flags import model_location
    try:
        found = check_tensors(model_location(args))
    except TinydiffError:
        return ""
    named = ", ".join(f"{name} ({bad} of {n})" for name, _, n, bad in found[:3])
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return f"; NaN or inf in {named}{more} (tinydiff info --check-tensors lists them)" if found else ""


def _quiet_stdout():
    """Points stdout at /dev/null, so the interpreter's last flush of what could not be written
    does not print a traceback on exit (Python's documented way for a broken pipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
