"""Serving: continuous batching equal to running alone, and `tinydiff serve` answering real clients."""
import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

import tinydiff
from tinydiff.decoding.sampling import SamplingParams
from tinydiff.serve.scheduler import Busy, Scheduler

starlette = pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from tinydiff.serve.server import make_app  # noqa: E402

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [3], [40, 41], [7] * 9, [100, 3, 5], [60], [61, 62]]


def greedy(n=10):
    return SamplingParams(temperature=0)


# -- the scheduler ---------------------------------------------------------------------------------

def test_more_requests_than_slots_each_get_what_they_get_alone():
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    scheduler = Scheduler(model, slots=3)
    steps = [10, 3, 12, 7, 5, 9, 1, 11]
    seqs = [scheduler.submit(p, n, SamplingParams(temperature=0.9, top_k=0, seed=i))
            for i, (p, n) in enumerate(zip(PROMPTS, steps))]
    got = [list(s) for s in seqs]
    assert got == [model.generate_ids(p, n, temperature=0.9, top_k=0, seed=i)
                   for i, (p, n) in enumerate(zip(PROMPTS, steps))]
    assert all(s.finish_reason in ("stop", "length") for s in seqs)
    assert sorted(scheduler.free) == [0, 1, 2] and not scheduler.running


def test_a_cancelled_request_frees_its_slot_for_the_next():
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    scheduler = Scheduler(model, slots=1, n_ctx=256)
    long = scheduler.submit([5, 6], 200, greedy())
    it = iter(long)
    next(it)
    waiting = scheduler.submit([7, 8], 4, greedy())
    long.cancel()
    assert list(waiting) == model.generate_ids([7, 8], 4, temperature=0)
    assert long.finish_reason == "cancelled" and len(long.new) < 200


def test_a_full_queue_is_busy():
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    scheduler = Scheduler(model, slots=1, n_ctx=256, queue=1)
    first = scheduler.submit([5, 6], 200, greedy())
    next(iter(first))                        # running in the slot
    scheduler.submit([7], 3, greedy())       # waits
    with pytest.raises(Busy):
        scheduler.submit([8], 3, greedy())
    first.cancel()


def test_one_requests_failing_sampler_ends_it_alone(monkeypatch):
    """A request whose own sampling fails (here a sampler that breaks at its third token) ends with
    "error"; the requests sharing its decode passes go on to what they get alone."""
    from tinydiff.decoding import generate as decoding

    class Breaks(decoding.Sampler):
        def __call__(self, logits, history):
            if self.p.seed == 666 and len(history) >= 4:
                raise ValueError("a broken sampler")
            return super().__call__(logits, history)
    monkeypatch.setattr(decoding, "Sampler", Breaks)
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    scheduler = Scheduler(model, slots=2, n_ctx=256)
    fine = scheduler.submit([5, 6], 40, greedy())
    broken = scheduler.submit([7, 8], 40, SamplingParams(temperature=0, seed=666))
    assert list(fine) == model.generate_ids([5, 6], 40, temperature=0) and fine.finish_reason != "error"
    list(broken)
    assert broken.finish_reason == "error" and "a broken sampler" in broken.error and len(broken.new) == 2


# -- the HTTP server, in process --------------------------------------------------------------------

@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve") / "chat"
    shutil.copytree(os.path.join(HF, "llama-gqa"), folder, ignore=shutil.ignore_patterns("*.npy"))
    json.dump({"chat_template": CHATML}, open(folder / "tokenizer_config.json", "w"))
    return str(folder)


@pytest.fixture(scope="module")
def client(chat_model):
    return TestClient(make_app(tinydiff.load(chat_model), "chat", slots=2, api_key="k")), tinydiff.load(chat_model)


def auth(**body):
    return dict(json=body, headers={"Authorization": "Bearer k"})


def events(text):
    lines = [line for line in text.split("\n\n") if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_completions_whole_and_streamed(client):
    c, model = client
    want = model.generate("Once upon", 12, temperature=0)
    r = c.post("/v1/completions", **auth(prompt="Once upon", max_tokens=12, temperature=0))
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == want
    assert body["usage"]["prompt_tokens"] == len(model.encode_prompt("Once upon"))
    assert body["usage"]["completion_tokens"] == len(model.generate_ids(model.encode_prompt("Once upon"), 12, temperature=0))
    r = c.post("/v1/completions", **auth(prompt="Once upon", max_tokens=12, temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    chunks = events(r.text)
    assert "".join(ch["choices"][0]["text"] for ch in chunks[:-1]) == want
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == body["usage"]


def test_chat_completions_follow_the_template_and_stop_strings_cut(client):
    c, model = client
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    want = model.chat(messages, 10, temperature=0)
    r = c.post("/v1/chat/completions", **auth(messages=messages, max_tokens=10, temperature=0))
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": want}
    chunks = events(c.post("/v1/chat/completions", **auth(messages=messages, max_tokens=10, temperature=0,
                                                          stream=True)).text)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks) == want
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    cut = want[2:4]
    r = c.post("/v1/chat/completions", **auth(messages=messages, max_tokens=10, temperature=0, stop=[cut]))
    assert r.json()["choices"][0]["message"]["content"] == want[:want.index(cut)]
    assert r.json()["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("path, body, status, words", [
    ("/v1/completions", b"{bad", 400, "not JSON"),
    ("/v1/completions", b"[1]", 400, "JSON object"),
    ("/v1/completions", b'{"prompt": ""}', 400, "prompt must be"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": -1}', 400, "max_tokens must be an integer >= 1"),
    ("/v1/completions", b'{"prompt": "x", "model": "gpt-4"}', 404, "does not exist"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 100000}', 400, "exceed the context"),
    ("/v1/completions", b'{"prompt": "x", "temperature": -1}', 400, "temperature must be >= 0"),
    ("/v1/completions", b'{"prompt": "x", "repeat_last_n": -1}', 400, "repeat_last_n must be"),
    ("/v1/completions", b'{"prompt": "x", "stop": 3}', 400, "stop must be"),
    ("/v1/chat/completions", b'{"messages": [{"role": "robot", "content": "x"}]}', 400, "role 'robot'"),
    ("/v1/chat/completions", b'{"messages": []}', 400, "non-empty list"),
    ("/v1/completions", b'{"prompt": "x", "stream": "false"}', 400, "stream must be true or false"),
    ("/v1/completions", b'{"prompt": "x", "stream_options": {"include_usage": true}}', 400, "only allowed with stream"),
    ("/v1/completions", b'{"prompt": "x", "n": 2}', 400, "n must be 1"),
    ("/v1/completions", b'{"prompt": [1, 100000]}', 400, "outside the vocabulary"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', 400,
     "text only"),
    ("/v1/completions", b'{"prompt": "x", "temperature": NaN}', 400, "NaN is not a JSON number"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": Infinity}', 400, "Infinity is not a JSON number"),
    ("/v1/completions", b'{"prompt": "x", "n": true}', 400, "n must be 1"),
    ("/v1/completions", b'{"prompt": ["x", "y"]}', 400, "one prompt a request"),
    ("/v1/completions", b'{"prompt": "x", "stop": ""}', 400, "each of 1 to 512 characters"),
    ("/v1/completions", b'{"prompt": "x", "stop": "' + b"s" * 513 + b'"}', 400, "each of 1 to 512 characters"),
    ("/v1/completions", b'{"prompt": "x", "stop": ' + json.dumps(["a"] * 17).encode() + b"}", 400,
     "at most 16 strings"),
    ("/v1/completions", b'{"prompt": "x", "logprobs": 5}', 400, "logprobs is not supported"),
    ("/v1/completions", b'{"prompt": "x", "echo": true}', 400, "echo is not supported"),
    ("/v1/completions", b'{"prompt": "x", "best_of": 2}', 400, "best_of is not supported"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}', 400,
     "top_logprobs is not supported"),
    ("/v1/completions", b'{"prompt": "x", "steps": 4}', 400, "steps is not an option of an autoregressive model"),
    ("/v1/completions", b'{"prompt": "x", "stream": true, "stream_options": {"include_usage": "yes"}}', 400,
     "include_usage must be true or false"),
    ("/v1/completions", b'{"prompt": "x", "temperature": 1e999}', 400, "1e999 is too large a number"),
    ("/v1/completions", b"[" * 100000 + b"]" * 100000, 400, "nested too deeply"),
    ("/v1/completions", b'{"prompt": "x", "presence_penalty": 1.5}', 400, "presence_penalty is not supported"),
    ("/v1/completions", b'{"prompt": "x", "logit_bias": {"5": 10}}', 400, "logit_bias is not supported"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}',
     400, "tools is not supported"),
])
def test_bad_requests_get_openai_errors_and_the_server_goes_on(client, path, body, status, words):
    c, _ = client
    r = c.post(path, content=body, headers={"Authorization": "Bearer k"})
    assert r.status_code == status and words in r.json()["error"]["message"]
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert c.post("/v1/completions", **auth(prompt="Hi", max_tokens=2)).status_code == 200


def test_openai_fields_kept_at_their_defaults_a_prompt_list_of_one_and_the_developer_role(client):
    c, model = client
    want = model.generate("Once upon", 6, temperature=0)
    r = c.post("/v1/completions", **auth(prompt=["Once upon"], max_tokens=6, temperature=0, logprobs=None,
                                         echo=False, best_of=1, suffix=None, presence_penalty=0,
                                         frequency_penalty=0.0, logit_bias={}, steps=None,
                                         stream_options=None))
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == want
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    developer = [{**system[0], "role": "developer"}, system[1]]
    answers = [c.post("/v1/chat/completions", **auth(messages=m, max_tokens=6, temperature=0)).json()
               for m in (system, developer)]
    assert answers[0]["choices"] == answers[1]["choices"]


def test_paths_methods_sizes_and_a_missing_template_are_openai_errors_too(client):
    c, _ = client
    key = {"Authorization": "Bearer k"}
    for method, path, status in [("GET", "/v1/completions", 405), ("PUT", "/v1/chat/completions", 405),
                                 ("POST", "/health", 405), ("GET", "/v1/embeddings", 404),
                                 ("GET", "/v1/models/gpt-4", 404)]:
        r = c.request(method, path, headers=key)
        assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert (status == 405) == ("allow" in r.headers)
    assert c.get("/v1/models/chat", headers=key).json()["id"] == "chat"
    r = c.post("/v1/completions", content=b'{"prompt": "' + b"x" * (2 << 20) + b'"}', headers=key)
    assert r.status_code == 413 and "over" in r.json()["error"]["message"]
    assert c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                  headers={"Authorization": "bearer k"}).status_code == 200     # the scheme in any case
    no_template = TestClient(make_app(tinydiff.load(os.path.join(HF, "llama-gqa")), "plain"))
    r = no_template.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 400 and r.json()["error"]["message"] == ("the model 'plain' has no chat template: use "
                                                                     "/v1/completions")    # not the folder


def test_a_penalty_past_floats_range_still_samples(client):
    """repeat_penalty 1e-320 made the penalized logits inf and the sampler fail (a 500, and the end
    of every request in the same decode pass): they stop at float32's largest number instead."""
    c, _ = client
    for penalty in (1e-320, 1e-40, 1e300):
        r = c.post("/v1/completions", **auth(prompt="Once upon a time", max_tokens=8, temperature=0.7, seed=3,
                                             repeat_penalty=penalty, repeat_last_n=4))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def test_content_parts_stop_strings_and_usage(client):
    from tinydiff.decoding.generate import TextStream
    c, model = client
    parts = [{"role": "user", "content": [{"type": "text", "text": "H"}, {"type": "text", "text": "i"}]}]
    r = c.post("/v1/chat/completions", **auth(messages=parts, max_tokens=6, temperature=0))
    assert r.json()["choices"][0]["message"]["content"] == model.chat([{"role": "user", "content": "Hi"}], 6,
                                                                       temperature=0)
    new = model.generate_ids(model.encode_prompt("Once upon"), 12, temperature=0)
    full = model.generate("Once upon", 12, temperature=0)
    stop = full[3:5]
    text = TextStream(model.tokenizer, model.stop_ids, [stop])
    taken = next(i + 1 for i, t in enumerate(new) if (text.push(t), text.done)[1])   # tokens up to the stop
    r = c.post("/v1/completions", **auth(prompt="Once upon", max_tokens=12, temperature=0, stop=stop))
    assert r.json()["choices"][0]["text"] == full[:full.index(stop)]
    assert r.json()["choices"][0]["finish_reason"] == "stop" and r.json()["usage"]["completion_tokens"] == taken


def test_an_engine_failure_is_a_500_not_an_ending(chat_model, monkeypatch):
    model = tinydiff.load(chat_model)
    c = TestClient(make_app(model, "chat"))

    def broken(*args, **kwargs):
        raise MemoryError("no memory for the test")
    monkeypatch.setattr(model.transformer, "forward", broken)
    r = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4})
    assert r.status_code == 500 and "MemoryError: no memory for the test" in r.json()["error"]["message"]
    r = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4, "stream": True})
    last = [line for line in r.text.split("\n\n") if line][-1]
    assert "[DONE]" not in r.text and "the engine failed: MemoryError" in json.loads(last[6:])["error"]["message"]
    monkeypatch.undo()
    assert c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4}).status_code == 200   # it goes on


def test_the_api_key_is_required(client):
    c, _ = client
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = c.post("/v1/completions", json={"prompt": "Hi"}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert c.get("/v1/models", headers={"Authorization": "Bearer k"}).json()["data"][0]["id"] == "chat"
    assert c.get("/health").json()["status"] == "ok"


def test_a_diffusion_model_is_served_with_its_options(tmp_path):
    from test_diffusion_models import write_llada
    folder = tmp_path / "llada"
    write_llada(os.path.join(HF, "llama-gqa"), str(folder), mask_token_id=2)
    json.dump({"chat_template": CHATML}, open(folder / "tokenizer_config.json", "w"))
    model = tinydiff.load(str(folder))
    c = TestClient(make_app(model, "llada"))
    want = model.chat([{"role": "user", "content": "Hi"}], 8, steps=4)
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "steps": 4})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == want
    r = c.post("/v1/completions", json={"prompt": "Once", "max_tokens": 8, "steps": 9})
    assert r.status_code == 400 and "steps=9 is more than" in r.json()["error"]["message"]
    opts = dict(threshold=0.5, gap=2, repeat_penalty=3.0, repeat_last_n=8)        # the extra fields reach the run
    r = c.post("/v1/completions", json={"prompt": "Once", "max_tokens": 8, **opts})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == model.denoise("Once", 8, **opts)
    r = c.post("/v1/completions", json={"prompt": "Once", "max_tokens": 8, "steps": 4, "stream": True})
    assert "".join(ch["choices"][0]["text"] for ch in events(r.text)) == model.denoise("Once", 8, steps=4)
    r = c.post("/v1/completions", json={"prompt": "Once", "max_tokens": 8, "steps": 4, "stream": True,
                                        "stream_steps": True})
    steps = [ch["denoising"] for ch in events(r.text) if "denoising" in ch]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert [s["text"].count("\u2591") for s in steps] == [6, 4, 2, 0]       # two positions a step
    assert "".join(ch["choices"][0]["text"] for ch in events(r.text)) == model.denoise("Once", 8, steps=4)
    r = c.post("/v1/completions", json={"prompt": "Once", "max_tokens": 8, "min_p": 0.1})
    assert r.status_code == 400 and "min_p is not an option of a diffusion model" in r.json()["error"]["message"]


def test_a_diffusion_server_past_its_queue_is_busy(tmp_path, monkeypatch):
    """One request denoises and `queue` wait; the next is a 503, and the count falls as they end."""
    from test_diffusion_models import write_llada
    folder = tmp_path / "llada"
    write_llada(os.path.join(HF, "llama-gqa"), str(folder), mask_token_id=2)
    model, go = tinydiff.load(str(folder)), threading.Event()
    denoise_steps = model.denoise_steps

    def held(*args, **kwargs):                  # the run waits for `go` before its first step
        steps = denoise_steps(*args, **kwargs)
        yield from (item for i, item in enumerate(steps) if i or go.wait(30))
    monkeypatch.setattr(model, "denoise_steps", held)
    body = {"prompt": "Once", "max_tokens": 8, "steps": 4}
    with TestClient(make_app(model, "llada", queue=1)) as c, concurrent.futures.ThreadPoolExecutor(2) as pool:
        first, second = pool.submit(c.post, "/v1/completions", json=body), pool.submit(c.post, "/v1/completions",
                                                                                     json=body)
        for _ in range(200):
            if c.get("/health").json()["waiting"] + c.get("/health").json()["running"] == 2:
                break
            time.sleep(0.01)
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 503 and r.json()["error"]["code"] == "busy"
        go.set()
        assert first.result().status_code == second.result().status_code == 200
        assert c.post("/v1/completions", json=body).status_code == 200
        for _ in range(200):                    # the worker's end reaches the counts just after the answer
            if c.get("/health").json() == {"status": "ok", "slots": 1, "running": 0, "waiting": 0}:
                break
            time.sleep(0.01)
        assert c.get("/health").json() == {"status": "ok", "slots": 1, "running": 0, "waiting": 0}


# -- a live server and real clients ------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def live(chat_model):
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "tinydiff", "serve", "-m", chat_model, "--port", str(port),
                          "--slots", "4", "-t", "1"], cwd=os.path.dirname(os.path.abspath(__file__)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if subprocess.run(["curl", "-sf", url + "/health"], capture_output=True, timeout=5).returncode == 0:
                break
        except (FileNotFoundError, subprocess.TimeoutExpired):
            pytest.skip("curl is needed for the live server test")
        time.sleep(0.1)
    else:
        p.kill()
        pytest.fail(f"tinydiff serve did not start: {p.stderr.read().decode()}")
    yield url, tinydiff.load(chat_model)
    p.terminate()
    p.wait(timeout=10)


def test_curl_and_the_openai_client_against_a_live_server(live):
    openai = pytest.importorskip("openai")
    url, model = live
    out = subprocess.run(["curl", "-sf", url + "/v1/completions", "-H", "Content-Type: application/json",
                          "-d", json.dumps({"prompt": "Once upon", "max_tokens": 8, "temperature": 0})],
                         capture_output=True, timeout=30)
    assert json.loads(out.stdout)["choices"][0]["text"] == model.generate("Once upon", 8, temperature=0)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    got = client.completions.create(model="chat", prompt="Once upon", max_tokens=8, temperature=0)
    assert got.choices[0].text == model.generate("Once upon", 8, temperature=0)
    messages = [{"role": "user", "content": "Hi"}]
    want = model.chat(messages, 8, temperature=0)
    got = client.chat.completions.create(model="chat", messages=messages, max_tokens=8, temperature=0)
    assert got.choices[0].message.content == want and got.usage.prompt_tokens == len(model.chat_ids(messages))
    stream = client.chat.completions.create(model="chat", messages=messages, max_tokens=8, temperature=0, stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == want
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")


def test_32_concurrent_streaming_clients_each_get_their_own_answer(live):
    url, model = live
    import httpx
    prompts = [("Once upon a time " * (i % 5 + 1)).strip() for i in range(32)]
    lengths = [4 + i % 13 for i in range(32)]

    def ask(i):
        body = {"prompt": prompts[i], "max_tokens": lengths[i], "temperature": 0.8, "seed": i, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            return "".join(json.loads(line[6:])["choices"][0]["text"] for line in r.iter_lines()
                           if line.startswith("data: {"))

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        got = list(pool.map(ask, range(32)))
    assert got == [model.generate(p, n, temperature=0.8, seed=i) for i, (p, n) in enumerate(zip(prompts, lengths))]


# -- the paged KV cache and its prefix cache -------------------------------------------------------------

def test_pages_are_named_by_their_prefix_shared_and_forgotten_least_recently_used_first():
    from tinydiff.engine.kernels import PAGE
    from tinydiff.engine.transformer import PagedKVCache
    cfg = tinydiff.load(os.path.join(HF, "llama-gqa")).config
    cache = PagedKVCache(cfg, pages=6)
    a = list(range(3 * PAGE + 5))                      # three full pages and a bit
    assert cache.start(0, a) == 0 and cache.grow(0, len(a))
    cache.name_pages(0, a)
    assert cache.start(1, a[:2 * PAGE] + [7] * 10) == 2 * PAGE          # its first two pages are a's
    assert list(cache.tables[1]) == list(cache.tables[0][:2]) and cache.refs[int(cache.tables[0][0])] == 2
    assert cache.start(2, a[:2 * PAGE]) == PAGE                          # never the page of the last id
    cache.end(1)
    cache.end(2)
    held = list(cache.tables[0])
    cache.end(0)
    assert list(cache.idle) == [int(p) for p in held[:3]] and int(held[3]) in cache.free   # named stay, idle
    assert cache.grow(3, 6 * PAGE)                     # takes every page: the idle named ones are forgotten
    assert not cache.named and not cache.idle and not cache.free
    assert not cache.grow(4, PAGE)                     # nothing left
    assert cache.start(5, a) == 0                      # forgotten


def test_a_shared_system_prompt_is_prefilled_once():
    model = tinydiff.load("stories5m-ar")
    system = model.encode_prompt("Once upon a time, " + "there was a little girl named Lily who loved flowers. " * 50)[:500]
    scheduler = Scheduler(model, slots=2, ledger=True)
    first = scheduler.submit(system + model.tokenizer.encode("She", add_special_tokens=False), 4, greedy())
    list(first)
    second_ids = system + model.tokenizer.encode("The dog", add_special_tokens=False)
    second = scheduler.submit(second_ids, 4, greedy())
    assert list(second) == model.generate_ids(second_ids, 4, temperature=0)
    reused = len(system) // 64 * 64
    assert first.reused == 0 and second.reused == reused
    assert second.prefilled == len(second_ids) - reused
    prefills = [p["tokens"] for p in scheduler.ledger.passes if p["tokens"] > 1]
    assert prefills == [len(first.ids), len(second_ids) - reused]


def test_a_client_that_disconnects_frees_its_slot(live):
    import httpx
    url, _ = live
    before = httpx.get(url + "/health").json()["tokens_generated"]
    body = {"prompt": "Once upon a time", "max_tokens": 240, "temperature": 0.8, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        assert next(line for line in r.iter_lines() if line.startswith("data: {"))
    for _ in range(100):                     # gone: the slot is free at the next step
        if httpx.get(url + "/health").json()["running"] == 0:
            break
        time.sleep(0.05)
    health = httpx.get(url + "/health").json()
    assert health["running"] == 0 and health["waiting"] == 0
    assert health["tokens_generated"] - before < 240          # stopped early, not run to its end


def test_a_burst_of_streamed_diffusion_requests_is_answered_in_turn():
    import httpx
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "tinydiff", "serve", "-m", "stories5m-mdm", "--port", str(port),
                          "-t", "1"], cwd=os.path.dirname(os.path.abspath(__file__)),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        model = tinydiff.load("stories5m-mdm")
        prompts = [f"Once upon a time {i}" for i in range(12)]

        def ask(prompt):
            body = {"prompt": prompt, "max_tokens": 16, "steps": 8, "stream": True, "stream_steps": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
            return sum("denoising" in ch for ch in chunks), "".join(ch["choices"][0]["text"] for ch in chunks)

        with concurrent.futures.ThreadPoolExecutor(12) as pool:       # more than the default executor's threads
            got = list(pool.map(ask, prompts))
        assert got == [(8, model.denoise(p, 16, steps=8)) for p in prompts]
    finally:
        p.terminate()
        p.wait(timeout=10)


def test_a_reader_that_is_gone_stops_its_request_not_the_engine():
    model = tinydiff.load(os.path.join(HF, "llama-gqa"))
    scheduler = Scheduler(model, slots=1)

    def closed_loop(token):
        raise RuntimeError("Event loop is closed")
    gone = scheduler.submit([5, 6], 50, greedy(), on_token=closed_loop)
    list(gone)
    assert gone.finish_reason == "cancelled" and len(gone.new) < 50
    assert list(scheduler.submit([7, 8], 4, greedy())) == model.generate_ids([7, 8], 4, temperature=0)
