"""`tinydiff serve`: an OpenAI-compatible HTTP server, as llama-server is, on starlette + uvicorn.

    tinydiff serve -m DIR --port 8080 --slots 4 --ctx-size 2048 [--api-key KEY]

Endpoints (OpenAI's shapes, https://platform.openai.com/docs/api-reference):
    GET  /health                 {"status": "ok", "slots", "running", "waiting", "tokens_generated"}
    GET  /v1/models              the one model served, under its folder's name
    POST /v1/completions         {"prompt": str or [ids], "max_tokens": 16, "stream": false, ...}
    POST /v1/chat/completions    {"messages": [...], rendered with the model's chat template}
Fields read: max_tokens (completions: 16, as OpenAI; chat: up to the context), temperature, top_p,
and llama-server's top_k, min_p, repeat_penalty (default: the model's generation_config.json, else
llama.cpp's), seed, stop (a string or a list), stream and stream_options.include_usage. Streaming
is server-sent events: `data: {chunk}` lines, then `data: [DONE]`. A diffusion model takes its
denoising options as extra fields (steps, block_length, threshold, remasking, cache, ...), runs one
request at a time, and streams its answer as one chunk when it is done; with "stream_steps": true,
each denoising step comes first as a chunk with empty text and a "denoising" field, {"step": i,
"text": the answer so far, masked positions as \u2591}.

An autoregressive model is served by continuous batching (scheduler.py): every request gets a
slot and all running ones share each decode pass. The engine runs on its own thread, never on the
event loop; a client that disconnects frees its slot at the next step. Every bad request is a 4xx
with OpenAI's error body {"error": {"message", "type", "param", "code"}}, and the server goes on:
malformed JSON, a wrong field, an unknown model (404), a prompt over the context, a wrong or
missing API key (401), a full queue (503).
"""
import asyncio
import json
import threading
import time
import uuid
from dataclasses import fields

from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ..decoding.diffusion import Options
from ..decoding.generate import stream_text
from ..decoding.sampling import SamplingParams
from ..errors import TinydiffError, UsageError
from .scheduler import Busy, Scheduler

# the request fields a diffusion model reads: its denoising options (eos: a request always stops at EOS)
DENOISING = {f.name for f in fields(Options)} - {"eos"}
MASK_SHOWN = "\u2591"   # a masked position in a streamed denoising step, as --visual draws it
# OpenAI's field -> SamplingParams' (llama-server's own names pass as they are)
SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
            "repeat_penalty": "repeat_penalty", "seed": "seed"}


class ApiError(Exception):
    def __init__(self, status, message, param=None, code=None, kind="invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def response(self):
        return JSONResponse({"error": {"message": str(self), "type": self.kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status)


def make_app(model, name, slots=4, n_ctx=None, api_key=None, queue=64):
    """The starlette app serving model under name."""
    n_ctx = n_ctx or min(model.config.max_position_embeddings, 4096)
    scheduler = Scheduler(model, slots, n_ctx, queue) if model.config.causal else None
    one_at_a_time = threading.Lock()       # a diffusion model's requests

    def check_key(request):
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)", code="invalid_api_key",
                           kind="authentication_error")

    async def body_of(request):
        check_key(request)
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if body.get("model") not in (None, name):
            raise ApiError(404, f"the model '{body.get('model')}' does not exist; this server has '{name}'",
                           param="model", code="model_not_found")
        return body

    async def health(request):
        busy = {} if scheduler is None else {"slots": slots, "running": len(scheduler.running),
                                             "waiting": len(scheduler.waiting), "tokens_generated": scheduler.generated}
        return JSONResponse({"status": "ok", **busy})

    async def models(request):
        check_key(request)
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                         "owned_by": "tinydiff"}]})

    async def completions(request):
        body = await body_of(request)
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            ids = model.encode_prompt(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            ids = model._ids(prompt).tolist()
        else:
            raise ApiError(400, "prompt must be a non-empty string or list of token ids", param="prompt")
        return await answer(request, body, ids, "text_completion", default_max=16)

    async def chat_completions(request):
        body = await body_of(request)
        ids = model.chat_ids(body.get("messages"))
        return await answer(request, body, ids, "chat.completion", default_max=None)

    async def answer(request, body, ids, kind, default_max):
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is None:
            max_tokens = default_max or max(n_ctx - len(ids), 1)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError(400, f"max_tokens must be an integer >= 1, got {max_tokens!r}", param="max_tokens")
        if len(ids) + max_tokens > n_ctx:
            raise ApiError(400, f"the prompt ({len(ids)} tokens) + max_tokens {max_tokens} exceed the context of "
                                f"{n_ctx} tokens", param="max_tokens", code="context_length_exceeded")
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else stop
        if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
            raise ApiError(400, "stop must be a string or a list of strings", param="stop")
        run = Run(kind, name, len(ids))
        if scheduler is not None:
            params = SamplingParams.of(**{**dict(model.config.sampling_defaults),
                                          **{ours: body[k] for k, ours in SAMPLING.items() if body.get(k) is not None}})
            try:
                seq = scheduler.submit(ids, max_tokens, params)
            except Busy as e:
                raise ApiError(503, f"the server is busy: {e}", kind="server_error", code="busy") from None
            pieces = stream_text(model.tokenizer, iter(seq), model.stop_ids, stop, on_stop=run.stopped)
            return await run.respond(request, body, pieces, seq)
        options = {k: v for k, v in body.items() if k in DENOISING and v is not None}
        model.denoise_steps(ids, max_tokens, **options)        # every check now, before any answer starts
        denoised = Denoised(model, ids, max_tokens, options, stop, one_at_a_time, bool(body.get("stream_steps")))
        return await run.respond(request, body, iter(denoised), denoised)

    async def errors(request, e):
        if isinstance(e, ApiError):
            return e.response()
        if isinstance(e, UsageError):
            return ApiError(400, str(e)).response()
        return ApiError(500, f"{type(e).__name__}: {e}", kind="server_error").response()

    routes = [Route("/health", health), Route("/v1/models", models),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={ApiError: errors, TinydiffError: errors, Exception: errors})


class Denoised:
    """A diffusion model's answer, made on a worker thread one request at a time, as one piece;
    with steps, each denoising step first, as {"step": i, "text": the canvas after the prompt,
    masks as MASK_SHOWN} (a streaming client's "denoising" field)."""

    def __init__(self, model, ids, gen_length, options, stop, lock, steps=False):
        self.model, self.ids, self.gen_length, self.options, self.stop, self.lock = model, ids, gen_length, options, stop, lock
        self.steps, self.new, self.finish_reason = steps, [], None

    def __iter__(self):
        from ..decoding.diffusion import Step
        from ..decoding.generate import cut_at_stop
        with self.lock:
            for item in self.model.denoise_steps(self.ids, self.gen_length, **self.options):
                if isinstance(item, Step) and self.steps:
                    yield {"step": item.index, "text": self._canvas(item)}
                elif not isinstance(item, Step):
                    self.new = item.ids
        self.finish_reason = "stop" if self.new and self.new[-1] in self.model.stop_ids else "length"
        text = self.model.text(self.new)
        cut = cut_at_stop(text, self.stop)
        self.finish_reason = "stop" if cut != text else self.finish_reason
        yield cut

    def _canvas(self, step):
        tok, start = self.model.tokenizer, len(self.ids)
        return "".join(tok.decode([int(t)]) if done else MASK_SHOWN
                       for t, done in zip(step.canvas[start:], step.committed[start:]))

    def cancel(self):
        pass


class Run:
    """One response: the pieces of text as OpenAI's JSON, whole or as server-sent events."""

    def __init__(self, kind, model, prompt_tokens):
        self.kind, self.model, self.prompt_tokens = kind, model, prompt_tokens
        self.id = ("cmpl-" if kind == "text_completion" else "chatcmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.stop_string = False                       # the answer was cut before a stop string

    def stopped(self):
        self.stop_string = True

    async def respond(self, request, body, pieces, seq):
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(self.events(request, pieces, seq, usage), media_type="text/event-stream")
        try:
            text = "".join([piece async for piece in _pieces(pieces) if isinstance(piece, str)])
        finally:
            seq.cancel()
        return JSONResponse(self.whole(text, self.reason(seq), self.usage(seq)))

    def reason(self, seq):
        """OpenAI's finish_reason: "stop" at a stop id or string, "length" at max_tokens."""
        return "stop" if self.stop_string or seq.finish_reason != "length" else "length"

    def usage(self, seq):
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(seq.new),
                "total_tokens": self.prompt_tokens + len(seq.new)}

    def whole(self, text, reason, usage):
        if self.kind == "text_completion":
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason}
        return {"id": self.id, "object": self.kind, "created": self.created, "model": self.model,
                "choices": [choice], "usage": usage}

    def chunk(self, text=None, reason=None, first=False, usage=None, denoising=None):
        if self.kind == "text_completion":
            choices = [] if usage else [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}]
            kind = "text_completion"
        else:
            delta = {} if reason else {"content": text or ""}
            if first:
                delta = {"role": "assistant", "content": ""}
            choices = [] if usage else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
            kind = "chat.completion.chunk"
        out = {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            out["usage"] = usage
        if denoising is not None:
            out["denoising"] = denoising
        return f"data: {json.dumps(out)}\n\n"

    async def events(self, request, pieces, seq, include_usage):
        try:
            if self.kind != "text_completion":
                yield self.chunk(first=True)
            async for piece in _pieces(pieces):
                yield self.chunk(piece) if isinstance(piece, str) else self.chunk(denoising=piece)
            yield self.chunk(reason=self.reason(seq))
            if include_usage:
                yield self.chunk(usage=self.usage(seq))
            yield "data: [DONE]\n\n"
        finally:
            seq.cancel()              # a client gone (or a stop string met): the slot is free at the next step


async def _pieces(pieces):
    """The pieces of a blocking iterator, each awaited on a worker thread (the event loop never waits)."""
    end = object()
    while (piece := await asyncio.to_thread(next, pieces, end)) is not end:
        yield piece


def serve(model, name, host="127.0.0.1", port=8080, slots=4, n_ctx=None, api_key=None):
    """Runs the server until Ctrl-C."""
    import uvicorn
    uvicorn.run(make_app(model, name, slots, n_ctx, api_key), host=host, port=port, log_level="warning")
