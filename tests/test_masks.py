"""Attention masks as data (tinydiff.engine.masks): the description, the C attention under each mask kind
against a dense NumPy softmax, and what the ledger and cost.forward book for it.

Block-causal sizes are chosen against the kernels' tiles (KB = 64 keys, RMAX = 48 rows): 2, 3, 7
and 100 cut them anywhere, 16 and 64 fit them, and q_pos0 > 0 moves every block edge off them.
Sliding windows likewise: 1, 5 and 63 inside a block of keys, 64 one, 65 and 100 across two, 1000
more than any test's keys; each with the causal, bidirectional and block-causal masks.
"""
import dataclasses
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tinydiff
from tinydiff.engine import cost
from tinydiff.engine import kernels as K
from tinydiff.engine import reference as R
from tinydiff.engine.ledger import Ledger
from tinydiff.engine.masks import BIDIRECTIONAL, CAUSAL, AttentionMask, block_causal

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
BLOCKS = [2, 3, 4, 7, 16, 64, 100]
MASKS = [CAUSAL, BIDIRECTIONAL] + [block_causal(b) for b in BLOCKS]
WINDOWS = [1, 5, 63, 64, 65, 100, 1000]
WINDOWED = [m.windowed(w) for m in (CAUSAL, BIDIRECTIONAL, block_causal(3), block_causal(64), block_causal(100))
            for w in WINDOWS]


def sees(mask, p, j, t):
    """The contract spelled out for one (query position p, key j) pair."""
    if j >= t or (mask.window and p - j >= mask.window):
        return False
    b = mask.block
    return True if b == 0 else j <= p if b == 1 else j // b <= p // b


# ---- the description ----

def test_kinds_and_validation():
    assert CAUSAL == block_causal(1) == AttentionMask(1) and BIDIRECTIONAL == AttentionMask(0) == AttentionMask(None)
    assert [str(m) for m in (CAUSAL, BIDIRECTIONAL, block_causal(4))] == ["causal", "bidirectional", "block-causal(4)"]
    assert block_causal(np.int64(4)).block == 4 and type(block_causal(np.int64(4)).block) is int
    for bad in (-1, 2.0, 1.5, True, "2"):
        with pytest.raises(ValueError, match="block"):
            AttentionMask(bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        CAUSAL.block = 0
    assert CAUSAL.window == 0 and CAUSAL.windowed(0) == CAUSAL and AttentionMask(1, None) == CAUSAL
    assert CAUSAL.windowed(np.int64(8)) == AttentionMask(1, 8) and type(CAUSAL.windowed(np.int64(8)).window) is int
    assert [str(m.windowed(4)) for m in (CAUSAL, BIDIRECTIONAL, block_causal(2))] == [
        "causal, window 4", "bidirectional, window 4", "block-causal(2), window 4"]
    for bad in (-1, 2.0, True, "2", 2**62):
        with pytest.raises(ValueError, match="window"):
            CAUSAL.windowed(bad)


@pytest.mark.parametrize("mask", MASKS + WINDOWED, ids=str)
def test_dense_is_the_contract(mask):
    for n, t, q_pos0 in [(1, 1, 0), (5, 9, 4), (130, 130, 0), (7, 200, 193), (20, 10, 3), (3, 0, 0), (0, 5, 2)]:
        want = np.array([[sees(mask, q_pos0 + i, j, t) for j in range(t)] for i in range(n)], bool).reshape(n, t)
        np.testing.assert_array_equal(mask.dense(n, t, q_pos0), want)


def test_block_edges_are_absolute():
    """Block k holds positions k*b .. k*b+b-1 whatever q_pos0 is: queries at 5, 6, 7 of blocks of 4
    see keys 0..7, the one at 8 starts the next block."""
    np.testing.assert_array_equal(block_causal(4).dense(4, 12, 5).sum(1), [8, 8, 8, 12])
    np.testing.assert_array_equal(CAUSAL.dense(3, 5, 2).sum(1), [3, 4, 5])


def test_window_is_hugging_faces():
    """masking_utils' sliding window: kv_idx > q_idx - sliding_window, AND the block mask; a window
    of 3 on causal queries at 4..6 over 8 keys sees keys 2..4, 3..5, 4..6."""
    np.testing.assert_array_equal(CAUSAL.windowed(3).dense(3, 8, 4), [[0, 0, 1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1, 0, 0],
                                                                      [0, 0, 0, 0, 1, 1, 1, 0]])
    q, kv = np.arange(50)[:, None], np.arange(60)[None, :]
    for w in (1, 7, 64):
        np.testing.assert_array_equal(CAUSAL.windowed(w).dense(50, 60), (kv <= q) & (kv > q - w))
        np.testing.assert_array_equal(BIDIRECTIONAL.windowed(w).dense(50, 60), kv > q - w)


@settings(max_examples=2000, deadline=None)
@given(block=st.one_of(st.integers(0, 8), st.sampled_from(BLOCKS + [1000])),
       window=st.one_of(st.just(0), st.integers(1, 10), st.sampled_from(WINDOWS + [128, 10 ** 12])),
       n=st.integers(0, 300), t=st.integers(0, 400), q_pos0=st.integers(0, 500))
def test_pairs_counts_the_dense_mask(block, window, n, t, q_pos0):
    mask = AttentionMask(block, window)
    assert mask.pairs(n, t, q_pos0) == mask.dense(n, t, q_pos0).sum()


def test_pairs_closed_forms():
    for n, past in [(1, 0), (1, 37), (64, 0), (9, 100)]:
        assert CAUSAL.pairs(n, past + n, past) == n * past + n * (n + 1) // 2
        assert BIDIRECTIONAL.pairs(n, past + n, past) == n * (past + n)
    assert block_causal(4).pairs(8, 8, 0) == 4 * 4 + 4 * 8          # two whole blocks
    big = 10 ** 9                                                     # closed form: no array
    assert block_causal(10 ** 6).pairs(big, big, 0) == sum(range(10 ** 6, big + 1, 10 ** 6)) * 10 ** 6
    w = 4096                                                          # a window: w keys each once past it
    assert CAUSAL.windowed(w).pairs(big, big, 0) == w * (w + 1) // 2 + (big - w) * w
    assert CAUSAL.windowed(w).pairs(1, big, big - 1) == w and BIDIRECTIONAL.windowed(w).pairs(1, big, 0) == big


# ---- the C attention under each mask, every SIMD level ----

def dense_attention(q, k, v, allowed, scale):
    """softmax(q k^T * scale, -inf where not allowed) v in float64, GQA by repeating kv heads; zeros
    for a query that sees no key (one a window puts past the keys there are)."""
    group = q.shape[1] // k.shape[1]
    k, v = (np.repeat(a.astype(np.float64), group, axis=1) for a in (k, v))
    s = np.einsum("nhd,thd->hnt", q.astype(np.float64), k) * scale
    s = np.where(allowed[None], s, -np.inf)
    with np.errstate(invalid="ignore"):                                # -inf - -inf where no key: replaced by 0
        p = np.where(allowed[None], np.exp(s - s.max(-1, keepdims=True, initial=-np.inf, where=allowed[None])), 0)
    return np.einsum("hnt,thd->nhd", p / np.maximum(p.sum(-1, keepdims=True), 1e-300), v)


def check_attention(mask, n, t, q_pos0, H, KVH, hd, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((n, H, hd), (t, KVH, hd), (t, KVH, hd)))
    want = dense_attention(q, k, v, mask.dense(n, t, q_pos0), 1 / np.sqrt(hd))
    for attention in (K.attention, R.attention):
        np.testing.assert_allclose(attention(q, k, v, mask=mask, q_pos0=q_pos0), want, rtol=0,
                                   atol=1e-5 * np.abs(v).max())


@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_attention_at_tile_edges(level, mask):
    """Shapes at the tiles' edges: 48 and 49 rows, 64 and 65 keys, a group of 50 heads split over
    two tasks, one query, blocks starting mid-tile."""
    for n, t, q_pos0, H, KVH, hd in [(48, 48, 0, 9, 3, 64), (49, 113, 64, 4, 1, 17), (16, 65, 49, 3, 1, 64),
                                     (130, 200, 37, 50, 1, 8), (1, 77, 70, 9, 3, 64), (2, 130, 128, 6, 6, 3)]:
        check_attention(mask, n, t, q_pos0, H, KVH, hd, seed=n + t)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mask=st.sampled_from(MASKS), n=st.integers(1, 130), extra=st.integers(0, 150), shift=st.integers(-40, 40),
       heads=st.sampled_from([(1, 1), (9, 3), (4, 1), (6, 6), (50, 1), (100, 2)]), hd=st.sampled_from([1, 8, 17, 64]),
       seed=st.integers(0, 999))
def test_attention_matches_dense_softmax(level, mask, n, extra, shift, heads, hd, seed):
    """n queries at positions q_pos0.. over t >= n keys; q_pos0 + n may fall short of t (a canvas
    read past the span recomputed) or past it (keys not yet written); groups of 50 heads exceed the
    tile's 48 rows."""
    t = n + extra
    check_attention(mask, n, t, max(extra + shift, 0), *heads, 8 if t * hd * heads[0] > 2_000_000 else hd, seed)


@pytest.mark.parametrize("mask", MASKS + WINDOWED, ids=str)
def test_hidden_keys_are_never_read(level, mask):
    """Keys no query of the call sees are not visited: NaN there changes nothing, on the one-query
    path and the tiled one."""
    for n, t, q_pos0, H, KVH, hd in [(70, 300, 30, 9, 3, 64), (1, 300, 99, 9, 3, 64)]:
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((n, H, hd), (t, KVH, hd), (t, KVH, hd)))
        want = dense_attention(q, k, v, mask.dense(n, t, q_pos0), 1 / 8)
        seen = mask.dense(n, t, q_pos0).any(0)
        if not mask.window:
            assert seen.all() == (mask == BIDIRECTIONAL)
        k[~seen], v[~seen] = np.nan, np.nan
        np.testing.assert_allclose(K.attention(q, k, v, mask=mask, q_pos0=q_pos0), want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("mask", WINDOWED, ids=str)
def test_windowed_attention_at_tile_edges(level, mask):
    """The same shapes under sliding windows: one query (decoding), 2, 48 and 49 rows, more than 64
    and 130 queries, windows starting mid-block."""
    for n, t, q_pos0, H, KVH, hd in [(1, 300, 299, 8, 2, 64), (1, 77, 70, 9, 3, 17), (2, 130, 128, 6, 6, 3),
                                     (48, 48, 0, 9, 3, 64), (49, 113, 64, 4, 1, 17), (16, 65, 49, 3, 1, 64),
                                     (130, 200, 37, 50, 1, 8), (70, 300, 230, 6, 2, 32), (1, 1, 0, 2, 1, 4)]:
        check_attention(mask, n, t, q_pos0, H, KVH, hd, seed=n + t)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mask=st.sampled_from(MASKS), window=st.one_of(st.integers(1, 70), st.sampled_from(WINDOWS)),
       n=st.integers(1, 130), extra=st.integers(0, 200), shift=st.integers(-40, 40),
       heads=st.sampled_from([(1, 1), (9, 3), (4, 1), (50, 1)]), hd=st.sampled_from([1, 8, 17, 64]),
       seed=st.integers(0, 999))
def test_windowed_attention_matches_dense_softmax(level, mask, window, n, extra, shift, heads, hd, seed):
    t = n + extra
    check_attention(mask.windowed(window), n, t, max(extra + shift, 0), *heads,
                    8 if t * hd * heads[0] > 2_000_000 else hd, seed)


def paged(k, rng, spare=2):
    """k [t, ...] in a pool of pages of K.PAGE rows in shuffled order, NaN in the rows not its keys:
    (pool, pages)"""
    npages = -(-len(k) // K.PAGE)
    pages = rng.permutation(npages + spare)[:npages]
    pool = np.full(((npages + spare) * K.PAGE,) + k.shape[1:], np.nan, np.float32)
    for i, page in enumerate(pages):
        rows = k[i * K.PAGE:(i + 1) * K.PAGE]
        pool[page * K.PAGE:page * K.PAGE + len(rows)] = rows
    return pool, pages


@pytest.mark.parametrize("mask", [CAUSAL, BIDIRECTIONAL, block_causal(3), block_causal(100)] + WINDOWED[::3], ids=str)
def test_paged_attention_is_the_contiguous_one(level, mask):
    """Keys in shuffled pages, first blocks of a window starting mid-page: bit for bit the contiguous
    attention (the same blocks of keys, read from elsewhere)."""
    rng = np.random.default_rng(1)
    for n, t, q_pos0, H, KVH, hd in [(1, 300, 299, 8, 2, 64), (1, 200, 100, 4, 4, 16), (49, 250, 190, 4, 1, 17),
                                     (130, 200, 37, 6, 2, 8)]:
        q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((n, H, hd), (t, KVH, hd), (t, KVH, hd)))
        (kp, pages), (vp, _) = paged(k, np.random.default_rng(t)), paged(v, np.random.default_rng(t))
        want = K.attention(q, k, v, mask=mask, q_pos0=q_pos0)
        np.testing.assert_array_equal(K.attention(q, kp, vp, mask=mask, q_pos0=q_pos0, pages=pages, t=t), want)
        np.testing.assert_allclose(want, R.attention(q, k, v, mask=mask, q_pos0=q_pos0), rtol=0, atol=1e-5 * 5)


@pytest.mark.parametrize("mask", MASKS[:4], ids=str)
def test_a_window_past_every_key_changes_nothing(level, mask):
    """A window no query's keys reach past (window > the last position) is no window, bit for bit."""
    rng = np.random.default_rng(2)
    for n, t, q_pos0 in [(1, 150, 149), (70, 200, 100)]:
        q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((n, 6, 16), (t, 2, 16), (t, 2, 16)))
        want = K.attention(q, k, v, mask=mask, q_pos0=q_pos0)
        for w in (q_pos0 + n, 10 ** 12):
            np.testing.assert_array_equal(K.attention(q, k, v, mask=mask.windowed(w), q_pos0=q_pos0), want)


def test_mask_must_be_data():
    q, k = np.zeros((2, 1, 4), np.float32), np.zeros((3, 1, 4), np.float32)
    for bad in (True, 1, np.ones((2, 3), bool)):
        with pytest.raises(ValueError, match="AttentionMask"):
            K.attention(q, k, k, mask=bad)


# ---- what the ledger and cost.forward book ----

@pytest.mark.parametrize("mask", MASKS + WINDOWED, ids=str)
def test_ledger_books_the_pairs(mask):
    n, t, q_pos0, H, KVH, hd = 37, 150, 90, 6, 2, 16
    q, k = np.ones((n, H, hd), np.float32), np.ones((t, KVH, hd), np.float32)
    with Ledger() as led:
        K.attention(q, k, k, mask=mask, q_pos0=q_pos0)
    pairs = mask.pairs(n, t, q_pos0)
    assert led.passes[0]["by_op"]["attention"]["flops"] == 4 * hd * H * pairs
    assert led.passes[0]["flops"] == cost.attention(n, H, KVH, hd, t, pairs)[0]
    assert (pairs < n * t) == (mask.block != 0 or 0 < mask.window <= q_pos0 + n - 1)   # hidden pairs to skip


@pytest.fixture(scope="module")
def model():
    return tinydiff.load(os.path.join(HF, "llama-gqa"))


@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_cost_forward_equals_a_real_pass(model, mask):
    """A prompt of 5, then 9 more positions at 5..13 under the mask, then a span 3..8 recomputed
    reading all 14 slots (a diffusion step with a cache): each pass as cost.forward has it."""
    t = model.transformer
    state = t.state(14)
    ids = np.arange(3, 17).reshape(1, 14)
    with Ledger() as led:
        t.forward(ids[:, :5], state, 0, mask=mask)
        t.forward(ids[:, 5:], state, 5, mask=mask)
        t.forward(ids[:, 3:9], state, 3, kv_len=14, mask=mask)
    c = model.config
    assert led.passes == [cost.forward(c, 5, 0, mask, all_logits=True), cost.forward(c, 9, 5, mask, all_logits=True),
                          cost.forward(c, 6, 3, mask, n_kv=14, all_logits=True)]


def test_block_causal_pass_is_causal_across_blocks(model):
    """A block-causal pass over 12 positions in blocks of 4: its first block is a bidirectional pass
    over 4 positions, its first two blocks a block-causal pass over 8 (the third is unseen), and
    inside a block it is not the causal pass."""
    ids = list(range(3, 15))
    whole = model.logits(ids, mask=block_causal(4))
    np.testing.assert_allclose(whole[:4], model.logits(ids[:4], mask=BIDIRECTIONAL), rtol=0, atol=1e-4)
    np.testing.assert_allclose(whole[:8], model.logits(ids[:8], mask=block_causal(4)), rtol=0, atol=1e-4)
    assert np.abs(whole[:3] - model.logits(ids[:3])).max() > 1e-2
