/* attention_isa.h: the attention kernels for one instruction set (included by foreach_isa.h). */
#include "dot_isa.h"
#include "exp_isa.h"
#define VI TD_CAT(vi, VL)
#define RT (REGS == 32 ? 3 : 2) /* register tile: RT row vectors by AT keys (or value dims), so */
#define AT (REGS == 32 ? 8 : 6) /* RT * AT accumulators, RT loads and a broadcast fit the registers */
/* ---- one query: a (query, head) row at a time ---- */

/* s[r * sstride + j] = q_r . k_j for nq <= QR queries q_r = q + r * qstride and nb keys stride
   apart: four keys at a time in a tile of nq x 4 dot products (each key vector loaded once for all
   the queries), their sums halved together (vsums), then the tail; the keys past the last four
   one by one. One query (nq 1) is attend_rows' scores; every score is the same bits either way */
TARGET TD_INLINE void ISA(scores_q)(const float *q, int64_t qstride, const float *k, int64_t stride, int64_t hd,
                                    int64_t nb, float *s, int64_t sstride, const int nq)
{
    int64_t j = 0;
    for (; j + 4 <= nb; j += 4) {
        VEC acc[QR * 4];
        for (int i = 0; i < nq * 4; i++)
            acc[i] = (VEC){0};
        int64_t d = 0;
        for (; d + VL <= hd; d += VL) {
            VEC kv[4];
            for (int c = 0; c < 4; c++)
                kv[c] = vload(k + (j + c) * stride + d);
            for (int r = 0; r < nq; r++) {
                VEC qv = vload(q + r * qstride + d);
                for (int c = 0; c < 4; c++)
                    acc[r * 4 + c] += qv * kv[c];
            }
        }
        float t[QR * 4];
        for (int i = 0; i < nq * 4; i += VL)
            ISA(vsums)(acc + i, nq * 4 - i < VL ? nq * 4 - i : VL, t + i);
        for (int r = 0; r < nq; r++)
            for (int c = 0; c < 4; c++) {
                float *out = s + r * sstride + j + c;
                *out = t[r * 4 + c];
                for (int64_t e = d; e < hd; e++)
                    *out += q[r * qstride + e] * k[(j + c) * stride + e];
            }
    }
    for (; j < nb; j++)
        for (int r = 0; r < nq; r++)
            s[r * sstride + j] = ISA(vec_dot_f32)(hd, q + r * qstride, k + j * stride);
}

/* y[len] *= c */
TARGET TD_INLINE void ISA(scale)(float *y, float c, int64_t len)
{
    int64_t i = 0;
    for (; i + VL <= len; i += VL)
        vstore(y + i, vload(y + i) * c);
    for (; i < len; i++)
        y[i] *= c;
}

/* One query's softmax over a key block, online: s[KB] holds the raw scores q.k; keys from nb on get
   weight 0 (to the end of the last vector that holds a key; past it s is not touched, nor read).
   Turns s into the weights exp(s*scale - m) under the running max *m, adds them to the running sum
   *l, and rescales the output acc[hd] summed so far when the max grows. */
TARGET TD_INLINE void ISA(softmax_block)(const struct attn *a, float *s, int64_t nb, float *m, float *l, float *acc)
{
    const int64_t nv = (nb + VL - 1) / VL * VL; /* the vectors that hold a key (add_values reads nb) */
    const VEC ninf = (VEC){0} - __builtin_inff();
    VI lane;
    for (int i = 0; i < VL; i++)
        lane[i] = i;
    VEC vmax = ninf;
    for (int64_t j = 0; j < nv; j += VL) { /* scaled, and -inf past nb (those lanes hold old numbers) */
        VEC v = ISA(vselect)(lane < (int)(nb - j), vload(s + j) * a->scale, ninf);
        vstore(s + j, v);
        vmax = ISA(vmax)(vmax, v);
    }
    float t[VL]; /* the largest, by halves */
    vstore(t, vmax);
    for (int w = VL / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++)
            t[i] = t[i + w] > t[i] ? t[i + w] : t[i];
    const float bmax = t[0];
    if (bmax == -INFINITY) { /* nothing to see in this block */
        memset(s, 0, sizeof(float) * nv);
        return;
    }
    if (bmax > *m) {
        float c = expf(*m - bmax);
        *l *= c;
        ISA(scale)(acc, c, a->hd);
        *m = bmax;
    }
    VEC sum = {0}; /* the vectors past nv would add exact zeros */
    for (int64_t j = 0; j < nv; j += VL) {
        VEC e = ISA(vexp)(vload(s + j) - *m); /* 0 where s = -inf */
        vstore(s + j, e);
        sum += e;
    }
    *l += vsum(sum);
}

/* acc[hd] += p[nb] @ v[nb][hd], value rows kvstride apart: four vectors of acc a pass over the keys
   (four chains of FMAs side by side: a head of 64 on AVX-512 in one pass), then two, then one */
TARGET TD_INLINE void ISA(add_values)(float *acc, const float *p, const float *v, int64_t kvstride, int64_t nb,
                                      int64_t hd)
{
    int64_t d = 0;
    for (; d + 4 * VL <= hd; d += 4 * VL) {
        VEC a0 = vload(acc + d), a1 = vload(acc + d + VL), a2 = vload(acc + d + 2 * VL), a3 = vload(acc + d + 3 * VL);
        for (int64_t j = 0; j < nb; j++) {
            const float *vj = v + j * kvstride + d;
            a0 += p[j] * vload(vj);
            a1 += p[j] * vload(vj + VL);
            a2 += p[j] * vload(vj + 2 * VL);
            a3 += p[j] * vload(vj + 3 * VL);
        }
        vstore(acc + d, a0), vstore(acc + d + VL, a1), vstore(acc + d + 2 * VL, a2), vstore(acc + d + 3 * VL, a3);
    }
    for (; d + 2 * VL <= hd; d += 2 * VL) {
        VEC a0 = vload(acc + d), a1 = vload(acc + d + VL);
        for (int64_t j = 0; j < nb; j++) {
            a0 += p[j] * vload(v + j * kvstride + d);
            a1 += p[j] * vload(v + j * kvstride + d + VL);
        }
        vstore(acc + d, a0), vstore(acc + d + VL, a1);
    }
    for (; d + VL <= hd; d += VL) {
        VEC a0 = vload(acc + d);
        for (int64_t j = 0; j < nb; j++)
            a0 += p[j] * vload(v + j * kvstride + d);
        vstore(acc + d, a0);
    }
    for (; d < hd; d++)
        for (int64_t j = 0; j < nb; j++)
            acc[d] += p[j] * v[j * kvstride + d];
}

/* tasks [b, e): task = query * heads + head */
TARGET static void ISA(attend_rows)(void *ctx, int64_t b, int64_t e)
{
    struct attn *a = ctx;
    int64_t hd = a->hd, kvstride = a->kv_heads * hd;
    float *p = malloc(sizeof(float) * (KB + hd)), *acc = p + KB; /* p[KB] weights, acc[hd] output */
    if (!p) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t task = b; task < e; task++) {
        int64_t i = task / a->heads, h = task % a->heads, end = key_end(a, a->q_pos0 + i);
        const float *q = a->q + task * hd, *k = a->k + h / a->group * hd, *v = k - a->k + a->v;
        float m = -INFINITY, l = 0.0f;
        memset(acc, 0, sizeof(float) * hd);
        /* blocks of keys j0 .. to the page's end (the first may start mid-page, at the window's start) */
        for (int64_t j0 = key_start(a, a->q_pos0 + i), nb; j0 < end; j0 += nb) {
            int64_t page = j0 / KB * KB, rows = key_rows(a, page) + j0 - page;
            nb = (end < page + KB ? end : page + KB) - j0;
            ISA(scores_q)(q, 0, k + rows * kvstride, kvstride, hd, nb, p, 0, 1);
            ISA(softmax_block)(a, p, nb, &m, &l, acc);
            ISA(add_values)(acc, p, v + rows * kvstride, kvstride, nb, hd);
        }
        float *out = a->out + task * hd, inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t d = 0; d < hd; d++)
            out[d] = acc[d] * inv;
    }
    free(p);
}

/* ---- a few queries of one kv head, each in the one-query order ---- */

/* acc_r[hd] += p_r[0:nb] @ v[nb][hd] for nq <= QR queries, p_r = p + r * pstride and acc_r = acc +
   r * hd: each value vector loaded once for all of them, and every acc_r[d] the chain of FMAs over
   j in order that add_values makes */
TARGET TD_INLINE void ISA(add_values_q)(float *acc, const float *p, int64_t pstride, const float *v, int64_t kvstride,
                                        int64_t nb, int64_t hd, const int nq)
{
    int64_t d = 0;
    for (; d + 2 * VL <= hd; d += 2 * VL) {
        VEC a[QR][2];
        for (int r = 0; r < nq; r++)
            a[r][0] = vload(acc + r * hd + d), a[r][1] = vload(acc + r * hd + d + VL);
        for (int64_t j = 0; j < nb; j++) {
            const VEC v0 = vload(v + j * kvstride + d), v1 = vload(v + j * kvstride + d + VL);
            for (int r = 0; r < nq; r++) {
                a[r][0] += p[r * pstride + j] * v0;
                a[r][1] += p[r * pstride + j] * v1;
            }
        }
        for (int r = 0; r < nq; r++)
            vstore(acc + r * hd + d, a[r][0]), vstore(acc + r * hd + d + VL, a[r][1]);
    }
    for (; d + VL <= hd; d += VL) {
        VEC a[QR];
        for (int r = 0; r < nq; r++)
            a[r] = vload(acc + r * hd + d);
        for (int64_t j = 0; j < nb; j++) {
            const VEC v0 = vload(v + j * kvstride + d);
            for (int r = 0; r < nq; r++)
                a[r] += p[r * pstride + j] * v0;
        }
        for (int r = 0; r < nq; r++)
            vstore(acc + r * hd + d, a[r]);
    }
    for (; d < hd; d++)
        for (int r = 0; r < nq; r++)
            for (int64_t j = 0; j < nb; j++)
                acc[r * hd + d] += p[r * pstride + j] * v[j * kvstride + d];
}

/* nq <= QR queries of one kv head (nq a constant after inlining), no window: query r is the one at
   position i0 + r * di of head h + r * dh (di, dh: 1, 0 for queries of one head; 0, 1 for the heads
   of a kv head at one position). Their key blocks are the same pages from key 0, each query's
   ending at its own key_end. A block's scores for the keys the furthest-seeing query sees, each
   query's softmax over its own keys, the values of the keys they all see shared, then each query's
   few more. p[QR][KB] the weights, acc[QR][hd] the outputs. */
TARGET TD_INLINE void ISA(attend_q)(const struct attn *a, int64_t i0, int64_t h, int64_t di, int64_t dh, float *p,
                                    float *acc, const int nq)
{
    const int64_t hd = a->hd, kvstride = a->kv_heads * hd, qstride = (di * a->heads + dh) * hd;
    const float *q = a->q + (i0 * a->heads + h) * hd, *k = a->k + h / a->group * hd, *v = k - a->k + a->v;
    float m[QR], l[QR];
    int64_t end[QR], last = 0;
    for (int r = 0; r < nq; r++) {
        m[r] = -INFINITY, l[r] = 0.0f, end[r] = key_end(a, a->q_pos0 + i0 + r * di);
        last = end[r] > last ? end[r] : last;
    }
    memset(acc, 0, sizeof(float) * nq * hd);
    for (int64_t j0 = 0; j0 < last; j0 += KB) {
        const int64_t rows = key_rows(a, j0);
        int64_t nb[QR], all = KB, most = 0;
        for (int r = 0; r < nq; r++) {
            nb[r] = end[r] < j0 + KB ? end[r] - j0 : KB;
            nb[r] = nb[r] > 0 ? nb[r] : 0;
            all = nb[r] < all ? nb[r] : all, most = nb[r] > most ? nb[r] : most;
        }
        ISA(scores_q)(q, qstride, k + rows * kvstride, kvstride, hd, most, p, KB, nq);
        for (int r = 0; r < nq; r++)
            if (nb[r])
                ISA(softmax_block)(a, p + r * KB, nb[r], &m[r], &l[r], acc + r * hd);
        ISA(add_values_q)(acc, p, KB, v + rows * kvstride, kvstride, all, hd, nq);
        for (int r = 0; r < nq; r++)
            if (nb[r] > all)
                ISA(add_values)(acc + r * hd, p + r * KB + all, v + (rows + all) * kvstride, kvstride, nb[r] - all, hd);
    }
    for (int r = 0; r < nq; r++) {
        float *out = a->out + (i0 * a->heads + h) * hd + r * qstride, inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (int64_t d = 0; d < hd; d++)
            out[d] = acc[r * hd + d] * inv;
    }
}

/* tasks [b, e): by_heads, task = (query * kv_heads + kv head) * chunks + chunk, a chunk QR heads of
   the kv head (the last may have fewer); else task = query block * heads + head, a block QR
   queries (the last may have fewer) */
TARGET static void ISA(attend_rows_q)(void *ctx, int64_t b, int64_t e)
{
    struct attn *a = ctx;
    float *p = malloc(sizeof(float) * QR * (KB + a->hd)), *acc = p + QR * KB; /* attend_q */
    if (!p) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    const int64_t chunks = (a->group + QR - 1) / QR;
    for (int64_t task = b; task < e; task++) {
        int64_t i0, h, di, dh, nq;
        if (a->by_heads) {
            const int64_t c = task % chunks * QR, g = task / chunks % a->kv_heads;
            i0 = task / chunks / a->kv_heads, h = g * a->group + c, di = 0, dh = 1;
            nq = a->group - c < QR ? a->group - c : QR;
        } else {
            i0 = task / a->heads * QR, h = task % a->heads, di = 1, dh = 0;
            nq = a->n - i0 < QR ? a->n - i0 : QR;
        }
        switch (nq) {
        case 1: ISA(attend_q)(a, i0, h, di, dh, p, acc, 1); break;
        case 2: ISA(attend_q)(a, i0, h, di, dh, p, acc, 2); break;
        case 3: ISA(attend_q)(a, i0, h, di, dh, p, acc, 3); break;
        default: ISA(attend_q)(a, i0, h, di, dh, p, acc, QR); break;
        }
    }
    free(p);
}

/* the one-query order's tasks of a, as plan() cut them: attend_rows_q's, or attend_rows' */
TARGET static void ISA(attend_one)(void *ctx, int64_t b, int64_t e)
{
    if (((struct attn *)ctx)->qr > 1)
        ISA(attend_rows_q)(ctx, b, e);
    else
        ISA(attend_rows)(ctx, b, e);
}

/* ---- many queries: RMAX (query, head) rows at a time, the rows in the vector lanes ---- */

/* c[a][0:nr*VL] (+)= sum over l < len of x[a*xa + l*xl] * y[l][0:nr*VL] for a < na; c and y rows are
   rp floats apart. Each y vector loaded serves na rows of c, each x value broadcast nr vectors. */
TARGET TD_INLINE void ISA(tile)(float *c, const float *x, int64_t xa, int64_t xl, const float *y, int64_t rp,
                                int64_t len, int accumulate, const int na, const int nr)
{
    VEC acc[AT][RT];
    for (int i = 0; i < na; i++)
        for (int r = 0; r < nr; r++)
            acc[i][r] = accumulate ? vload(c + i * rp + r * VL) : (VEC){0};
    for (int64_t l = 0; l < len; l++) {
        VEC yv[RT];
        for (int r = 0; r < nr; r++)
            yv[r] = vload(y + l * rp + r * VL);
        for (int i = 0; i < na; i++) {
            float xv = x[i * xa + l * xl];
            for (int r = 0; r < nr; r++)
                acc[i][r] += xv * yv[r];
        }
    }
    for (int i = 0; i < na; i++)
        for (int r = 0; r < nr; r++)
            vstore(c + i * rp + r * VL, acc[i][r]);
}

/* ISA(tile) with nr (1..RT) row vectors known only at run time */
TARGET TD_INLINE void ISA(tile_nr)(float *c, const float *x, int64_t xa, int64_t xl, const float *y, int64_t rp,
                                   int64_t len, int accumulate, const int na, int64_t nr)
{
    if (nr == RT)
        ISA(tile)(c, x, xa, xl, y, rp, len, accumulate, na, RT);
    else if (nr == 2)
        ISA(tile)(c, x, xa, xl, y, rp, len, accumulate, na, 2);
    else
        ISA(tile)(c, x, xa, xl, y, rp, len, accumulate, na, 1);
}

/* c[na][rp] (+)= x y as in ISA(tile), for all na rows of c and all rp / VL row vectors. The rows
   past the last full AT go as one tile of that many (1..AT-1, each unrolled as its own): a row at
   a time would leave only nr sums in flight, too few for the FMA latency (68 queries and keys of 8
   heads, one thread: 107 -> 97 us). */
TARGET static void ISA(gemm_rows)(float *c, const float *x, int64_t xa, int64_t xl, const float *y, int64_t rp,
                                  int64_t len, int accumulate, int64_t na)
{
    for (int64_t r = 0; r < rp; r += RT * VL) {
        int64_t nr = (rp - r) / VL < RT ? (rp - r) / VL : RT, i = 0;
        for (; i + AT <= na; i += AT)
            ISA(tile_nr)(c + i * rp + r, x + i * xa, xa, xl, y + r, rp, len, accumulate, AT, nr);
        float *ci = c + i * rp + r;
        const float *xi = x + i * xa;
        switch (na - i) {
#if AT == 8
        case 7: ISA(tile_nr)(ci, xi, xa, xl, y + r, rp, len, accumulate, 7, nr); break;
        case 6: ISA(tile_nr)(ci, xi, xa, xl, y + r, rp, len, accumulate, 6, nr); break;
#endif
        case 5: ISA(tile_nr)(ci, xi, xa, xl, y + r, rp, len, accumulate, 5, nr); break;
        case 4: ISA(tile_nr)(ci, xi, xa, xl, y + r, rp, len, accumulate, 4, nr); break;
        case 3: ISA(tile_nr)(ci, xi, xa, xl, y + r, rp, len, accumulate, 3, nr); break;
        case 2: ISA(tile_nr)(ci, xi, xa, xl, y + r, rp, len, accumulate, 2, nr); break;
        case 1: ISA(tile_nr)(ci, xi, xa, xl, y + r, rp, len, accumulate, 1, nr); break;
        }
    }
}

/* 2^x for x <= 0 or -inf, exactly 0 below -126 (so for scores under -87.3 in natural units, as
   in vexp): round x to n, 2^(x - n) by a degree-5 fit (relative error 2.4e-7), 2^n in the exponent
   bits. No clamping selects, whose dependency chains cost more here than the polynomial. */
TARGET TD_INLINE VEC ISA(exp2_neg)(VEC x)
{
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer in the low bits */
    VI keep = x >= -126.0f;          /* the lanes below give garbage (NaN from -inf), zeroed at the end */
    VEC t = x + magic, f = x - (t - magic); /* f = x - round(x), in [-0.5, 0.5] */
    VEC p = 1.3276471e-3f * f + 9.6755419e-3f;
    p = p * f + 5.5507131e-2f;
    p = p * f + 2.4022121e-1f;
    p = p * f + 6.9314694e-1f;
    p = p * f + 1.0000001f;
    VEC y = p * (VEC)(((VI)t - (0x4B400000 - 127)) << 23); /* 0x4B400000: the bits of magic */
    return (VEC)((VI)y & keep);
}

/* the largest of st[0:nb][r:r + VL] (rows rp apart), by four independent chains */
TARGET TD_INLINE VEC ISA(block_max)(const float *st, int64_t nb, int64_t rp)
{
    const VEC ninf = (VEC){0} - __builtin_inff();
    VEC m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    int64_t j = 0;
    for (; j + 4 <= nb; j += 4) {
        m0 = ISA(vmax)(m0, vload(st + j * rp));
        m1 = ISA(vmax)(m1, vload(st + (j + 1) * rp));
        m2 = ISA(vmax)(m2, vload(st + (j + 2) * rp));
        m3 = ISA(vmax)(m3, vload(st + (j + 3) * rp));
    }
    for (; j < nb; j++)
        m0 = ISA(vmax)(m0, vload(st + j * rp));
    return ISA(vmax)(ISA(vmax)(m0, m1), ISA(vmax)(m2, m3));
}

/* Online softmax over a key block, a row per lane: st[nb][rp] holds the scores in log2 units and
   becomes the weights 2^(s - m) under the running max m[rp]; l[rp] gets their sums and ot[hd][rp],
   the output so far, is rescaled by 2^(m_old - m_new). masked: some row's first visible key lo[rp]
   or last one lim[rp] falls in the block, and key j0 + j weighs 0 for the rows it is outside of. */
TARGET TD_INLINE void ISA(softmax_rows)(float *st, int64_t nb, int64_t rp, int64_t j0, int masked,
                                        const int32_t *lo, const int32_t *lim, float *m, float *l, float *ot,
                                        int64_t hd)
{
    const VEC ninf = (VEC){0} - __builtin_inff();
    for (int64_t r = 0; r < rp; r += VL) {
        if (masked) {
            VI first, last;
            memcpy(&first, lo + r, sizeof first);
            memcpy(&last, lim + r, sizeof last);
            for (int64_t j = 0; j < nb; j++) {
                VI key = (VI){0} + (int32_t)(j0 + j), outside = (key < first) | (key > last);
                vstore(st + j * rp + r, ISA(vselect)(outside, ninf, vload(st + j * rp + r)));
            }
        }
        VEC mold = vload(m + r), mnew = ISA(vmax)(mold, ISA(block_max)(st + r, nb, rp));
        VEC base = ISA(vselect)(mnew == ninf, (VEC){0}, mnew); /* rows with no key yet: 2^(-inf - 0) = 0 */
        VEC c = ISA(exp2_neg)(mold - base), sum = {0};
        for (int64_t j = 0; j < nb; j++) {
            VEC p = ISA(exp2_neg)(vload(st + j * rp + r) - base);
            vstore(st + j * rp + r, p);
            sum += p;
        }
        vstore(l + r, vload(l + r) * c + sum);
        vstore(m + r, mnew);
        for (int64_t d = 0; d < hd; d++)
            vstore(ot + d * rp + r, vload(ot + d * rp + r) * c);
    }
}

/* Queries [i0, i0 + nq) times heads [h0, h0 + nh), all of one kv head: rows r = il * nh + hl, padded
   to rp, a multiple of VL. scratch: qt[hd][RMAX], st[KB][RMAX], ot[hd][RMAX], m, l, lo, lim[RMAX]. */
TARGET TD_INLINE void ISA(attend_tile)(const struct attn *a, int64_t i0, int64_t nq, int64_t h0, int64_t nh,
                                       float *scratch)
{
    int64_t hd = a->hd, kvstride = a->kv_heads * hd, rows = nq * nh, rp = (rows + VL - 1) / VL * VL;
    const float *k = a->k + h0 / a->group * hd, *v = k - a->k + a->v;
    float *qt = scratch, *st = qt + hd * RMAX, *ot = st + KB * RMAX, *m = ot + hd * RMAX, *l = m + RMAX;
    int32_t *lo = (int32_t *)(l + RMAX), *lim = lo + RMAX;
    float log2e_scale = a->scale * 1.44269504088896341f; /* scores in log2 units: e^s = 2^(s log2 e) */
    for (int64_t r = 0; r < rp; r++) { /* padding rows: q = 0, harmless and never written out */
        const float *q = a->q + ((i0 + r / nh) * a->heads + h0 + r % nh) * hd;
        for (int64_t d = 0; d < hd; d++)
            qt[d * rp + r] = r < rows ? q[d] * log2e_scale : 0.0f;
        int64_t p = a->q_pos0 + i0 + r / nh;
        m[r] = -INFINITY, l[r] = 0.0f, lo[r] = (int32_t)key_start(a, p), lim[r] = (int32_t)(key_end(a, p) - 1);
    }
    memset(ot, 0, sizeof(float) * hd * rp);
    /* starts and ends grow with the position: the keys from the first query's start to the last
       query's end, by pages (the first from the first start, mid-page if need be) */
    int64_t first = key_end(a, a->q_pos0 + i0), end = key_end(a, a->q_pos0 + i0 + nq - 1);
    int64_t last_start = key_start(a, a->q_pos0 + i0 + nq - 1);
    for (int64_t j0 = key_start(a, a->q_pos0 + i0), nb; j0 < end; j0 += nb) {
        int64_t page = j0 / KB * KB, rows = key_rows(a, page) + j0 - page;
        nb = (end < page + KB ? end : page + KB) - j0;
        ISA(gemm_rows)(st, k + rows * kvstride, kvstride, 1, qt, rp, hd, 0, nb); /* st[j] = q k_j scale log2e */
        ISA(softmax_rows)(st, nb, rp, j0, j0 + nb > first || j0 < last_start, lo, lim, m, l, ot, hd);
        ISA(gemm_rows)(ot, v + rows * kvstride, 1, kvstride, st, rp, nb, 1, hd); /* ot[d] += p v[.][d] */
    }
    for (int64_t r = 0; r < rows; r++) {
        float *out = a->out + ((i0 + r / nh) * a->heads + h0 + r % nh) * hd, inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (int64_t d = 0; d < hd; d++)
            out[d] = ot[d * rp + r] * inv;
    }
}

/* tasks [b, e): task = (kv head * qblocks + query block order) * hchunks + head chunk, the query
   blocks of each kv head in the order first, last, second, second last... */
TARGET static void ISA(attend_tiles)(void *ctx, int64_t b, int64_t e)
{
    struct attn *a = ctx;
    float *scratch = malloc(sizeof(float) * ((2 * a->hd + KB + 4) * RMAX)); /* attend_tile */
    if (!scratch) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t task = b; task < e; task++) {
        int64_t chunk = task % a->hchunks, o = task / a->hchunks % a->qblocks;
        int64_t kvh = task / a->hchunks / a->qblocks;
        int64_t qblock = o % 2 ? a->qblocks - 1 - o / 2 : o / 2, i0 = qblock * a->qb;
        int64_t h0 = kvh * a->group + chunk * a->nh, nh = kvh * a->group + a->group - h0;
        ISA(attend_tile)(a, i0, a->n - i0 < a->qb ? a->n - i0 : a->qb, h0, nh < a->nh ? nh : a->nh, scratch);
    }
    free(scratch);
}
#undef VI
#undef RT
#undef AT
