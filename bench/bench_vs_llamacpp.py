"""tinydiff against llama.cpp's llama-bench on the same GGUF files, threads and tests, in one run.

    python bench/bench_vs_llamacpp.py --llama-bench /tmp/llama.cpp/build/bin/llama-bench \
        FILE.gguf [FILE.gguf ...] [-t 2] [-p 512] [-n 128] [-r 3] [--rounds 2]

Per file and round it runs `llama-bench -m FILE -t T -p P -n N -r R -o json` and then
`tinydiff bench -m FILE -t T -p P -n N -r R`, alternating, so both see the same machine; it prints
each engine's tokens/s per test and the ratio tinydiff / llama.cpp (the issue's targets: >= 1 for
decode tg and prefill pp). The machine is shared and noisy: read the ratios of one run, and the
spread between rounds, never a figure written down elsewhere. Build llama.cpp as DEVELOPERS.md says
(in /tmp, never committed).
"""
import argparse
import json
import re
import subprocess
import sys


def llama_cpp(binary, path, a):
    out = subprocess.run([binary, "-m", path, "-t", str(a.threads), "-p", str(a.p), "-n", str(a.n),
                          "-r", str(a.r), "-o", "json"], capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    return {("pp" if r["n_prompt"] else "tg") + str(r["n_prompt"] or r["n_gen"]): r["avg_ts"] for r in rows}


def tinydiff(path, a):
    out = subprocess.run([sys.executable, "-m", "tinydiff", "bench", "-m", path, "-t", str(a.threads),
                          "-p", str(a.p), "-n", str(a.n), "-r", str(a.r), "--no-roofline"],
                         capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():   # llama-bench's table: | ... | test | t/s ± sd |
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for i, c in enumerate(cells[:-1]):
            if re.fullmatch(r"(pp|tg)\d+", c):
                found[c] = float(cells[i + 1].split()[0])
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    print("| file | test | round | llama.cpp t/s | tinydiff t/s | tinydiff / llama.cpp |")
    print("|---|---|---|---|---|---|")
    for path in a.files:
        for rnd in range(1, a.rounds + 1):
            theirs, ours = llama_cpp(a.llama_bench, path, a), tinydiff(path, a)
            for test in sorted(theirs):
                if test in ours:
                    print(f"| {path.rsplit('/', 1)[-1]} | {test} | {rnd} | {theirs[test]:.1f} | {ours[test]:.1f} "
                          f"| {ours[test] / theirs[test]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
