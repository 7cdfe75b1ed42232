/* rope.c: rotary position embedding, rotate-half layout (HF Llama), in place.
   For token i and pair f < hd/2: angle = (float)pos[i] * inv_freq[f], computed in f32 as HF does;
   (x1, x2) = (x[f], x[f + hd/2]) becomes (x1 cos - x2 sin, x2 cos + x1 sin) in every head.
   It allocates nothing (cos and sin go through a stack buffer), so it cannot fail. */
#include <math.h>
#include "internal.h"

struct rope {
    float *x[2];           /* [n,heads[0],hd] and [n,heads[1],hd] (q and k), rotated alike */
    int64_t heads[2];
    const int64_t *pos;    /* [n] */
    const float *inv_freq; /* [hd/2] */
    int64_t hd;
};

#define ROPE_CHUNK 64 /* pairs whose cos and sin are on the stack at once */

static void rope_rows(void *ctx, int64_t b, int64_t e)
{
    const struct rope *a = ctx;
    int64_t half = a->hd / 2;
    float c[ROPE_CHUNK], s[ROPE_CHUNK]; /* cos, sin of pairs f0.. of one token */
    for (int64_t i = b; i < e; i++)
        for (int64_t f0 = 0; f0 < half; f0 += ROPE_CHUNK) {
            int64_t nf = half - f0 < ROPE_CHUNK ? half - f0 : ROPE_CHUNK;
            for (int64_t f = 0; f < nf; f++) {
                float angle = (float)a->pos[i] * a->inv_freq[f0 + f];
                c[f] = cosf(angle);
                s[f] = sinf(angle);
            }
            for (int t = 0; t < 2; t++)
                for (int64_t h = 0; h < a->heads[t]; h++) {
                    float *x1 = a->x[t] + (i * a->heads[t] + h) * a->hd + f0, *x2 = x1 + half;
                    for (int64_t f = 0; f < nf; f++) {
                        float u = x1[f], w = x2[f];
                        x1[f] = u * c[f] - w * s[f];
                        x2[f] = w * c[f] + u * s[f];
                    }
                }
        }
}

void td_rope_f32(float *x, const int64_t *pos, const float *inv_freq, int64_t n, int64_t heads, int64_t hd)
{
    td_rope_qk_f32(x, NULL, pos, inv_freq, n, heads, 0, hd);
}

void td_rope_qk_f32(float *q, float *k, const int64_t *pos, const float *inv_freq, int64_t n, int64_t heads,
                    int64_t kv_heads, int64_t hd)
{
    struct rope a = {.x = {q, k}, .heads = {heads, kv_heads}, .pos = pos, .inv_freq = inv_freq, .hd = hd};
    td_parallel_for(rope_rows, &a, n, 6.0 * (heads + kv_heads) * hd + 40.0 * hd);
}
