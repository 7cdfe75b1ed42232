/* matmul.c: y[n,m] = x[n,k] @ w[m,k]^T in f32, w in HF layout (out_features x in_features).

   Few x rows (one token while decoding) is memory bound: each weight row is streamed from memory
   once, four at a time, and dotted with every x row while it sits in L1. Threads split the
   weight rows.

   Many x rows is compute bound, done BLIS style: NR weight rows x KC columns are packed
   transposed into wp[KC][NR] (L1-sized), then an MR x NR register tile sweeps down the x rows:
   each packed weight vector loaded is used MR times, each x value broadcast is used NR times.
   Threads split (weight panel, x row chunk) pairs. The kernels are in matmul_isa.h. */
#include "internal.h"

#define KC 256 /* k per packed panel */
#define ROWS_PER_TASK 16
#define GEMM_MIN_ROWS 12 /* below this many x rows, packing weights costs more than it saves */

struct mm {
    const float *x; /* [n,k] */
    const float *w; /* [m,k] */
    float *y;       /* [n,m] */
    int64_t n, k, m;
    int64_t chunk;   /* gemm: x rows per task, a multiple of the tile height */
    int64_t nchunks; /* gemm: tasks per weight panel */
};

struct mm_kernels {
    td_range_fn rows, gemm;
    int mr, nr; /* gemm register tile: MR x rows by NR output columns */
};

#if defined(__x86_64__)
#include <immintrin.h>

/* r[16] (16 rows of 16 floats) transposed in registers: unpack 32-bit, 64-bit, then 128-bit lanes */
TD_AVX512 TD_INLINE void transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++) {
            __m512d a = _mm512_castps_pd(t[4 * i + j]), b = _mm512_castps_pd(t[4 * i + j + 2]);
            r[4 * i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[4 * i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 16; j += 8) {
            t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

/* pack_w of the AVX-512 kernel (NR = 32) by 16x16 blocks: 4x faster than element by element */
TD_AVX512 TD_INLINE void transpose_panel_avx512(const float *w, int64_t k, int64_t cols, int64_t kc, float *wp)
{
    int64_t p = 0;
    for (; p + 16 <= kc; p += 16)
        for (int64_t half = 0; half < 32; half += 16) {
            __m512 r[16];
            for (int64_t c = 0; c < 16; c++)
                r[c] = half + c < cols ? _mm512_loadu_ps(w + (half + c) * k + p) : _mm512_setzero_ps();
            transpose16(r);
            for (int64_t j = 0; j < 16; j++)
                _mm512_storeu_ps(wp + (p + j) * 32 + half, r[j]);
        }
    for (; p < kc; p++)
        for (int64_t c = 0; c < 32; c++)
            wp[p * 32 + c] = c < cols ? w[c * k + p] : 0.0f;
}
#endif

#define TD_ISA_FILE "matmul_isa.h"
#include "foreach_isa.h"

void td_matmul_f32(const float *x, const float *w, float *y, int64_t n, int64_t k, int64_t m)
{
    struct mm a = {x, w, y, n, k, m, 0, 1};
    const struct mm_kernels *kern = TD_PICK(matmul_kernels);
    if (n == 0 || m == 0)
        return;
    if (k == 0) {
        memset(y, 0, sizeof(float) * n * m);
        return;
    }
    if (n < GEMM_MIN_ROWS) {
        td_parallel_for(kern->rows, &a, (m + ROWS_PER_TASK - 1) / ROWS_PER_TASK, 2.0 * ROWS_PER_TASK * k * n);
        return;
    }
    /* enough tasks to keep every thread busy: split x rows too when there are few weight panels */
    int64_t npanels = (m + kern->nr - 1) / kern->nr, want = 4 * (int64_t)td_get_threads();
    int64_t nchunks = npanels >= want ? 1 : (want + npanels - 1) / npanels;
    int64_t chunk = (n + nchunks - 1) / nchunks;
    a.chunk = (chunk + kern->mr - 1) / kern->mr * kern->mr;
    a.nchunks = (n + a.chunk - 1) / a.chunk;
    td_parallel_for(kern->gemm, &a, npanels * a.nchunks, 2.0 * kern->nr * k * a.chunk);
}
