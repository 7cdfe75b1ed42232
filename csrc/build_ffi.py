"""cffi build of the C kernels as tinydiff._kernels (out-of-line API mode; calls release the GIL).

setup.py uses `ffi` through cffi_modules, with paths relative to the project root where setup.py
runs; for development build in place with `pip install -e . --no-build-isolation`.
No -march=native: the AVX2 and AVX-512 kernels are compiled per function (target attributes) and
picked at load time from the CPU, so one build runs on any x86-64; the plain C path builds anywhere.
"""
import glob

from cffi import FFI

SOURCES = ["cpu.c", "threads.c", "matmul.c", "quant.c", "gemm_q8.c", "attention.c", "norm.c", "rope.c", "activation.c", "layer.c", "roofline.c"]

with open("csrc/tinydiff.h") as f:  # cffi's cdef takes plain declarations: drop the '#' lines
    CDEF = "".join(line for line in f if not line.lstrip().startswith("#"))

ffi = FFI()
ffi.cdef(CDEF)
ffi.set_source(
    "tinydiff._kernels",
    '#include "tinydiff.h"',
    sources=["csrc/" + s for s in SOURCES],
    depends=glob.glob("csrc/*.h"),
    include_dirs=["csrc"],
    extra_compile_args=["-O3", "-pthread", "-ffp-contract=fast", "-Wno-psabi"],
    extra_link_args=["-pthread"],
    libraries=["m"],
)
