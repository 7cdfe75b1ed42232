/* activation.c: the SwiGLU gate, y = silu(gate) * up = gate / (1 + exp(-gate)) * up.
   The kernel is in activation_isa.h. */
#include <math.h>
#include "internal.h"

#define CHUNK 4096 /* elements per task */

struct silu {
    const float *gate, *up; /* [len] */
    float *y;               /* [len], may be gate or up */
    int64_t len;
};

#define TD_ISA_FILE "activation_isa.h"
#include "foreach_isa.h"

void td_silu_mul_f32(const float *gate, const float *up, float *y, int64_t len)
{
    struct silu a = {.gate = gate, .up = up, .y = y, .len = len};
    td_parallel_for(TD_PICK(silu_mul_chunks), &a, (len + CHUNK - 1) / CHUNK, 8.0 * CHUNK);
}
