/* quant_ref.c: every weight type's row functions in plain C, the reference the other levels are
   pinned to (ggml-quants.c's role): weights to f32, an x row to the type its dot product wants,
   the dot product of a weight row with a converted x row, and the table of them, td_traits_c,
   which is what every level runs where its own file (quant_x86.c, quant_arm.c) names nothing
   faster (quant.c merges the tables).

   f16, bf16, Q8_0 and Q4_0 come from quant_isa.h's plain-C instance (suffix _c: one source for
   every instruction set, see there); the X8 types' readable kernels and the panel types' rows are
   here in plain C only (suffix _ref where a level has its own). */
#include <math.h>
#include "quant.h"

/* ---- Q8_0X8 and Q4_0X8 (quant.h): the readable kernels, for every instruction set without its own ---- */

/* row `lane`'s quant j (0..31) of a group's block */
TD_INLINE int q8_0x8_quant(const block_q8_0x8 *b, int lane, int j) { return b->qs[32 * (j / 4) + 4 * lane + j % 4]; }

TD_INLINE int q4_0x8_quant(const block_q4_0x8 *b, int lane, int j) /* nibble - 8 */
{
    const uint8_t byte = b->qs[32 * (j % 16 / 4) + 4 * lane + j % 4];
    return (j < 16 ? byte & 15 : byte >> 4) - 8;
}

/* ---- F32P, F16P and BF16P (quant.h): row `lane` of a panel, numbers p TD_PANEL apart ---- */

static void f32p_to_float_lane(const void *w, int lane, float *y, int64_t k)
{
    for (int64_t p = 0; p < k; p++)
        y[p] = ((const float *)w)[p * TD_PANEL + lane];
}

static void f16p_to_float_lane(const void *w, int lane, float *y, int64_t k)
{
    for (int64_t p = 0; p < k; p++)
        y[p] = fp16_to_fp32(((const td_fp16_t *)w)[p * TD_PANEL + lane]);
}

static void bf16p_to_float_lane(const void *w, int lane, float *y, int64_t k)
{
    for (int64_t p = 0; p < k; p++)
        y[p] = bf16_to_fp32(((const td_bf16_t *)w)[p * TD_PANEL + lane]);
}

/* to_float_lane and vec_dot_8xn (quant.h) of each type, written once: q4 a constant after inlining */
TD_INLINE void x8_to_float_lane(const int q4, const void *w, int lane, float *y, int64_t k)
{
    const size_t bytes = q4 ? sizeof(block_q4_0x8) : sizeof(block_q8_0x8);
    for (int64_t i = 0; i < k / QK8_0; i++) {
        const void *b = (const char *)w + i * bytes;
        const float d = fp16_to_fp32(q4 ? ((const block_q4_0x8 *)b)->d[lane] : ((const block_q8_0x8 *)b)->d[lane]);
        for (int j = 0; j < QK8_0; j++)
            y[i * QK8_0 + j] = d * (float)(q4 ? q4_0x8_quant(b, lane, j) : q8_0x8_quant(b, lane, j));
    }
}

TD_INLINE void x8_vec_dot_ref(const int q4, int64_t k, const void *w, int64_t ngroups, int64_t group_bytes,
                              const void *x, int64_t x_bytes, int64_t nx, float *y, int64_t ldy)
{
    const size_t bytes = q4 ? sizeof(block_q4_0x8) : sizeof(block_q8_0x8);
    for (int64_t i = 0; i < nx; i++)
        for (int64_t g = 0; g < ngroups; g++)
            for (int r = 0; r < 8; r++) {
                const block_q8_0 *xb = (const block_q8_0 *)((const char *)x + i * x_bytes);
                float acc = 0.0f;
                for (int64_t b = 0; b < k / QK8_0; b++) {
                    const void *wb = (const char *)w + g * group_bytes + b * bytes;
                    int sumi = 0;
                    for (int j = 0; j < QK8_0; j++)
                        sumi += (q4 ? q4_0x8_quant(wb, r, j) : q8_0x8_quant(wb, r, j)) * xb[b].qs[j];
                    const td_fp16_t dw = q4 ? ((const block_q4_0x8 *)wb)->d[r] : ((const block_q8_0x8 *)wb)->d[r];
                    acc = fmaf((float)sumi, fp16_to_fp32(dw) * fp16_to_fp32(xb[b].d), acc);
                }
                y[i * ldy + 8 * g + r] = acc;
            }
}

static void q8_0x8_to_float_lane(const void *w, int lane, float *y, int64_t k) { x8_to_float_lane(0, w, lane, y, k); }
static void q4_0x8_to_float_lane(const void *w, int lane, float *y, int64_t k) { x8_to_float_lane(1, w, lane, y, k); }

static void vec_dot_8xn_q8_0x8_q8_0_ref(int64_t k, const void *w, int64_t ngroups, int64_t group_bytes,
                                        const void *x, int64_t x_bytes, int64_t nx, float *y, int64_t ldy)
{
    x8_vec_dot_ref(0, k, w, ngroups, group_bytes, x, x_bytes, nx, y, ldy);
}

static void vec_dot_8xn_q4_0x8_q8_0_ref(int64_t k, const void *w, int64_t ngroups, int64_t group_bytes,
                                        const void *x, int64_t x_bytes, int64_t nx, float *y, int64_t ldy)
{
    x8_vec_dot_ref(1, k, w, ngroups, group_bytes, x, x_bytes, nx, y, ldy);
}


/* ---- the formats beyond Q8_0 and Q4_0 (quant.h), in plain C only for now ----

   to_float gives gguf-py's numbers bit for bit (gguf.quants.dequantize, tests/test_block_formats.py):
   its float32 steps, d * sub-block scale, then * q, then - d_min * minimum (or + m). Every product
   there is exact (an f16's 11 significant bits times integers of at most 13 bits in all: 24 bits),
   so where -ffp-contract=fast (build_ffi.py) fuses a product and the add after it into an fma,
   the fma rounds once where the two steps would round once: the same number either way.

   The dot products: each block's integer dot product exact, per sub-block times its integer scale
   and summed in int32 (the minimums through x's sums of 16, Q8_K's bsums), then one float term a
   block added in block order: ggml's order of sums per block (its x86 kernels' too; its generic C
   spreads a super-block's int32 sum over 8 lanes). The float steps are pinned: unfused() keeps a
   product from fusing into an fma with the add after it, so that NumPy repeats them exactly. */

/* p, rounded to float on its own: the add it feeds cannot fuse with the product that made it (a
   volatile store and load, once a block: the reference's float steps are then its written ones) */
TD_INLINE float unfused(float p)
{
    volatile float r = p;
    return r;
}

/* bit 4 of weight j's quant in a Q5_0 or Q5_1 block: bit j of qh, a little-endian uint32 */
TD_INLINE int fifth_bit(const uint8_t qh[4], int j) { return (qh[j / 8] >> (j % 8) & 1) << 4; }

/* the 32 quants of a block of Q4_1 (q5 0) or Q5_1 (q5 1), as weight = d * q + m has them */
TD_INLINE void q_1_unpack(const uint8_t *qs, const uint8_t *qh, const int q5, int *q)
{
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 15) | (q5 ? fifth_bit(qh, j) : 0);
        q[j + 16] = (qs[j] >> 4) | (q5 ? fifth_bit(qh, j + 16) : 0);
    }
}

/* the 32 signed quants of a block of Q5_0 (q - 16) or IQ4_NL (the grid's values) */
TD_INLINE void q_0_unpack(const uint8_t *qs, const uint8_t *qh, const int nl, int *q)
{
    for (int j = 0; j < 16; j++) {
        q[j] = nl ? kvalues_iq4nl[qs[j] & 15] : ((qs[j] & 15) | fifth_bit(qh, j)) - 16;
        q[j + 16] = nl ? kvalues_iq4nl[qs[j] >> 4] : ((qs[j] >> 4) | fifth_bit(qh, j + 16)) - 16;
    }
}

static void q4_1_to_float_ref(const void *w, float *y, int64_t k)
{
    const block_q4_1 *b = w;
    for (int64_t i = 0; i < k / QK4_1; i++, y += QK4_1) {
        const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
        int q[QK4_1];
        q_1_unpack(b[i].qs, NULL, 0, q);
        for (int j = 0; j < QK4_1; j++)
            y[j] = d * (float)q[j] + m;
    }
}

static void q5_1_to_float_ref(const void *w, float *y, int64_t k)
{
    const block_q5_1 *b = w;
    for (int64_t i = 0; i < k / QK5_1; i++, y += QK5_1) {
        const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
        int q[QK5_1];
        q_1_unpack(b[i].qs, b[i].qh, 1, q);
        for (int j = 0; j < QK5_1; j++)
            y[j] = d * (float)q[j] + m;
    }
}

static void q5_0_to_float_ref(const void *w, float *y, int64_t k)
{
    const block_q5_0 *b = w;
    for (int64_t i = 0; i < k / QK5_0; i++, y += QK5_0) {
        const float d = fp16_to_fp32(b[i].d);
        int q[QK5_0];
        q_0_unpack(b[i].qs, b[i].qh, 0, q);
        for (int j = 0; j < QK5_0; j++)
            y[j] = d * (float)q[j];
    }
}

static void iq4_nl_to_float_ref(const void *w, float *y, int64_t k)
{
    const block_iq4_nl *b = w;
    for (int64_t i = 0; i < k / QK4_NL; i++, y += QK4_NL) {
        const float d = fp16_to_fp32(b[i].d);
        int q[QK4_NL];
        q_0_unpack(b[i].qs, NULL, 1, q);
        for (int j = 0; j < QK4_NL; j++)
            y[j] = d * (float)q[j];
    }
}

/* x to Q8_1: Q8_0's d and quants (quantize_row_q8_0's numbers), and s = d * their sum with the f32 d */
static void quantize_row_q8_1_ref(const float *x, void *vy, int64_t k)
{
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < k / QK8_1; i++, x += QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].d = fp32_to_fp16(d);
        y[i].s = fp32_to_fp16((float)sum * d);
    }
}

static void q8_1_to_float_ref(const void *vx, float *y, int64_t k)
{
    const block_q8_1 *b = vx;
    for (int64_t i = 0; i < k / QK8_1; i++)
        for (int j = 0; j < QK8_1; j++)
            y[i * QK8_1 + j] = fp16_to_fp32(b[i].d) * (float)b[i].qs[j];
}

/* Q4_1 and Q5_1 by Q8_1: d_w d_x (q . x) + m_w s_x a block */
TD_INLINE float dot_q_1_q8_1(const int q5, int64_t k, const void *vw, const void *vx)
{
    const block_q8_1 *x = vx;
    float sum = 0.0f;
    for (int64_t i = 0; i < k / QK8_1; i++) {
        const char *b = (const char *)vw + i * (q5 ? sizeof(block_q5_1) : sizeof(block_q4_1));
        const block_q4_1 *w4 = (const block_q4_1 *)b;
        const block_q5_1 *w5 = (const block_q5_1 *)b;
        int q[QK8_1], sumi = 0;
        q_1_unpack(q5 ? w5->qs : w4->qs, q5 ? w5->qh : NULL, q5, q);
        for (int j = 0; j < QK8_1; j++)
            sumi += q[j] * x[i].qs[j];
        const float d = fp16_to_fp32(q5 ? w5->d : w4->d) * fp16_to_fp32(x[i].d);
        sum += unfused(d * (float)sumi) + unfused(fp16_to_fp32(q5 ? w5->m : w4->m) * fp16_to_fp32(x[i].s));
    }
    return sum;
}

static float vec_dot_q4_1_q8_1_ref(int64_t k, const void *w, const void *x) { return dot_q_1_q8_1(0, k, w, x); }
static float vec_dot_q5_1_q8_1_ref(int64_t k, const void *w, const void *x) { return dot_q_1_q8_1(1, k, w, x); }

/* Q5_0 and IQ4_NL by Q8_0: d_w d_x (q . x) a block */
TD_INLINE float dot_q_0_q8_0(const int nl, int64_t k, const void *vw, const void *vx)
{
    const block_q8_0 *x = vx;
    float sum = 0.0f;
    for (int64_t i = 0; i < k / QK8_0; i++) {
        const char *b = (const char *)vw + i * (nl ? sizeof(block_iq4_nl) : sizeof(block_q5_0));
        const block_q5_0 *w5 = (const block_q5_0 *)b;
        const block_iq4_nl *wn = (const block_iq4_nl *)b;
        int q[QK8_0], sumi = 0;
        q_0_unpack(nl ? wn->qs : w5->qs, nl ? NULL : w5->qh, nl, q);
        for (int j = 0; j < QK8_0; j++)
            sumi += q[j] * x[i].qs[j];
        sum += unfused(fp16_to_fp32(nl ? wn->d : w5->d) * fp16_to_fp32(x[i].d) * (float)sumi);
    }
    return sum;
}

static float vec_dot_q5_0_q8_0_ref(int64_t k, const void *w, const void *x) { return dot_q_0_q8_0(0, k, w, x); }
static float vec_dot_iq4_nl_q8_0_ref(int64_t k, const void *w, const void *x) { return dot_q_0_q8_0(1, k, w, x); }

/* ---- the K-quants and IQ4_XS: super-blocks of 256, sub-blocks of 16 or 32 ----

   Each format's unpack gives a super-block's quants as integers (q[256], weight v = d * sc[v / sub]
   * q[v] - dmin * mn[v / sub]) and its sub-blocks' integer scales (and minimums): to_float and the
   dot product read the layout through it alone. */

/* Q4_K's and Q5_K's 6-bit scale and minimum of sub-block s (ggml's get_scale_min_k4) */
TD_INLINE void scale_min_k4(const uint8_t *p, int s, int *sc, int *mn)
{
    *sc = s < 4 ? p[s] & 63 : (p[s + 4] & 15) | (p[s - 4] >> 6) << 4;
    *mn = s < 4 ? p[s + 4] & 63 : (p[s + 4] >> 4) | (p[s] >> 6) << 4;
}

static void q2_K_unpack(const block_q2_K *b, int8_t *q, int *sc, int *mn)
{
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++)
                q[128 * h + 32 * j + l] = (int8_t)(b->qs[32 * h + l] >> (2 * j) & 3);
    for (int s = 0; s < QK_K / 16; s++)
        sc[s] = b->scales[s] & 15, mn[s] = b->scales[s] >> 4;
}

static void q3_K_unpack(const block_q3_K *b, int8_t *q, int *sc, int *mn)
{
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                const int v = 128 * h + 32 * j + l, high = b->hmask[l] >> (v / 32) & 1;
                q[v] = (int8_t)((b->qs[32 * h + l] >> (2 * j) & 3) - (high ? 0 : 4));
            }
    for (int s = 0; s < QK_K / 16; s++)
        sc[s] = ((b->scales[s % 8] >> (s < 8 ? 0 : 4) & 15) | (b->scales[8 + s % 4] >> (2 * (s / 4)) & 3) << 4) - 32;
    (void)mn;
}

static void q4_K_unpack(const block_q4_K *b, int8_t *q, int *sc, int *mn)
{
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) {
            q[64 * j + l] = (int8_t)(b->qs[32 * j + l] & 15);
            q[64 * j + 32 + l] = (int8_t)(b->qs[32 * j + l] >> 4);
        }
    for (int s = 0; s < QK_K / 32; s++)
        scale_min_k4(b->scales, s, &sc[s], &mn[s]);
}

static void q5_K_unpack(const block_q5_K *b, int8_t *q, int *sc, int *mn)
{
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) {
            q[64 * j + l] = (int8_t)((b->qs[32 * j + l] & 15) | (b->qh[l] >> (2 * j) & 1) << 4);
            q[64 * j + 32 + l] = (int8_t)((b->qs[32 * j + l] >> 4) | (b->qh[l] >> (2 * j + 1) & 1) << 4);
        }
    for (int s = 0; s < QK_K / 32; s++)
        scale_min_k4(b->scales, s, &sc[s], &mn[s]);
}

static void q6_K_unpack(const block_q6_K *b, int8_t *q, int *sc, int *mn)
{
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 64; l++)
            for (int n = 0; n < 2; n++) {
                const int v = 128 * h + 64 * n + l, low = b->ql[64 * h + l] >> (4 * n) & 15;
                const int high = b->qh[32 * h + l % 32] >> (2 * (2 * n + l / 32)) & 3;
                q[v] = (int8_t)((low | high << 4) - 32);
            }
    for (int s = 0; s < QK_K / 16; s++)
        sc[s] = b->scales[s];
    (void)mn;
}

static void iq4_xs_unpack(const block_iq4_xs *b, int8_t *q, int *sc, int *mn)
{
    for (int s = 0; s < QK_K / 32; s++) {
        for (int l = 0; l < 16; l++) {
            q[32 * s + l] = kvalues_iq4nl[b->qs[16 * s + l] & 15];
            q[32 * s + 16 + l] = kvalues_iq4nl[b->qs[16 * s + l] >> 4];
        }
        sc[s] = ((b->scales_l[s / 2] >> (4 * (s % 2)) & 15) | (b->scales_h >> (2 * s) & 3) << 4) - 32;
    }
    (void)mn;
}

/* weights of a super-block: d * sc * q (- dmin * mn where the format has minimums), sub-blocks of sub */
TD_INLINE void k_to_float(const int8_t *q, const int *sc, const int *mn, float d, float dmin, int sub, float *y)
{
    for (int s = 0; s < QK_K / sub; s++) {
        const float dl = d * (float)sc[s], ml = mn ? dmin * (float)mn[s] : 0.0f;
        for (int j = s * sub; j < (s + 1) * sub; j++)
            y[j] = mn ? dl * (float)q[j] - ml : dl * (float)q[j];
    }
}

/* a weight row of a K type: each super-block unpacked, then widened (MN: mn, or NULL where the
   format has no minimums; DMIN: the block's dmin as a float) */
#define K_TO_FLOAT(type, sub, MN, DMIN)                                                                    \
    static void type##_to_float_ref(const void *w, float *y, int64_t k)                                   \
    {                                                                                                      \
        const block_##type *b = w;                                                                         \
        for (int64_t i = 0; i < k / QK_K; i++) {                                                           \
            int8_t q[QK_K];                                                                                \
            int sc[QK_K / 16], mn[QK_K / 16];                                                              \
            type##_unpack(&b[i], q, sc, mn);                                                               \
            k_to_float(q, sc, MN, fp16_to_fp32(b[i].d), DMIN, sub, y + i * QK_K);                          \
        }                                                                                                  \
    }
K_TO_FLOAT(q2_K, 16, mn, fp16_to_fp32(b[i].dmin))
K_TO_FLOAT(q3_K, 16, NULL, 0.0f)
K_TO_FLOAT(q4_K, 32, mn, fp16_to_fp32(b[i].dmin))
K_TO_FLOAT(q5_K, 32, mn, fp16_to_fp32(b[i].dmin))
K_TO_FLOAT(q6_K, 16, NULL, 0.0f)
K_TO_FLOAT(iq4_xs, 32, NULL, 0.0f)
#undef K_TO_FLOAT

static void q8_K_to_float_ref(const void *w, float *y, int64_t k)
{
    const block_q8_K *b = w;
    for (int64_t i = 0; i < k / QK_K; i++)
        for (int j = 0; j < QK_K; j++)
            y[i * QK_K + j] = b[i].d * (float)b[i].qs[j];
}

/* x to Q8_K (ggml's quantize_row_q8_K_ref): iscale = -127 / the value of largest magnitude (the
   first of them), q = iscale * x rounded to nearest even, at most 127; d = 1 / iscale; a block of
   zeros all zeros */
static void quantize_row_q8_K_ref(const float *x, void *vy, int64_t k)
{
    block_q8_K *y = vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) > amax)
                amax = fabsf(x[j]), max = x[j];
        memset(&y[i], 0, sizeof y[i]);
        if (amax == 0.0f)
            continue;
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++)
            y[i].qs[j] = (int8_t)fmaxf(-128.0f, fminf(127.0f, rintf(iscale * x[j]))); /* NaN: 127, defined */
        for (int s = 0; s < QK_K / 16; s++) {
            int sum = 0;
            for (int j = 16 * s; j < 16 * s + 16; j++)
                sum += y[i].qs[j];
            y[i].bsums[s] = (int16_t)sum;
        }
        y[i].d = 1.0f / iscale;
    }
}

/* sum over the sub-blocks (of sub quants) of sc[s] * (q . x): exact in int32 (at most 2^28) */
TD_INLINE int32_t scaled_dot(const int8_t *q, const int8_t *x, const int *sc, int sub)
{
    int32_t sum = 0;
    for (int s = 0; s < QK_K / sub; s++) {
        int32_t dot = 0;
        for (int j = s * sub; j < (s + 1) * sub; j++)
            dot += q[j] * x[j];
        sum += sc[s] * dot;
    }
    return sum;
}

/* sum over the sub-blocks of mn[s] * (the sum of x's quants in it), from x's sums of 16 */
TD_INLINE int32_t min_dot(const int16_t *bsums, const int *mn, int sub)
{
    int32_t sum = 0;
    for (int s = 0; s < QK_K / sub; s++)
        for (int t = s * sub / 16; t < (s + 1) * sub / 16; t++)
            sum += mn[s] * bsums[t];
    return sum;
}

/* a K type's row by Q8_K: per super-block (d_w d_x) * scaled_dot - (dmin_w d_x) * min_dot (has_min:
   the format has minimums, DMIN the block's dmin as a float) */
#define K_DOT(type, sub, has_min, DMIN)                                                                          \
    static float vec_dot_##type##_q8_K_ref(int64_t k, const void *vw, const void *vx)                      \
    {                                                                                                       \
        const block_##type *b = vw;                                                                         \
        const block_q8_K *x = vx;                                                                           \
        float sum = 0.0f;                                                                                   \
        for (int64_t i = 0; i < k / QK_K; i++) {                                                            \
            int8_t q[QK_K];                                                                                 \
            int sc[QK_K / 16], mn[QK_K / 16];                                                               \
            type##_unpack(&b[i], q, sc, mn);                                                                \
            const float t = unfused(fp16_to_fp32(b[i].d) * x[i].d * (float)scaled_dot(q, x[i].qs, sc, sub)); \
            sum += has_min ? t - unfused(DMIN * x[i].d * (float)min_dot(x[i].bsums, mn, sub)) : t;          \
        }                                                                                                   \
        return sum;                                                                                         \
    }
K_DOT(q2_K, 16, 1, fp16_to_fp32(b[i].dmin))
K_DOT(q3_K, 16, 0, 0.0f)
K_DOT(q4_K, 32, 1, fp16_to_fp32(b[i].dmin))
K_DOT(q5_K, 32, 1, fp16_to_fp32(b[i].dmin))
K_DOT(q6_K, 16, 0, 0.0f)
K_DOT(iq4_xs, 32, 0, 0.0f)
#undef K_DOT

static float vec_dot_q8_K_q8_K_ref(int64_t k, const void *vw, const void *vx)
{
    const block_q8_K *w = vw, *x = vx;
    float sum = 0.0f;
    for (int64_t i = 0; i < k / QK_K; i++) {
        int32_t dot = 0;
        for (int j = 0; j < QK_K; j++)
            dot += w[i].qs[j] * x[i].qs[j];
        sum += unfused(w[i].d * x[i].d * (float)dot);
    }
    return sum;
}


/* quant_isa.h in plain C: vf4 vectors (SSE2 on any x86-64, NEON or SSE-width vectors elsewhere),
   the reference's order of sums */
#define TD_ISA_FILE "quant_isa.h"
#define VEC vf4
#define VL 4
#define REGS 16
#define PLAIN 1
#define NEON 0
#define TARGET
#define ISA(name) name##_c
#include "isa_instance.h"

/* the x types of the formats beyond Q8_0 and Q4_0 */
#define X_Q8_1 .from_float = quantize_row_q8_1_ref, .x_to_float = q8_1_to_float_ref, .x_blck_size = QK8_1, \
               .x_type_size = sizeof(block_q8_1)
#define X_Q8_K .from_float = quantize_row_q8_K_ref, .x_to_float = q8_K_to_float_ref, .x_blck_size = QK_K, \
               .x_type_size = sizeof(block_q8_K)

/* f32 x (from_float NULL): x_to_float is never needed, the GEMM reads x itself */
const struct type_traits td_traits_c[TD_NTYPES] = {
    [TD_F16] = {.rows = 1, .blck_size = 1, .type_size = 2, .to_float = f16_to_float_c, .x_blck_size = 1,
                .x_type_size = 4},
    [TD_BF16] = {.rows = 1, .blck_size = 1, .type_size = 2, .to_float = bf16_to_float_c, .x_blck_size = 1,
                 .x_type_size = 4},
    [TD_Q8_0] = {.rows = 1, .blck_size = QK8_0, .type_size = sizeof(block_q8_0), .to_float = q8_0_to_float_c,
                 TD_X_Q8_0(c), .vec_dot = vec_dot_q8_0_q8_0_c},
    [TD_Q4_0] = {.rows = 1, .blck_size = QK4_0, .type_size = sizeof(block_q4_0), .to_float = q4_0_to_float_c,
                 TD_X_Q8_0(c), .vec_dot = vec_dot_q4_0_q8_0_c},
    /* panels: only the f32 GEMM reads them, x as it is */
    [TD_F32P] = {.rows = TD_PANEL, .blck_size = 1, .type_size = 4, .to_float_lane = f32p_to_float_lane,
                 .x_blck_size = 1, .x_type_size = 4},
    [TD_F16P] = {.rows = TD_PANEL, .blck_size = 1, .type_size = 2, .to_float_lane = f16p_to_float_lane,
                 .x_blck_size = 1, .x_type_size = 4},
    [TD_BF16P] = {.rows = TD_PANEL, .blck_size = 1, .type_size = 2, .to_float_lane = bf16p_to_float_lane,
                  .x_blck_size = 1, .x_type_size = 4},
    [TD_Q4_1] = {.rows = 1, .blck_size = QK4_1, .type_size = sizeof(block_q4_1), .to_float = q4_1_to_float_ref,
                 X_Q8_1, .vec_dot = vec_dot_q4_1_q8_1_ref},
    [TD_Q5_0] = {.rows = 1, .blck_size = QK5_0, .type_size = sizeof(block_q5_0), .to_float = q5_0_to_float_ref,
                 TD_X_Q8_0(c), .vec_dot = vec_dot_q5_0_q8_0_ref},
    [TD_Q5_1] = {.rows = 1, .blck_size = QK5_1, .type_size = sizeof(block_q5_1), .to_float = q5_1_to_float_ref,
                 X_Q8_1, .vec_dot = vec_dot_q5_1_q8_1_ref},
    [TD_IQ4_NL] = {.rows = 1, .blck_size = QK4_NL, .type_size = sizeof(block_iq4_nl),
                   .to_float = iq4_nl_to_float_ref, TD_X_Q8_0(c), .vec_dot = vec_dot_iq4_nl_q8_0_ref},
    [TD_Q2_K] = {.rows = 1, .blck_size = QK_K, .type_size = sizeof(block_q2_K), .to_float = q2_K_to_float_ref,
                 X_Q8_K, .vec_dot = vec_dot_q2_K_q8_K_ref},
    [TD_Q3_K] = {.rows = 1, .blck_size = QK_K, .type_size = sizeof(block_q3_K), .to_float = q3_K_to_float_ref,
                 X_Q8_K, .vec_dot = vec_dot_q3_K_q8_K_ref},
    [TD_Q4_K] = {.rows = 1, .blck_size = QK_K, .type_size = sizeof(block_q4_K), .to_float = q4_K_to_float_ref,
                 X_Q8_K, .vec_dot = vec_dot_q4_K_q8_K_ref},
    [TD_Q5_K] = {.rows = 1, .blck_size = QK_K, .type_size = sizeof(block_q5_K), .to_float = q5_K_to_float_ref,
                 X_Q8_K, .vec_dot = vec_dot_q5_K_q8_K_ref},
    [TD_Q6_K] = {.rows = 1, .blck_size = QK_K, .type_size = sizeof(block_q6_K), .to_float = q6_K_to_float_ref,
                 X_Q8_K, .vec_dot = vec_dot_q6_K_q8_K_ref},
    [TD_Q8_K] = {.rows = 1, .blck_size = QK_K, .type_size = sizeof(block_q8_K), .to_float = q8_K_to_float_ref,
                 X_Q8_K, .vec_dot = vec_dot_q8_K_q8_K_ref},
    [TD_IQ4_XS] = {.rows = 1, .blck_size = QK_K, .type_size = sizeof(block_iq4_xs),
                   .to_float = iq4_xs_to_float_ref, X_Q8_K, .vec_dot = vec_dot_iq4_xs_q8_K_ref},
    [TD_Q8_0X8] = {.rows = 8, .blck_size = QK8_0, .type_size = sizeof(block_q8_0),
                   .to_float_lane = q8_0x8_to_float_lane, TD_X_Q8_0(c), .vec_dot_8xn = vec_dot_8xn_q8_0x8_q8_0_ref},
    [TD_Q4_0X8] = {.rows = 8, .blck_size = QK4_0, .type_size = sizeof(block_q4_0),
                   .to_float_lane = q4_0x8_to_float_lane, TD_X_Q8_0(c), .vec_dot_8xn = vec_dot_8xn_q4_0x8_q8_0_ref},
};
