/* attention.c: fused scaled dot-product attention with an online softmax.

   Keys are visited once, in blocks of KB: the block's scores are computed, then each row's running
   max m, running sum l = sum exp(s - m) and running output acc = sum exp(s - m) v are rescaled by
   exp(m_old - m_new) when the max grows. out = acc / l. Grouped-query heads: head h reads kv head
   h / (heads / kv_heads).

   Many queries (prefill, diffusion): a task takes up to RMAX rows, each a (query, head) pair, from
   a block of queries times the heads sharing one kv head. Vectors run over the rows, so the scores
   S^T[KB][rows] = K Q^T and the output O^T[hd][rows] += V^T P^T are small GEMMs in registers (each
   key and value row is read once per task, straight from the cache, with no transpose) and the
   softmax needs no horizontal sums. Threads split the tasks, each kv head's query blocks one
   after another (the head chunks of a block side by side); a query sees more keys the later it
   sits (causal and block-causal masks), so they go first, last, second, second last... and any
   contiguous range of tasks costs about the same.
   One query (decoding): a head per task, dot products straight from k; the tiled path would leave
   most lanes empty. With grouped-query heads and no sliding window, the heads of a kv head go up to
   four a task (attend_rows_q below), each key and value row loaded once for them: 1024 keys of
   Gemma 3 270M's shape (4 heads of 256 on one kv head, 2 threads, AVX-512, Xeon) 283 -> 125 us a
   layer, SmolLM2's (9 heads of 64 on 3) 130 -> 110 us. Batch invariant (matmul.c), a causal mask's
   queries all take this order, however many: the tiles sum in another order than it, so a prompt's
   rows, a verifying pass's drafted rows (speculative decoding) or a prefix-cached prompt's last
   rows would differ in their last bits from the same positions decoded one at a time (prefill of
   the SmolLM2-135M Q4_1 file, 512 tokens: 0.91 -> 0.72x without invariance,
   bench/bench_batch_invariance.py). Several such queries without a sliding window (whose keys start
   at key 0, in the same blocks) go four of a head a task (attend_rows_q), each key and value row
   loaded once for the four and every number each one's as alone: 512 causal queries of SmolLM2's
   shape (9 heads of 64, 2 threads, AVX-512, Xeon) 15.0 -> 8.9 ms a layer (the tiles, invariance
   off: 3.2), a block of 8 of stories5m (8 heads of 32, 72 keys, 1 thread) 35 -> 25 us, as the
   tiles; six a task were slower. Bidirectional and block-causal masks (diffusion) keep the tiles:
   their passes always have a canvas of rows. The one-query sequences of a batched decode step are
   one job for them all (td_attention_rows): a wait per layer instead of one per sequence, and the
   heads of all of them to share out.

   The mask is two numbers (masks.py, block and window): each query visits only the keys from its
   start, key_start (the sliding window), up to its end, key_end (the block mask). A query's first
   block of keys starts at its first key, mid-page if need be (keys before it are not read); a tile
   starts at its first query's start and ends at its last query's end, and weighs keys per row only
   where some row's start or end falls in the block. With window 0 every start is key 0 and the
   loops run as they would without one.

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
#define QR 4           /* the one-query order's queries a task, when several come (attend_rows_q) */

struct attn {
    const float *q;      /* [n,heads,hd] */
    const float *k, *v;  /* [t,kv_heads,hd] */
    float *out;          /* [n,heads,hd] */
    int64_t n, t, heads, kv_heads, hd;
    int64_t block;       /* the mask: 1 causal, 0 bidirectional, b >= 2 block-causal */
    int64_t window;      /* and the sliding window: query p sees keys j > p - window; 0 none */
    int64_t q_pos0;      /* position of query 0 */
    float scale;
    int64_t group;       /* heads per kv head */
    int64_t nh, qb;      /* tiled: heads and queries per task (nh * qb <= RMAX) */
    int64_t hchunks;     /* tiled: tasks of nh heads per kv head */
    int64_t qblocks;     /* tiled: query blocks of qb */
    int64_t qr;          /* one-query order: queries a task (QR: attend_rows_q, or 1: attend_rows) */
    int by_heads;        /* and with QR: a task's queries the heads of one kv head at one position */
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

/* the first key the query at position p sees: p - window + 1, 0 with no window, at most t (then it
   sees none) */
static inline int64_t key_start(const struct attn *a, int64_t p)
{
    int64_t w = a->window, start = w > 0 && p - w + 1 > 0 ? p - w + 1 : 0;
    return start < a->t ? start : a->t;
}

#define TD_ISA_FILE "attention_isa.h"
#include "foreach_isa.h"

/* a's tasks on the tiled path (qblocks set) or one (query, head) row a task (qblocks 0); returns
   their number */
static int64_t plan(struct attn *a)
{
    if (a->n < TILE_MIN_N || (td_batch_invariant && a->block == 1) || a->heads == 0) { /* (no heads: no tasks) */
        a->qblocks = 0, a->qr = (a->n > 1 || a->group > 1) && !a->window ? QR : 1;
        a->by_heads = a->qr > 1 && a->n == 1;
        return a->by_heads ? a->kv_heads * ((a->group + QR - 1) / QR) : (a->n + a->qr - 1) / a->qr * a->heads;
    }
    a->nh = a->group < RMAX ? a->group : RMAX;
    a->hchunks = (a->group + a->nh - 1) / a->nh;
    a->qblocks = (a->n + RMAX / a->nh - 1) / (RMAX / a->nh);
    /* blocks of about one size, each as many queries as fill the vectors of 8 rows it needs: 68
       queries of a head go as 40 + 28, not 48 + 20 (the threads take the blocks in turn: the
       largest sets the time) */
    const int64_t even = (a->n + a->qblocks - 1) / a->qblocks, fill = (even * a->nh + 7) / 8 * 8 / a->nh;
    a->qb = fill < RMAX / a->nh ? fill : RMAX / a->nh; /* (>= even: qblocks has even <= RMAX / nh) */
    return a->qblocks * a->kv_heads * a->hchunks;
}

/* FLOPs a task of a costs, for the pool's split */
static double task_cost(const struct attn *a)
{
    const double row = 4.0 * a->t * a->hd; /* a (query, head) row */
    return a->qblocks ? row * a->qb * a->nh : row * (a->by_heads && a->group < QR ? a->group : a->qr);
}

/* the attention of a (its pointers, sizes and mask set), on the thread pool */
static int attention(struct attn a)
{
    const int64_t ntasks = plan(&a);
    td_parallel_for(a.qblocks ? TD_PICK(attend_tiles) : TD_PICK(attend_one), &a, ntasks, task_cost(&a));
    return a.failed ? -1 : 0;
}

struct attn_rows {
    struct attn *a;  /* [nseq] */
    int64_t *first;  /* [nseq + 1]: sequence j's tasks are [first[j], first[j+1]) */
    int64_t nseq;
};

/* tasks [b, e) of every sequence's rows laid end to end */
static void attend_rows_end_to_end(void *ctx, int64_t b, int64_t e)
{
    const struct attn_rows *r = ctx;
    td_run_end_to_end(TD_PICK(attend_one), r->a, sizeof r->a[0], r->first, r->nseq, b, e);
}

int td_attention_rows(const struct td_attn_seq *seqs, int64_t nseq, int64_t heads, int64_t kv_heads, int64_t hd,
                      int64_t block, int64_t window, float scale)
{
    struct attn_rows r = {.a = malloc(sizeof(struct attn) * (size_t)nseq),
                          .first = malloc(sizeof(int64_t) * (size_t)(nseq + 1)), .nseq = nseq};
    int failed = !r.a || !r.first;
    double cost = 0.0;
    if (!failed)
        r.first[0] = 0;
    for (int64_t j = 0; !failed && j < nseq; j++) {
        const struct td_attn_seq *s = &seqs[j];
        r.a[j] = (struct attn){.q = s->q, .k = s->k, .v = s->v, .pages = s->pages, .out = s->out, .n = 1,
                               .t = s->t, .heads = heads, .kv_heads = kv_heads, .hd = hd, .block = block,
                               .window = window, .q_pos0 = s->q_pos0, .scale = scale, .group = heads / kv_heads};
        r.first[j + 1] = r.first[j] + plan(&r.a[j]);
        cost += task_cost(&r.a[j]) * heads;
    }
    if (!failed && r.first[nseq] > 0) {
        td_parallel_for(attend_rows_end_to_end, &r, r.first[nseq], cost / (double)r.first[nseq]);
        for (int64_t j = 0; j < nseq; j++)
            failed |= r.a[j].failed;
    }
    free(r.a);
    free(r.first);
    return failed ? -1 : 0;
}

int td_attention_f32(const float *q, const float *k, const float *v, float *out, int64_t n, int64_t t,
                     int64_t heads, int64_t kv_heads, int64_t hd, int64_t block, int64_t window, int64_t q_pos0,
                     float scale)
{
    return attention((struct attn){.q = q, .k = k, .v = v, .out = out, .n = n, .t = t, .heads = heads,
                                   .kv_heads = kv_heads, .hd = hd, .block = block, .window = window,
                                   .q_pos0 = q_pos0, .scale = scale, .group = heads / kv_heads});
}

int td_attention_paged_f32(const float *q, const float *k, const float *v, const int64_t *pages, float *out,
                           int64_t n, int64_t t, int64_t heads, int64_t kv_heads, int64_t hd, int64_t block,
                           int64_t window, int64_t q_pos0, float scale)
{
    return attention((struct attn){.q = q, .k = k, .v = v, .pages = pages, .out = out, .n = n, .t = t,
                                   .heads = heads, .kv_heads = kv_heads, .hd = hd, .block = block,
                                   .window = window, .q_pos0 = q_pos0, .scale = scale, .group = heads / kv_heads});
}
