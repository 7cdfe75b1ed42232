/* matmul_isa.h: the matmul kernels for one instruction set (included by foreach_isa.h, see there).
   NR = two vectors of output columns, MR x rows per register tile: MR * 2 accumulators plus two
   weight vectors and a broadcast fit the register file (16 registers, or 32 with AVX-512). */
#define NR (2 * VL)
#define MR (VL == 16 ? 12 : 6)
#define MR_REST 4 /* tile height for the rows left over */

#include "dot_isa.h"

/* ---- few rows: dot products ---- */

/* y[0:4] = x[k] . w[4,k] (four weight rows k apart) */
TARGET TD_INLINE void ISA(dot4)(const float *x, const float *w, int64_t k, float *y)
{
    const float *w0 = w, *w1 = w + k, *w2 = w + 2 * k, *w3 = w + 3 * k;
    VEC a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
    int64_t p = 0;
    for (; p + 2 * VL <= k; p += 2 * VL) { /* two sums per row: eight FMA chains in flight */
        VEC xv = vload(x + p), xu = vload(x + p + VL);
        a0 += vload(w0 + p) * xv, b0 += vload(w0 + p + VL) * xu;
        a1 += vload(w1 + p) * xv, b1 += vload(w1 + p + VL) * xu;
        a2 += vload(w2 + p) * xv, b2 += vload(w2 + p + VL) * xu;
        a3 += vload(w3 + p) * xv, b3 += vload(w3 + p + VL) * xu;
    }
    for (; p + VL <= k; p += VL) {
        VEC xv = vload(x + p);
        a0 += vload(w0 + p) * xv;
        a1 += vload(w1 + p) * xv;
        a2 += vload(w2 + p) * xv;
        a3 += vload(w3 + p) * xv;
    }
    float s0 = vsum(a0 + b0), s1 = vsum(a1 + b1), s2 = vsum(a2 + b2), s3 = vsum(a3 + b3);
    for (; p < k; p++) {
        s0 += w0[p] * x[p];
        s1 += w1[p] * x[p];
        s2 += w2[p] * x[p];
        s3 += w3[p] * x[p];
    }
    y[0] = s0, y[1] = s1, y[2] = s2, y[3] = s3;
}

/* tasks [b, e) = weight rows [ROWS_PER_TASK*b, ROWS_PER_TASK*e) against every x row */
TARGET static void ISA(matmul_rows)(void *ctx, int64_t b, int64_t e)
{
    const struct mm *a = ctx;
    const float *w = a->w;
    int64_t k = a->k, m = a->m, j = b * ROWS_PER_TASK, j1 = e * ROWS_PER_TASK;
    if (j1 > m)
        j1 = m;
    for (; j + 4 <= j1; j += 4)
        for (int64_t i = 0; i < a->n; i++) {
            float s[4], *y = a->y + i * m + j;
            ISA(dot4)(a->x + i * k, w + j * k, k, s);
            for (int c = 0; c < 4; c++)
                y[c] = a->acc ? y[c] + s[c] : s[c];
        }
    for (; j < j1; j++)
        for (int64_t i = 0; i < a->n; i++) {
            float s = ISA(vec_dot_f32)(k, a->x + i * k, w + j * k);
            a->y[i * m + j] = a->acc ? a->y[i * m + j] + s : s;
        }
}

/* ---- many rows: packed panels and register tiles ---- */

/* wp[kc][NR] = w[0:cols, 0:kc]^T (weight rows k apart), zero past cols */
TARGET TD_INLINE void ISA(pack_w)(const float *w, int64_t k, int64_t cols, int64_t kc, float *wp)
{
#if VL == 16 && defined(__x86_64__)
    transpose_panel_avx512(w, k, cols, kc, wp);
#else
    for (int64_t c = 0; c < NR; c++)
        for (int64_t p = 0; p < kc; p++)
            wp[p * NR + c] = c < cols ? w[c * k + p] : 0.0f;
#endif
}

/* y[0:mr, 0:NR] (+)= x[0:mr, 0:kc] @ wp[kc][NR]; x rows ldx apart, y rows ldy apart.
   mr is a constant (MR or MR_REST) after inlining, so acc lives in registers. */
TARGET TD_INLINE void ISA(gemm_tile)(const float *x, int64_t ldx, const float *wp, int64_t kc,
                                     float *y, int64_t ldy, int add, const int mr)
{
    VEC acc[MR][2];
    for (int r = 0; r < mr; r++)
        acc[r][0] = acc[r][1] = (VEC){0};
    for (int64_t p = 0; p < kc; p++) {
        VEC b0 = vload(wp + p * NR), b1 = vload(wp + p * NR + VL);
        for (int r = 0; r < mr; r++) {
            float xv = x[r * ldx + p];
            acc[r][0] += xv * b0;
            acc[r][1] += xv * b1;
        }
    }
    for (int r = 0; r < mr; r++) {
        float *yr = y + r * ldy;
        if (add)
            acc[r][0] += vload(yr), acc[r][1] += vload(yr + VL);
        vstore(yr, acc[r][0]);
        vstore(yr + VL, acc[r][1]);
    }
}

/* a tile cut by the matrix edge (rows < mr or cols < NR): run it on zero-padded copies */
TARGET TD_INLINE void ISA(gemm_edge)(const float *x, int64_t ldx, const float *wp, int64_t kc, float *y,
                                     int64_t ldy, int add, int64_t rows, int64_t cols, const int mr)
{
    float xt[MR * KC]; /* [mr][kc] the x rows, zero below rows */
    float yt[MR * NR]; /* [mr][NR] the y tile */
    memset(xt, 0, sizeof(float) * mr * kc);
    for (int64_t r = 0; r < rows; r++)
        memcpy(xt + r * kc, x + r * ldx, sizeof(float) * kc);
    for (int64_t r = 0; r < rows && add; r++)
        memcpy(yt + r * NR, y + r * ldy, sizeof(float) * cols);
    ISA(gemm_tile)(xt, kc, wp, kc, yt, NR, add, mr);
    for (int64_t r = 0; r < rows; r++)
        memcpy(y + r * ldy, yt + r * NR, sizeof(float) * cols);
}

/* y[0:rows, 0:cols] (+)= x[0:rows, 0:kc] @ wp: MR-row tiles, then MR_REST-row tiles for what is left */
TARGET TD_INLINE void ISA(gemm_rows)(const float *x, int64_t ldx, const float *wp, int64_t kc, float *y,
                                     int64_t ldy, int add, int64_t rows, int64_t cols)
{
    int64_t i = 0;
    for (; i + MR <= rows && cols == NR; i += MR)
        ISA(gemm_tile)(x + i * ldx, ldx, wp, kc, y + i * ldy, ldy, add, MR);
    for (; i + MR_REST <= rows && cols == NR; i += MR_REST)
        ISA(gemm_tile)(x + i * ldx, ldx, wp, kc, y + i * ldy, ldy, add, MR_REST);
    for (; i < rows; i += MR_REST) {
        int64_t r = rows - i < MR_REST ? rows - i : MR_REST;
        ISA(gemm_edge)(x + i * ldx, ldx, wp, kc, y + i * ldy, ldy, add, r, cols, MR_REST);
    }
}

/* wp[kc][NR] from typed weight rows j0.. (cols of them), numbers p0..p0+kc: each row widened to
   f32 by the type's to_float, then packed as f32 rows are */
TARGET TD_INLINE void ISA(pack_w_typed)(const struct mm *a, int64_t j0, int64_t cols, int64_t p0, int64_t kc,
                                         float *wp)
{
    float wt[NR * KC] __attribute__((aligned(64))); /* [NR][KC] the rows in f32 */
    const struct type_traits *tt = a->tt;
    const char *w = (const char *)a->w + j0 * a->row_bytes + p0 / tt->blck_size * tt->type_size;
    for (int64_t c = 0; c < cols; c++)
        tt->to_float(w + c * a->row_bytes, wt + c * KC, kc);
    ISA(pack_w)(wt, KC, cols, kc, wp);
}

/* tasks [b, e): task t is weight panel t / nchunks (NR rows of w) times x row chunk t % nchunks */
TARGET static void ISA(matmul_gemm)(void *ctx, int64_t b, int64_t e)
{
    const struct mm *a = ctx;
    float wp[KC * NR] __attribute__((aligned(64))); /* [KC][NR] packed weight panel */
    int64_t n = a->n, k = a->k, m = a->m;
    for (int64_t t = b; t < e; t++) {
        int64_t j0 = t / a->nchunks * NR, cols = m - j0 < NR ? m - j0 : NR;
        int64_t i0 = t % a->nchunks * a->chunk, i1 = i0 + a->chunk < n ? i0 + a->chunk : n;
        for (int64_t p0 = 0; p0 < k; p0 += KC) {
            int64_t kc = k - p0 < KC ? k - p0 : KC;
            if (a->tt)
                ISA(pack_w_typed)(a, j0, cols, p0, kc, wp);
            else
                ISA(pack_w)((const float *)a->w + j0 * k + p0, k, cols, kc, wp);
            ISA(gemm_rows)(a->x + i0 * k + p0, k, wp, kc, a->y + i0 * m + j0, m, p0 > 0, i1 - i0, cols);
        }
    }
}

static const struct mm_kernels ISA(matmul_kernels) = {.rows = ISA(matmul_rows), .gemm = ISA(matmul_gemm), .mr = MR,
                                                       .nr = NR};

#undef NR
#undef MR
#undef MR_REST
