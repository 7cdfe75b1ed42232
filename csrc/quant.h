/* quant.h: the weight types beside f32, in llama.cpp's layouts byte for byte (ggml-common.h), and
   what the matmul kernels need of each type (ggml's type_traits).

   A weight row of k numbers is k halves (f16), k bfloat16s (bf16), or k/32 blocks of a scale and
   32 small integers (Q8_0, Q4_0). To multiply, each x (activation) row is first converted, once
   per call, to the type its dot product with a weight row wants (ggml's vec_dot_type):
     Q8_0 and Q4_0 weights: x quantized to Q8_0 blocks, so a block's dot product is integer
       (int8 x int8 -> int32, exact), scaled by d_x * d_w;
     bf16 weights on a CPU with AVX512_BF16: x rounded to bf16, for the bf16 dot instruction;
     otherwise x stays f32 and the weights are widened as they are read.
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
   needs (quant_x86.c); on arm64 NEON's and what dotprod adds to them (quant_arm.c) */
extern const struct type_traits td_traits_c[TD_NTYPES];
extern const struct type_traits td_traits_avx2[TD_NTYPES], td_traits_avx512[TD_NTYPES];
extern const int td_traits_avx512_needs[TD_NTYPES];
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
