/* matmul.c: y[n,m] = x[n,k] @ w[m,k]^T in f32, w in HF layout (out_features x in_features).

   Few x rows (one token while decoding, a block of block diffusion) is memory bound: the weight
   rows (f32, or f16 and bf16 widened to f32 as they are read) are streamed from memory once, a
   few at a time, and dotted with every x row while they sit in L1, in register tiles of 3 weight
   rows by 4 x rows (AVX-512, NEON: 4 by 4). Rows ahead are prefetched while the x tiles run:
   without it the memory idles while the later x tiles run on rows already in L1 (8 rows cost 1.7
   decode steps instead of 1.3: SmolLM2-135M's matrices, 2 threads, AVX-512, prefetching the next
   four rows during the first x tile). Spreading the prefetch of the group two ahead over every x
   tile made 4 sequences of SmolLM2-135M f32 decode 1.28x faster, 8 1.12-1.17x (AVX2, Zen 4). On
   AMD the first x tile does not prefetch, and one x row (on AVX2 everywhere) takes its weight rows
   one at a time: one stream (matmul_isa.h). Threads split the weight rows.

   Batch invariance (on unless td_set_batch_invariant(0)): a row's result is the same bits whatever
   rows come with it, so a request's answer does not depend on its batch (issue 40). Every output
   of a type is summed in one order at any number of rows. f32, f16, bf16 rows: the tiles' order (a
   vector of partial sums in k order, halved, then the tail an fma at a time), from
   td_gemm_min_rows() x rows by the lane GEMM (matmul_isa.h), which runs a GEMM register tile over
   each of those partial sums' chains and halves them alike: SmolLM2-135M's f32 matrices, 512 rows,
   0.85-0.91x the BLIS GEMM below (AVX-512, Xeon; bench/bench_batch_invariance.py for whole models).
   The other row types: their tiles and vec_dot at any n (they sum a row as plain C does). Q8_0X8
   and Q4_0X8: their kernel, and from GEMM_X8_MIN_ROWS the int8 GEMM, which sums as it does (gemm_q8.c).
   Panels: only the GEMM reads them. With invariance off, many rows take the GEMMs below, whose
   order differs from the tiles' (f32 and the widened types: one chain per output, k chunk by k chunk).

   Many x rows, invariance off, is done BLIS style: NR weight rows x KC columns are packed
   transposed into wp[KC][NR] (L1-sized), then an MR x NR register tile sweeps down the x rows:
   each packed weight vector loaded is used MR times, each x value broadcast is used NR times.
   While a panel's tiles run, the weights the next one packs are prefetched a slice per tile
   (struct ahead). Threads split (weight panel, x row chunk) pairs. The kernels are in matmul_isa.h.

   A masked-diffusion model's passes all have many rows, and packing the same weights on every call
   cost 6-9% of a step of the shipped MDM (Zen 4, AVX-512). Its f32, f16 and bf16 matrices are put in
   panels at load instead (F32P, F16P, BF16P: quant.h), which only the GEMM reads, at any number of x
   rows: f32 as they are, f16 and bf16 widened a sweep's NR columns at a time. Zen 4, 68 x rows, 2
   threads, against the same matrices in rows (before the lane GEMM): AVX-512 1.07-1.09x (f32),
   1.15-1.58x (bf16, whose rows then rounded x in a job of its own); AVX2 0.98-1.09x; the shipped MDM's
   step 4.26-4.51 -> 4.03-4.17 ms (AVX-512), 4.27-4.53 -> 4.12-4.23 (AVX2), three interleaved pairs
   each.

   Other weight types (quant.h): x rows are converted once per call to the type the weights' dot
   product wants (the same conversion on every path). Few x rows: each weight row is dotted with every
   converted x row by the type's vec_dot, reading the weights once in their own type; where the type
   has a tile (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL on AVX2 and AVX512_VNNI), 4 weight rows by up to
   4 x rows at once, each weight block made ready once for all the x rows and each x block once for the
   4 weight rows; batch invariant, at any number of x rows (prefill of the SmolLM2-135M Q4_1 file
   0.91x, Gemma 3 270M Q4_K_M 0.81x the widening below, but 32 decoding sequences 1.47x and 1.63x).
   Many x rows, invariance off: Q8_0 and Q4_0 run an int8 GEMM on AVX512_VNNI (gemm_q8.c); otherwise
   the converted x is widened back to f32 and the f32 GEMM above runs, each weight panel widened to f32
   just before it is packed (f16 and bf16 inside the packing transpose: 2-3% off a bf16 GEMM of the
   shipped models on AVX2, a diffusion step of the shipped MDM 3.32 -> 3.20 ms on AVX-512).

   Q8_0X8 and Q4_0X8 (rows interleaved by 8 at load, on AVX2 and AVX512_VNNI: quant.h) take their
   own kernel: a group of 8 rows is one stream of memory and its 8 dot products come out in one
   register's lanes (AVX-512: two groups' 16 in one). On AVX2 at any number of x rows: it outruns
   both the 4-row tiles (2x, one x row) and widening to f32 for the GEMM (pp512). On AVX512_VNNI up
   to 16 x rows, two of its tiles of 8 (8 decoding sequences of SmolLM2-135M q8_0: 1492-1502 t/s
   against 1271-1310 through the GEMM on a Xeon; 16 on Zen 4: 1343-1410 against 939-1108); from 17
   the int8 GEMM, its panels copied from the groups, outruns it (Zen 4: the same at 24 sequences;
   Xeon: its 1536x576 matrix, 2 threads, 64 rows 124 against 157 us; 9-16 rows not measured
   there since 17 became the bound). A group at a time is one stream of memory, which the hardware
   prefetches best: the AVX2 kernel reads so, and the AVX-512 one for one x row; from two x rows
   the AVX-512 one reads two groups at once and prefetches the next two (quant.c).

   td_matmuls does several matmuls of one x (q/k/v, gate/up): with few x rows, x is converted once
   and the row tasks of all the weights make one job, one thread-pool round trip. */
#include <stdlib.h>
#include "quant.h"

int td_batch_invariant = 1;

int td_set_batch_invariant(int on)
{
    const int was = td_batch_invariant;
    td_batch_invariant = on != 0;
    return was;
}

#define KC 256 /* k per packed panel */
#define ROWS_PER_TASK 16
#define GEMM_16BIT_MIN_ROWS 4 /* f16 / bf16, invariance off: chosen when their tiles were vec_dot, one x row at a time */
#define GEMM_Q8_MIN_ROWS 4 /* the int8 GEMM's panels are bytes, cheap to pack: it wins from 3-4 rows */
#define GEMM_X8_MIN_ROWS 17 /* Q8_0X8 / Q4_0X8 on AVX512_VNNI: two of their kernel's tiles of 8 x rows */
#define PREFETCH_BYTES 4096 /* typed few-rows path: how far ahead of the row being read to prefetch */

struct mm {
    const float *x; /* [n,k] */
    const void *w;  /* [m,k] f32, or m rows of row_bytes in type tt */
    float *y;       /* [n,m] */
    int64_t n, k, m;
    int64_t chunk;   /* gemm: x rows per task, a multiple of the tile height */
    int64_t nchunks; /* gemm: tasks per weight panel */
    enum td_type type;            /* the weights' type */
    const struct type_traits *tt; /* its traits; NULL for f32 */
    int64_t row_bytes;            /* of one weight row, for tt */
    const char *xc;               /* [n] x rows as tt's vec_dot wants them (few-rows path) */
    int64_t xc_bytes;             /* of one such row */
    int acc;                      /* y += the products, not y = (the GEMM: only where k <= KC) */
};

/* weight rows a GEMM task brings into the cache while the tiles of the panel before them run: the
   next panel's (or k chunk's) bytes, rows row_bytes apart. The hardware's prefetchers stop between
   panels (some us of arithmetic apart), so without it every panel starts with misses to L3 or
   memory: 10-20% of a shipped model's layer GEMMs, whose 10 MB of weights cycle through L3. */
struct ahead {
    const char *w;          /* the first row's first byte wanted */
    int64_t row_bytes;      /* between rows */
    int64_t lines, rows;    /* cache lines a row, rows */
    int64_t row, line;      /* the next line to prefetch */
};

/* the next count lines of the region (fewer at its end), prefetched into L2, where the packing
   reads them; count is worked out once a panel, so the tiles pay no division */
TD_INLINE void prefetch_next(struct ahead *a, int64_t count)
{
    for (; count > 0 && a->row < a->rows; count--) {
        __builtin_prefetch(a->w + a->row * a->row_bytes + a->line * 64, 0, 2);
        if (++a->line == a->lines)
            a->row++, a->line = 0;
    }
}

/* the lines of a each of `slices` calls of prefetch_next takes, so that they cover it (no division
   for one call: one x row's tiles ask for it once a weight row) */
TD_INLINE int64_t ahead_slice(const struct ahead *a, int64_t slices)
{
    return slices <= 1 ? a->rows * a->lines : (a->rows * a->lines + slices - 1) / slices;
}

/* a's weights are panels made at load (F32P, F16P, BF16P) */
TD_INLINE int stored_panels(const struct mm *a) { return a->tt && a->tt->rows == TD_PANEL; }

/* the bytes of weight rows j0..j0+rows, numbers p0..p0+kc, as a region to prefetch (of a stored
   panel: the panel's k chunk, one run of bytes) */
TD_INLINE struct ahead weights_ahead(const struct mm *a, int64_t j0, int64_t rows, int64_t p0, int64_t kc)
{
    if (stored_panels(a))
        return (struct ahead){.w = (const char *)a->w + (j0 * a->k + p0 * TD_PANEL) * a->tt->type_size,
                              .lines = (kc * TD_PANEL * a->tt->type_size + 63) / 64, .rows = 1};
    const int64_t row_bytes = a->tt ? a->row_bytes : 4 * a->k;
    const int64_t per = a->tt ? a->tt->type_size : 4, blck = a->tt ? a->tt->blck_size : 1; /* bytes a block */
    return (struct ahead){.w = (const char *)a->w + j0 * row_bytes + p0 / blck * per, .row_bytes = row_bytes,
                          .lines = (kc / blck * per + 63) / 64, .rows = rows};
}

struct mm_kernels {
    td_range_fn rows, gemm;
    td_range_fn lanes, pack_x; /* the lane GEMM (matmul_isa.h) and its packing of x */
    int mr, nr; /* gemm register tile: MR x rows by NR output columns */
};

/* the lane GEMM of nw f32 weights of one x: their (panel, x chunk) items laid end to end and
   shared out as nbuf job tasks, task b packing its panels into buffer b */
struct lanes {
    struct mm a[TD_MATMULS_MAX];
    int64_t first[TD_MATMULS_MAX + 1]; /* weight j's items: [first[j], first[j+1]) */
    int64_t items, nbuf;
    float *xp;                         /* [padded rows][k] x packed by chains (pack_x_lanes), rows past n zero */
    float *wp;                         /* [nbuf][panel_floats] */
    int64_t panel_floats;              /* k * NR */
};

/* one number of a weight row, as f32 */
TD_INLINE float load1(const char *row, int64_t p, const enum td_type type)
{
    uint16_t h;
    if (type == TD_F32)
        return ((const float *)row)[p];
    memcpy(&h, row + 2 * p, 2);
    return type == TD_BF16 ? bf16_to_fp32(h) : fp16_to_fp32(h);
}

#if defined(__x86_64__)
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

/* 16 numbers of a weight row from number p on, as f32: f32 rows, or bf16 / f16 widened (exactly) */
TD_AVX512 TD_INLINE __m512 load16_avx512(const char *row, int64_t p, const enum td_type type)
{
    if (type == TD_F32)
        return _mm512_loadu_ps((const float *)row + p);
    __m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * p));
    return type == TD_BF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}

/* pack_w of the AVX-512 kernel (NR = 32) by 16x16 blocks (4x faster than element by element), from
   rows of f32, bf16 or f16 (row_bytes apart): 16-bit rows are widened in the registers the
   transpose takes, never written out as f32 rows first */
TD_AVX512 TD_INLINE void transpose_panel_avx512(const char *w, int64_t row_bytes, int64_t cols, int64_t kc, float *wp,
                                                const enum td_type type)
{
    int64_t p = 0;
    for (; p + 16 <= kc; p += 16)
        for (int64_t half = 0; half < 32; half += 16) {
            __m512 r[16];
            for (int64_t c = 0; c < 16; c++)
                r[c] = half + c < cols ? load16_avx512(w + (half + c) * row_bytes, p, type) : _mm512_setzero_ps();
            transpose16(r);
            for (int64_t j = 0; j < 16; j++)
                _mm512_storeu_ps(wp + (p + j) * 32 + half, r[j]);
        }
    for (; p < kc; p++)
        for (int64_t c = 0; c < 32; c++)
            wp[p * 32 + c] = c < cols ? load1(w + c * row_bytes, p, type) : 0.0f;
}

/* r[8] (8 rows of 8 floats) transposed in registers: unpack 32-bit, shuffle 64-bit, then swap 128-bit halves */
TD_AVX2 TD_INLINE void transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);     /* a0 b0 a1 b1 | a4 b4 a5 b5 */
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
    }
    for (int i = 0; i < 2; i++) { /* rows a-d, then e-h: u[4i+j] = columns j | j+4 of those rows */
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
        r[j + 4] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
}

/* 8 numbers of a weight row from number p on, as f32: f32 rows, or bf16 / f16 widened (exactly) */
TD_AVX2 TD_INLINE __m256 load8_avx2(const char *row, int64_t p, const enum td_type type)
{
    if (type == TD_F32)
        return _mm256_loadu_ps((const float *)row + p);
    __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * p));
    return type == TD_BF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                           : _mm256_cvtph_ps(h);
}

/* pack_w of the AVX2 kernel (NR = 16) by 8x8 blocks, as transpose_panel_avx512, from rows of f32,
   bf16 or f16 (row_bytes apart): 16-bit rows are widened in the registers the transpose takes,
   never written out as f32 rows first */
TD_AVX2 TD_INLINE void transpose_panel_avx2(const char *w, int64_t row_bytes, int64_t cols, int64_t kc, float *wp,
                                            const enum td_type type)
{
    int64_t p = 0;
    for (; p + 8 <= kc; p += 8)
        for (int64_t half = 0; half < 16; half += 8) {
            __m256 r[8];
            for (int64_t c = 0; c < 8; c++)
                r[c] = half + c < cols ? load8_avx2(w + (half + c) * row_bytes, p, type) : _mm256_setzero_ps();
            transpose8(r);
            for (int64_t j = 0; j < 8; j++)
                _mm256_storeu_ps(wp + (p + j) * 16 + half, r[j]);
        }
    for (; p < kc; p++)
        for (int64_t c = 0; c < 16; c++)
            wp[p * 16 + c] = c < cols ? load1(w + c * row_bytes, p, type) : 0.0f;
}
#endif

#define TD_ISA_FILE "matmul_isa.h"
#include "foreach_isa.h"

/* gemm: sets the x row chunks of a; returns the number of tasks */
static int64_t plan_gemm(const struct mm_kernels *kern, struct mm *a)
{
    /* enough tasks to keep every thread busy: split x rows too when there are few weight panels
       (no weight rows: no tasks); a panel is NR weight rows, or a stored one's TD_PANEL */
    const int64_t width = stored_panels(a) ? TD_PANEL : kern->nr;
    int64_t npanels = (a->m + width - 1) / width, want = 4 * (int64_t)td_get_threads();
    int64_t nchunks = npanels >= want || !npanels ? 1 : (want + npanels - 1) / npanels;
    int64_t chunk = (a->n + nchunks - 1) / nchunks;
    a->chunk = (chunk + kern->mr - 1) / kern->mr * kern->mr;
    a->nchunks = (a->n + a->chunk - 1) / a->chunk;
    return npanels * a->nchunks;
}

/* interleaved weights (tt->rows 8): weight rows [j0, j1), whole groups, by every x row, X_ROWS at
   a time (the groups stay in L1 for all of them) */
#define X_ROWS 16
static void matmul_groups_typed(const struct mm *a, int64_t j0, int64_t j1)
{
    float s[X_ROWS * ROWS_PER_TASK]; /* [x row][weight row j0..j1) */
    const int64_t rows = j1 - j0;
    for (int64_t i0 = 0; i0 < a->n; i0 += X_ROWS) {
        const int64_t nx = a->n - i0 < X_ROWS ? a->n - i0 : X_ROWS;
        a->tt->vec_dot_8xn(a->k, (const char *)a->w + j0 * a->row_bytes, rows / 8, 8 * a->row_bytes,
                           a->xc + i0 * a->xc_bytes, a->xc_bytes, nx, s, rows);
        for (int64_t i = 0; i < nx; i++)
            for (int64_t r = 0; r < rows; r++) {
                float *y = a->y + (i0 + i) * a->m + j0 + r;
                *y = a->acc ? *y + s[i * rows + r] : s[i * rows + r];
            }
    }
}

/* typed weights, few x rows: tasks [b, e) = weight rows [ROWS_PER_TASK*b, ROWS_PER_TASK*e), in
   tiles of 4 weight rows by up to 4 x rows where the type has them, else a row by a row */
static void matmul_rows_typed(void *ctx, int64_t b, int64_t e)
{
    const struct mm *a = ctx;
    int64_t j1 = e * ROWS_PER_TASK < a->m ? e * ROWS_PER_TASK : a->m;
    if (a->tt->rows > 1) { /* interleaved: groups of 8 rows, ROWS_PER_TASK a multiple of 8 */
        for (int64_t j = b * ROWS_PER_TASK; j < j1; j += ROWS_PER_TASK)
            matmul_groups_typed(a, j, j + ROWS_PER_TASK < j1 ? j + ROWS_PER_TASK : j1);
        return;
    }
    for (int64_t j = b * ROWS_PER_TASK; j < j1;) {
        const int rows = a->tt->vec_dot_4xn && j + 4 <= j1 ? 4 : 1;
        const char *w = (const char *)a->w + j * a->row_bytes;
        /* the cache lines of rows some way ahead, requested at once: vec_dot reads a row at a
           time, and its own loads alone keep too few misses in flight (Q8_0 streams 2x faster so);
           but not where the tile spreads them over its steps itself */
        for (int64_t p = 0; (td_amd || !a->tt->tile_ahead) && p < rows * a->row_bytes; p += 64)
            __builtin_prefetch(w + PREFETCH_BYTES + p);
        for (int64_t i = 0; i < a->n;) {
            const int nx = rows == 4 ? (a->n - i < 4 ? (int)(a->n - i) : 4) : 1;
            float s[4][4], *y = a->y + i * a->m + j; /* s[x row][weight row] */
            if (rows == 4)
                a->tt->vec_dot_4xn(a->k, w, a->row_bytes, a->xc + i * a->xc_bytes, a->xc_bytes, nx, s[0], 4);
            else
                s[0][0] = a->tt->vec_dot(a->k, w, a->xc + i * a->xc_bytes);
            for (int t = 0; t < nx; t++)
                for (int r = 0; r < rows; r++)
                    y[t * a->m + r] = a->acc ? y[t * a->m + r] + s[t][r] : s[t][r];
            i += nx;
        }
        j += rows;
    }
}

struct convert {
    const struct type_traits *tt;
    const float *x; /* [n,k] */
    char *xc;       /* [n] rows of xc_bytes: x in the dot product's type */
    int64_t xc_bytes, k;
    float *xf;      /* [n,k] xc widened back to f32, or NULL */
};

/* tasks [b, e) = x rows */
static void convert_rows(void *ctx, int64_t b, int64_t e)
{
    const struct convert *c = ctx;
    for (int64_t i = b; i < e; i++) {
        c->tt->from_float(c->x + i * c->k, c->xc + i * c->xc_bytes, c->k);
        if (c->xf)
            c->tt->x_to_float(c->xc + i * c->xc_bytes, c->xf + i * c->k, c->k);
    }
}

/* with the pool held: a's x rows converted (in pool scratch) to the type its weights' dot product
   wants, as a->xc, and for the GEMM widened back to f32, as a->x; 0, or -1 out of scratch memory */
static int convert_x(struct mm *a, int gemm)
{
    const struct type_traits *tt = a->tt;
    if (!tt->from_float)
        return 0;
    int64_t n = a->n, k = a->k, xc_bytes = k / tt->x_blck_size * tt->x_type_size;
    int64_t xf_at = (n * xc_bytes + 63) / 64 * 64;
    char *scratch = td_scratch(xf_at + (gemm ? n * k * 4 : 0));
    if (!scratch)
        return -1;
    struct convert c = {.tt = tt, .x = a->x, .xc = scratch, .xc_bytes = xc_bytes, .k = k,
                         .xf = gemm ? (float *)(scratch + xf_at) : NULL};
    td_parallel_run(convert_rows, &c, n, 8.0 * k);
    a->xc = scratch, a->xc_bytes = xc_bytes;
    if (gemm)
        a->x = c.xf;
    return 0;
}

/* Q8_0 and Q4_0 weights on AVX512_VNNI: the int8 GEMM, from GEMM_Q8_MIN_ROWS x rows; as Q8_0X8 and
   Q4_0X8, from GEMM_X8_MIN_ROWS (below it their own kernel, which brings a group from memory once
   for up to 16 x rows) */
static int int8_gemm(enum td_type type, int64_t n)
{
#if defined(__x86_64__)
    if (td_simd != TD_SIMD_AVX512 || !(td_simd_ext & TD_EXT_VNNI))
        return 0;
    if (type == TD_Q8_0X8 || type == TD_Q4_0X8)
        return n >= GEMM_X8_MIN_ROWS;
    return !td_batch_invariant && n >= GEMM_Q8_MIN_ROWS && (type == TD_Q8_0 || type == TD_Q4_0);
#else
    (void)type, (void)n;
    return 0;
#endif
}

/* below this many x rows the f32 register tiles beat packing the weights for the GEMM: 24, and on
   AMD 33 (a GEMM panel packs 32 weight rows at once, 32 streams of memory, which Zen 4's
   prefetchers serve worst: SmolLM2-135M f32 decoding 16 / 24 / 32 sequences 291-309 / 376-390 /
   428-437 t/s through the GEMM, 445-465 / 478-494 / 454-479 through the tiles; at 48 they are
   even, at 128 the GEMM is 1.15x). Elsewhere 24: on the Xeon (AVX-512, 2 threads, SmolLM2-135M's
   f32 matrices, batch invariant) the tiles take 6.3 / 16.5 / 17.1 / 539 us a row at 15 rows for
   q / gate / down / the LM head, the lane GEMM 6.4 / 15.5 / 19.6 / 759 at 16 and 5.1 / 13.0 / 15.7
   / 581 at 24 (16 made a 16-row pass of the model 2.3x a 12-row one). */
int64_t td_gemm_min_rows(void) { return td_amd ? 33 : 24; }

/* the f32 GEMM (typed weights widened to f32), from td_gemm_min_rows() x rows (f16 and bf16 from
   GEMM_16BIT_MIN_ROWS: a SmolLM2-135M-shaped bf16 model decodes 8 sequences 1.3-1.6x faster so,
   4 at 1.1-1.25x, AVX2); never the X8 types, whose int8 kernels beat it at any n (pp512 2.5k
   against 2.2k t/s, stories42M Q4_0, AVX2) */
static int f32_gemm(enum td_type type, int64_t n)
{
    if (type == TD_F32P || type == TD_F16P || type == TD_BF16P) /* only the GEMM reads them */
        return 1;
    if (td_batch_invariant)
        return 0;
    if (type == TD_F16 || type == TD_BF16)
        return n >= GEMM_16BIT_MIN_ROWS;
    return n >= td_gemm_min_rows() && (type == TD_F32 || td_type_traits(type)->rows == 1);
}

struct mms {
    struct mm a[TD_MATMULS_MAX];
    int64_t first[TD_MATMULS_MAX + 1]; /* weight j's tasks: [first[j], first[j+1]) of the job */
    int64_t nw;
    td_range_fn rows;                  /* the kernel of the weights' type: few-rows, or the GEMM */
};

/* tasks [b, e) of the weights' tasks laid end to end: each part run on its own weight */
static void matmuls_rows(void *ctx, int64_t b, int64_t e)
{
    struct mms *s = ctx;
    td_run_end_to_end(s->rows, s->a, sizeof s->a[0], s->first, s->nw, b, e);
}

/* ys[j] = x @ ws[j]^T by the f32 GEMM for nw weights of one type as one job: x converted to the
   weights' dot product type and widened back once for all, every weight's (panel, x chunk) tasks
   laid end to end (q/k/v, gate/up: one pool round trip, not one a weight, and no thread idle while
   the last panels of one weight finish alone); 0, or -1 out of scratch memory */
static int f32_gemms(enum td_type type, const float *x, int64_t n, int64_t k, int64_t nw, void **ws, float **ys,
                     const int64_t *ms, int acc)
{
    const struct mm_kernels *kern = TD_PICK(matmul_kernels);
    const struct type_traits *tt = type == TD_F32 ? NULL : td_type_traits(type);
    struct mms s = {.nw = nw, .rows = kern->gemm};
    for (int64_t j = 0; j < nw; j++) {
        s.a[j] = (struct mm){.x = x, .w = ws[j], .y = ys[j], .n = n, .k = k, .m = ms[j], .nchunks = 1, .type = type,
                             .tt = tt, .row_bytes = tt ? k / tt->blck_size * tt->type_size : 4 * k, .acc = acc};
        s.first[j + 1] = s.first[j] + plan_gemm(kern, &s.a[j]);
    }
    td_pool_enter();
    if (tt && convert_x(&s.a[0], 1)) {
        td_pool_leave();
        return -1;
    }
    for (int64_t j = 1; j < nw; j++) /* x converted once for all */
        s.a[j].x = s.a[0].x;
    td_parallel_run(matmuls_rows, &s, s.first[nw], 2.0 * kern->nr * k * s.a[0].chunk);
    td_pool_leave();
    return 0;
}

/* f32, f16 or bf16 rows: the few-rows tiles read them all (matmul_isa.h), x as it is */
static int float_rows(enum td_type type) { return type == TD_F32 || type == TD_F16 || type == TD_BF16; }

/* the lane GEMM: f32, f16 and bf16 rows from td_gemm_min_rows() x rows, when batch invariant */
static int lane_gemm(enum td_type type, int64_t n)
{
    return td_batch_invariant && float_rows(type) && n >= td_gemm_min_rows();
}

/* ys[j] (+)= x @ ws[j]^T for nw weights of one of the float_rows types by the lane GEMM, each
   output summed as the few-rows tiles sum it; 0, or -1 out of scratch memory */
static int lane_gemms(enum td_type type, const float *x, int64_t n, int64_t k, int64_t nw, void **ws, float **ys,
                      const int64_t *ms, int acc)
{
    const struct mm_kernels *kern = TD_PICK(matmul_kernels);
    struct lanes g = {.panel_floats = k * kern->nr};
    double flops = 0.0;
    for (int64_t j = 0; j < nw; j++) {
        g.a[j] = (struct mm){.x = x, .w = ws[j], .y = ys[j], .n = n, .k = k, .m = ms[j], .nchunks = 1, .type = type,
                             .tt = type == TD_F32 ? NULL : td_type_traits(type),
                             .row_bytes = (type == TD_F32 ? 4 : 2) * k, .acc = acc};
        g.first[j + 1] = g.first[j] + plan_gemm(kern, &g.a[j]);
        flops += 2.0 * n * k * ms[j];
    }
    g.items = g.first[nw];
    g.nbuf = g.items < td_get_threads() ? g.items : td_get_threads();
    const int64_t full = n / kern->mr * kern->mr, padded = full + (n - full + 3) / 4 * 4; /* MR_REST is 4 */
    const int64_t xp_floats = padded * k;
    td_pool_enter();
    float *scratch = td_scratch(4 * (xp_floats + g.nbuf * g.panel_floats));
    if (!scratch) {
        td_pool_leave();
        return -1;
    }
    g.xp = scratch, g.wp = scratch + xp_floats;
    td_parallel_run(kern->pack_x, &g, padded, 2.0 * k);
    td_parallel_run(kern->lanes, &g, g.nbuf, flops / (double)g.nbuf);
    td_pool_leave();
    return 0;
}

/* y = x @ w^T for float_rows weights (a): by the lane GEMM from its rows, else by the few-rows
   tiles; the same numbers either way (so also where the lane GEMM has no memory) */
static void matmul_float(const struct mm *a)
{
    void *w = (void *)a->w;
    float *y = a->y;
    if (lane_gemm(a->type, a->n) && !lane_gemms(a->type, a->x, a->n, a->k, 1, &w, &y, &a->m, 0))
        return;
    td_parallel_for(TD_PICK(matmul_kernels)->rows, (void *)a, (a->m + ROWS_PER_TASK - 1) / ROWS_PER_TASK,
                    2.0 * ROWS_PER_TASK * a->k * a->n);
}

void td_matmul_f32(const float *x, const float *w, float *y, int64_t n, int64_t k, int64_t m)
{
    struct mm a = {.x = x, .w = w, .y = y, .n = n, .k = k, .m = m, .nchunks = 1, .type = TD_F32};
    if (n == 0 || m == 0)
        return;
    if (k == 0) {
        memset(y, 0, sizeof(float) * n * m);
        return;
    }
    if (f32_gemm(TD_F32, n))
        f32_gemms(TD_F32, x, n, k, 1, (void **)&w, &y, &m, 0); /* (f32: no x to convert, it cannot fail) */
    else
        matmul_float(&a);
}

static int matmul_typed(enum td_type type, const float *x, const void *w, float *y, int64_t n, int64_t k, int64_t m)
{
    const struct type_traits *tt = td_type_traits(type);
    struct mm a = {.x = x, .w = w, .y = y, .n = n, .k = k, .m = m, .nchunks = 1, .type = type, .tt = tt,
                   .row_bytes = k / tt->blck_size * tt->type_size, .xc = (const char *)x, .xc_bytes = 4 * k};
    if (n == 0 || m == 0)
        return 0;
    if (k == 0) {
        memset(y, 0, sizeof(float) * n * m);
        return 0;
    }
#if defined(__x86_64__)
    if (int8_gemm(type, n))
        return td_gemm_q8_vnni(type, x, n, k, 1, (void **)&w, &y, &m);
#endif
    if (f32_gemm(type, n))
        return f32_gemms(type, x, n, k, 1, (void **)&w, &y, &m, 0);
    if (float_rows(type)) {
        matmul_float(&a);
        return 0;
    }
    td_pool_enter();
    if (convert_x(&a, 0)) {
        td_pool_leave();
        return -1;
    }
    td_parallel_run(matmul_rows_typed, &a, (m + ROWS_PER_TASK - 1) / ROWS_PER_TASK, 2.0 * ROWS_PER_TASK * k * n);
    td_pool_leave();
    return 0;
}

/* y[n,m] (+)= x @ w^T on the many-rows paths. y is added to the finished product, as on the few-rows
   path: by the f32 GEMM's tiles where one k chunk holds it (o_proj of a small model), else through
   a temporary; 0, or -1 out of memory (y untouched) */
static int matmul_one(enum td_type type, const float *x, const void *w, float *y, int64_t n, int64_t k, int64_t m,
                      int acc)
{
    if (acc && k > 0 && k <= KC && f32_gemm(type, n) && !int8_gemm(type, n))
        return f32_gemms(type, x, n, k, 1, (void **)&w, &y, &m, 1);
    float *t = acc ? malloc(sizeof(float) * (size_t)(n * m > 0 ? n * m : 1)) : y;
    if (!t)
        return -1;
    int r = 0;
    if (type == TD_F32)
        td_matmul_f32(x, w, t, n, k, m);
    else
        r = matmul_typed(type, x, w, t, n, k, m);
    if (acc) {
        for (int64_t i = 0; !r && i < n * m; i++)
            y[i] += t[i];
        free(t);
    }
    return r;
}

/* td_matmuls for up to TD_MATMULS_MAX weights of one type */
static int matmuls_of_type(enum td_type type, const float *x, int64_t n, int64_t k, int64_t nw, void **ws,
                           float **ys, const int64_t *ms, int accumulate)
{
#if defined(__x86_64__)
    if (n > 0 && k > 0 && int8_gemm(type, n) && !accumulate) /* one job, x quantized once */
        return td_gemm_q8_vnni(type, x, n, k, nw, ws, ys, ms);
#endif
    if (n > 0 && k > 0 && lane_gemm(type, n) && !lane_gemms(type, x, n, k, nw, ws, ys, ms, accumulate))
        return 0; /* (no memory for it: the few-rows tiles below, the same numbers) */
    if (n > 0 && k > 0 && f32_gemm(type, n) && !accumulate) /* one job, x converted once */
        return f32_gemms(type, x, n, k, nw, ws, ys, ms, 0);
    if (n == 0 || k == 0 || f32_gemm(type, n) || int8_gemm(type, n)) { /* one after the other */
        for (int64_t j = 0; j < nw; j++)
            if (matmul_one(type, x, ws[j], ys[j], n, k, ms[j], accumulate))
                return -1;
        return 0;
    }
    const struct type_traits *tt = type == TD_F32 ? NULL : td_type_traits(type);
    struct mms s = {.nw = nw, .rows = float_rows(type) ? TD_PICK(matmul_kernels)->rows : matmul_rows_typed};
    for (int64_t j = 0; j < nw; j++) {
        s.a[j] = (struct mm){.x = x, .w = ws[j], .y = ys[j], .n = n, .k = k, .m = ms[j], .nchunks = 1, .type = type,
                             .tt = tt, .row_bytes = tt ? k / tt->blck_size * tt->type_size : 0,
                             .xc = (const char *)x, .xc_bytes = 4 * k, .acc = accumulate};
        s.first[j + 1] = s.first[j] + (ms[j] + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
    }
    td_pool_enter();
    if (tt && convert_x(&s.a[0], 0)) {
        td_pool_leave();
        return -1;
    }
    for (int64_t j = 1; j < nw; j++) /* x converted once for all */
        s.a[j].xc = s.a[0].xc, s.a[j].xc_bytes = s.a[0].xc_bytes;
    td_parallel_run(matmuls_rows, &s, s.first[nw], 2.0 * ROWS_PER_TASK * k * n);
    td_pool_leave();
    return 0;
}

int td_matmuls(const enum td_type *types, const float *x, int64_t n, int64_t k, int64_t nw, void **ws, float **ys,
               const int64_t *ms, int accumulate)
{
    for (int64_t j = 0; j < nw; j++) {
        int64_t i = 0;
        while (types[i] != types[j]) /* done already, with the first weight of its type? */
            i++;
        if (i < j)
            continue;
        void *w[TD_MATMULS_MAX];        /* the weights of this type, in order, TD_MATMULS_MAX at a time */
        float *y[TD_MATMULS_MAX];
        int64_t m[TD_MATMULS_MAX], count = 0;
        for (i = j; i < nw; i++) {
            if (types[i] == types[j])
                w[count] = ws[i], y[count] = ys[i], m[count++] = ms[i];
            if (count == TD_MATMULS_MAX || (i == nw - 1 && count)) {
                if (matmuls_of_type(types[j], x, n, k, count, w, y, m, accumulate))
                    return -1;
                count = 0;
            }
        }
    }
    return 0;
}
