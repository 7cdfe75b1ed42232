/* quant_x86.c: the weight types' kernels on x86-64 (ggml-cpu/arch/x86/quants.c's role): AVX2 (+FMA,
   F16C) and AVX-512, and their tables, td_traits_avx2 and td_traits_avx512, which name only what
   each level does its own way (quant.c fills the rest from plain C's, quant_ref.c).

   - quant_isa.h's AVX2 and AVX-512 instances (suffixes _avx2, _avx512): f16 and bf16 rows to f32
     (their dot products are matmul_isa.h's, f32's widened), Q8_0 and Q4_0 rows to f32, x to Q8_0 (and Q8_0S, Q8_0V), the generic Q8_0 and Q4_0 dot products;
   - by hand, AVX2: the tiles of 4 weight rows by up to 2 x rows (dot_tile_avx2) and the X8 groups
     (x8_tile_avx2) (the K-quants' kernels and tables are quant_x86_k.c's);
   - quant_x86_32.h, written once for AVX2 and for AVX512_VNNI: Q4_1, Q5_1, Q5_0 and IQ4_NL in tiles
     of 4 weight rows by up to 4 x rows, plain C's float chains run 4 rows at once (bit for bit),
     with x to Q8_1 (quant_isa.h) and Q8_0S (Q5_0; IQ4_NL on VNNI);
   - by hand, AVX-512 with AVX512_VNNI (td_simd_ext says whether the CPU has it, and without it
     td_type_traits gives the AVX2 entry, as td_traits_avx512_needs says): the Q8_0 and Q4_0 dot
     products (as rows and as X8 groups). Their shape is their own: the VNNI kernels put two blocks in one zmm and gather eight blocks' scales with one permute (the X8
     ones two groups in one), which a per-block primitive under the generic loop cannot express.

   The integer dot products follow llama.cpp (ggml-cpu/arch/x86/quants.c): the "sign trick" makes
   one operand unsigned, |a| . sign(b, a) = a . b, since maddubs / vpdpbusd multiply unsigned by
   signed bytes. A fast path for another type is a function here and its entry in the level's
   table below; tests/test_block_formats.py pins it to plain C. */
#include <math.h>
#include "quant.h"

#if defined(__x86_64__)
/* ---- x86 pieces: AVX2's block dot product, and the extension kernels' odd last block ---- */

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

/* AVX2 tiles: 4 weight rows by N (1 or 2) x rows, each x block's side (its quants, d_x, and for
   Q4_0 -8 . x) made once for the 4 rows and each weight block's once for the N x rows. Q4_0's
   nibbles are the unsigned side of maddubs as they are (0..15), and -8 . x is taken off each lane
   once, where vec_dot's sign trick works on nibble - 8. Each sum has vec_dot's lanes, terms and
   order: the same result to the bit. */
TD_AVX2 TD_INLINE void dot_tile_avx2(const int q4, const int N, int64_t k, const char *vw, int64_t row_bytes,
                                     const char *vx, int64_t x_bytes, float *y, int64_t ldy)
{
    const __m256i ones = _mm256_set1_epi16(1);
    vf8 acc[4][2];
    for (int r = 0; r < 4; r++)
        for (int n = 0; n < N; n++)
            acc[r][n] = (vf8){0};
    for (int64_t i = 0; i < k / QK8_0; i++) {
        __m256i qx[2], minus8x[2];
        float dx[2];
        for (int n = 0; n < N; n++) {
            const block_q8_0 *xb = (const block_q8_0 *)(vx + n * x_bytes) + i;
            qx[n] = _mm256_loadu_si256((const __m256i *)xb->qs);
            dx[n] = _cvtsh_ss(xb->d);
            if (q4)
                minus8x[n] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(8), qx[n]), ones);
        }
        for (int r = 0; r < 4; r++) {
            __m256i qw;
            float dw;
            if (q4) {
                const block_q4_0 *wb = (const block_q4_0 *)(vw + r * row_bytes) + i;
                qw = bytes_from_nibbles_32(wb->qs), dw = _cvtsh_ss(wb->d);
            } else {
                const block_q8_0 *wb = (const block_q8_0 *)(vw + r * row_bytes) + i;
                qw = _mm256_loadu_si256((const __m256i *)wb->qs), dw = _cvtsh_ss(wb->d);
            }
            const __m256i uw = q4 ? qw : _mm256_sign_epi8(qw, qw);
            for (int n = 0; n < N; n++) {
                const __m256i sx = q4 ? qx[n] : _mm256_sign_epi8(qx[n], qw);
                __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(uw, sx), ones);
                if (q4)
                    lanes = _mm256_sub_epi32(lanes, minus8x[n]);
                acc[r][n] += dw * dx[n] * (vf8)_mm256_cvtepi32_ps(lanes);
            }
        }
    }
    for (int n = 0; n < N; n++)
        for (int r = 0; r < 4; r++)
            y[n * ldy + r] = sum_vf8(acc[r][n]);
}

#define DOT_4XN_AVX2(type, q4)                                                                              \
    TD_AVX2 static void vec_dot_4xn_##type##_q8_0_avx2(int64_t k, const void *w, int64_t row_bytes,        \
                                                       const void *x, int64_t x_bytes, int nx, float *y,   \
                                                       int64_t ldy)                                         \
    {                                                                                                       \
        for (int i = 0; i < nx; i += 2) {                                                                   \
            if (nx - i >= 2)                                                                                \
                dot_tile_avx2(q4, 2, k, w, row_bytes, (const char *)x + i * x_bytes, x_bytes, y + i * ldy, ldy); \
            else                                                                                            \
                dot_tile_avx2(q4, 1, k, w, row_bytes, (const char *)x + i * x_bytes, x_bytes, y + i * ldy, ldy); \
        }                                                                                                   \
    }
DOT_4XN_AVX2(q8_0, 0)
DOT_4XN_AVX2(q4_0, 1)
#undef DOT_4XN_AVX2

/* 32 bits of x (4 quants) in all 8 lanes */
TD_AVX2 TD_INLINE __m256i broadcast4(const int8_t *x)
{
    int32_t four;
    memcpy(&four, x, 4);
    return _mm256_set1_epi32(four);
}

/* The X8 types on AVX2: a group's block (8 rows side by side) by NX (1..4) x rows, its weight side
   made ready once for them all. Q4_0X8: the nibbles (0..15) are maddubs' unsigned side as they are,
   by 4 x quants broadcast to every lane; 8 maddubs a block summed in int16 (at most 8 x 2 x 15 x 127
   = 30480: no overflow), one madd to int32, minus 8 x sum(x) (x as Q8_0S: the sum made once per x
   row, not per group). Q8_0X8: the sign trick, each maddubs' int16 pairs (up to 2 x 127 x 127) to
   int32 by madd at once, since two could overflow. Either way lane r holds row r's exact block dot
   product; then one fma a block for the 8 rows, as x8_vec_dot_ref does for each. */
TD_AVX2 TD_INLINE void x8_tile_avx2(const int q4, const int NX, int64_t k, const char *wg, const char *vx,
                                    int64_t x_bytes, float *y, int64_t ldy)
{
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const int64_t bytes = q4 ? sizeof(block_q4_0x8) : sizeof(block_q8_0x8);
    const int64_t xblock = q4 ? sizeof(block_q8_0s) : sizeof(block_q8_0);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < k / QK8_0; b++) {
        const char *wb = wg + b * bytes;
        const td_fp16_t *d = q4 ? ((const block_q4_0x8 *)wb)->d : ((const block_q8_0x8 *)wb)->d;
        const uint8_t *qs = q4 ? ((const block_q4_0x8 *)wb)->qs : (const uint8_t *)((const block_q8_0x8 *)wb)->qs;
        __m256i uw[8]; /* Q4_0X8: the 8 rows' quants 4h..4h+3, made once for the x rows (Q8_0X8's are
                          loaded for each x row, from L1 after the first: 16 registers would spill) */
        for (int h = 0; q4 && h < 8; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * (h % 4)));
            uw[h] = _mm256_and_si256(h < 4 ? q : _mm256_srli_epi16(q, 4), m4);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));
        for (int n = 0; n < NX; n++) {
            const char *xb = vx + n * x_bytes + b * xblock;
            const int8_t *xq = q4 ? ((const block_q8_0s *)xb)->qs : ((const block_q8_0 *)xb)->qs;
            const td_fp16_t xd = q4 ? ((const block_q8_0s *)xb)->d : ((const block_q8_0 *)xb)->d;
            __m256i dot;
            if (q4) { /* quants 4h..4h+3 of x: run h % 4, low nibbles for h < 4, high ones after */
                __m256i s[2];
                for (int c = 0; c < 2; c++) /* two chains of int16 sums */
                    s[c] = _mm256_add_epi16(
                        _mm256_add_epi16(_mm256_maddubs_epi16(uw[4 * c], broadcast4(xq + 16 * c)),
                                         _mm256_maddubs_epi16(uw[4 * c + 1], broadcast4(xq + 16 * c + 4))),
                        _mm256_add_epi16(_mm256_maddubs_epi16(uw[4 * c + 2], broadcast4(xq + 16 * c + 8)),
                                         _mm256_maddubs_epi16(uw[4 * c + 3], broadcast4(xq + 16 * c + 12))));
                dot = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_add_epi16(s[0], s[1]), ones),
                                       _mm256_set1_epi32(8 * ((const block_q8_0s *)xb)->sum));
            } else {
                __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
                for (int h = 0; h < 8; h++) {
                    const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
                    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q),
                                                               _mm256_sign_epi8(broadcast4(xq + 4 * h), q));
                    s[h % 2] = _mm256_add_epi32(s[h % 2], _mm256_madd_epi16(pairs, ones));
                }
                dot = _mm256_add_epi32(s[0], s[1]);
            }
            acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dw, _mm256_set1_ps(_cvtsh_ss(xd))), acc[n]);
        }
    }
    for (int n = 0; n < NX; n++)
        _mm256_storeu_ps(y + n * ldy, acc[n]);
}

/* vec_dot_8xn (quant.h) of each X8 type: each group by the x rows four at a time, NX a constant */
#define VEC_DOT_8XN_AVX2(name, q4)                                                                           \
    TD_AVX2 static void vec_dot_8xn_##name##_avx2(int64_t k, const void *w, int64_t ngroups, int64_t group_bytes, \
                                                  const void *vx, int64_t x_bytes, int64_t nx, float *y,      \
                                                  int64_t ldy)                                                \
    {                                                                                                         \
        for (int64_t g = 0; g < ngroups; g++)                                                                 \
            for (int64_t i = 0; i < nx; i += 4) {                                                             \
                const char *wg = (const char *)w + g * group_bytes, *x = (const char *)vx + i * x_bytes;      \
                float *yt = y + i * ldy + 8 * g;                                                              \
                switch (nx - i < 4 ? nx - i : 4) {                                                            \
                case 1: x8_tile_avx2(q4, 1, k, wg, x, x_bytes, yt, ldy); break;                              \
                case 2: x8_tile_avx2(q4, 2, k, wg, x, x_bytes, yt, ldy); break;                              \
                case 3: x8_tile_avx2(q4, 3, k, wg, x, x_bytes, yt, ldy); break;                              \
                default: x8_tile_avx2(q4, 4, k, wg, x, x_bytes, yt, ldy); break;                             \
                }                                                                                             \
            }                                                                                                 \
    }
VEC_DOT_8XN_AVX2(q8_0x8_q8_0, 0)
VEC_DOT_8XN_AVX2(q4_0x8_q8_0s, 1)
#undef VEC_DOT_8XN_AVX2

/* ---- AVX2: the formats beyond Q8_0 and Q4_0 (quant_ref.c's dot products, the same numbers) ----

   Each block's integer sums are made in registers (exact, as plain C's), then its float terms are
   taken in plain C's order and steps, one block after another: the same result to the bit
   (tests/test_block_formats.py pins every level to replica()). fixed() is quant_ref.c's unfused()
   at no cost: an empty asm the product must leave a register through, so -ffp-contract=fast cannot
   fuse it into an fma with the add after it. */

TD_INLINE float fixed(float p)
{
    __asm__("" : "+x"(p));
    return p;
}

/* the sum of 8 int32 lanes */
TD_AVX2 TD_INLINE int32_t hsum_i32_8(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
}

/* Q4_1, Q5_1, Q5_0 and IQ4_NL: tiles of 4 weight rows (quant_x86_32.h), under AVX2 and under
   AVX512_VNNI's 256-bit vpdpbusd */
#define TARGET TD_AVX2
#define ISA(name) name##_avx2
#define VNNI 0
#include "quant_x86_32.h"
#undef TARGET
#undef ISA
#undef VNNI
#define TARGET TD_AVX512_VNNI
#define ISA(name) name##_vnni
#define VNNI 1
#include "quant_x86_32.h"
#undef TARGET
#undef ISA
#undef VNNI

/* ---- the exception: AVX-512 dot products that need AVX512_VNNI ---- */

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

/* -128 . w of each lane's 4 quants: (x + 128) . w - 128 . w = x . w */
TD_AVX512_VNNI TD_INLINE __m512i minus_128w(__m512i qw)
{
    return _mm512_sub_epi32(_mm512_setzero_si512(),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), qw));
}

/* The int8 tiles: R weight rows (1 or 4) by N x rows (1 to 4) of Q8_0 or Q4_0 (q4) weights at
   once, each pair of weight blocks and each pair of x blocks made ready once for the whole tile,
   so a few rows of x (a batch of decoding sequences) pass the weights for little more than one.
   vpdpbusd multiplies unsigned bytes by signed ones: Q8_0 takes x + 128 as the unsigned side and
   starts each sum at -128 . w; Q4_0's nibbles are unsigned as they are, x (in their order) the
   signed side, each sum started at -8 . x. Two blocks a step in one zmm, eight blocks' scales at
   a time; the pairs past the last 8 with their scales one by one, an odd last block as AVX2 does.
   The lanes of a pair's scale follow its dot product's. Each (row, x row) sum runs in the same
   order whatever R and N are: the same result to the bit as vec_dot. */
struct pair_side {
    __m512i q, start; /* the pair's bytes for vpdpbusd; where its sums start (the other side's -8 . x
                         or this side's -128 . w) */
};

TD_AVX512_VNNI TD_INLINE struct pair_side w_pair(const int q4, const char *w, int64_t i)
{
    if (q4)
        return (struct pair_side){nibbles_pair_q4_0((const block_q4_0 *)w + i), _mm512_setzero_si512()};
    const __m512i qw = load_q8_pair((const block_q8_0 *)w + i);
    return (struct pair_side){qw, minus_128w(qw)};
}

TD_AVX512_VNNI TD_INLINE struct pair_side x_pair(const int q4, const block_q8_0 *x)
{
    if (q4) {
        const __m512i xs = x_pair_q4_0(x);
        return (struct pair_side){xs, minus_8x(xs)};
    }
    return (struct pair_side){_mm512_xor_si512(load_q8_pair(x), _mm512_set1_epi8((char)0x80)), _mm512_setzero_si512()};
}

/* the pair's exact int32 sums, as floats */
TD_AVX512_VNNI TD_INLINE __m512 pair_dot(const int q4, struct pair_side w, struct pair_side x)
{
    return _mm512_cvtepi32_ps(q4 ? _mm512_dpbusd_epi32(x.start, w.q, x.q) : _mm512_dpbusd_epi32(w.start, x.q, w.q));
}

TD_AVX512_VNNI TD_INLINE td_fp16_t block_d(const int q4, const char *w, int64_t i) /* a weight block's scale */
{
    return q4 ? ((const block_q4_0 *)w)[i].d : ((const block_q8_0 *)w)[i].d;
}

/* an odd last block, as AVX2 does it, with vpdpbusd */
TD_AVX512_VNNI TD_INLINE float last_block(const int q4, const char *w, int64_t i, const block_q8_0 *x)
{
    const __m256i qw = q4 ? _mm256_sub_epi8(bytes_from_nibbles_32(((const block_q4_0 *)w)[i].qs), _mm256_set1_epi8(8))
                          : _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)w)[i].qs);
    const __m256i qx = _mm256_loadu_si256((const __m256i *)x->qs);
    return hsum_float_8(_mm256_mul_ps(scale_8(block_d(q4, w, i), x->d), mul_sum_i8_pairs_vnni(qw, qx)));
}

TD_AVX512_VNNI TD_INLINE void dot_tile(const int q4, const int R, const int N, int64_t k, const char *vw,
                                       int64_t row_bytes, const char *vx, int64_t x_bytes, float *y, int64_t ldy)
{
    const __m512i lanes = q4 ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1)
                             : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const char *w[4];
    const block_q8_0 *x[4];
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        w[r] = vw + r * row_bytes;
    for (int n = 0; n < N; n++) {
        x[n] = (const block_q8_0 *)(vx + n * x_bytes);
        for (int r = 0; r < R; r++)
            acc[r][n] = _mm512_setzero_ps();
    }
    int64_t nb = k / QK8_0, i = 0;
    for (; i + 8 <= nb; i += 8) {
        __m256 dw[4], dx[4];
        for (int r = 0; r < R; r++)
            dw[r] = _mm256_cvtph_ps(q4 ? scales8_q4_0((const block_q4_0 *)w[r] + i)
                                       : scales8_q8_0((const block_q8_0 *)w[r] + i));
        for (int n = 0; n < N; n++)
            dx[n] = _mm256_cvtph_ps(scales8_q8_0(x[n] + i));
        for (int j = 0; j < 8; j += 2) {
            const __m512i at = _mm512_add_epi32(lanes, _mm512_set1_epi32(j));
            struct pair_side ws[4];
            for (int r = 0; r < R; r++)
                ws[r] = w_pair(q4, w[r], i + j);
            for (int n = 0; n < N; n++) {
                const struct pair_side xs = x_pair(q4, x[n] + i + j);
                for (int r = 0; r < R; r++) {
                    const __m512 s = _mm512_castps256_ps512(_mm256_mul_ps(dw[r], dx[n]));
                    acc[r][n] = _mm512_fmadd_ps(pair_dot(q4, ws[r], xs), _mm512_permutexvar_ps(at, s), acc[r][n]);
                }
            }
        }
    }
    for (; i + 2 <= nb; i += 2)
        for (int n = 0; n < N; n++) {
            const struct pair_side xs = x_pair(q4, x[n] + i);
            for (int r = 0; r < R; r++)
                acc[r][n] = _mm512_fmadd_ps(pair_dot(q4, w_pair(q4, w[r], i), xs),
                                            scale_pair(block_d(q4, w[r], i), block_d(q4, w[r], i + 1), x[n][i].d,
                                                       x[n][i + 1].d, lanes), acc[r][n]);
        }
    for (int n = 0; n < N; n++)
        for (int r = 0; r < R; r++) {
            y[n * ldy + r] = _mm512_reduce_add_ps(acc[r][n]);
            if (i < nb)
                y[n * ldy + r] += last_block(q4, w[r], i, x[n] + i);
        }
}

TD_AVX512_VNNI static float vec_dot_q8_0_q8_0_avx512(int64_t k, const void *w, const void *x)
{
    float y;
    dot_tile(0, 1, 1, k, w, 0, x, 0, &y, 1);
    return y;
}

TD_AVX512_VNNI static float vec_dot_q4_0_q8_0_avx512(int64_t k, const void *w, const void *x)
{
    float y;
    dot_tile(1, 1, 1, k, w, 0, x, 0, &y, 1);
    return y;
}

/* the tiles of four weight rows, with N a constant in each */
#define DOT_4XN(type, q4)                                                                                      \
    TD_AVX512_VNNI static void vec_dot_4xn_##type##_q8_0_avx512(int64_t k, const void *w, int64_t row_bytes,  \
                                                                const void *x, int64_t x_bytes, int nx,       \
                                                                float *y, int64_t ldy)                        \
    {                                                                                                          \
        switch (nx) {                                                                                          \
        case 1: dot_tile(q4, 4, 1, k, w, row_bytes, x, x_bytes, y, ldy); break;                               \
        case 2: dot_tile(q4, 4, 2, k, w, row_bytes, x, x_bytes, y, ldy); break;                               \
        case 3: dot_tile(q4, 4, 3, k, w, row_bytes, x, x_bytes, y, ldy); break;                               \
        default: dot_tile(q4, 4, 4, k, w, row_bytes, x, x_bytes, y, ldy); break;                              \
        }                                                                                                      \
    }
DOT_4XN(q8_0, 0)
DOT_4XN(q4_0, 1)
#undef DOT_4XN

/* The X8 types on AVX512_VNNI: two groups side by side (16 rows, group a in lanes 0-7, b in 8-15;
   a lone last group goes as a = b, its second half not stored) by NX (1..8) x rows. vpdpbusd takes
   the weights as its unsigned side, in lanes of 4 quants (Q8_0X8: q + 128; Q4_0X8: the nibbles,
   q + 8), made ready once a block for all NX x rows, and 4 quants of x broadcast to every lane. The
   offset comes back by starting each sum at x's -offset . sum (Q8_0V). Every x number comes in by a
   broadcast load; what remains a block is the int8 work and one cvt, mul and fma an x row. Lane r's
   sum is row r's exact block dot product, and that fma a block follows x8_vec_dot_ref, so a row's
   result is the readable one.
   Two groups are two streams of memory, each a group long (k/32 blocks: 4.9 KB for k = 576) and
   then a jump over the other: the hardware's prefetchers start over at every jump (AMD Zen 4: the
   LM head of SmolLM2-135M, 28 MB, read at 24-34 GB/s against 65-87 in one stream, one x row), so
   each block prefetches the same block of the pair after this one (the rows of the task after
   this one in matmul.c, mostly the same thread's next). Zen 4, 2 threads: 8 decoding sequences of
   SmolLM2-135M q8_0 629-679 -> 919-1038 t/s. Not measured on a Xeon, where an earlier prefetch
   (a fixed distance ahead in each stream) gained nothing. */
TD_AVX512_VNNI TD_INLINE void x8_tile_avx512(const int q4, const int NX, int64_t k, const char *ga, const char *gb,
                                             int pair, const char *vx, int64_t x_bytes, float *y, int64_t ldy)
{
    const __m512i low = _mm512_set1_epi8(15), x80 = _mm512_set1_epi8((char)0x80);
    const int64_t bytes = q4 ? sizeof(block_q4_0x8) : sizeof(block_q8_0x8), next = 2 * (gb - ga);
    __m512 acc[8];
    for (int n = 0; n < NX; n++)
        acc[n] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / QK8_0; b++) {
        const char *wa = ga + b * bytes, *wb = gb + b * bytes; /* d[8], then the runs of 32 bytes */
        for (int64_t c = 0; pair && c < bytes; c += 64) {
            __builtin_prefetch(wa + next + c, 0, 2);
            __builtin_prefetch(wb + next + c, 0, 2);
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)wa)), _mm_loadu_si128((const __m128i *)wb), 1));
        __m512i uw[8]; /* lanes of 4 quants 4h..4h+3 of the 16 rows, unsigned */
        for (int h = 0; h < 8; h++) {
            const int run = q4 ? h % 4 : h;
            const __m512i q = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(wa + 16 + 32 * run))),
                _mm256_loadu_si256((const __m256i *)(wb + 16 + 32 * run)), 1);
            uw[h] = !q4 ? _mm512_xor_si512(q, x80) : _mm512_and_si512(h < 4 ? q : _mm512_srli_epi16(q, 4), low);
        }
#pragma GCC unroll 8 /* every x row's sums in registers (gcc stops at 64 vpdpbusd by itself) */
        for (int n = 0; n < NX; n++) {
            const block_q8_0v *xb = (const block_q8_0v *)(vx + n * x_bytes) + b;
            __m512i s = _mm512_set1_epi32(xb->start);
#pragma GCC unroll 8
            for (int h = 0; h < 8; h++) {
                int32_t four;
                memcpy(&four, xb->qs + 4 * h, 4);
                s = _mm512_dpbusd_epi32(s, uw[h], _mm512_set1_epi32(four));
            }
            acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(xb->d)), acc[n]);
        }
    }
    for (int n = 0; n < NX; n++)
        if (pair)
            _mm512_storeu_ps(y + n * ldy, acc[n]);
        else
            _mm256_storeu_ps(y + n * ldy, _mm512_castps512_ps256(acc[n]));
}

/* One x row (decoding one sequence) reads as fast as memory lets it, and then one stream is what
   keeps memory busy: a group at a time (the groups lie one after the other), in 256-bit registers,
   as x8_tile_avx512 does each of its halves (the same sums: the same results). On Zen 4, 2 threads,
   SmolLM2-135M decode against pairs of groups with no prefetch: q8_0 177-183 t/s against 128-142,
   q4_0 299-335 against 175-186 (pairs prefetching the next pair made q8_0 150-182). On AMD only: on
   the Xeon the pairs win (SmolLM2-135M-shaped q4_0 decode step 5.9 -> 2.6 ms, q8_0 7.7 -> 5.8). */
TD_AVX512_VNNI TD_INLINE void x8_row_avx512(const int q4, int64_t k, const char *g, const block_q8_0v *xb, float *y)
{
    const __m256i low = _mm256_set1_epi8(15), x80 = _mm256_set1_epi8((char)0x80);
    const int64_t bytes = q4 ? sizeof(block_q4_0x8) : sizeof(block_q8_0x8);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / QK8_0; b++) {
        const char *wb = g + b * bytes;
        __m256i s = _mm256_set1_epi32(xb[b].start);
#pragma GCC unroll 8
        for (int h = 0; h < 8; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(wb + 16 + 32 * (q4 ? h % 4 : h)));
            const __m256i uw = !q4 ? _mm256_xor_si256(q, x80) : _mm256_and_si256(h < 4 ? q : _mm256_srli_epi16(q, 4), low);
            int32_t four;
            memcpy(&four, xb[b].qs + 4 * h, 4);
            s = _mm256_dpbusd_epi32(s, uw, _mm256_set1_epi32(four));
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wb));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(xb[b].d)), acc);
    }
    _mm256_storeu_ps(y, acc);
}

/* vec_dot_8xn (quant.h) of each X8 type: one x row a group at a time; more, groups two at a time
   by the x rows eight at a time */
#define VEC_DOT_8XN_AVX512(name, q4)                                                                           \
    TD_AVX512_VNNI static void vec_dot_8xn_##name##_avx512(int64_t k, const void *w, int64_t ngroups,          \
                                                           int64_t group_bytes, const void *vx, int64_t x_bytes,\
                                                           int64_t nx, float *y, int64_t ldy)                  \
    {                                                                                                           \
        const int one_stream = nx == 1 && td_amd;                                                               \
        for (int64_t g = 0; one_stream && g < ngroups; g++)                                                     \
            x8_row_avx512(q4, k, (const char *)w + g * group_bytes, vx, y + 8 * g);                             \
        for (int64_t g = 0; !one_stream && g < ngroups; g += 2)                                                 \
            for (int64_t i = 0; i < nx; i += 8) {                                                               \
                const char *ga = (const char *)w + g * group_bytes, *x = (const char *)vx + i * x_bytes;        \
                const int pair = g + 1 < ngroups;                                                               \
                const char *gb = pair ? ga + group_bytes : ga;                                                  \
                float *yt = y + i * ldy + 8 * g;                                                                \
                switch (nx - i < 8 ? nx - i : 8) {                                                              \
                case 1: x8_tile_avx512(q4, 1, k, ga, gb, pair, x, x_bytes, yt, ldy); break;                    \
                case 2: x8_tile_avx512(q4, 2, k, ga, gb, pair, x, x_bytes, yt, ldy); break;                    \
                case 3: x8_tile_avx512(q4, 3, k, ga, gb, pair, x, x_bytes, yt, ldy); break;                    \
                case 4: x8_tile_avx512(q4, 4, k, ga, gb, pair, x, x_bytes, yt, ldy); break;                    \
                case 5: x8_tile_avx512(q4, 5, k, ga, gb, pair, x, x_bytes, yt, ldy); break;                    \
                case 6: x8_tile_avx512(q4, 6, k, ga, gb, pair, x, x_bytes, yt, ldy); break;                    \
                case 7: x8_tile_avx512(q4, 7, k, ga, gb, pair, x, x_bytes, yt, ldy); break;                    \
                default: x8_tile_avx512(q4, 8, k, ga, gb, pair, x, x_bytes, yt, ldy); break;                   \
                }                                                                                               \
            }                                                                                                   \
    }
VEC_DOT_8XN_AVX512(q8_0x8_q8_0v, 0)
VEC_DOT_8XN_AVX512(q4_0x8_q8_0v, 1)
#undef VEC_DOT_8XN_AVX512


/* quant_isa.h under AVX2 (vf8) and AVX-512 (vf16) */
#define TD_ISA_FILE "quant_isa.h"
#define VEC vf8
#define VL 8
#define REGS 16
#define PLAIN 0
#define NEON 0
#define TARGET TD_AVX2
#define ISA(name) name##_avx2
#include "isa_instance.h"

#define VEC vf16
#define VL 16
#define REGS 32
#define PLAIN 0
#define NEON 0
#define TARGET TD_AVX512
#define ISA(name) name##_avx512
#include "isa_instance.h"

/* the blocks of 32 beyond Q8_0 and Q4_0 (quant_x86_32.h): the kernels of suffix k, x quantized by
   the level's own quantizers (suffix q) */
#define X_Q8_1(q) .from_float = quantize_row_q8_1_##q, .x_to_float = q8_1_to_float_##q, .x_blck_size = QK8_1, \
                  .x_type_size = sizeof(block_q8_1)
#define BLOCK32_FORMATS(k, q, ahead)                                                                              \
    [TD_Q4_1] = {X_Q8_1(q), .vec_dot = vec_dot_q4_1_q8_1_##k, .vec_dot_4xn = vec_dot_4xn_q4_1_q8_1_##k,            \
                 .tile_ahead = ahead},                                                                            \
    [TD_Q5_1] = {X_Q8_1(q), .vec_dot = vec_dot_q5_1_q8_1_##k, .vec_dot_4xn = vec_dot_4xn_q5_1_q8_1_##k,            \
                 .tile_ahead = ahead},                                                                            \
    [TD_Q5_0] = {X_Q8_0S(q), .vec_dot = vec_dot_q5_0_q8_0_##k, .vec_dot_4xn = vec_dot_4xn_q5_0_q8_0_##k,           \
                 .tile_ahead = ahead},                                                                            \
    [TD_IQ4_NL] = {X_IQ4_NL_##q, .vec_dot = vec_dot_iq4_nl_q8_0_##k, .vec_dot_4xn = vec_dot_4xn_iq4_nl_q8_0_##k,   \
                   .tile_ahead = ahead}
#define X_Q8_0S(q) .from_float = quantize_row_q8_0s_##q, .x_to_float = q8_0s_to_float_##q, .x_blck_size = QK8_0, \
                   .x_type_size = sizeof(block_q8_0s) /* Q8_0 and its sums, for an offset's product with x */
#define X_IQ4_NL_avx2 TD_X_Q8_0(avx2) /* IQ4_NL's x: Q8_0 on AVX2 (signed quants), Q8_0S on VNNI (grid + 128) */
#define X_IQ4_NL_avx512 X_Q8_0S(avx512)

/* AVX2's own functions, per type; a field left out is plain C's (quant.c) */
const struct type_traits td_traits_avx2[TD_NTYPES] = {
    [TD_F16] = {.to_float = f16_to_float_avx2},
    [TD_BF16] = {.to_float = bf16_to_float_avx2},
    [TD_Q8_0] = {.to_float = q8_0_to_float_avx2, TD_X_Q8_0(avx2), .vec_dot = vec_dot_q8_0_q8_0_avx2,
                 .vec_dot_4xn = vec_dot_4xn_q8_0_q8_0_avx2},
    [TD_Q4_0] = {.to_float = q4_0_to_float_avx2, TD_X_Q8_0(avx2), .vec_dot = vec_dot_q4_0_q8_0_avx2,
                 .vec_dot_4xn = vec_dot_4xn_q4_0_q8_0_avx2},
    [TD_Q8_0X8] = {TD_X_Q8_0(avx2), .vec_dot_8xn = vec_dot_8xn_q8_0x8_q8_0_avx2},
    [TD_Q4_0X8] = {.from_float = quantize_row_q8_0s_avx2, .x_to_float = q8_0s_to_float_avx2, .x_blck_size = QK8_0,
                   .x_type_size = sizeof(block_q8_0s), .vec_dot_8xn = vec_dot_8xn_q4_0x8_q8_0s_avx2}, /* x as Q8_0S */
    BLOCK32_FORMATS(avx2, avx2, 0),
};

/* AVX-512's own functions, per type; a field left out is plain C's */
const struct type_traits td_traits_avx512[TD_NTYPES] = {
    [TD_F16] = {.to_float = f16_to_float_avx512},
    [TD_BF16] = {.to_float = bf16_to_float_avx512},
    [TD_Q8_0] = {.to_float = q8_0_to_float_avx512, TD_X_Q8_0(avx512), .vec_dot = vec_dot_q8_0_q8_0_avx512,
                 .vec_dot_4xn = vec_dot_4xn_q8_0_q8_0_avx512},
    [TD_Q4_0] = {.to_float = q4_0_to_float_avx512, TD_X_Q8_0(avx512), .vec_dot = vec_dot_q4_0_q8_0_avx512,
                 .vec_dot_4xn = vec_dot_4xn_q4_0_q8_0_avx512},
    [TD_Q8_0X8] = {.from_float = quantize_row_q8_0v_128_avx512, .x_to_float = q8_0v_to_float_avx512, /* x as Q8_0V */
                   .x_blck_size = QK8_0, .x_type_size = sizeof(block_q8_0v),
                   .vec_dot_8xn = vec_dot_8xn_q8_0x8_q8_0v_avx512},
    [TD_Q4_0X8] = {.from_float = quantize_row_q8_0v_8_avx512, .x_to_float = q8_0v_to_float_avx512,
                   .x_blck_size = QK8_0, .x_type_size = sizeof(block_q8_0v),
                   .vec_dot_8xn = vec_dot_8xn_q4_0x8_q8_0v_avx512},
    BLOCK32_FORMATS(vnni, avx512, 1),
};

/* the extension each AVX-512 entry needs; without it the AVX2 entry is used */
const int td_traits_avx512_needs[TD_NTYPES] = {[TD_Q8_0] = TD_EXT_VNNI,
                                               [TD_Q4_0] = TD_EXT_VNNI, [TD_Q8_0X8] = TD_EXT_VNNI,
                                               [TD_Q4_0X8] = TD_EXT_VNNI, [TD_Q4_1] = TD_EXT_VNNI,
                                               [TD_Q5_1] = TD_EXT_VNNI, [TD_Q5_0] = TD_EXT_VNNI,
                                               [TD_IQ4_NL] = TD_EXT_VNNI};
#endif
