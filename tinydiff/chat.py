"""A conversation with a model: its messages, and (autoregressive) the KV cache of all that was said.

    chat = Chat(model, system="You are terse.")
    for piece in chat.send("What is 2 + 2?", max_new_tokens=64, temperature=0):
        print(piece, end="")

Each turn renders the whole conversation with the model's chat template (formats/chat_template.py),
so a turn sees exactly what a fresh model.chat(messages) would. An autoregressive Chat keeps one
run State across turns and the ids whose keys and values it holds; a turn prefills only from the
first id where the new rendering differs from them (llama.cpp server's cache_prompt rule): the
previous answer is normally kept whole, since the template writes it back as it was generated.
A masked-diffusion model has no cache to keep (its positions see each other, so every step
recomputes the canvas): each answer is a canvas of max_new_tokens masks after the rendered history.

A turn that fails its checks (a template that refuses the conversation, a conversation too long
for the context) raises UsageError and leaves the conversation as it was; an answer cut short
(the caller stops reading, Ctrl-C) is kept as far as it went, as llama.cpp's chat keeps it, and
one cut before its first piece leaves no turn. A new turn (or reset) ends an answer still being
read: one State serves one turn at a time.
"""
from .decoding.diffusion import to_the_end
from .decoding.generate import DEFAULT_CTX, PREFILL_ROWS, stream_text
from .errors import UsageError, is_integer
from .formats.chat_template import check_variables


class Chat:
    """model: a tinydiff Model with a chat template; system: an optional system message; n_ctx:
    the positions the conversation may take (default: the model's context, at most 4096);
    variables: extra template variables (date_string, ...)."""

    def __init__(self, model, system=None, n_ctx=None, **variables):
        if not hasattr(model, "chat_ids"):
            raise UsageError(f"Chat takes a tinydiff Model (tinydiff.load(...)), got {type(model).__name__}")
        self.model, self.system, self.variables = model, system, check_variables(variables)
        limit = model.config.max_position_embeddings
        if n_ctx is not None and not (is_integer(n_ctx) and 1 <= n_ctx <= limit):
            raise UsageError(f"the chat's context must be an integer in 1..{limit} (the model's), got {n_ctx!r}")
        self.n_ctx = n_ctx or min(limit, DEFAULT_CTX)
        self._turn = None
        self.reset()
        model.render_chat(self.messages or [{"role": "user", "content": ""}], **variables)   # no template: fails here

    def reset(self):
        """Forgets the conversation (the system message stays) and the cache."""
        self._end_turn()
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.cached = []        # ids whose keys and values are in the State's cache, from position 0
        self.decoder = None     # its run State: made at the first autoregressive turn
        self.last_prefill = 0   # positions the last turn prefilled (what the cache saved shows here)

    def send(self, text, max_new_tokens=256, on_step=None, draft=None, draft_max=None, **options):
        """Yields the answer to the user's text as pieces; the turn joins the conversation when the
        answer ends (or is cut short). options: sampling (autoregressive) or denoising options;
        draft, draft_max: speculative decoding, as Model.speculator takes them (give a Speculator made
        once, model.speculator(...), to keep a drafter model's cache across turns);
        on_step (masked diffusion): called after every step, as Model.denoise_ids calls it. Every
        check is made before the first piece is asked for (an autoregressive turn's by
        Model.request); self.ids is then the rendered conversation the answer follows."""
        self._end_turn()   # an answer still being read ends here: two turns never share the cache
        if on_step is not None and (self.model.config.causal or not callable(on_step)):
            raise UsageError("on_step is a function called after each denoising step, for a masked-diffusion "
                             "model (an autoregressive one has no steps)")
        causal = self.model.config.causal
        if not is_integer(max_new_tokens) or max_new_tokens < 1:
            raise UsageError(f"the number of tokens to generate must be an integer >= 1, got {max_new_tokens!r}")
        messages = self.messages + [{"role": "user", "content": text}]
        ids = self.model.chat_ids(messages, **self.variables)
        if len(ids) + max_new_tokens > self.n_ctx:    # in a chat's words: the conversation, and /reset
            raise UsageError(f"the conversation ({len(ids)} tokens) + {max_new_tokens} new tokens exceed the "
                             f"context of {self.n_ctx} positions: /reset it, or ask for fewer tokens")
        if causal:
            spec = None if draft is None else self.model.speculator(draft, draft_max, self.n_ctx)
            request = self.model.request(ids, max_new_tokens, self.model.sampling_params(**options), n_ctx=self.n_ctx)
        elif draft is not None:
            spec = self.model.speculator(draft, draft_max)      # refuses a masked-diffusion model in one line
        self.ids = ids
        if causal:
            answer = self._generate(request, spec)
        else:
            answer = self._denoise(ids, max_new_tokens, on_step, options)
        self._turn = self._record(messages, answer)
        return self._turn

    def _end_turn(self):
        if self._turn is not None:
            self._turn.close()
            self._turn = None

    def _record(self, messages, pieces):
        """The answer's pieces; when they end, the turn joins the conversation, unless nothing
        was said (an answer stopped before its first piece leaves no turn)."""
        said = []
        try:
            for piece in pieces:
                said.append(piece)
                yield piece
        finally:
            if said:
                self.messages = messages + [{"role": "assistant", "content": "".join(said)}]
            self._turn = None

    def _generate(self, request, spec):
        model, ids = self.model, request.ids
        if self.decoder is None:
            self.decoder = model.decoder(self.n_ctx, rows=PREFILL_ROWS)
        same = next((i for i, (a, b) in enumerate(zip(ids, self.cached)) if a != b), min(len(ids), len(self.cached)))
        same = min(same, len(ids) - 1)           # the last prompt id is run, for the first answer's logits
        self.last_prefill = len(ids) - same
        self.cached = list(ids[:same])
        if spec is None:
            tokens = self.decoder.tokens(request, cached=same)
        else:                                    # a verify round for each decode step, the same tokens
            tokens = spec.tokens(self.decoder, request, cached=same)
        return stream_text(model.tokenizer, self._cache_as_run(ids, tokens), model.stop_ids, None)

    def _cache_as_run(self, ids, tokens):
        """The tokens, noting what the cache holds after each: the prompt (once the first token
        shows it prefilled), then each token once the pass after it has written its K/V."""
        held = None                               # the newest token: its K/V not yet written
        for token in tokens:
            if held is None:
                self.cached = list(ids)
            else:
                self.cached.append(held)
            held = token
            yield token

    def _denoise(self, ids, max_new_tokens, on_step, options):
        steps = self.model.denoise_steps(ids, max_new_tokens, **options)     # checked now, run when read
        return self._text_of(steps, on_step)

    def _text_of(self, steps, on_step):
        yield self.model.text(to_the_end(steps, on_step).ids)
