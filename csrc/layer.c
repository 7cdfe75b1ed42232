/* layer.c: one decoder layer for the new positions of one sequence (a decode step, a prompt, a
   block of block diffusion, a diffusion canvas), in one call from Python.

   It is Transformer.layers' loop body for n <= TD_LAYER_MAX_ROWS positions of a single sequence,
   kernel for kernel, in the same order with the same arguments, so its result is bit for bit the
   same (K and V are written straight into their cache rows, where layers copies them). What it
   saves is Python: a decode step calls ~11 kernels per layer, and each call through the Python
   wrappers costs 2-7 us of argument checks and pointer making, which on a small model is a third
   of the token's time (bench/bench_python_share.py). Here the calls cost nothing extra. */
#include <math.h>
#include "internal.h"

/* y[n, m] += b[m] per row, if there is a bias */
static void add_bias(float *y, const float *b, int64_t n, int64_t m)
{
    if (b)
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < m; i++)
                y[r * m + i] += b[i];
}

int td_decode_layer(const struct td_layer *w, const struct td_decode *s, float *x, float *k_cache,
                    float *v_cache, int64_t pos, int64_t n, int64_t kv_len, int64_t block)
{
    const int64_t d = s->d, qd = s->heads * s->hd, kvd = s->kv_heads * s->hd;
    float *k = k_cache + pos * kvd, *v = v_cache + pos * kvd; /* [n, KVH*hd] these tokens' cache rows */
    int64_t positions[TD_LAYER_MAX_ROWS];                      /* [n] RoPE's */
    if (n < 1 || n > TD_LAYER_MAX_ROWS)
        return -2;
    for (int64_t i = 0; i < n; i++)
        positions[i] = pos + i;

    /* attention: x += o_proj(attention(rope(q), rope(k), v)) */
    td_rmsnorm_f32(x, w->input_layernorm, s->h, n, d, s->eps);                   /* h [n, d] */
    const void *qkv[3] = {w->q_proj, w->k_proj, w->v_proj};
    const enum td_type qkv_types[3] = {w->q_type, w->k_type, w->v_type};
    float *qkv_out[3] = {s->q, k, v};
    const int64_t qkv_rows[3] = {qd, kvd, kvd};
    if (td_matmuls(qkv_types, s->h, n, d, 3, (void **)qkv, qkv_out, qkv_rows, 0)) /* q [n, H*hd], k v [n, KVH*hd] */
        return -1;
    add_bias(s->q, w->q_bias, n, qd);
    add_bias(k, w->k_bias, n, kvd);
    add_bias(v, w->v_bias, n, kvd);
    td_rope_qk_f32(s->q, k, positions, s->inv_freq, n, s->heads, s->kv_heads, s->hd);
    if (td_attention_f32(s->q, k_cache, v_cache, s->att, n, kv_len, s->heads, s->kv_heads, s->hd, block, pos,
                         (float)(1.0 / sqrt((double)s->hd))))                    /* att [n, H*hd] */
        return -1;
    if (td_matmuls(&w->o_type, s->att, n, qd, 1, (void **)&w->o_proj, &x, &d, 1))   /* x += [n, d] */
        return -1;
    add_bias(x, w->o_bias, n, d);

    /* MLP: x += down_proj(silu(gate_proj(x)) * up_proj(x)) */
    td_rmsnorm_f32(x, w->post_attention_layernorm, s->h, n, d, s->eps);          /* h [n, d] */
    const void *gate_up[2] = {w->gate_proj, w->up_proj};
    const enum td_type gate_up_types[2] = {w->gate_type, w->up_type};
    float *gate_up_out[2] = {s->gate, s->up};
    const int64_t f[2] = {s->f, s->f};
    if (td_matmuls(gate_up_types, s->h, n, d, 2, (void **)gate_up, gate_up_out, f, 0)) /* gate, up [n, f] */
        return -1;
    td_silu_mul_f32(s->gate, s->up, s->gate, n * s->f);                           /* [n, f] */
    return td_matmuls(&w->down_type, s->gate, n, s->f, 1, (void **)&w->down_proj, &x, &d, 1); /* x += [n, d] */
}
