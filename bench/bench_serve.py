"""Load test of `tinydiff serve`: N concurrent streaming clients, their tokens/s with S slots against 1.

    python bench/bench_serve.py [-m stories5m-ar | --shape SmolLM2-135M] [--clients 32] [--slots 1,4,8,16] [-t 2]

For each slot count it starts a server (a subprocess, as users run it), sends every client's
request at once (mixed prompt lengths and max_tokens, temperature 0.8, a seed each, streaming),
checks that every answer equals the same request run alone through the Python API, counts errors,
and prints the completion tokens per second of the whole load. With one slot the requests queue
and run one after another (B = 1); with S slots up to S share each decode pass. --shape serves a
random-weight model of a real shape (measure/shapes.py, f32, the shipped tokenizer), written to a
temporary folder, where the weights, not Python, are the cost. Compare rows of one run: the
machine is shared and noisy.
"""
import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx

import tinydiff


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model, slots, threads):
    port = free_port()
    # run from the temporary folder: `-m tinydiff` from the repository's root would import the
    # source tree (no built kernels) rather than the installed package
    p = subprocess.Popen([sys.executable, "-m", "tinydiff", "serve", "-m", model, "--port", str(port),
                          "--slots", str(slots), "-t", str(threads)], stderr=subprocess.DEVNULL,
                         cwd=tempfile.gettempdir())
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return p, url
        except httpx.HTTPError:
            time.sleep(0.1)
    p.kill()
    sys.exit(f"the server with {slots} slots did not start")


def requests(n):
    words = "Once upon a time there was a little girl named Lily who loved to play".split()
    return [{"prompt": " ".join(words[:2 + i % 11]), "max_tokens": 16 + (i * 7) % 49, "temperature": 0.8,
             "seed": i, "stream": True} for i in range(n)]


def ask(url, body):
    """(text, completion tokens, error) of one streaming request."""
    text, usage = "", None
    try:
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream_options": {"include_usage": True}},
                          timeout=600) as r:
            if r.status_code != 200:
                return "", 0, f"HTTP {r.status_code}"
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    text += "".join(c["text"] for c in chunk["choices"])
                    usage = chunk.get("usage") or usage
    except httpx.HTTPError as e:
        return "", 0, str(e)
    return text, usage["completion_tokens"] if usage else 0, None


def shape_folder(name, folder):
    """A model folder of a real shape with random weights and the shipped AR model's tokenizer."""
    import shutil

    from tinydiff.engine.weights import HF_NAMES, random_weights
    from tinydiff.formats.safetensors import save_safetensors
    from tinydiff.measure.shapes import SHAPES, shape_config
    cfg = shape_config(name)
    w = random_weights(cfg)
    tensors = {HF_NAMES["embed_tokens"]: w.embed_tokens, HF_NAMES["norm"]: w.norm}
    for i, lw in enumerate(w.layers):
        for field, a in vars(lw).items():
            if a is not None:
                tensors[HF_NAMES["layer"].format(i=i) + HF_NAMES[field]] = a
    os.makedirs(folder, exist_ok=True)
    save_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    json.dump({**SHAPES[name], "architectures": ["LlamaForCausalLM"], "eos_token_id": 0},
              open(os.path.join(folder, "config.json"), "w"))
    shutil.copy(os.path.join(os.path.dirname(tinydiff.load("stories5m-ar").path), "stories5m-ar", "tokenizer.json"),
                folder)
    return folder


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default="stories5m-ar")
    p.add_argument("--shape", default=None, help="serve a random-weight model of this shape instead (SmolLM2-135M, ...)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--slots", default="1,4,8,16")
    p.add_argument("-t", "--threads", type=int, default=2)
    a = p.parse_args()
    if a.shape:
        a.model = shape_folder(a.shape, os.path.join(tempfile.mkdtemp(prefix="tinydiff-serve-"), a.shape))
    model = tinydiff.load(a.model, threads=a.threads)
    bodies = requests(a.clients)
    alone = [model.generate(b["prompt"], b["max_tokens"], temperature=0.8, seed=b["seed"]) for b in bodies]
    path = model.path if os.path.isdir(model.path) else a.model
    rates = {}
    for slots in [int(s) for s in a.slots.split(",")]:
        server, url = start(path, slots, a.threads)
        try:
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(a.clients) as pool:
                out = list(pool.map(lambda b: ask(url, b), bodies))
            seconds = time.perf_counter() - t0
        finally:
            server.terminate()
            server.wait()
        errors = sum(e is not None for _, _, e in out)
        wrong = sum(text != want for (text, _, e), want in zip(out, alone) if e is None)
        tokens = sum(n for _, n, _ in out)
        rates[slots] = tokens / seconds
        print(f"slots {slots:3d}: {a.clients} clients, {tokens} tokens in {seconds:6.2f} s = {rates[slots]:7.1f} t/s"
              f" ({rates[slots] / rates[min(rates)]:.2f}x {min(rates)} slot{'s' * (min(rates) > 1)}); "
              f"{errors} errors, {wrong} answers differing from the request run alone", flush=True)


if __name__ == "__main__":
    main()
