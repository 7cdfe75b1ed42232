/* tinydiff.h: the C kernel API. build_ffi.py feeds this file (minus '#' lines) to cffi's cdef,
   so it holds only plain declarations. All arrays are float32, C-contiguous (row-major).
   Sizes are int64_t. Every kernel splits its work over the thread pool (threads.c). */
#include <stdint.h>

/* thread pools (threads.c): the process default pool, and pools of their own (one per model).
   Every kernel call runs on the calling thread's current pool: the default pool unless
   td_pool_use chose another. Counts are clamped to 1..TD_MAX_THREADS, the caller included. */
enum { TD_MAX_THREADS = 1024 };
struct td_pool;
struct td_pool *td_pool_new(int nthreads);  /* NULL if there is no memory for it */
void td_pool_free(struct td_pool *p);       /* p idle and current on no thread; NULL: nothing */
struct td_pool *td_pool_use(struct td_pool *p); /* this thread's current pool (NULL: default); returns the last */
int td_pool_set_threads(struct td_pool *p, int n); /* p NULL: the default pool; returns the count in use */
int td_pool_threads(const struct td_pool *p);      /* the count asked for */
int td_set_threads(int n);          /* td_pool_set_threads on the current pool */
int td_get_threads(void);           /* td_pool_threads of the current pool */
/* for tests, since the last reset: the most parts one job of p was cut into; the most pools
   running a job at the same moment (all pools) */
int td_pool_max_parts(struct td_pool *p, int reset);
int td_max_busy_pools(int reset);

/* SIMD path (cpu.c): 0 plain C, 1 AVX2+FMA+F16C, 2 AVX-512. Picked at load from the CPU. */
int td_get_simd(void);
int td_set_simd(int level);         /* clamps to what the CPU supports; returns the level in use */
/* AVX-512 extensions the CPU has (bits); the kernels needing one run their AVX2 version without it */
enum { TD_EXT_VNNI = 1,             /* AVX512_VNNI (+BW, VL): int8 dot products, Q8_0 and Q4_0 */
       TD_EXT_DOTPROD = 4 };        /* arm64 dotprod (sdot): int8 dot products, Q8_0 and Q4_0 */
int td_get_simd_ext(void);

/* y[n,m] = x[n,k] @ w[m,k]^T   (w in HF layout: out_features x in_features) */
void td_matmul_f32(const float *x, const float *w, float *y, int64_t n, int64_t k, int64_t m);

/* the x rows from which f32 weights go through the GEMM instead of register tiles (this CPU's) */
int64_t td_gemm_min_rows(void);
/* on (1, the default): a row's result does not depend on the rows beside it (matmul.c); 0: the
   GEMMs and attention tiles that sum in their own order take many rows. Returns the last setting. */
int td_set_batch_invariant(int on);

/* weight types: f32, or stored as quant.h has them: f16 and bf16 w[m,k]; Q8_0, Q4_0, Q4_1, Q5_0,
   Q5_1 and IQ4_NL w[m,k/32] blocks (k % 32 == 0); the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K
   and IQ4_XS w[m,k/256] super-blocks (k % 256 == 0); Q8_0X8 and Q4_0X8: their rows interleaved 8 at a time, w[m/8,k/32]
   groups of blocks (m % 8 == 0), and F32P, F16P and BF16P: f32, f16 and bf16 rows in the GEMM's
   panels of TD_PANEL, w[m/TD_PANEL,k,TD_PANEL] (m % TD_PANEL == 0; quant.h) */
enum td_type { TD_F32 = -1, TD_F16, TD_BF16, TD_Q8_0, TD_Q4_0, TD_Q8_0X8, TD_Q4_0X8, TD_F32P, TD_F16P, TD_BF16P,
               TD_Q4_1, TD_Q5_0, TD_Q5_1, TD_IQ4_NL, TD_Q2_K, TD_Q3_K, TD_Q4_K, TD_Q5_K, TD_Q6_K, TD_Q8_K, TD_IQ4_XS,
               TD_NTYPES };
enum { TD_PANEL = 32 };

/* 1 if weights of type (TD_Q8_0 or TD_Q4_0) are best repacked at load into its X8 type for the SIMD
   path in use (the X8 kernel is the faster one there), else 0: the loader asks, once per matrix */
int td_interleave(enum td_type type);

/* ys[j][n,ms[j]] = x[n,k] @ ws[j][ms[j],k]^T for j < nw: several matmuls of one x (q/k/v, gate/up),
   weight j of type types[j], read in place. x and the ys are float32. Other weight types than f32:
   x is first converted to the type the dot product wants (quant.h), once per type. Few x rows: the
   output rows of all the weights of a type are shared out to the threads as one job; many: one
   matmul after the other. accumulate: ys[j] += the products instead (a residual added in the same
   pass). Returns 0, or -1 if memory could not be had (scratch for the converted x; accumulating with
   many x rows, a temporary for the products): each ys[j] then holds its result or its old values. */
int td_matmuls(const enum td_type *types, const float *x, int64_t n, int64_t k, int64_t nw, void **ws, float **ys,
               const int64_t *ms, int accumulate);

/* y[i,:] = row rows[i] of w[m,k] (any weight type) as f32, for i < n: an embedding look-up. Returns 0, or -1 (y untouched) if a row is outside 0..m-1. */
int td_rows_to_f32(enum td_type type, const void *w, int64_t m, int64_t k, const int64_t *rows, int64_t n, float *y);

/* y[n,d] = x * 1/sqrt(mean(x^2) + eps) * w[d], per row, accumulating in f32 */
void td_rmsnorm_f32(const float *x, const float *w, float *y, int64_t n, int64_t d, float eps);

/* y[n,d] = softmax of each row of x[n,d] */
void td_softmax_f32(const float *x, float *y, int64_t n, int64_t d);
/* For each row of z[n,V] (float64, at least one value finite; -inf where a token is ruled out), with
   m its largest value: max[i] = m, arg[i] = where m first is (numpy's argmax), sum[i] = sum_j e^(z_j - m),
   and if h is not NULL h[i] = sum_j e^(z_j - m) (z_j - m): the softmax's p_j = e^(z_j - m) / sum, its
   entropy log(sum) - h / sum. In float64 throughout, e^ within ~2 ulp. */
void td_softmax_stats_f64(const double *z, int64_t n, int64_t V, double *max, int64_t *arg, double *sum, double *h);
/* arg[i] = argmax_j z[i,j] / temperature - log(-log(1 - u[i,j])) for z[n,V] (float64, -inf where a
   token is ruled out) and uniforms u[n,V] in [0, 1): the Gumbel-max draw of NumPy's gumbel noise made
   from those uniforms (sampling.c); the first of equal maxima; a u of 0 gives its token no chance. */
void td_gumbel_max_f64(const double *z, const double *u, int64_t n, int64_t V, double temperature, int64_t *arg);

/* x[n,heads,hd] rotated in place, rotate-half layout; angle = (float)pos[i] * inv_freq[hd/2].
   Allocates nothing: cannot fail. */
void td_rope_f32(float *x, const int64_t *pos, const float *inv_freq, int64_t n, int64_t heads, int64_t hd);
/* the same on q[n,heads,hd] and k[n,kv_heads,hd] in one call (each token's angles computed once) */
void td_rope_qk_f32(float *q, float *k, const int64_t *pos, const float *inv_freq, int64_t n, int64_t heads,
                    int64_t kv_heads, int64_t hd);

/* y[len] = silu(gate) * up */
void td_silu_mul_f32(const float *gate, const float *up, float *y, int64_t len);
/* y[len] = gelu_tanh(gate) * up, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (PyTorch's
   gelu(approximate="tanh"), Gemma's gelu_pytorch_tanh); gelu_tanh(inf) = inf, gelu_tanh(-inf) = -0 */
void td_gelu_tanh_mul_f32(const float *gate, const float *up, float *y, int64_t len);

/* out[n,H,hd] = softmax(q k^T * scale over the visible keys) v with q[n,H,hd], k,v[t,KVH,hd]; head h
   uses kv head h / (H/KVH). The mask is data (tinydiff/engine/masks.py): query i sits at position
   p = q_pos0 + i and sees keys j < min(t, (p / block + 1) * block), every key if block == 0. So block
   1 is causal, 0 bidirectional, b >= 2 block-causal (bidirectional inside blocks of b positions,
   causal across them). A sliding window > 0 hides besides the keys j <= p - window (the keys with
   p - j < window stay: Hugging Face's sliding_window); window 0 hides none. A query that sees no
   key gets zeros. Hidden keys weigh exactly 0: their v rows must be finite, as in softmax(...) @ v.
   Returns 0, or -1 (out partly written) if scratch memory could not be had. */
int td_attention_f32(const float *q, const float *k, const float *v, float *out, int64_t n, int64_t t,
                     int64_t heads, int64_t kv_heads, int64_t hd, int64_t block, int64_t window, int64_t q_pos0,
                     float scale);

/* the same with paged keys: k and v are pools of pages of TD_PAGE rows ([pages * TD_PAGE, kv_heads,
   hd]), key j being row j % TD_PAGE of page pages[j / TD_PAGE] (a paged KV cache: serving) */
enum { TD_PAGE = 64 };
int td_attention_paged_f32(const float *q, const float *k, const float *v, const int64_t *pages, float *out,
                           int64_t n, int64_t t, int64_t heads, int64_t kv_heads, int64_t hd, int64_t block,
                           int64_t window, int64_t q_pos0, float scale);

/* one decoder layer for the rows of a few sequences (layer.c): Transformer.layers' loop body */
struct td_layer {                   /* one layer's weights (weights.LAYER_TENSORS), each matrix of its own type */
    const float *input_layernorm, *post_attention_layernorm;       /* [d] the attention's and the MLP's input norms */
    const void *q_proj, *k_proj, *v_proj, *o_proj;                  /* [H*hd,d] [KVH*hd,d] x2 [d,H*hd] */
    const void *gate_proj, *up_proj, *down_proj;                    /* [f,d] x2 [d,f] */
    enum td_type q_type, k_type, v_type, o_type, gate_type, up_type, down_type;
    const float *q_bias, *k_bias, *v_bias, *o_bias;                 /* [H*hd] [KVH*hd] x2 [d], or NULL */
    const float *q_norm, *k_norm;                                   /* [hd] QK-norm's, or NULL */
    const float *post_attention_norm, *post_feedforward_layernorm;  /* [d] the blocks' output norms, or NULL */
    const float *inv_freq;                                          /* [hd/2] this layer's RoPE table */
};
enum td_act { TD_SILU, TD_GELU_TANH };  /* the gated MLP's act(gate) * up */
struct td_scratch {                 /* the model's sizes, what its layers share, the scratch rows of a pass */
    int64_t d, heads, kv_heads, hd, f;
    float eps;                      /* RMSNorm's */
    float scale;                    /* attention's q.k scale */
    enum td_act act;
    float *h;                       /* [n, d] normed input of a block, or its output to be normed */
    float *q, *att;                 /* [n, H*hd] */
    float *k, *v;                   /* [n, KVH*hd] */
    float *gate, *up;               /* [n, f] */
};
struct td_seq {                     /* one sequence's rows in a td_layer_forward call */
    int64_t n, pos, kv_len;         /* n rows (the next ones of x) at positions pos..pos+n-1, reading kv_len keys */
    float *k, *v;                   /* layer 0's cache of it [ctx, KVH*hd], or layer 0's page pool */
    const int64_t *pages;           /* NULL, or the pool page of each TD_PAGE positions (a paged cache) */
};
enum { TD_LAYER_MAX_ROWS = 1024 };  /* the most rows (of all sequences) one td_layer_forward call takes */
/* x[n, d] += the layer's attention and MLP blocks for the rows of nseq sequences, one after
   another (n the sum of theirs); each sequence's K and V go into its cache rows pos..pos+n-1 (layer
   `layer` of it: layer_floats further per layer), and its attention reads keys 0..kv_len-1 under
   the mask (block, window), as td_attention_f32 takes it. Returns 0, -1 if a matmul's or
   attention's scratch memory could not be had, -2 if n is not 1..TD_LAYER_MAX_ROWS. */
int td_layer_forward(const struct td_layer *w, const struct td_scratch *s, float *x, const struct td_seq *seqs,
                     int64_t nseq, int64_t layer, int64_t layer_floats, int64_t block, int64_t window);

/* roofline (roofline.c): the sum mod 2^32 of x[len] (any 4-byte words), each thread reading its own
   contiguous slice reps times (a slice that fits a cache is read from it after the first pass).
   Only for measuring read bandwidth: tinydiff/measure/roofline.py times it. */
uint32_t td_read_sum_u32(const uint32_t *x, int64_t len, int64_t reps);
