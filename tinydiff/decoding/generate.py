"""Autoregressive decoding: prefill the prompt, then one pass per new token.

It runs a Transformer (engine/transformer.py) on a prompt model.py has checked. The run State (KV
cache for prompt + max_new_tokens positions, buffers) is made once per call, and the prompt
prefilled in one pass; a chat (chat.py) instead keeps one State across turns, its cache already
holding the conversation's first ids, and prefills the rest in passes of its buffers' rows. Each
decode pass appends one position to the cache and reads all the earlier ones. Text comes out as the tokens arrive, decoded
incrementally so a character split across two tokens is emitted whole, and held back while it
could still be the start of a stop string.
"""
import codecs
import time

import numpy as np

from .sampling import Sampler


class Timings:
    """What llama.cpp prints after a run: prompt and generation speed, time to first token.

    Generation counts decode passes, as llama.cpp's "eval" does: n new tokens take n - 1 of them
    (the first comes from the prompt's pass)."""

    def __init__(self):
        self.start = time.perf_counter()
        self.prompt_tokens = self.gen_tokens = 0
        self.prompt_s = self.gen_s = 0.0
        self.first_token_s = None

    def report(self):
        def rate(n, s):
            return f"{n:6d} tokens in {s * 1e3:9.2f} ms ({n / s if s else float('inf'):8.2f} tokens/s)"
        ttft = f"{self.first_token_s * 1e3:.2f} ms" if self.first_token_s is not None else "-"
        return (f"prompt eval: {rate(self.prompt_tokens, self.prompt_s)}\n"
                f"eval:        {rate(self.gen_tokens, self.gen_s)}\n"
                f"time to first token: {ttft}")


def decode_tokens(transformer, ids, max_new_tokens, params, stop_ids, timings=None, state=None, cached=0):
    """Yields new token ids one by one; the last one is a stop id if generation hit one.
    ids: the prompt, in the vocabulary and fitting the context with max_new_tokens (Model checks).
    state, cached: a State whose cache already holds the keys and values of ids[:cached] (a chat's
    earlier turns), so only the rest is prefilled; by default a fresh State for this call."""
    timings = timings or Timings()
    sampler = Sampler(params)
    state = state or transformer.state(len(ids) + max_new_tokens, rows=len(ids))
    history = list(ids)

    t0 = time.perf_counter()
    logits = prefill(transformer, ids[cached:], state, cached)  # [1, V]
    timings.prompt_tokens, timings.prompt_s = len(ids) - cached, time.perf_counter() - t0
    for i in range(max_new_tokens):
        token = sampler(logits[-1], history)
        if timings.first_token_s is None:
            timings.first_token_s = time.perf_counter() - timings.start
        history.append(token)
        yield token
        if token in stop_ids or i == max_new_tokens - 1:
            return
        t0 = time.perf_counter()
        logits = transformer.forward(np.array([[token]]), state, len(history) - 1, last_only=True)  # [1, V]
        timings.gen_tokens += 1
        timings.gen_s += time.perf_counter() - t0


def decode_batch(transformer, prompts, max_new_tokens, params, stop_ids):
    """Yields (i, token): the new tokens of several prompts decoded together, prompt i with
    max_new_tokens[i] and params[i] (its own sampler and seed). Each prompt is prefilled on its
    own (a prefill is compute-bound: batching prompts saves nothing there); then each step is one
    pass for every sequence still running, each at its own position, so the weights are read once
    a step for all of them. A sequence leaves the batch at a stop id or its last token."""
    samplers = [Sampler(p) for p in params]
    history = [list(p) for p in prompts]
    state = transformer.state(max(len(p) + m for p, m in zip(prompts, max_new_tokens)), batch=len(prompts),
                              rows=max(len(prompts), *map(len, prompts)))
    logits = [transformer.forward(np.asarray([p]), state, 0, last_only=True, slots=[i])[0]   # [V] each
              for i, p in enumerate(prompts)]
    running = range(len(prompts))
    while True:
        for i, row in zip(running, logits):
            history[i].append(samplers[i](row, history[i]))
            yield i, history[i][-1]
        running = [i for i in running if history[i][-1] not in stop_ids
                   and len(history[i]) - len(prompts[i]) < max_new_tokens[i]]
        if not running:
            return
        ids = np.array([[history[i][-1]] for i in running])             # [B', 1] the newest token of each
        logits = transformer.forward(ids, state, [len(history[i]) - 1 for i in running], last_only=True,
                                     slots=running)                     # [B', V]


def prefill(transformer, ids, state, start, slot=None):
    """Runs ids at positions start.. into the cache (of the State's sequence `slot`, default its
    only one), in passes of as many rows as the State's buffers hold (one pass for a prompt State
    sized to it); the last position's logits [1, V]."""
    rows = state.buf.n_max
    for i in range(0, len(ids), rows):
        logits = transformer.forward(np.asarray([ids[i:i + rows]]), state, start + i, last_only=True,
                                     slots=None if slot is None else [slot])
    return logits


class TextStream:
    """Token ids in, text out, one token at a time: push(token) gives the text that is safe to
    show (a character split across tokens is held until whole, and text that could still become a
    stop string is held back); done once a stop id or a stop string is met (stopped: a stop
    string, before which the text ends); finish() gives what is held at the end."""

    def __init__(self, tokenizer, stop_ids, stop_strings):
        self.tokenizer, self.stop_ids = tokenizer, stop_ids
        self.stops = [s for s in (stop_strings or []) if s]
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""                               # text not yet given out
        self.tokens = 0                                 # tokens taken, up to the stop
        self.done = self.stopped = False

    def push(self, token):
        self.tokens += 1
        if token in self.stop_ids:
            self.done = True
            return ""
        if token in self.tokenizer.special_ids:
            return ""
        self.pending += self.decoder.decode(self.tokenizer.decode_bytes([token]))
        piece, self.pending, self.stopped = _split_at_stop(self.pending, self.stops)
        self.done = self.stopped
        return piece

    def finish(self):
        if self.stopped:
            return ""
        self.pending += self.decoder.decode(b"", final=True)
        piece, self.pending, self.stopped = _split_at_stop(self.pending, self.stops, final=True)
        return piece


def stream_text(tokenizer, tokens, stop_ids, stop_strings):
    """Turns a token stream into text pieces; stops at a stop id or before a stop string."""
    text = TextStream(tokenizer, stop_ids, stop_strings)
    for token in tokens:
        piece = text.push(token)
        if piece:
            yield piece
        if text.done:
            break
    piece = text.finish()
    if piece:
        yield piece


def cut_at_stop(text, stop_strings):
    """text up to the first of the stop strings (a whole text, as diffusion makes it)."""
    return _split_at_stop(text, [s for s in stop_strings or [] if s], final=True)[0]


def _split_at_stop(text, stops, final=False):
    """(text safe to emit, text held back, whether a stop string was found)."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if hits:
        return text[:min(hits)], "", True
    if final:
        return text, "", False
    # hold back the longest tail that could still grow into a stop string
    hold = max((n for s in stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
    return text[:len(text) - hold], text[len(text) - hold:], False
