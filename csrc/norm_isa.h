/* norm_isa.h: RMSNorm and softmax rows for one instruction set (included by foreach_isa.h). */
#include "dot_isa.h"
#include "exp_isa.h"

/* HF computes the variance in f32: y = w * (x * 1/sqrt(mean(x^2) + eps)) */
TARGET static void ISA(rmsnorm_rows)(void *ctx, int64_t b, int64_t e)
{
    const struct rows *a = ctx;
    int64_t d = a->d;
    for (int64_t i = b; i < e; i++) {
        const float *x = a->x + i * d;
        float *y = a->y + i * d;
        float r = 1.0f / sqrtf(ISA(vec_dot_f32)(d, x, x) / (float)d + a->eps);
        int64_t j = 0;
        for (; j + VL <= d; j += VL)
            vstore(y + j, vload(a->w + j) * (vload(x + j) * r));
        for (; j < d; j++)
            y[j] = a->w[j] * (x[j] * r);
    }
}

TARGET TD_INLINE float ISA(row_max)(const float *x, int64_t d)
{
    VEC m = (VEC){0} - __builtin_inff();
    int64_t j = 0;
    for (; j + VL <= d; j += VL)
        m = ISA(vmax)(vload(x + j), m);
    float max = -__builtin_inff();
    for (int l = 0; l < VL; l++)
        max = m[l] > max ? m[l] : max;
    for (; j < d; j++)
        max = x[j] > max ? x[j] : max;
    return max;
}

/* y = exp(x - max) / sum; the tail past the last full vector goes through one zero-padded vector */
TARGET static void ISA(softmax_rows)(void *ctx, int64_t b, int64_t e)
{
    const struct rows *a = ctx;
    int64_t d = a->d;
    for (int64_t i = b; i < e; i++) {
        const float *x = a->x + i * d;
        float *y = a->y + i * d, max = ISA(row_max)(x, d);
        VEC acc = {0};
        int64_t j = 0;
        for (; j + VL <= d; j += VL) {
            VEC p = ISA(vexp)(vload(x + j) - max);
            vstore(y + j, p);
            acc += p;
        }
        if (j < d) {
            float tail[VL]; /* the last d - j values, -inf after them so they add 0 */
            for (int l = 0; l < VL; l++)
                tail[l] = j + l < d ? x[j + l] - max : -__builtin_inff();
            VEC p = ISA(vexp)(vload(tail));
            acc += p;
            for (int l = 0; j + l < d; l++)
                y[j + l] = p[l];
        }
        float r = 1.0f / vsum(acc);
        for (j = 0; j < d; j++)
            y[j] *= r;
    }
}
