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

/* f32 x (from_float NULL): x_to_float is never needed, the GEMM reads x itself */
const struct type_traits td_traits_c[TD_NTYPES] = {
    [TD_F16] = {.rows = 1, .blck_size = 1, .type_size = 2, .to_float = f16_to_float_c, .x_blck_size = 1,
                .x_type_size = 4, .vec_dot = vec_dot_f16_c},
    [TD_BF16] = {.rows = 1, .blck_size = 1, .type_size = 2, .to_float = bf16_to_float_c, .x_blck_size = 1,
                 .x_type_size = 4, .vec_dot = vec_dot_bf16_c},
    [TD_Q8_0] = {.rows = 1, .blck_size = QK8_0, .type_size = sizeof(block_q8_0), .to_float = q8_0_to_float_c,
                 TD_X_Q8_0(c), .vec_dot = vec_dot_q8_0_q8_0_c},
    [TD_Q4_0] = {.rows = 1, .blck_size = QK4_0, .type_size = sizeof(block_q4_0), .to_float = q4_0_to_float_c,
                 TD_X_Q8_0(c), .vec_dot = vec_dot_q4_0_q8_0_c},
    /* panels: only the f32 GEMM reads them, x as it is (never rounded to bf16: no vdpbf16ps path) */
    [TD_F32P] = {.rows = TD_PANEL, .blck_size = 1, .type_size = 4, .to_float_lane = f32p_to_float_lane,
                 .x_blck_size = 1, .x_type_size = 4},
    [TD_F16P] = {.rows = TD_PANEL, .blck_size = 1, .type_size = 2, .to_float_lane = f16p_to_float_lane,
                 .x_blck_size = 1, .x_type_size = 4},
    [TD_BF16P] = {.rows = TD_PANEL, .blck_size = 1, .type_size = 2, .to_float_lane = bf16p_to_float_lane,
                  .x_blck_size = 1, .x_type_size = 4},
    [TD_Q8_0X8] = {.rows = 8, .blck_size = QK8_0, .type_size = sizeof(block_q8_0),
                   .to_float_lane = q8_0x8_to_float_lane, TD_X_Q8_0(c), .vec_dot_8xn = vec_dot_8xn_q8_0x8_q8_0_ref},
    [TD_Q4_0X8] = {.rows = 8, .blck_size = QK4_0, .type_size = sizeof(block_q4_0),
                   .to_float_lane = q4_0x8_to_float_lane, TD_X_Q8_0(c), .vec_dot_8xn = vec_dot_8xn_q4_0x8_q8_0_ref},
};
