/* quant_arm.c: the weight types' kernels on arm64 (ggml-cpu/arch/arm/quants.c's role): NEON, and
   NEON with the dotprod extension (sdot), and their tables, td_traits_neon and td_traits_dotprod,
   which name only what each level does its own way (quant.c fills the rest: dotprod's from NEON's,
   NEON's from plain C's, quant_ref.c).

   - quant_isa.h's NEON instance (suffix _neon): f16 and bf16 rows, Q8_0 and Q4_0 rows to f32, x to
     Q8_0, the Q8_0 and Q4_0 dot products with NEON's widening multiplies (vmull_s8);
   - by hand, with dotprod: the Q8_0 and Q4_0 dot products, sdot summing a lane's 4 products in one
     instruction (td_type_traits gives them where the CPU has it).
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


/* NEON's own functions, per type; a field left out is plain C's (quant.c) */
const struct type_traits td_traits_neon[TD_NTYPES] = {
    [TD_F16] = {.to_float = f16_to_float_neon, .vec_dot = vec_dot_f16_neon},
    [TD_BF16] = {.to_float = bf16_to_float_neon, .vec_dot = vec_dot_bf16_neon},
    [TD_Q8_0] = {.to_float = q8_0_to_float_neon, TD_X_Q8_0(neon), .vec_dot = vec_dot_q8_0_q8_0_neon},
    [TD_Q4_0] = {.to_float = q4_0_to_float_neon, TD_X_Q8_0(neon), .vec_dot = vec_dot_q4_0_q8_0_neon},
    [TD_Q8_0X8] = {TD_X_Q8_0(neon)},
    [TD_Q4_0X8] = {TD_X_Q8_0(neon)},
};

/* what dotprod does better than NEON; a field left out is NEON's */
const struct type_traits td_traits_dotprod[TD_NTYPES] = {
    [TD_Q8_0] = {.vec_dot = vec_dot_q8_0_q8_0_dotprod},
    [TD_Q4_0] = {.vec_dot = vec_dot_q4_0_q8_0_dotprod},
};
#endif
