"""The `tinydiff` argument parser: each subcommand's flags and the function that runs it (args.run).

Flags follow llama.cpp's spellings where one exists (-m, -p, -f, -n, -t, -s, --temp, --top-k,
--top-p, --min-p, --repeat-penalty, --repeat-last-n). The groups several commands share are in
flags.py; train, curves and eval take theirs from tinydiff.training.
"""
import argparse

from .. import __version__
from ..errors import UsageError
from ..formats import mixes
from ..training.curves import add_curves_arguments, run_curves
from ..training.evaluate import add_eval_arguments, run_eval
from ..training.settings import add_train_arguments
from ..training.train import run_train
from .flags import add_batch_invariant_arg, add_decoding_args, add_diffusion_args, add_draft_args, add_model_args
from .generate import cmd_chat, cmd_generate, cmd_infill, cmd_serve
from .perplexity import add_perplexity_arguments, cmd_perplexity
from .tools import (
    cmd_bench,
    cmd_compare,
    cmd_convert,
    cmd_cost,
    cmd_info,
    cmd_models,
    cmd_roofline,
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line, exit status 2."""

    def error(self, message):
        command = self.prog.removeprefix("tinydiff").strip()      # the subcommand; main() says "tinydiff: error:"
        raise UsageError(f"{command}: {message}" if command else message)


def build_parser():
    parser = _Parser(prog="tinydiff", description="CPU inference for autoregressive and masked-diffusion LMs")
    parser.add_argument("--version", action="version", version=f"tinydiff {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (_generate, _chat, _serve, _infill, _bench, _cost, _compare, _roofline, _perplexity, _training, _models,
                _info, _convert):   # the order of `tinydiff --help`
        add(sub)
    return parser


def _generate(sub):
    g = sub.add_parser("generate", help="generate text from a prompt, streaming to stdout")
    add_model_args(g)
    g.add_argument("-p", "--prompt", help="the prompt text")
    g.add_argument("-f", "--file", help="read the prompt from a file ('-' = stdin)")
    g.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate (default 128)")
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--truncate", action="store_true",
                   help="drop the start of a prompt too long for the context (autoregressive only)")
    g.add_argument("--no-display-prompt", dest="display_prompt", action="store_false",
                   help="print only the completion, not the prompt before it")
    g.add_argument("--stats", action="store_true", help="print timings to stderr, as llama.cpp does")
    add_decoding_args(g)
    g.set_defaults(run=cmd_generate)


def _chat(sub):
    c = sub.add_parser("chat", help="talk with an instruct model through its chat template (/reset, /exit)")
    add_model_args(c)
    c.add_argument("--system", default=None, help="system message")
    c.add_argument("-n", "--n-predict", type=int, default=256, help="tokens per answer at most (default 256)")
    c.add_argument("-c", "--ctx-size", type=int, default=None,
                   help="positions the conversation may take (default: the model's context, at most 4096)")
    c.add_argument("--chat-template-file", default=None,
                   help="a Jinja chat template to use instead of the model's")
    add_decoding_args(c)
    c.set_defaults(run=cmd_chat)


def _serve(sub):
    v = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs the [serve] extra)")
    add_model_args(v)
    v.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    v.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    v.add_argument("--slots", type=int, default=4, help="requests decoded at once (default 4)")
    v.add_argument("-c", "--ctx-size", type=int, default=None,
                   help="positions per request, prompt and answer (default: the model's context, at most 4096)")
    v.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    add_draft_args(v)
    v.set_defaults(run=cmd_serve)


def _infill(sub):
    f = sub.add_parser("infill", help="fill the [MASK] / [MASK*N] holes of a text (masked-diffusion models)")
    add_model_args(f)
    f.add_argument("-p", "--prompt", required=True, help='text with holes, e.g. "The [MASK*3] sat on the mat."')
    f.add_argument("--stats", action="store_true", help="print forward passes and time per step to stderr")
    f.add_argument("--temp", type=float, default=None, help="temperature; 0 = greedy (default 0)")
    f.add_argument("-s", "--seed", type=int, default=None, help="random seed")
    f.add_argument("--repeat-penalty", type=float, default=None, help="repetition penalty, 1 = off (default 1.0)")
    f.add_argument("--repeat-last-n", type=int, default=None,
                   help="the known tokens this near a hole are penalised, on either side (default 64)")
    add_diffusion_args(f)
    f.set_defaults(run=cmd_infill)


def _bench(sub):
    b = sub.add_parser("bench", help="llama-bench style speed tests (pp, tg, dd / bd for diffusion, kp: k-row passes)")
    b.add_argument("-m", "--model", action="append", default=None, help="model folder or .gguf file (repeatable)")
    b.add_argument("--shape", action="append", default=None,
                   help="a real model shape with random weights (default without -m: all of them)")
    b.add_argument("-p", "--n-prompt", type=int, action="append", default=None,
                   help="pp test sizes (default 512; 0: no pp test, as llama-bench)")
    b.add_argument("-n", "--n-gen", type=int, action="append", default=None,
                   help="tg test sizes (default 128; 0: no tg test)")
    b.add_argument("-d", "--diffusion", action="append", default=None,
                   help="dd tests as LxS: canvas L for S steps (default 256x4; 0: no dd test)")
    b.add_argument("-b", "--block-diffusion", action="append", default=None,
                   help="bd tests as NxBxS: N tokens in blocks of B, S steps a block (default 128x8x2; 0: none)")
    b.add_argument("-k", "--k-rows", type=int, action="append", default=None,
                   help="kp tests: one pass of K rows after a 64-position prompt, its time in decode steps and "
                        "against the roofline (default 1, 2, 4, 8, 16, 32, those that fit; 0: no kp test)")
    b.add_argument("--type", default=None,
                   help="weight types to run each model in, quantized in memory, e.g. f32,q8_0,q4_0 "
                        "(default: as loaded); the t/s of each type is also given as a ratio to the first")
    b.add_argument("--npl", default=None, metavar="B1,B2,...",
                   help="sequences decoded as one batch in the tg tests, as llama-batched-bench's -npl "
                        "(e.g. 1,2,4,8,16; tg alone always runs too)")
    b.add_argument("-r", "--repetitions", type=int, default=3, help="repetitions of each test (default 3)")
    b.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    add_batch_invariant_arg(b)
    b.add_argument("--json", action="store_true", help="print JSON instead of the table")
    b.add_argument("--no-roofline", action="store_true", help="skip the roofline measurement (no %% column)")
    b.set_defaults(run=cmd_bench)


def _cost(sub):
    c = sub.add_parser("cost", help="AR decoding and masked diffusion side by side: bytes, FLOPs, time")
    c.add_argument("-m", "--model", action="append", default=None,
                   help="model folder or .gguf file; give an AR and a diffusion model "
                        "(default: the two shipped models)")
    c.add_argument("-p", "--prompt", default="Once upon a time", help="the prompt (default 'Once upon a time')")
    c.add_argument("-n", "--n-predict", type=int, default=64, help="tokens to generate (default 64)")
    c.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    add_diffusion_args(c, visual=False)
    add_draft_args(c)
    c.add_argument("--type", default=None, metavar="T1,T2,...",
                   help="also run with the matrices stored as these weight types (f32,f16,bf16,q8_0,q4_0), "
                        "quantized in memory: bytes per token fall with the type, a large step's time much less")
    c.add_argument("--plot", default=None, help="draw the runs on the roofline into FILE.svg (or .png)")
    c.set_defaults(run=cmd_cost)


def _compare(sub):
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
    cm.add_argument("--sweep", action="store_true",
                    help="each diffusion model over a grid of commit rules, gaps, block sizes and repetition "
                         "penalties; picks the fastest within 1.25x the AR twin's judged perplexity and 10%% "
                         "rep4 (how the shipped defaults were chosen: training/sweep.py)")
    cm.add_argument("--plot", default=None, help="draw ms per token against judged perplexity into FILE.svg")
    cm.set_defaults(run=cmd_compare)


def _roofline(sub):
    r = sub.add_parser("roofline", help="measure this machine: memory and cache bandwidth, peak FLOP/s")
    r.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    r.add_argument("--remeasure", action="store_true", help="measure again instead of reading the cache")
    r.set_defaults(run=cmd_roofline)


def _perplexity(sub):
    p = sub.add_parser("perplexity", help="llama-perplexity's figure of a text: chunks of -c tokens, the second "
                                          "half of each scored; KL against a reference model (--kl-against)")
    add_perplexity_arguments(p)
    p.set_defaults(run=cmd_perplexity)


def _training(sub):
    """train, curves and eval: tinydiff.training's commands, which bring their own flags."""
    for name, help, add_arguments, run in (
            ("train", "train a small model, autoregressive or masked diffusion (needs .[train])",
             add_train_arguments, run_train),
            ("curves", "validation bits per byte against epochs of training runs, on one axis (SVG)",
             add_curves_arguments, run_curves),
            ("eval", "held-out bits per byte (AR exact, MDM ELBO), judge perplexity, KL --against",
             add_eval_arguments, run_eval)):
        p = sub.add_parser(name, help=help)
        add_arguments(p)
        p.set_defaults(run=run)


def _models(sub):
    ms = sub.add_parser("models", help="the models that ship with tinydiff: names for -m, and their folders")
    ms.set_defaults(run=cmd_models)


def _info(sub):
    i = sub.add_parser("info", help="architecture, parameter count and weight bytes per dtype")
    add_model_args(i, runs=False)
    i.add_argument("--check-tensors", action="store_true",
                   help="first read every tensor and name each that holds a NaN or an inf (llama.cpp's "
                        "--check-tensors); exit 1 if any does")
    i.set_defaults(run=cmd_info)


def _convert(sub):
    v = sub.add_parser("convert", help="write a Hugging Face model folder as a GGUF file (llama.cpp's format), "
                                       "or a GGUF file in another type (as llama-quantize)")
    v.add_argument("-m", "--model", required=True, help="Hugging Face model folder, or a .gguf file")
    v.add_argument("--type", default="f16", type=str.lower, choices=mixes.CHOICES, metavar="TYPE",
                   help="f32, f16, bf16, q8_0, q4_0: every matrix that type; q4_1, q5_0, q5_1, q4_k_m, q4_k_s, "
                        "q5_k_m, q5_k_s, q6_k (q4_k, q5_k: aliases of the _m ones): llama-quantize's mix of types "
                        "for it; norms stay f32 (default f16)")
    v.add_argument("--allow-requantize", action="store_true",
                   help="requantize a GGUF file's tensors that are already in a block type (as llama-quantize)")
    v.add_argument("-o", "--output", required=True, help="the .gguf file to write")
    v.set_defaults(run=cmd_convert)
