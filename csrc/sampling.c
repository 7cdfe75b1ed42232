/* sampling.c: the samplers' float64 kernels, for masked diffusion's rows over a whole vocabulary
   (tinydiff/decoding/diffusion.py), where NumPy's exp and log over every position and token were
   most of a step's sampling (LLaDA's rules score and draw in float64):
   - td_softmax_stats_f64: each row's softmax at temperature 1 summed up in one pass (its max and
     argmax, sum e^(z - max), and the entropy's sum), for the remasking scores;
   - td_gumbel_max_f64: each row's draw argmax(z / T + g), g = -log(-log(1 - u)) from uniforms u the
     caller draws: NumPy's Generator.gumbel makes g from the same uniforms by the same formula, so
     a seeded draw is the one decoding/sampling.py's gumbel_max makes (but for a log an ulp or two
     apart: a choice between two tokens whose scores tie to 1e-15).
   e^ and log are our own, within 2 ulp (fdlibm's reductions, polynomials); threads split the rows.
   The kernels are in sampling_isa.h. */
#include "internal.h"

struct rows64 {
    const double *z;       /* [n,V] */
    const double *u;       /* [n,V] uniforms in [0, 1) (gumbel_max) */
    int64_t V;
    double temperature;    /* gumbel_max */
    double *max, *sum, *h; /* [n] each (softmax_stats); h may be NULL */
    int64_t *arg;          /* [n] */
};

#define TD_ISA_FILE "sampling_isa.h"
#include "foreach_isa.h"

void td_softmax_stats_f64(const double *z, int64_t n, int64_t V, double *max, int64_t *arg, double *sum, double *h)
{
    struct rows64 a = {.z = z, .V = V, .max = max, .sum = sum, .h = h, .arg = arg};
    td_parallel_for(TD_PICK(softmax_stats_rows), &a, n, 30.0 * V);
}

void td_gumbel_max_f64(const double *z, const double *u, int64_t n, int64_t V, double temperature, int64_t *arg)
{
    struct rows64 a = {.z = z, .u = u, .V = V, .temperature = temperature, .arg = arg};
    td_parallel_for(TD_PICK(gumbel_max_rows), &a, n, 60.0 * V);
}
