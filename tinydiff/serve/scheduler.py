"""Continuous batching: many requests decoded together, each joining and leaving at any step.

    scheduler = Scheduler(model, slots=4)
    seq = scheduler.submit(prompt_ids, max_new_tokens=64, params=SamplingParams(temperature=0))
    for token in seq:            # the new ids as they come (a thread-safe queue underneath)
        ...

The scheduler owns one Decoder (Model.decoder): a run State of `slots` sequences, its KV cache paged and shared
(engine/transformer.py's PagedKVCache: pages of 64 positions, a page table per sequence, a prefix
cache of named pages), and one thread, the engine's, which loops: admit waiting requests into free
slots (each prompt prefilled on its own, in passes of up to PREFILL_ROWS rows: a prefill is
compute-bound, batching it buys nothing; the pages of its start that an earlier request left, a
shared system prompt, are taken instead of recomputed), then one decode step for every running
sequence, each at its own position (decoding/generate.py's Decoder.step: the weights are read once
for all of them), then each takes its token and those that ended retire (a stop id,
max_new_tokens, or cancel(): a client gone). A retired slot is free at the next step. The passes
and a request's token choice are decoding/generate.py's, the checks Model.request's: the
scheduler keeps admission, the pages and its thread. Requests beyond the slots wait in a queue
of at most `queue` entries; submit() beyond that raises Busy (the server answers 503).

With a Speculator (decoding/speculative.py: --draft), each slot speculates on its own: its own
drafter (a drafter model's cache a slot), its drafts cut to what the pass's rows and its context
leave; one pass then verifies every running sequence's newest token and drafts (ragged, each at its
own positions), and each takes as many tokens as its drafts earn. The rows a sequence's rejected
drafts wrote stay in its pages unread, overwritten by its next pass; only pages of accepted
positions are named for the prefix cache.

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

from ..decoding.generate import PREFILL_ROWS
from ..engine.kernels import PAGE
from ..engine.ledger import Ledger
from ..engine.transformer import PagedKVCache


class Busy(Exception):
    """Every slot is taken and the waiting queue is full."""


class Sequence:
    """A request being served (its decoding.generate.Request, checked by Model.request): iterate
    it for its new token ids (it ends after the last); finish_reason then says why: "stop" (a stop
    id, the last id given), "length" (max_new_tokens), "cancelled", or "error" (the engine failed:
    `error` says how)."""

    def __init__(self, request, on_token=None):
        self.request = request
        self.ids, self.history = request.ids, request.history   # the request's own lists, read as they grow
        self.on_token = on_token           # also called with each token and None at the end (the server's)
        self.error = None
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
    def finish_reason(self):
        return self.request.finish_reason

    @property
    def new(self):
        return self.request.new

    def _take(self, logits):
        """The request takes its next token from logits [V], which is given out; True if it has ended."""
        done = self.request.take(logits)
        self._give(self.history[-1])
        return done

    def _end(self, reason=None):
        self.request.finish_reason = self.request.finish_reason or reason
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
    Ledger of every pass the engine runs (self.ledger; tests, never a long-running server);
    speculator: a decoding.speculative.Speculator (Model.speculator) each slot speculates with a copy of."""

    def __init__(self, model, slots=4, n_ctx=None, queue=64, prefix_cache_bytes=64 << 20, ledger=False,
                 speculator=None):
        self.model, self.slots, self.queue_size = model, slots, queue
        self.n_ctx = n_ctx or model.config.max_position_embeddings
        pages = (slots * -(-self.n_ctx // PAGE)                        # every slot can fill its context
                 + prefix_cache_bytes // PagedKVCache.page_bytes(model.config))
        self.decoder = model.decoder(self.n_ctx, batch=slots, rows=max(slots, min(PREFILL_ROWS, self.n_ctx)),
                                     pages=pages)
        self.cache = self.decoder.cache
        self.ledger = Ledger() if ledger else None
        self.spec = None if speculator is None else {slot: speculator.fresh() for slot in range(slots)}
        self.free = list(range(slots))
        self.waiting = deque()
        self.running = {}                  # slot -> Sequence
        self.steps = self.generated = 0    # decode passes run and tokens given, for /health
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="tinydiff-engine", daemon=True)
        self._thread.start()

    def submit(self, ids, max_new_tokens, params, on_token=None):
        """Queues a request (prompt ids, max_new_tokens, SamplingParams: Model.request checks them
        and that they fit a slot's context, a UsageError if not); returns its Sequence at once
        (on_token: called on the engine's thread with each token, then None). Busy if the queue is full."""
        seq = Sequence(self.model.request(ids, max_new_tokens, params, n_ctx=self.n_ctx), on_token)
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
        logits = self.decoder.prefill(seq.request, seq.reused, slot)
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
        if self.spec is not None:
            return self._speculate(slots, seqs)
        for slot, seq in zip(slots, seqs):
            self._grow(slot, len(seq.history))                            # a page for the newest token's K/V
        logits = self.decoder.step([seq.request for seq in seqs], slots)  # [B, V]
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

    def _speculate(self, slots, seqs):
        """_step's pass as one verify pass: each sequence's newest token and its slot's drafts, then
        each takes the tokens they earn (decoding/speculative.py)."""
        share = self.decoder.state.buf.n_max // len(seqs)               # rows a sequence may take
        drafts = [self.spec[slot].drafts(seq.request, min(share, self.n_ctx - len(seq.history) + 1) - 1)
                  for slot, seq in zip(slots, seqs)]
        for slot, seq, d in zip(slots, seqs, drafts):
            self._grow(slot, len(seq.history) + len(d))                  # pages for the newest token and its drafts
        logits = self.decoder.verify([seq.request for seq in seqs], drafts, slots)   # [[1 + k_i, V]]
        self.steps += 1
        for slot, seq, rows, d in zip(slots, seqs, logits, drafts):
            try:
                known = len(seq.history) - 1                             # positions whose K/V were right before
                tokens, done = self.spec[slot].take(seq.request, rows, d)
                self.generated += len(tokens)
                for token in tokens:
                    seq._give(token)
                if (len(seq.history) - 1) // PAGE > known // PAGE:      # a page of accepted positions filled
                    self.cache.name_pages(slot, seq.history[:-1])
                if done:
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
