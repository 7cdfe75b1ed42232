/* gemm_q8.c: y[n,m] = x[n,k] @ w[m,k]^T for Q8_0 and Q4_0 weights (as rows, or as Q8_0X8 and
   Q4_0X8 groups), in int8 on AVX512_VNNI.

   x rows are quantized to Q8_0 once, as the few-rows path does (so a row's result does not depend
   on the path), keeping each block's scale d_x and the sum of its quants beside them. A panel of
   NR weight rows by KB blocks is packed so one zmm holds four consecutive weights of 16 rows as
   unsigned bytes (Q8_0: q + 128; Q4_0: the nibble, i.e. q + 8): vpdpbusd multiplies them by four
   x quants broadcast to every lane and adds the four products into each row's int32 lane, 64
   multiply-adds an instruction where an f32 FMA does 16. The offset is taken back once per block
   by starting the int32 sums at -offset * (sum of the x block's quants). At a block's end the sums
   are exact; they are scaled by d_x * d_w into f32 accumulators. An MR x NR register tile of x
   rows by weight rows sweeps the panel as in matmul.c.

   The panels are packed at every call: from rows as the file has them, 16 rows at a time by a
   transpose in registers, about the time vec_dot takes to read the same weights, so from 4 x rows
   the GEMM beats the few-rows tiles (SmolLM2-135M's matrices, one thread: 4 rows 152 us against
   the tiles' 240; packed row by row it was 347); from Q8_0X8 and Q4_0X8 (quant.h), whose runs of
   32 bytes are already 8 rows' lanes of 4 quants, by copying them (Q4_0X8's nibbles taken apart).
   A tile's sums start from what y holds after the panels before it, so each is one chain of fmas
   in block order: the X8 kernels' and x8_vec_dot_ref's result to the bit. */
#include "quant.h"

#if defined(__x86_64__)
#define NR 32 /* weight rows per panel: two zmm of int32 lanes */
#define MR 4  /* x rows per tile: 2*MR int32 sums and 2*MR f32 sums in registers; 4, not 6: a batch
                 of 8 decoding sequences is two whole tiles (6 wasted a third of the work) */
#define KB 8  /* blocks per panel (256 numbers): 8 KiB of packed bytes, L1-sized */

struct gq {
    const float *x;        /* [n,k] */
    const void *w;         /* [m][nb] Q8_0 or Q4_0 blocks, or [m/8][nb] groups of 8 rows' (X8) */
    float *y;              /* [n,m] */
    int64_t n, k, m, nb;
    enum td_type type;
    int64_t chunk, nchunks; /* x rows per task (a multiple of MR); tasks per panel */
    block_q8_0 *xq;        /* [n][nb] x quantized */
    float *xd;             /* [n][nb] each x block's scale in f32 */
    int32_t *start;        /* [n][nb] where each x block's int32 sums start: -offset * its quants' sum */
};

/* Q4_0 or Q4_0X8 (else Q8_0 or Q8_0X8) */
static int q4_type(enum td_type type)
{
    return type == TD_Q4_0 || type == TD_Q4_0X8;
}

/* the bytes of one weight block (of a row; an X8 group's block is 8 of them) */
static int64_t block_bytes(const struct gq *a)
{
    return q4_type(a->type) ? sizeof(block_q4_0) : sizeof(block_q8_0);
}

/* rows interleaved by 8 (quant.h's X8 types) */
static int x8_type(enum td_type type)
{
    return type == TD_Q8_0X8 || type == TD_Q4_0X8;
}

/* tasks [b, e) = x rows */
static void quantize_x(void *ctx, int64_t b, int64_t e)
{
    const struct gq *a = ctx;
    from_float_fn quantize = td_type_traits(TD_Q8_0)->from_float;
    for (int64_t i = b; i < e; i++) {
        quantize(a->x + i * a->k, a->xq + i * a->nb, a->k);
        for (int64_t j = i * a->nb; j < (i + 1) * a->nb; j++) {
            int32_t s = 0;
            for (int q = 0; q < QK8_0; q++)
                s += a->xq[j].qs[q];
            a->xd[j] = fp16_to_fp32(a->xq[j].d);
            a->start[j] = -(q4_type(a->type) ? 8 : 128) * s;
        }
    }
}

/* wq[nbk][8][NR][4]: weights 4g..4g+3 of block b of each of the panel's rows, as unsigned bytes;
   wd[nbk][NR]: the rows' block scales. Rows past cols are zero (scale 0: they add nothing).
   This is the readable packing; pack16 below does the same for 16 whole rows at a time. */
static void pack_rows(const struct gq *a, int64_t j0, int64_t c0, int64_t c1, int64_t cols, int64_t b0, int64_t nbk,
                      uint8_t *wq, float *wd)
{
    for (int64_t c = c0; c < c1; c++)
        for (int64_t b = 0; b < nbk; b++) {
            uint32_t q[8] = {0}; /* four weights a word */
            float d = 0.0f;
            if (c < cols && a->type == TD_Q8_0) {
                const block_q8_0 *blk = (const block_q8_0 *)a->w + (j0 + c) * a->nb + b0 + b;
                d = fp16_to_fp32(blk->d);
                memcpy(q, blk->qs, sizeof q);
                for (int g = 0; g < 8; g++)
                    q[g] ^= 0x80808080u; /* q + 128 in each byte */
            } else if (c < cols) {
                const block_q4_0 *blk = (const block_q4_0 *)a->w + (j0 + c) * a->nb + b0 + b;
                d = fp16_to_fp32(blk->d);
                memcpy(q, blk->qs, sizeof blk->qs);
                for (int g = 0; g < 4; g++) {
                    q[g + 4] = (q[g] >> 4) & 0x0F0F0F0Fu; /* weights 16..31: the high nibbles */
                    q[g] &= 0x0F0F0F0Fu;
                }
            }
            wd[b * NR + c] = d;
            for (int g = 0; g < 8; g++)
                memcpy(wq + ((b * 8 + g) * NR + c) * 4, &q[g], 4);
        }
}

/* z[p] holds words 0..3 of rows 4p..4p+3 (lane 4r + g: row 4p + r, word g). Two rounds of "even
   lanes of z[p] ++ z[q], then odd lanes" (q = p with one bit set) leave z[g] = word g of the 16
   rows, lane = row: the transpose that puts rows in lanes, 8 two-source permutes. */
TD_AVX512_VNNI TD_INLINE void rows_to_lanes(__m512i z[4])
{
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int bit = 1; bit <= 2; bit <<= 1)
        for (int p = 0; p < 4; p++)
            if (!(p & bit)) {
                const __m512i a = z[p], b = z[p | bit];
                z[p] = _mm512_permutex2var_epi32(a, even, b);
                z[p | bit] = _mm512_permutex2var_epi32(a, odd, b);
            }
}

/* 16 bytes at byte `at` of 4 rows' block b, row_bytes apart, in one zmm: row r in lanes 4r..4r+3 */
TD_AVX512_VNNI TD_INLINE __m512i load4(const char *p, int64_t row_bytes)
{
    __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p + row_bytes)), 1);
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p + 2 * row_bytes)), 2);
    return _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p + 3 * row_bytes)), 3);
}

/* pack_rows for rows c0..c0+15, all of them rows of the weights: the same bytes, transposed in
   registers (scalar packing took 3x as long as the tiles' own work at 4-16 x rows) */
TD_AVX512_VNNI static void pack16(const struct gq *a, int64_t j0, int64_t c0, int64_t b0, int64_t nbk, uint8_t *wq,
                                  float *wd)
{
    const int64_t bytes = block_bytes(a), row_bytes = a->nb * bytes;
    const __m512i low = _mm512_set1_epi8(15), x80 = _mm512_set1_epi8((char)0x80);
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)row_bytes));
    for (int64_t b = 0; b < nbk; b++) {
        const char *blk = (const char *)a->w + (j0 + c0) * row_bytes + (b0 + b) * bytes; /* row c0's block */
        __m512i lo[4], hi[4];                                                             /* words 0-3, 4-7 */
        for (int p = 0; p < 4; p++) {
            const char *at = blk + 4 * p * row_bytes + 2; /* past the scale */
            if (a->type == TD_Q8_0) {
                lo[p] = _mm512_xor_si512(load4(at, row_bytes), x80);
                hi[p] = _mm512_xor_si512(load4(at + 16, row_bytes), x80);
            } else {
                const __m512i q = load4(at, row_bytes);
                lo[p] = _mm512_and_si512(q, low);
                hi[p] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
            }
        }
        rows_to_lanes(lo);
        rows_to_lanes(hi);
        for (int g = 0; g < 4; g++) {
            _mm512_store_si512(wq + ((b * 8 + g) * NR + c0) * 4, lo[g]);
            _mm512_store_si512(wq + ((b * 8 + g + 4) * NR + c0) * 4, hi[g]);
        }
        const __m512i d = _mm512_i32gather_epi32(rows, blk, 1); /* each row's scale in its low half */
        _mm512_store_ps(wd + b * NR + c0, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d)));
    }
}

/* pack_rows from X8 groups (cols a multiple of 8): run h of a Q8_0X8 block is word h of its 8 rows,
   lane = row, as the panel holds them; a Q4_0X8 run h holds words h (low nibbles) and h + 4 (high) */
TD_AVX512_VNNI static void pack_x8(const struct gq *a, int64_t j0, int64_t cols, int64_t b0, int64_t nbk,
                                   uint8_t *wq, float *wd)
{
    const int q4 = q4_type(a->type);
    const int64_t bytes = 8 * block_bytes(a), group_bytes = a->nb * bytes;
    const __m256i low = _mm256_set1_epi8(15), x80 = _mm256_set1_epi8((char)0x80);
    for (int64_t c = 0; c < NR; c += 8)
        for (int64_t b = 0; b < nbk; b++) {
            float *d = wd + b * NR + c;
            uint8_t *q = wq + (b * 8 * NR + c) * 4; /* word g at q + g * NR * 4 */
            if (c >= cols) {                         /* past the matrix: zero scales add nothing */
                memset(d, 0, 8 * sizeof(float));
                for (int g = 0; g < 8; g++)
                    memset(q + g * NR * 4, 0, 32);
                continue;
            }
            const char *blk = (const char *)a->w + (j0 + c) / 8 * group_bytes + (b0 + b) * bytes;
            _mm256_store_ps(d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk))); /* d[8] */
            for (int g = 0; g < (q4 ? 4 : 8); g++) {
                const __m256i run = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * g));
                if (!q4) {
                    _mm256_store_si256((__m256i *)(q + g * NR * 4), _mm256_xor_si256(run, x80));
                    continue;
                }
                _mm256_store_si256((__m256i *)(q + g * NR * 4), _mm256_and_si256(run, low));
                _mm256_store_si256((__m256i *)(q + (g + 4) * NR * 4), _mm256_and_si256(_mm256_srli_epi16(run, 4), low));
            }
        }
}

/* the panel of weight rows j0..j0+cols: whole 16-row halves by pack16, the rest by pack_rows; or
   from X8 groups */
TD_AVX512_VNNI static void pack_panel(const struct gq *a, int64_t j0, int64_t cols, int64_t b0, int64_t nbk,
                                      uint8_t *wq, float *wd)
{
    if (x8_type(a->type)) {
        pack_x8(a, j0, cols, b0, nbk, wq, wd);
        return;
    }
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16)
        pack16(a, j0, c, b0, nbk, wq, wd);
    pack_rows(a, j0, c, NR, cols, b0, nbk, wq, wd);
}

/* y[0:rows, 0:NR] (+)= x rows i.. times the packed panel (blocks b0..b0+nbk), the sums continued
   from y's (add). Past `rows` the tile repeats the last row (computed, not stored), so one compiled
   tile serves every edge. */
TD_AVX512_VNNI TD_INLINE void tile(const struct gq *a, int64_t i, int64_t rows, int64_t b0, int64_t nbk,
                                   const uint8_t *wq, const float *wd, float *y, int64_t ldy, int add)
{
    __m512 acc[MR][2];
    int64_t xrow[MR]; /* block index of each tile row's block b0 */
    for (int r = 0; r < MR; r++) { /* the sums so far (rows past `rows`: the last one's) */
        const float *yr = y + (r < rows ? r : rows - 1) * ldy;
        acc[r][0] = add ? _mm512_loadu_ps(yr) : _mm512_setzero_ps();
        acc[r][1] = add ? _mm512_loadu_ps(yr + 16) : _mm512_setzero_ps();
        xrow[r] = (i + (r < rows ? r : rows - 1)) * a->nb + b0;
    }
    for (int64_t b = 0; b < nbk; b++) {
        __m512i s[MR][2];
        const int8_t *xq[MR]; /* the tile rows' quants of block b */
        for (int r = 0; r < MR; r++) {
            s[r][0] = s[r][1] = _mm512_set1_epi32(a->start[xrow[r] + b]); /* a load, not a multiply */
            xq[r] = a->xq[xrow[r] + b].qs;
        }
        for (int g = 0; g < 8; g++) {
            const __m512i w0 = _mm512_load_si512(wq + (b * 8 + g) * NR * 4);
            const __m512i w1 = _mm512_load_si512(wq + (b * 8 + g) * NR * 4 + 64);
            for (int r = 0; r < MR; r++) {
                int32_t four;
                memcpy(&four, xq[r] + 4 * g, 4);
                const __m512i xv = _mm512_set1_epi32(four);
                s[r][0] = _mm512_dpbusd_epi32(s[r][0], w0, xv);
                s[r][1] = _mm512_dpbusd_epi32(s[r][1], w1, xv);
            }
        }
        const __m512 d0 = _mm512_load_ps(wd + b * NR), d1 = _mm512_load_ps(wd + b * NR + 16);
        for (int r = 0; r < MR; r++) {
            const __m512 dx = _mm512_set1_ps(a->xd[xrow[r] + b]);
            acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][0]), _mm512_mul_ps(d0, dx), acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][1]), _mm512_mul_ps(d1, dx), acc[r][1]);
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm512_storeu_ps(y + r * ldy, acc[r][0]);
        _mm512_storeu_ps(y + r * ldy + 16, acc[r][1]);
    }
}

/* The weights pack_panel will read AHEAD panels of KB blocks after this one (blocks b0.. of task
   t's rows; past a row's last block, the next task's), requested into L2 while this one is packed
   and its tiles run: 32 rows are 32 streams, more than the hardware prefetcher follows, and
   without it the tiles' work and the weights' reading take turns instead of overlapping. */
#define AHEAD 2
static void prefetch_ahead(const struct gq *a, int64_t t, int64_t b0, int64_t e)
{
    const int64_t bytes = block_bytes(a), row_bytes = a->nb * bytes;
    const int64_t per_row = (a->nb + KB - 1) / KB; /* panels of KB blocks a row */
    int64_t step = b0 / KB + AHEAD;
    t += step / per_row, b0 = step % per_row * KB;
    if (t >= e)
        return;
    const int64_t j0 = t / a->nchunks * NR, cols = a->m - j0 < NR ? a->m - j0 : NR;
    const int64_t span = (a->nb - b0 < KB ? a->nb - b0 : KB) * bytes;
    const int64_t unit = x8_type(a->type) ? 8 : 1; /* rows whose blocks lie side by side */
    for (int64_t c = 0; c < cols; c += unit) /* (an X8 group's blocks: unit x the bytes, unit x the rows) */
        for (int64_t p = 0; p < unit * span; p += 64)
            __builtin_prefetch((const char *)a->w + (j0 + c) * row_bytes + unit * b0 * bytes + p, 0, 2);
}

/* tasks [b, e): task t is weight panel t / nchunks times x row chunk t % nchunks */
TD_AVX512_VNNI static void gemm_range(void *ctx, int64_t b, int64_t e)
{
    const struct gq *a = ctx;
    uint8_t wq[KB * 8 * NR * 4] __attribute__((aligned(64))); /* [KB][8][NR][4] packed panel */
    float wd[KB * NR] __attribute__((aligned(64)));           /* [KB][NR] its scales */
    float yt[MR * NR];                                        /* [MR][NR] a tile cut by the last panel */
    for (int64_t t = b; t < e; t++) {
        int64_t j0 = t / a->nchunks * NR, cols = a->m - j0 < NR ? a->m - j0 : NR;
        int64_t i0 = t % a->nchunks * a->chunk, i1 = i0 + a->chunk < a->n ? i0 + a->chunk : a->n;
        for (int64_t b0 = 0; b0 < a->nb; b0 += KB) {
            int64_t nbk = a->nb - b0 < KB ? a->nb - b0 : KB;
            pack_panel(a, j0, cols, b0, nbk, wq, wd);
            prefetch_ahead(a, t, b0, e);
            for (int64_t i = i0; i < i1; i += MR) {
                int64_t rows = i1 - i < MR ? i1 - i : MR;
                float *y = a->y + i * a->m + j0;
                if (cols == NR) {
                    tile(a, i, rows, b0, nbk, wq, wd, y, a->m, b0 > 0);
                    continue;
                }
                for (int64_t r = 0; r < rows && b0 > 0; r++)
                    memcpy(yt + r * NR, y + r * a->m, sizeof(float) * cols);
                tile(a, i, rows, b0, nbk, wq, wd, yt, NR, b0 > 0);
                for (int64_t r = 0; r < rows; r++)
                    memcpy(y + r * a->m, yt + r * NR, sizeof(float) * cols);
            }
        }
    }
}

struct gqs {
    struct gq a[TD_MATMULS_MAX];
    int64_t first[TD_MATMULS_MAX + 1]; /* weight j's tasks: [first[j], first[j+1]) of the job */
    int64_t nw;
};

/* tasks [b, e) of the weights' tasks laid end to end: each part run on its own weight */
TD_AVX512_VNNI static void gemms_range(void *ctx, int64_t b, int64_t e)
{
    struct gqs *s = ctx;
    td_run_end_to_end(gemm_range, s->a, sizeof s->a[0], s->first, s->nw, b, e);
}

int td_gemm_q8_vnni(enum td_type type, const float *x, int64_t n, int64_t k, int64_t nw, void **ws, float **ys,
                    const int64_t *ms)
{
    struct gqs s = {.nw = nw};
    const int64_t nb = k / QK8_0, xq_bytes = (n * nb * (int64_t)sizeof(block_q8_0) + 63) / 64 * 64;
    if (nw > TD_MATMULS_MAX)
        return -1;
    td_pool_enter();
    char *scratch = td_scratch(xq_bytes + n * nb * 8);
    if (!scratch) {
        td_pool_leave();
        return -1;
    }
    for (int64_t j = 0; j < nw; j++) {
        struct gq *a = &s.a[j];
        *a = (struct gq){.x = x, .w = ws[j], .y = ys[j], .n = n, .k = k, .m = ms[j], .nb = nb, .type = type,
                         .xq = (block_q8_0 *)scratch, .xd = (float *)(scratch + xq_bytes)};
        a->start = (int32_t *)(a->xd + n * nb);
        /* enough tasks to keep every thread busy: split x rows too when there are few weight
           panels, unless there are few x rows (a decoding batch), whose tiles are cheap next to
           the packing each chunk would repeat */
        int64_t npanels = (a->m + NR - 1) / NR, want = 4 * (int64_t)td_get_threads(); /* (no rows: none) */
        int64_t nchunks = npanels >= want || n <= 4 * MR || !npanels ? 1 : (want + npanels - 1) / npanels;
        a->chunk = ((n + nchunks - 1) / nchunks + MR - 1) / MR * MR;
        a->nchunks = (n + a->chunk - 1) / a->chunk;
        s.first[j + 1] = s.first[j] + npanels * a->nchunks;
    }
    td_parallel_run(quantize_x, &s.a[0], n, 8.0 * k); /* x quantized once for all the weights */
    td_parallel_run(gemms_range, &s, s.first[nw], 2.0 * NR * k * s.a[0].chunk);
    td_pool_leave();
    return 0;
}
#endif
