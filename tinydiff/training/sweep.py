"""`tinydiff compare --sweep`: the grid the shipped diffusion models' defaults were chosen from.

Takes the AR twin (also the judge) and the diffusion models compare takes; each writes the samples
compare's rows write (sample i continues OPENINGS[i % 8] with seed i, at one temperature), once for
each setting of its grid (grid(): every combination of the commit rule (RULES: a fixed count a
step, or a confidence threshold with a gap between a step's commits), the block size (BLOCK_SIZES,
a block model) and the repetition penalty (PENALTIES)); the AR twin once for each penalty. Guarantees, for each diffusion model, the
pick (pick()): of the settings whose judged perplexity is within QUALITY x the AR twin's own (the
AR twin's samples at the same temperature and penalty, judged by itself) and whose rep4 is at most
MAX_REP4, the fastest in measured ms per token; if there is none, it says so and names the setting
of best judged perplexity among those of rep4 <= MAX_REP4. The rule is the one issue 39 set; the
pick's options are what a model's generation_config.json holds (Config.denoising_defaults).
"""
import json
from dataclasses import dataclass

from .compare import run_setting

QUALITY = 1.25      # a setting's judged perplexity at most this times the AR twin's
MAX_REP4 = 0.10     # and at most this share of its 4-grams already written
PENALTIES = (1.0, 1.2, 1.3)
# the commit rules: (steps a token, None) a fixed count, or (None, (threshold, gap)) Fast-dLLM's rule
RULES = {"masked": [(1, None), (2, None)] + [(None, (t, g)) for t in (0.9, 0.5, 0.3, 0.1) for g in (0, 4, 10)],
         "block": [(1, None), (2, None)] + [(None, (t, g)) for t in (0.9, 0.7, 0.5, 0.3) for g in (0, 1)]}
BLOCK_SIZES = (8, 16)


@dataclass
class Setting:
    model: str          # "masked" or "block", or "autoregressive"
    options: dict       # the denoising (or sampling) keywords it sets; the rest are Options' defaults
    row: object = None  # compare.Row, once run

    @property
    def label(self):
        return f"{self.model}: " + ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in self.options.items())


def grid(kind, n):
    """The Settings of one diffusion model (kind "masked" or "block"; n tokens a sample), each naming
    all it sets (a model's own defaults play no part)."""
    out = []
    for penalty in PENALTIES:
        for blocks in (BLOCK_SIZES if kind == "block" else (None,)):
            for per_step, rule in RULES[kind]:
                o = {} if blocks is None else {"block_size": blocks}
                if rule is None:
                    o["steps"] = n // per_step
                else:
                    o["threshold"] = rule[0]
                    o.update({"gap": rule[1]} if rule[1] else {})
                if penalty != 1.0:
                    o["repeat_penalty"] = penalty
                out.append(Setting(kind, o))
    return out


def run(ar, models, n, samples, temperature, roofline, log=print):
    """(AR Settings by penalty, [Setting] of every diffusion model): each run and judged by ar.
    models: {"masked": Model, "block": Model} (either may be left out)."""
    def generate_ar(penalty):
        return lambda p, s: ar.generate_ids(p, n, temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=s,
                                            repeat_penalty=penalty, repeat_last_n=64)

    def denoise(model, options):
        options = {"repeat_penalty": 1.0, "repeat_last_n": 64, **options}     # none of the model's defaults
        return lambda p, s: model.denoise_ids(p, n, temperature=temperature, seed=s, **options)

    refs = {}
    for penalty in PENALTIES:
        ref = Setting("autoregressive", {"repeat_penalty": penalty} if penalty != 1.0 else {})
        ref.row = run_setting(ref.label, ar, generate_ar(penalty), ar, samples, roofline)
        refs[penalty] = ref
        log(ref.row.line())
    settings = []
    for kind, model in models.items():
        for s in grid(kind, n):
            s.row = run_setting(s.label, model, denoise(model, s.options), ar, samples, roofline)
            settings.append(s)
            log(s.row.line())
    return refs, settings


def ms_per_token(row):
    return row.seconds / row.tokens * 1e3


def pick(kind, refs, settings, n):
    """(the chosen Setting of the kind, whether it met the rule, one line that says why), of the
    eligible settings."""
    mine = [s for s in settings if s.model == kind and eligible(s, n)]

    def ref(s):
        return refs[s.options.get("repeat_penalty", 1.0)].row

    good = [s for s in mine if s.row.judged.perplexity <= QUALITY * ref(s).judged.perplexity
            and s.row.judged.repeats <= MAX_REP4]
    if good:
        best, met = min(good, key=lambda s: ms_per_token(s.row)), True
    else:
        low_rep = [s for s in mine if s.row.judged.repeats <= MAX_REP4] or mine
        best, met = min(low_rep, key=lambda s: s.row.judged.perplexity), False
    r, a = best.row, ref(best)
    why = (f"{'pick' if met else 'none meets the rule; best quality'} for {kind} diffusion: {best.label}: "
           f"{r.tokens / r.passes:.2f} tokens a pass, {ms_per_token(r):.3f} ms a token "
           f"({ms_per_token(r) / ms_per_token(a):.2f}x the AR twin's), judged perplexity {r.judged.perplexity:.2f} "
           f"({r.judged.perplexity / a.judged.perplexity:.2f}x the AR twin's {a.judged.perplexity:.2f}), "
           f"rep4 {r.judged.repeats:.3f}")
    return best, met, why


def eligible(setting, n):
    """A setting a generation_config.json can hold: a rule, or one token a step (a fixed count of
    more depends on the length asked for)."""
    return setting.options.get("steps", n) == n


def generation_config(setting, temperature):
    """The generation_config.json keys that make setting a model's defaults (transformers' spelling
    for the sampling ones, Options' for the rest)."""
    o = {k: v for k, v in setting.options.items() if k not in ("steps", "repeat_penalty")}
    out = {"do_sample": temperature > 0, **({"temperature": temperature} if temperature > 0 else {}), **o}
    if "repeat_penalty" in setting.options:
        out["repetition_penalty"] = setting.options["repeat_penalty"]
    return json.dumps(out)
