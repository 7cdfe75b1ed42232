"""Continuous batching: many requests decoded together, each joining and leaving at any step.

    scheduler = Scheduler(model, slots=4)
    seq = scheduler.submit(prompt_ids, max_new_tokens=64, params=SamplingParams(temperature=0))
    for token in seq:            # the new ids as they come (a thread-safe queue underneath)
        ...

The scheduler owns one run State of `slots` sequences, its KV cache paged and shared
(engine/transformer.py's PagedKVCache: pages of 64 positions, a page table per sequence, a prefix
cache of named pages), and one thread, the engine's, which loops: admit waiting requests into free
slots (each prompt prefilled on its own, in passes of up to PREFILL_ROWS rows: a prefill is
compute-bound, batching it buys nothing; the pages of its start that an earlier request left, a
shared system prompt, are taken instead of recomputed), then one decode pass
for every running sequence, each at its own position (Transformer.forward with a start and a page
table per sequence: the weights are read once for all of them), then hand each its token and retire
those that ended (a stop id, max_new_tokens, or cancel(): a client gone). A retired slot is free at
the next step. Requests beyond the slots wait in a queue of at most `queue` entries; submit()
beyond that raises Busy (the server answers 503).

A request's tokens are those it would get alone: its own Sampler and seed, its own pages and
positions; tests/test_serve.py checks it token for token (decoding/generate.py's decode_batch is
the same loop for a fixed set of prompts). Token for token, not bit for bit: a matmul's rounding
depends on how many rows share its pass (csrc/matmul.c takes its GEMM from 16 rows, 33 on AMD,
its int8 GEMM from 4), so a request's logits in a batch can differ from its logits alone in the
last bits, and a near-tie between two tokens could fall the other way, as in any batching engine.
"""
import queue
import threading
from collections import deque

import numpy as np

from ..decoding.generate import prefill
from ..decoding.sampling import Sampler
from ..engine.kernels import PAGE
from ..engine.ledger import Ledger
from ..engine.transformer import PagedKVCache
from ..errors import UsageError

PREFILL_ROWS = 512      # rows per prefill pass (llama.cpp's default micro-batch)


class Busy(Exception):
    """Every slot is taken and the waiting queue is full."""


class Sequence:
    """One request: iterate it for its new token ids (it ends after the last); finish_reason then
    says why: "stop" (a stop id, the last id given), "length" (max_new_tokens), "cancelled", or
    "error" (the engine failed: `error` says how)."""

    def __init__(self, ids, max_new_tokens, params, stop_ids, on_token=None):
        self.ids, self.max_new_tokens, self.stop_ids = list(ids), max_new_tokens, stop_ids
        self.on_token = on_token           # also called with each token and None at the end (the server's)
        self.sampler = Sampler(params)
        self.history = list(ids)
        self.finish_reason = self.error = None
        self.cancelled = False
        self.reused = self.prefilled = 0    # prompt positions taken from the prefix cache / run
        self._out = queue.Queue()

    def __iter__(self):
        while (token := self._out.get()) is not None:
            yield token

    def cancel(self):
        """Frees the request's slot at the next step (a client that went away)."""
        self.cancelled = True

    @property
    def new(self):
        return self.history[len(self.ids):]

    def _take(self, logits):
        """Samples the next token from logits [V]; True if the sequence has ended."""
        token = self.sampler(logits, self.history)
        self.history.append(token)
        self._give(token)
        if token in self.stop_ids:
            self.finish_reason = "stop"
        elif len(self.new) >= self.max_new_tokens:
            self.finish_reason = "length"
        return self.finish_reason is not None

    def _end(self, reason=None):
        self.finish_reason = self.finish_reason or reason
        self._give(None)

    def _give(self, item):
        self._out.put(item)
        if self.on_token is not None:
            try:
                self.on_token(item)
            except Exception:          # its reader is gone (a closed event loop): stop it, never the engine
                self.cancelled = True


class Scheduler:
    """model: an autoregressive Model; slots: sequences decoded at once; n_ctx: positions per
    sequence (prompt + new tokens; default the model's context); queue: requests that may wait;
    prefix_cache_bytes: KV memory beyond what the slots need, where the pages of finished requests
    stay for later ones that start the same (engine/transformer.py's PagedKVCache); ledger: keep a
    Ledger of every pass the engine runs (self.ledger; tests, never a long-running server)."""

    def __init__(self, model, slots=4, n_ctx=None, queue=64, prefix_cache_bytes=64 << 20, ledger=False):
        self.model, self.slots, self.queue_size = model, slots, queue
        self.n_ctx = n_ctx or model.config.max_position_embeddings
        pages = (slots * -(-self.n_ctx // PAGE)                        # every slot can fill its context
                 + prefix_cache_bytes // PagedKVCache.page_bytes(model.config))
        self.state = model.transformer.state(self.n_ctx, batch=slots, rows=max(slots, min(PREFILL_ROWS, self.n_ctx)),
                                             pages=pages)
        self.cache = self.state.cache
        self.ledger = Ledger() if ledger else None
        self.free = list(range(slots))
        self.waiting = deque()
        self.running = {}                  # slot -> Sequence
        self.steps = self.generated = 0    # decode passes run and tokens given, for /health
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="tinydiff-engine", daemon=True)
        self._thread.start()

    def submit(self, ids, max_new_tokens, params, on_token=None):
        """Queues a request (prompt ids checked by the caller: in the vocabulary, non-empty); returns
        its Sequence at once (on_token: called on the engine's thread with each token, then None).
        UsageError if it cannot fit a slot's context; Busy if the queue is full."""
        if len(ids) + max_new_tokens > self.n_ctx:
            raise UsageError(f"the prompt ({len(ids)} tokens) + {max_new_tokens} new tokens exceed the "
                             f"context of {self.n_ctx} positions")
        seq = Sequence(ids, max_new_tokens, params, self.model.stop_ids, on_token)
        with self._wake:
            if len(self.waiting) >= self.queue_size + len(self.free):   # the free slots take some at once
                raise Busy(f"all {self.slots} slots are busy and {len(self.waiting)} requests wait")
            self.waiting.append(seq)
            self._wake.notify()
        return seq

    def _loop(self):
        if self.ledger is not None:
            self.ledger.__enter__()            # on the engine's thread, which runs every pass
        while True:
            with self._wake:
                while not self.running and not self.waiting:
                    self._wake.wait()
                admitted = []
                while self.free and self.waiting:
                    admitted.append((self.free.pop(0), self.waiting.popleft()))
            for slot, seq in admitted:
                try:
                    self._admit(slot, seq)
                except Exception as e:   # MemoryError, a kernel's error: this request ends with it
                    self._fail(slot, seq, e)
            try:
                self._step()
            except Exception as e:   # the pass every running request shares (not one's sampling): all end
                for slot, seq in list(self.running.items()):
                    self._fail(slot, seq, e)

    def _fail(self, slot, seq, error):
        seq.error = f"{type(error).__name__}: {error}"
        self._retire(slot, seq, "error")

    def _admit(self, slot, seq):
        """Prefills the prompt into the slot's pages, but for the pages the prefix cache already
        holds, and takes the first token."""
        if seq.cancelled:
            return self._retire(slot, seq, "cancelled")
        seq.reused = self.cache.start(slot, seq.ids)
        self._grow(slot, len(seq.ids))
        logits = prefill(self.model.transformer, seq.ids[seq.reused:], self.state, seq.reused, slot)
        seq.prefilled = len(seq.ids) - seq.reused
        self.cache.name_pages(slot, seq.ids)
        self.running[slot] = seq
        self.generated += 1
        if seq._take(logits[0]):
            self._retire(slot, seq)

    def _step(self):
        """One decode pass for every running sequence, then each takes its token."""
        for slot, seq in list(self.running.items()):
            if seq.cancelled:
                self._retire(slot, seq, "cancelled")
        if not self.running:
            return
        slots = list(self.running)
        seqs = [self.running[s] for s in slots]
        for slot, seq in zip(slots, seqs):
            self._grow(slot, len(seq.history))                            # a page for the newest token's K/V
        ids = np.array([[seq.history[-1]] for seq in seqs])               # [B, 1] the newest token of each
        logits = self.model.transformer.forward(ids, self.state, [len(seq.history) - 1 for seq in seqs],
                                                last_only=True, slots=slots)   # [B, V]
        self.steps += 1
        self.generated += len(seqs)
        for slot, seq, row in zip(slots, seqs, logits):
            try:
                if len(seq.history) % PAGE == 0:                           # a page just filled: name it
                    self.cache.name_pages(slot, seq.history)
                if seq._take(row):
                    self._retire(slot, seq)
            except Exception as e:   # its own sampling: this request alone ends with it
                self._fail(slot, seq, e)

    def _grow(self, slot, positions):
        if not self.cache.grow(slot, positions):   # cannot happen: every slot can fill its context
            raise MemoryError(f"the KV cache has no page left for {positions} positions")

    def _retire(self, slot, seq, reason=None):
        self.running.pop(slot, None)
        self.cache.end(slot)
        seq._end(reason)
        with self._wake:
            if slot not in self.free:
                self.free.append(slot)
                self.free.sort()
