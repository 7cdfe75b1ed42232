"""Soak test of `tinydiff serve`: many clients for minutes, against an AR and a diffusion server.

    python bench/soak_serve.py [--ar stories5m-ar] [--diffusion stories5m-mdm] [--clients 32]
                               [--minutes 10] [--slots 4] [-t 2]

Each server (a subprocess, as users run it) first answers every request of a fixed set alone, one
after another: those answers are the reference. Then `--clients` threads send requests from the set
for `--minutes`, all at once, half to each server: temperature 0 and seeded sampling, streaming and
not, and one request in eight a client that reads two chunks of a stream and hangs up. At the end,
for each server: requests completed, hung up, failed (an HTTP error or a dropped connection), answers
that differ from the reference (the same request, alone), slots still running or waiting once every
client has stopped (a leak), and the server's resident memory at the start, the peak and the end.

A mismatch at temperature 0 is a batch-variance bug: the same request computed differently beside
others (issue 40). Timings are not the point here; bench_serve.py measures throughput.
"""
import argparse
import concurrent.futures
import json
import os
import random
import sys
import threading
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve import start  # noqa: E402

WORDS = "Once upon a time there was a little girl named Lily who loved to play in the park with her dog".split()


def bodies(n, causal):
    """n requests: prompts of 2-13 words, greedy and seeded, streaming and not."""
    out = []
    for i in range(n):
        body = {"prompt": " ".join(WORDS[i % 5:i % 5 + 2 + i % 12]), "max_tokens": 16 + (i * 7) % 33,
                "temperature": 0.0 if i % 2 == 0 else 0.8, "seed": i, "stream": i % 3 != 0}
        if not causal:      # a diffusion model fills a canvas of max_tokens in a few steps
            body.update(temperature=0.0 if i % 2 == 0 else 0.5, max_tokens=16 + 16 * (i % 3))
        out.append(body)
    return out


def ask(url, body, hang_up=False):
    """('ok', text) or ('hung up', '') or ('error', why) for one request."""
    try:
        if not body["stream"]:
            r = httpx.post(url + "/v1/completions", json=body, timeout=600)
            if r.status_code != 200:
                return "error", f"HTTP {r.status_code}"
            return "ok", r.json()["choices"][0]["text"]
        text = ""
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
            if r.status_code != 200:
                return "error", f"HTTP {r.status_code}"
            for n, line in enumerate(r.iter_lines()):
                if hang_up and n >= 2:
                    return "hung up", ""
                if line.startswith("data: {"):
                    text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
        return "ok", text
    except httpx.HTTPError as e:
        return "error", type(e).__name__


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


class Server:
    def __init__(self, name, model, slots, threads, n_bodies):
        self.name, (self.proc, self.url) = name, start(model, slots, threads)
        self.bodies = bodies(n_bodies, "tokens_generated" in httpx.get(self.url + "/health").json())
        self.reference = [ask(self.url, b) for b in self.bodies]          # each alone
        self.rss = [rss_mib(self.proc.pid)]
        self.counts = dict.fromkeys(("ok", "hung up", "error", "mismatch", "mismatch at temperature 0"), 0)
        self.lock = threading.Lock()

    def client(self, seed, deadline):
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            i = rng.randrange(len(self.bodies))
            hang_up = self.bodies[i]["stream"] and rng.random() < 1 / 8
            kind, text = ask(self.url, self.bodies[i], hang_up)
            with self.lock:
                self.counts[kind] += 1
                if kind == "ok" and (kind, text) != self.reference[i]:
                    self.counts["mismatch"] += 1
                    self.counts["mismatch at temperature 0"] += self.bodies[i]["temperature"] == 0

    def report(self):
        time.sleep(2)                                # hung-up requests end at their next pass
        health = httpx.get(self.url + "/health").json()
        leaked = health.get("running", 0) + health.get("waiting", 0)
        c = self.counts
        print(f"{self.name}: {c['ok']} completed, {c['hung up']} hung up, {c['error']} failed; "
              f"{c['mismatch']} answers differ from the request alone ({c['mismatch at temperature 0']} at "
              f"temperature 0); {leaked} slots leaked; RSS {self.rss[0]:.0f} MiB at the start, "
              f"{max(self.rss):.0f} at the peak, {self.rss[-1]:.0f} at the end", flush=True)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ar", default="stories5m-ar")
    p.add_argument("--diffusion", default="stories5m-mdm")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--bodies", type=int, default=24, help="distinct requests in the set")
    p.add_argument("-t", "--threads", type=int, default=2)
    a = p.parse_args()
    servers = [Server(name, model, a.slots, a.threads, a.bodies) for name, model in
               (("AR " + a.ar, a.ar), ("diffusion " + a.diffusion, a.diffusion))]
    try:
        deadline = time.monotonic() + 60 * a.minutes
        with concurrent.futures.ThreadPoolExecutor(a.clients) as pool:
            jobs = [pool.submit(servers[i % 2].client, i, deadline) for i in range(a.clients)]
            while not all(j.done() for j in jobs):
                time.sleep(5)
                for s in servers:
                    s.rss.append(rss_mib(s.proc.pid))
            for j in jobs:
                j.result()
        for s in servers:
            s.rss.append(rss_mib(s.proc.pid))
            s.report()
    finally:
        for s in servers:
            s.stop()


if __name__ == "__main__":
    main()
