"""The flag groups several commands share, each beside the function that reads it back: the model
flags and the model they name, the sampling flags, the masked-diffusion flags (built from
decoding.diffusion.Options) and the denoising keywords they set.

A value a flag cannot take is a UsageError here, before a model is loaded or anything printed.
"""
from ..decoding.diffusion import Options
from ..errors import UsageError
from ..model import default_model_path, load, set_batch_invariant

# flags that only one mode reads: given in the other, they are refused rather than ignored
AR_ONLY = {"truncate": "--truncate", "min_p": "--min-p", "draft": "--draft", "draft_max": "--draft-max",
           "draft_ngram_min": "--draft-ngram-min", "draft_ngram_max": "--draft-ngram-max"}


def add_model_args(p, runs=True):
    """-m and -t, and where the command runs the model (runs) --no-batch-invariant."""
    p.add_argument("-m", "--model", default=None,
                   help="model folder (config.json, *.safetensors, tokenizer.json), .gguf file or shipped "
                        "model name (tinydiff models); default: the shipped model for the mode")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    if runs:
        add_batch_invariant_arg(p)


def add_batch_invariant_arg(p):
    p.add_argument("--no-batch-invariant", action="store_true",
                   help="let the GEMMs and attention tiles that sum many rows in their own order take over: "
                        "faster prefill, but a request's answer may then depend on the requests beside it")


def load_model(args):
    """The model -m names, or the shipped one for the run's mode."""
    if args.model == "":
        raise UsageError("-m/--model is empty: give a model folder, a .gguf file or a shipped model's name")
    if "" in (getattr(args, "stop", None) or []):
        raise UsageError("--stop \"\": a stop string must not be empty (it would end every answer at once)")
    set_batch_invariant(not getattr(args, "no_batch_invariant", False))
    return load(model_location(args), threads=args.threads)


def model_location(args):
    """What -m names (a folder, a .gguf file or a shipped name), or the shipped model for the run's mode."""
    return args.model or default_model_path("diffusion" if getattr(args, "mode", None) == "diffusion"
                                            or args.command == "infill" else "ar")


def add_sampling_args(p):
    p.add_argument("--temp", type=float, default=None,
                   help="temperature; 0 = greedy (default 0.8; masked diffusion: 0). A model whose "
                        "generation_config.json sets do_sample or a repetition penalty (a diffusion model: also "
                        "its commit rule) gives its own values as defaults (engine/config.py says how); a flag "
                        "overrides each")
    p.add_argument("--top-k", type=int, default=None, help="top-k, 0 = off (default 40; masked diffusion: 0)")
    p.add_argument("--top-p", type=float, default=None, help="top-p, 1 = off (default 0.95; masked diffusion: 1)")
    p.add_argument("--min-p", type=float, default=None, help="min-p, 0 = off (default 0.05; autoregressive only)")
    p.add_argument("--repeat-penalty", type=float, default=None,
                   help="repetition penalty, 1 = off (default 1.0)")
    p.add_argument("--repeat-last-n", type=int, default=None,
                   help="tokens the penalty looks back at, 0 = off (default 64; masked diffusion: the known "
                        "tokens this near a masked position, on either side)")
    p.add_argument("-s", "--seed", type=int, default=None, help="random seed (default or -1: fresh each run)")


def checked_seed(value):
    """-s: a seed >= 0, or -1 (llama.cpp's spelling) / none for a fresh one each run."""
    if value is not None and value < -1:
        raise UsageError(f"-s/--seed must be >= 0, or -1 for a random seed; got {value}")
    return None if value == -1 else value


def ar_sampling(args):
    """The sampling flags given; the model's defaults (generation_config.json, else llama.cpp's) fill the rest."""
    given = {"temperature": args.temp, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
             "repeat_penalty": args.repeat_penalty, "repeat_last_n": args.repeat_last_n}
    return {name: value for name, value in given.items() if value is not None}


def diffusion_sampling(args, seed):
    """The token choice of a denoising run, as the flags given say (infill has no --top-k / --top-p);
    the model's defaults (generation_config.json), else LLaDA's greedy ones, fill the rest."""
    given = {"temperature": args.temp, "top_k": getattr(args, "top_k", None), "top_p": getattr(args, "top_p", None),
             "repeat_penalty": getattr(args, "repeat_penalty", None),
             "repeat_last_n": getattr(args, "repeat_last_n", None)}
    return {"seed": seed, **{k: v for k, v in given.items() if v is not None}}


def add_diffusion_args(p, visual=True):
    """A flag for each field of diffusion.Options that names one; None is spelled "none" here only."""
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
    given = {f.name: getattr(args, f.name) for f in Options.flagged() if getattr(args, f.name) is not None}
    return {name: None if value == "none" else value for name, value in given.items()}


def add_decoding_args(p):
    """--mode, then the sampling, speculative and denoising flags: how generate and chat decode."""
    p.add_argument("--mode", choices=["ar", "diffusion"], default=None,
                   help="autoregressive or masked diffusion (default: what the model was trained for)")
    add_sampling_args(p)
    add_draft_args(p)
    add_diffusion_args(p)


def add_draft_args(p):
    """Speculative decoding (decoding/speculative.py): the same output, fewer passes when drafts are taken."""
    d = p.add_argument_group("speculative decoding (autoregressive)")
    d.add_argument("--draft", default=None, metavar="ngram|MODEL",
                   help="draft tokens and verify them in one pass: 'ngram' (prompt lookup: copied from the prompt "
                        "and the text so far) or a smaller model with the same vocabulary (causal, or block "
                        "diffusion as stories5m-bd); the output is the one without it, token for token")
    d.add_argument("--draft-max", type=int, default=None, help="most tokens drafted a verify pass (default 8)")
    d.add_argument("--draft-ngram-max", type=int, default=None,
                   help="--draft ngram: the longest n-gram looked up, tried from it down (default 4)")
    d.add_argument("--draft-ngram-min", type=int, default=None,
                   help="--draft ngram: the shortest n-gram that drafts (default 3: shorter matches draft mostly "
                        "wrong tokens, each a row of the verify pass)")


def speculator(args, model, n_ctx=None):
    """The Speculator --draft names (Model.speculator checks it), or None; --draft-max and the n-gram
    sizes only with the --draft they tune."""
    ngram = (args.draft_ngram_min, args.draft_ngram_max)
    given = [flag for name, flag in (("draft_max", "--draft-max"), ("draft_ngram_min", "--draft-ngram-min"),
                                     ("draft_ngram_max", "--draft-ngram-max")) if getattr(args, name) is not None]
    if args.draft is None and given:
        raise UsageError(f"{given[0]} tunes --draft: give --draft ngram or --draft MODEL with it")
    if ngram != (None, None) and args.draft != "ngram":
        raise UsageError(f"{[g for g in given if 'ngram' in g][0]} is an n-gram size of --draft ngram")
    if args.draft is None:
        return None
    if args.draft == "":
        raise UsageError("--draft is empty: give 'ngram' or a model folder, .gguf file or shipped model's name")
    return model.speculator(args.draft, args.draft_max, n_ctx, ngram)


def refuse_other_modes_flags(args, mode):
    """A decoding flag that the run's mode would not read is a usage error, not ignored."""
    if mode == "diffusion":
        given = [flag for name, flag in AR_ONLY.items() if getattr(args, name, None) not in (None, False)]
    else:
        given = [f.metadata["flag"] for f in Options.flagged()
                 if getattr(args, f.name) is not None] + (["--visual"] if args.visual else [])
    if given:
        other = "masked diffusion" if mode == "ar" else "autoregressive decoding"
        this = "autoregressive" if mode == "ar" else "masked diffusion"
        raise UsageError(f"{given[0]} is a flag of {other}; this run is {this} (--mode {mode})")
