/* layer.c: one decoder layer for the new positions of a few sequences (a decode step of one or
   of a batch, a prompt, a block of block diffusion, a diffusion canvas), in one call from Python.

   It is Transformer.layers' loop body for n <= TD_LAYER_MAX_ROWS rows, kernel for kernel, in the
   same order with the same arguments, so its result is bit for bit the same. What differs between
   model families is data here as there: a tensor that is there or NULL (biases, QK-norm, the
   blocks' output norms), a field of td_scratch (the activation, attention's scale) or of td_layer
   (its RoPE table), the window passed with the mask; nothing tests an architecture. The matmuls take
   every sequence's rows at once (the weights read once for all), then each sequence's K and V go
   into its cache (rows of its own, or pages of a shared pool) and its attention reads them (the
   one-query sequences' attention as one job). One difference of place, not of value: a lone
   sequence in rows of its own gets its K and V made in its cache rows, not copied there. What
   it saves is Python: a decode step calls ~11 kernels per layer, and each call through the Python
   wrappers costs 2-7 us of argument checks and pointer making, which on a small model is a third
   of the token's time (bench/bench_python_share.py). Here the calls cost nothing extra. */
#include <math.h>
#include <stdlib.h>
#include "internal.h"

/* y[n, m] += b[m] per row, if there is a bias */
static void add_bias(float *y, const float *b, int64_t n, int64_t m)
{
    if (b)
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < m; i++)
                y[r * m + i] += b[i];
}

/* seq's rows of k and v (roped) into its cache rows pos..pos+n-1: contiguous, or in pool pages */
static void store_kv(const struct td_seq *seq, int64_t at, const float *k, const float *v, int64_t kvd)
{
    for (int64_t i = 0; i < seq->n; i++) {
        const int64_t p = seq->pos + i;
        const int64_t row = seq->pages ? seq->pages[p / TD_PAGE] * TD_PAGE + p % TD_PAGE : p;
        memcpy(seq->k + at + row * kvd, k + i * kvd, sizeof(float) * (size_t)kvd);
        memcpy(seq->v + at + row * kvd, v + i * kvd, sizeof(float) * (size_t)kvd);
    }
}

/* x[n*d] += y[n*d]: a block's normed output into the residual stream */
static void add_rows(float *x, const float *y, int64_t len)
{
    for (int64_t i = 0; i < len; i++)
        x[i] += y[i];
}

/* att = each sequence's attention over its cache (K and V stored): the sequences of one query (a
   decode step) as one job, any other (a prompt, a block, a canvas) a job of its own; 0, or -1 out of
   memory */
static int attend(const struct td_scratch *s, const struct td_seq *seqs, int64_t nseq, int64_t at, int64_t block,
                  int64_t window)
{
    const int64_t qd = s->heads * s->hd;
    struct td_attn_seq *ones = malloc(sizeof(struct td_attn_seq) * (size_t)nseq); /* the one-query ones */
    int64_t nones = 0;
    int failed = !ones;
    for (int64_t b = 0, r = 0; !failed && b < nseq; r += seqs[b++].n) {
        const struct td_seq *seq = &seqs[b];
        if (seq->n == 1)
            ones[nones++] = (struct td_attn_seq){.q = s->q + r * qd, .k = seq->k + at, .v = seq->v + at,
                                                 .pages = seq->pages, .out = s->att + r * qd, .t = seq->kv_len,
                                                 .q_pos0 = seq->pos};
        else
            failed = seq->pages ? td_attention_paged_f32(s->q + r * qd, seq->k + at, seq->v + at, seq->pages,
                                                         s->att + r * qd, seq->n, seq->kv_len, s->heads,
                                                         s->kv_heads, s->hd, block, window, seq->pos, s->scale)
                                : td_attention_f32(s->q + r * qd, seq->k + at, seq->v + at, s->att + r * qd,
                                                   seq->n, seq->kv_len, s->heads, s->kv_heads, s->hd, block,
                                                   window, seq->pos, s->scale);
    }
    if (!failed && nones)
        failed = td_attention_rows(ones, nones, s->heads, s->kv_heads, s->hd, block, window, s->scale);
    free(ones);
    return failed ? -1 : 0;
}

/* x[n, d] += (norm)(y[n, k] @ w^T (+ bias)): a block's output into the residual stream, added as the
   matmul writes it, or first into h and normed there when the layer norms its blocks' outputs */
static int residual(const struct td_scratch *s, float *x, float *y, int64_t k, const void *w, enum td_type type,
                    const float *bias, const float *norm, int64_t n)
{
    const int64_t d = s->d;
    float *out = norm ? s->h : x;
    if (td_matmuls(&type, y, n, k, 1, (void **)&w, &out, &d, !norm))              /* [n, d] */
        return -1;
    add_bias(out, bias, n, d);
    if (norm) {
        td_rmsnorm_f32(s->h, norm, s->h, n, d, s->eps);
        add_rows(x, s->h, n * d);
    }
    return 0;
}

int td_layer_forward(const struct td_layer *w, const struct td_scratch *s, float *x, const struct td_seq *seqs,
                     int64_t nseq, int64_t layer, int64_t layer_floats, int64_t block, int64_t window)
{
    const int64_t d = s->d, qd = s->heads * s->hd, kvd = s->kv_heads * s->hd, at = layer * layer_floats;
    int64_t positions[TD_LAYER_MAX_ROWS]; /* [n] RoPE's */
    int64_t n = 0;
    for (int64_t b = 0; b < nseq; b++) {
        if (seqs[b].n < 1 || n + seqs[b].n > TD_LAYER_MAX_ROWS)
            return -2;
        for (int64_t i = 0; i < seqs[b].n; i++)
            positions[n++] = seqs[b].pos + i;
    }
    if (n < 1)
        return -2;

    /* attention: x += (norm)(o_proj(attention(rope((norm) q), rope((norm) k), v))) */
    td_rmsnorm_f32(x, w->input_layernorm, s->h, n, d, s->eps);                   /* h [n, d] */
    /* one sequence in rows of its own (a prompt, a canvas): its k and v are made in its cache rows,
       not copied there (the copy cost a diffusion step of the 5M model 1.3%) */
    const int in_cache = nseq == 1 && !seqs[0].pages;
    float *k = in_cache ? seqs[0].k + at + seqs[0].pos * kvd : s->k;           /* [n, KVH*hd] */
    float *v = in_cache ? seqs[0].v + at + seqs[0].pos * kvd : s->v;           /* [n, KVH*hd] */
    const void *qkv[3] = {w->q_proj, w->k_proj, w->v_proj};
    const enum td_type qkv_types[3] = {w->q_type, w->k_type, w->v_type};
    float *qkv_out[3] = {s->q, k, v};
    const int64_t qkv_rows[3] = {qd, kvd, kvd};
    if (td_matmuls(qkv_types, s->h, n, d, 3, (void **)qkv, qkv_out, qkv_rows, 0)) /* q [n, H*hd], k v [n, KVH*hd] */
        return -1;
    add_bias(s->q, w->q_bias, n, qd);
    add_bias(k, w->k_bias, n, kvd);
    add_bias(v, w->v_bias, n, kvd);
    if (w->q_norm) {                                                              /* QK-norm, per head */
        td_rmsnorm_f32(s->q, w->q_norm, s->q, n * s->heads, s->hd, s->eps);
        td_rmsnorm_f32(k, w->k_norm, k, n * s->kv_heads, s->hd, s->eps);
    }
    td_rope_qk_f32(s->q, k, positions, w->inv_freq, n, s->heads, s->kv_heads, s->hd);
    for (int64_t b = 0, r = 0; !in_cache && b < nseq; r += seqs[b++].n)         /* sequence b: rows r.. */
        store_kv(&seqs[b], at, k + r * kvd, v + r * kvd, kvd);
    if (attend(s, seqs, nseq, at, block, window))                                 /* att [n, H*hd] */
        return -1;
    if (residual(s, x, s->att, qd, w->o_proj, w->o_type, w->o_bias, w->post_attention_norm, n)) /* x += [n, d] */
        return -1;

    /* MLP: x += (norm)(down_proj(act(gate_proj(x)) * up_proj(x))) */
    td_rmsnorm_f32(x, w->post_attention_layernorm, s->h, n, d, s->eps);          /* h [n, d] */
    const void *gate_up[2] = {w->gate_proj, w->up_proj};
    const enum td_type gate_up_types[2] = {w->gate_type, w->up_type};
    float *gate_up_out[2] = {s->gate, s->up};
    const int64_t f[2] = {s->f, s->f};
    if (td_matmuls(gate_up_types, s->h, n, d, 2, (void **)gate_up, gate_up_out, f, 0)) /* gate, up [n, f] */
        return -1;
    (s->act == TD_GELU_TANH ? td_gelu_tanh_mul_f32 : td_silu_mul_f32)(s->gate, s->up, s->gate, n * s->f); /* [n, f] */
    return residual(s, x, s->gate, s->f, w->down_proj, w->down_type, NULL, w->post_feedforward_layernorm, n);
}
