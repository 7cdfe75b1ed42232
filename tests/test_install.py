"""Building the package: a missing compiler is one line, and a build leaves nothing behind.

These run the build itself (setup.py through pip, csrc/build_ffi.py) in subprocesses on a copy of
the project, as `pip install .` builds (in an isolated environment from the package index).
"""
import os
import shutil
import subprocess
import sys
import zipfile
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


def test_build_leaves_no_tree_behind_and_no_stale_module(tmp_path):
    """A module deleted from tinydiff/ is not in the next wheel (setuptools' in-tree build/lib kept
    it), and neither build/ nor tinydiff.egg-info nor the temporary build directory remain."""
    src, tmp = copy_project(tmp_path / "src"), tmp_path / "tmp"
    tmp.mkdir()
    probe = src / "tinydiff" / "stale_probe.py"
    probe.write_text("GONE = False\n")
    for build, want_probe in [("first", True), ("second", False)]:
        dist = tmp_path / build
        run = pip_wheel(src, dist, TMPDIR=str(tmp))
        assert run.returncode == 0, run.stdout + run.stderr
        (wheel,) = dist.glob("*.whl")
        names = zipfile.ZipFile(wheel).namelist()
        assert any(n.startswith("tinydiff/_kernels") for n in names)
        assert ("tinydiff/stale_probe.py" in names) == want_probe, build
        assert sorted(p.name for p in src.iterdir()) == sorted(PROJECT)
        assert not list(tmp.glob("tinydiff-build-*"))
        probe.unlink(missing_ok=True)
