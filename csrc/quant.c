/* quant.c: per weight type and SIMD level, the row functions of quant.h: weights to f32, an x row
   to Q8_0 or bf16, and the dot product of a weight row with a converted x row. The integer dot
   products follow llama.cpp (ggml-cpu/arch/x86/quants.c): the "sign trick" makes one operand
   unsigned, |a| . sign(b, a) = a . b, since maddubs / vpdpbusd multiply unsigned by signed bytes.

   Quantizing x must give exactly what quant.quantize_q8_0 gives (tests compare them bit for bit):
   d = amax / 127 in f32, q = x * (1/d) rounded half away from zero (C's roundf, not the SIMD
   round-to-even), d stored as f16. The SIMD rounding never lets x * (1/d) fuse into an FMA
   (build_ffi.py compiles with -ffp-contract=fast): it rounds |x * (1/d)|, a bitwise result. */
#include <math.h>
#include "quant.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---- plain C ---- */

static void f16_to_float_c(const void *w, float *y, int64_t k)
{
    const td_fp16_t *h = w;
    for (int64_t i = 0; i < k; i++)
        y[i] = fp16_to_fp32(h[i]);
}

static void bf16_to_float_c(const void *w, float *y, int64_t k)
{
    const td_bf16_t *h = w;
    for (int64_t i = 0; i < k; i++)
        y[i] = bf16_to_fp32(h[i]);
}

static void q8_0_to_float_c(const void *w, float *y, int64_t k)
{
    const block_q8_0 *b = w;
    for (int64_t i = 0; i < k / QK8_0; i++, y += QK8_0) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK8_0; j++)
            y[j] = d * b[i].qs[j];
    }
}

static void q4_0_to_float_c(const void *w, float *y, int64_t k)
{
    const block_q4_0 *b = w;
    for (int64_t i = 0; i < k / QK4_0; i++, y += QK4_0) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = d * ((b[i].qs[j] & 15) - 8);
            y[j + QK4_0 / 2] = d * ((b[i].qs[j] >> 4) - 8);
        }
    }
}

/* ggml's quantize_row_q8_0_ref */
static void quantize_row_q8_0_c(const float *x, void *vy, int64_t k)
{
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++)
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static float vec_dot_f16_c(int64_t k, const void *w, const void *x)
{
    const td_fp16_t *h = w;
    const float *xf = x;
    float s = 0.0f;
    for (int64_t i = 0; i < k; i++)
        s += fp16_to_fp32(h[i]) * xf[i];
    return s;
}

static float vec_dot_bf16_c(int64_t k, const void *w, const void *x)
{
    const td_bf16_t *h = w;
    const float *xf = x;
    float s = 0.0f;
    for (int64_t i = 0; i < k; i++)
        s += bf16_to_fp32(h[i]) * xf[i];
    return s;
}

static float vec_dot_q8_0_q8_0_c(int64_t k, const void *vw, const void *vx)
{
    const block_q8_0 *w = vw, *x = vx;
    float s = 0.0f;
    for (int64_t i = 0; i < k / QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++)
            sumi += w[i].qs[j] * x[i].qs[j];
        s += sumi * (fp16_to_fp32(w[i].d) * fp16_to_fp32(x[i].d));
    }
    return s;
}

static float vec_dot_q4_0_q8_0_c(int64_t k, const void *vw, const void *vx)
{
    const block_q4_0 *w = vw;
    const block_q8_0 *x = vx;
    float s = 0.0f;
    for (int64_t i = 0; i < k / QK4_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK4_0 / 2; j++)
            sumi += ((w[i].qs[j] & 15) - 8) * x[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * x[i].qs[j + QK4_0 / 2];
        s += sumi * (fp16_to_fp32(w[i].d) * fp16_to_fp32(x[i].d));
    }
    return s;
}

/* f32 x: x_to_float is never needed (the GEMM reads x itself) */
static const struct type_traits traits_c[TD_NTYPES] = {
    [TD_F16] = {1, 2, f16_to_float_c, NULL, NULL, 1, 4, vec_dot_f16_c},
    [TD_BF16] = {1, 2, bf16_to_float_c, NULL, NULL, 1, 4, vec_dot_bf16_c},
    [TD_Q8_0] = {QK8_0, sizeof(block_q8_0), q8_0_to_float_c, quantize_row_q8_0_c, q8_0_to_float_c,
                 QK8_0, sizeof(block_q8_0), vec_dot_q8_0_q8_0_c},
    [TD_Q4_0] = {QK4_0, sizeof(block_q4_0), q4_0_to_float_c, quantize_row_q8_0_c, q8_0_to_float_c,
                 QK8_0, sizeof(block_q8_0), vec_dot_q4_0_q8_0_c},
};

#if defined(__x86_64__)

/* ---- AVX2 + FMA + F16C ---- */

TD_AVX2 TD_INLINE float hsum_float_8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* d_w * d_x in all 8 lanes */
TD_AVX2 TD_INLINE __m256 scale_8(td_fp16_t dw, td_fp16_t dx)
{
    return _mm256_set1_ps(_cvtsh_ss(dw) * _cvtsh_ss(dx));
}

TD_AVX2 TD_INLINE __m256 load_f16_avx2(const td_fp16_t *h)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

TD_AVX2 static void f16_to_float_avx2(const void *w, float *y, int64_t k)
{
    const td_fp16_t *h = w;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        _mm256_storeu_ps(y + i, load_f16_avx2(h + i));
    for (; i < k; i++)
        y[i] = _cvtsh_ss(h[i]);
}

/* 8 bfloat16s -> 8 floats: widen to 32 bits, shift into the top half */
TD_AVX2 TD_INLINE __m256 load_bf16_avx2(const td_bf16_t *h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)h)), 16));
}

TD_AVX2 static void bf16_to_float_avx2(const void *w, float *y, int64_t k)
{
    const td_bf16_t *h = w;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        _mm256_storeu_ps(y + i, load_bf16_avx2(h + i));
    for (; i < k; i++)
        y[i] = bf16_to_fp32(h[i]);
}

TD_AVX2 static void q8_0_to_float_avx2(const void *w, float *y, int64_t k)
{
    const block_q8_0 *b = w;
    for (int64_t i = 0; i < k / QK8_0; i++, y += QK8_0) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
        for (int j = 0; j < QK8_0; j += 8) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b[i].qs + j)));
            _mm256_storeu_ps(y + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
        }
    }
}

TD_AVX2 static void q4_0_to_float_avx2(const void *w, float *y, int64_t k)
{
    const block_q4_0 *b = w;
    const __m256i eight = _mm256_set1_epi32(8), low = _mm256_set1_epi32(15);
    for (int64_t i = 0; i < k / QK4_0; i++, y += QK4_0) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
        for (int j = 0; j < QK4_0 / 2; j += 8) {
            __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b[i].qs + j)));
            __m256i lo = _mm256_sub_epi32(_mm256_and_si256(q, low), eight);
            __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(q, 4), eight);
            _mm256_storeu_ps(y + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(lo)));
            _mm256_storeu_ps(y + j + QK4_0 / 2, _mm256_mul_ps(d, _mm256_cvtepi32_ps(hi)));
        }
    }
}

/* roundf of each lane: |t| rounded half up, then t's sign put back */
TD_AVX2 TD_INLINE __m256i round_away_avx2(__m256 t)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 a = _mm256_andnot_ps(sign, t);
    const __m256 whole = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 up = _mm256_cmp_ps(_mm256_sub_ps(a, whole), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 r = _mm256_add_ps(whole, _mm256_and_ps(up, _mm256_set1_ps(1.0f)));
    return _mm256_cvtps_epi32(_mm256_or_ps(r, _mm256_and_ps(sign, t)));
}

TD_AVX2 static void quantize_row_q8_0_avx2(const float *x, void *vy, int64_t k)
{
    block_q8_0 *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + 8 * j);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float d = _mm_cvtss_f32(m) / 127, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        const __m256 mul = _mm256_set1_ps(id);
        __m256i q0 = round_away_avx2(_mm256_mul_ps(v[0], mul)), q1 = round_away_avx2(_mm256_mul_ps(v[1], mul));
        __m256i q2 = round_away_avx2(_mm256_mul_ps(v[2], mul)), q3 = round_away_avx2(_mm256_mul_ps(v[3], mul));
        /* 32 int32 -> 32 int8; the packs work within 128-bit lanes, the permute restores the order */
        q0 = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
        q0 = _mm256_permutevar8x32_epi32(q0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[i].qs, q0);
    }
}

TD_AVX2 static float vec_dot_f16_avx2(int64_t k, const void *w, const void *x)
{
    const td_fp16_t *h = w;
    const float *xf = x;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        a0 = _mm256_fmadd_ps(load_f16_avx2(h + i), _mm256_loadu_ps(xf + i), a0);
        a1 = _mm256_fmadd_ps(load_f16_avx2(h + i + 8), _mm256_loadu_ps(xf + i + 8), a1);
    }
    for (; i + 8 <= k; i += 8)
        a0 = _mm256_fmadd_ps(load_f16_avx2(h + i), _mm256_loadu_ps(xf + i), a0);
    float s = hsum_float_8(_mm256_add_ps(a0, a1));
    for (; i < k; i++)
        s += _cvtsh_ss(h[i]) * xf[i];
    return s;
}

TD_AVX2 static float vec_dot_bf16_avx2(int64_t k, const void *w, const void *x)
{
    const td_bf16_t *h = w;
    const float *xf = x;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        a0 = _mm256_fmadd_ps(load_bf16_avx2(h + i), _mm256_loadu_ps(xf + i), a0);
        a1 = _mm256_fmadd_ps(load_bf16_avx2(h + i + 8), _mm256_loadu_ps(xf + i + 8), a1);
    }
    for (; i + 8 <= k; i += 8)
        a0 = _mm256_fmadd_ps(load_bf16_avx2(h + i), _mm256_loadu_ps(xf + i), a0);
    float s = hsum_float_8(_mm256_add_ps(a0, a1));
    for (; i < k; i++)
        s += bf16_to_fp32(h[i]) * xf[i];
    return s;
}

/* 32 bytes q0..q31 from 16 bytes of nibbles: low nibbles first, then the high ones */
TD_AVX2 TD_INLINE __m256i bytes_from_nibbles_32(const uint8_t *p)
{
    const __m128i t = _mm_loadu_si128((const __m128i *)p);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(15));
}

/* 8 int32 lanes whose sum is x . y over 32 int8 pairs (sign trick, then maddubs and madd) */
TD_AVX2 TD_INLINE __m256 mul_sum_i8_pairs_avx2(__m256i x, __m256i y)
{
    const __m256i dot = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)));
}

TD_AVX2 static float vec_dot_q8_0_q8_0_avx2(int64_t k, const void *vw, const void *vx)
{
    const block_q8_0 *w = vw, *x = vx;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < k / QK8_0; i++) {
        const __m256 d = scale_8(w[i].d, x[i].d);
        const __m256i qw = _mm256_loadu_si256((const __m256i *)w[i].qs);
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_avx2(qw, qx), acc);
    }
    return hsum_float_8(acc);
}

TD_AVX2 static float vec_dot_q4_0_q8_0_avx2(int64_t k, const void *vw, const void *vx)
{
    const block_q4_0 *w = vw;
    const block_q8_0 *x = vx;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < k / QK4_0; i++) {
        const __m256 d = scale_8(w[i].d, x[i].d);
        const __m256i qw = _mm256_sub_epi8(bytes_from_nibbles_32(w[i].qs), _mm256_set1_epi8(8));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_avx2(qw, qx), acc);
    }
    return hsum_float_8(acc);
}

static const struct type_traits traits_avx2[TD_NTYPES] = {
    [TD_F16] = {1, 2, f16_to_float_avx2, NULL, NULL, 1, 4, vec_dot_f16_avx2},
    [TD_BF16] = {1, 2, bf16_to_float_avx2, NULL, NULL, 1, 4, vec_dot_bf16_avx2},
    [TD_Q8_0] = {QK8_0, sizeof(block_q8_0), q8_0_to_float_avx2, quantize_row_q8_0_avx2, q8_0_to_float_avx2,
                 QK8_0, sizeof(block_q8_0), vec_dot_q8_0_q8_0_avx2},
    [TD_Q4_0] = {QK4_0, sizeof(block_q4_0), q4_0_to_float_avx2, quantize_row_q8_0_avx2, q8_0_to_float_avx2,
                 QK8_0, sizeof(block_q8_0), vec_dot_q4_0_q8_0_avx2},
};

/* ---- AVX-512 (F; VNNI for the int8 dot products, BF16 for the bf16 one) ---- */

TD_AVX512 TD_INLINE __m512 load_f16_avx512(const td_fp16_t *h)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
}

TD_AVX512 static void f16_to_float_avx512(const void *w, float *y, int64_t k)
{
    const td_fp16_t *h = w;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16)
        _mm512_storeu_ps(y + i, load_f16_avx512(h + i));
    for (; i < k; i++)
        y[i] = _cvtsh_ss(h[i]);
}

TD_AVX512 static void q8_0_to_float_avx512(const void *w, float *y, int64_t k)
{
    const block_q8_0 *b = w;
    for (int64_t i = 0; i < k / QK8_0; i++, y += QK8_0) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(b[i].d));
        for (int j = 0; j < QK8_0; j += 16) {
            __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b[i].qs + j)));
            _mm512_storeu_ps(y + j, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q)));
        }
    }
}

TD_AVX512 static void q4_0_to_float_avx512(const void *w, float *y, int64_t k)
{
    const block_q4_0 *b = w;
    const __m512i eight = _mm512_set1_epi32(8), low = _mm512_set1_epi32(15);
    for (int64_t i = 0; i < k / QK4_0; i++, y += QK4_0) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(b[i].d));
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b[i].qs));
        const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(q, low), eight);
        const __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(q, 4), eight);
        _mm512_storeu_ps(y, _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo)));
        _mm512_storeu_ps(y + QK4_0 / 2, _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi)));
    }
}

TD_AVX512 TD_INLINE __m512i round_away_avx512(__m512 t)
{
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    const __m512 a = _mm512_abs_ps(t);
    const __m512 whole = _mm512_roundscale_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(a, whole), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 r = _mm512_mask_add_ps(whole, up, whole, _mm512_set1_ps(1.0f));
    const __m512i s = _mm512_and_si512(_mm512_castps_si512(t), sign);
    return _mm512_cvtps_epi32(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), s)));
}

TD_AVX512 static void quantize_row_q8_0_avx512(const float *x, void *vy, int64_t k)
{
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float d = amax / 127, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        const __m512 mul = _mm512_set1_ps(id);
        _mm_storeu_si128((__m128i *)y[i].qs, _mm512_cvtepi32_epi8(round_away_avx512(_mm512_mul_ps(v0, mul))));
        _mm_storeu_si128((__m128i *)(y[i].qs + 16), _mm512_cvtepi32_epi8(round_away_avx512(_mm512_mul_ps(v1, mul))));
    }
}

TD_AVX512 static float vec_dot_f16_avx512(int64_t k, const void *w, const void *x)
{
    const td_fp16_t *h = w;
    const float *xf = x;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        a0 = _mm512_fmadd_ps(load_f16_avx512(h + i), _mm512_loadu_ps(xf + i), a0);
        a1 = _mm512_fmadd_ps(load_f16_avx512(h + i + 16), _mm512_loadu_ps(xf + i + 16), a1);
    }
    for (; i + 16 <= k; i += 16)
        a0 = _mm512_fmadd_ps(load_f16_avx512(h + i), _mm512_loadu_ps(xf + i), a0);
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    for (; i < k; i++)
        s += _cvtsh_ss(h[i]) * xf[i];
    return s;
}

/* x rounded to bf16 (nearest even, as quant.to_bf16) for vdpbf16ps; a masked tail past k % 16 */
TD_AVX512_BF16 static void bf16_from_float_avx512(const float *x, void *vy, int64_t k)
{
    td_bf16_t *y = vy;
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512(y + i, (__m512i)b);
    }
    for (; i < k; i += 16) {
        const __mmask16 mask = k - i >= 16 ? 0xFFFF : (__mmask16)((1u << (k - i)) - 1);
        __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + i));
        _mm256_mask_storeu_epi16(y + i, mask, (__m256i)b);
    }
}

TD_AVX512_BF16 static float vec_dot_bf16_avx512(int64_t k, const void *w, const void *x)
{
    const td_bf16_t *a = w, *b = x;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= k; i += 64) {
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(a + i), (__m512bh)_mm512_loadu_si512(b + i));
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(a + i + 32), (__m512bh)_mm512_loadu_si512(b + i + 32));
    }
    for (; i < k; i += 32) { /* zeros past k add nothing */
        const __mmask32 mask = k - i >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << (k - i)) - 1);
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_maskz_loadu_epi16(mask, a + i),
                              (__m512bh)_mm512_maskz_loadu_epi16(mask, b + i));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

TD_AVX512 static void bf16_to_float_avx512(const void *w, float *y, int64_t k)
{
    const td_bf16_t *h = w;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(h + i)));
        _mm512_storeu_ps(y + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
    for (; i < k; i++)
        y[i] = bf16_to_fp32(h[i]);
}

/* as mul_sum_i8_pairs_avx2, with one vpdpbusd for maddubs + madd */
TD_AVX512_VNNI TD_INLINE __m256 mul_sum_i8_pairs_vnni(__m256i x, __m256i y)
{
    const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_cvtepi32_ps(dot);
}

/* two Q8_0 blocks' 32 quants side by side: block 0 in the low half of the zmm */
TD_AVX512_VNNI TD_INLINE __m512i load_q8_pair(const block_q8_0 *b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b[0].qs)),
                              _mm256_loadu_si256((const __m256i *)b[1].qs), 1);
}

/* d_w * d_x of two blocks, each in the lanes whose index in `lanes` is 0 or 1 */
TD_AVX512_VNNI TD_INLINE __m512 scale_pair(td_fp16_t dw0, td_fp16_t dw1, td_fp16_t dx0, td_fp16_t dx1, __m512i lanes)
{
    __m128i h = _mm_insert_epi16(_mm_insert_epi16(_mm_insert_epi16(_mm_cvtsi32_si128(dw0), dw1, 1), dx0, 2), dx1, 3);
    const __m128 d = _mm_cvtph_ps(h);                     /* dw0 dw1 dx0 dx1 */
    return _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(_mm_mul_ps(d, _mm_movehl_ps(d, d))));
}

/* The scales of 8 consecutive blocks as 8 halves, picked out of the block bytes by a word permute
   (one per 128 bytes) instead of one by one: converting each pair's scales on its own cost as many
   instructions as the pair's integer dot product. Q4_0 blocks are 9 words long, Q8_0 blocks 17. */
static const uint16_t d_words_q4_0[32] = {0, 9, 18, 27, 36, 45, 54, 63};
static const uint16_t d_words_q8_0[32] = {0, 17, 34, 51, 4, 21, 38, 55}; /* blocks 4-7: from byte 128 */

TD_AVX512_VNNI TD_INLINE __m128i scales8_q4_0(const block_q4_0 *b)
{
    const char *p = (const char *)b; /* 8 blocks are 144 bytes: the first 128 hold every scale */
    return _mm512_castsi512_si128(_mm512_permutex2var_epi16(
        _mm512_loadu_si512(p), _mm512_loadu_si512(d_words_q4_0), _mm512_loadu_si512(p + 64)));
}

TD_AVX512_VNNI TD_INLINE __m128i scales8_q8_0(const block_q8_0 *b)
{
    const char *p = (const char *)b; /* 8 blocks are 272 bytes: scales 0-3 in bytes 0-127, 4-7 in 128-255 */
    const __m512i idx = _mm512_loadu_si512(d_words_q8_0);
    const __m512i lo = _mm512_permutex2var_epi16(_mm512_loadu_si512(p), idx, _mm512_loadu_si512(p + 64));
    const __m512i hi = _mm512_permutex2var_epi16(_mm512_loadu_si512(p + 128), idx, _mm512_loadu_si512(p + 192));
    return _mm_blend_epi16(_mm512_castsi512_si128(lo), _mm512_castsi512_si128(hi), 0xF0);
}

/* d_w * d_x of 8 blocks, in the low 8 lanes */
TD_AVX512_VNNI TD_INLINE __m512 scales8(__m128i dw, const block_q8_0 *x)
{
    return _mm512_castps256_ps512(_mm256_mul_ps(_mm256_cvtph_ps(dw), _mm256_cvtph_ps(scales8_q8_0(x))));
}

/* the sign trick, |w| . (x with w's sign), on two Q8_0 blocks: lanes of 4 quants, block 0 in lanes 0-7 */
TD_AVX512_VNNI TD_INLINE __m512 dot_pair_q8_0(const block_q8_0 *w, const block_q8_0 *x)
{
    const __m512i qw = load_q8_pair(w), qx = load_q8_pair(x);
    const __m512i sx = _mm512_mask_sub_epi8(qx, _mm512_movepi8_mask(qw), _mm512_setzero_si512(), qx);
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(qw), sx));
}

/* two Q4_0 blocks' nibbles as unsigned bytes, lanes of 4 quants: [block 0: 0..15 | block 1: 0..15 |
   block 0: 16..31 | block 1: 16..31] */
TD_AVX512_VNNI TD_INLINE __m512i nibbles_pair_q4_0(const block_q4_0 *w)
{
    const __m256i low = _mm256_set1_epi8(15);
    const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)w[0].qs)),
                                              _mm_loadu_si128((const __m128i *)w[1].qs), 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(q, low)),
                              _mm256_and_si256(_mm256_srli_epi16(q, 4), low), 1);
}

/* Two blocks a step in one zmm, eight blocks' scales at a time; the pairs past the last 8 with
   their scales one by one, an odd last block as AVX2 does, with vpdpbusd. The lanes of a pair's
   scale follow its dot product's. */
TD_AVX512_VNNI static float vec_dot_q8_0_q8_0_vnni(int64_t k, const void *vw, const void *vx)
{
    const block_q8_0 *w = vw, *x = vx;
    const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512 acc = _mm512_setzero_ps();
    int64_t nb = k / QK8_0, i = 0;
    for (; i + 8 <= nb; i += 8) {
        const __m512 s = scales8(scales8_q8_0(w + i), x + i);
        for (int j = 0; j < 8; j += 2)
            acc = _mm512_fmadd_ps(dot_pair_q8_0(w + i + j, x + i + j),
                                  _mm512_permutexvar_ps(_mm512_add_epi32(lanes, _mm512_set1_epi32(j)), s), acc);
    }
    for (; i + 2 <= nb; i += 2)
        acc = _mm512_fmadd_ps(dot_pair_q8_0(w + i, x + i), scale_pair(w[i].d, w[i + 1].d, x[i].d, x[i + 1].d, lanes),
                              acc);
    float s = _mm512_reduce_add_ps(acc);
    if (i < nb) {
        const __m256i qw = _mm256_loadu_si256((const __m256i *)w[i].qs);
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        s += hsum_float_8(_mm256_mul_ps(scale_8(w[i].d, x[i].d), mul_sum_i8_pairs_vnni(qw, qx)));
    }
    return s;
}

/* two Q8_0 blocks of x in nibbles_pair_q4_0's order */
TD_AVX512_VNNI TD_INLINE __m512i x_pair_q4_0(const block_q8_0 *x)
{
    const __m512i qx = load_q8_pair(x);
    return _mm512_shuffle_i64x2(qx, qx, _MM_SHUFFLE(3, 1, 2, 0));
}

/* -8 . x of each lane's 4 quants: nibble . x - 8 . x = (nibble - 8) . x */
TD_AVX512_VNNI TD_INLINE __m512i minus_8x(__m512i xs)
{
    return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), xs));
}

/* Q4_0 rows . one x, R rows at once (1 or 4): the x side of each pair of blocks (its quants in
   the nibbles' order, -8 . x for nibble . x - 8 . x = (nibble - 8) . x, its scales) is made once
   for the R rows. Each row's sums run in the same order whatever R is: the same result to the bit. */
TD_AVX512_VNNI TD_INLINE void dot_rows_q4_0(const int R, int64_t k, const char *vw, int64_t row_bytes,
                                            const block_q8_0 *x, float *y)
{
    const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    const block_q4_0 *w[4];
    __m512 acc[4], s[4];
    for (int r = 0; r < R; r++)
        w[r] = (const block_q4_0 *)(vw + r * row_bytes), acc[r] = _mm512_setzero_ps();
    int64_t nb = k / QK4_0, i = 0;
    for (; i + 8 <= nb; i += 8) {
        for (int r = 0; r < R; r++)
            s[r] = scales8(scales8_q4_0(w[r] + i), x + i);
        for (int j = 0; j < 8; j += 2) {
            const __m512i xs = x_pair_q4_0(x + i + j), minus8x = minus_8x(xs);
            const __m512i at = _mm512_add_epi32(lanes, _mm512_set1_epi32(j));
            for (int r = 0; r < R; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(minus8x, nibbles_pair_q4_0(w[r] + i + j), xs)),
                                         _mm512_permutexvar_ps(at, s[r]), acc[r]);
        }
    }
    for (; i + 2 <= nb; i += 2) {
        const __m512i xs = x_pair_q4_0(x + i), minus8x = minus_8x(xs);
        for (int r = 0; r < R; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(minus8x, nibbles_pair_q4_0(w[r] + i), xs)),
                                     scale_pair(w[r][i].d, w[r][i + 1].d, x[i].d, x[i + 1].d, lanes), acc[r]);
    }
    for (int r = 0; r < R; r++) {
        y[r] = _mm512_reduce_add_ps(acc[r]);
        if (i < nb) { /* an odd last block as AVX2 does, with vpdpbusd */
            const __m256i qw = _mm256_sub_epi8(bytes_from_nibbles_32(w[r][i].qs), _mm256_set1_epi8(8));
            const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
            y[r] += hsum_float_8(_mm256_mul_ps(scale_8(w[r][i].d, x[i].d), mul_sum_i8_pairs_vnni(qw, qx)));
        }
    }
}

TD_AVX512_VNNI static float vec_dot_q4_0_q8_0_vnni(int64_t k, const void *w, const void *x)
{
    float y;
    dot_rows_q4_0(1, k, w, 0, x, &y);
    return y;
}

TD_AVX512_VNNI static void vec_dot4_q4_0_q8_0_vnni(int64_t k, const void *w, int64_t row_bytes, const void *x, float *y)
{
    dot_rows_q4_0(4, k, w, row_bytes, x, y);
}

/* each entry needs the extension named in needs_ext[]; without it the AVX2 entry is used */
static const struct type_traits traits_avx512[TD_NTYPES] = {
    [TD_F16] = {1, 2, f16_to_float_avx512, NULL, NULL, 1, 4, vec_dot_f16_avx512},
    [TD_BF16] = {1, 2, bf16_to_float_avx512, bf16_from_float_avx512, bf16_to_float_avx512, 1, 2, vec_dot_bf16_avx512},
    [TD_Q8_0] = {QK8_0, sizeof(block_q8_0), q8_0_to_float_avx512, quantize_row_q8_0_avx512, q8_0_to_float_avx512,
                 QK8_0, sizeof(block_q8_0), vec_dot_q8_0_q8_0_vnni},
    [TD_Q4_0] = {QK4_0, sizeof(block_q4_0), q4_0_to_float_avx512, quantize_row_q8_0_avx512, q8_0_to_float_avx512,
                 QK8_0, sizeof(block_q8_0), vec_dot_q4_0_q8_0_vnni, vec_dot4_q4_0_q8_0_vnni},
};
static const int needs_ext[TD_NTYPES] = {[TD_BF16] = TD_EXT_BF16, [TD_Q8_0] = TD_EXT_VNNI, [TD_Q4_0] = TD_EXT_VNNI};

#endif

const struct type_traits *td_type_traits(enum td_type type)
{
#if defined(__x86_64__)
    if (td_simd == TD_SIMD_AVX512 && (td_simd_ext & needs_ext[type]) == needs_ext[type])
        return &traits_avx512[type];
    if (td_simd >= TD_SIMD_AVX2)
        return &traits_avx2[type];
#endif
    return &traits_c[type];
}

int td_rows_to_f32(enum td_type type, const void *w, int64_t m, int64_t k, const int64_t *rows, int64_t n, float *y)
{
    const struct type_traits *tt = type == TD_F32 ? NULL : td_type_traits(type);
    const int64_t row_bytes = tt ? k / tt->blck_size * tt->type_size : 4 * k;
    for (int64_t i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= m)
            return -1;
    for (int64_t i = 0; i < n; i++) {
        const char *row = (const char *)w + rows[i] * row_bytes;
        if (tt)
            tt->to_float(row, y + i * k, k);
        else
            memcpy(y + i * k, row, (size_t)row_bytes);
    }
    return 0;
}
