/* layer.c: one decoder layer for one new token, in one call from Python.

   It is transformer.forward's loop body for a single position of a single sequence, kernel for
   kernel, in the same order on the same buffers, so its result is bit for bit the same. What it
   saves is Python: a decode step calls ~11 kernels per layer, and each call through the Python
   wrappers costs 2-7 us of argument checks and pointer making, which on a small model is a third
   of the token's time (bench/bench_python_share.py). Here the calls cost nothing extra. */
#include <math.h>
#include "internal.h"

static void add_bias(float *y, const float *b, int64_t m)
{
    if (b)
        for (int64_t i = 0; i < m; i++)
            y[i] += b[i];
}

int td_decode_layer(const struct td_layer *w, const struct td_decode *s, float *x, float *k_cache,
                    float *v_cache, int64_t pos)
{
    const int64_t d = s->d, qd = s->heads * s->hd, kvd = s->kv_heads * s->hd;
    float *k = k_cache + pos * kvd, *v = v_cache + pos * kvd; /* [KVH*hd] this token's cache rows */

    /* attention: x += o_proj(attention(rope(q), rope(k), v)) */
    td_rmsnorm_f32(x, w->input_layernorm, s->h, 1, d, s->eps);                   /* h [d] */
    const void *qkv[3] = {w->q_proj, w->k_proj, w->v_proj};
    const enum td_type qkv_types[3] = {w->q_type, w->k_type, w->v_type};
    float *qkv_out[3] = {s->q, k, v};
    const int64_t qkv_rows[3] = {qd, kvd, kvd};
    if (td_matmuls(qkv_types, s->h, 1, d, 3, (void **)qkv, qkv_out, qkv_rows, 0)) /* q [H*hd], k v [KVH*hd] */
        return -1;
    add_bias(s->q, w->q_bias, qd);
    add_bias(k, w->k_bias, kvd);
    add_bias(v, w->v_bias, kvd);
    td_rope_qk_f32(s->q, k, &pos, s->inv_freq, 1, s->heads, s->kv_heads, s->hd);
    if (td_attention_f32(s->q, k_cache, v_cache, s->att, 1, pos + 1, s->heads, s->kv_heads, s->hd, 1, pos,
                         (float)(1.0 / sqrt((double)s->hd))))                    /* att [H*hd], causal */
        return -1;
    if (td_matmuls(&w->o_type, s->att, 1, qd, 1, (void **)&w->o_proj, &x, &d, 1))   /* x += [d] */
        return -1;
    add_bias(x, w->o_bias, d);

    /* MLP: x += down_proj(silu(gate_proj(x)) * up_proj(x)) */
    td_rmsnorm_f32(x, w->post_attention_layernorm, s->h, 1, d, s->eps);          /* h [d] */
    const void *gate_up[2] = {w->gate_proj, w->up_proj};
    const enum td_type gate_up_types[2] = {w->gate_type, w->up_type};
    float *gate_up_out[2] = {s->gate, s->up};
    const int64_t f[2] = {s->f, s->f};
    if (td_matmuls(gate_up_types, s->h, 1, d, 2, (void **)gate_up, gate_up_out, f, 0)) /* gate, up [f] */
        return -1;
    td_silu_mul_f32(s->gate, s->up, s->gate, s->f);                               /* [f] */
    return td_matmuls(&w->down_type, s->gate, 1, s->f, 1, (void **)&w->down_proj, &x, &d, 1); /* x += [d] */
}
