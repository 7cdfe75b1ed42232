"""`tinydiff serve`: an OpenAI-compatible HTTP server, as llama-server is, on starlette + uvicorn.

    tinydiff serve -m DIR --port 8080 --slots 4 --ctx-size 2048 [--api-key KEY]

Endpoints (OpenAI's shapes, https://platform.openai.com/docs/api-reference):
    GET  /health                 {"status": "ok", "slots", "running", "waiting", "tokens_generated"}
    GET  /v1/models              the one model served, under its folder's name
    POST /v1/completions         {"prompt": str or [ids], "max_tokens": 16, "stream": false, ...}
    POST /v1/chat/completions    {"messages": [...], rendered with the model's chat template}
Fields read: max_tokens (completions: 16, as OpenAI; chat: up to the context, for a diffusion model
128), temperature, top_p, and llama-server's top_k, min_p, repeat_penalty, repeat_last_n (default:
the model's generation_config.json, else llama.cpp's; a diffusion model's: LLaDA's greedy, no
penalty), seed, stop (a string or a list of at most 16, each 1-512 characters), n (1 only), stream
and stream_options.include_usage. A prompt is a string, a list of one, or a list of token ids. A
message's content is a string or a list of {"type": "text"} parts; "developer" is the system role
under OpenAI's newer name. Fields this server cannot honour (logprobs, echo, suffix, best_of > 1,
presence and frequency penalties, logit_bias, tools, response_format other than text; another kind
of model's options: a diffusion field to an autoregressive model, min_p to a diffusion one) are a
400, never ignored; their defaults (and null) pass.
Streaming is server-sent events: `data: {chunk}` lines, then `data: [DONE]`. A diffusion model
takes its denoising options as extra fields (steps, block_length, threshold, gap, remasking, cache, ...),
runs one request at a time on a worker thread of its own (at most `queue` more wait: 503 past
them), and streams its answer as one chunk when
it is done; with "stream_steps": true, each denoising step comes first as a chunk with empty text
and a "denoising" field, {"step": i, "text": the answer so far, masked positions as \u2591}.

An autoregressive model is served by continuous batching (scheduler.py): every request gets a
slot and all running ones share each decode pass. `--draft ngram|MODEL` (a server flag, not a
request field: a drafter model is loaded once) makes every slot speculate on its own, each pass
verifying every running request's drafts (the same tokens as without it). The engines run on their own threads and hand
each request its tokens through an asyncio queue, so the event loop never waits on them and no
request holds a thread while it waits for a slot. A streaming client that disconnects frees its
slot at the next step (a non-streaming request runs to its end, as llama-server's does). A failure
in the engine is a 500 (or, mid-stream, a `data: {"error": ...}` event), never a normal ending.
Every bad request is a 4xx with OpenAI's error body {"error": {"message", "type", "param", "code"}},
and the server goes on: malformed JSON (NaN and Infinity included), a wrong field, an unknown model
or path (404), a wrong method (405), a body over MAX_BODY_BYTES or 64 bytes a context position (413),
a prompt over the context, a wrong or missing API key (401), a full queue (503). Prompts are
tokenized off the event loop, so a long one never stalls the other clients; one request's failure
in sampling ends it alone.
"""
import asyncio
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ..decoding.diffusion import Denoised, Options, Step
from ..decoding.generate import DEFAULT_CTX, TextStream, cut_at_stop
from ..decoding.visual import masked_text
from ..errors import TinydiffError, UsageError
from .scheduler import Busy, Scheduler

# the request fields a diffusion model reads: its denoising options (eos: a request always stops at EOS)
DENOISING = {f.name for f in fields(Options)} - {"eos"}
DIFFUSION_MAX_TOKENS = 128   # a diffusion answer's canvas when the request names none (LLaDA's default)
# OpenAI's field -> SamplingParams' (llama-server's own names pass as they are)
SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
            "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n", "seed": "seed"}
# OpenAI's fields this server cannot honour, and the value each may keep (anything else is a 400)
UNSUPPORTED = {"logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "suffix": (None, ""),
               "best_of": (None, 1), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
               "logit_bias": (None, {}), "tools": (None, []), "functions": (None, []), "tool_choice": (None, "none"),
               "response_format": (None, {"type": "text"})}
MAX_STOPS, MAX_STOP_CHARS = 16, 512   # each token checks every stop string: kept small
MAX_BODY_BYTES = 1 << 20              # or 64 bytes a context position, if more


class ApiError(Exception):
    def __init__(self, status, message, param=None, code=None, kind="invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self):
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}

    def response(self):
        return JSONResponse(self.body(), status_code=self.status)


def make_app(model, name, slots=4, n_ctx=None, api_key=None, queue=64, speculator=None):
    """The starlette app serving model under name (speculator: every slot speculates, a copy each)."""
    n_ctx = n_ctx or min(model.config.max_position_embeddings, DEFAULT_CTX)
    scheduler = Scheduler(model, slots, n_ctx, queue, speculator=speculator) if model.config.causal else None
    diffusion = ThreadPoolExecutor(1, thread_name_prefix="tinydiff-diffusion") if scheduler is None else None
    denoising = {"running": 0, "waiting": 0}          # a diffusion model's requests (event loop only)
    max_body = max(MAX_BODY_BYTES, 64 * n_ctx)
    # the fields of the other kind of model: a 400, not ignored
    foreign = DENOISING - set(SAMPLING) | {"stream_steps"} if scheduler is not None else set(SAMPLING) - DENOISING

    def check_key(request):
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if api_key is not None and (scheme.lower() != "bearer" or key.strip() != api_key):
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)", code="invalid_api_key",
                           kind="authentication_error")

    async def body_of(request):
        check_key(request)
        if int(request.headers.get("content-length") or 0) > max_body:
            raise _too_large(max_body)
        raw = bytearray()
        async for piece in request.stream():
            raw += piece
            if len(raw) > max_body:
                raise _too_large(max_body)
        try:
            body = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
            raise ApiError(400, f"the request body is not JSON: {e}") from None
        except RecursionError:
            raise ApiError(400, "the request body is not JSON this server reads: nested too deeply") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if body.get("model") not in (None, name):
            raise no_such_model(body["model"])
        for field in sorted(k for k in set(body) & foreign if body[k] is not None):
            kind = "an autoregressive" if scheduler is not None else "a diffusion"
            raise ApiError(400, f"{field} is not an option of {kind} model", param=field)
        for field, allowed in UNSUPPORTED.items():
            if field in body and not any(body[field] is a or body[field] == a and type(body[field]) is type(a)
                                         for a in allowed):
                raise ApiError(400, f"{field} is not supported by this server (got {body[field]!r})", param=field)
        return body

    async def health(request):
        busy = {"slots": 1, **denoising} if scheduler is None else {
            "slots": slots, "running": len(scheduler.running), "waiting": len(scheduler.waiting),
            "tokens_generated": scheduler.generated}
        return JSONResponse({"status": "ok", **busy})

    def no_such_model(asked):
        return ApiError(404, f"the model '{asked}' does not exist; this server has '{name}'", param="model",
                        code="model_not_found")

    def model_card():
        return {"id": name, "object": "model", "created": 0, "owned_by": "tinydiff"}

    async def models(request):
        check_key(request)
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def one_model(request):
        check_key(request)
        if request.path_params["id"] != name:
            raise no_such_model(request.path_params["id"])
        return JSONResponse(model_card())

    async def completions(request):
        body = await body_of(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]                                     # a batch of one
        if isinstance(prompt, str) and prompt:
            ids = await asyncio.to_thread(model.encode_prompt, prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            ids = prompt                          # in the vocabulary: the Model checks (request, denoise_steps)
        else:
            raise ApiError(400, "prompt must be a non-empty string, a list of one, or a list of token ids "
                                "(one prompt a request)", param="prompt")
        return await answer(body, ids, "text_completion", default_max=16)

    async def chat_completions(request):
        body = await body_of(request)
        if model.chat_template is None:                  # (the model's own error names its folder)
            raise ApiError(400, f"the model '{name}' has no chat template: use /v1/completions")
        ids = await asyncio.to_thread(model.chat_ids, _text_messages(body.get("messages")))
        return await answer(body, ids, "chat.completion", default_max=None)

    async def answer(body, ids, kind, default_max):
        stream, options = _stream_options(body)
        if body.get("n", 1) != 1 or isinstance(body.get("n"), bool):
            raise ApiError(400, f"n must be 1 (one answer a request), got {body['n']!r}", param="n")
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is None:
            max_tokens = default_max or (max(n_ctx - len(ids), 1) if scheduler is not None
                                         else min(DIFFUSION_MAX_TOKENS, max(n_ctx - len(ids), 1)))
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError(400, f"max_tokens must be an integer >= 1, got {max_tokens!r}", param="max_tokens")
        if len(ids) + max_tokens > n_ctx:
            raise ApiError(400, f"the prompt ({len(ids)} tokens) + max_tokens {max_tokens} exceed the context of "
                                f"{n_ctx} tokens", param="max_tokens", code="context_length_exceeded")
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else stop
        if stop is not None and not (isinstance(stop, list) and len(stop) <= MAX_STOPS and all(
                isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stop)):
            raise ApiError(400, f"stop must be a string or a list of at most {MAX_STOPS} strings, each of 1 to "
                                f"{MAX_STOP_CHARS} characters", param="stop")
        run = Run(kind, name, len(ids))
        events = generated(body, ids, max_tokens, stop, run) if scheduler is not None \
            else denoised(body, ids, max_tokens, stop, run)
        if stream:
            return StreamingResponse(run.events(events, options.get("include_usage") is True),
                                     media_type="text/event-stream")
        return JSONResponse(await run.whole(events))

    def generated(body, ids, max_tokens, stop, run):
        """The events of an autoregressive answer: its text pieces, from the scheduler's tokens."""
        params = model.sampling_params(**{ours: body[k] for k, ours in SAMPLING.items() if body.get(k) is not None})
        tokens, loop = asyncio.Queue(), asyncio.get_running_loop()
        try:
            seq = scheduler.submit(ids, max_tokens, params, lambda t: loop.call_soon_threadsafe(tokens.put_nowait, t))
        except Busy as e:
            raise ApiError(503, f"the server is busy: {e}", kind="server_error", code="busy") from None

        async def events():
            text = TextStream(model.tokenizer, model.stop_ids, stop)
            try:
                while (token := await tokens.get()) is not None:
                    piece = text.push(token)
                    if piece:
                        yield piece
                    if text.done:
                        break
                if seq.finish_reason == "error" and not text.done:
                    raise ApiError(500, f"the engine failed: {seq.error}", kind="server_error")
                piece = text.finish()
                if piece:
                    yield piece
                run.ended("stop" if text.done else "length", text.tokens)
            finally:
                seq.cancel()          # a client gone (or a stop string met): the slot is free at the next step
        return events()

    def denoised(body, ids, max_tokens, stop, run):
        """The events of a diffusion answer, made on the diffusion thread: its steps, if asked for,
        then its text as one piece."""
        options = {k: v for k, v in body.items() if k in DENOISING and v is not None}
        steps = model.denoise_steps(ids, max_tokens, **options)    # every check now, before any answer starts
        if denoising["running"] + denoising["waiting"] > queue:   # one runs, `queue` wait (counted as they
            raise ApiError(503, f"the server is busy: a request is denoising and {denoising['waiting']} wait",
                           kind="server_error", code="busy")         # start: a few at once may pass together)
        show_steps = body.get("stream_steps") is True
        out, loop, gone = asyncio.Queue(), asyncio.get_running_loop(), threading.Event()

        def work():
            loop.call_soon_threadsafe(started)
            try:
                for item in steps:
                    if gone.is_set():
                        break
                    if isinstance(item, Step) and show_steps:
                        give({"step": item.index, "text": masked_text(model.tokenizer, item.canvas[len(ids):],
                                                                      item.committed[len(ids):])})
                    elif isinstance(item, Denoised):
                        give(item)
            except Exception as e:
                give(e)
            give(None)

        def give(item):
            loop.call_soon_threadsafe(out.put_nowait, item)

        def started():
            denoising["waiting"] -= 1
            denoising["running"] += 1

        def finished(_):
            loop.call_soon_threadsafe(lambda: denoising.__setitem__("running", denoising["running"] - 1))

        async def events():
            denoising["waiting"] += 1                            # submitted when read: a client gone before
            diffusion.submit(work).add_done_callback(finished)   # its first chunk costs no run
            try:
                while (item := await out.get()) is not None:
                    if isinstance(item, Exception):
                        raise ApiError(500, f"the engine failed: {type(item).__name__}: {item}", kind="server_error")
                    if isinstance(item, dict):
                        yield item
                        continue
                    text = model.text(item.ids)
                    cut = cut_at_stop(text, stop)
                    yield cut
                    ended = cut != text or (item.ids and item.ids[-1] in model.stop_ids)
                    run.ended("stop" if ended else "length", len(item.ids))
            finally:
                gone.set()
        return events()

    async def errors(request, e):
        if isinstance(e, ApiError):
            return e.response()
        if isinstance(e, UsageError):
            return ApiError(400, str(e)).response()
        if isinstance(e, HTTPException):                  # starlette's own: no such path, a wrong method
            response = ApiError(e.status_code, f"{request.method} {request.url.path}: {e.detail}",
                                code="not_found" if e.status_code == 404 else None).response()
            response.headers.update(e.headers or {})              # a 405's Allow
            return response
        return ApiError(500, f"{type(e).__name__}: {e}", kind="server_error").response()

    routes = [Route("/health", health), Route("/v1/models", models), Route("/v1/models/{id:path}", one_model),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={ApiError: errors, TinydiffError: errors,
                                                        HTTPException: errors, Exception: errors})


def _too_large(limit):
    return ApiError(413, f"the request body is over {limit} bytes", code="request_too_large")


def _no_constant(word):
    raise ValueError(f"{word} is not a JSON number")


def _finite(text):
    """A JSON number as a float, refused where it overflows (1e999 would be inf)."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is too large a number")
    return value


def _stream_options(body):
    """(stream, stream_options) checked: a bool, and options (an object) only with stream."""
    stream, options = body.get("stream", False), body.get("stream_options")
    if not isinstance(stream, bool):
        raise ApiError(400, f"stream must be true or false, got {stream!r}", param="stream")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise ApiError(400, "stream_options must be an object, and is only allowed with stream: true",
                       param="stream_options")
    if not isinstance((options or {}).get("include_usage", False), (bool, type(None))):
        raise ApiError(400, "stream_options.include_usage must be true or false", param="stream_options")
    return stream, options or {}


def _text_messages(messages):
    """OpenAI's messages with a content that is a list of text parts made plain strings."""
    if not isinstance(messages, list):
        return messages
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "developer":        # OpenAI's newer name for system
            m = {**m, "role": "system"}
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ApiError(400, "message content parts must be {\"type\": \"text\", \"text\": ...} (text only)",
                               param="messages")
            m = {**m, "content": "".join(p["text"] for p in content)}
        out.append(m)
    return out


class Run:
    """One response: its events (text pieces, denoising steps) as OpenAI's JSON, whole or as
    server-sent events."""

    def __init__(self, kind, model, prompt_tokens):
        self.kind, self.model, self.prompt_tokens = kind, model, prompt_tokens
        self.id = ("cmpl-" if kind == "text_completion" else "chatcmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.finish_reason, self.completion_tokens = None, 0

    def ended(self, reason, tokens):
        """OpenAI's finish_reason ("stop" at a stop id or string, "length" at max_tokens) and the
        tokens the answer took, up to its stop."""
        self.finish_reason, self.completion_tokens = reason, tokens

    def usage(self):
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    async def whole(self, events):
        text = "".join([piece async for piece in events if isinstance(piece, str)])
        if self.kind == "text_completion":
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason}
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": self.finish_reason}
        return {"id": self.id, "object": self.kind, "created": self.created, "model": self.model,
                "choices": [choice], "usage": self.usage()}

    def chunk(self, text=None, reason=None, first=False, usage=False, denoising=None, with_usage=False):
        if self.kind == "text_completion":
            choices = [] if usage else [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}]
            kind = "text_completion"
        else:
            delta = {"role": "assistant", "content": ""} if first else {} if reason else {"content": text or ""}
            choices = [] if usage else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
            kind = "chat.completion.chunk"
        out = {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}
        if with_usage:                                  # OpenAI: null in every chunk but the last
            out["usage"] = self.usage() if usage else None
        if denoising is not None:
            out["denoising"] = denoising
        return f"data: {json.dumps(out)}\n\n"

    async def events(self, events, include_usage):
        u = include_usage
        try:
            if self.kind != "text_completion":
                yield self.chunk(first=True, with_usage=u)
            async for item in events:
                yield self.chunk(item, with_usage=u) if isinstance(item, str) else self.chunk(denoising=item, with_usage=u)
            yield self.chunk(reason=self.finish_reason, with_usage=u)
            if include_usage:
                yield self.chunk(usage=True, with_usage=u)
            yield "data: [DONE]\n\n"
        except ApiError as e:                           # mid-stream: the status is sent, the error is an event
            yield f"data: {json.dumps(e.body())}\n\n"


def serve(model, name, host="127.0.0.1", port=8080, slots=4, n_ctx=None, api_key=None, speculator=None):
    """Runs the server until Ctrl-C."""
    import uvicorn
    uvicorn.run(make_app(model, name, slots, n_ctx, api_key, speculator=speculator), host=host, port=port,
                log_level="warning")
