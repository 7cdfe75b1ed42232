"""The transformer: one forward pass you can read top to bottom.

As in llama2.c's `Transformer {config, weights, state}`: the Config (config.py) and the Weights
(weights.py, views of the memory-mapped checkpoint) are read-only and held by a Transformer with
what is derived from them once (each layer's RoPE table, csrc/layer.c's view of each layer); the
run State is what one generation writes (the KV cache, the scratch buffers, csrc/layer.c's view of
both), made once per generation by Transformer.state and reused for every pass. Several threads
may run one Transformer at once, each with its own State; every pass runs on the Transformer's own
thread pool (kernels.ThreadPool), so two models never share threads.

Transformer.forward is the one entry for every pass: prefill, decoding, diffusion steps, batches.
Which body runs: a pass of up to layer_c.MAX_LAYER_ROWS = 1024 rows that fits the State's
buffers (a decode step of one sequence or of a batch, a prompt, a block of block diffusion, a
diffusion canvas) runs layers_c, each layer one call of csrc/layer.c; a longer one runs layers, the
readable loop of kernel calls below, which layer.c follows kernel for kernel (one call a layer
instead of ~11 kernel calls, whose Python would cost a small model a third of its time).
tests/test_layer_c.py holds the two to the same logits and cache, bit for bit, for every
variant of the layer (the Config's fields: QK-norm, sandwich norms, activation, windows, ...).

Shapes: n = positions in this pass, t = positions in the cache after it, d = hidden_size,
H/KVH = query/key-value heads, hd = head_dim, f = intermediate_size, V = vocab_size.
"""
import dataclasses
import hashlib
from collections import OrderedDict

import numpy as np

from . import kernels as K
from . import layer_c, ledger
from .masks import BIDIRECTIONAL, CAUSAL
from .weights import MATRICES

ACTIVATIONS = {"silu": K.silu_mul, "gelu_tanh": K.gelu_tanh_mul}   # Config.hidden_act: act(gate) * up


def interleaved(weights, panels=False):
    """The weights with every matrix the matmul reads as K.interleaved gives it (Q8_0 and Q4_0
    repacked for the AVX2 and AVX512_VNNI kernels; with panels, for a model whose passes all have
    many rows, f32, f16 and bf16 in the GEMM's panels). An embedding tied to the head is repacked
    with it and read from the one copy (a look-up reads repacked rows as well: the same numbers);
    an untied embedding, only looked up, stays as it is."""
    layers = [dataclasses.replace(lw, **{name: K.interleaved(getattr(lw, name), panels) for name in MATRICES})
              for lw in weights.layers]
    head = K.interleaved(weights.lm_head, panels)
    embed = head if weights.lm_head is weights.embed_tokens else weights.embed_tokens
    return dataclasses.replace(weights, embed_tokens=embed, layers=layers, lm_head=head)


def rope_inv_freq(cfg, layer=None):
    """RoPE's inverse frequencies [hd/2] (of layer `layer`: a windowed layer of a config with a
    local_rope_theta takes that base, unscaled, as Gemma 3's sliding layers do), computed in float32
    as transformers computes them (modeling_rope_utils.py), with the config's scaling: linear divides
    every frequency by the factor (positions stretched); llama3 divides only the low ones
    (wavelengths longer than the original context / low_freq_factor), keeps the high ones (shorter
    than original context / high_freq_factor) and blends the ones between; freq_factors (a GGUF's
    rope_freqs.weight) gives each frequency's divisor."""
    f32 = np.float32
    local = layer is not None and cfg.local_rope_theta is not None and cfg.window(layer) > 0
    exponent = np.arange(0, cfg.head_dim, 2, dtype=f32) / f32(cfg.head_dim)
    inv_freq = (f32(1.0) / f32(cfg.local_rope_theta if local else cfg.rope_theta) ** exponent).astype(f32)
    kind, *p = ("default",) if local or not cfg.rope_scaling else cfg.rope_scaling
    if kind == "linear":
        return (inv_freq / f32(p[0])).astype(f32)
    if kind == "freq_factors":   # GGUF's llama3 scaling: the factor each frequency is divided by
        return (inv_freq / np.array(p, f32)).astype(f32)
    if kind == "llama3":
        factor, low, high, context = (f32(v) for v in p)
        wavelen = f32(2 * np.pi) / inv_freq
        scaled = np.where(wavelen > context / low, inv_freq / factor, inv_freq)
        smooth = (context / wavelen - low) / (high - low)
        blended = (f32(1) - smooth) * scaled / factor + smooth * scaled
        between = ~(wavelen < context / high) & ~(wavelen > context / low)
        return np.where(between, blended, scaled).astype(f32)
    return inv_freq


class KVCache:
    """Keys (after RoPE) and values of B sequences, n_ctx position slots each, for every layer."""

    def __init__(self, cfg, n_ctx, batch=1):
        shape = (cfg.num_hidden_layers, batch, n_ctx, cfg.kv_dim)
        self.k = np.zeros(shape, np.float32)   # [L, B, ctx, KVH*hd]
        self.v = np.zeros(shape, np.float32)   # [L, B, ctx, KVH*hd]

    def store(self, l, slot, pos, k, v):
        """k, v [n, KVH*hd] of positions pos [n] (consecutive) into the sequence's slots of layer l."""
        s = int(pos[0])
        K.store(self.k[l, slot, s:s + len(pos)], k)
        K.store(self.v[l, slot, s:s + len(pos)], v)

    def keys_values(self, l, slot, t):
        """(keys, values [t, KVH*hd], attention's paging arguments) of the sequence's first t positions."""
        return self.k[l, slot, :t], self.v[l, slot, :t], {}


class PagedKVCache:
    """Keys and values in pages of PAGE positions (kernels.PAGE, the attention's key block), shared
    by every sequence: pools [L, pages*PAGE, KVH*hd], and a page table per sequence (`tables`, its
    State slot -> int64 [pages]: position p is row p % PAGE of page table[p // PAGE]).

    A prefix cache over it (vLLM's, at page granularity): a full page is named by its tokens and
    all those before it (a chained hash: equal names, equal K/V, since attention is causal and RoPE
    positions absolute), stays named after its sequences end, and a later sequence whose ids start
    the same takes it instead of recomputing it. Pages no sequence holds are freed least recently
    used first when a sequence needs one; `pages` bounds the pool (page_bytes(cfg) each)."""

    def __init__(self, cfg, pages):
        self.k = np.zeros((cfg.num_hidden_layers, pages * K.PAGE, cfg.kv_dim), np.float32)  # [L, rows, KVH*hd]
        self.v = np.zeros((cfg.num_hidden_layers, pages * K.PAGE, cfg.kv_dim), np.float32)
        self.tables = {}                     # slot -> int64 [pages]
        self.free = list(range(pages))       # pages holding nothing
        self.refs = [0] * pages              # sequences holding each page
        self.named, self.name_of = {}, {}    # prefix name -> page, page -> name
        self.idle = OrderedDict()            # named pages no sequence holds, least recently used first

    def store(self, l, slot, pos, k, v):
        """k, v [n, KVH*hd] of positions pos [n] into the pool rows of the sequence's pages, layer l."""
        table = self.tables[slot]
        at = table[pos // K.PAGE] * K.PAGE + pos % K.PAGE
        K.store_at(self.k[l], at, k)
        K.store_at(self.v[l], at, v)

    def keys_values(self, l, slot, t):
        """(the pools of layer l, [rows, KVH*hd] each, and attention's paging arguments: the
        sequence's page table and its t keys)."""
        return self.k[l], self.v[l], {"pages": self.tables[slot], "t": int(t)}

    @staticmethod
    def page_bytes(cfg):
        """K and V of one page, every layer, f32."""
        return 2 * cfg.num_hidden_layers * K.PAGE * cfg.kv_dim * 4

    @staticmethod
    def names(ids):
        """The name of each full page of ids: the SHA-256 of its tokens and every token before it
        (chained), so no prompt can be made to take another's pages (Python's hash() can be
        collided on purpose: vLLM's CVE-2025-25183)."""
        out, h = [], b""
        for i in range(len(ids) // K.PAGE):
            h = hashlib.sha256(h + np.asarray(ids[i * K.PAGE:(i + 1) * K.PAGE], np.int64).tobytes()).digest()
            out.append(h)
        return out

    def start(self, slot, ids):
        """Gives slot a table holding the named pages that start ids (never the page of its last id,
        which a pass must run for its logits); returns how many positions they cover."""
        table = []
        for name in self.names(ids[:len(ids) - 1]):
            page = self.named.get(name)
            if page is None:
                break
            self._hold(page)
            table.append(page)
        self.tables[slot] = np.array(table, np.int64)
        return len(table) * K.PAGE

    def grow(self, slot, positions):
        """Pages for slot's positions up to `positions`; False if the pool cannot give them."""
        table = self.tables.get(slot, np.zeros(0, np.int64))
        need = -(-positions // K.PAGE) - len(table)
        new = []
        for _ in range(need):
            page = self._take()
            if page is None:
                for p in new:
                    self._drop(p)
                return False
            new.append(page)
        self.tables[slot] = np.concatenate([table, np.array(new, np.int64)])
        return True

    def name_pages(self, slot, ids):
        """Names the full pages of slot's first len(ids) positions (their K/V are ids'), so later
        sequences can take them."""
        for page, name in zip(self.tables[slot], self.names(ids)):
            page = int(page)
            if page not in self.name_of and name not in self.named:
                self.named[name], self.name_of[page] = page, name

    def end(self, slot):
        """The slot's sequence is done: its pages go back (named ones stay, idle, for later sequences)."""
        for page in self.tables.pop(slot, []):
            self._drop(int(page))

    def _hold(self, page):
        self.refs[page] += 1
        self.idle.pop(page, None)

    def _drop(self, page):
        self.refs[page] -= 1
        if self.refs[page] == 0:
            if page in self.name_of:
                self.idle[page] = None
            else:
                self.free.append(page)

    def _take(self):
        if not self.free and self.idle:              # the least recently used named page is forgotten
            page, _ = self.idle.popitem(last=False)
            del self.named[self.name_of.pop(page)]
            self.free.append(page)
        if not self.free:
            return None
        page = self.free.pop()
        self.refs[page] = 1
        return page


class Buffers:
    """Scratch activations for up to n_max rows (batch x positions) per pass."""

    def __init__(self, cfg, n_max):
        self.n_max = n_max
        self.x = np.zeros((n_max, cfg.hidden_size), np.float32)           # [Bn, d] residual stream
        self.h = np.zeros((n_max, cfg.hidden_size), np.float32)           # [Bn, d] normed input of a block
        self.q = np.zeros((n_max, cfg.q_dim), np.float32)                 # [Bn, H*hd]
        self.k = np.zeros((n_max, cfg.kv_dim), np.float32)                # [Bn, KVH*hd]
        self.v = np.zeros((n_max, cfg.kv_dim), np.float32)                # [Bn, KVH*hd]
        self.att = np.zeros((n_max, cfg.q_dim), np.float32)               # [Bn, H*hd] attention output
        self.gate = np.zeros((n_max, cfg.intermediate_size), np.float32)  # [Bn, f]
        self.up = np.zeros((n_max, cfg.intermediate_size), np.float32)    # [Bn, f]


class State:
    """One generation's run state: the KV cache of `batch` sequences of n_ctx slots (or a paged
    one), buffers for up to `rows` rows a pass, and csrc/layer.c's view of both. Made by
    Transformer.state."""

    def __init__(self, transformer, n_ctx, batch, rows, pages=None):
        cfg = transformer.config
        self.owner = transformer
        self.cache = KVCache(cfg, n_ctx, batch) if pages is None else PagedKVCache(cfg, pages)  # x2 [L, ...]
        self.buf = Buffers(cfg, rows)                                 # [rows, ...]
        self.scratch = layer_c.Scratch(cfg, self.buf, self.cache)


class Seqs:
    """The sequences of one pass, as forward takes them: ids [B, n] or a list of B sequences of
    their own lengths; start, kv_len: one for all or [B]; slots: the State's sequence each is
    (default 0..B-1)."""

    def __init__(self, ids, start, kv_len, slots):
        self.lens = np.array([len(a) for a in ids] if isinstance(ids, list) else [ids.shape[1]] * len(ids))  # [B]
        self.ids = np.concatenate(list(ids)) if isinstance(ids, list) else np.asarray(ids).reshape(-1)     # [N]
        self.ends = np.cumsum(self.lens)                                # [B] each sequence's rows end here
        B = len(self.lens)
        self.rows = int(self.ends[-1]) if B else 0
        self.starts = np.broadcast_to(np.asarray(start, np.int64), (B,))   # [B] each one's first position
        self.kv_lens = (self.starts + self.lens if kv_len is None
                        else np.broadcast_to(np.asarray(kv_len, np.int64), (B,)))   # [B] keys each reads
        self.slots = range(B) if slots is None else slots               # [B] the cache sequence of each


def many_rows(config):
    """Whether every pass of the model has many rows: a masked-diffusion model's (the whole canvas),
    not a block-diffusion one's (a block of block_size rows after a cached prefix), whose few-row
    passes the tiles run faster from the rows (stories5m-bd, a 1-row pass 0.69 -> 0.50 ms, 8 rows
    1.04 -> 0.95-0.99, against the panels' GEMM, Xeon)"""
    return not config.causal and config.block_size is None


class Transformer:
    """A model's config and weights, each layer's RoPE table, its layers as csrc/layer.c reads them
    and its thread pool (threads: its count; default the default pool's), built once. The weights
    are read as they are when it is made (layer.c keeps pointers to them)."""

    def __init__(self, config, weights, threads=None):
        if len(weights.layers) != config.num_hidden_layers:
            raise ValueError(f"the weights have {len(weights.layers)} layers, the config "
                             f"{config.num_hidden_layers}")
        self.config, self.weights = config, interleaved(weights, panels=many_rows(config))
        self.inv_freqs = [rope_inv_freq(config, l) for l in range(config.num_hidden_layers)]   # [L] x [hd/2]
        self.c_layers = [layer_c.Layer(config, lw, f) for lw, f in zip(self.weights.layers, self.inv_freqs)]
        self.pool = K.ThreadPool(K.get_threads() if threads is None else K.check_threads(threads))

    def state(self, n_ctx, batch=1, rows=None, pages=None):
        """A run State: n_ctx cache slots per sequence, passes of up to `rows` rows (default all);
        or, with pages, a PagedKVCache of that many pages that sequences share (serving)."""
        return State(self, n_ctx, batch, batch * n_ctx if rows is None else rows, pages)

    def forward(self, ids, state, start, kv_len=None, mask=CAUSAL, last_only=False, slots=None, out_rows=None):
        """Runs ids [B, n] (B sequences, the tokens at positions start..start+n-1 of each) through the model.

        Their keys and values go into cache slots start..start+n-1; attention reads slots 0..kv_len-1
        (default: up to the last new position) under mask (masks.py; each layer adds its own window,
        Config.layer_windows). Autoregressive decoding appends (start = positions so far); a
        diffusion step with a cache recomputes a span of the canvas and reads the cached rest.
        Returns logits [B*n, V], or [B, V] for each sequence's last position (the same for one position).

        Batched decoding: start may give each sequence its own first position ([B] ints), and slots
        the State's sequence each row of ids is (default 0..B-1), so sequences of different
        lengths, any subset of the State's, share one pass: the weights are read once for all.
        ids may also be a list of B sequences of their own lengths (ragged: canvases of different
        sizes); the logits are then their rows one sequence after another [sum of lengths, V].

        out_rows: the rows (of the pass's rows, one sequence after another) whose logits are wanted,
        instead of all or each sequence's last: the final norm and the LM head run on those alone
        (a diffusion step needs the positions it may commit, not the whole canvas)."""
        if state.owner is not self:
            raise ValueError("forward: this State was made by another Transformer (Transformer.state)")
        return self.forward_seqs(Seqs(ids, start, kv_len, slots), state, mask, last_only, out_rows)

    def forward_seqs(self, seqs, state, mask=CAUSAL, last_only=False, out_rows=None, body=None):
        """forward's pass for the sequences of seqs (a Seqs), through body (layers or layers_c;
        default layers_c where the pass fits it, as forward says; tests choose)."""
        if body is None:
            fits = seqs.rows <= min(state.scratch.rows, layer_c.MAX_LAYER_ROWS)
            body = self.layers_c if fits else self.layers               # the loop below, in C, or it
        with self.pool:
            x = self.embed(seqs, state)                                 # [N, d]
            body(x, seqs, state, mask)                                  # x += every layer
            return self.logits(x, seqs, last_only, out_rows)

    def embed(self, seqs, state):
        """The pass's start: the embedding rows of its ids, scaled as the config says; x [N, d]."""
        x = state.buf.x[:seqs.rows]                                     # [N, d] the residual stream
        ledger.begin_pass(tokens=seqs.rows)
        K.embedding(self.weights.embed_tokens, seqs.ids, out=x)         # [N, d]
        if self.config.embedding_scale != 1:
            K.scale(x, self.config.embedding_scale, op="embedding")     # Gemma: x *= sqrt(d)
        return x

    def layers(self, x, seqs, state, mask):
        """x [N, d] += every decoder layer, kernel by kernel: the readable definition, for the
        sequences of seqs (a Seqs: their rows one after another, run through the same matmuls).
        Each choice a model family makes is a field of the Config or a tensor that is there or not."""
        cfg, cache, buf = self.config, state.cache, state.buf
        N, H, KVH, hd, eps = seqs.rows, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
        pos = np.concatenate([np.arange(s, s + m) for s, m in zip(seqs.starts, seqs.lens)])   # [N] positions
        h, q, k, v = buf.h[:N], buf.q[:N], buf.k[:N], buf.v[:N]
        att, gate, up = buf.att[:N], buf.gate[:N], buf.up[:N]

        for l, lw in enumerate(self.weights.layers):
            # attention: x += [norm](o_proj(attention(rope([norm] q), rope([norm] k), v)))
            K.rmsnorm(x, lw.input_layernorm, eps, out=h, op="norm")     # [N, d]
            K.matmuls(h, (lw.q_proj, lw.k_proj, lw.v_proj), (q, k, v), op="matmul")  # [N, H*hd], 2x [N, KVH*hd]
            if lw.q_bias is not None:
                K.add_bias(q, lw.q_bias, op="matmul")
                K.add_bias(k, lw.k_bias, op="matmul")
                K.add_bias(v, lw.v_bias, op="matmul")
            if lw.q_norm is not None:                                   # QK-norm, each head on its own
                K.rmsnorm(q.reshape(N * H, hd), lw.q_norm, eps, out=q.reshape(N * H, hd), op="norm")
                K.rmsnorm(k.reshape(N * KVH, hd), lw.k_norm, eps, out=k.reshape(N * KVH, hd), op="norm")
            K.rope_qk(q.reshape(N, H, hd), k.reshape(N, KVH, hd), pos, self.inv_freqs[l], op="rope")
            layer_mask = self.layer_mask(mask, l)
            for slot, s, t, n, end in zip(seqs.slots, seqs.starts, seqs.kv_lens, seqs.lens, seqs.ends):
                rows = slice(end - n, end)
                cache.store(l, slot, pos[rows], k[rows], v[rows])       # [n, KVH*hd] into the cache
                keys, values, paging = cache.keys_values(l, slot, t)    # [t, KVH*hd] (or pools)
                K.attention(q[rows].reshape(n, H, hd), keys.reshape(-1, KVH, hd), values.reshape(-1, KVH, hd),
                            out=att[rows].reshape(n, H, hd), mask=layer_mask, q_pos0=s, scale=cfg.scale,
                            op="attention", **paging)                   # [n, H, hd]
            self._residual(x, att, lw.o_proj, lw.o_bias, lw.post_attention_norm, h, "matmul")  # x += [N, d]

            # MLP: x += [norm](down_proj(act(gate_proj(x)) * up_proj(x)))
            K.rmsnorm(x, lw.post_attention_layernorm, eps, out=h, op="norm")  # [N, d]
            K.matmuls(h, (lw.gate_proj, lw.up_proj), (gate, up), op="mlp")  # 2x [N, f]
            ACTIVATIONS[cfg.hidden_act](gate, up, out=gate, op="mlp")   # [N, f]
            self._residual(x, gate, lw.down_proj, None, lw.post_feedforward_layernorm, h, "mlp")  # x += [N, d]

    def _residual(self, x, a, w, bias, norm, h, op):
        """x += a @ w.T (+ bias), normed first if the layer norms its blocks' outputs (norm given);
        h [N, d] is the scratch for that."""
        if norm is None:
            K.matmul(a, w, out=x, op=op, residual=True)                 # x += [N, d]
            if bias is not None:
                K.add_bias(x, bias, op=op)
            return
        K.matmul(a, w, out=h, op=op)                                    # [N, d]
        if bias is not None:
            K.add_bias(h, bias, op=op)
        K.rmsnorm(h, norm, self.config.rms_norm_eps, out=h, op="norm")
        K.add(x, h, op="residual")                                      # x += [N, d]

    def layers_c(self, x, seqs, state, mask):
        """layers() for passes of up to layer_c.MAX_LAYER_ROWS rows, each layer one C call
        (csrc/layer.c: the loop body above, kernel for kernel)."""
        c_seqs = layer_c.Seqs(state.scratch, seqs.slots, seqs.starts, seqs.lens, seqs.kv_lens,
                              state.cache.tables if state.scratch.paged else None)
        for l, layer in enumerate(self.c_layers):
            layer_c.forward(layer, state.scratch, l, c_seqs, self.layer_mask(mask, l))   # x += layer l  [n, d]

    def layer_mask(self, mask, l):
        """The pass's mask as layer l applies it: with the layer's own window, if it has one."""
        return mask.windowed(self.config.window(l)) if self.config.window(l) else mask

    def logits(self, x, seqs, last_only, out_rows):
        """The pass's end: the final norm and the LM head on the rows of x [N, d] wanted (out_rows,
        or each sequence's last with last_only, or all), soft-capped if the config says so.
        Returns [N, B or rows, V]."""
        if out_rows is not None:
            x = x[out_rows]                                             # [rows, d] those wanted
        elif last_only:
            x = x[seqs.ends - 1]                                        # [B, d] each sequence's last row
        out = K.rmsnorm(x, self.weights.norm, self.config.rms_norm_eps, op="norm")   # [N, B or rows, d]
        logits = K.matmul(out, self.weights.lm_head, op="lm_head")      # [N, B or rows, V]
        if self.config.final_logit_softcapping:
            K.softcap(logits, self.config.final_logit_softcapping, op="lm_head")   # cap * tanh(logits / cap)
        return logits

    def canvas_logits(self, canvas, state, start=0, end=None, want=None):
        """Bidirectional logits [B, end-start, V] for canvas [B, L] positions start..end-1.

        Recomputes canvas[:, start:end] (their K/V overwrite those cache slots) attending over all
        canvas positions; the slots outside [start, end) are read from the cache as an earlier pass
        left them. start=0, end=None is a full, uncached pass. Row i is the distribution of the token
        at position start+i, for every model (Dream's shift is canvas_rows').
        want: positions (in start..end-1) whose distributions alone are wanted: [B, len(want), V],
        the LM head run on those rows only."""
        B, L = canvas.shape
        end = L if end is None else end
        first, out_rows, unshift = canvas_rows(self.config, B, start, end, want)
        return unshift(self.forward(canvas[:, first:end], state, first, kv_len=L, mask=BIDIRECTIONAL,
                                    out_rows=out_rows))


def canvas_rows(config, B, start, end, want=None, left=None):
    """Dream's shift, the one place it is written: which rows of a bidirectional pass over B
    sequences hold the distributions of positions `want` (default start..end-1). A model whose row i
    predicts position i+1 (config.shifted_logits: Dream, an AR model read as a diffusion one) has
    position p's in row p-1, so the pass recomputes one position more on the left, unless `left`
    [B, V], the logits of that row, is given (block diffusion: the last row of the pass that cached
    the text before the block). Position 0, with no row before it, keeps its own.

    Returns (first, out_rows, unshift): the pass recomputes positions first..end-1; out_rows, the
    rows of its B*(end-first) (one sequence after another) the LM head runs on (None: all of them,
    when want is None); unshift(the pass's logits) -> [B, len(want), V]."""
    shift = 1 if config.shifted_logits else 0
    first = start - 1 if shift and start > 0 and left is None else start
    pos = np.arange(start, end) if want is None else np.asarray(want, np.int64)
    src = (pos - shift if left is not None else np.maximum(pos - shift, 0)) - first   # rows; -1: left's
    inner = src[src >= 0]                                               # the rows this pass gives
    if want is None:                                                    # all rows run: pick, a view if it can be
        pick, out_rows = (slice(len(inner)) if np.array_equal(inner, np.arange(len(inner))) else inner), None
    else:                                                               # the LM head on those rows alone
        pick, out_rows = slice(None), (np.arange(B)[:, None] * (end - first) + inner).reshape(-1)

    def unshift(logits):
        rows = logits.reshape(B, -1, logits.shape[-1])[:, pick]         # [B, rows it gave, V]
        return rows if len(inner) == len(src) else np.concatenate([left[:, None], rows], axis=1)
    return first, out_rows, unshift
