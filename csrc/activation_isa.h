/* activation_isa.h: silu_mul and gelu_tanh_mul for one instruction set (included by foreach_isa.h). */
#include "exp_isa.h"

/* tasks [b, e) = elements [CHUNK*b, CHUNK*e) */
TARGET static void ISA(silu_mul_chunks)(void *ctx, int64_t b, int64_t e)
{
    const struct gated *a = ctx;
    int64_t i = b * CHUNK, end = e * CHUNK < a->len ? e * CHUNK : a->len;
    for (; i + VL <= end; i += VL) {
        VEC g = vload(a->gate + i);
        vstore(a->y + i, g / (1.0f + ISA(vexp)(-g)) * vload(a->up + i));
    }
    for (; i < end; i++) {
        float g = a->gate[i];
        a->y[i] = g / (1.0f + expf(-g)) * a->up[i];
    }
}

/* gelu_tanh(g) = g / (1 + exp(-2u)) (activation.c), VL lanes: exp overflows to inf for g < -10.2,
   giving g / inf = -0; the select makes -inf (and what rounds to -0 anyway) -0 */
TARGET TD_INLINE VEC ISA(gelu_tanh)(VEC g)
{
    VEC y = g / (1.0f + ISA(vexp)(g * (GELU_A + GELU_B * (g * g))));
    return ISA(vselect)(g < GELU_ZERO, -(VEC){0}, y); /* -(+0) = -0 */
}

/* tasks [b, e) = elements [CHUNK*b, CHUNK*e) */
TARGET static void ISA(gelu_tanh_mul_chunks)(void *ctx, int64_t b, int64_t e)
{
    const struct gated *a = ctx;
    int64_t i = b * CHUNK, end = e * CHUNK < a->len ? e * CHUNK : a->len;
    for (; i + VL <= end; i += VL)
        vstore(a->y + i, ISA(gelu_tanh)(vload(a->gate + i)) * vload(a->up + i));
    for (; i < end; i++) {
        float g = a->gate[i];
        a->y[i] = (g < GELU_ZERO ? -0.0f : g / (1.0f + expf(g * (GELU_A + GELU_B * (g * g))))) * a->up[i];
    }
}
