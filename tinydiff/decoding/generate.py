"""Autoregressive decoding: prefill the prompt, then one decode step per new token.

A Request (made and checked by Model.request) is one sequence to generate: its prompt ids, its
own Sampler, the stop ids, a budget of max_new_tokens and the history so far; take(logits) picks
the next token and says whether the request has ended. A Decoder is a Transformer
(engine/transformer.py) with one run State (KV cache, buffers) and the two passes over the State's
sequences: prefill() runs a request's prompt into one of them, step() runs ONE decode pass for the
newest token of any set of running requests, each at its own position, and gives a row of logits
for each; verify() is step() with drafted ids after each newest token, a row of logits for every
one (speculative.py's verify pass). Every loop is a loop over these: decode_tokens (one request, a State sized to it),
decode_batch (a fixed set, one pass a step for all), a chat's turns (chat.py: one State across
turns, its cache already holding the conversation's first ids) and the server's scheduler
(serve/scheduler.py: requests joining and leaving a paged State at any step). Text comes out as
the tokens arrive, decoded incrementally so a character split across two tokens is emitted whole,
and held back while it could still be the start of a stop string.
"""
import codecs
import time

import numpy as np

from ..engine import ledger
from .sampling import Sampler

PREFILL_ROWS = 512      # rows per prefill pass of a chat turn or a served prompt (llama.cpp's default micro-batch)
DEFAULT_CTX = 4096      # positions a chat or a server takes unless told (llama-cli's default -c): a Llama 3
                        # model's full 131072 would reserve 8.6 GB of f32 KV cache for a 1B model


class Timings:
    """What llama.cpp prints after a run: prompt and generation speed, time to first token.

    Generation counts decode passes, as llama.cpp's "eval" does: n new tokens take n - 1 of them
    (the first comes from the prompt's pass)."""

    def __init__(self):
        self.start = time.perf_counter()
        self.prompt_tokens = self.gen_tokens = 0
        self.prompt_s = self.gen_s = 0.0
        self.first_token_s = None
        self.speculation = None     # speculative.Counts of a speculative run

    def report(self):
        def rate(n, s):
            return f"{n:6d} tokens in {s * 1e3:9.2f} ms ({n / s if s else float('inf'):8.2f} tokens/s)"
        ttft = f"{self.first_token_s * 1e3:.2f} ms" if self.first_token_s is not None else "-"
        return (f"prompt eval: {rate(self.prompt_tokens, self.prompt_s)}\n"
                f"eval:        {rate(self.gen_tokens, self.gen_s)}\n"
                f"time to first token: {ttft}"
                + (f"\n{self.speculation.report()}" if self.speculation is not None else ""))


class Request:
    """One sequence to generate. ids: the prompt (in the vocabulary, fitting the context with
    max_new_tokens: Model.request checks); params: its SamplingParams (its own Sampler and seed);
    history: the prompt and the new ids so far. Once take() returns True, finish_reason says why:
    "stop" (a stop id, the last of history) or "length" (max_new_tokens)."""

    def __init__(self, ids, max_new_tokens, params, stop_ids):
        self.ids, self.max_new_tokens, self.stop_ids = list(ids), max_new_tokens, stop_ids
        self.sampler = Sampler(params)
        self.history = list(ids)
        self.finish_reason = None

    @property
    def new(self):
        return self.history[len(self.ids):]

    def take(self, logits):
        """Picks the next token from logits [V] and appends it; True if the request has ended."""
        token = self.sampler(logits, self.history)
        self.history.append(token)
        if token in self.stop_ids:
            self.finish_reason = "stop"
        elif len(self.history) - len(self.ids) >= self.max_new_tokens:
            self.finish_reason = "length"
        return self.finish_reason is not None


class Decoder:
    """A Transformer and one run State of it: a KV cache of `batch` sequences of n_ctx positions (or,
    with pages, a PagedKVCache they share), buffers for `rows` rows a pass (default all). Made once
    per generation, or kept across requests by a chat or a server (Model.decoder)."""

    def __init__(self, transformer, n_ctx, batch=1, rows=None, pages=None):
        self.transformer = transformer
        self.state = transformer.state(n_ctx, batch, rows, pages)
        self.cache = self.state.cache

    def prefill(self, request, start=0, slot=None):
        """Runs the request's prompt from position start (the cache holds the rest) into the State's
        sequence `slot` (default its only one), in passes of as many rows as the buffers hold (one
        pass for a State sized to the prompt); the last position's logits [1, V]."""
        ids, rows = request.ids, self.state.buf.n_max
        for i in range(start, len(ids), rows):
            logits = self.transformer.forward(np.asarray([ids[i:i + rows]]), self.state, i, last_only=True,
                                              slots=None if slot is None else [slot])
        return logits

    def step(self, requests, slots=None):
        """One decode pass: the newest token of each request, at its own position, its K/V appended
        to the State's sequence slots[i] (slots None: one request, in the State's only sequence);
        logits [len(requests), V], one row for each request to take."""
        if slots is None:
            (r,) = requests
            return self.transformer.forward(np.array([[r.history[-1]]]), self.state, len(r.history) - 1,
                                            last_only=True)
        ids = np.array([[r.history[-1]] for r in requests])              # [B, 1] the newest token of each
        return self.transformer.forward(ids, self.state, [len(r.history) - 1 for r in requests], last_only=True,
                                        slots=slots)

    def verify(self, requests, drafts, slots=None):
        """One pass for the newest token of each request and the ids drafted after it (drafts[i] for
        requests[i]), at positions len(history)-1.. of the State's sequence slots[i] (slots None: one
        request, the only sequence); [logits [1 + len(drafts[i]), V] for each request], row j the
        target's for the token after history + drafts[i][:j] (decoding/speculative.py)."""
        rows = [np.array([r.history[-1], *d]) for r, d in zip(requests, drafts)]     # [1 + k_i] each
        starts = [len(r.history) - 1 for r in requests]
        with ledger.role("verify"):
            if slots is None:
                logits = self.transformer.forward(rows[0][None], self.state, starts[0])
            else:
                logits = self.transformer.forward(rows, self.state, starts, slots=slots)   # [sum of 1 + k_i, V]
        return np.split(logits, np.cumsum([len(r) for r in rows])[:-1])

    def tokens(self, request, timings=None, cached=0):
        """Yields the request's new ids one by one; the last one is a stop id if it hit one. cached:
        the State's cache already holds the keys and values of request.ids[:cached] (a chat's
        earlier turns), so only the rest is prefilled. Timings time the passes, not the sampling."""
        timings = timings or Timings()
        t0 = time.perf_counter()
        logits = self.prefill(request, cached)                            # [1, V]
        timings.prompt_tokens, timings.prompt_s = len(request.ids) - cached, time.perf_counter() - t0
        while True:
            done = request.take(logits[-1])
            if timings.first_token_s is None:
                timings.first_token_s = time.perf_counter() - timings.start
            yield request.history[-1]
            if done:
                return
            t0 = time.perf_counter()
            logits = self.step([request])                                 # [1, V]
            timings.gen_tokens += 1
            timings.gen_s += time.perf_counter() - t0


def decode_tokens(transformer, request, timings=None):
    """Yields the request's new ids one by one (Decoder.tokens), on a State made for it when the
    first one is asked for: prompt + max_new_tokens positions, the prompt prefilled in one pass."""
    decoder = Decoder(transformer, len(request.ids) + request.max_new_tokens, rows=len(request.ids))
    yield from decoder.tokens(request, timings)


def decode_batch(transformer, requests):
    """Yields (i, token): the new tokens of several requests decoded together. Each prompt is
    prefilled on its own (a prefill is compute-bound: batching prompts saves nothing there); then
    each step is one pass for every request still running, each at its own position, so the
    weights are read once a step for all of them. A request leaves the batch when take() ends it."""
    decoder = Decoder(transformer, max(len(r.ids) + r.max_new_tokens for r in requests), batch=len(requests),
                      rows=max(len(requests), *(len(r.ids) for r in requests)))
    logits = [decoder.prefill(r, slot=i)[0] for i, r in enumerate(requests)]    # [V] each
    running = range(len(requests))
    while True:
        for i, row in zip(running, logits):
            requests[i].take(row)
            yield i, requests[i].history[-1]
        running = [i for i in running if requests[i].finish_reason is None]
        if not running:
            return
        logits = decoder.step([requests[i] for i in running], running)      # [B', V]


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
