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

/* ---- float64 softmax statistics: the diffusion sampler's scores (tinydiff/decoding/diffusion.py) ---- */
#if VL == 16
#define VD vd8
#define VDI vl8
#elif VL == 8
#define VD vd4
#define VDI vl4
#else
#define VD vd2
#define VDI vl2
#endif
#define DL (VL / 2) /* float64 lanes */

/* e^x for x in [-745, 0] in float64, fdlibm's way: x = n ln2 + r with |r| <= ln2/2 (ln2 in two
   parts, n ln2's high part exact), e^r by its Taylor series to r^13 (truncation under 1e-17
   relative), 2^n in the exponent bits. Within ~2 ulp of e^x; below -708 it gives 0, where e^x is
   under 1e-307, nothing next to the largest term of a softmax (1). */
TARGET TD_INLINE VD ISA(vexp_f64)(VD x)
{
    const double magic = 6755399441055744.0; /* 1.5 * 2^52: adding it rounds to an integer in the low bits */
    const int64_t magic_bits = 0x4338000000000000;
    const VDI under = x < -708.0;
    x = (VD)(~under & (VDI)x);
    VD t = x * 1.4426950408889634 + magic; /* n = round(x / ln2), in the low bits of t */
    VD n = t - magic;
    VD r = (x - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
    VD p = (VD){0} + 1.0 / 6227020800.0; /* 1/13! */
    static const double inv_fact[13] = {1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040,
                                        1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800,
                                        1.0 / 479001600};
    for (int k = 12; k >= 0; k--)
        p = p * r + inv_fact[k];
    VD pow2n = (VD)(((VDI)t - magic_bits + 1023) << 52);
    return (VD)(~under & (VDI)(p * pow2n));
}

/* the largest of z[0..V) (at least one finite) and where it first is, as numpy's argmax */
TARGET TD_INLINE double ISA(row_max_f64)(const double *z, int64_t V, int64_t *arg)
{
    VD mv = (VD){0} - __builtin_inf();
    int64_t j = 0;
    for (; j + DL <= V; j += DL) {
        VD v = TD_CAT(load_, VD)(z + j);
        VDI gt = v > mv;
        mv = (VD)((gt & (VDI)v) | (~gt & (VDI)mv));
    }
    double m = -__builtin_inf();
    for (int l = 0; l < DL; l++)
        m = mv[l] > m ? mv[l] : m;
    for (; j < V; j++)
        m = z[j] > m ? z[j] : m;
    for (j = 0; j < V - 1 && z[j] != m; j++) /* (a row of NaN ends at its last place) */
        ;
    *arg = j;
    return m;
}

/* each row of the job: its max and argmax, sum_j e^(z_j - max), and h = sum_j e^(z_j - max) (z_j - max)
   if asked; z_j - max is clamped at -745 (e^ is 0 there, so -inf adds 0 to both sums, never NaN) */
TARGET static void ISA(softmax_stats_rows)(void *ctx, int64_t b, int64_t e)
{
    const struct stats *a = ctx;
    const int64_t V = a->V;
    for (int64_t i = b; i < e; i++) {
        const double *z = a->z + i * V;
        const double m = ISA(row_max_f64)(z, V, &a->arg[i]);
        VD sum = {0}, h = {0};
        for (int64_t j = 0; j < V; j += DL) {
            double tail[DL]; /* the last values, -inf past V */
            for (int l = 0; j + DL > V && l < DL; l++)
                tail[l] = j + l < V ? z[j + l] : -__builtin_inf();
            VD d = TD_CAT(load_, VD)(j + DL <= V ? z + j : tail) - m;
            const VDI low = d < -745.0;
            d = (VD)((low & (VDI)((VD){0} - 745.0)) | (~low & (VDI)d));
            VD p = ISA(vexp_f64)(d);
            sum += p;
            if (a->h)
                h += p * d;
        }
        double s = 0.0, hs = 0.0;
        for (int l = 0; l < DL; l++)
            s += sum[l], hs += h[l];
        a->max[i] = m, a->sum[i] = s;
        if (a->h)
            a->h[i] = hs;
    }
}
#undef VD
#undef VDI
#undef DL
