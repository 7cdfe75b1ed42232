/* quant_x86_k.c: the K-quants' kernels on x86-64 (Q2_K .. Q6_K, IQ4_XS, Q8_K and the Q8_K x
   quantizer; ggml-cpu/arch/x86/quants.c's ggml_vec_dot_q*_K_q8_K), AVX2 (+FMA, F16C) and AVX-512,
   and their tables, td_traits_avx2_k and td_traits_avx512_k, which quant.c lays over quant_x86.c's
   (the types are disjoint): a reader finds Q4_K's AVX2 dot product here by the file's name.

   Every dot product is bit for bit quant_ref.c's K_DOT: each super-block's integer sums (sub-block
   dot products times their integer scales, the minimums through x's sums of 16) made exactly in
   registers, then plain C's float steps for the super-block, in its order, one super-block after
   another (tests/test_block_formats.py and tests/test_kquants_x86.py pin every level to plain C).
   A type's integer work is one function, sums_<type>_<isa>, giving lanes whose sums are the
   super-block's two integers (struct k_sums); the row (vec_dot) and the tile of 4 weight rows by
   up to 4 x rows (vec_dot_4xn) are written once over it (K_ROWS): the tile adds 4 rows' lanes
   across at once and takes its 4 rows' float steps in the 4 lanes of one register (each lane its
   row's own chain, the same operations: the same bits), where a row waits on its own chain.
   AVX2: every type, the x quantizer (both levels use it) and Q8_K back to f32 (the GEMM's x).
   AVX-512 (with AVX512_VNNI; without it, AVX2's entries): Q2_K .. Q6_K, 128 weights a step in a
   zmm, vpdpwssd applying the scales; IQ4_XS and Q8_K keep AVX2's (their sign trick has no 512-bit
   form). Single thread, 1 x row by 640 x 2048 (bench/bench_kquants.py), a Xeon: Q4_K 43 us
   against 61 before this file had AVX-512 and the tile, Q4_0 (interleaved, as loaded) 26.

   The integer tricks (learnt from llama.cpp's x86 kernels): maddubs multiplies unsigned bytes by
   signed ones, so a format's signed quants go in with an offset that makes them unsigned (Q3_K's
   q + 4, Q6_K's q + 32), taken back once a super-block through x's sums of 16 (bsums), or through
   the sign trick, |a| . sign(b, a) = a . b (IQ4_XS, Q8_K); a pair of products stays within int16
   (at most 2 x 127 x 128), each sub-block's pairs times its scale by madd, in int32. */
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

/* a K type's super-block's float terms, as quant_ref.c's K_DOT: (d_w d_x) isum - (dmin_w d_x) imin */
TD_INLINE float k_terms(float d, float dmin, float dx, int32_t isum, int32_t imin, const int has_min)
{
    const float t = fixed(d * dx * (float)isum);
    return has_min ? t - fixed(dmin * dx * (float)imin) : t;
}

/* ---- x to Q8_K, and back ---- */

/* quantize_row_q8_K_ref in 8 lanes: the largest magnitude (NaN passed over, as its > does: maxps
   gives its second operand when either is NaN), the first number of that magnitude, iscale =
   -127 / it; rint(iscale x) clamped (minps: NaN to 127, as fminf), packed to bytes; the sums of
   16 by maddubs with ones and three rounds of hadd */
TD_AVX2 static void quantize_row_q8_K_avx2(const float *x, void *vy, int64_t k)
{
    block_q8_K *y = vy;
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), ones = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8)
            m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), magnitude), m);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        int first = 0;
        for (int j = 0; j < QK_K; j += 8) {
            const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + j), magnitude);
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (hit) {
                first = j + __builtin_ctz((unsigned)hit);
                break;
            }
        }
        const float iscale = -127.0f / x[first];
        const __m256 s = _mm256_set1_ps(iscale), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-128.0f);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            for (int c = 0; c < 4; c++) {
                const __m256 r = _mm256_round_ps(_mm256_mul_ps(s, _mm256_loadu_ps(x + j + 8 * c)),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                q[c] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(r, hi), lo));
            }
            const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), _mm256_permutevar8x32_epi32(b, order));
        }
        __m256i p[8]; /* lanes 0..7: pair sums of the 16 quants of sum 2c, lanes 8..15 of sum 2c + 1 */
        for (int c = 0; c < 8; c++)
            p[c] = _mm256_maddubs_epi16(ones, _mm256_loadu_si256((const __m256i *)(y[i].qs + 32 * c)));
        for (int c = 0; c < 4; c++)
            p[c] = _mm256_hadd_epi16(p[2 * c], p[2 * c + 1]);
        p[0] = _mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3]));
        const __m128i even = _mm256_castsi256_si128(p[0]), odd = _mm256_extracti128_si256(p[0], 1); /* 0, 2, ..; 1, 3, .. */
        _mm_storeu_si128((__m128i *)y[i].bsums, _mm_unpacklo_epi16(even, odd));
        _mm_storeu_si128((__m128i *)(y[i].bsums + 8), _mm_unpackhi_epi16(even, odd));
        y[i].d = 1.0f / iscale;
    }
}

TD_AVX2 static void q8_K_to_float_avx2(const void *vx, float *y, int64_t k)
{
    const block_q8_K *b = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const __m256 d = _mm256_set1_ps(b[i].d);
        for (int j = 0; j < QK_K; j += 8) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b[i].qs + j)));
            _mm256_storeu_ps(y + i * QK_K + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
        }
    }
}

/* ---- AVX2: each type's integer sums of a super-block ---- */

struct k_sums {
    __m256i sum, min; /* 8 int32 lanes each, whose sums are K_DOT's scaled_dot and min_dot */
};

/* the int16 scales of sub-blocks 2c (lanes 0..7) and 2c+1 (lanes 8..15), of up to 16 int8 scales */
TD_AVX2 TD_INLINE __m256i pair_scales(__m128i sc8, int c)
{
    const __m128i pick = _mm_set_epi64x(0x0101010101010101ll * (2 * c + 1), 0x0101010101010101ll * (2 * c));
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
}

/* lanes whose sum is sum_s sc[s] (x's sum in sub-block s of 16), sc 16 int16 lanes */
TD_AVX2 TD_INLINE __m256i scaled_bsums_16(__m256i sc16, const int16_t *bsums)
{
    return _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)bsums));
}

/* Q4_K's and Q5_K's 8 scales (bytes 0..7) and 8 minimums (bytes 8..15) of a super-block, from
   its 12 bytes (and 4 of the quants after them, unused): scale_min_k4's bits, 4 sub-blocks a
   32-bit lane, in registers (a store of words read back as wider loads stalls store forwarding) */
TD_AVX2 TD_INLINE __m128i scales_mins_k4(const uint8_t *p)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)p);        /* words a0 a1 a2 (and one more) */
    const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)); /* a0 a2 a1 a2 */
    const __m128i b = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)); /* a0 a0 a1 a1 */
    const __m128i low = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                      _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i top = _mm_and_si128(_mm_srli_epi32(b, 6), _mm_setr_epi32(0, 0x03030303, 0, 0x03030303));
    return _mm_or_si128(low, _mm_slli_epi32(top, 4)); /* scales 0..3, 4..7, minimums 0..3, 4..7 */
}

/* lanes whose sum is sum_s mn[s] (x's sum in sub-block s of 32), mn 8 int16, x's 16 sums of 16 */
TD_AVX2 TD_INLINE __m256i min_dot_32(__m128i mn, const int16_t *bsums)
{
    const __m256i b = _mm256_loadu_si256((const __m256i *)bsums);
    const __m128i sums = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)); /* 8 of 32 */
    return _mm256_zextsi128_si256(_mm_madd_epi16(mn, sums));
}

/* int16 word w of v in all 16 lanes */
TD_AVX2 TD_INLINE __m256i word_16(__m128i v, int w)
{
    return _mm256_broadcastsi128_si256(_mm_shuffle_epi8(v, _mm_set1_epi16((short)((2 * w + 1) << 8 | 2 * w))));
}

/* Q2_K: 32 bytes of quants a half, crumb j of each the weights 128h + 32j + l (sub-blocks 8h + 2j
   and 8h + 2j + 1), unsigned (0..3) by x; the minimums by the bsums */
TD_AVX2 TD_INLINE struct k_sums sums_q2_K_avx2(const block_q2_K *w, const block_q8_K *x)
{
    const __m128i sc = _mm_loadu_si128((const __m128i *)w->scales), m4 = _mm_set1_epi8(15);
    const __m128i sc8 = _mm_and_si128(sc, m4), mn8 = _mm_and_si128(_mm_srli_epi16(sc, 4), m4);
    const __m256i m2 = _mm256_set1_epi8(3);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * h));
        for (int j = 0; j < 4; j++) {
            const __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m2);
            const __m256i xq = _mm256_loadu_si256((const __m256i *)(x->qs + 128 * h + 32 * j));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, xq), pair_scales(sc8, 4 * h + j)));
        }
    }
    return (struct k_sums){acc, scaled_bsums_16(_mm256_cvtepu8_epi16(mn8), x->bsums)};
}

/* Q3_K's 16 6-bit scales - 32 as bytes: the low 4 bits in bytes 0..7 (low nibbles: scales 0..7,
   high: 8..15), the high 2 bits in bytes 8..11 (bits 2t..2t+1 of byte 8 + s % 4 for s / 4 = t) */
TD_AVX2 TD_INLINE __m128i scales_q3_K(const uint8_t p[K_SCALE_SIZE])
{
    uint32_t a2;
    memcpy(&a2, p + 8, 4); /* 12 bytes: a 16-byte load would pass the last block's end */
    const __m128i v = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)p), (int)a2, 2); /* words a0 a1 a2 */
    const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 1, 0)); /* a0 a1 a0 a1: the low 4 bits */
    const __m128i b = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2)); /* a2: the high 2 */
    const __m128i low = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 4, 4)), _mm_set1_epi32(0x0f0f0f0f));
    const __m128i high = _mm_and_si128(_mm_srlv_epi32(b, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi32(0x03030303));
    return _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi32(high, 4)), _mm_set1_epi8(32));
}

/* Q3_K: q + 4 = the low 2 bits | the high bit << 2 (0..7) unsigned by x, placed as Q2_K's; the 4
   comes back once a super-block, 4 sum_s sc[s] (x's sum in s) */
TD_AVX2 TD_INLINE struct k_sums sums_q3_K_avx2(const block_q3_K *w, const block_q8_K *x)
{
    const __m128i sc8 = scales_q3_K(w->scales);
    const __m256i m2 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
    const __m256i hm = _mm256_loadu_si256((const __m256i *)w->hmask);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * h));
        for (int j = 0; j < 4; j++) { /* the high bit of weight 32 (4h + j) + l: bit 4h + j of hmask[l] */
            const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), m1), 2);
            const __m256i u = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m2), high);
            const __m256i xq = _mm256_loadu_si256((const __m256i *)(x->qs + 128 * h + 32 * j));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, xq), pair_scales(sc8, 4 * h + j)));
        }
    }
    const __m256i offset = _mm256_slli_epi32(scaled_bsums_16(_mm256_cvtepi8_epi16(sc8), x->bsums), 2);
    return (struct k_sums){_mm256_sub_epi32(acc, offset), _mm256_setzero_si256()};
}

/* Q4_K (q5 0) and Q5_K (q5 1): 64 weights a step (32 bytes of nibbles: sub-blocks 2j and 2j+1),
   unsigned by x in maddubs (Q5_K: at most 31 x 128 x 2, no saturation), each sub-block's int16
   pairs times its scale by madd, summed in int32 */
TD_AVX2 TD_INLINE struct k_sums sums_q45_K_avx2(const int q5, const void *vw, const block_q8_K *x)
{
    const block_q4_K *w4 = vw;
    const block_q5_K *w5 = vw;
    const __m256i m4 = _mm256_set1_epi8(15);
    const uint8_t *qs = q5 ? w5->qs : w4->qs;
    const __m128i sm = scales_mins_k4(q5 ? w5->scales : w4->scales), sc = _mm_cvtepu8_epi16(sm);
    const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)w5->qh) : _mm256_setzero_si256();
    __m256i acc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int j = 0; j < 4; j++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (q5) { /* bit 2j of qh[l] for weight 64j + l, bit 2j + 1 for 64j + 32 + l */
            const __m256i b = _mm256_set1_epi8(1);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), b), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), b), 4));
        }
        const __m256i xl = _mm256_loadu_si256((const __m256i *)(x->qs + 64 * j));
        const __m256i xh = _mm256_loadu_si256((const __m256i *)(x->qs + 64 * j + 32));
        const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), word_16(sc, 2 * j));
        const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), word_16(sc, 2 * j + 1));
        acc[j % 2] = _mm256_add_epi32(acc[j % 2], _mm256_add_epi32(pl, ph));
    }
    return (struct k_sums){_mm256_add_epi32(acc[0], acc[1]), min_dot_32(_mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)), x->bsums)};
}

TD_AVX2 TD_INLINE struct k_sums sums_q4_K_avx2(const block_q4_K *w, const block_q8_K *x) { return sums_q45_K_avx2(0, w, x); }
TD_AVX2 TD_INLINE struct k_sums sums_q5_K_avx2(const block_q5_K *w, const block_q8_K *x) { return sums_q45_K_avx2(1, w, x); }

/* Q6_K: the quants unsigned (q + 32, 0..63) by x in maddubs, each sub-block of 16's pairs times its
   signed scale by madd; the 32 comes back once a super-block, 32 sum_s sc[s] (x's sum) */
TD_AVX2 TD_INLINE struct k_sums sums_q6_K_avx2(const block_q6_K *w, const block_q8_K *x)
{
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)w->scales);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(w->ql + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(w->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(w->qh + 32 * h));
        for (int c = 0; c < 4; c++) { /* weights 128h + 32c ..: nibble c / 2 of l0 (c even) or l1 */
            const __m256i l = c % 2 ? l1 : l0;
            const __m256i low = _mm256_and_si256(c < 2 ? l : _mm256_srli_epi16(l, 4), m4);
            const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), m2), 4);
            const __m256i xq = _mm256_loadu_si256((const __m256i *)(x->qs + 128 * h + 32 * c));
            const __m256i p = _mm256_maddubs_epi16(_mm256_or_si256(low, high), xq);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, pair_scales(sc8, 4 * h + c)));
        }
    }
    const __m256i offset = _mm256_slli_epi32(scaled_bsums_16(_mm256_cvtepi8_epi16(sc8), x->bsums), 5);
    return (struct k_sums){_mm256_sub_epi32(acc, offset), _mm256_setzero_si256()};
}

/* IQ4_XS's 8 6-bit scales - 32 as bytes: the low 4 bits nibble s % 2 of scales_l[s / 2], the high
   2 bits bits 2s..2s+1 of scales_h, spread to a byte each by three shifts and masks */
TD_AVX2 TD_INLINE __m128i scales_iq4_xs(const block_iq4_xs *w)
{
    uint32_t l;
    memcpy(&l, w->scales_l, 4);
    const __m128i low = _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)(l & 0x0f0f0f0f)),
                                          _mm_cvtsi32_si128((int)(l >> 4 & 0x0f0f0f0f)));
    uint64_t h = w->scales_h;
    h = (h | h << 24) & 0x000000FF000000FFull;  /* scales 0..3's bits in byte 0, 4..7's in byte 4 */
    h = (h | h << 12) & 0x000F000F000F000Full;  /* two scales' bits a 16-bit word */
    h = (h | h << 6) & 0x0303030303030303ull;   /* one a byte */
    const __m128i high = _mm_slli_epi16(_mm_cvtsi64_si128((long long)h), 4);
    return _mm_sub_epi8(_mm_or_si128(low, high), _mm_set1_epi8(32));
}

/* IQ4_XS: the grid's values looked up by pshufb, 64 weights a step (32 bytes of indices: sub-blocks
   2p and 2p+1, low nibbles the first 16 of each, high ones the next), the sign trick, x's halves
   loaded to match (|grid| <= 127: a pair of products fits int16) */
TD_AVX2 TD_INLINE struct k_sums sums_iq4_xs_avx2(const block_iq4_xs *w, const block_q8_K *x)
{
    const __m256i grid = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m128i sc8 = scales_iq4_xs(w);
    __m256i acc = _mm256_setzero_si256();
    for (int p = 0; p < 4; p++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * p));
        const __m256i lo = _mm256_shuffle_epi8(grid, _mm256_and_si256(q, m4)); /* weights 64p + 0..15, 32..47 */
        const __m256i hi = _mm256_shuffle_epi8(grid, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)); /* 16..31, 48..63 */
        const int8_t *xp = x->qs + 64 * p;
        const __m256i xl = _mm256_loadu2_m128i((const __m128i *)(xp + 32), (const __m128i *)xp);
        const __m256i xh = _mm256_loadu2_m128i((const __m128i *)(xp + 48), (const __m128i *)(xp + 16));
        const __m256i s = pair_scales(sc8, p);
        const __m256i pl = _mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(xl, lo));
        const __m256i ph = _mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(xh, hi));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(pl, s), _mm256_madd_epi16(ph, s)));
    }
    return (struct k_sums){acc, _mm256_setzero_si256()};
}

/* Q8_K weights: the sign trick (a weight of -128 is 128 unsigned; x is never -128) */
TD_AVX2 TD_INLINE struct k_sums sums_q8_K_avx2(const block_q8_K *w, const block_q8_K *x)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < QK_K; c += 32) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(w->qs + c));
        const __m256i xq = _mm256_loadu_si256((const __m256i *)(x->qs + c));
        const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xq, q));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
    }
    return (struct k_sums){acc, _mm256_setzero_si256()};
}

/* ---- the rows and tiles over the sums ---- */

/* the sum of 8 int32 lanes */
TD_AVX2 TD_INLINE int32_t hsum_i32_8(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
}

/* the lane sums of 4 vectors, in the 4 lanes of one */
TD_AVX2 TD_INLINE __m128i hsum4_i32_8(__m256i a, __m256i b, __m256i c, __m256i d)
{
    const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

/* fixed() of 4 lanes */
TD_INLINE __m128 fixed4(__m128 p)
{
    __asm__("" : "+x"(p));
    return p;
}

/* a weight block's scale field f as a float (F16 or F32, as the format stores it), of block b, or
   of the tile's 4 rows' blocks rb[0..3] in 4 lanes */
#define SCALAR_F16(f) _cvtsh_ss(b->f)
#define SCALAR_F32(f) (b->f)
#define ROWS4_F16(f) _mm_cvtph_ps(_mm_setr_epi16((short)rb[0]->f, (short)rb[1]->f, (short)rb[2]->f, (short)rb[3]->f, 0, 0, 0, 0))
#define ROWS4_F32(f) _mm_setr_ps(rb[0]->f, rb[1]->f, rb[2]->f, rb[3]->f)

/* vec_dot and vec_dot_4xn (quant.h) of a type over its sums_<type>_<isa>: super-block after
   super-block, each row's terms as K_DOT's (the block's scales d and, where has_min, dmin, stored
   as F, F16 or F32); the tile's 4 rows side by side in the lanes of its float steps, each lane the
   row's own chain */
#define K_ROWS(type, isa, has_min, TARGET, HSUM, HSUM4, MSUM, MSUM4, F)                                        \
    TARGET static float vec_dot_##type##_q8_K_##isa(int64_t k, const void *vw, const void *vx)                \
    {                                                                                                         \
        const block_q8_K *x = vx;                                                                             \
        float sum = 0.0f;                                                                                     \
        for (int64_t i = 0; i < k / QK_K; i++) {                                                              \
            const block_##type *b = (const block_##type *)vw + i;                                             \
            const __auto_type s = sums_##type##_##isa(b, &x[i]);                                              \
            sum += k_terms(SCALAR_##F(d), has_min ? SCALAR_##F(DMIN_##type) : 0.0f, x[i].d, HSUM(s.sum),       \
                           has_min ? MSUM(s.min) : 0, has_min);                                               \
        }                                                                                                     \
        return sum;                                                                                           \
    }                                                                                                         \
    TARGET static void vec_dot_4xn_##type##_q8_K_##isa(int64_t k, const void *vw, int64_t row_bytes,          \
                                                       const void *vx, int64_t x_bytes, int nx, float *y,     \
                                                       int64_t ldy)                                           \
    {                                                                                                         \
        for (int n = 0; n < nx; n++) {                                                                        \
            const block_q8_K *x = (const block_q8_K *)((const char *)vx + n * x_bytes);                       \
            __m128 sum = _mm_setzero_ps();                                                                    \
            for (int64_t i = 0; i < k / QK_K; i++) {                                                          \
                const block_##type *rb[4];                                                                    \
                __typeof__(sums_##type##_##isa(0, 0)) s[4];                                                   \
                for (int r = 0; r < 4; r++)                                                                   \
                    rb[r] = (const block_##type *)((const char *)vw + r * row_bytes) + i;                     \
                sums4_##type##_##isa(rb, &x[i], s);                                                           \
                const __m128 dx = _mm_set1_ps(x[i].d);                                                        \
                __m128 t = fixed4(_mm_mul_ps(_mm_mul_ps(ROWS4_##F(d), dx),                                        \
                                             _mm_cvtepi32_ps(HSUM4(s[0].sum, s[1].sum, s[2].sum, s[3].sum))));  \
                if (has_min)                                                                                  \
                    t = _mm_sub_ps(t, fixed4(_mm_mul_ps(_mm_mul_ps(ROWS4_##F(DMIN_##type), dx),                          \
                                             _mm_cvtepi32_ps(MSUM4(s[0].min, s[1].min, s[2].min, s[3].min))))); \
                sum = _mm_add_ps(sum, t);                                                                     \
            }                                                                                                 \
            _mm_storeu_ps(y + n * ldy, sum);                                                                  \
        }                                                                                                     \
    }

/* a type's sums of 4 rows' super-blocks by one x super-block: each row's own (a type may do better) */
#define K_SUMS4(type, isa, TARGET)                                                                            \
    TARGET TD_INLINE void sums4_##type##_##isa(const block_##type *rb[4], const block_q8_K *x,                \
                                               __typeof__(sums_##type##_##isa(0, 0)) s[4])                    \
    {                                                                                                         \
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)                                                   \
            s[r] = sums_##type##_##isa(rb[r], x);                                                             \
    }

/* the field of each type's minimums' scale (d where it has none: never read) */
#define DMIN_q2_K dmin
#define DMIN_q3_K d
#define DMIN_q4_K dmin
#define DMIN_q5_K dmin
#define DMIN_q6_K d
#define DMIN_iq4_xs d
#define DMIN_q8_K d

#define K_ROWS_AVX2(type, has_min, F) K_SUMS4(type, avx2, TD_AVX2) \
    K_ROWS(type, avx2, has_min, TD_AVX2, hsum_i32_8, hsum4_i32_8, hsum_i32_8, hsum4_i32_8, F)
K_ROWS_AVX2(q2_K, 1, F16)
K_ROWS_AVX2(q3_K, 0, F16)
K_ROWS_AVX2(q4_K, 1, F16)
K_ROWS_AVX2(q5_K, 1, F16)
K_ROWS_AVX2(q6_K, 0, F16)
K_ROWS_AVX2(iq4_xs, 0, F16)
K_ROWS_AVX2(q8_K, 0, F32)
#undef K_ROWS_AVX2

/* ---- AVX-512 (AVX512BW for maddubs on zmm, AVX512_VNNI for vpdpwssd: madd and add in one): the
   same sums, 128 weights a step, each sub-block's int16 pairs times its scale added to int32 lanes
   by vpdpwssd; the scales made int16 vectors by a word permute a step. IQ4_XS and Q8_K keep AVX2's:
   their sign trick has no 512-bit form. ---- */

struct k_sums512 {
    __m512i sum; /* 16 int32 lanes whose sum is scaled_dot */
    __m256i min; /* 8 whose sum is min_dot */
};

/* lanes i of the result: word idx[i] of 16 int16 scales s */
TD_AVX512_VNNI TD_INLINE __m512i scale_words(__m256i s, const uint16_t idx[32])
{
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(idx), _mm512_castsi256_si512(s));
}

/* sub-block (of 32) of each int16 lane of a step's two vectors: Q4_K's and Q5_K's low nibbles and
   high ones, steps t = 0, 1; and the same words of the upper half of a zmm of scales (+ 16) */
static const uint16_t sub32[2][4][32] = {
#define HALF(a, b) a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b
    {{HALF(0, 2)}, {HALF(1, 3)}, {HALF(4, 6)}, {HALF(5, 7)}},
    {{HALF(16, 18)}, {HALF(17, 19)}, {HALF(20, 22)}, {HALF(21, 23)}},
#undef HALF
};

/* Q4_K (q5 0) and Q5_K (q5 1): a step t is 64 bytes of nibbles, sub-blocks 4t .. 4t + 3 (low
   nibbles of the first 32 bytes, high ones, low of the next 32, high), x's 128 quants regrouped by
   128-bit lanes to match (the same for a tile's 4 rows: the compiler makes them once); Q5_K's
   fifth bits added (16) where a byte test of qh finds them. The scales and minimums come made, as
   16 words in half `half` of sm (scales_mins_k4's bytes widened) */
TD_AVX512_VNNI TD_INLINE struct k_sums512 sums_q45_K_made(const int q5, const void *vw, const block_q8_K *x,
                                                           __m512i sm, const int half)
{
    const block_q4_K *w4 = vw;
    const block_q5_K *w5 = vw;
    const __m512i m4 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
    const uint8_t *qs = q5 ? w5->qs : w4->qs;
    const __m512i qh = q5 ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)w5->qh)) : _mm512_setzero_si512();
    __m512i acc[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int t = 0; t < 2; t++) {
        const __m512i q = _mm512_loadu_si512(qs + 64 * t);
        __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        if (q5) { /* sub-block s's fifth bit: bit s of qh[l]; lo holds s = 4t, 4t + 2, hi 4t + 1, 4t + 3 */
            const __m512i blo = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << 4 * t)), _mm256_set1_epi8((char)(4 << 4 * t)), 1);
            lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, blo), lo, sixteen);
            hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, _mm512_add_epi8(blo, blo)), hi, sixteen);
        }
        const __m512i xa = _mm512_loadu_si512(x->qs + 128 * t), xb = _mm512_loadu_si512(x->qs + 128 * t + 64);
        const __m512i xlo = _mm512_shuffle_i64x2(xa, xb, _MM_SHUFFLE(1, 0, 1, 0)); /* sub-blocks 4t, 4t + 2 */
        const __m512i xhi = _mm512_shuffle_i64x2(xa, xb, _MM_SHUFFLE(3, 2, 3, 2)); /* 4t + 1, 4t + 3 */
        const __m512i slo = _mm512_permutexvar_epi16(_mm512_loadu_si512(sub32[half][2 * t]), sm);
        const __m512i shi = _mm512_permutexvar_epi16(_mm512_loadu_si512(sub32[half][2 * t + 1]), sm);
        acc[0] = _mm512_dpwssd_epi32(acc[0], _mm512_maddubs_epi16(lo, xlo), slo);
        acc[1] = _mm512_dpwssd_epi32(acc[1], _mm512_maddubs_epi16(hi, xhi), shi);
    }
    const __m128i mn = half ? _mm512_extracti32x4_epi32(sm, 3) : _mm512_extracti32x4_epi32(sm, 1);
    return (struct k_sums512){_mm512_add_epi32(acc[0], acc[1]), min_dot_32(mn, x->bsums)};
}

TD_AVX512_VNNI TD_INLINE struct k_sums512 sums_q45_K_avx512(const int q5, const void *vw, const block_q8_K *x)
{
    const __m128i sm = scales_mins_k4(q5 ? ((const block_q5_K *)vw)->scales : ((const block_q4_K *)vw)->scales);
    return sums_q45_K_made(q5, vw, x, _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(sm)), 0);
}

/* 4 rows: scales_mins_k4 on the 4 rows' bytes at once, a row a 128-bit lane, widened two rows a zmm */
TD_AVX512_VNNI TD_INLINE void sums4_q45_K_avx512(const int q5, const void *const rb[4], const block_q8_K *x,
                                                 struct k_sums512 s[4])
{
    __m512i v = _mm512_setzero_si512();
    for (int r = 0; r < 4; r++) {
        const uint8_t *p = q5 ? ((const block_q5_K *)rb[r])->scales : ((const block_q4_K *)rb[r])->scales;
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)p), r);
    }
    const __m512i a = _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)_MM_SHUFFLE(2, 1, 2, 0));
    const __m512i b = _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 1, 0, 0));
    const __m512i low = _mm512_and_si512(_mm512_srlv_epi32(a, _mm512_broadcast_i32x4(_mm_setr_epi32(0, 0, 0, 4))),
                                         _mm512_broadcast_i32x4(_mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f)));
    const __m512i top = _mm512_and_si512(_mm512_srli_epi32(b, 6), _mm512_broadcast_i32x4(_mm_setr_epi32(0, 0x03030303, 0, 0x03030303)));
    const __m512i o = _mm512_or_si512(low, _mm512_slli_epi32(top, 4));
    const __m512i w01 = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(o)), w23 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(o, 1));
    s[0] = sums_q45_K_made(q5, rb[0], x, w01, 0);
    s[1] = sums_q45_K_made(q5, rb[1], x, w01, 1);
    s[2] = sums_q45_K_made(q5, rb[2], x, w23, 0);
    s[3] = sums_q45_K_made(q5, rb[3], x, w23, 1);
}

TD_AVX512_VNNI TD_INLINE struct k_sums512 sums_q4_K_avx512(const block_q4_K *w, const block_q8_K *x) { return sums_q45_K_avx512(0, w, x); }
TD_AVX512_VNNI TD_INLINE struct k_sums512 sums_q5_K_avx512(const block_q5_K *w, const block_q8_K *x) { return sums_q45_K_avx512(1, w, x); }
TD_AVX512_VNNI TD_INLINE void sums4_q4_K_avx512(const block_q4_K *rb[4], const block_q8_K *x, struct k_sums512 s[4])
{
    sums4_q45_K_avx512(0, (const void *const *)rb, x, s);
}
TD_AVX512_VNNI TD_INLINE void sums4_q5_K_avx512(const block_q5_K *rb[4], const block_q8_K *x, struct k_sums512 s[4])
{
    sums4_q45_K_avx512(1, (const void *const *)rb, x, s);
}

/* sub-block (of 16) of each int16 lane of a 64-weight vector: 4u .. 4u + 3, 8 lanes each */
static const uint16_t sub16[4][32] = {
#define QUARTER(a) a, a, a, a, a, a, a, a, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, \
                   a + 2, a + 2, a + 2, a + 2, a + 2, a + 2, a + 2, a + 2, a + 3, a + 3, a + 3, a + 3, a + 3, a + 3, a + 3, a + 3
    {QUARTER(0)}, {QUARTER(4)}, {QUARTER(8)}, {QUARTER(12)},
#undef QUARTER
};

/* Q6_K: a half h is 64 bytes of ql (nibble 0: weights 128h + 0..63, nibble 1: + 64..127, x's
   order as they are) and 32 of qh (crumb c for weights 128h + 32c + l), both halves of a zmm
   shifted by their own count */
TD_AVX512_VNNI TD_INLINE struct k_sums512 sums_q6_K_avx512(const block_q6_K *w, const block_q8_K *x)
{
    const __m512i m4 = _mm512_set1_epi8(15), m2 = _mm512_set1_epi8(3);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)w->scales);
    const __m256i sc = _mm256_cvtepi8_epi16(sc8);
    const __m512i shift01 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1); /* crumbs 0, 1 */
    const __m512i shift23 = _mm512_add_epi16(shift01, _mm512_set1_epi16(4));                     /* 2, 3 */
    __m512i acc[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int h = 0; h < 2; h++) {
        const __m512i l = _mm512_loadu_si512(w->ql + 64 * h);
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w->qh + 32 * h)));
        const __m512i ua = _mm512_or_si512(_mm512_and_si512(l, m4),
                                           _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift01), m2), 4));
        const __m512i ub = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                           _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift23), m2), 4));
        const __m512i xa = _mm512_loadu_si512(x->qs + 128 * h), xb = _mm512_loadu_si512(x->qs + 128 * h + 64);
        acc[0] = _mm512_dpwssd_epi32(acc[0], _mm512_maddubs_epi16(ua, xa), scale_words(sc, sub16[2 * h]));
        acc[1] = _mm512_dpwssd_epi32(acc[1], _mm512_maddubs_epi16(ub, xb), scale_words(sc, sub16[2 * h + 1]));
    }
    const __m256i offset = _mm256_slli_epi32(scaled_bsums_16(sc, x->bsums), 5);
    return (struct k_sums512){_mm512_sub_epi32(_mm512_add_epi32(acc[0], acc[1]), _mm512_zextsi256_si512(offset)),
                              _mm256_setzero_si256()};
}

/* Q2_K (q3 0) and Q3_K (q3 1): the two halves h side by side in a zmm (64 bytes of quants), crumb j
   of each for weights 32j + l and 128 + 32j + l (sub-blocks 2j, 2j + 1, 8 + 2j, 9 + 2j), x's two
   runs of 32 put together to match; Q3_K's high bit (+4) where a byte test of hmask finds it */
static const uint16_t sub16_q2[4][32] = {
#define RUNS(a) a, a, a, a, a, a, a, a, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, \
                a + 8, a + 8, a + 8, a + 8, a + 8, a + 8, a + 8, a + 8, a + 9, a + 9, a + 9, a + 9, a + 9, a + 9, a + 9, a + 9
    {RUNS(0)}, {RUNS(2)}, {RUNS(4)}, {RUNS(6)},
#undef RUNS
};

TD_AVX512_VNNI TD_INLINE struct k_sums512 sums_q23_K_avx512(const int q3, const void *vw, const block_q8_K *x)
{
    const block_q2_K *w2 = vw;
    const block_q3_K *w3 = vw;
    const __m512i m2 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    __m128i sc8, mn8 = _mm_setzero_si128();
    if (q3)
        sc8 = scales_q3_K(w3->scales);
    else {
        const __m128i s = _mm_loadu_si128((const __m128i *)w2->scales), m4 = _mm_set1_epi8(15);
        sc8 = _mm_and_si128(s, m4), mn8 = _mm_and_si128(_mm_srli_epi16(s, 4), m4);
    }
    const __m256i sc = _mm256_cvtepi8_epi16(sc8);
    const __m512i q = _mm512_loadu_si512(q3 ? w3->qs : w2->qs);
    const __m512i hm = q3 ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)w3->hmask)) : _mm512_setzero_si512();
    __m512i acc[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int j = 0; j < 4; j++) {
        __m512i u = _mm512_and_si512(_mm512_srli_epi16(q, 2 * j), m2);
        if (q3) /* weight 32 (4h + j) + l's high bit: bit 4h + j of hmask[l] */
            u = _mm512_mask_add_epi8(u, _mm512_test_epi8_mask(hm, _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << j)),
                                                                                     _mm256_set1_epi8((char)(16 << j)), 1)),
                                     u, four);
        const __m512i xq = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(x->qs + 32 * j))),
                                              _mm256_loadu_si256((const __m256i *)(x->qs + 128 + 32 * j)), 1);
        acc[j % 2] = _mm512_dpwssd_epi32(acc[j % 2], _mm512_maddubs_epi16(u, xq), scale_words(sc, sub16_q2[j]));
    }
    const __m512i sum = _mm512_add_epi32(acc[0], acc[1]);
    if (q3) {
        const __m256i offset = _mm256_slli_epi32(scaled_bsums_16(sc, x->bsums), 2);
        return (struct k_sums512){_mm512_sub_epi32(sum, _mm512_zextsi256_si512(offset)), _mm256_setzero_si256()};
    }
    return (struct k_sums512){sum, scaled_bsums_16(_mm256_cvtepu8_epi16(mn8), x->bsums)};
}

TD_AVX512_VNNI TD_INLINE struct k_sums512 sums_q2_K_avx512(const block_q2_K *w, const block_q8_K *x) { return sums_q23_K_avx512(0, w, x); }
TD_AVX512_VNNI TD_INLINE struct k_sums512 sums_q3_K_avx512(const block_q3_K *w, const block_q8_K *x) { return sums_q23_K_avx512(1, w, x); }

/* the K_ROWS reductions of k_sums512: the zmm's halves added, then as AVX2's */
TD_AVX512_VNNI TD_INLINE __m256i halves(__m512i v)
{
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}
TD_AVX512_VNNI TD_INLINE int32_t hsum_512(__m512i v) { return hsum_i32_8(halves(v)); }
TD_AVX512_VNNI TD_INLINE __m128i hsum4_512(__m512i a, __m512i b, __m512i c, __m512i d)
{
    return hsum4_i32_8(halves(a), halves(b), halves(c), halves(d));
}

/* K_ROWS's sums are zmm, its minimums ymm */
#define K_ROWS_AVX512(type, has_min) \
    K_ROWS(type, avx512, has_min, TD_AVX512_VNNI, hsum_512, hsum4_512, hsum_i32_8, hsum4_i32_8, F16)
K_SUMS4(q2_K, avx512, TD_AVX512_VNNI)
K_SUMS4(q3_K, avx512, TD_AVX512_VNNI)
K_SUMS4(q6_K, avx512, TD_AVX512_VNNI)
K_ROWS_AVX512(q2_K, 1)
K_ROWS_AVX512(q3_K, 0)
K_ROWS_AVX512(q4_K, 1)
K_ROWS_AVX512(q5_K, 1)
K_ROWS_AVX512(q6_K, 0)
#undef K_ROWS_AVX512

/* ---- the tables ---- */

/* a K type's entry: x as Q8_K by the level's quantizer, its row and its tile */
#define K_ENTRY(type, isa) {.from_float = quantize_row_q8_K_avx2, .x_to_float = q8_K_to_float_avx2,              \
                            .x_blck_size = QK_K, .x_type_size = sizeof(block_q8_K),                            \
                            .vec_dot = vec_dot_##type##_q8_K_##isa, .vec_dot_4xn = vec_dot_4xn_##type##_q8_K_##isa}

/* AVX2's own functions of the K types, per type; a field left out is plain C's */
const struct type_traits td_traits_avx2_k[TD_NTYPES] = {
    [TD_Q2_K] = K_ENTRY(q2_K, avx2), [TD_Q3_K] = K_ENTRY(q3_K, avx2), [TD_Q4_K] = K_ENTRY(q4_K, avx2),
    [TD_Q5_K] = K_ENTRY(q5_K, avx2), [TD_Q6_K] = K_ENTRY(q6_K, avx2), [TD_IQ4_XS] = K_ENTRY(iq4_xs, avx2),
    [TD_Q8_K] = K_ENTRY(q8_K, avx2),
};

/* AVX-512's (IQ4_XS and Q8_K: AVX2's, as the x quantizer) */
const struct type_traits td_traits_avx512_k[TD_NTYPES] = {
    [TD_Q2_K] = K_ENTRY(q2_K, avx512), [TD_Q3_K] = K_ENTRY(q3_K, avx512), [TD_Q4_K] = K_ENTRY(q4_K, avx512),
    [TD_Q5_K] = K_ENTRY(q5_K, avx512), [TD_Q6_K] = K_ENTRY(q6_K, avx512), [TD_IQ4_XS] = K_ENTRY(iq4_xs, avx2),
    [TD_Q8_K] = K_ENTRY(q8_K, avx2),
};

/* the extension each AVX-512 entry needs; without it the AVX2 entry is used */
const int td_traits_avx512_k_needs[TD_NTYPES] = {[TD_Q2_K] = TD_EXT_VNNI, [TD_Q3_K] = TD_EXT_VNNI, [TD_Q4_K] = TD_EXT_VNNI,
                                                 [TD_Q5_K] = TD_EXT_VNNI, [TD_Q6_K] = TD_EXT_VNNI};
#endif
