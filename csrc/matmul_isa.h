/* matmul_isa.h: the matmul kernels for one instruction set (included by foreach_isa.h, see there).
   NR = two vectors of output columns, MR x rows per register tile: MR * 2 accumulators plus two
   weight vectors and a broadcast fit the register file (16 registers, or 32 with AVX-512 and NEON). */
#define NR (2 * VL)
#define MR (REGS == 32 ? 12 : 6)
#define MR_REST 4 /* tile height for the rows left over */
/* few rows: register tiles of FEW_RX x rows by FEW_RW weight rows, FEW_RX * FEW_RW sums + FEW_RX + 1
   registers (one weight vector at a time; the compiler may fold one into an FMA's memory operand).
   With 16 registers 4 x 3: 12 FMAs for 7 loads a step, against 2 x 4's 8 for 6; 8 sequences of
   SmolLM2-135M f32 decode 1.4x faster (AVX2, Zen 4) */
#define FEW_RW (REGS == 32 ? 4 : 3)
#define FEW_RX 4
/* one x row (decoding one sequence): weight rows a tile. On AVX2, and on AVX-512 on AMD, one row at a
   time, a single stream of memory: stories42M f32 decodes at 1.8x the 4-row tiles' pace on an EPYC
   (Zen 4, AVX2), whose prefetchers serve one long stream better than four short ones; on Zen 4 with
   AVX-512 (the row's sums in 256-bit halves, dot_tile) SmolLM2-135M f32 40-43 -> 60-79 t/s,
   stories42M 118-125 -> 191-254 (AVX2 in the same runs: 60-82 and 191-268). Elsewhere FEW_RW: the
   Xeon's AVX-512 (4 rows beat one 512-bit chain, measured; one row in halves not measured there),
   plain C and NEON (not measured). Zen 5 was not measured either. */
#define ONE_X_RW (VL == 8 || (VL == 16 && td_amd) ? 1 : FEW_RW)
/* several x rows: the first x tile also brings in the next group line by line as it reads this one
   (AVX-512, Xeon: SmolLM2-135M f32 decoding 2 / 4 / 8 sequences 92 / 171 / 339 -> 129 / 231 / 395
   t/s; the group two ahead prefetched a slice a tile alone left the memory idle in 1-tile passes).
   Not on AMD: on Zen 4 with AVX-512 the 4 more streams cost more than they bring (the same 2 / 4 / 8
   sequences 77-85 / 149-157 / 268-282 with them, 92-98 / 175-188 / 331-357 without; Zen 5 not
   measured) */
#define FIRST_TILE_AHEAD (VL == 16 && !td_amd)

#include "dot_isa.h"

/* ---- few rows: register tiles of dot products ---- */

/* VL numbers of a weight row from number p on, as f32: f32 rows as they are, f16 and bf16 widened
   (exactly); type is a constant after inlining */
TARGET TD_INLINE VEC ISA(wload)(const char *row, int64_t p, const enum td_type type)
{
#if VL == 16 && defined(__x86_64__)
    return (VEC)load16_avx512(row, p, type);
#elif VL == 8 && defined(__x86_64__)
    return (VEC)load8_avx2(row, p, type);
#elif NEON
    if (type == TD_F32)
        return vload((const float *)row + p);
    const uint16x4_t h = vld1_u16((const uint16_t *)(row + 2 * p));
    return type == TD_BF16 ? (VEC)vreinterpretq_f32_u32(vshll_n_u16(h, 16)) : (VEC)vcvt_f32_f16(vreinterpret_f16_u16(h));
#else
    if (type == TD_F32)
        return vload((const float *)row + p);
    return (VEC){load1(row, p, type), load1(row, p + 1, type), load1(row, p + 2, type), load1(row, p + 3, type)};
#endif
}

/* s[rx][rw] = x rows [rx, k] (k apart) . weight rows [rw, k] (ldw bytes apart, of f32, f16 or bf16:
   widened as they are read). Every entry is summed in one order: a vector of partial sums in k
   order, halved (vsum), then the tail one fma at a time (plain C: a product and a sum; the lane
   GEMM below sums the same way), so it does not depend on the tile it was computed in, nor on
   how many x rows came with it. rx, rw and type are constants after inlining: the rx * rw sums
   live in registers, and each weight vector loaded is used rx times, each x vector rw times. */
TARGET TD_INLINE void ISA(dot_tile)(const float *x, const char *w, int64_t ldw, int64_t k, float *s, const int rx,
                                    const int rw, const char *ahead, const enum td_type type)
{
    VEC acc[FEW_RX][FEW_RW];
    for (int r = 0; r < rx; r++)
        for (int c = 0; c < rw; c++)
            acc[r][c] = (VEC){0};
    int64_t p = 0;
    const int64_t size = type == TD_F32 ? 4 : 2; /* bytes a weight */
#if VL == 16 && defined(__x86_64__)
    /* one x row by one f32 weight row, as two 256-bit halves of the vector of partial sums (lane
       for lane the same sums, written as the loop below writes them, so that they fuse into FMAs
       exactly where its do): streaming from memory on Zen 4 it outran the one 512-bit chain
       (SmolLM2-135M f32 decode, one row at a time: 44-47 -> 54-67 t/s) */
    if (rx == 1 && rw == 1 && type == TD_F32) {
        vf8 lo = {0}, hi = {0};
        for (; p + VL <= k; p += VL) {
            lo += load_vf8(x + p) * load_vf8((const float *)w + p);
            hi += load_vf8(x + p + 8) * load_vf8((const float *)w + p + 8);
        }
        acc[0][0] = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    }
#endif
    for (; p + VL <= k; p += VL) {
        VEC xv[FEW_RX];
        for (int r = 0; r < rx; r++)
            xv[r] = vload(x + r * k + p);
        for (int c = 0; c < rw; c++) {
            if (ahead)
                __builtin_prefetch(ahead + c * ldw + p * size);
            VEC wv = ISA(wload)(w + c * ldw, p, type);
            for (int r = 0; r < rx; r++)
                acc[r][c] += xv[r] * wv;
        }
    }
    VEC flat[FEW_RX * FEW_RW];
    for (int r = 0; r < rx; r++)
        for (int c = 0; c < rw; c++)
            flat[r * rw + c] = acc[r][c];
    for (int i = 0; i < rx * rw; i += VL)
        ISA(vsums)(flat + i, rx * rw - i < VL ? rx * rw - i : VL, s + i);
    for (int r = 0; r < rx; r++)
        for (int c = 0; c < rw; c++)
            for (int64_t q = p; q < k; q++) { /* an fma where there is one, as the lane GEMM's vector does */
                const float xq = x[r * k + q], wq = load1(w + c * ldw, q, type);
                s[r * rw + c] = PLAIN ? s[r * rw + c] + xq * wq : __builtin_fmaf(xq, wq, s[r * rw + c]);
            }
}

/* dot_tile for rx <= FEW_RX x rows and rw <= FEW_RW weight rows, each case a constant tile */
TARGET TD_INLINE void ISA(dot_tiles)(const float *x, const char *w, int64_t ldw, int64_t k, float *s, int rx, int rw,
                                     const char *ahead, const enum td_type type)
{
    if (rw == FEW_RW)
        switch (rx) {
#define TILE(r) case r: ISA(dot_tile)(x, w, ldw, k, s, r, FEW_RW, ahead, type); return;
        TILE(1) TILE(2) TILE(3) TILE(4)
#undef TILE
        }
    for (int r = 0; r < rx; r++) /* the last few weight rows of a matrix */
        for (int c = 0; c < rw; c++)
            ISA(dot_tile)(x + r * k, w + c * ldw, ldw, k, s + r * rw + c, 1, 1, NULL, type);
}

/* matmul_rows for weights of type (f32, f16 or bf16, a constant after inlining) */
TARGET TD_INLINE void ISA(rows_of)(const struct mm *a, int64_t b, int64_t e, const enum td_type type)
{
    int64_t k = a->k, m = a->m, j1 = e * ROWS_PER_TASK < m ? e * ROWS_PER_TASK : m;
    const int64_t ldw = type == TD_F32 ? 4 * k : 2 * k; /* bytes a weight row */
    const int tile_rw = a->n == 1 ? ONE_X_RW : FEW_RW;
    for (int64_t j = b * ROWS_PER_TASK; j < j1; j += tile_rw) {
        int rw = j1 - j < tile_rw ? (int)(j1 - j) : tile_rw;
        const int64_t jn = j + 2 * FEW_RW; /* the group 2 ahead (one x row: none) */
        struct ahead next = a->n > 1 && jn < m ? weights_ahead(a, jn, m - jn < FEW_RW ? m - jn : FEW_RW, 0, k)
                                               : (struct ahead){0};
        const int64_t slice = ahead_slice(&next, (a->n + FEW_RX - 1) / FEW_RX);
        for (int64_t i = 0; i < a->n; i += FEW_RX) {
            int rx = a->n - i < FEW_RX ? (int)(a->n - i) : FEW_RX;
            float s[FEW_RX * FEW_RW];
            const char *w = (const char *)a->w + j * ldw;
            const int in_tile = i == 0 && rw == FEW_RW && (a->n == 1 || FIRST_TILE_AHEAD);
            if (!in_tile)
                prefetch_next(&next, slice);
            if (in_tile) /* two copies, so that the other's prefetch test folds away */
                ISA(dot_tiles)(a->x + i * k, w, ldw, k, s, rx, rw, w + FEW_RW * ldw, type);
            else
                ISA(dot_tiles)(a->x + i * k, w, ldw, k, s, rx, rw, NULL, type);
            for (int r = 0; r < rx; r++)
                for (int c = 0; c < rw; c++) {
                    float *y = a->y + (i + r) * m + j + c;
                    *y = a->acc ? *y + s[r * rw + c] : s[r * rw + c];
                }
        }
    }
}

/* tasks [b, e) = weight rows [ROWS_PER_TASK*b, ROWS_PER_TASK*e) of f32, f16 or bf16 against every
   x row: FEW_RW weight rows at a time, read from memory once and kept in L1 while the x rows pass
   by FEW_RX at a time. Several x rows: each x tile prefetches a slice of the group two ahead
   (matmul.c), but the first where FIRST_TILE_AHEAD: the tile itself prefetches the next group as
   it goes; one x row: nothing (one row at a time), or the same (tiles of FEW_RW rows) */
TARGET static void ISA(matmul_rows)(void *ctx, int64_t b, int64_t e)
{
    const struct mm *a = ctx;
    if (a->type == TD_F16)
        ISA(rows_of)(a, b, e, TD_F16);
    else if (a->type == TD_BF16)
        ISA(rows_of)(a, b, e, TD_BF16);
    else
        ISA(rows_of)(a, b, e, TD_F32);
}

/* ---- many rows: packed panels and register tiles ---- */

/* wp[kc][NR] = w[0:cols, 0:kc]^T (weight rows k apart), zero past cols */
TARGET TD_INLINE void ISA(pack_w)(const float *w, int64_t k, int64_t cols, int64_t kc, float *wp)
{
#if VL == 16 && defined(__x86_64__)
    transpose_panel_avx512((const char *)w, 4 * k, cols, kc, wp, TD_F32);
#elif VL == 8 && defined(__x86_64__)
    transpose_panel_avx2((const char *)w, 4 * k, cols, kc, wp, TD_F32);
#else
    for (int64_t c = 0; c < NR; c++)
        for (int64_t p = 0; p < kc; p++)
            wp[p * NR + c] = c < cols ? w[c * k + p] : 0.0f;
#endif
}

/* y[0:mr, 0:NR] (+)= x[0:mr, 0:kc] @ wp[kc][NR]; x rows ldx apart, wp rows ldw (NR, or a stored
   panel's TD_PANEL), y rows ldy. mr is a constant (MR or MR_REST) after inlining, so acc lives in
   registers. */
TARGET TD_INLINE void ISA(gemm_tile)(const float *x, int64_t ldx, const float *wp, int64_t ldw, int64_t kc,
                                     float *y, int64_t ldy, int add, const int mr)
{
    VEC acc[MR][2];
    for (int r = 0; r < mr; r++)
        acc[r][0] = acc[r][1] = (VEC){0};
    for (int64_t p = 0; p < kc; p++) {
        VEC b0 = vload(wp + p * ldw), b1 = vload(wp + p * ldw + VL);
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
TARGET TD_INLINE void ISA(gemm_edge)(const float *x, int64_t ldx, const float *wp, int64_t ldw, int64_t kc,
                                     float *y, int64_t ldy, int add, int64_t rows, int64_t cols, const int mr)
{
    float xt[MR * KC]; /* [mr][kc] the x rows, zero below rows */
    float yt[MR * NR]; /* [mr][NR] the y tile */
    memset(xt, 0, sizeof(float) * mr * kc);
    for (int64_t r = 0; r < rows; r++)
        memcpy(xt + r * kc, x + r * ldx, sizeof(float) * kc);
    for (int64_t r = 0; r < rows && add; r++)
        memcpy(yt + r * NR, y + r * ldy, sizeof(float) * cols);
    ISA(gemm_tile)(xt, kc, wp, ldw, kc, yt, NR, add, mr);
    for (int64_t r = 0; r < rows; r++)
        memcpy(y + r * ldy, yt + r * NR, sizeof(float) * cols);
}

/* y[0:rows, 0:cols] (+)= x[0:rows, 0:kc] @ wp: MR-row tiles, then MR_REST-row tiles, then one of the
   1 to MR_REST - 1 rows left; only a panel cut by the matrix edge (cols < NR) goes through copies */
TARGET TD_INLINE void ISA(gemm_rows)(const float *x, int64_t ldx, const float *wp, int64_t ldw, int64_t kc,
                                     float *y, int64_t ldy, int add, int64_t rows, int64_t cols, struct ahead *next)
{
    int64_t i = 0;
    /* the MR tiles stop one early where they would leave 1 or 2 rows that MR more can cut into
       MR_REST-row tiles and a 3-row one: a 1- or 2-row tile keeps too few sums in flight to
       hide the FMA's latency (2 or 4 of the 8 needed) */
    const int64_t left = rows % MR, cut = (MR + left) % MR_REST; /* what MR_REST tiles would leave */
    const int early = left && left < 3 && rows > MR && (cut == 0 || cut > 2);
    const int64_t mr_rows = rows - (early ? MR + left : left);         /* rows the MR tiles take */
    const int64_t slice = ahead_slice(next, mr_rows / MR); /* all at once if there is no MR tile */
    if (mr_rows < MR)
        prefetch_next(next, slice);
    for (; i < mr_rows && cols == NR; i += MR) {
        prefetch_next(next, slice); /* a slice of the next panel's lines per tile */
        ISA(gemm_tile)(x + i * ldx, ldx, wp, ldw, kc, y + i * ldy, ldy, add, MR);
    }
    for (; i + MR_REST <= rows && cols == NR; i += MR_REST)
        ISA(gemm_tile)(x + i * ldx, ldx, wp, ldw, kc, y + i * ldy, ldy, add, MR_REST);
    if (i < rows && cols == NR) {
        switch (rows - i) { /* a constant tile height each */
#define TILE(r) case r: ISA(gemm_tile)(x + i * ldx, ldx, wp, ldw, kc, y + i * ldy, ldy, add, r); return;
        TILE(1) TILE(2) TILE(3)
#undef TILE
        }
    }
    for (; i < rows; i += MR_REST) {
        int64_t r = rows - i < MR_REST ? rows - i : MR_REST;
        ISA(gemm_edge)(x + i * ldx, ldx, wp, ldw, kc, y + i * ldy, ldy, add, r, cols, MR_REST);
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
#if (VL == 8 || VL == 16) && defined(__x86_64__)
    if (a->type == TD_BF16 || a->type == TD_F16) { /* widened inside the transpose */
#if VL == 16
        transpose_panel_avx512(w, a->row_bytes, cols, kc, wp, a->type);
#else
        transpose_panel_avx2(w, a->row_bytes, cols, kc, wp, a->type);
#endif
        return;
    }
#endif
    for (int64_t c = 0; c < cols; c++)
        tt->to_float(w + c * a->row_bytes, wt + c * KC, kc);
    ISA(pack_w)(wt, KC, cols, kc, wp);
}

/* wp[kc][NR] = columns c0..c0+NR of the k chunk of a stored f16 or bf16 panel (TD_PANEL numbers a
   row; row_type TD_F16 or TD_BF16), widened to f32: only the columns one sweep of the tiles reads,
   so that wp is as small as a packed panel (AVX2: 16 KB, not 32) */
TARGET TD_INLINE void ISA(widen_panel)(const char *chunk, const enum td_type row_type, int64_t c0, int64_t kc,
                                       float *wp)
{
    for (int64_t p = 0; p < kc; p++) {
        const char *row = chunk + (p * TD_PANEL + c0) * 2;
#if VL == 16 && defined(__x86_64__)
        _mm512_storeu_ps(wp + p * NR, load16_avx512(row, 0, row_type));
        _mm512_storeu_ps(wp + p * NR + 16, load16_avx512(row, 16, row_type));
#elif VL == 8 && defined(__x86_64__)
        _mm256_storeu_ps(wp + p * NR, load8_avx2(row, 0, row_type));
        _mm256_storeu_ps(wp + p * NR + 8, load8_avx2(row, 8, row_type));
#else
        for (int64_t c = 0; c < NR; c++)
            wp[p * NR + c] = load1(row, c, row_type);
#endif
    }
}

/* tasks [b, e): task t is weight panel t / nchunks times x row chunk t % nchunks; a panel is NR
   weight rows, packed here a k chunk at a time, or a stored panel's TD_PANEL (F32P, F16P, BF16P),
   swept NR columns at a time: read as it is (f32), or those columns widened (f16, bf16) */
TARGET static void ISA(matmul_gemm)(void *ctx, int64_t b, int64_t e)
{
    const struct mm *a = ctx;
    float wp[KC * NR] __attribute__((aligned(64))); /* [KC][NR] packed weight panel */
    int64_t n = a->n, k = a->k, m = a->m;
    const int stored = stored_panels(a);
    const int64_t width = stored ? TD_PANEL : NR;
    const enum td_type row_type = a->type == TD_BF16P ? TD_BF16 : TD_F16; /* of a stored 16-bit panel */
    for (int64_t t = b; t < e; t++) {
        int64_t j0 = t / a->nchunks * width, cols = m - j0 < width ? m - j0 : width;
        int64_t i0 = t % a->nchunks * a->chunk, i1 = i0 + a->chunk < n ? i0 + a->chunk : n;
        for (int64_t p0 = 0; p0 < k; p0 += KC) {
            int64_t kc = k - p0 < KC ? k - p0 : KC;
            struct ahead next = {0}; /* the weights the next k chunk, or the next task's panel, reads */
            int64_t jn = (t + 1) / a->nchunks * width;
            if (p0 + KC < k)
                next = weights_ahead(a, j0, cols, p0 + KC, k - p0 - KC < KC ? k - p0 - KC : KC);
            else if (t + 1 < e && jn != j0)
                next = weights_ahead(a, jn, m - jn < width ? m - jn : width, 0, k < KC ? k : KC);
            const char *chunk = stored ? (const char *)a->w + (j0 * k + p0 * TD_PANEL) * a->tt->type_size : NULL;
            for (int64_t c = 0; c < cols; c += NR) { /* one sweep unless stored; the first prefetches next */
                const float *panel = wp;
                int64_t ldw = NR;
                if (!stored && a->tt)
                    ISA(pack_w_typed)(a, j0, cols, p0, kc, wp);
                else if (!stored)
                    ISA(pack_w)((const float *)a->w + j0 * k + p0, k, cols, kc, wp);
                else if (a->type == TD_F32P)
                    panel = (const float *)chunk + c, ldw = TD_PANEL;
                else
                    ISA(widen_panel)(chunk, row_type, c, kc, wp);
                ISA(gemm_rows)(a->x + i0 * k + p0, k, panel, ldw, kc, a->y + i0 * m + j0 + c, m, p0 > 0 || a->acc,
                               i1 - i0, cols - c < NR ? cols - c : NR, &next);
            }
        }
    }
}

/* ---- many rows in the few-rows order: the lane GEMM ----

   dot_tile sums x . w as VL chains, chain l over the numbers p = l, l + VL, ... (p < kv, the
   multiple of VL below k), then adds the chains up by halving (vsum), then the tail p >= kv term by
   term. Chain l is itself a dot product, of x's and w's numbers l, l + VL, ...: the lane GEMM runs
   the GEMM's register tile (gemm_tile) over each chain in turn (x broadcast, w's columns in
   vectors), keeps the VL tiles of chain sums, halves them as vsum does, then adds the tail. Every
   output gets the same operations in the same order as in dot_tile, vectorised across its row of
   outputs instead of along k, so a row's result does not depend on the path, nor on the rows
   beside it. x and w are packed chain by chain (pack_x_lanes, pack_w_lanes): a chain's numbers consecutive. */

/* xp = an x row as chains, k numbers: xp[l * nq + q] = x[q * VL + l], then the tail xp[p] = x[p],
   p >= nq * VL; or zeros (x NULL: a row past n, which a tile of MR_REST rows reads) */
TARGET TD_INLINE void ISA(pack_x_lanes)(const float *x, int64_t k, float *xp)
{
    const int64_t nq = k / VL, kv = nq * VL;
    for (int64_t q = 0; q < nq; q++)
        for (int l = 0; l < VL; l++)
            xp[l * nq + q] = x ? x[q * VL + l] : 0.0f;
    for (int64_t p = kv; p < k; p++)
        xp[p] = x ? x[p] : 0.0f;
}

/* wp = weight rows j..j+cols (ldw bytes apart, of f32, f16 or bf16: widened; zero past cols) as
   chains, NR columns a number: wp[(l * nq + q) * NR + c] = w[c][q * VL + l], then the tail
   wp[(nq * VL + t) * NR + c] */
TARGET TD_INLINE void ISA(pack_w_lanes)(const char *w, int64_t ldw, int64_t k, int64_t cols, float *wp,
                                        const enum td_type type)
{
    const int64_t nq = k / VL, kv = nq * VL;
#if (VL == 8 || VL == 16) && defined(__x86_64__)
    for (int64_t q = 0; q < nq; q++) /* VL rows by VL numbers at a time, transposed in registers */
        for (int64_t half = 0; half < NR; half += VL) {
            VEC r[VL];
            for (int64_t c = 0; c < VL; c++)
                r[c] = half + c < cols ? ISA(wload)(w + (half + c) * ldw, q * VL, type) : (VEC){0};
#if VL == 16
            transpose16((__m512 *)r);
#else
            transpose8((__m256 *)r);
#endif
            for (int l = 0; l < VL; l++)
                vstore(wp + (l * nq + q) * NR + half, r[l]);
        }
#else
    for (int64_t c = 0; c < NR; c++)
        for (int64_t q = 0; q < nq; q++)
            for (int l = 0; l < VL; l++)
                wp[(l * nq + q) * NR + c] = c < cols ? load1(w + c * ldw, q * VL + l, type) : 0.0f;
#endif
    for (int64_t c = 0; c < NR; c++)
        for (int64_t p = kv; p < k; p++)
            wp[p * NR + c] = c < cols ? load1(w + c * ldw, p, type) : 0.0f;
}

/* y[0:rows, 0:cols] (+)= the products of mr packed x rows (k apart) by a packed panel, in
   dot_tile's order: each chain by gemm_tile into s, chain l + VL / 2 added to chain l as it is
   stored (vsum's first halving); s halved down to s[0] as vsum halves a vector; the tail added term
   by term. mr is a constant after inlining. */
TARGET TD_INLINE void ISA(lane_tile)(const float *xp, const float *wp, int64_t k, float *y, int64_t ldy, int add,
                                     int64_t rows, int64_t cols, const int mr)
{
    float s[VL / 2][MR * NR] __attribute__((aligned(64))); /* [chain][x row][column] the chain sums */
    const int64_t nq = k / VL, kv = nq * VL;
    for (int l = 0; l < VL; l++)
        ISA(gemm_tile)(xp + l * nq, k, wp + l * nq * NR, NR, nq, s[l % (VL / 2)], NR, l >= VL / 2, mr);
    for (int half = VL / 4; half >= 1; half /= 2) /* vsum's other halvings: chain l and l + half */
        for (int l = 0; l < half; l++)
            for (int64_t i = 0; i < mr * NR; i += VL)
                vstore(s[l] + i, vload(s[l] + i) + vload(s[l + half] + i));
    for (int64_t p = kv; p < k; p++) { /* the tail, term by term */
        VEC b0 = vload(wp + p * NR), b1 = vload(wp + p * NR + VL);
        for (int r = 0; r < mr; r++) {
            float xv = xp[r * k + p], *sr = s[0] + r * NR;
            vstore(sr, vload(sr) + xv * b0);
            vstore(sr + VL, vload(sr + VL) + xv * b1);
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        float *yr = y + r * ldy, *sr = s[0] + r * NR;
        for (int64_t c = 0; c < cols; c++)
            yr[c] = add ? yr[c] + sr[c] : sr[c];
    }
}

/* job task b of the lane GEMM: items [b * items / nbuf, (b + 1) * items / nbuf) of the weights'
   (panel, x chunk) items laid end to end, with panel buffer b (matmul.c, struct lanes) */
TARGET static void ISA(lane_gemm)(void *ctx, int64_t b, int64_t e)
{
    const struct lanes *g = ctx;
    for (; b < e; b++) {
        float *wp = g->wp + b * g->panel_floats;
        const struct mm *packed = NULL;
        int64_t packed_j0 = -1;
        for (int64_t it = b * g->items / g->nbuf; it < (b + 1) * g->items / g->nbuf; it++) {
            int64_t j = 0;
            while (g->first[j + 1] <= it)
                j++;
            const struct mm *a = &g->a[j];
            const int64_t t = it - g->first[j], k = a->k, m = a->m;
            const int64_t j0 = t / a->nchunks * NR, cols = m - j0 < NR ? m - j0 : NR;
            const int64_t i0 = t % a->nchunks * a->chunk, i1 = i0 + a->chunk < a->n ? i0 + a->chunk : a->n;
            const int64_t ldw = a->type == TD_F32 ? 4 * k : 2 * k;
            if (packed != a || packed_j0 != j0)
                ISA(pack_w_lanes)((const char *)a->w + j0 * ldw, ldw, k, cols, wp, a->type), packed = a, packed_j0 = j0;
            int64_t i = i0;
            for (; i + MR <= i1; i += MR)
                ISA(lane_tile)(g->xp + i * k, wp, k, a->y + i * m + j0, m, a->acc, MR, cols, MR);
            for (; i < i1; i += MR_REST)
                ISA(lane_tile)(g->xp + i * k, wp, k, a->y + i * m + j0, m, a->acc, i1 - i < MR_REST ? i1 - i : MR_REST,
                               cols, MR_REST);
        }
    }
}

/* tasks [b, e) = x rows, and the zero rows after n that the last tile reads: x packed for lane_tile
   (matmul.c, struct lanes) */
TARGET static void ISA(lane_pack_x)(void *ctx, int64_t b, int64_t e)
{
    const struct lanes *g = ctx;
    const int64_t n = g->a[0].n, k = g->a[0].k;
    for (int64_t i = b; i < e; i++)
        ISA(pack_x_lanes)(i < n ? g->a[0].x + i * k : NULL, k, g->xp + i * k);
}

static const struct mm_kernels ISA(matmul_kernels) = {.rows = ISA(matmul_rows), .gemm = ISA(matmul_gemm),
                                                       .lanes = ISA(lane_gemm), .pack_x = ISA(lane_pack_x), .mr = MR,
                                                       .nr = NR};

#undef FIRST_TILE_AHEAD
#undef NR
#undef MR
#undef MR_REST
#undef FEW_RW
#undef FEW_RX
