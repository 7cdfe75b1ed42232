/* quant_x86_k.c: the K-quants' kernels on x86-64 (Q2_K .. Q6_K, IQ4_XS, Q8_K and the Q8_K x
   quantizer; ggml-cpu/arch/x86/quants.c's ggml_vec_dot_q*_K_q8_K), AVX2 (+FMA, F16C) and AVX-512,
   and their tables, td_traits_avx2_k and td_traits_avx512_k, which quant.c lays over quant_x86.c's
   (the types are disjoint): a reader finds Q4_K's AVX2 dot product here by the file's name.

   Every dot product is bit for bit quant_ref.c's K_DOT: each super-block's integer sums (sub-block
   dot products times their integer scales, the minimums through x's sums of 16) made exactly in
   registers, then plain C's float steps for the super-block, in its order, one super-block after
   another (tests/test_block_formats.py pins every level to its NumPy replica). */
#include <math.h>
#include "quant.h"

#if defined(__x86_64__)
/* quant_x86.c's fixed(): quant_ref.c's unfused() at no cost, an empty asm the product must leave a
   register through, so -ffp-contract=fast cannot fuse it into an fma with the add after it */
TD_INLINE float fixed(float p)
{
    __asm__("" : "+x"(p));
    return p;
}

/* the sum of 8 int32 lanes (as quant_x86.c's) */
TD_AVX2 TD_INLINE int32_t hsum_i32_8(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
}


/* a K type's super-block's float terms, as quant_ref.c's K_DOT: (d_w d_x) isum - (dmin_w d_x) imin */
TD_INLINE float k_terms(float d, float dmin, float dx, int32_t isum, int32_t imin, const int has_min)
{
    const float t = fixed(d * dx * (float)isum);
    return has_min ? t - fixed(dmin * dx * (float)imin) : t;
}

/* Q4_K's 8 scales (bytes 0..7) and 8 minimums (bytes 8..15) of a super-block, from its 12 bytes:
   scale_min_k4's bits, moved 4 sub-blocks at a time in 32-bit words */
TD_INLINE void scales_mins_k4(const uint8_t p[K_SCALE_SIZE], uint8_t out[16])
{
    uint32_t a[3], o[4];
    memcpy(a, p, 12);
    const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, top2 = 0x03030303;
    o[0] = a[0] & low6;                                   /* scales 0..3 */
    o[1] = (a[2] & low4) | ((a[0] >> 6) & top2) << 4;     /* scales 4..7 */
    o[2] = a[1] & low6;                                   /* minimums 0..3 */
    o[3] = ((a[2] >> 4) & low4) | ((a[1] >> 6) & top2) << 4; /* minimums 4..7 */
    memcpy(out, o, 16);
}

/* sum_s mn[s] (x's sum in sub-block s of 32), mn 8 bytes at p, x's 16 sums of 16 */
TD_AVX2 TD_INLINE int32_t min_dot_32(const uint8_t *mn, const int16_t *bsums)
{
    const __m256i b = _mm256_loadu_si256((const __m256i *)bsums);
    const __m128i sums = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)); /* 8 of 32 */
    const __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
    __m128i s = _mm_madd_epi16(m, sums);
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
}

/* Q4_K (q5 0) and Q5_K (q5 1) by Q8_K: 64 weights a step (32 bytes of nibbles: sub-blocks 2j and
   2j+1), unsigned by x in maddubs (Q5_K: at most 31 x 128 x 2, no saturation), each sub-block's
   int16 pairs times its scale by madd, summed in int32 */
TD_AVX2 TD_INLINE float dot_q45_K_avx2(const int q5, int64_t k, const void *vw, const void *vx)
{
    const block_q8_K *x = vx;
    const __m256i m4 = _mm256_set1_epi8(15);
    float sum = 0.0f;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const block_q4_K *w4 = (const block_q4_K *)vw + i;
        const block_q5_K *w5 = (const block_q5_K *)vw + i;
        const uint8_t *qs = q5 ? w5->qs : w4->qs;
        uint8_t sm[16];
        scales_mins_k4(q5 ? w5->scales : w4->scales, sm);
        const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)w5->qh) : _mm256_setzero_si256();
        __m256i acc = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (q5) { /* bit 2j of qh[l] for weight 64j + l, bit 2j + 1 for 64j + 32 + l */
                const __m256i b = _mm256_set1_epi8(1);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), b), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), b), 4));
            }
            const __m256i xl = _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * j));
            const __m256i xh = _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * j + 32));
            const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_set1_epi16(sm[2 * j]));
            const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), _mm256_set1_epi16(sm[2 * j + 1]));
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(pl, ph));
        }
        sum += k_terms(_cvtsh_ss(q5 ? w5->d : w4->d), _cvtsh_ss(q5 ? w5->dmin : w4->dmin), x[i].d, hsum_i32_8(acc),
                       min_dot_32(sm + 8, x[i].bsums), 1);
    }
    return sum;
}

TD_AVX2 static float vec_dot_q4_K_q8_K_avx2(int64_t k, const void *w, const void *x) { return dot_q45_K_avx2(0, k, w, x); }
TD_AVX2 static float vec_dot_q5_K_q8_K_avx2(int64_t k, const void *w, const void *x) { return dot_q45_K_avx2(1, k, w, x); }

/* sum_s sc[s] (x's sum in sub-block s of 16), sc 16 int16 lanes */
TD_AVX2 TD_INLINE int32_t scaled_bsums_16(__m256i sc16, const int16_t *bsums)
{
    return hsum_i32_8(_mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)bsums)));
}

/* the int16 scales of sub-blocks 2c (lanes 0..7) and 2c+1 (lanes 8..15), of 16 int8 scales */
TD_AVX2 TD_INLINE __m256i pair_scales(__m128i sc8, int c)
{
    const __m128i pick = _mm_set_epi64x(0x0101010101010101ll * (2 * c + 1), 0x0101010101010101ll * (2 * c));
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
}

/* Q6_K by Q8_K: the quants unsigned (q + 32, 0..63) by x in maddubs, each sub-block of 16's pairs
   times its signed scale by madd; the 32 comes back once a super-block, 32 sum_s sc[s] (x's sum) */
TD_AVX2 static float vec_dot_q6_K_q8_K_avx2(int64_t k, const void *vw, const void *vx)
{
    const block_q6_K *w = vw;
    const block_q8_K *x = vx;
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    float sum = 0.0f;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)w[i].scales);
        __m256i acc = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h));
            for (int c = 0; c < 4; c++) { /* weights 128h + 32c ..: nibble c / 2 of l0 (c even) or l1 */
                const __m256i l = c % 2 ? l1 : l0;
                const __m256i low = _mm256_and_si256(c < 2 ? l : _mm256_srli_epi16(l, 4), m4);
                const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), m2), 4);
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(x[i].qs + 128 * h + 32 * c));
                const __m256i p = _mm256_maddubs_epi16(_mm256_or_si256(low, high), xq);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, pair_scales(sc8, 4 * h + c)));
            }
        }
        const int32_t isum = hsum_i32_8(acc) - 32 * scaled_bsums_16(_mm256_cvtepi8_epi16(sc8), x[i].bsums);
        sum += k_terms(_cvtsh_ss(w[i].d), 0.0f, x[i].d, isum, 0, 0);
    }
    return sum;
}


/* AVX2's own functions of the K types, per type; a field left out is quant_x86.c's, or plain C's */
const struct type_traits td_traits_avx2_k[TD_NTYPES] = {
    [TD_Q4_K] = {.vec_dot = vec_dot_q4_K_q8_K_avx2}, [TD_Q5_K] = {.vec_dot = vec_dot_q5_K_q8_K_avx2},
    [TD_Q6_K] = {.vec_dot = vec_dot_q6_K_q8_K_avx2},
};

/* AVX-512's: AVX2's for now */
const struct type_traits td_traits_avx512_k[TD_NTYPES] = {
    [TD_Q4_K] = {.vec_dot = vec_dot_q4_K_q8_K_avx2}, [TD_Q5_K] = {.vec_dot = vec_dot_q5_K_q8_K_avx2},
    [TD_Q6_K] = {.vec_dot = vec_dot_q6_K_q8_K_avx2},
};

/* the extension each AVX-512 entry needs; without it the AVX2 entry is used */
const int td_traits_avx512_k_needs[TD_NTYPES] = {0};
#endif
