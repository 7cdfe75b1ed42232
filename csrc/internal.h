/* internal.h: what the kernel files share and Python does not see: the thread pool's parallel-for,
   the SIMD level, the out-of-memory rule, and portable vector types (and x86's intrinsics).

   cpu.c picks the SIMD variant at load time, so one build runs on any x86-64. */
#ifndef TD_INTERNAL_H
#define TD_INTERNAL_H
#include <stdint.h>
#include <string.h>
#include "tinydiff.h"
#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#define TD_INLINE static inline __attribute__((always_inline))
#if defined(__x86_64__)
#define TD_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TD_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
/* the AVX-512 kernels that need an extension (td_simd_ext says whether the CPU has it) */
#define TD_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#endif

enum { TD_SIMD_C = 0, TD_SIMD_AVX2 = 1, TD_SIMD_AVX512 = 2 }; /* x86-64 */
enum { TD_SIMD_NEON = 1 };                                     /* arm64 */
extern int td_simd;     /* level in use, set by cpu.c */
extern int td_simd_ext; /* TD_EXT_* bits: what the CPU has beyond AVX512F, or NEON */
extern int td_batch_invariant; /* matmul.c: a row's result never depends on the rows beside it */
extern int td_amd;      /* an AMD x86 core: its prefetchers want fewer, longer streams (matmul_isa.h) */

/* The pool functions below act on the calling thread's current pool (td_pool_use in tinydiff.h).
   td_parallel_for: run fn(ctx, begin, end) over [0, ntasks) split in contiguous ranges, one per thread. cost is the
   rough number of float operations per task; small jobs run on the calling thread alone, since
   waking a worker costs more than it saves. Returns when every range is done. */
typedef void (*td_range_fn)(void *ctx, int64_t begin, int64_t end);
void td_parallel_for(td_range_fn fn, void *ctx, int64_t ntasks, double cost);

/* Several jobs' tasks laid end to end, as one job (the matmuls of one x, td_matmuls): job j's
   tasks are [first[j], first[j+1]); tasks [b, e) run as fn on each job's part, jobs[j] being
   item_size bytes after jobs[j-1]. */
TD_INLINE void td_run_end_to_end(td_range_fn fn, void *jobs, size_t item_size, const int64_t *first, int64_t nw,
                                 int64_t b, int64_t e)
{
    for (int64_t j = 0; j < nw && b < e; j++)
        if (b < first[j + 1]) {
            int64_t end = e < first[j + 1] ? e : first[j + 1];
            fn((char *)jobs + j * item_size, b - first[j], end - first[j]);
            b = end;
        }
}
#define TD_MATMULS_MAX 4 /* weights in one job of td_matmuls; it does more in groups */

/* one query of one sequence (a decode step) in td_attention_rows: td_attention_paged_f32's
   arguments of its own (pages NULL: k and v are the sequence's rows [t, kv_heads, hd]) */
struct td_attn_seq {
    const float *q, *k, *v; /* [heads, hd], [t or pool rows, kv_heads, hd] x2 */
    const int64_t *pages;
    float *out;             /* [heads, hd] */
    int64_t t, q_pos0;
};
/* the attention of nseq such sequences, one query each, as one job on the pool (their (query, head)
   rows end to end): each out as td_attention_paged_f32 (or td_attention_f32) would give it, bit for
   bit. Returns 0, or -1 (outs partly written) if memory could not be had. */
int td_attention_rows(const struct td_attn_seq *seqs, int64_t nseq, int64_t heads, int64_t kv_heads, int64_t hd,
                      int64_t block, int64_t window, float scale);

/* A kernel that runs several jobs in a row or keeps scratch memory between them holds the pool:
   td_pool_enter(), then any number of td_parallel_run (td_parallel_for without the locking) and
   td_scratch calls, then td_pool_leave(). td_scratch(bytes) is the pool's one grow-only buffer, 64-byte
   aligned, valid until the pool is left; NULL if the memory cannot be had. */
void td_pool_enter(void);
void td_pool_leave(void);
void td_parallel_run(td_range_fn fn, void *ctx, int64_t ntasks, double cost);
void *td_scratch(int64_t bytes);

/* Out of memory, the one rule for every kernel: a kernel that allocates (malloc, or td_scratch,
   which gives NULL when the memory cannot be had) returns int, 0 done or -1 no memory, and never
   aborts or prints: the library's caller decides. Its declaration in tinydiff.h says what its
   outputs hold after -1 (untouched, or each output either done or untouched). Where the scratch
   a kernel needs has a bound, it lives on the stack and the kernel cannot fail (rope.c); only
   sizes without one (an x row converted per call, a temporary of n x m) are allocated. The Python
   wrapper turns -1 into MemoryError with a one-line message naming the kernel. */

/* GCC/clang vector extensions: one type per register width. Each hot kernel is written once in a
   *_isa.h file against VEC (VL floats) and compiled once per instruction set by foreach_isa.h. */
typedef float vf4 __attribute__((vector_size(16)));  /* an SSE or NEON register */
typedef float vf8 __attribute__((vector_size(32)));  /* an AVX2 ymm register */
typedef float vf16 __attribute__((vector_size(64))); /* an AVX-512 zmm register */
typedef int32_t vi4 __attribute__((vector_size(16)));  /* the same widths in int32 (exp's bit tricks) */
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef int32_t vi16 __attribute__((vector_size(64)));
typedef uint32_t vu4 __attribute__((vector_size(16))); /* and uint32 (the bandwidth loop's sums) */
typedef uint32_t vu8 __attribute__((vector_size(32)));
typedef uint32_t vu16 __attribute__((vector_size(64)));
typedef double vd2 __attribute__((vector_size(16))); /* float64 at the same widths (the scoring's softmax) */
typedef double vd4 __attribute__((vector_size(32)));
typedef double vd8 __attribute__((vector_size(64)));
typedef int64_t vl2 __attribute__((vector_size(16))); /* and int64, for float64's bit tricks */
typedef int64_t vl4 __attribute__((vector_size(32)));
typedef int64_t vl8 __attribute__((vector_size(64)));

/* memcpy makes unaligned loads and stores legal; compilers emit one vmovups / ldr */
TD_INLINE vf4 load_vf4(const float *p) { vf4 v; memcpy(&v, p, sizeof v); return v; }
TD_INLINE vf8 load_vf8(const float *p) { vf8 v; memcpy(&v, p, sizeof v); return v; }
TD_INLINE vf16 load_vf16(const float *p) { vf16 v; memcpy(&v, p, sizeof v); return v; }
TD_INLINE void store_vf4(float *p, vf4 v) { memcpy(p, &v, sizeof v); }
TD_INLINE void store_vf8(float *p, vf8 v) { memcpy(p, &v, sizeof v); }
TD_INLINE void store_vf16(float *p, vf16 v) { memcpy(p, &v, sizeof v); }
TD_INLINE vd2 load_vd2(const double *p) { vd2 v; memcpy(&v, p, sizeof v); return v; }
TD_INLINE vd4 load_vd4(const double *p) { vd4 v; memcpy(&v, p, sizeof v); return v; }
TD_INLINE vd8 load_vd8(const double *p) { vd8 v; memcpy(&v, p, sizeof v); return v; }

/* horizontal sums by halving; the halves taken in registers (a store and two half-width reloads
   would stall on store forwarding, ~20 cycles a sum) */
TD_INLINE float sum_vf4(vf4 v) { return (v[0] + v[2]) + (v[1] + v[3]); }
TD_INLINE float sum_vf8(vf8 v)
{
    return sum_vf4(__builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7));
}
TD_INLINE float sum_vf16(vf16 v)
{
    return sum_vf8(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                   __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}

/* in *_isa.h files: the operations on VEC */
#define TD_CAT2(a, b) a##b
#define TD_CAT(a, b) TD_CAT2(a, b)
#define vload TD_CAT(load_, VEC)
#define vstore TD_CAT(store_, VEC)
#define vsum TD_CAT(sum_, VEC)

/* the address of a kernel (or table) from foreach_isa.h for the SIMD level in use */
#if defined(__x86_64__)
#define TD_PICK(name) \
    (td_simd == TD_SIMD_AVX512 ? &name##_avx512 : td_simd == TD_SIMD_AVX2 ? &name##_avx2 : &name##_c)
#elif defined(__aarch64__)
#define TD_PICK(name) (td_simd == TD_SIMD_NEON ? &name##_neon : &name##_c)
#define TD_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#else
#define TD_PICK(name) (&name##_c)
#endif

#endif
