/* foreach_isa.h: compile the kernels in TD_ISA_FILE once per instruction set.

   The file is written against VEC (a vector of VL floats, one register), TARGET (the function
   attribute enabling the instruction set) and ISA(name) (name with the set's suffix). Plain C uses
   vf4: SSE2 on any x86-64, NEON on arm64, scalar code elsewhere. On x86-64 the same code is also
   compiled with vf8 under AVX2+FMA and vf16 under AVX-512; cpu.c says which one runs. What only
   one instruction set can do (an F16C load, maddubs), the file writes as a small primitive under
   #if VL == 4 / 8 / 16, and the kernels around it once (quant_isa.h). */
#define VEC vf4
#define VL 4
#define TARGET
#define ISA(name) name##_c
#include TD_ISA_FILE
#undef VEC
#undef VL
#undef TARGET
#undef ISA

#if defined(__x86_64__)
#define VEC vf8
#define VL 8
#define TARGET TD_AVX2
#define ISA(name) name##_avx2
#include TD_ISA_FILE
#undef VEC
#undef VL
#undef TARGET
#undef ISA

#define VEC vf16
#define VL 16
#define TARGET TD_AVX512
#define ISA(name) name##_avx512
#include TD_ISA_FILE
#undef VEC
#undef VL
#undef TARGET
#undef ISA
#endif
