"""csrc/layer.c's view of a model: one decoder layer for the rows of a few sequences in one C call.

Transformer.layers_c calls `forward` once a layer for every pass of up to MAX_LAYER_ROWS rows.
What layer.c reads is built here once and checked here, because C trusts it: a Layer per layer
(struct td_layer: pointers to the weights of that layer's LAYER_TENSORS, each shape checked against
the config, the layer's RoPE table), a Scratch per State (struct td_scratch: the model's sizes, the
choices every layer shares (activation, attention scale, RMSNorm's eps), the State's buffers and
KV cache) and Seqs per pass (struct td_seq[]: each sequence's rows, positions and cache, checked
to fit it). `forward` books what the per-kernel loop (Transformer.layers) would book: the same
numbers, so the ledger cannot tell which body ran.
"""
import numpy as np

from .._kernels import ffi, lib
from ..formats import quant
from . import cost, ledger
from .kernels import _F32, _buf, _f32, _p, _weight
from .masks import CAUSAL
from .weights import LAYER_TENSORS

MAX_LAYER_ROWS = lib.TD_LAYER_MAX_ROWS      # the most rows one forward call takes
ACTIVATIONS = {"silu": lib.TD_SILU, "gelu_tanh": lib.TD_GELU_TANH}   # Config.hidden_act -> enum td_act


class Layer:
    """A layer's weights as csrc/layer.c reads them (struct td_layer), made once per model: a
    pointer to each of its LAYER_TENSORS (NULL for an optional one it does not have: no bias, no
    QK-norm, ...; the NumPy layer skips the same), its matrices' types, and inv_freq [hd/2], the
    layer's RoPE table; and what one call books, but for attention (which grows with the
    position): cost.layer."""

    def __init__(self, cfg, lw, inv_freq):
        fields, arrays, w_bytes = {}, [], {}
        for t in LAYER_TENSORS:                     # the C layer reads by the config's sizes: they must hold
            a = getattr(lw, t.name)
            if a is None and not t.matrix:          # NULL: this layer has no such bias or norm
                continue
            if t.matrix:
                a, kind, cols, fields[t.name] = _weight(a)
                fields[t.name[:-5] + "_type"], w_bytes[t.name] = kind, quant.bytes_per_weight(a)
                shape = (quant.rows(a), cols) if a.ndim == 2 else a.shape
            else:
                a = _f32(a)
                fields[t.name], shape = _p(a), a.shape
            if shape != t.shape(cfg):
                raise ValueError(f"decode layer: {t.name} is {shape}, the config wants {t.shape(cfg)}")
            arrays.append(a)
        self.inv_freq = _f32(inv_freq)               # [hd/2]
        fields["inv_freq"] = _p(self.inv_freq)
        self._arrays = (arrays, fields)              # the pointers' owners
        self.c = ffi.new("struct td_layer *", fields)
        self._cfg, self._w_bytes = cfg, w_bytes
        self._costs = {}                             # n -> cost.layer(cfg, n, ...)
        self.shape = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)

    def costs_of(self, n):
        """What one call over n rows books but attention (cost.layer), made once per n."""
        if n not in self._costs:
            self._costs[n] = cost.layer(self._cfg, n, self._w_bytes)
        return self._costs[n]


class Scratch:
    """A State as csrc/layer.c reads it (struct td_scratch): the model's sizes and the choices its
    layers share, the scratch rows of a transformer.Buffers, and its KV cache: B sequences of ctx
    slots [L, B, ctx, KVH*hd], or a pool of pages [L, rows, KVH*hd] that sequences hold by page
    tables (a PagedKVCache)."""

    def __init__(self, cfg, buf, cache):
        self.paged = cache.k.ndim == 3
        L, *rest, kvd = cache.k.shape
        if ((L, kvd) != (cfg.num_hidden_layers, cfg.kv_dim) or cache.v.shape != cache.k.shape
                or cache.k.ndim not in (3, 4)):
            raise ValueError(f"decode: a KV cache [{cfg.num_hidden_layers}, B, ctx, {cfg.kv_dim}] or "
                             f"[{cfg.num_hidden_layers}, rows, {cfg.kv_dim}] expected, got {cache.k.shape}")
        self.batch, self.ctx = (1, rest[0]) if self.paged else rest    # paged: one pool of ctx rows
        rows = {"x": cfg.hidden_size, "h": cfg.hidden_size, "q": cfg.q_dim, "att": cfg.q_dim, "k": cfg.kv_dim,
                "v": cfg.kv_dim, "gate": cfg.intermediate_size, "up": cfg.intermediate_size}
        for name, width in rows.items():
            if getattr(buf, name).shape[1:] != (width,) or not len(getattr(buf, name)):
                raise ValueError(f"decode: buffers of another model ({name} {getattr(buf, name).shape})")
        for what, a in [("the KV cache", cache.k), ("the KV cache", cache.v), *(("buffer " + n, getattr(buf, n))
                                                                                for n in rows)]:
            if not (a.dtype == _F32 and a.flags.c_contiguous and a.flags.writeable):   # C writes them as float32
                raise ValueError(f"decode: {what} must be a writable C-contiguous float32 array, got {a.dtype}")
        scratch = {n: _p(getattr(buf, n)) for n in ("h", "q", "att", "k", "v", "gate", "up")}
        self._arrays = scratch                                         # the pointers' owners
        self.c = ffi.new("struct td_scratch *", dict(
            d=cfg.hidden_size, heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads, hd=cfg.head_dim,
            f=cfg.intermediate_size, eps=cfg.rms_norm_eps, scale=cfg.scale, act=ACTIVATIONS[cfg.hidden_act],
            **scratch))
        self.x = _p(buf.x)                                             # [rows, d] the residual stream
        self.rows = len(buf.x)
        self.k, self.v, self.layer_floats = _p(cache.k), _p(cache.v), cache.k[0].size
        self.seq_floats = 0 if self.paged else self.ctx * kvd          # one sequence's slots in a layer


class Seqs:
    """The sequences of one pass as csrc/layer.c takes them (struct td_seq[]), each checked to fit
    its cache, made once a pass for every layer: slots [B] (the cache sequence of each), starts,
    lens and kv_lens [B] (first position, rows, keys read), tables (a paged cache's, by slot)."""

    def __init__(self, run, slots, starts, lens, kv_lens, tables=None):
        self.c = ffi.new("struct td_seq[]", len(lens))
        self.rows, self._keep = int(sum(lens)), []                     # the page tables' owners
        self.spans = list(zip(map(int, lens), map(int, kv_lens), map(int, starts)))   # [(n, t, pos)] for booking
        for i, (slot, (n, t, pos)) in enumerate(zip(slots, self.spans)):
            seq = self.c[i]
            if tables is None:
                if not 0 <= slot < run.batch:
                    raise ValueError(f"decode: no sequence {slot} in a cache of {run.batch}")
                limit, at = run.ctx, slot * run.seq_floats
            else:
                table = np.ascontiguousarray(tables[slot], dtype=np.int64)
                if ((table < 0) | (table >= run.ctx // lib.TD_PAGE)).any():
                    raise ValueError(f"decode: page table {table.tolist()} outside a pool of "
                                     f"{run.ctx // lib.TD_PAGE} pages")
                limit, at, seq.pages = len(table) * lib.TD_PAGE, 0, _buf("int64_t[]", table)
                self._keep.append((table, seq.pages))
            if not 0 <= pos <= pos + n <= t <= limit:
                raise ValueError(f"decode: position {pos + n - 1} is outside the cache's {limit} slots, or reads "
                                 f"{t} keys")
            seq.n, seq.pos, seq.kv_len, seq.k, seq.v = n, pos, t, run.k + at, run.v + at
        if not 1 <= self.rows <= min(run.rows, MAX_LAYER_ROWS):
            raise ValueError(f"decode: {self.rows} positions in one call; the buffers hold {run.rows}, a call at "
                             f"most {MAX_LAYER_ROWS}")


def forward(layer, run, l, seqs, mask=CAUSAL):
    """run's x [n, d] += decoder layer l (a Layer) for the rows of seqs (a Seqs), one sequence after
    another; each one's K and V go into its cache slots pos..pos+n-1 of layer l, and its attention
    reads slots 0..kv_len-1 under mask (its window included)."""
    if _forward(layer.c, run.c, run.x, seqs.c, len(seqs.spans), l, run.layer_floats, mask.block, mask.window):
        raise MemoryError("decode: no memory for x in the dot product's type, or for attention's scratch")
    if ledger.active():
        ledger.book_all(layer.costs_of(seqs.rows))
        for n, t, pos in seqs.spans:
            ledger.book("attention", cost.attention(n, *layer.shape, t, mask.pairs(n, t, pos)))


_forward = lib.td_layer_forward
