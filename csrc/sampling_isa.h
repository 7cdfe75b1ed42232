/* sampling_isa.h: the samplers' float64 kernels for one instruction set (included by foreach_isa.h;
   see sampling.c). VD is VEC's width in float64, VDI in int64. */
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
    const struct rows64 *a = ctx;
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

/* log x for x positive and normal, in float64, fdlibm's way: x = 2^e m with m in [sqrt(1/2),
   sqrt(2)), f = m - 1, s = f / (2 + f), log(1 + f) = f - (f^2/2 - s (f^2/2 + R(s^2))) with fdlibm's
   degree-14 R, e ln2 in two parts. Within ~2 ulp; 0 gives a finite number (the caller masks it). */
TARGET TD_INLINE VD ISA(vlog_f64)(VD x)
{
    const int64_t magic_bits = 0x4338000000000000; /* 1.5 * 2^52, whose low bits hold a small integer */
    VDI bits = (VDI)x;
    VDI e = ((bits >> 52) & 0x7ff) - 1023;
    VD m = (VD)((bits & 0x000fffffffffffff) | 0x3ff0000000000000); /* [1, 2) */
    const VDI big = m > 1.4142135623730951;
    m = (VD)((big & (VDI)(m * 0.5)) | (~big & (VDI)m));
    e -= big; /* big is -1 where true */
    const VD k = (VD)(e + magic_bits) - 6755399441055744.0; /* e as a double, exactly */
    const VD f = m - 1.0, s = f / (2.0 + f), z = s * s, hfsq = 0.5 * f * f;
    VD r = (VD){0} + 1.479819860511658591e-01;
    static const double lg[6] = {6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01,
                                 2.222219843214978396e-01, 1.818357216161805012e-01, 1.531383769920937332e-01};
    for (int i = 5; i >= 0; i--)
        r = r * z + lg[i];
    r *= z;
    return k * 6.93147180369123816490e-01 - ((hfsq - (s * (hfsq + r) + k * 1.90821492927058770002e-10)) - f);
}

/* z / T + g for DL tokens, g = -log(-log(1 - u)); -inf where u = 0 (see gumbel_max_rows) */
TARGET TD_INLINE VD ISA(gumbel_scores)(VD z, VD u, double temperature)
{
    const VD inf = (VD){0} + __builtin_inf();
    const VD nl = -ISA(vlog_f64)(1.0 - u); /* -log(1 - u) > 0, or 0 where u = 0 */
    const VDI zero = nl == 0.0;
    const VD g = (VD)((zero & (VDI)-inf) | (~zero & (VDI)-ISA(vlog_f64)(nl)));
    return z / temperature + g;
}

/* each row of the job: argmax_j z_j / T + g_j, g_j = -log(-log(1 - u_j)), the first of equal
   maxima as np.argmax; z_j = -inf never wins. u_j = 0 (NumPy draws again there, 2^-53 of draws)
   gives g_j = -inf: that token sits this draw out. Each lane keeps its best and where it is; the
   tail goes through one vector padded with -inf. */
TARGET static void ISA(gumbel_max_rows)(void *ctx, int64_t b, int64_t e)
{
    const struct rows64 *a = ctx;
    const int64_t V = a->V;
    for (int64_t i = b; i < e; i++) {
        const double *z = a->z + i * V, *u = a->u + i * V;
        VD best = (VD){0} - __builtin_inf();
        VDI where = {0}, at;
        for (int l = 0; l < DL; l++)
            at[l] = l;
        for (int64_t j = 0; j < V; j += DL, at += DL) {
            double zt[DL], ut[DL]; /* the last values, -inf past V */
            for (int l = 0; j + DL > V && l < DL; l++)
                zt[l] = j + l < V ? z[j + l] : -__builtin_inf(), ut[l] = j + l < V ? u[j + l] : 0.5;
            const int whole = j + DL <= V;
            const VD t = ISA(gumbel_scores)(TD_CAT(load_, VD)(whole ? z + j : zt),
                                            TD_CAT(load_, VD)(whole ? u + j : ut), a->temperature);
            const VDI gt = t > best;
            best = (VD)((gt & (VDI)t) | (~gt & (VDI)best));
            where = (gt & at) | (~gt & where);
        }
        int64_t arg = 0;
        double top = -__builtin_inf();
        for (int l = 0; l < DL; l++)
            if (best[l] > top || (best[l] == top && where[l] < arg))
                top = best[l], arg = where[l];
        a->arg[i] = arg;
    }
}

#undef VD
#undef VDI
#undef DL
