/* attention_isa.h: the attention kernel for one instruction set (included by foreach_isa.h). */
#include "exp_isa.h"

TARGET TD_INLINE float ISA(dot1)(const float *q, const float *k, int64_t hd)
{
    VEC acc = {0};
    int64_t d = 0;
    for (; d + VL <= hd; d += VL)
        acc += vload(q + d) * vload(k + d);
    float s = vsum(acc);
    for (; d < hd; d++)
        s += q[d] * k[d];
    return s;
}

/* s[0:4] = q[hd] . k_r[hd] for four keys k_r = k + r * stride */
TARGET TD_INLINE void ISA(dot4)(const float *q, const float *k, int64_t stride, int64_t hd, float *s)
{
    const float *k0 = k, *k1 = k + stride, *k2 = k + 2 * stride, *k3 = k + 3 * stride;
    VEC a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t d = 0;
    for (; d + VL <= hd; d += VL) {
        VEC qv = vload(q + d);
        a0 += qv * vload(k0 + d);
        a1 += qv * vload(k1 + d);
        a2 += qv * vload(k2 + d);
        a3 += qv * vload(k3 + d);
    }
    s[0] = vsum(a0), s[1] = vsum(a1), s[2] = vsum(a2), s[3] = vsum(a3);
    for (; d < hd; d++) {
        s[0] += q[d] * k0[d];
        s[1] += q[d] * k1[d];
        s[2] += q[d] * k2[d];
        s[3] += q[d] * k3[d];
    }
}

/* s[0:nb] = q . k_j for nb keys stride apart (four at a time, then one by one) */
TARGET TD_INLINE void ISA(scores)(const float *q, const float *k, int64_t stride, int64_t hd, int64_t nb, float *s)
{
    int64_t j = 0;
    for (; j + 4 <= nb; j += 4)
        ISA(dot4)(q, k + j * stride, stride, hd, s + j);
    for (; j < nb; j++)
        s[j] = ISA(dot1)(q, k + j * stride, hd);
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

/* acc[0:nr][d:d + nv*VL] += p[0:nr][0:nb] @ v[0:nb][d:d + nv*VL], p rows KB apart, acc rows hd apart,
   value rows kvstride apart; nr x nv accumulators stay in registers while the keys go by */
TARGET TD_INLINE void ISA(pv_tile)(float *acc, const float *p, const float *v, int64_t kvstride, int64_t nb,
                                   int64_t hd, int64_t d, const int nr, const int nv)
{
    VEC t[4][2];
    for (int r = 0; r < nr; r++)
        for (int u = 0; u < nv; u++)
            t[r][u] = vload(acc + r * hd + d + u * VL);
    for (int64_t j = 0; j < nb; j++) {
        VEC vj[2];
        for (int u = 0; u < nv; u++)
            vj[u] = vload(v + j * kvstride + d + u * VL);
        for (int r = 0; r < nr; r++)
            for (int u = 0; u < nv; u++)
                t[r][u] += p[r * KB + j] * vj[u];
    }
    for (int r = 0; r < nr; r++)
        for (int u = 0; u < nv; u++)
            vstore(acc + r * hd + d + u * VL, t[r][u]);
}

/* acc[0:nr][hd] += p[0:nr][0:nb] @ v[0:nb][hd], nr = 1 or 4 */
TARGET TD_INLINE void ISA(pv_rows)(float *acc, const float *p, const float *v, int64_t kvstride, int64_t nb,
                                   int64_t hd, const int nr)
{
    int64_t d = 0;
    for (; d + 2 * VL <= hd; d += 2 * VL)
        ISA(pv_tile)(acc, p, v, kvstride, nb, hd, d, nr, 2);
    for (; d + VL <= hd; d += VL)
        ISA(pv_tile)(acc, p, v, kvstride, nb, hd, d, nr, 1);
    for (; d < hd; d++)
        for (int r = 0; r < nr; r++)
            for (int64_t j = 0; j < nb; j++)
                acc[r * hd + d] += p[r * KB + j] * v[j * kvstride + d];
}

/* acc[nq][hd] += p[nq][KB] @ v[nb][hd]: four queries at a time share each value vector loaded */
TARGET TD_INLINE void ISA(add_values)(float *acc, const float *p, int64_t nq, const float *v, int64_t kvstride,
                                      int64_t nb, int64_t hd)
{
    int64_t r = 0;
    for (; r + 4 <= nq; r += 4)
        ISA(pv_rows)(acc + r * hd, p + r * KB, v, kvstride, nb, hd, 4);
    for (; r < nq; r++)
        ISA(pv_rows)(acc + r * hd, p + r * KB, v, kvstride, nb, hd, 1);
}

/* kt[hd][KB] = the first nb of KB keys (rows stride apart) transposed; zero past nb */
TARGET TD_INLINE void ISA(pack_keys)(const float *k, int64_t stride, int64_t nb, int64_t hd, float *kt)
{
    for (int64_t j = 0; j < KB; j++)
        for (int64_t d = 0; d < hd; d++)
            kt[d * KB + j] = j < nb ? k[j * stride + d] : 0.0f;
}

/* s[KB] = q[hd] . kt[hd][KB]: the vectors run over keys, so there are no horizontal sums */
TARGET TD_INLINE void ISA(scores_packed)(const float *q, const float *kt, int64_t hd, float *s)
{
    VEC acc[KB / VL];
    for (int c = 0; c < KB / VL; c++)
        acc[c] = (VEC){0};
    for (int64_t d = 0; d < hd; d++)
        for (int c = 0; c < KB / VL; c++)
            acc[c] += q[d] * vload(kt + d * KB + c * VL);
    for (int c = 0; c < KB / VL; c++)
        vstore(s + c * VL, acc[c]);
}

/* One query's softmax over a key block, online: s[KB] holds the raw scores q.k; keys from nb on and
   those with allowed[j] == 0 (allowed may be NULL) get weight 0. Turns s into the weights
   exp(s*scale - m) under the running max *m, adds them to the running sum *l, and rescales the
   output acc[hd] summed so far when the max grows. */
TARGET TD_INLINE void ISA(softmax_block)(const struct attn *a, float *s, int64_t nb, const uint8_t *allowed,
                                         float *m, float *l, float *acc)
{
    float bmax = -INFINITY;
    for (int64_t j = 0; j < KB; j++) {
        s[j] = j < nb && !(allowed && !allowed[j]) ? s[j] * a->scale : -INFINITY;
        bmax = s[j] > bmax ? s[j] : bmax;
    }
    if (bmax == -INFINITY) { /* nothing to see in this block */
        memset(s, 0, sizeof(float) * KB);
        return;
    }
    if (bmax > *m) {
        float c = expf(*m - bmax);
        *l *= c;
        ISA(scale)(acc, c, a->hd);
        *m = bmax;
    }
    VEC sum = {0};
    for (int64_t j = 0; j < KB; j += VL) {
        VEC e = ISA(vexp)(vload(s + j) - *m); /* 0 where s = -inf */
        vstore(s + j, e);
        sum += e;
    }
    *l += vsum(sum);
}

/* Queries [i0, i0 + nq) of head h. With four or more queries each key block is transposed once
   (kt) and shared by all of them; a lone query (decoding) takes dot products straight from k.
   scratch holds kt[hd][KB], p[QB][KB], acc[QB][hd], m[QB], l[QB]. */
TARGET TD_INLINE void ISA(attend_block)(const struct attn *a, int64_t i0, int64_t nq, int64_t h, float *scratch)
{
    int64_t hd = a->hd, kvstride = a->kv_heads * hd, packed = nq >= 4;
    const float *k = a->k + h / (a->heads / a->kv_heads) * hd, *v = k - a->k + a->v;
    float *kt = scratch, *p = kt + hd * KB, *acc = p + QB * KB, *m = acc + QB * hd, *l = m + QB;
    int64_t end = a->t; /* keys any query of the block may see */
    if (a->causal && a->q_pos0 + i0 + nq < end)
        end = a->q_pos0 + i0 + nq;
    memset(acc, 0, sizeof(float) * nq * hd);
    for (int64_t r = 0; r < nq; r++)
        m[r] = -INFINITY, l[r] = 0.0f;
    for (int64_t j0 = 0; j0 < end; j0 += KB) {
        int64_t nb = end - j0 < KB ? end - j0 : KB;
        if (packed)
            ISA(pack_keys)(k + j0 * kvstride, kvstride, nb, hd, kt);
        for (int64_t r = 0; r < nq; r++) { /* p[r] = query r's weights for the block's keys */
            int64_t i = i0 + r, nbi = nb;
            if (a->causal && a->q_pos0 + i + 1 - j0 < nbi)
                nbi = a->q_pos0 + i + 1 - j0 > 0 ? a->q_pos0 + i + 1 - j0 : 0;
            const float *q = a->q + (i * a->heads + h) * hd;
            if (packed)
                ISA(scores_packed)(q, kt, hd, p + r * KB);
            else
                ISA(scores)(q, k + j0 * kvstride, kvstride, hd, nbi, p + r * KB);
            const uint8_t *allowed = a->mask ? a->mask + i * a->t + j0 : NULL;
            ISA(softmax_block)(a, p + r * KB, nbi, allowed, m + r, l + r, acc + r * hd);
        }
        ISA(add_values)(acc, p, nq, v + j0 * kvstride, kvstride, nb, hd);
    }
    for (int64_t r = 0; r < nq; r++) {
        float *out = a->out + ((i0 + r) * a->heads + h) * hd, inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (int64_t d = 0; d < hd; d++)
            out[d] = acc[r * hd + d] * inv;
    }
}

/* tasks [b, e): task = query block * heads + head */
TARGET static void ISA(attend_range)(void *ctx, int64_t b, int64_t e)
{
    const struct attn *a = ctx;
    float *scratch = malloc(sizeof(float) * (KB * a->hd + QB * KB + QB * a->hd + 2 * QB)); /* attend_block */
    if (!scratch)
        abort();
    for (int64_t task = b; task < e; task++) {
        int64_t i0 = task / a->heads * QB, nq = a->n - i0 < QB ? a->n - i0 : QB;
        ISA(attend_block)(a, i0, nq, task % a->heads, scratch);
    }
    free(scratch);
}
