/* norm.c: RMSNorm and softmax over the rows of a [n,d] f32 matrix; threads split the rows.
   The kernels are in norm_isa.h. */
#include <math.h>
#include "internal.h"

struct rows {
    const float *x; /* [n,d] */
    const float *w; /* [d] rmsnorm weight */
    float *y;       /* [n,d], may be x itself */
    int64_t d;
    float eps;
};

#define TD_ISA_FILE "norm_isa.h"
#include "foreach_isa.h"

void td_rmsnorm_f32(const float *x, const float *w, float *y, int64_t n, int64_t d, float eps)
{
    struct rows a = {.x = x, .w = w, .y = y, .d = d, .eps = eps};
    td_parallel_for(TD_PICK(rmsnorm_rows), &a, n, 4.0 * d);
}

void td_softmax_f32(const float *x, float *y, int64_t n, int64_t d)
{
    struct rows a = {.x = x, .y = y, .d = d};
    td_parallel_for(TD_PICK(softmax_rows), &a, n, 8.0 * d);
}
