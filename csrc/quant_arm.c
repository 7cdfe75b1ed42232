/* quant_arm.c: the weight types' kernels on arm64 (ggml-cpu/arch/arm/quants.c's role): NEON, and
   NEON with the dotprod extension (sdot), and their tables, td_traits_neon and td_traits_dotprod,
   which name only what each level does its own way (quant.c fills the rest: dotprod's from NEON's,
   NEON's from plain C's, quant_ref.c).

   - quant_isa.h's NEON instance (suffix _neon): f16 and bf16 rows, Q8_0 and Q4_0 rows to f32, x to
     Q8_0, the Q8_0 and Q4_0 dot products with NEON's widening multiplies (vmull_s8);
   - by hand, with dotprod: the Q8_0 and Q4_0 dot products, sdot summing a lane's 4 products in one
     instruction (td_type_traits gives them where the CPU has it);
   - by hand, with dotprod: the dot products of Q4_1, Q5_1 (by Q8_1), Q5_0, IQ4_NL (by Q8_0), Q2_K,
     Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS (by Q8_K): the integer sums in sdot, the float steps plain C's
     in its order, so the results are plain C's to the bit. Without dotprod these types, and Q8_K as a
     weight on either, run plain C (quant_ref.c), as do their to_float and x quantizers.
   A fast path for another type is a function here and its entry in the level's table below. */
#include <math.h>
#include "quant.h"

#if defined(__aarch64__)
/* quant_isa.h under NEON: vf4 vectors, 32 registers */
#define TD_ISA_FILE "quant_isa.h"
#define VEC vf4
#define VL 4
#define REGS 32
#define PLAIN 0
#define NEON 1
#define TARGET
#define ISA(name) name##_neon
#include "isa_instance.h"

/* ---- the exception on arm64: the int8 dot products with dotprod (sdot: a lane's 4 products summed
   in one instruction, where vmull_s8 widens to int16 and adds pairs in two) ---- */

TD_INLINE float fp16_neon(td_fp16_t h)
{
    __fp16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}

TD_DOTPROD static float vec_dot_q8_0_q8_0_dotprod(int64_t k, const void *vw, const void *vx)
{
    const block_q8_0 *w = vw, *x = vx;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < k / QK8_0; i++) {
        int32x4_t s = vdotq_s32(vdupq_n_s32(0), vld1q_s8(w[i].qs), vld1q_s8(x[i].qs));
        s = vdotq_s32(s, vld1q_s8(w[i].qs + 16), vld1q_s8(x[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), fp16_neon(w[i].d) * fp16_neon(x[i].d));
    }
    return vaddvq_f32(acc);
}

TD_DOTPROD static float vec_dot_q4_0_q8_0_dotprod(int64_t k, const void *vw, const void *vx)
{
    const block_q4_0 *w = vw;
    const block_q8_0 *x = vx;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < k / QK4_0; i++) {
        const uint8x16_t q = vld1q_u8(w[i].qs);
        const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), vdupq_n_s8(8));
        const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
        int32x4_t s = vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(x[i].qs));
        s = vdotq_s32(s, hi, vld1q_s8(x[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), fp16_neon(w[i].d) * fp16_neon(x[i].d));
    }
    return vaddvq_f32(acc);
}

/* ---- the formats beyond Q8_0 and Q4_0 with dotprod: their integer sums with sdot, their float
   steps quant_ref.c's, in its order (a block after another, each product rounded on its own), so
   that every result is plain C's bit for bit (tests/test_block_formats.py pins it on arm64) ---- */

/* p rounded to float on its own, as quant_ref.c's unfused: no fma with the add it feeds */
TD_INLINE float unfused(float p)
{
    volatile float r = p;
    return r;
}

/* the fifth bits of a Q5_0 or Q5_1 block as 16 (set) or 0 bytes: weights 0..15 (half 0) or 16..31
   (half 1), bit j of the little-endian uint32 qh; each byte of qh spread over 8 lanes, one bit a lane */
TD_DOTPROD TD_INLINE uint8x16_t fifth_bits(const uint8_t qh[4], int half)
{
    static const uint8_t spread[2][16] = {{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
                                          {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3}};
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint32_t h;
    memcpy(&h, qh, 4);
    const uint8x16_t bytes = vqtbl1q_u8(vreinterpretq_u8_u32(vdupq_n_u32(h)), vld1q_u8(spread[half]));
    return vandq_u8(vtstq_u8(bytes, vld1q_u8(bit)), vdupq_n_u8(16));
}

/* the exact dot product of a block's 32 quants (lo: weights 0..15, hi: 16..31) with x's 32 */
TD_DOTPROD TD_INLINE int32_t dot32(int8x16_t lo, int8x16_t hi, const int8_t *x)
{
    return vaddvq_s32(vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(x)), hi, vld1q_s8(x + 16)));
}

/* Q4_1 (q5 0) and Q5_1 (q5 1) by Q8_1: d_w d_x (q . x) + m_w s_x a block, quant_ref.c's dot_q_1_q8_1 */
TD_DOTPROD TD_INLINE float dot_q_1_q8_1_dotprod(const int q5, int64_t k, const void *vw, const void *vx)
{
    const block_q8_1 *x = vx;
    float sum = 0.0f;
    for (int64_t i = 0; i < k / QK8_1; i++) {
        const char *b = (const char *)vw + i * (q5 ? sizeof(block_q5_1) : sizeof(block_q4_1));
        const block_q4_1 *w4 = (const block_q4_1 *)b;
        const block_q5_1 *w5 = (const block_q5_1 *)b;
        const uint8x16_t q = vld1q_u8(q5 ? w5->qs : w4->qs);
        uint8x16_t lo = vandq_u8(q, vdupq_n_u8(15)), hi = vshrq_n_u8(q, 4);
        if (q5)
            lo = vorrq_u8(lo, fifth_bits(w5->qh, 0)), hi = vorrq_u8(hi, fifth_bits(w5->qh, 1));
        const int32_t sumi = dot32(vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), x[i].qs);
        const float d = fp16_neon(q5 ? w5->d : w4->d) * fp16_neon(x[i].d);
        sum += unfused(d * (float)sumi) + unfused(fp16_neon(q5 ? w5->m : w4->m) * fp16_neon(x[i].s));
    }
    return sum;
}

TD_DOTPROD static float vec_dot_q4_1_q8_1_dotprod(int64_t k, const void *w, const void *x)
{
    return dot_q_1_q8_1_dotprod(0, k, w, x);
}

TD_DOTPROD static float vec_dot_q5_1_q8_1_dotprod(int64_t k, const void *w, const void *x)
{
    return dot_q_1_q8_1_dotprod(1, k, w, x);
}

/* Q5_0 (nl 0: q - 16) and IQ4_NL (nl 1: the grid's values, a table look-up) by Q8_0: d_w d_x (q . x)
   a block, quant_ref.c's dot_q_0_q8_0 */
TD_DOTPROD TD_INLINE float dot_q_0_q8_0_dotprod(const int nl, int64_t k, const void *vw, const void *vx)
{
    const block_q8_0 *x = vx;
    const int8x16_t grid = vld1q_s8(kvalues_iq4nl);
    float sum = 0.0f;
    for (int64_t i = 0; i < k / QK8_0; i++) {
        const char *b = (const char *)vw + i * (nl ? sizeof(block_iq4_nl) : sizeof(block_q5_0));
        const block_q5_0 *w5 = (const block_q5_0 *)b;
        const block_iq4_nl *wn = (const block_iq4_nl *)b;
        const uint8x16_t q = vld1q_u8(nl ? wn->qs : w5->qs);
        const uint8x16_t lo = vandq_u8(q, vdupq_n_u8(15)), hi = vshrq_n_u8(q, 4);
        int8x16_t l, h;
        if (nl) {
            l = vqtbl1q_s8(grid, lo), h = vqtbl1q_s8(grid, hi);
        } else {
            l = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, fifth_bits(w5->qh, 0))), vdupq_n_s8(16));
            h = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, fifth_bits(w5->qh, 1))), vdupq_n_s8(16));
        }
        const int32_t sumi = dot32(l, h, x[i].qs);
        sum += unfused(fp16_neon(nl ? wn->d : w5->d) * fp16_neon(x[i].d) * (float)sumi);
    }
    return sum;
}

TD_DOTPROD static float vec_dot_q5_0_q8_0_dotprod(int64_t k, const void *w, const void *x)
{
    return dot_q_0_q8_0_dotprod(0, k, w, x);
}

TD_DOTPROD static float vec_dot_iq4_nl_q8_0_dotprod(int64_t k, const void *w, const void *x)
{
    return dot_q_0_q8_0_dotprod(1, k, w, x);
}

/* ---- the K-quants and IQ4_XS by Q8_K: per super-block the sum over its sub-blocks of scale *
   (q . x) in int32 lanes (sdot, then a multiply-add by the scale), the minimums' sum from x's sums
   of 16, then quant_ref.c's K_DOT float steps ---- */

/* acc += sc * (the 16 quants q . x's 16 at x), lane-wise in int32 */
TD_DOTPROD TD_INLINE int32x4_t dot16_scaled(int32x4_t acc, int8x16_t q, const int8_t *x, int sc)
{
    return vmlaq_n_s32(acc, vdotq_s32(vdupq_n_s32(0), q, vld1q_s8(x)), sc);
}

/* a super-block's term: d_w d_x isum - dmin_w d_x imin (no minimums: has_min 0), as K_DOT has it */
TD_INLINE float k_term(float d, float xd, int32_t isum, const int has_min, float dmin, int32_t imin)
{
    const float t = unfused(d * xd * (float)isum);
    return has_min ? t - unfused(dmin * xd * (float)imin) : t;
}

/* sum over 16 sub-blocks of mn[s] * bsums[s] (Q2_K), exact in int32 */
TD_DOTPROD TD_INLINE int32_t min_dot16(const int16_t *bsums, const uint8_t *mn)
{
    const uint8x16_t m = vld1q_u8(mn);
    const int16x8_t m0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(m))), m1 = vreinterpretq_s16_u16(vmovl_high_u8(m));
    const int32x4_t s = vmlal_s16(vmull_s16(vget_low_s16(m0), vld1_s16(bsums)), vget_high_s16(m0), vld1_s16(bsums + 4));
    return vaddvq_s32(vmlal_s16(vmlal_s16(s, vget_low_s16(m1), vld1_s16(bsums + 8)), vget_high_s16(m1),
                                vld1_s16(bsums + 12)));
}

/* sum over 8 sub-blocks of 32 of mn[s] * (bsums[2s] + bsums[2s + 1]) (Q4_K, Q5_K), exact in int32 */
TD_DOTPROD TD_INLINE int32_t min_dot8(const int16_t *bsums, const uint8_t *mn)
{
    const int16x8_t pairs = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8)); /* |.| <= 32 x 128 */
    const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn)));
    return vaddvq_s32(vmlal_s16(vmull_s16(vget_low_s16(pairs), vget_low_s16(m)), vget_high_s16(pairs),
                                vget_high_s16(m)));
}

/* Q4_K's and Q5_K's 8 scales and 8 minimums (quant_ref.c's scale_min_k4) */
TD_INLINE void scales_mins_k4(const uint8_t *p, uint8_t *sc, uint8_t *mn)
{
    for (int s = 0; s < 8; s++) {
        sc[s] = (uint8_t)(s < 4 ? p[s] & 63 : (p[s + 4] & 15) | (p[s - 4] >> 6) << 4);
        mn[s] = (uint8_t)(s < 4 ? p[s + 4] & 63 : (p[s + 4] >> 4) | (p[s] >> 6) << 4);
    }
}

/* Q4_K (q5 0) and Q5_K (q5 1): qs[32j..32j+31]'s low nibbles are sub-block 2j, its high ones 2j + 1;
   Q5_K's fifth bits bit 2j (and 2j + 1) of qh[0..31] */
TD_DOTPROD TD_INLINE float dot_q45_K_q8_K(const int q5, int64_t k, const void *vw, const void *vx)
{
    const block_q8_K *x = vx;
    float sum = 0.0f;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const char *b = (const char *)vw + i * (q5 ? sizeof(block_q5_K) : sizeof(block_q4_K));
        const block_q4_K *w4 = (const block_q4_K *)b;
        const block_q5_K *w5 = (const block_q5_K *)b;
        const uint8_t *qs = q5 ? w5->qs : w4->qs;
        uint8_t sc[8], mn[8];
        scales_mins_k4(q5 ? w5->scales : w4->scales, sc, mn);
        uint8x16_t h0 = q5 ? vld1q_u8(w5->qh) : vdupq_n_u8(0), h1 = q5 ? vld1q_u8(w5->qh + 16) : vdupq_n_u8(0);
        const uint8x16_t one = vdupq_n_u8(1), low4 = vdupq_n_u8(15);
        int32x4_t acc = vdupq_n_s32(0);
        for (int j = 0; j < 4; j++) {
            const uint8x16_t q0 = vld1q_u8(qs + 32 * j), q1 = vld1q_u8(qs + 32 * j + 16);
            const int8_t *xs = x[i].qs + 64 * j;
            uint8x16_t a0 = vandq_u8(q0, low4), a1 = vandq_u8(q1, low4), c0 = vshrq_n_u8(q0, 4), c1 = vshrq_n_u8(q1, 4);
            if (q5) {
                a0 = vorrq_u8(a0, vshlq_n_u8(vandq_u8(h0, one), 4)), a1 = vorrq_u8(a1, vshlq_n_u8(vandq_u8(h1, one), 4));
                c0 = vorrq_u8(c0, vshlq_n_u8(vandq_u8(h0, vdupq_n_u8(2)), 3));
                c1 = vorrq_u8(c1, vshlq_n_u8(vandq_u8(h1, vdupq_n_u8(2)), 3));
                h0 = vshrq_n_u8(h0, 2), h1 = vshrq_n_u8(h1, 2);
            }
            acc = dot16_scaled(acc, vreinterpretq_s8_u8(a0), xs, sc[2 * j]);
            acc = dot16_scaled(acc, vreinterpretq_s8_u8(a1), xs + 16, sc[2 * j]);
            acc = dot16_scaled(acc, vreinterpretq_s8_u8(c0), xs + 32, sc[2 * j + 1]);
            acc = dot16_scaled(acc, vreinterpretq_s8_u8(c1), xs + 48, sc[2 * j + 1]);
        }
        sum += k_term(fp16_neon(q5 ? w5->d : w4->d), x[i].d, vaddvq_s32(acc), 1,
                      fp16_neon(q5 ? w5->dmin : w4->dmin), min_dot8(x[i].bsums, mn));
    }
    return sum;
}

TD_DOTPROD static float vec_dot_q4_K_q8_K_dotprod(int64_t k, const void *w, const void *x)
{
    return dot_q45_K_q8_K(0, k, w, x);
}

TD_DOTPROD static float vec_dot_q5_K_q8_K_dotprod(int64_t k, const void *w, const void *x)
{
    return dot_q45_K_q8_K(1, k, w, x);
}

/* Q6_K: for each half h of 128, ql[64h..64h+63]'s nibble n and qh[32h..32h+31]'s bits 2(2n + l / 32)
   make weights 128h + 64n + l (l < 64), q - 32; 16 sub-blocks of 16, signed scales */
TD_DOTPROD static float vec_dot_q6_K_q8_K_dotprod(int64_t k, const void *vw, const void *vx)
{
    const block_q6_K *w = vw;
    const block_q8_K *x = vx;
    const uint8x16_t low4 = vdupq_n_u8(15), bits45 = vdupq_n_u8(3 << 4);
    float sum = 0.0f;
    for (int64_t i = 0; i < k / QK_K; i++) {
        int32x4_t acc = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[i].ql + 64 * h, *qh = w[i].qh + 32 * h;
            const int8_t *xs = x[i].qs + 128 * h, *sc = w[i].scales + 8 * h;
            const uint8x16_t hb[2] = {vld1q_u8(qh), vld1q_u8(qh + 16)};
            for (int c = 0; c < 4; c++) {                 /* l = 16c..16c+15 */
                const uint8x16_t lq = vld1q_u8(ql + 16 * c), hq = hb[c % 2];
                const int up = 2 * (c / 2);                 /* qh's shift for n = 0: 2 (l / 32) */
                const uint8x16_t h0 = vandq_u8(up ? vshlq_n_u8(hq, 2) : vshlq_n_u8(hq, 4), bits45);
                const uint8x16_t h1 = vandq_u8(up ? vshrq_n_u8(hq, 2) : hq, bits45);
                const int8x16_t q0 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(lq, low4), h0)), vdupq_n_s8(32));
                const int8x16_t q1 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(lq, 4), h1)), vdupq_n_s8(32));
                acc = dot16_scaled(acc, q0, xs + 16 * c, sc[c]);
                acc = dot16_scaled(acc, q1, xs + 64 + 16 * c, sc[4 + c]);
            }
        }
        sum += k_term(fp16_neon(w[i].d), x[i].d, vaddvq_s32(acc), 0, 0.0f, 0);
    }
    return sum;
}

/* Q2_K (q3 0: q = the 2 bits, scale and minimum the nibbles of scales[s]) and Q3_K (q3 1: q = the
   2 bits - 4 where hmask's bit is clear, 6-bit scales - 32): weight 128h + 32j + l in bits 2j..2j+1
   of qs[32h + l] (and bit 4h + j of hmask[l]); 16 sub-blocks of 16 */
TD_DOTPROD TD_INLINE float dot_q23_K_q8_K(const int q3, int64_t k, const void *vw, const void *vx)
{
    const block_q8_K *x = vx;
    const uint8x16_t three = vdupq_n_u8(3);
    float sum = 0.0f;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const char *b = (const char *)vw + i * (q3 ? sizeof(block_q3_K) : sizeof(block_q2_K));
        const block_q2_K *w2 = (const block_q2_K *)b;
        const block_q3_K *w3 = (const block_q3_K *)b;
        const uint8_t *qs = q3 ? w3->qs : w2->qs;
        int sc[16];
        uint8_t mn[16];
        for (int s = 0; s < 16; s++) {
            if (q3)
                sc[s] = ((w3->scales[s % 8] >> (s < 8 ? 0 : 4) & 15) | (w3->scales[8 + s % 4] >> (2 * (s / 4)) & 3) << 4) - 32;
            else
                sc[s] = w2->scales[s] & 15, mn[s] = (uint8_t)(w2->scales[s] >> 4);
        }
        const uint8x16_t hm[2] = {q3 ? vld1q_u8(w3->hmask) : three, q3 ? vld1q_u8(w3->hmask + 16) : three};
        int32x4_t acc = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < 2; c++) {                   /* l = 16c..16c+15 */
                uint8x16_t q = vld1q_u8(qs + 32 * h + 16 * c);
                for (int j = 0; j < 4; j++, q = vshrq_n_u8(q, 2)) {
                    int8x16_t v = vreinterpretq_s8_u8(vandq_u8(q, three));
                    if (q3)
                        v = vsubq_s8(v, vreinterpretq_s8_u8(vbicq_u8(vdupq_n_u8(4),
                                                                     vtstq_u8(hm[c], vdupq_n_u8((uint8_t)(1 << (4 * h + j)))))));
                    acc = dot16_scaled(acc, v, x[i].qs + 128 * h + 32 * j + 16 * c, sc[8 * h + 2 * j + c]);
                }
            }
        sum += q3 ? k_term(fp16_neon(w3->d), x[i].d, vaddvq_s32(acc), 0, 0.0f, 0)
                  : k_term(fp16_neon(w2->d), x[i].d, vaddvq_s32(acc), 1, fp16_neon(w2->dmin), min_dot16(x[i].bsums, mn));
    }
    return sum;
}

TD_DOTPROD static float vec_dot_q2_K_q8_K_dotprod(int64_t k, const void *w, const void *x)
{
    return dot_q23_K_q8_K(0, k, w, x);
}

TD_DOTPROD static float vec_dot_q3_K_q8_K_dotprod(int64_t k, const void *w, const void *x)
{
    return dot_q23_K_q8_K(1, k, w, x);
}

/* IQ4_XS: sub-block s of 32 in qs[16s..16s+15] (low nibbles its first 16), the grid's values, 6-bit
   scales - 32 */
TD_DOTPROD static float vec_dot_iq4_xs_q8_K_dotprod(int64_t k, const void *vw, const void *vx)
{
    const block_iq4_xs *w = vw;
    const block_q8_K *x = vx;
    const int8x16_t grid = vld1q_s8(kvalues_iq4nl);
    float sum = 0.0f;
    for (int64_t i = 0; i < k / QK_K; i++) {
        int32x4_t acc = vdupq_n_s32(0);
        for (int s = 0; s < 8; s++) {
            const int sc = ((w[i].scales_l[s / 2] >> (4 * (s % 2)) & 15) | (w[i].scales_h >> (2 * s) & 3) << 4) - 32;
            const uint8x16_t q = vld1q_u8(w[i].qs + 16 * s);
            acc = dot16_scaled(acc, vqtbl1q_s8(grid, vandq_u8(q, vdupq_n_u8(15))), x[i].qs + 32 * s, sc);
            acc = dot16_scaled(acc, vqtbl1q_s8(grid, vshrq_n_u8(q, 4)), x[i].qs + 32 * s + 16, sc);
        }
        sum += k_term(fp16_neon(w[i].d), x[i].d, vaddvq_s32(acc), 0, 0.0f, 0);
    }
    return sum;
}


/* NEON's own functions, per type; a field left out is plain C's (quant.c) */
const struct type_traits td_traits_neon[TD_NTYPES] = {
    [TD_F16] = {.to_float = f16_to_float_neon},
    [TD_BF16] = {.to_float = bf16_to_float_neon},
    [TD_Q8_0] = {.to_float = q8_0_to_float_neon, TD_X_Q8_0(neon), .vec_dot = vec_dot_q8_0_q8_0_neon},
    [TD_Q4_0] = {.to_float = q4_0_to_float_neon, TD_X_Q8_0(neon), .vec_dot = vec_dot_q4_0_q8_0_neon},
    [TD_Q8_0X8] = {TD_X_Q8_0(neon)},
    [TD_Q4_0X8] = {TD_X_Q8_0(neon)},
};

/* what dotprod does better than NEON; a field left out is NEON's */
const struct type_traits td_traits_dotprod[TD_NTYPES] = {
    [TD_Q8_0] = {.vec_dot = vec_dot_q8_0_q8_0_dotprod},
    [TD_Q4_0] = {.vec_dot = vec_dot_q4_0_q8_0_dotprod},
    [TD_Q4_1] = {.vec_dot = vec_dot_q4_1_q8_1_dotprod},
    [TD_Q5_0] = {.vec_dot = vec_dot_q5_0_q8_0_dotprod},
    [TD_Q5_1] = {.vec_dot = vec_dot_q5_1_q8_1_dotprod},
    [TD_IQ4_NL] = {.vec_dot = vec_dot_iq4_nl_q8_0_dotprod},
    [TD_Q2_K] = {.vec_dot = vec_dot_q2_K_q8_K_dotprod},
    [TD_Q3_K] = {.vec_dot = vec_dot_q3_K_q8_K_dotprod},
    [TD_Q4_K] = {.vec_dot = vec_dot_q4_K_q8_K_dotprod},
    [TD_Q5_K] = {.vec_dot = vec_dot_q5_K_q8_K_dotprod},
    [TD_Q6_K] = {.vec_dot = vec_dot_q6_K_q8_K_dotprod},
    [TD_IQ4_XS] = {.vec_dot = vec_dot_iq4_xs_q8_K_dotprod},
};
#endif
