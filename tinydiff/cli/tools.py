"""The tool commands, which measure, describe or convert models rather than run them for a user:
bench, cost, compare, roofline, models, info and convert (train, curves and eval are
tinydiff.training's own).

Each checks its flags and every model before the first measurement (minutes of it, for bench and
compare), then prints its table or report to stdout.
"""
import os
import sys

from ..convert import convert
from ..errors import ModelError, UsageError
from ..formats.quant import TYPES

# the module, its load_or_measure read at each call: a machine put in its place (tests do) is the one used
from ..measure import roofline as machine
from ..measure import table as cost_table
from ..measure.bench import (
    HEADER,
    KP_PROMPT,
    MAX_SEQUENCES,
    as_json,
    batch_ratios,
    bench,
    block_ratios,
    check_fits,
    kp_ratios,
    parse_test,
    type_ratios,
    weight_bandwidth,
)
from ..measure.shapes import SHAPES, random_model, shape_config
from ..model import (
    DEFAULT_MODELS,
    check_tensors,
    default_model_path,
    load,
    model_path,
    set_batch_invariant,
    set_threads,
    shipped_models,
)
from ..training import sweep
from ..training.compare import HEADER as COMPARE_HEADER
from ..training.compare import compare, table
from .flags import diffusion_options, load_model, model_location, speculator

KP_DEFAULT = (1, 2, 4, 8, 16, 32)   # bench's k-row passes unless -k says (issue 39: a block step, a verify pass)


def cmd_bench(args):
    set_batch_invariant(not args.no_batch_invariant)
    if args.threads is not None:
        set_threads(args.threads)
    if args.repetitions < 1:
        raise UsageError(f"bench: repetitions must be >= 1, got {args.repetitions}")
    asked = _bench_tests(args, None)
    if not asked:
        raise UsageError("bench: every test kind is 0 (-p, -n, -d, -b, -k): no test to run")
    for spec in asked:
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
    roofline = None if args.no_roofline else machine.load_or_measure(args.threads)
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
            for r in bench(cost_table.stored_as(model, wtype), label, tests, args.repetitions, roofline):
                results.append(r)
                if not args.json:
                    print(r.row(), flush=True)
    if args.json:
        print(as_json(results))
        return
    for lines in (weight_bandwidth(results, roofline), batch_ratios(results, roofline), block_ratios(results),
                  kp_ratios(results), type_ratios(results, types) if len(types) > 1 else ""):
        if lines:
            print("\n" + lines)


def _bench_tests(args, n_ctx):
    """The test specs: the ones asked for, else llama-bench's defaults (pp512, tg128, and dd256x4,
    bd128x8x2, kp1 .. kp32) made to fit a context of n_ctx positions (None: as they are). A size of
    0 asks for no test of its kind, as llama-bench's -p 0 / -n 0."""
    fit = (lambda n: n) if n_ctx is None else (lambda n: min(n, n_ctx - 1))   # tg and bd read one more
    batches = sorted({1, *_npl(args.npl)})
    rows = [k for k in KP_DEFAULT if n_ctx is None or KP_PROMPT + k <= n_ctx]
    return ([f"pp{n}" for n in _asked(args.n_prompt, [fit(512)])]
            + [f"tg{n}" if b == 1 else f"tg{n}x{b}" for n in _asked(args.n_gen, [fit(128)]) for b in batches]
            + [f"dd{d}" for d in _asked(args.diffusion, [f"{fit(256)}x4"])]
            + [f"bd{b}" for b in _asked(args.block_diffusion, [f"{fit(128) // 8 * 8}x8x2"])]
            + [f"kp{k}" for k in _asked(args.k_rows, rows)])


def _asked(given, default):
    """A flag's test sizes: default when not given, else those given but 0 (0 alone: none)."""
    return default if given is None else [v for v in given if v not in (0, "0")]


def _npl(text):
    """--npl 1,2,4,8: the batch sizes, each 1..MAX_SEQUENCES."""
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
    if text is None:
        return [None]
    types = [t.strip() for t in text.split(",")]
    for t in types:
        if t not in TYPES:
            raise UsageError(f"{command}: unknown weight type {t!r} in --type; choose from {', '.join(TYPES)}")
    return types


def cmd_cost(args):
    if args.threads is not None:
        set_threads(args.threads)
    if args.n_predict < 1:
        raise UsageError(f"cost: the number of tokens to generate must be >= 1, got {args.n_predict}")
    if args.plot:
        _plot().check_plot_path(args.plot)                 # before minutes of measuring, not after
    ar, dm = _cost_models(args.model or [default_model_path("ar"), default_model_path("diffusion")], args.threads)
    if dm is None:
        print("note: no masked-diffusion model given: diffusion runs use the AR weights read "
              "bidirectionally, so their costs are real but their commits per pass are not", file=sys.stderr)
        dm = cost_table.bidirectional_twin(ar)
    roofline = machine.load_or_measure(args.threads)
    runs = cost_table.cost_runs(ar, dm, args.prompt, args.n_predict, diffusion_options(args),
                                _weight_types(args.type), roofline, _draft(args, ar))
    print(cost_table.table(runs, roofline))
    if args.plot:
        _plot().roofline_svg(roofline, cost_table.plot_points(runs, dm), args.plot)
        print(f"roofline plot: {args.plot}")


def _draft(args, ar):
    """(draft, draft_max, ngram sizes) of cost's --draft flags, checked on the AR model before any run, or None."""
    if args.draft is None:
        speculator(args, ar)                              # refuses the tuning flags without --draft
        return None
    if ar is None:
        raise UsageError("cost: --draft speculates for the autoregressive model: give one with -m")
    speculator(args, ar)
    return args.draft, args.draft_max, (args.draft_ngram_min, args.draft_ngram_max)


def _cost_models(paths, threads):
    """(the causal model, the masked-diffusion one) of the -m paths, either None; one of each at most."""
    models = [load(p, threads=threads) for p in paths]
    ar = next((m for m in models if m.config.causal), None)
    dm = next((m for m in models if m.config.mask_token_id is not None), None)
    if ar is None and dm is None:
        raise UsageError("cost: give a causal model, a masked-diffusion model, or both with -m")
    unused = [p for p, m in zip(paths, models) if m is not ar and m is not dm]
    if unused:   # one of each kind is set side by side
        raise UsageError(f"cost: {unused[0]} would not be measured: give at most one causal model and one "
                         "masked-diffusion model")
    return ar, dm


def cmd_compare(args):
    if args.n_predict < 1 or args.samples < 1:
        raise UsageError("compare: -n and --samples must be >= 1")
    if not 0 < args.repeat_penalty < float("inf"):
        raise UsageError(f"compare: --repeat-penalty must be > 0 and finite, got {args.repeat_penalty:g}")
    if args.threshold is not None and not 0 < args.threshold <= 1:
        raise UsageError(f"compare: --threshold must be in (0, 1], got {args.threshold:g}")
    if args.sweep and (args.threshold is not None or args.gap or args.repeat_penalty != 1.0):
        raise UsageError("compare: --sweep sets the rule, gap and repetition penalty of every setting itself; "
                         "leave out --threshold, --gap and --repeat-penalty")
    if args.gap < 0 or args.gap and args.threshold is None:
        raise UsageError(f"compare: --gap {args.gap}: give N >= 1 with --threshold (it spaces its picks)")
    if args.plot:
        _plot().check_plot_path(args.plot)                 # before minutes of measuring, not after
    ar = load(args.ar, threads=args.threads)
    if not ar.config.causal:
        raise UsageError(f"compare: --ar {args.ar} is not an autoregressive model")
    mdm, bd = (None if name == "none" else load(name, threads=args.threads) for name in (args.mdm, args.bd))
    for flag, m in (("--mdm", mdm), ("--bd", bd)):
        if m is not None and (m.config.causal or (flag == "--bd") != bool(m.config.block_size)):
            raise UsageError(f"compare: {flag} {m.path} is not a {'block' if flag == '--bd' else 'masked'}-"
                             "diffusion model")
    roofline = machine.load_or_measure(args.threads)
    if args.sweep:
        return _sweep(args, ar, {"masked": mdm, "block": bd}, roofline)
    rows = compare(ar, mdm, bd, ar, args.n_predict, args.samples, args.temp, roofline, args.repeat_penalty,
                   args.threshold, args.gap)
    print(table(rows, roofline, args.n_predict, args.samples, args.temp, args.repeat_penalty))
    if args.plot:
        _plot().tradeoff_svg([(r.label, r.seconds / r.tokens * 1e3, r.judged.perplexity) for r in rows], args.plot)
        print(f"plot: {args.plot}")


def _sweep(args, ar, models, roofline):
    """compare --sweep: every setting's row as it is judged, then each model's pick and its
    generation_config.json keys, and the plot (the picks and the AR twin labelled)."""
    models = {kind: m for kind, m in models.items() if m is not None}
    print(f"{args.samples} samples of {args.n_predict} tokens after story openings, temperature {args.temp:g}; "
          "per generated token; judged by the AR model")
    print(COMPARE_HEADER)
    refs, settings = sweep.run(ar, models, args.n_predict, args.samples, args.temp, roofline)
    picks = []
    for kind in models:
        best, met, why = sweep.pick(kind, refs, settings, args.n_predict)
        print(why)
        print(f"  generation_config.json: {sweep.generation_config(best, args.temp)}")
        picks.append(best)
    if args.plot:
        points = [("AR twin" if s.options == {} else "", s, "autoregressive") for s in refs.values()]
        points += [("pick" if s in picks else "", s, s.model) for s in settings]
        _plot().tradeoff_svg([(label, sweep.ms_per_token(s.row), s.row.judged.perplexity, group)
                              for label, s, group in points], args.plot)
        print(f"plot: {args.plot}")


def _plot():
    """tinydiff.measure.plot, imported only by a run that draws: its xml.sax.saxutils brings in
    urllib.request, http.client and ssl, some 20 ms of every other command's start-up."""
    from ..measure import plot
    return plot


def cmd_roofline(args):
    if args.threads is not None:
        set_threads(args.threads)
    print(machine.report(machine.load_or_measure(args.threads, remeasure=args.remeasure)))


def _check_tensors(args):
    found = check_tensors(model_location(args))
    for name, kind, n, bad in found:
        print(f"tensor {name} ({kind}): {bad} of its {n:,} {'numbers' if kind.upper() in ('F32', 'F16', 'BF16') else 'blocks'} "
              "NaN or inf")
    if found:
        raise ModelError(f"{model_location(args)}: {len(found)} tensor{'s' if len(found) > 1 else ''} hold NaN or inf "
                         f"({', '.join(name for name, *_ in found[:3])}{', ...' if len(found) > 3 else ''})")
    print("check-tensors: every tensor finite")


def cmd_convert(args):
    try:
        result = convert(model_path(args.model), args.output, args.type, args.allow_requantize)
    except OSError as e:
        raise UsageError(f"{args.output}: cannot write ({e.strerror})") from None
    if isinstance(result, dict):   # a GGUF file requantized: how many tensors of each type
        print(f"types: {', '.join(f'{t} {n}' for t, n in sorted(result.items()))}", file=sys.stderr)
    elif result:   # llama.cpp's converter does the same, with the same warning
        print(f"note: {len(result)} matrices with rows that are not whole {args.type} blocks of 32 are "
              f"stored as f16 ({', '.join(result[:3])}{', ...' if len(result) > 3 else ''})", file=sys.stderr)
    print(f"wrote {args.output}")


def cmd_models(args):
    defaults = {name: mode for mode, name in DEFAULT_MODELS.items()}
    for name, path in shipped_models().items():
        note = f"  (default for --mode {defaults[name]})" if name in defaults else ""
        print(f"{name:16s} {path}{note}")


def cmd_info(args):
    if args.check_tensors:      # before the load, which refuses a NaN block scale at the first
        _check_tensors(args)
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
