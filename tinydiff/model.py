"""The public API: load a checkpoint, get logits, generate text, denoise, infill.

A Model is loading (a Hugging Face folder or a GGUF file into a Transformer and a Tokenizer) plus
the calls an application makes. Every argument a caller gives is checked here, once, before the
decoders below (generate.py, diffusion.py) run on the Transformer: they trust what they get.

A Model holds only read-only things (config, weights, tokenizer) and its Transformer's thread pool,
so several threads may generate with one Model at once: each call makes its own run State, and
their kernel calls take turns on the model's pool. The weights are read as they are when the Model
is made (the C decode layer keeps pointers to them): to change weights, make a new Model.
"""
import mmap
import os

import numpy as np

from .decoding import diffusion
from .decoding.canvas import MASK_NAMES, mask_token_id, parse_holes
from .decoding.diffusion import Options
from .decoding.generate import DEFAULT_CTX, Decoder, Request, Timings, decode_batch, decode_tokens, stream_text
from .decoding.speculative import DRAFT_MAX, Speculator, check_same_vocabulary, model_speculator, ngram_speculator
from .decoding.sampling import SamplingParams
from .engine import kernels
from .engine.config import load_config
from .engine.gguf_model import load_gguf
from .engine.masks import BIDIRECTIONAL, CAUSAL, AttentionMask
from .engine.transformer import Transformer
from .engine.weights import load_weights
from .errors import ModelError, UsageError, is_integer
from .formats import quant
from .formats.chat_template import check_variables, load_chat_template
from .formats.safetensors import load_checkpoint
from .formats.tokenizer import Tokenizer


def set_threads(threads):
    """Sets the default pool's thread count (1 .. the machine's physical cores): kernels called
    outside a model use it, and models made later without a count of their own get it. A model
    keeps its own: Model.pool.threads."""
    kernels.set_threads(kernels.check_threads(threads))


def set_batch_invariant(on):
    """on (the default): a request's logits are the same bits alone or among any others (a batch, the
    server, a diffusion group, a verify pass); off: faster prefill, kernels whose sums depend on the
    rows beside a row (csrc/matmul.c). For the whole process."""
    kernels.set_batch_invariant(on)


# The models that ship in weights/ (installed as tinydiff/models/), used when no model is named.
DEFAULT_MODELS = {"ar": "stories5m-ar", "diffusion": "stories5m-mdm"}


def shipped_models():
    """{name: folder} of the models that ship with tinydiff: installed beside the package, or in a
    source checkout's weights/."""
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in (os.path.join(here, "models"), os.path.join(os.path.dirname(here), "weights")):
        found = {name: os.path.join(folder, name) for name in sorted(os.listdir(folder))
                 if os.path.isfile(os.path.join(folder, name, "config.json"))} if os.path.isdir(folder) else {}
        if found:
            return found
    return {}


def default_model_path(mode="ar"):
    """The shipped model for a mode."""
    path = shipped_models().get(DEFAULT_MODELS[mode])
    if path is None:
        raise UsageError(f"no model given and the shipped {DEFAULT_MODELS[mode]} model is not installed: use -m DIR")
    return path


def model_path(name):
    """A model folder or GGUF file as given, or the folder of a shipped model named so."""
    if not isinstance(name, (str, os.PathLike)):
        raise UsageError(f"a model is a folder, a .gguf file or a shipped model's name, got {type(name).__name__}")
    path = os.fspath(name)
    return path if os.path.exists(path) else shipped_models().get(path, path)


def load(path, threads=None):
    """Loads a Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json), a GGUF
    file (llama.cpp's format; weights stay in their stored type: gguf.py) or a shipped model by
    name (`tinydiff models` lists them: "stories5m-ar", "stories5m-mdm").

    threads: the model's own thread count (default: the default pool's: TINYDIFF_THREADS, else the
    physical cores, unless set_threads changed it)."""
    if threads is None:
        kernels.threads_from_env()      # a bad TINYDIFF_THREADS is reported here (importing ignores it)
    else:
        kernels.check_threads(threads)  # before the minutes a big checkpoint takes to read
    kernels.simd_from_env()             # and a bad TINYDIFF_SIMD
    path = model_path(path)
    if os.path.isfile(path):
        config, weights, tokenizer, stored, template = load_gguf(path)
        return Model(config, weights, tokenizer, path, stored, threads, template)
    if not os.path.isdir(path):
        raise ModelError(f"{path}: not a model folder (config.json, model.safetensors, tokenizer.json) "
                         "or a .gguf file, nor a shipped model's name (tinydiff models)")
    config = load_config(path)
    ckpt = load_checkpoint(path)
    weights = load_weights(config, ckpt)
    tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    if tokenizer.vocab_size > config.vocab_size:
        raise ModelError(f"{path}: tokenizer.json has {tokenizer.vocab_size} tokens but the model's "
                         f"vocab_size is {config.vocab_size}")
    return Model(config, weights, tokenizer, path, stored_bytes(ckpt), threads, load_chat_template(path))


def check_tensors(path):
    """[(tensor name, stored type, numbers, how many are NaN or inf)] for each tensor of a model
    file or folder (a shipped name too) that holds any, as llama.cpp's --check-tensors finds them:
    weights for the float types, blocks with such a scale for the block types. Reads every byte."""
    from .formats.gguf import open_gguf
    path = model_path(path)
    if os.path.isfile(path):
        f = open_gguf(path)
        arrays = ((name, f.type_name(name), f.raw(name, checked=False)) for name in f.names)
    elif os.path.isdir(path):
        ckpt = load_checkpoint(path)
        arrays = ((name, ckpt.dtype(name), ckpt.stored(name)) for name in ckpt.names)
    else:
        raise ModelError(f"{path}: not a model folder or a .gguf file, nor a shipped model's name (tinydiff models)")
    found = []
    for name, kind, a in arrays:
        bad = quant.nonfinite_count(a)
        if bad:
            found.append((name, kind, a.size, bad))
    return found


# the options that say how many tokens a step commits: a run naming any replaces the defaults' plan
PLAN = ("steps", "threshold", "factor", "entropy_bound", "schedule", "alg_temp")


def _is_batch(ids):
    """A list of prompts (each a sequence of ids), not one prompt."""
    return (isinstance(ids, (list, tuple)) and len(ids) > 0
            and all(isinstance(p, (list, tuple, np.ndarray)) for p in ids))


def _is_text_batch(prompt):
    """A list of prompts (each a string), not one prompt."""
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and all(isinstance(p, str) for p in prompt)


def _stop_strings(stop):
    """stop (None, a string or a list of them) as None or a list, checked."""
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop)):
        raise UsageError(f"stop must be a string or a list of strings, got {stop!r}")
    return stop


def _check_on_step(on_step):
    if on_step is not None and not callable(on_step):
        raise UsageError(f"on_step must be a function (step, canvas_ids, committed), got {type(on_step).__name__}")


def _per_prompt(value, n, name):
    """One value per prompt of a batch of n: a list of n as it is, anything else n times."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise UsageError(f"{name}: {len(value)} values for {n} prompts (give one, or one per prompt)")
        return list(value)
    return [value] * n


def stored_bytes(ckpt):
    """Bytes of the checkpoint's tensors per stored dtype ("F32", "BF16", ...)."""
    total = {}
    for name in ckpt.names:
        total[ckpt.dtype(name)] = total.get(ckpt.dtype(name), 0) + ckpt.raw(name).nbytes
    return total


class Model:
    """threads: the count of the model's own thread pool, which runs every pass of it (default:
    the default pool's count: TINYDIFF_THREADS, else the physical cores, unless set_threads changed it)."""

    def __init__(self, config, weights, tokenizer, path=None, stored_bytes=None, threads=None, chat_template=None):
        self._attach(Transformer(config, weights, threads), tokenizer, path, stored_bytes)
        self.chat_template = chat_template        # formats.chat_template.ChatTemplate, or None

    @classmethod
    def of(cls, transformer, tokenizer=None, path=None):
        """A Model around a Transformer already built (or a stand-in with its config, weights, state
        and the passes the decoders call: the tests drive the decoders through the API this way)."""
        transformer = transformer.transformer if isinstance(transformer, Model) else transformer
        missing = [a for a in ("config", "weights", "state") if not hasattr(transformer, a)]
        if missing:
            raise UsageError(f"Model.of takes a Transformer, got {type(transformer).__name__} (no {missing[0]})")
        if tokenizer is not None and not hasattr(tokenizer, "encode"):
            raise UsageError(f"Model.of: tokenizer must be a Tokenizer, got {type(tokenizer).__name__}")
        model = cls.__new__(cls)
        model._attach(transformer, tokenizer, path, None)
        model.chat_template = None
        return model

    def _attach(self, transformer, tokenizer, path, stored_bytes):
        config = transformer.config
        self.transformer, self.config, self.tokenizer, self.path = transformer, config, tokenizer, path
        self.weights = transformer.weights
        self.stored_bytes = stored_bytes or {}     # {"F32": bytes, "Q8_0": ...} as in the checkpoint
        eos = None if tokenizer is None else tokenizer.eos_id
        self.stop_ids = frozenset(config.eos_token_ids) | ({eos} if eos is not None else set())  # EOS ids
        self.mask_id = mask_token_id(config, tokenizer)   # None: this model cannot denoise
        try:
            Options.of(**dict(getattr(config, "denoising_defaults", ())))  # the file's defaults, checked once
        except UsageError as e:
            raise ModelError(f"{os.path.join(path or '.', 'generation_config.json')}: {e}") from None

    @property
    def pool(self):
        """The thread pool every pass of this model runs on (kernels.ThreadPool: .threads to change)."""
        return self.transformer.pool

    # -- the checks: what a caller gives, checked once --------------------------------------

    def _ids(self, ids):
        """ids as int64 [n]: a non-empty flat sequence of token ids in the vocabulary."""
        if isinstance(ids, (str, bytes, bytearray)):
            raise UsageError("expected token ids, got a string (use the text form of this call)")
        if isinstance(ids, (dict, set, frozenset)):
            raise UsageError(f"expected a sequence of token ids, got a {type(ids).__name__} (no order)")
        try:
            ids = list(ids)
        except TypeError:
            raise UsageError(f"expected a list of token ids, got {type(ids).__name__}") from None
        if not ids:
            raise UsageError("the prompt is empty")
        if not all(is_integer(i) for i in ids):     # (bools too: True is no token)
            raise UsageError("token ids must be a flat list of integers")
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":              # past int64 and uint64 (2**64): objects
            raise UsageError("token ids must be a flat list of integers in int64's range")
        V = self.config.vocab_size
        bad = ids[(ids < 0) | (ids >= V)]
        if bad.size:
            raise UsageError(f"token id {bad[0]} is outside the vocabulary (0..{V - 1})")
        return ids.astype(np.int64)

    def encode_prompt(self, prompt):
        """The prompt's ids (the tokenizer's BOS and the like included)."""
        if not isinstance(prompt, str):
            raise UsageError(f"the prompt must be text (str), got {type(prompt).__name__}")
        if not prompt:
            raise UsageError("the prompt is empty")
        return self._tokenizer().encode(prompt)

    def _tokenizer(self):
        if self.tokenizer is None:
            raise UsageError("this model has no tokenizer: give token ids")
        return self.tokenizer

    def _mask(self):
        if self.config.causal:
            raise UsageError(f"{self.path or 'this model'} is an autoregressive model (causal attention): it "
                             "cannot denoise or infill; use generate() / --mode ar, or a masked-diffusion model")
        if self.mask_id is None:
            raise UsageError(f"{self.path or 'the model'} has no mask token (no mask_token_id in config.json, "
                             f"no special token {' '.join(MASK_NAMES)}), so it cannot denoise")
        return self.mask_id

    def _fit_prompt(self, ids, max_new_tokens, truncate, n_ctx=None):
        """The prompt ids that fit the context (n_ctx positions, default the model's) with room for
        max_new_tokens, or a clear error."""
        # a chat and the server, which give their own context, offer their users no truncate
        hint = "shorten the prompt or truncate" if n_ctx is None else "shorten the prompt or ask for fewer tokens"
        n_ctx = n_ctx or self.config.max_position_embeddings
        if not isinstance(truncate, bool):
            raise UsageError(f"truncate must be True or False, got {truncate!r}")
        if not is_integer(max_new_tokens):
            raise UsageError(f"the number of tokens to generate must be an integer, got {max_new_tokens!r}")
        if max_new_tokens < 1:
            raise UsageError(f"the number of tokens to generate must be >= 1, got {max_new_tokens}")
        if max_new_tokens >= n_ctx:
            raise UsageError(f"{max_new_tokens} new tokens do not fit the context of {n_ctx} positions")
        if len(ids) + max_new_tokens <= n_ctx:
            return list(ids)
        if not truncate:
            raise UsageError(f"prompt ({len(ids)} tokens) + {max_new_tokens} new tokens exceed the "
                             f"context of {n_ctx} positions ({hint})")
        return list(ids[len(ids) + max_new_tokens - n_ctx:])

    def _canvas(self, ids, gen_length, fixed, mask_id):
        """The starting canvas [L], which positions are given [L], where the output starts, and the
        name of the hole count for messages: the prompt + gen_length masks, or (fixed, a bool per id,
        True = keep) ids whose other positions are holes."""
        n_ctx = self.config.max_position_embeddings
        if fixed is None:
            if not is_integer(gen_length) or gen_length < 1:
                raise UsageError(f"gen_length must be an integer >= 1, got {gen_length!r}")
            if (ids == mask_id).any():
                raise UsageError(f"the prompt contains the mask token (id {mask_id}) at position "
                                 f"{int(np.argmax(ids == mask_id))}; use infill to fill holes in a text")
            if len(ids) + gen_length > n_ctx:
                raise UsageError(f"the canvas ({gen_length} to fill + {len(ids)} given = {len(ids) + gen_length} "
                                 f"positions) exceeds the context of {n_ctx} positions")
            canvas = np.concatenate([ids, np.full(gen_length, mask_id, np.int64)])
            return canvas, np.arange(len(canvas)) < len(ids), len(ids), "gen_length"
        given = np.asarray(fixed, bool)
        if given.shape != ids.shape:
            raise UsageError(f"fixed has shape {given.shape} for {ids.size} ids: one bool per id")
        if given.all():
            raise UsageError("nothing to fill: every position is fixed (mark holes with the mask token)")
        if (ids[given] == mask_id).any():
            raise UsageError(f"a fixed position holds the mask token (id {mask_id}); it would stay masked")
        if len(ids) > n_ctx:
            raise UsageError(f"the canvas ({(~given).sum()} to fill + {given.sum()} given = {len(ids)} positions) "
                             f"exceeds the context of {n_ctx} positions")
        return np.where(given, ids, mask_id), given, 0, "the number of holes"

    @staticmethod
    def _check_plan(n, o, what):
        """The steps and block length of options o fit n holes (`what` names the count)."""
        steps = n if o.steps is None else o.steps
        name = "block_size" if o.block_size is not None else "block_length"
        block_length = o.block_size or o.block_length or n
        if steps > n:
            raise UsageError(f"steps={steps} is more than {what}={n}: at most one step per token")
        if n % block_length:
            raise UsageError(f"{name}={block_length} does not divide {what}={n}")
        if steps % (n // block_length):
            raise UsageError(f"steps={steps} is not a multiple of the {n // block_length} blocks "
                             f"({what}={n} / {name}={block_length}); each block gets steps / blocks")

    def text(self, ids):
        """The text of generated ids, up to the first EOS."""
        ids = self._ids(ids).tolist() if len(ids) else []                # (checked: in the vocabulary)
        end = next((i for i, t in enumerate(ids) if t in self.stop_ids), len(ids))
        return self._tokenizer().text(ids[:end])

    # -- logits --------------------------------------------------------------------------------

    def logits(self, ids, mask=CAUSAL):
        """One full forward pass over ids, no cache kept: logits [len(ids), V] float32.

        mask=CAUSAL: row i predicts the token after position i. BIDIRECTIONAL (masked diffusion):
        row i is the distribution of the token at position i, for every model (Dream's shift is
        applied here). Another mask: the plain pass under it."""
        if not isinstance(mask, AttentionMask):
            raise UsageError(f"mask must be a tinydiff.masks.AttentionMask (CAUSAL, BIDIRECTIONAL, "
                             f"block_causal(b)), got {mask!r}")
        ids = self._ids(ids)
        if len(ids) > self.config.max_position_embeddings:
            raise UsageError(f"logits: {len(ids)} ids exceed the context of "
                             f"{self.config.max_position_embeddings} positions")
        state = self.transformer.state(len(ids))
        if mask == BIDIRECTIONAL:
            return self.transformer.canvas_logits(ids[None], state)[0]
        return self.transformer.forward(ids[None], state, 0, mask=mask)

    # -- autoregressive generation -----------------------------------------------------------

    def request(self, ids, max_new_tokens=128, params=None, *, n_ctx=None, truncate=False):
        """One checked autoregressive request (decoding.generate.Request): the checks of every
        generation are made here. ids: the prompt's token ids (text: encode_prompt or chat_ids
        first); params: its SamplingParams (sampling_params(...) makes one; default the model's);
        n_ctx: the positions it must fit with max_new_tokens (default the model's context);
        truncate: drop the prompt's start to fit instead of refusing."""
        self._check_causal()
        if params is None:
            params = self.sampling_params()
        elif not isinstance(params, SamplingParams):
            raise UsageError(f"params must be a decoding.sampling.SamplingParams, got {type(params).__name__}")
        ids = self._fit_prompt(self._ids(ids).tolist(), max_new_tokens, truncate, n_ctx)
        return Request(ids, max_new_tokens, params, self.stop_ids)

    def _check_causal(self):
        if not self.config.causal:
            raise UsageError(f"{self.path or 'this model'} is a masked-diffusion model (bidirectional "
                             "attention): generate with denoise() or --mode diffusion")

    def decoder(self, n_ctx, batch=1, rows=None, pages=None):
        """A decoding.generate.Decoder: this model's Transformer with a run State of `batch`
        sequences of n_ctx positions (rows: a pass's rows; pages: a paged cache), for a caller that
        keeps one across requests (a Chat, the server's Scheduler)."""
        return Decoder(self.transformer, n_ctx, batch, rows, pages)

    def generate_tokens(self, ids, max_new_tokens=128, *, truncate=False, timings=None, draft=None, draft_max=None,
                        **sampling):
        """Yields new ids one at a time (the last one is EOS if the model produced it). sampling:
        the fields of decoding.sampling.SamplingParams (temperature, top_k, top_p, min_p,
        repeat_penalty, repeat_last_n, seed); those not given come from the model's
        generation_config.json when it sets do_sample (config.with_generation_config), else
        llama.cpp's defaults. draft: speculative decoding (speculator()), the same ids as without."""
        self._check_causal()
        spec = None if draft is None else self.speculator(draft, draft_max)
        request = self.request(ids, max_new_tokens, self.sampling_params(**sampling), truncate=truncate)
        if timings is not None and not isinstance(timings, Timings):
            raise UsageError(f"timings must be a decoding.generate.Timings, got {type(timings).__name__}")
        if spec is None:
            return decode_tokens(self.transformer, request, timings)
        decoder = Decoder(self.transformer, len(request.ids) + max_new_tokens,
                          rows=max(len(request.ids), spec.draft_max + 1))
        return spec.tokens(decoder, request, timings)

    def speculator(self, draft, draft_max=None, n_ctx=None, ngram=(None, None)):
        """A checked decoding.speculative.Speculator for this (autoregressive) model. draft: "ngram"
        (prompt lookup), a smaller model with the same vocabulary (a Model or its path or shipped name:
        causal, or block diffusion as stories5m-bd), or a Speculator (as it is); draft_max: drafts a
        verify pass (default 8, below the context); n_ctx: a drafter's cache (default its context, at
        most 4096); ngram: prompt lookup's shortest and longest n-gram (default 3 and 4)."""
        if isinstance(draft, Speculator):
            return draft
        if not self.config.causal:
            raise UsageError(f"--draft (speculative decoding) is for autoregressive models; {self.path or 'this model'} "
                             "is a masked-diffusion model")
        limit = self.config.max_position_embeddings
        draft_max = DRAFT_MAX if draft_max is None else draft_max
        if not is_integer(draft_max) or not 1 <= draft_max < limit:
            raise UsageError(f"--draft-max must be an integer in 1..{limit - 1} (the context less one), got {draft_max!r}")
        if draft == "ngram":
            return ngram_speculator(ngram, draft_max)
        drafter = draft if isinstance(draft, Model) else self._draft_model(draft)
        check_same_vocabulary(self, drafter)
        return model_speculator(drafter.transformer, drafter.mask_id, n_ctx or min(limit, DEFAULT_CTX), draft_max,
                                drafter.path)

    def _draft_model(self, name):
        if not isinstance(name, (str, os.PathLike)):
            raise UsageError(f"draft must be 'ngram', a Model or a model's path, got {type(name).__name__}")
        path = model_path(name)
        if not os.path.exists(path):
            raise UsageError(f"--draft {os.fspath(name)}: no such model file or folder (nor 'ngram', nor a shipped one)")
        return load(path, threads=self.pool.threads)

    def sampling_params(self, **sampling):
        """SamplingParams from the options given, the model's defaults (generation_config.json's,
        config.with_generation_config) filling the rest, then llama.cpp's."""
        return SamplingParams.of(**{**dict(self.config.sampling_defaults), **sampling})

    def generate_ids(self, ids, max_new_tokens=128, **sampling):
        """The new ids only (ending with EOS if the model produced it, as transformers does).

        ids may be a list of prompts (each a list of ids): they are decoded as one batch, one pass
        a step for all (decoding.generate.decode_batch), and the result is a list of new ids per
        prompt, equal to running each alone token for token (not bit for bit: a matmul rounds with
        the number of rows in its pass, so a near-tie could fall either way). max_new_tokens and every sampling option may then be
        one value for all or a list with one per prompt (seed=[1, 2, 3])."""
        if not _is_batch(ids):
            return list(self.generate_tokens(ids, max_new_tokens, **sampling))
        self._check_causal()
        n = len(ids)
        steps = _per_prompt(max_new_tokens, n, "max_new_tokens")
        truncate = sampling.pop("truncate", False)
        options = {name: _per_prompt(value, n, name) for name, value in sampling.items()}
        params = [self.sampling_params(**{k: v[i] for k, v in options.items()}) for i in range(n)]
        requests = [self.request(p, m, ps, truncate=truncate) for p, m, ps in zip(ids, steps, params)]
        new = [[] for _ in requests]
        for i, token in decode_batch(self.transformer, requests):
            new[i].append(token)
        return new

    def stream(self, prompt, max_new_tokens=128, stop=None, **sampling):
        """Yields the completion as text pieces while it is generated. stop: a string or a list of
        them; the completion ends before the first one."""
        stop = _stop_strings(stop)
        tokens = self.generate_tokens(self.encode_prompt(prompt), max_new_tokens, **sampling)
        return stream_text(self.tokenizer, tokens, self.stop_ids, stop)

    def generate(self, prompt, max_new_tokens=128, stop=None, **sampling):
        """The completion only, without the prompt, cut before any stop string. A list of prompts
        is decoded as one batch (generate_ids) and gives a list of completions."""
        if not _is_text_batch(prompt):
            return "".join(self.stream(prompt, max_new_tokens, stop, **sampling))
        stop = _stop_strings(stop)                                      # before the batch runs
        new = self.generate_ids([self.encode_prompt(p) for p in prompt], max_new_tokens, **sampling)
        return ["".join(stream_text(self.tokenizer, ids, self.stop_ids, stop)) for ids in new]

    # -- masked diffusion (decoding/diffusion.py has the options, docs/diffusion.md what they do) ----------

    def denoise_steps(self, ids, gen_length=128, fixed=None, **options):
        """Yields a diffusion.Step per forward pass, then the diffusion.Denoised. ids: the prompt, or
        with fixed (a bool per id, True = keep) a canvas whose other positions are holes."""
        return diffusion.denoise_steps(self.transformer, *self._job(ids, gen_length, fixed, options), self.mask_id,
                                       self.stop_ids)

    def denoising_options(self, options, infill=False):
        """The options a run is given over the model's defaults (generation_config.json's: Config.
        denoising_defaults). A run that names its own commit plan (steps, a rule, a schedule) drops the
        defaults' rule and its gap; one that names its blocks, or an infill, the defaults' blocks."""
        defaults = dict(getattr(self.config, "denoising_defaults", ()))   # (a stand-in config: none)
        if any(options.get(k) is not None for k in PLAN):
            defaults = {k: v for k, v in defaults.items() if k not in PLAN + ("gap",)}
        if options.get("block_size") is not None:
            defaults.pop("block_length", None)
        if options.get("block_length") is not None or infill:       # an infill's blocks are block_length's
            defaults.pop("block_size", None)
        return {**defaults, **options}

    def _job(self, ids, gen_length, fixed, options):
        """(canvas, given, start, Options) of a denoising run, every argument checked."""
        options = self.denoising_options(options, infill=fixed is not None)
        if (self.config.block_size and options.get("block_size") is None and options.get("block_length") is None
                and fixed is None):
            options["block_size"] = self.config.block_size              # a block-diffusion model's own
        mask_id, o = self._mask(), Options.of(**options)
        canvas, given, start, what = self._canvas(self._ids(ids), gen_length, fixed, mask_id)
        if fixed is not None and o.eos == "stop":
            raise UsageError("eos='stop' ends a continuation; an infill has given text after its holes "
                             "(use eos='suppress' or 'keep')")
        if fixed is not None and o.block_size is not None:
            raise UsageError("block_size decodes a continuation block by block; an infill has given text after "
                             "its holes (use block_length)")
        self._check_plan(int((~given).sum()), o, what)
        return canvas, given, start, o

    def denoise_result(self, ids, gen_length=128, *, on_step=None, fixed=None, **options):
        """The diffusion.Denoised of a run, calling on_step(step, canvas_ids, committed_mask) after each step."""
        _check_on_step(on_step)
        return diffusion.to_the_end(self.denoise_steps(ids, gen_length, fixed, **options), on_step)

    def denoise_ids(self, ids, gen_length=128, *, on_step=None, **options):
        """The generated ids (up to and including the first EOS with eos="stop").

        ids may be a list of prompts (each a list of ids): they are denoised as one batch, each
        pass one forward for all (decoding.diffusion.denoise_together), and the result is a list,
        equal to denoising each alone token for token (up to near-ties, as generate_ids says); gen_length and every option may then be one value for all
        or a list with one per prompt."""
        if not _is_batch(ids):
            return self.denoise_result(ids, gen_length, on_step=on_step, **options).ids
        if on_step is not None:
            raise UsageError("on_step follows one run: denoise a batch without it")
        n = len(ids)
        lengths = _per_prompt(gen_length, n, "gen_length")
        options = {name: _per_prompt(value, n, name) for name, value in options.items()}
        jobs = [self._job(p, m, None, {k: v[i] for k, v in options.items()}) for i, (p, m) in enumerate(zip(ids, lengths))]
        out = [None] * n
        for i, item in diffusion.denoise_together(self.transformer, jobs, self.mask_id, self.stop_ids):
            if isinstance(item, diffusion.Denoised):
                out[i] = item.ids
        return out

    def denoise(self, prompt, gen_length=128, *, on_step=None, **options):
        """The generated text: the prompt followed by gen_length masks, denoised step by step. A
        list of prompts is denoised as one batch (denoise_ids) and gives a list of texts."""
        if _is_text_batch(prompt):
            ids = self.denoise_ids([self.encode_prompt(p) for p in prompt], gen_length, on_step=on_step, **options)
            return [self.text(i) for i in ids]
        return self.text(self.denoise_ids(self.encode_prompt(prompt), gen_length, on_step=on_step, **options))

    def denoise_stream(self, prompt, gen_length=128, **options):
        """Yields (step, canvas_ids, committed_mask) after every denoising step."""
        for item in self.denoise_steps(self.encode_prompt(prompt), gen_length, **options):
            if isinstance(item, diffusion.Step):
                yield item.index, item.canvas, item.committed

    def holes(self, text):
        """Text with [MASK] / [MASK*N] holes -> (ids, where the text's ids start, where they end)."""
        return parse_holes(self._tokenizer(), text, self._mask(), self.config.max_position_embeddings)

    def infill(self, text, *, on_step=None, **options):
        """Fills the [MASK] / [MASK*N] holes of text (or the mask ids of a list of ids); every given
        token stays as it is. Returns the whole text (or ids). eos defaults to "suppress"."""
        for name in ("gen_length", "fixed"):             # the holes say both
            if name in options:
                raise UsageError(f"infill takes no {name}: the text's [MASK] holes are what is generated")
        options.setdefault("eos", "suppress")
        if not isinstance(text, str):
            ids = self._ids(text)
            return self.denoise_result(ids, on_step=on_step, fixed=ids != self._mask(), **options).ids
        ids, first, last = self.holes(text)
        filled = self.denoise_result(ids, on_step=on_step, fixed=np.asarray(ids) != self.mask_id, **options).ids
        return self._tokenizer().text(filled[first:last])

    # -- chat (formats/chat_template.py renders; chat.py keeps a conversation) -----------------

    def render_chat(self, messages, add_generation_prompt=True, **variables):
        """The conversation [{"role": ..., "content": ...}, ...] as the model's chat template writes
        it, ending with the assistant's header; variables: extra template variables (date_string, ...)."""
        if self.chat_template is None:
            raise UsageError(f"{self.path or 'this model'} has no chat template (chat_template.jinja, "
                             "tokenizer_config.json's chat_template or GGUF's tokenizer.chat_template)")
        return self.chat_template.render(messages, add_generation_prompt, **variables)

    def chat_ids(self, messages, add_generation_prompt=True, **variables):
        """The rendered conversation's ids: the template writes BOS and the like, none is added."""
        ids = self._tokenizer().encode(self.render_chat(messages, add_generation_prompt, **variables),
                                       add_special_tokens=False)
        if not ids:
            raise UsageError("the chat template renders the conversation as nothing: no prompt to answer")
        return ids

    def chat(self, messages, max_new_tokens=256, variables=None, **options):
        """The assistant's answer to the conversation: generated (options: sampling) or, for a
        masked-diffusion model, denoised on max_new_tokens positions (options: denoising).
        variables: extra template variables ({"date_string": "26 Jul 2024"}, ...)."""
        ids = self.chat_ids(messages, **check_variables(variables or {}))
        if self.config.causal:
            return "".join(stream_text(self.tokenizer, self.generate_tokens(ids, max_new_tokens, **options),
                                       self.stop_ids, None))
        return self.text(self.denoise_ids(ids, max_new_tokens, **options))

    def parameter_count(self):
        """Weights, not storage units: a Q8_0 array [m, k/32] holds m*k of them, a Q4_0X8 [m/8, k/32] too."""
        return sum(quant.rows(a) * quant.columns(a) if a.ndim == 2 else a.size for a in self._arrays())

    def weight_bytes(self):
        """{type: bytes} of the weights as the kernels read them ("bf16", "q8_0", "f32", ...), and
        how many of those bytes are views of the checkpoint's map rather than copies in memory."""
        by_type, mapped = {}, 0
        for a in self._arrays():
            by_type[quant.type_of(a)] = by_type.get(quant.type_of(a), 0) + a.nbytes
            base = a
            while isinstance(base, np.ndarray) and base.base is not None:
                base = base.base
            base = base.obj if isinstance(base, memoryview) else base   # np.frombuffer's holder
            mapped += a.nbytes if isinstance(base, mmap.mmap) else 0
        return by_type, mapped

    def _arrays(self):
        w = self.weights
        seen = {id(w.embed_tokens): w.embed_tokens, id(w.norm): w.norm, id(w.lm_head): w.lm_head}
        for lw in w.layers:
            for a in vars(lw).values():
                if a is not None:
                    seen[id(a)] = a
        return list(seen.values())
