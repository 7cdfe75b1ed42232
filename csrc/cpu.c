/* cpu.c: which SIMD path the kernels take. Detected once when the library loads. */
#include "internal.h"
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

int td_simd = TD_SIMD_C;
int td_simd_ext = 0;
int td_amd = 0;
static int td_simd_max = TD_SIMD_C; /* best level this CPU (and OS) supports */

__attribute__((constructor)) static void td_detect_simd(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    td_amd = __builtin_cpu_is("amd");
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        td_simd_max = TD_SIMD_AVX2;
    if (td_simd_max == TD_SIMD_AVX2 && __builtin_cpu_supports("avx512f"))
        td_simd_max = TD_SIMD_AVX512;
    int bw_vl = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    if (td_simd_max == TD_SIMD_AVX512 && bw_vl && __builtin_cpu_supports("avx512vnni"))
        td_simd_ext |= TD_EXT_VNNI;
#elif defined(__aarch64__)
    td_simd_max = TD_SIMD_NEON; /* every arm64 CPU has it */
#if defined(__linux__) && defined(HWCAP_ASIMDDP)
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP)
        td_simd_ext |= TD_EXT_DOTPROD;
#elif defined(__APPLE__)
    int dotprod = 0;
    size_t len = sizeof dotprod;
    if (!sysctlbyname("hw.optional.arm.FEAT_DotProd", &dotprod, &len, NULL, 0) && dotprod)
        td_simd_ext |= TD_EXT_DOTPROD;
#endif
#endif
    td_simd = td_simd_max;
}

int td_get_simd(void) { return td_simd; }

int td_get_simd_ext(void) { return td_simd_ext; }

int td_set_simd(int level)
{
    td_simd = level < TD_SIMD_C ? TD_SIMD_C : level > td_simd_max ? td_simd_max : level;
    return td_simd;
}
