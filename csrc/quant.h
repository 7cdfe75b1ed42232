/* quant.h: the weight types beside f32, in llama.cpp's layouts byte for byte (ggml-common.h), and
   what the matmul kernels need of each type (ggml's type_traits).

   A weight row of k numbers is k halves (f16), k bfloat16s (bf16), or blocks of a scale (or two,
   or sub-block scales) and small integers: k/32 blocks of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL;
   k/256 super-blocks of the K-quants Q2_K .. Q6_K, Q8_K and of IQ4_XS. To multiply, each x
   (activation) row is first converted, once per call, to the type its dot product with a weight
   row wants (ggml's vec_dot_type), so that a block's dot product is integer (exact):
     Q8_0, Q4_0, Q5_0, IQ4_NL: x quantized to Q8_0 blocks, each block's integer dot product
       scaled by d_x * d_w;
     Q4_1, Q5_1: x to Q8_1 (Q8_0 and d_x * the sum of its quants, which the weights' minimum m
       multiplies);
     the K-quants and IQ4_XS: x to Q8_K (256 quants, an f32 scale and the sums of each 16), each
       sub-block's integer dot product times its integer scale, summed in int32, the minimums
       through the sums of 16;
     f16 and bf16 weights: x stays f32 and the weights are widened as they are read (matmul_isa.h:
       the f32 tiles' order).
   Every path of a type sees the same converted x, so a row's result does not depend on how many
   rows the call has (only on the order of float sums). */
#ifndef TD_QUANT_H
#define TD_QUANT_H
#include "internal.h"

typedef uint16_t td_fp16_t; /* an IEEE half, as bits */
typedef uint16_t td_bf16_t; /* the top 16 bits of a float32 */

#define QK8_0 32
typedef struct {
    td_fp16_t d;      /* scale: the block's largest magnitude / 127 */
    int8_t qs[QK8_0]; /* weight j = d * qs[j] */
} block_q8_0;         /* 34 bytes: 8.5 bits a weight */

#define QK4_0 32
typedef struct {
    td_fp16_t d;           /* scale: the block's value of largest magnitude / -8 */
    uint8_t qs[QK4_0 / 2]; /* weight j in the low nibble of qs[j], weight j+16 in the high one;
                              weight = d * (nibble - 8) */
} block_q4_0;              /* 18 bytes: 4.5 bits a weight */

#define QK4_1 32
typedef struct {
    td_fp16_t d, m;        /* scale (the block's range / 15) and minimum */
    uint8_t qs[QK4_1 / 2]; /* weight j in the low nibble of qs[j], weight j+16 in the high one;
                              weight = d * nibble + m */
} block_q4_1;              /* 20 bytes: 5 bits a weight */

#define QK5_0 32
typedef struct {
    td_fp16_t d;           /* scale: the block's value of largest magnitude / -16 */
    uint8_t qh[4];         /* bit j of the little-endian uint32: the fifth bit of weight j */
    uint8_t qs[QK5_0 / 2]; /* the low four bits, nibbles as block_q4_0's; weight = d * (q - 16) */
} block_q5_0;              /* 22 bytes: 5.5 bits a weight */

#define QK5_1 32
typedef struct {
    td_fp16_t d, m;        /* scale (range / 31) and minimum */
    uint8_t qh[4];         /* as block_q5_0's */
    uint8_t qs[QK5_1 / 2]; /* as block_q5_0's; weight = d * q + m */
} block_q5_1;              /* 24 bytes: 6 bits a weight */

#define QK4_NL 32
typedef struct {
    td_fp16_t d;            /* scale */
    uint8_t qs[QK4_NL / 2]; /* 4-bit indices, nibbles as block_q4_0's; weight = d * kvalues_iq4nl[index] */
} block_iq4_nl;             /* 18 bytes: 4.5 bits a weight */

/* IQ4_NL's and IQ4_XS's 16 values, a non-linear grid denser near 0 (ggml-common.h) */
static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* Q8_1: an x row for Q4_1 and Q5_1 (made per call; ggml's vec_dot_type of theirs): Q8_0 with s =
   d * the sum of its quants (d in f32 before its f16 rounding, as ggml's quantize_row_q8_1_ref),
   so that a weight block's minimum m contributes m * s in one product */
#define QK8_1 32
typedef struct {
    td_fp16_t d, s;   /* as block_q8_0.d; d * (qs[0] + ... + qs[31]) */
    int8_t qs[QK8_1]; /* as block_q8_0.qs */
} block_q8_1;         /* 36 bytes */

/* The K-quants: a super-block of QK_K = 256 weights in sub-blocks of 16 or 32, each sub-block's
   scale (and minimum) a small integer times the super-block's f16 d (and dmin). Sub-block s holds
   weights 16s..16s+15 (or 32s..32s+31). */
#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct {
    uint8_t scales[QK_K / 16]; /* sub-block s of 16: scale d * (scales[s] & 15), minimum dmin * (scales[s] >> 4) */
    uint8_t qs[QK_K / 4];      /* 2-bit quants: weight 128h + 32j + l (h < 2, j < 4, l < 32) in bits 2j..2j+1
                                  of qs[32h + l]; weight = d * (scales[s] & 15) * q - dmin * (scales[s] >> 4) */
    td_fp16_t d, dmin;
} block_q2_K;                  /* 84 bytes: 2.625 bits a weight */

typedef struct {
    uint8_t hmask[QK_K / 8];  /* bit j of hmask[l]: weight 32j + l's high bit, set for 0..3, clear for -4..-1 */
    uint8_t qs[QK_K / 4];     /* the low 2 bits, placed as block_q2_K's */
    uint8_t scales[K_SCALE_SIZE]; /* 16 6-bit scales: scale s's low 4 bits are byte s % 8's low (s < 8)
                                     or high nibble, its high 2 bits bits 2(s / 4)..+1 of byte 8 + s % 4;
                                     sub-block s of 16 scales by d * (that - 32) */
    td_fp16_t d;              /* weight = d * (scale - 32) * (low bits - (high bit ? 0 : 4)) */
} block_q3_K;                 /* 110 bytes: 3.4375 bits a weight */

typedef struct {
    td_fp16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE]; /* 8 6-bit scales and 8 6-bit minimums of sub-blocks of 32: for s < 4,
                                     scale s = scales[s] & 63, minimum s = scales[s + 4] & 63; for s >= 4,
                                     scale s = (scales[s + 4] & 15) | (scales[s - 4] >> 6) << 4, minimum s =
                                     (scales[s + 4] >> 4) | (scales[s] >> 6) << 4 (ggml's get_scale_min_k4) */
    uint8_t qs[QK_K / 2];     /* weight 64j + l (l < 32) in the low nibble of qs[32j + l], 64j + 32 + l in
                                 the high one; weight = d * scale * q - dmin * minimum */
} block_q4_K;                 /* 144 bytes: 4.5 bits a weight */

typedef struct {
    td_fp16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE]; /* as block_q4_K's */
    uint8_t qh[QK_K / 8];     /* bit j of qh[l]: the fifth bit of weight 32j + l */
    uint8_t qs[QK_K / 2];     /* the low 4 bits, placed as block_q4_K's */
} block_q5_K;                 /* 176 bytes: 5.5 bits a weight */

typedef struct {
    uint8_t ql[QK_K / 2];      /* low 4 bits: weight 128h + 64n + l (l < 64) in nibble n of ql[64h + l] */
    uint8_t qh[QK_K / 4];      /* high 2 bits: weight 128h + 32j + l (l < 32) in bits 2j..2j+1 of qh[32h + l] */
    int8_t scales[QK_K / 16];  /* signed scales of sub-blocks of 16 */
    td_fp16_t d;               /* weight = d * scales[s] * (q - 32) */
} block_q6_K;                  /* 210 bytes: 6.5625 bits a weight */

/* Q8_K: the K-quants' x row (ggml's vec_dot_type of theirs and IQ4_XS's), and a weight type too */
typedef struct {
    float d;                   /* 1 / iscale, iscale = -127 / (the value of largest magnitude) */
    int8_t qs[QK_K];           /* weight j = d * qs[j] */
    int16_t bsums[QK_K / 16];  /* qs[16s] + ... + qs[16s + 15] */
} block_q8_K;                  /* 292 bytes: 9.125 bits a weight */

typedef struct {
    td_fp16_t d;
    uint16_t scales_h;         /* bits 2s..2s+1: the high 2 bits of sub-block s's 6-bit scale */
    uint8_t scales_l[QK_K / 64]; /* nibble s % 2 of scales_l[s / 2]: its low 4 bits */
    uint8_t qs[QK_K / 2];      /* 4-bit indices: sub-block s of 32 in qs[16s..16s+15], nibbles as block_q4_0's;
                                  weight = d * (scale - 32) * kvalues_iq4nl[index] */
} block_iq4_xs;                /* 136 bytes: 4.25 bits a weight */

/* Q8_0X8 and Q4_0X8: Q8_0 and Q4_0 repacked at load (never stored in a file), block b of 8 rows side
   by side, so that one 256-bit load holds 4 quants of each of the 8 rows and the dot products of the
   8 rows come out in the 8 lanes of one register: no sum across lanes, one scale conversion for 8
   rows, and one stream of memory a group. The bytes are the row blocks' own, moved 4 at a time
   (llama.cpp's block_q4_0x8 does the same for its AVX2 GEMV, in another order). Weight row 8g + r
   of a matrix is row r of group g; w[m/8][k/32]. Made for the AVX2 and AVX512_VNNI kernels. */
typedef struct {
    td_fp16_t d[8]; /* row r's block scale, as its block_q8_0.d */
    int8_t qs[256]; /* run h = 0..7 of 32 bytes: bytes 4r..4r+3 are row r's qs[4h..4h+3] */
} block_q8_0x8;     /* 272 bytes: 8 x 34 */

typedef struct {
    td_fp16_t d[8];  /* row r's block scale, as its block_q4_0.d */
    uint8_t qs[128]; /* run h = 0..3 of 32 bytes: bytes 4r..4r+3 are row r's qs[4h..4h+3], that is
                        weights 4h..4h+3 in the low nibbles and 16+4h..16+4h+3 in the high ones */
} block_q4_0x8;      /* 144 bytes: 8 x 18 */

/* F32P, F16P and BF16P: f32, f16 and bf16 matrices repacked at load (never stored in a file) for
   a model whose every pass has many rows (masked diffusion), in the f32 GEMM's panels, so that it
   reads a panel where it would pack one from TD_PANEL rows on every call (matmul.c). Weight row
   TD_PANEL g + c, number p, is w[g][p][c]: a panel's numbers p of its TD_PANEL rows side by side,
   in the row type's own bytes (f16 and bf16 are widened where the GEMM would pack them). TD_PANEL
   (32) is a multiple of every instruction set's NR, the width of the GEMM's register tile. */

/* Q8_0S: an x row for Q4_0X8's AVX2 kernel (made per call, never stored): a Q8_0 block and the
   exact sum of its quants, which Q4_0's offset of 8 takes back (8 . sum); made once per x row, not
   once per group of 8 weight rows the row meets */
typedef struct {
    td_fp16_t d;       /* as block_q8_0.d */
    int16_t sum;       /* qs[0] + ... + qs[31] (|sum| <= 32 x 127) */
    int8_t qs[QK8_0];  /* as block_q8_0.qs */
} block_q8_0s;         /* 36 bytes */

/* Q8_0V: an x row for the X8 kernels on AVX512_VNNI (made per call, never stored): a Q8_0 block's
   quants with its scale widened to f32 and the start of the kernel's int32 sums, -offset . sum of
   the quants (the offset its weights carry: 128 for Q8_0X8, 8 for Q4_0X8), so that each comes into
   every lane by a broadcast load, where a scale to widen or a sum to multiply cost a shuffle a block */
typedef struct {
    float d;          /* the block_q8_0.d widened */
    int32_t start;    /* -offset * (qs[0] + ... + qs[31]) */
    int8_t qs[QK8_0]; /* as block_q8_0.qs */
} block_q8_0v;        /* 40 bytes */

_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 must match GGUF's 34 bytes");
_Static_assert(sizeof(block_q8_0x8) == 8 * sizeof(block_q8_0), "block_q8_0x8 is 8 Q8_0 blocks");
_Static_assert(sizeof(block_q4_0x8) == 8 * sizeof(block_q4_0), "block_q4_0x8 is 8 Q4_0 blocks");
_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 must match GGUF's 18 bytes");
_Static_assert(sizeof(block_q4_1) == 20 && sizeof(block_q5_0) == 22 && sizeof(block_q5_1) == 24 &&
               sizeof(block_iq4_nl) == 18 && sizeof(block_q8_1) == 36, "the 32-blocks must match GGUF's sizes");
_Static_assert(sizeof(block_q2_K) == 84 && sizeof(block_q3_K) == 110 && sizeof(block_q4_K) == 144 &&
               sizeof(block_q5_K) == 176 && sizeof(block_q6_K) == 210 && sizeof(block_q8_K) == 292 &&
               sizeof(block_iq4_xs) == 136, "the super-blocks must match GGUF's sizes");

typedef void (*to_float_fn)(const void *w, float *y, int64_t k);      /* y[k] = k numbers of a row */
typedef void (*from_float_fn)(const float *x, void *y, int64_t k);    /* an x row to vec_dot's type */
typedef float (*vec_dot_fn)(int64_t k, const void *w, const void *x); /* weight row . converted x row */
typedef void (*vec_dot_4xn_fn)(int64_t k, const void *w, int64_t row_bytes, const void *x, int64_t x_bytes, int nx,
                               float *y, int64_t ldy);
            /* y[i*ldy + r] = weight row r (row_bytes apart) . x row i (x_bytes apart), for r < 4 and
               i < nx <= 4: as vec_dot gives each, to the bit */
typedef void (*vec_dot_8xn_fn)(int64_t k, const void *w, int64_t ngroups, int64_t group_bytes, const void *x,
                               int64_t x_bytes, int64_t nx, float *y, int64_t ldy);
            /* interleaved types: y[i*ldy + 8g + r] = row r of group g (group_bytes apart) . x row i,
               for r < 8, g < ngroups, i < nx; per row, the blocks' exact integer dot products scaled
               and summed in order, one fma a block (ggml's reference order, with the fma) */
typedef void (*to_float_lane_fn)(const void *w, int lane, float *y, int64_t k); /* row `lane` of a group */

struct type_traits {
    int64_t blck_size, type_size; /* numbers per block and its bytes (1 and 2 for f16, bf16) */
    to_float_fn to_float;         /* widens weights, for the f32 GEMM's packed panels */
    from_float_fn from_float;     /* NULL: vec_dot takes x as f32 */
    to_float_fn x_to_float;       /* a converted x row back to f32 (the f32 GEMM's input) */
    int64_t x_blck_size, x_type_size;
    vec_dot_fn vec_dot;
    vec_dot_4xn_fn vec_dot_4xn;   /* NULL, or a tile of 4 weight rows by up to 4 x rows sharing the
                                     work on each (same results) */
    int tile_ahead;               /* vec_dot_4xn (and vec_dot) prefetch the rows ahead themselves on
                                     Intel, so matmul.c does not (quant_x86_32.h's VNNI tiles) */
    int64_t rows;                 /* weight rows a stored unit interleaves: 8 for the X8 types (whose
                                     blocks are groups: blck_size and type_size say one row's share),
                                     which has to_float_lane and vec_dot_8xn instead of to_float,
                                     vec_dot and vec_dot_4xn; TD_PANEL for the panel types, which
                                     only the f32 GEMM reads (matmul_isa.h), and to_float_lane gives
                                     a row of; else 1 */
    to_float_lane_fn to_float_lane;
    vec_dot_8xn_fn vec_dot_8xn;
};

/* the functions for the SIMD level in use (and the extensions it may use): quant.c */
const struct type_traits *td_type_traits(enum td_type type);

/* each level's own functions (quant.c merges them over plain C's): every field of every type in
   plain C (quant_ref.c); on x86-64 AVX2's and AVX-512's, and the extension each AVX-512 entry
   needs (quant_x86.c; the K-quants' in quant_x86_k.c, _k); on arm64 NEON's and what dotprod adds
   to them (quant_arm.c) */
extern const struct type_traits td_traits_c[TD_NTYPES];
extern const struct type_traits td_traits_avx2[TD_NTYPES], td_traits_avx512[TD_NTYPES];
extern const int td_traits_avx512_needs[TD_NTYPES];
extern const struct type_traits td_traits_avx2_k[TD_NTYPES], td_traits_avx512_k[TD_NTYPES];
extern const int td_traits_avx512_k_needs[TD_NTYPES];
extern const struct type_traits td_traits_neon[TD_NTYPES], td_traits_dotprod[TD_NTYPES];

/* a table entry's x type when it is Q8_0, made by the level's quantize_row_q8_0 */
#define TD_X_Q8_0(isa) .from_float = quantize_row_q8_0_##isa, .x_to_float = q8_0_to_float_##isa, \
                       .x_blck_size = QK8_0, .x_type_size = sizeof(block_q8_0)

/* ys[j][n,ms[j]] = x[n,k] @ ws[j]^T for up to 4 Q8_0, Q4_0, Q8_0X8 or Q4_0X8 weights of one type,
   one job for all, in int8 on AVX512_VNNI (gemm_q8.c); 0, or -1 out of scratch memory */
int td_gemm_q8_vnni(enum td_type type, const float *x, int64_t n, int64_t k, int64_t nw, void **ws, float **ys,
                    const int64_t *ms);

/* ---- scalar conversions (ggml-impl.h's portable versions) ---- */

TD_INLINE float fp32_from_bits(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }
TD_INLINE uint32_t fp32_to_bits(float f) { uint32_t w; memcpy(&w, &f, 4); return w; }

/* exact: every half is a float */
TD_INLINE float fp16_to_fp32(td_fp16_t h)
{
    const uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    const float normalized = fp32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = fp32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    return fp32_from_bits(sign | (two_w < (1u << 27) ? fp32_to_bits(denormalized) : fp32_to_bits(normalized)));
}

/* round to nearest even, overflow to inf, NaN stays NaN (as F16C and NumPy) */
TD_INLINE td_fp16_t fp32_to_fp16(float f)
{
    float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = fp32_to_bits(f), shl1_w = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u)
        bias = 0x71000000u;
    base = fp32_from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = fp32_to_bits(base), nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
    return (td_fp16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

TD_INLINE float bf16_to_fp32(td_bf16_t h) { return fp32_from_bits((uint32_t)h << 16); }

#endif
