/* quant_isa.h: the row functions every instruction set has in the same shape, written once and
   compiled per instruction set (quant_ref.c: plain C, suffix _c; quant_x86.c: AVX2 and AVX-512,
   _avx2 and _avx512; quant_arm.c: NEON, _neon), each file instancing it as foreach_isa.h does: f16
   and bf16 rows to f32 and their dot product with an f32 x; Q8_0 and Q4_0 rows to f32, an x row
   to Q8_0 (and to Q8_0S and Q8_0V, the X8 kernels' x rows), and their integer dot products. What
   only an instruction set can do is a primitive below, picked by PLAIN (plain C), NEON (arm64) or
   VL (8 AVX2 + FMA + F16C, 16 AVX-512): f16 <-> f32; bytes and words <-> int32 lanes (GCC 12 turns
   the vector extensions' conversions of these into one scalar move a lane); the largest lane; and
   the int8 dot product of one block (maddubs on AVX2, vmull_s8 on NEON).

   Why it stays generic: these are one algorithm at four widths, and a conversion written once
   gives the same numbers on every level by construction (x to Q8_0 above all: every path of a
   type must see the same x). The kernels whose shape is their own (register tiles, the X8 groups,
   the extension instructions, and every format beyond Q8_0 and Q4_0) are written per file
   instead, and each file's table names the functions it has (quant.c merges them).

   Every path gives the same numbers where the order of float operations allows it (weights to
   f32, x to Q8_0), so a dot product's result depends only on its summation order. Plain C keeps
   ggml's reference order: a float sum term after term, and each block's int8 dot product whole
   in lane 0 (so vsum of the accumulator is that one sum). The AVX-512 bf16 and int8 dot products
   need an extension and are hand-written in quant_x86.c, and so are NEON's with the dotprod
   extension (sdot) in quant_arm.c: under VL == 16 this file leaves them out. */
#include "exp_isa.h"

typedef int32_t ISA(vi) __attribute__((vector_size(4 * VL)));   /* VL lanes of int32 */
typedef uint32_t ISA(vu) __attribute__((vector_size(4 * VL)));  /* and uint32 */

/* ---- the primitives of each instruction set ---- */

#if PLAIN
TARGET TD_INLINE ISA(vi) ISA(load_i8)(const int8_t *p) { return (ISA(vi)){p[0], p[1], p[2], p[3]}; }
TARGET TD_INLINE ISA(vi) ISA(load_u8)(const uint8_t *p) { return (ISA(vi)){p[0], p[1], p[2], p[3]}; }
TARGET TD_INLINE ISA(vu) ISA(load_u16)(const uint16_t *p) { return (ISA(vu)){p[0], p[1], p[2], p[3]}; }
TARGET TD_INLINE void ISA(store_i8)(int8_t *p, ISA(vi) v)
{
    for (int l = 0; l < VL; l++)
        p[l] = (int8_t)v[l];
}
TARGET TD_INLINE float ISA(hmax)(VEC v) { return fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3])); }
TARGET TD_INLINE float ISA(h2f)(td_fp16_t h) { return fp16_to_fp32(h); }
TARGET TD_INLINE td_fp16_t ISA(f2h)(float f) { return fp32_to_fp16(f); }
TARGET TD_INLINE VEC ISA(load_f16)(const td_fp16_t *h)
{
    return (VEC){fp16_to_fp32(h[0]), fp16_to_fp32(h[1]), fp16_to_fp32(h[2]), fp16_to_fp32(h[3])};
}

/* lanes whose sum is w . x over a block's 32 int8 pairs: here all of it in lane 0 */
TARGET TD_INLINE VEC ISA(dot_q8_0)(const int8_t *w, const int8_t *x)
{
    int sumi = 0;
    for (int j = 0; j < QK8_0; j++)
        sumi += w[j] * x[j];
    return (VEC){(float)sumi};
}

/* the same with a Q4_0 block's nibbles, weight = nibble - 8 */
TARGET TD_INLINE VEC ISA(dot_q4_0)(const uint8_t *w, const int8_t *x)
{
    int sumi = 0;
    for (int j = 0; j < QK4_0 / 2; j++)
        sumi += ((w[j] & 15) - 8) * x[j] + ((w[j] >> 4) - 8) * x[j + QK4_0 / 2];
    return (VEC){(float)sumi};
}
#elif NEON /* arm64: widening moves and narrowing moves, the f16 conversion, vmull_s8 */
TARGET TD_INLINE ISA(vi) ISA(load_i8)(const int8_t *p)
{
    int32_t four;
    memcpy(&four, p, 4);
    return (ISA(vi))vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(four)))));
}
TARGET TD_INLINE ISA(vi) ISA(load_u8)(const uint8_t *p)
{
    uint32_t four;
    memcpy(&four, p, 4);
    return (ISA(vi))vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(four)))));
}
TARGET TD_INLINE ISA(vu) ISA(load_u16)(const uint16_t *p) { return (ISA(vu))vmovl_u16(vld1_u16(p)); }
TARGET TD_INLINE void ISA(store_i8)(int8_t *p, ISA(vi) v) /* truncating; the lanes fit a byte */
{
    const int16x4_t h = vmovn_s32((int32x4_t)v);
    const int32_t four = vget_lane_s32(vreinterpret_s32_s8(vmovn_s16(vcombine_s16(h, h))), 0);
    memcpy(p, &four, 4);
}
TARGET TD_INLINE float ISA(hmax)(VEC v) { return vmaxnmvq_f32((float32x4_t)v); } /* NaN ignored, as fmaxf */
TARGET TD_INLINE float ISA(h2f)(td_fp16_t h)
{
    __fp16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}
TARGET TD_INLINE td_fp16_t ISA(f2h)(float f) { return fp32_to_fp16(f); } /* one a block: NaN as plain C gives it */
TARGET TD_INLINE VEC ISA(load_f16)(const td_fp16_t *h)
{
    return (VEC)vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* w . x of 16 int8 pairs, in 4 int32 lanes: 8 products widened to int16, summed in pairs */
TARGET TD_INLINE int32x4_t ISA(dot16_s8)(int32x4_t acc, int8x16_t w, int8x16_t x)
{
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w), vget_low_s8(x)));
    return vpadalq_s16(acc, vmull_high_s8(w, x));
}

TARGET TD_INLINE VEC ISA(dot_q8_0)(const int8_t *w, const int8_t *x)
{
    int32x4_t s = ISA(dot16_s8)(vdupq_n_s32(0), vld1q_s8(w), vld1q_s8(x));
    return (VEC)vcvtq_f32_s32(ISA(dot16_s8)(s, vld1q_s8(w + 16), vld1q_s8(x + 16)));
}

TARGET TD_INLINE VEC ISA(dot_q4_0)(const uint8_t *w, const int8_t *x)
{
    const uint8x16_t q = vld1q_u8(w);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), vdupq_n_s8(8));
    const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
    int32x4_t s = ISA(dot16_s8)(vdupq_n_s32(0), lo, vld1q_s8(x));
    return (VEC)vcvtq_f32_s32(ISA(dot16_s8)(s, hi, vld1q_s8(x + 16)));
}
#else /* AVX2 (VL 8) and AVX-512 (VL 16): the same intrinsics on a ymm or a zmm */
#if VL == 8
#define MM(op) _mm256_##op
#define LOAD_BYTES(p) _mm_loadl_epi64((const __m128i *)(p))     /* VL bytes */
#define LOAD_WORDS(p) _mm_loadu_si128((const __m128i *)(p))     /* VL 16-bit words */
#else
#define MM(op) _mm512_##op
#define LOAD_BYTES(p) _mm_loadu_si128((const __m128i *)(p))
#define LOAD_WORDS(p) _mm256_loadu_si256((const __m256i *)(p))
#endif
TARGET TD_INLINE ISA(vi) ISA(load_i8)(const int8_t *p) { return (ISA(vi))MM(cvtepi8_epi32)(LOAD_BYTES(p)); }
TARGET TD_INLINE ISA(vi) ISA(load_u8)(const uint8_t *p) { return (ISA(vi))MM(cvtepu8_epi32)(LOAD_BYTES(p)); }
TARGET TD_INLINE ISA(vu) ISA(load_u16)(const uint16_t *p) { return (ISA(vu))MM(cvtepu16_epi32)(LOAD_WORDS(p)); }
TARGET TD_INLINE VEC ISA(load_f16)(const td_fp16_t *h) { return (VEC)MM(cvtph_ps)(LOAD_WORDS(h)); }
TARGET TD_INLINE float ISA(h2f)(td_fp16_t h) { return _cvtsh_ss(h); }
TARGET TD_INLINE td_fp16_t ISA(f2h)(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#undef MM
#undef LOAD_BYTES
#undef LOAD_WORDS

#if VL == 8
TARGET TD_INLINE void ISA(store_i8)(int8_t *p, ISA(vi) v) /* saturating; the lanes fit a byte */
{
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128((__m256i)v), _mm256_extracti128_si256((__m256i)v, 1));
    _mm_storel_epi64((__m128i *)p, _mm_packs_epi16(w, w));
}

TARGET TD_INLINE float ISA(hmax)(VEC v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* 8 lanes of 4 products each (sign trick, then maddubs and madd) */
TARGET TD_INLINE VEC ISA(dot_q8_0)(const int8_t *w, const int8_t *x)
{
    return (VEC)mul_sum_i8_pairs_avx2(_mm256_loadu_si256((const __m256i *)w), _mm256_loadu_si256((const __m256i *)x));
}

TARGET TD_INLINE VEC ISA(dot_q4_0)(const uint8_t *w, const int8_t *x)
{
    const __m256i qw = _mm256_sub_epi8(bytes_from_nibbles_32(w), _mm256_set1_epi8(8));
    return (VEC)mul_sum_i8_pairs_avx2(qw, _mm256_loadu_si256((const __m256i *)x));
}
#else
TARGET TD_INLINE void ISA(store_i8)(int8_t *p, ISA(vi) v) /* truncating; the lanes fit a byte */
{
    _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8((__m512i)v));
}

TARGET TD_INLINE float ISA(hmax)(VEC v) { return _mm512_reduce_max_ps((__m512)v); }
#endif
#endif

/* ---- weights to f32 (exact: every path gives the same numbers) ---- */

/* VL bfloat16s -> VL floats: widen to 32 bits, shift into the top half */
TARGET TD_INLINE VEC ISA(load_bf16)(const td_bf16_t *h) { return (VEC)(ISA(load_u16)(h) << 16); }

/* VL, or one, of a row of halves (bf16 = 0) or bfloat16s (1) as floats; bf16 is a constant after
   inlining, so the two row functions of each kernel below are written once */
TARGET TD_INLINE VEC ISA(load_16bit)(const uint16_t *h, const int bf16)
{
    return bf16 ? ISA(load_bf16)(h) : ISA(load_f16)(h);
}

TARGET TD_INLINE float ISA(to_fp32_16bit)(uint16_t h, const int bf16) { return bf16 ? bf16_to_fp32(h) : ISA(h2f)(h); }

TARGET TD_INLINE void ISA(to_float_16bit)(const uint16_t *h, float *y, int64_t k, const int bf16)
{
    int64_t i = 0;
    for (; i + VL <= k; i += VL)
        vstore(y + i, ISA(load_16bit)(h + i, bf16));
    for (; i < k; i++)
        y[i] = ISA(to_fp32_16bit)(h[i], bf16);
}

TARGET static void ISA(f16_to_float)(const void *w, float *y, int64_t k) { ISA(to_float_16bit)(w, y, k, 0); }

TARGET static void ISA(bf16_to_float)(const void *w, float *y, int64_t k) { ISA(to_float_16bit)(w, y, k, 1); }

/* y[32] = d * qs[32]: a Q8_0 block's numbers */
TARGET TD_INLINE void ISA(q8_block_to_float)(td_fp16_t d, const int8_t *qs, float *y)
{
    const float f = ISA(h2f)(d);
    for (int j = 0; j < QK8_0; j += VL)
        vstore(y + j, f * __builtin_convertvector(ISA(load_i8)(qs + j), VEC));
}

TARGET static void ISA(q8_0_to_float)(const void *w, float *y, int64_t k)
{
    const block_q8_0 *b = w;
    for (int64_t i = 0; i < k / QK8_0; i++)
        ISA(q8_block_to_float)(b[i].d, b[i].qs, y + i * QK8_0);
}

TARGET static void ISA(q4_0_to_float)(const void *w, float *y, int64_t k)
{
    const block_q4_0 *b = w;
    for (int64_t i = 0; i < k / QK4_0; i++, y += QK4_0) {
        const float d = ISA(h2f)(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j += VL) {
            const ISA(vi) q = ISA(load_u8)(b[i].qs + j), lo = (q & 15) - 8, hi = (q >> 4) - 8;
            vstore(y + j, d * __builtin_convertvector(lo, VEC));
            vstore(y + j + QK4_0 / 2, d * __builtin_convertvector(hi, VEC));
        }
    }
}

/* ---- x to Q8_0 ----

   It must give exactly what quant.quantize_q8_0 gives (tests compare them bit for bit): d = amax /
   127 in f32, q = x * (1/d) rounded half away from zero (C's roundf, not the SIMD round-to-even),
   d stored as f16. x * (1/d) never fuses into an FMA (build_ffi.py compiles with
   -ffp-contract=fast): the rounding takes |x * (1/d)|, a bitwise result. */

/* roundf of each lane: |t| truncated, one up from a fraction of 1/2, t's sign put back */
TARGET TD_INLINE ISA(vi) ISA(round_away)(VEC t)
{
    const ISA(vi) neg = (ISA(vi))t >> 31; /* -1 in the negative lanes */
    const VEC a = (VEC)((ISA(vi))t & 0x7FFFFFFF);
    const ISA(vi) whole = __builtin_convertvector(a, ISA(vi));
    const ISA(vi) r = whole - (a - __builtin_convertvector(whole, VEC) >= 0.5f); /* true is -1 */
    return (r ^ neg) - neg;
}

/* ggml's quantize_row_q8_0_ref, VL numbers at a time */
TARGET static void ISA(quantize_row_q8_0)(const float *x, void *vy, int64_t k)
{
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        VEC v[QK8_0 / VL], m = {0};
        for (int j = 0; j < QK8_0 / VL; j++) {
            v[j] = vload(x + j * VL);
            m = ISA(vmax)((VEC)((ISA(vi))v[j] & 0x7FFFFFFF), m);
        }
        const float d = ISA(hmax)(m) / 127, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = ISA(f2h)(d);
        for (int j = 0; j < QK8_0 / VL; j++)
            ISA(store_i8)(y[i].qs + j * VL, ISA(round_away)(v[j] * id));
    }
}

#if VL >= 8
/* a block of x quantized to Q8_0 in b; returns the sum of its quants (the X8 kernels' x rows) */
TARGET TD_INLINE int ISA(quantize_block_sum)(const float *x, block_q8_0 *b)
{
    ISA(quantize_row_q8_0)(x, b, QK8_0);
    int sum = 0;
    for (int j = 0; j < QK8_0; j++)
        sum += b->qs[j];
    return sum;
}
#endif

#if VL >= 8
/* x to Q8_1 (Q4_1's and Q5_1's x rows): quantize_row_q8_0's d and quants, and s = d * their sum
   with d in f32 before its f16 rounding, as quant_ref.c's quantize_row_q8_1_ref */
TARGET static void ISA(quantize_row_q8_1)(const float *x, void *vy, int64_t k)
{
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < k / QK8_1; i++, x += QK8_1) {
        VEC v[QK8_1 / VL], m = {0};
        for (int j = 0; j < QK8_1 / VL; j++) {
            v[j] = vload(x + j * VL);
            m = ISA(vmax)((VEC)((ISA(vi))v[j] & 0x7FFFFFFF), m);
        }
        const float d = ISA(hmax)(m) / 127, id = d != 0.0f ? 1.0f / d : 0.0f;
        ISA(vi) sums = {0};
        for (int j = 0; j < QK8_1 / VL; j++) {
            const ISA(vi) q = ISA(round_away)(v[j] * id);
            ISA(store_i8)(y[i].qs + j * VL, q);
            sums += q;
        }
        int sum = 0;
        for (int j = 0; j < VL; j++)
            sum += sums[j];
        y[i].d = ISA(f2h)(d);
        y[i].s = ISA(f2h)((float)sum * d);
    }
}

TARGET static void ISA(q8_1_to_float)(const void *vx, float *y, int64_t k)
{
    const block_q8_1 *b = vx;
    for (int64_t i = 0; i < k / QK8_1; i++)
        ISA(q8_block_to_float)(b[i].d, b[i].qs, y + i * QK8_1);
}
#endif

#if VL >= 8 /* Q4_0X8's x rows on AVX2, Q5_0's and IQ4_NL's on AVX512_VNNI (quant.h) */
TARGET static void ISA(quantize_row_q8_0s)(const float *x, void *vy, int64_t k)
{
    block_q8_0s *y = vy;
    for (int64_t i = 0; i < k / QK8_0; i++) {
        block_q8_0 b;
        y[i].sum = (int16_t)ISA(quantize_block_sum)(x + i * QK8_0, &b);
        y[i].d = b.d;
        memcpy(y[i].qs, b.qs, QK8_0);
    }
}

TARGET static void ISA(q8_0s_to_float)(const void *vx, float *y, int64_t k)
{
    const block_q8_0s *b = vx;
    for (int64_t i = 0; i < k / QK8_0; i++)
        ISA(q8_block_to_float)(b[i].d, b[i].qs, y + i * QK8_0);
}
#endif

#if VL == 16 /* the X8 types' x rows on AVX512_VNNI (quant.h), offset a constant after inlining */
TARGET TD_INLINE void ISA(quantize_row_q8_0v)(const float *x, void *vy, int64_t k, const int offset)
{
    block_q8_0v *y = vy;
    for (int64_t i = 0; i < k / QK8_0; i++) {
        block_q8_0 b;
        y[i].start = -offset * ISA(quantize_block_sum)(x + i * QK8_0, &b);
        y[i].d = ISA(h2f)(b.d);
        memcpy(y[i].qs, b.qs, QK8_0);
    }
}

TARGET static void ISA(quantize_row_q8_0v_128)(const float *x, void *y, int64_t k)
{
    ISA(quantize_row_q8_0v)(x, y, k, 128);
}

TARGET static void ISA(quantize_row_q8_0v_8)(const float *x, void *y, int64_t k)
{
    ISA(quantize_row_q8_0v)(x, y, k, 8);
}

TARGET static void ISA(q8_0v_to_float)(const void *vx, float *y, int64_t k)
{
    const block_q8_0v *b = vx;
    for (int64_t i = 0; i < k / QK8_0; i++)
        for (int j = 0; j < QK8_0; j += VL)
            vstore(y + i * QK8_0 + j, b[i].d * __builtin_convertvector(ISA(load_i8)(b[i].qs + j), VEC));
}
#endif

/* ---- dot products ---- */


#if VL != 16 /* AVX-512: quant_x86.c's AVX512_VNNI kernels instead */

/* each block's exact int32 dot product, scaled by d_w * d_x into VL float sums */
TARGET static float ISA(vec_dot_q8_0_q8_0)(int64_t k, const void *vw, const void *vx)
{
    const block_q8_0 *w = vw, *x = vx;
    VEC acc = {0};
    for (int64_t i = 0; i < k / QK8_0; i++)
        acc += ISA(h2f)(w[i].d) * ISA(h2f)(x[i].d) * ISA(dot_q8_0)(w[i].qs, x[i].qs);
    return vsum(acc);
}

TARGET static float ISA(vec_dot_q4_0_q8_0)(int64_t k, const void *vw, const void *vx)
{
    const block_q4_0 *w = vw;
    const block_q8_0 *x = vx;
    VEC acc = {0};
    for (int64_t i = 0; i < k / QK4_0; i++)
        acc += ISA(h2f)(w[i].d) * ISA(h2f)(x[i].d) * ISA(dot_q4_0)(w[i].qs, x[i].qs);
    return vsum(acc);
}
#endif
