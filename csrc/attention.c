/* attention.c: fused scaled dot-product attention with an online softmax.

   For one query row and head, keys are visited once, in blocks of KB: the block's scores are
   computed, then the running max m, the running sum l = sum exp(s - m) and the running output
   acc = sum exp(s - m) v are rescaled by exp(m_old - m_new) when the max grows. out = acc / l.
   Grouped-query heads: head h reads kv head h / (heads / kv_heads). Threads split the
   (query, head) pairs; pairs sharing a kv head are adjacent, so K and V stay in cache. */
#include <math.h>
#include <stdlib.h>
#include "internal.h"

#define KB 64 /* keys per block */
#define QB 16 /* queries per task */

struct attn {
    const float *q;      /* [n,heads,hd] */
    const float *k, *v;  /* [t,kv_heads,hd] */
    float *out;          /* [n,heads,hd] */
    const uint8_t *mask; /* [n,t] nonzero = may attend, or NULL */
    int64_t n, t, heads, kv_heads, hd, q_pos0;
    int causal;
    float scale;
};

#define TD_ISA_FILE "attention_isa.h"
#include "foreach_isa.h"

void td_attention_f32(const float *q, const float *k, const float *v, float *out, const uint8_t *mask,
                      int64_t n, int64_t t, int64_t heads, int64_t kv_heads, int64_t hd,
                      int causal, int64_t q_pos0, float scale)
{
    struct attn a = {q, k, v, out, mask, n, t, heads, kv_heads, hd, q_pos0, causal, scale};
    td_parallel_for(TD_PICK(attend_range), &a, (n + QB - 1) / QB * heads, 4.0 * t * hd * (n < QB ? n : QB));
}
