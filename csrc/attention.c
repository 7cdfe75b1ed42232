/* attention.c: fused scaled dot-product attention with an online softmax.

   Keys are visited once, in blocks of KB: the block's scores are computed, then each row's running
   max m, running sum l = sum exp(s - m) and running output acc = sum exp(s - m) v are rescaled by
   exp(m_old - m_new) when the max grows. out = acc / l. Grouped-query heads: head h reads kv head
   h / (heads / kv_heads).

   Many queries (prefill, diffusion): a task takes up to RMAX rows, each a (query, head) pair, from
   a block of queries times the heads sharing one kv head. Vectors run over the rows, so the scores
   S^T[KB][rows] = K Q^T and the output O^T[hd][rows] += V^T P^T are small GEMMs in registers (each
   key and value row is read once per task, straight from the cache, with no transpose) and the
   softmax needs no horizontal sums. Threads split the tasks; a query sees more keys the later it
   sits (causal and block-causal masks), so the query blocks are ordered first, last, second, second
   last... and any contiguous range of tasks costs about the same.
   One query (decoding): a head per task, dot products straight from k; the tiled path would leave
   most lanes empty.

   The mask is a number (masks.py, block): each query visits only the keys before its end, key_end;
   a tile visits those of its last query, and weighs keys per row only past its first query's end.

   Paged keys (td_attention_paged_f32): k and v are pools of pages of TD_PAGE = KB rows, and key j
   of the sequence is row j % TD_PAGE of page pages[j / TD_PAGE]. A block of keys is one page, so
   each block is found once (key_rows) and read as the contiguous case reads it. */
#include <math.h>
#include <stdlib.h>
#include "internal.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define KB 64          /* keys per block */
#define RMAX 48        /* rows per task of the tiled path: a multiple of every VL */
#define TILE_MIN_N 2   /* from this many queries on, the tiled path (it wins even half empty) */

struct attn {
    const float *q;      /* [n,heads,hd] */
    const float *k, *v;  /* [t,kv_heads,hd] */
    float *out;          /* [n,heads,hd] */
    int64_t n, t, heads, kv_heads, hd;
    int64_t block;       /* the mask: 1 causal, 0 bidirectional, b >= 2 block-causal */
    int64_t q_pos0;      /* position of query 0 */
    float scale;
    int64_t group;       /* heads per kv head */
    int64_t nh, qb;      /* tiled: heads and queries per task (nh * qb <= RMAX) */
    int64_t hchunks;     /* tiled: tasks of nh heads per kv head */
    int64_t qblocks;     /* tiled: query blocks of qb */
    const int64_t *pages; /* paged: the pool page of each TD_PAGE keys; NULL: k, v are [t,...] rows */
    int failed;          /* set (atomically) by a task whose scratch memory could not be had */
};

_Static_assert(TD_PAGE == KB, "a block of keys must be one page");

/* the pool row of key j0, the first of a block (a multiple of KB) */
static inline int64_t key_rows(const struct attn *a, int64_t j0)
{
    return a->pages ? a->pages[j0 / KB] * KB : j0;
}

/* the keys the query at position p sees: 0 .. key_end - 1 (causal, the common case, without the
   division: the tiles take an end per row) */
static inline int64_t key_end(const struct attn *a, int64_t p)
{
    int64_t b = a->block, end = b == 1 ? p + 1 : b ? (p / b + 1) * b : a->t;
    return end < a->t ? end : a->t;
}

#define TD_ISA_FILE "attention_isa.h"
#include "foreach_isa.h"

/* the attention of a (its pointers, sizes and mask set), on the thread pool */
static int attention(struct attn a)
{
    int64_t n = a.n, heads = a.heads;
    double keys = 4.0 * a.t * a.hd; /* FLOPs a (query, head) row costs, for the pool's split */
    if (n < TILE_MIN_N || heads == 0) { /* (no heads: no tasks) */
        td_parallel_for(TD_PICK(attend_rows), &a, n * heads, keys);
        return a.failed ? -1 : 0;
    }
    a.nh = a.group < RMAX ? a.group : RMAX;
    a.qb = RMAX / a.nh;
    a.hchunks = (a.group + a.nh - 1) / a.nh;
    a.qblocks = (n + a.qb - 1) / a.qb;
    td_parallel_for(TD_PICK(attend_tiles), &a, a.qblocks * a.kv_heads * a.hchunks, keys * a.qb * a.nh);
    return a.failed ? -1 : 0;
}

int td_attention_f32(const float *q, const float *k, const float *v, float *out, int64_t n, int64_t t,
                     int64_t heads, int64_t kv_heads, int64_t hd, int64_t block, int64_t q_pos0, float scale)
{
    return attention((struct attn){.q = q, .k = k, .v = v, .out = out, .n = n, .t = t, .heads = heads,
                                   .kv_heads = kv_heads, .hd = hd, .block = block, .q_pos0 = q_pos0,
                                   .scale = scale, .group = heads / kv_heads});
}

int td_attention_paged_f32(const float *q, const float *k, const float *v, const int64_t *pages, float *out,
                           int64_t n, int64_t t, int64_t heads, int64_t kv_heads, int64_t hd, int64_t block,
                           int64_t q_pos0, float scale)
{
    return attention((struct attn){.q = q, .k = k, .v = v, .pages = pages, .out = out, .n = n, .t = t,
                                   .heads = heads, .kv_heads = kv_heads, .hd = hd, .block = block,
                                   .q_pos0 = q_pos0, .scale = scale, .group = heads / kv_heads});
}
