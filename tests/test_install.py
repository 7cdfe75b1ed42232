"""Building the package: a missing compiler is one line.

These run the build itself (setup.py through pip, csrc/build_ffi.py) in subprocesses on a copy of
the project, as `pip install .` builds (in an isolated environment from the package index).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# what a build reads; tests/ and bench/ are not part of the package
PROJECT = ["setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "csrc", "tinydiff", "weights"]

pytestmark = pytest.mark.skipif(not (ROOT / "setup.py").exists(), reason="needs the source tree")


def copy_project(to):
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "_kernels.c")
    to.mkdir()
    for name in PROJECT:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, to / name, ignore=ignore)
        else:
            shutil.copy2(src, to / name)
    return to


def pip_wheel(src, out, **env):
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(src)],
                          capture_output=True, text=True, env={**os.environ, **env})


def test_no_compiler_is_one_line():
    run = subprocess.run([sys.executable, "csrc/build_ffi.py"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "CC": "/nonexistent/cc"})
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1, run.stderr
    for words in ["needs a C compiler", "/nonexistent/cc", "apt install build-essential python3-dev",
                  "dnf install gcc python3-devel", "xcode-select --install"]:
        assert words in run.stderr


def test_compiler_on_path_passes_the_check():
    run = subprocess.run([sys.executable, "csrc/build_ffi.py"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_pip_without_compiler_says_so(tmp_path):
    run = pip_wheel(copy_project(tmp_path / "src"), tmp_path / "dist", CC="/nonexistent/cc")
    assert run.returncode != 0
    assert "tinydiff needs a C compiler" in run.stdout + run.stderr
    assert "No such file or directory" not in run.stdout + run.stderr

