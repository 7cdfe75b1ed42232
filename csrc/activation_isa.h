/* activation_isa.h: silu_mul for one instruction set (included by foreach_isa.h). */
#include "exp_isa.h"

/* tasks [b, e) = elements [CHUNK*b, CHUNK*e) */
TARGET static void ISA(silu_mul_chunks)(void *ctx, int64_t b, int64_t e)
{
    const struct silu *a = ctx;
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
