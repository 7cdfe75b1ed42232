/* foreach_isa.h: compile the kernels in TD_ISA_FILE once per instruction set.

   The file is written against VEC (a vector of VL floats, one register), TARGET (the function
   attribute enabling the instruction set), ISA(name) (name with the set's suffix), REGS (the
   vector registers there are, for the register tiles' sizes) and PLAIN (1 in plain C, the
   reference: ggml's order of sums, integer dot products term by term). Plain C uses vf4: SSE2 on
   any x86-64, NEON or SSE-width vectors elsewhere, with 16 registers' tiles. On x86-64 the same
   code is also compiled with vf8 under AVX2+FMA and vf16 under AVX-512; on arm64 with vf4 as NEON
   (32 registers, NEON's own int8 and f16 primitives); cpu.c says which one runs. What only one
   instruction set can do (an F16C load, maddubs, vmull_s8), the file writes as a small primitive
   under #if PLAIN / NEON / VL == 8 / 16, and the kernels around it once (quant_isa.h). */
#define VEC vf4
#define VL 4
#define REGS 16
#define PLAIN 1
#define NEON 0
#define TARGET
#define ISA(name) name##_c
#include "isa_instance.h"

#if defined(__aarch64__)
#define VEC vf4
#define VL 4
#define REGS 32
#define PLAIN 0
#define NEON 1
#define TARGET
#define ISA(name) name##_neon
#include "isa_instance.h"
#endif

#if defined(__x86_64__)
#define VEC vf8
#define VL 8
#define REGS 16
#define PLAIN 0
#define NEON 0
#define TARGET TD_AVX2
#define ISA(name) name##_avx2
#include "isa_instance.h"

#define VEC vf16
#define VL 16
#define REGS 32
#define PLAIN 0
#define NEON 0
#define TARGET TD_AVX512
#define ISA(name) name##_avx512
#include "isa_instance.h"
#endif
