"""The public Model: load a checkpoint, get logits, generate text.

A Model holds only read-only things (config, weights, tokenizer) and its thread pool, so several
threads may generate with one Model at once: each call makes its own KV cache and buffers, and their
kernel calls take turns on the model's pool. The weights are read as they
are when the Model is made (the C decode layer keeps pointers to them): to change weights, make a
new Model.
"""
import os

import numpy as np

from . import diffusion, kernels, quant
from .config import load_config
from .errors import ModelError, UsageError
from .generate import decode_tokens, fit_context, stream_text
from .gguf import load_gguf
from .safetensors import load_checkpoint
from .sampling import SamplingParams
from .tokenizer import Tokenizer
from .transformer import Buffers, KVCache, decode, forward, rope_inv_freq
from .weights import load_weights


def set_threads(threads):
    """Sets the default pool's thread count (1 .. the machine's physical cores): kernels called
    outside a model use it, and models made later without a count of their own get it. A model
    keeps its own: Model.pool.threads."""
    kernels.set_threads(kernels.check_threads(threads))


# The models that ship in weights/ (installed as tinydiff/models/), used when no model is named.
DEFAULT_MODELS = {"ar": "stories5m-ar", "diffusion": "stories5m-mdm"}


def default_model_path(mode="ar"):
    """The shipped model for a mode: installed beside the package, or in a source checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in (os.path.join(here, "models"), os.path.join(os.path.dirname(here), "weights")):
        path = os.path.join(folder, DEFAULT_MODELS[mode])
        if os.path.isfile(os.path.join(path, "config.json")):
            return path
    raise UsageError(f"no model given and the shipped {DEFAULT_MODELS[mode]} model is not installed: use -m DIR")


def load(path, threads=None):
    """Loads a Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json) or a
    GGUF file (llama.cpp's format; weights stay in their stored type: gguf.py).

    threads: the model's own thread count (default: the default pool's: TINYDIFF_THREADS, else the
    physical cores, unless set_threads changed it)."""
    if threads is None:
        kernels.threads_from_env()      # a bad TINYDIFF_THREADS is reported here (importing ignores it)
    else:
        kernels.check_threads(threads)  # before the minutes a big checkpoint takes to read
    path = os.fspath(path)
    if os.path.isfile(path):
        config, weights, tokenizer, stored = load_gguf(path)
        return Model(config, weights, tokenizer, path, stored, threads)
    if not os.path.isdir(path):
        raise ModelError(f"{path}: not a model folder (config.json, model.safetensors, tokenizer.json) "
                         "or a .gguf file")
    config = load_config(path)
    ckpt = load_checkpoint(path)
    weights = load_weights(config, ckpt)
    tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    if tokenizer.vocab_size > config.vocab_size:
        raise ModelError(f"{path}: tokenizer.json has {tokenizer.vocab_size} tokens but the model's "
                         f"vocab_size is {config.vocab_size}")
    return Model(config, weights, tokenizer, path, stored_bytes(ckpt), threads)


def stored_bytes(ckpt):
    """Bytes of the checkpoint's tensors per stored dtype ("F32", "BF16", ...)."""
    total = {}
    for name in ckpt.names:
        total[ckpt.dtype(name)] = total.get(ckpt.dtype(name), 0) + ckpt.raw(name).nbytes
    return total


class Model:
    """threads: the count of the model's own thread pool, which runs every pass of it (default:
    the default pool's count: TINYDIFF_THREADS, else the physical cores, unless set_threads changed it)."""

    def __init__(self, config, weights, tokenizer, path=None, stored_bytes=None, threads=None):
        self.config = config
        self.stored_bytes = stored_bytes or {}     # {"F32": bytes, "Q8_0": ...} as in the checkpoint
        self.weights = weights
        self.tokenizer = tokenizer
        self.path = path
        self.inv_freq = rope_inv_freq(config)       # [hd/2]
        if len(weights.layers) != config.num_hidden_layers:
            raise ValueError(f"the weights have {len(weights.layers)} layers, the config "
                             f"{config.num_hidden_layers}")
        self.decode_layers = [kernels.DecodeLayer(config, lw) for lw in weights.layers]  # for csrc/layer.c
        self.pool = kernels.ThreadPool(kernels.get_threads() if threads is None else kernels.check_threads(threads))

    # -- forward passes ------------------------------------------------------------------

    def forward(self, ids, cache, buf, start, kv_len=None, causal=True, last_only=False):
        """ids [B, n]: see transformer.forward."""
        ids = np.asarray(ids, dtype=np.int64)
        self._check_ids(ids)
        with self.pool:
            if ids.shape == (1, 1) and causal and kv_len in (None, start + 1) and cache.k.shape[1] == 1:
                return decode(self.config, self.weights, self.decode_layers, self.inv_freq, ids[0], cache, buf, start)
            return forward(self.config, self.weights, self.inv_freq, ids, cache, buf, start, kv_len,
                           causal, last_only)

    def logits(self, ids, causal=True):
        """One full forward pass over ids, no cache kept: logits [len(ids), V] float32.

        causal=True: row i predicts the token after position i. causal=False (masked diffusion):
        row i is the distribution of the token at position i, for every model (Dream's shift is
        applied here)."""
        ids = list(ids)
        if not ids:
            raise UsageError("logits: ids is empty")
        if len(ids) > self.config.max_position_embeddings:
            raise UsageError(f"logits: {len(ids)} ids exceed the context of "
                             f"{self.config.max_position_embeddings} positions")
        if not causal:
            cache, buf = self.canvas_state(1, len(ids))
            return self.canvas_logits(np.asarray([ids]), cache, buf)[0]
        return self.forward([ids], KVCache(self.config, len(ids)), Buffers(self.config, len(ids)), 0)

    def canvas_state(self, batch, length):
        """The KV cache and buffers for denoising `batch` canvases of `length` positions."""
        return KVCache(self.config, length, batch), Buffers(self.config, batch * length)

    def canvas_logits(self, canvas, cache, buf, start=0, end=None):
        """Bidirectional logits [B, end-start, V] for canvas positions start..end-1.

        Recomputes canvas[:, start:end] (their K/V overwrite those cache slots) attending over all
        canvas positions; the slots outside [start, end) are read from the cache as they were left
        by an earlier pass. start=0, end=None is a full, uncached pass. Row i is the distribution of
        the token at position start+i: for a model that predicts position i from row i-1 (Dream),
        one more position is recomputed on the left and the rows shifted."""
        B, L = canvas.shape
        end = L if end is None else end
        first = start - 1 if self.config.shifted_logits and start > 0 else start
        n = end - first
        logits = self.forward(canvas[:, first:end], cache, buf, first, kv_len=L, causal=False)
        logits = logits.reshape(B, n, -1)                               # [B, n, V]
        if self.config.shifted_logits:                                  # row i <- row i-1; row 0 keeps its own
            logits = logits[:, :-1] if first < start else np.concatenate([logits[:, :1], logits[:, :-1]], axis=1)
        return logits

    def _check_ids(self, ids):
        bad = ids[(ids < 0) | (ids >= self.config.vocab_size)]
        if bad.size:
            raise UsageError(f"token id {bad[0]} is outside the vocabulary (0..{self.config.vocab_size - 1})")

    # -- autoregressive generation -----------------------------------------------------------

    @property
    def stop_ids(self):
        """EOS ids from config.json and tokenizer.json."""
        ids = set(self.config.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_id is not None:
            ids.add(self.tokenizer.eos_id)
        return ids

    def encode_prompt(self, prompt):
        if not isinstance(prompt, str) or not prompt:
            raise UsageError("the prompt is empty")
        return self.tokenizer.encode(prompt)

    def generate_tokens(self, ids, max_new_tokens=128, temperature=0.8, top_k=40, top_p=0.95,
                        min_p=0.05, repeat_penalty=1.0, repeat_last_n=64, seed=None,
                        truncate=False, timings=None):
        """Yields new ids one at a time (the last one is EOS if the model produced it)."""
        if not self.config.causal:
            raise UsageError("this is a masked-diffusion model (bidirectional attention): "
                             "generate with denoise() or --mode diffusion")
        params = SamplingParams(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed)
        ids = fit_context(list(ids), max_new_tokens, self.config.max_position_embeddings, truncate)
        self._check_ids(np.asarray(ids, dtype=np.int64))
        return decode_tokens(self, ids, max_new_tokens, params, self.stop_ids, timings)

    def generate_ids(self, ids, max_new_tokens=128, **sampling):
        """The new ids only (ending with EOS if the model produced it, as transformers does)."""
        return list(self.generate_tokens(ids, max_new_tokens, **sampling))

    def stream(self, prompt, max_new_tokens=128, stop=None, **sampling):
        """Yields the completion as text pieces while it is generated."""
        tokens = self.generate_tokens(self.encode_prompt(prompt), max_new_tokens, **sampling)
        return stream_text(self.tokenizer, tokens, self.stop_ids, stop)

    def generate(self, prompt, max_new_tokens=128, stop=None, **sampling):
        """The completion only, without the prompt, cut before any stop string."""
        return "".join(self.stream(prompt, max_new_tokens, stop, **sampling))

    # -- masked diffusion (tinydiff/diffusion.py has the options and what they mean) ---------------

    def denoise(self, prompt, gen_length=128, *, on_step=None, **options):
        """The generated text: the prompt followed by gen_length masks, denoised step by step."""
        return diffusion.denoise(self, prompt, on_step, gen_length=gen_length, **options)

    def denoise_ids(self, ids, gen_length=128, *, on_step=None, **options):
        """The generated ids (up to and including the first EOS with eos="stop")."""
        return diffusion.denoise_ids(self, ids, on_step, gen_length=gen_length, **options)

    def denoise_stream(self, prompt, gen_length=128, **options):
        """Yields (step, canvas_ids, committed_mask) after every denoising step."""
        for item in diffusion.denoise_steps(self, self.encode_prompt(prompt), gen_length, **options):
            if isinstance(item, diffusion.Step):
                yield item.index, item.canvas, item.committed

    def infill(self, text, *, on_step=None, **options):
        """Fills the [MASK] / [MASK*N] holes of text; every given token stays as it is."""
        if isinstance(text, str):
            return diffusion.infill(self, text, on_step, **options)
        return diffusion.infill_ids(self, text, on_step, **options)

    # -- what it is -------------------------------------------------------------------------

    def parameter_count(self):
        """Weights, not storage units: a Q8_0 array [m, k/32] holds m*k of them."""
        return sum(a.size * (quant.QK if quant.is_blocked(a) else 1) for a in self._arrays())

    def _arrays(self):
        w = self.weights
        seen = {id(w.embed_tokens): w.embed_tokens, id(w.norm): w.norm, id(w.lm_head): w.lm_head}
        for lw in w.layers:
            for a in vars(lw).values():
                if a is not None:
                    seen[id(a)] = a
        return list(seen.values())
