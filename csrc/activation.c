/* activation.c: the gated MLPs' products y = act(gate) * up, elementwise:
     silu_mul       SwiGLU (Llama, Qwen): silu(g) = g / (1 + exp(-g))
     gelu_tanh_mul  GeGLU (Gemma): gelu_tanh(g) = 0.5 g (1 + tanh(u)), u = sqrt(2/pi) (g + 0.044715 g^3),
                    PyTorch's gelu(approximate="tanh"); computed as g / (1 + exp(-2u)), the same
                    number, since 1 + tanh(u) = 2 / (1 + exp(-2u)): no cancellation in 1 + tanh(u)
                    for g < 0. gelu_tanh(inf) = inf; gelu_tanh(-inf) = -0, its limit (the tanh
                    form, as torch evaluates it, gives -inf * 0 = NaN there); NaN stays NaN.
   The kernels are in activation_isa.h, vectorised per instruction set, the plain-C one the
   reference the others are tested against (with engine/reference.py). */
#include <math.h>
#include "internal.h"

#define CHUNK 4096 /* elements per task */

/* gelu_tanh: -2u = g (GELU_A + GELU_B g^2); below GELU_ZERO the result rounds to -0 (it does from
   -11 on), and -inf would give -inf / inf */
#define GELU_A -1.59576912f  /* -2 sqrt(2/pi) */
#define GELU_B -0.0713548163f /* -2 sqrt(2/pi) 0.044715 */
#define GELU_ZERO -20.0f

struct gated {
    const float *gate, *up; /* [len] */
    float *y;               /* [len], may be gate or up */
    int64_t len;
};

#define TD_ISA_FILE "activation_isa.h"
#include "foreach_isa.h"

void td_silu_mul_f32(const float *gate, const float *up, float *y, int64_t len)
{
    struct gated a = {.gate = gate, .up = up, .y = y, .len = len};
    td_parallel_for(TD_PICK(silu_mul_chunks), &a, (len + CHUNK - 1) / CHUNK, 8.0 * CHUNK);
}

void td_gelu_tanh_mul_f32(const float *gate, const float *up, float *y, int64_t len)
{
    struct gated a = {.gate = gate, .up = up, .y = y, .len = len};
    td_parallel_for(TD_PICK(gelu_tanh_mul_chunks), &a, (len + CHUNK - 1) / CHUNK, 10.0 * CHUNK);
}
