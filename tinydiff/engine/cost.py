"""What each operation costs in FLOPs and bytes, and what a whole forward pass costs.

The per-operation functions are the conventions the kernels book with (kernels.py calls them on
every call when a Ledger is open); `forward` adds them up for a pass from the config alone, so the
two can be compared exactly. Each returns (flops, {byte kind: bytes}).

Conventions: a multiply-add is 2 FLOPs. A weight takes the bytes of its storage type, which may be
a fraction (Q8_0: a block of 32 in 34 bytes, 34/32; Q4_0: 18/32); every cost is returned in whole
bytes (rounded: a matrix of blocks is a whole number of them). Activations are float32 (4 bytes);
each kernel reads its inputs and writes its output once (what sits in cache between kernels is not
subtracted: this is traffic as a kernel sees it, the honest upper bound). Weights are read once per
pass, whatever the number of positions: that is the whole point. Softmax's exp/max, the sampler's
sort and similar bookkeeping are not counted as FLOPs.
"""
import functools

from .masks import CAUSAL, AttentionMask
from .weights import layer_tensors

F32 = 4
# A decode loop books the same few shapes at every step: the per-op costs are remembered, so
# booking with a ledger open is a look-up. Their results are shared: read them, never change them.
_memo = functools.lru_cache(maxsize=4096)


@_memo
def matmul(n, k, m, w_bytes=F32):
    """x [n,k] @ W[m,k].T: n*m dot products of length k; W read once (w_bytes a weight), x read, y
    written. (Q8_0/Q4_0 weights: x is also quantized, into scratch that stays in cache: not counted.)"""
    return 2 * n * k * m, {"weights": round(k * m * w_bytes), "activations": F32 * (n * k + n * m)}


@_memo
def attention(n, heads, kv_heads, hd, t, scores):
    """`scores` (query, key) pairs per head: q.k and p.v are hd multiply-adds each (4*hd FLOPs).

    K and V of the t positions attended are read once per pass (kv_heads x hd each); q is read and
    the output written."""
    return 4 * hd * heads * scores, {"kv_read": 2 * t * kv_heads * hd * F32,
                                     "activations": 2 * n * heads * hd * F32}


@_memo
def kv_store(size):
    """Copying `size` new K (or V) values into the cache, from the projection's output."""
    return 0, {"kv_write": size * F32, "activations": size * F32}


@_memo
def rmsnorm(n, d):
    """x^2, sum, scale, times weight: 4 FLOPs an element; the weight vector read once."""
    return 4 * n * d, {"weights": d * F32, "activations": 2 * n * d * F32}


@_memo
def rope(n, heads, hd):
    """Each pair (x1, x2) -> (x1 c - x2 s, x2 c + x1 s): 6 FLOPs a pair, in place."""
    return 3 * n * heads * hd, {"activations": 2 * n * heads * hd * F32}


@_memo
def silu_mul(size):
    """silu(g) * u = g / (1 + exp(-g)) * u: counted as 5 FLOPs an element; two read, one written."""
    return 5 * size, {"activations": 3 * size * F32}


@_memo
def gelu_tanh_mul(size):
    """gelu_tanh(g) * u = g / (1 + exp(g (a + b g^2))) * u (kernels.gelu_tanh_mul): counted as 8 FLOPs an
    element (g^2, b g^2, + a, g (.), exp as one like silu_mul's, 1 + e, the division, * u); two read,
    one written."""
    return 8 * size, {"activations": 3 * size * F32}


ACTIVATIONS = {"silu": silu_mul, "gelu_tanh": gelu_tanh_mul}   # Config.hidden_act -> its cost


@_memo
def scale(size):
    """y *= s (the embedding's scale): one FLOP an element, read and written."""
    return size, {"activations": 2 * size * F32}


@_memo
def softcap(size):
    """y = cap * tanh(y / cap): counted as 3 FLOPs an element (tanh as one), read and written."""
    return 3 * size, {"activations": 2 * size * F32}


@_memo
def add(size):
    """A residual: y += b, two activations read, one written."""
    return size, {"activations": 3 * size * F32}


@_memo
def bias_add(n, m, w_bytes=F32):
    """y[n, m] += b[m]: the bias vector is a weight, read once."""
    return n * m, {"weights": round(m * w_bytes), "activations": 2 * n * m * F32}


@_memo
def embedding(n, d, w_bytes=F32):
    """Gathering n rows of the embedding matrix: only those rows are read."""
    return 0, {"weights": round(n * d * w_bytes), "activations": n * d * F32}


def sampling(rows, vocab):
    """Choosing tokens from rows of logits: counted as 5 FLOPs a logit (scale, exp, sum, divide,
    compare); the logits are read once."""
    return 5 * rows * vocab, {"activations": rows * vocab * F32}


def layer(config, n, w_bytes=F32):
    """[(op, cost)] of one decoder layer over n rows (batch x positions), all but its attention
    proper (which depends on the keys read): what the kernels of transformer.forward's loop body
    book. w_bytes: bytes a weight, one number or {matrix name ("q_proj", ...): bytes}, since a GGUF
    file may mix types. Its matmuls and biases are the config's layer tensors (weights.LAYER_TENSORS);
    its norms, activation and residuals the config's variant fields."""
    c = config
    d, f, H, KVH, hd = c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    tensors = layer_tensors(c)
    wb = w_bytes if isinstance(w_bytes, dict) else {t.name: w_bytes for t in tensors if t.matrix}
    entries = [("norm", rmsnorm(n, d)), ("norm", rmsnorm(n, d))]
    entries += [(t.op, matmul(n, t.shape(c)[1], t.shape(c)[0], wb[t.name])) for t in tensors if t.matrix]
    entries += [("rope", rope(n, H, hd)), ("rope", rope(n, KVH, hd)),
                ("attention", kv_store(n * KVH * hd)), ("attention", kv_store(n * KVH * hd)),
                ("residual", add(n * d)), ("residual", add(n * d)),
                ("mlp", ACTIVATIONS[c.hidden_act](n * f))]
    if c.qk_norm:
        entries += [("norm", rmsnorm(n * H, hd)), ("norm", rmsnorm(n * KVH, hd))]
    if c.sandwich_norms:
        entries += [("norm", rmsnorm(n, d)), ("norm", rmsnorm(n, d))]
    entries += [(t.op, bias_add(n, t.shape(c)[0])) for t in tensors if not t.matrix and t.op != "norm"]
    return entries


def forward(config, n_new, n_past, mask, dtype_bytes=F32, n_kv=None, batch=1, all_logits=None, logit_rows=None):
    """FLOPs and bytes of one forward pass, from the config alone, shaped like one Ledger pass.

    dtype_bytes: bytes a weight of the matrices takes (4 f32, 2 f16/bf16, 34/32 Q8_0, 18/32 Q4_0);
    the vectors (norm weights, biases) stay f32, as GGUF files keep them.

    n_new positions are computed (per sequence, `batch` sequences) after n_past cached ones, under
    mask (masks.py: CAUSAL, BIDIRECTIONAL, block_causal(b)), the first new one at position n_past.
    Attention reads n_kv keys (default n_past + n_new; a diffusion step with a dual cache reads the
    whole canvas while computing only a block). all_logits: LM head on every new position
    (default: all but causal passes do; those only the last, as decoding needs). logit_rows: the
    LM head on that many positions of each sequence instead (a diffusion step: the masked positions
    of its block, the only ones it may commit).

    Per layer, with n = batch * n_new rows, d = hidden, f = intermediate, H/KVH heads of hd:
      matmuls   q, k, v, o: 2*n*d*(H*hd) + 2 * 2*n*d*(KVH*hd) + 2*n*(H*hd)*d FLOPs; weights
                d*(H*hd + 2*KVH*hd) + (H*hd)*d elements, read once however large n is.
      mlp       gate, up, down: 3 * 2*n*d*f FLOPs, 3*d*f weights; plus silu*up, 5*n*f.
      attention 4*hd*H FLOPs per (query, key) pair the mask lets through (mask.pairs: n*t
                bidirectional, n*past + n(n+1)/2 causal); K and V of the t keys read: 2*t*KVH*hd*4
                bytes (t = n_kv) -- the KV bytes per position, 2*layers*KVH*hd*4, are what a long
                context costs a decode step.
      kv write  2*n*KVH*hd*4 bytes into the cache.
      norms     2 RMSNorms (4*n*d FLOPs each), rope on q and k (3*n*H*hd + 3*n*KVH*hd), 2
                residual adds (n*d each), q/k/v biases if the model has them.
    Then the final norm and the LM head on the rows that need logits (2*rows*d*V FLOPs, d*V
    weights), and the embedding rows gathered (n*d weights). So a decode step is ~2*params FLOPs
    against params*dtype_bytes bytes: about 0.5 FLOP per byte in f32, far below any CPU's balance.
    """
    if not isinstance(mask, AttentionMask):
        raise ValueError(f"cost.forward: mask must be a masks.AttentionMask (CAUSAL, BIDIRECTIONAL, "
                         f"block_causal(b)), got {mask!r}")
    c = config
    d, V, H, KVH, hd = c.hidden_size, c.vocab_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    n = batch * n_new
    t = n_past + n_new if n_kv is None else n_kv
    all_logits = mask != CAUSAL if all_logits is None else all_logits
    scores = batch * mask.pairs(n_new, t, n_past)
    wb = dtype_bytes

    entry = {"tokens": n, "flops": 0, "bytes": dict.fromkeys(("weights", "kv_read", "kv_write", "activations"), 0),
             "by_op": {}}

    def book(op, cost, times=1):
        flops, nbytes = cost
        slot = entry["by_op"].setdefault(op, {"flops": 0, "bytes": dict.fromkeys(entry["bytes"], 0)})
        for target in (entry, slot):
            target["flops"] += times * flops
            for kind, b in nbytes.items():
                target["bytes"][kind] += times * b

    L = c.num_hidden_layers
    book("embedding", embedding(n, d, wb))
    if c.embedding_scale != 1:
        book("embedding", scale(n * d))
    for op, cost in layer(c, n, wb):
        book(op, cost, L)
    for l in range(L):                                  # each layer's window hides keys of its own
        pairs = mask.windowed(c.window(l)).pairs(n_new, t, n_past) if c.window(l) else scores // batch
        book("attention", attention(n_new, H, KVH, hd, t, pairs), batch)
    rows = batch * logit_rows if logit_rows is not None else n if all_logits else batch
    book("norm", rmsnorm(rows, d))
    book("lm_head", matmul(rows, d, V, wb))
    if c.final_logit_softcapping:
        book("lm_head", softcap(rows * V))
    return entry
