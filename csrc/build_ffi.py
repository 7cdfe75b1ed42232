"""cffi build of the C kernels as tinydiff._kernels (out-of-line API mode; calls release the GIL).

setup.py uses `ffi` through cffi_modules, with paths relative to the project root where setup.py
runs; for development build in place with `pip install -e . --no-build-isolation`.
No -march=native: the AVX2 and AVX-512 kernels are compiled per function (target attributes) and
picked at load time from the CPU, so one build runs on any x86-64; the plain C path builds anywhere.

TINYDIFF_SANITIZE=1 builds with AddressSanitizer and UndefinedBehaviorSanitizer (.ci/run's second
step); such a build runs only under a Python with libasan preloaded.
"""
import glob
import os
import shlex
import shutil
import sys
import sysconfig

from cffi import FFI

INSTALL_HINT = ("install one: Debian/Ubuntu `apt install build-essential python3-dev`, "
                "Fedora `dnf install gcc python3-devel`, macOS `xcode-select --install`")


def missing_toolchain():
    """What the build lacks, as one line, or None. Checked before cffi and setuptools start, whose
    own failure is ~60 lines of traceback ending in `No such file or directory: cc`."""
    if os.name == "nt":
        return "tinydiff does not build on Windows (the kernels need pthreads and GCC or Clang); use WSL"
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    compiler = shlex.split(cc)[0]
    if not shutil.which(compiler):
        return f"tinydiff needs a C compiler and found none (looked for {compiler!r}, from CC or Python's build settings); {INSTALL_HINT}"
    headers = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(headers, "Python.h")):
        return f"tinydiff needs the Python headers and found no Python.h in {headers}; {INSTALL_HINT}"
    return None


problem = missing_toolchain()
if problem:
    sys.exit(problem)

SOURCES = ["cpu.c", "threads.c", "matmul.c", "quant.c", "quant_ref.c", "quant_x86.c", "quant_x86_k.c", "quant_arm.c", "gemm_q8.c", "attention.c", "norm.c", "sampling.c", "rope.c", "activation.c", "layer.c", "roofline.c"]

with open("csrc/tinydiff.h") as f:  # cffi's cdef takes plain declarations: drop the '#' lines
    CDEF = "".join(line for line in f if not line.lstrip().startswith("#"))

# -O1 after -O3 wins: ASan's reports name the right lines; UB halts instead of printing and going on
SANITIZE = (["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer",
             "-g", "-O1"] if os.environ.get("TINYDIFF_SANITIZE") == "1" else [])

ffi = FFI()
ffi.cdef(CDEF)
ffi.set_source(
    "tinydiff._kernels",
    '#include "tinydiff.h"',
    sources=["csrc/" + s for s in SOURCES],
    depends=glob.glob("csrc/*.h"),
    include_dirs=["csrc"],
    extra_compile_args=["-O3", "-pthread", "-ffp-contract=fast", "-Wno-psabi"] + SANITIZE,
    extra_link_args=["-pthread"] + SANITIZE,
    libraries=["m"],
)
