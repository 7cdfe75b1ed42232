"""How many blanks in held-out text a model gives back exactly (`tinydiff eval --infill`).

Takes a loaded model, causal or bidirectional (one with a mask token: the command checks it), and
paragraphs; guarantees (holes, correct) counts, the holes drawn from the seed alone.

--infill RATES: in each paragraph of the first --max-stories stories (default 300), that share of
its tokens (at least one) hidden at seeded places; a bidirectional model fills them by
Model.infill (one token a step, greedy), a causal one left to right from what is left of each
hole; the accuracy is the share of holes given back the very token that was there.
"""
import numpy as np

from .sequences import story_seqs


def infill_accuracy(model, texts, rate, seed=0):
    """(holes, correct) over texts (scored as story_seqs' paragraphs: [EOT] text, cut to the
    context). In each, round(rate * n) of its n tokens (at least one) become holes at seeded
    random places. A bidirectional model fills them with Model.infill (one token a step, the most
    confident first, greedy); a causal one left to right, each hole the argmax given everything
    left of it, its own earlier fills included (it cannot see to the right). correct: holes given
    back the very token that was there."""
    holes = correct = 0
    ctx = model.config.max_position_embeddings
    for i, seq in enumerate(story_seqs(model, texts, unit="paragraph")):
        ids = seq.ids[:ctx].copy()
        n = len(ids) - 1
        k = max(1, round(rate * n))
        where = 1 + np.sort(np.random.default_rng([seed, i]).choice(n, size=k, replace=False))
        filled = _fill(model, ids, where)
        holes, correct = holes + k, correct + int((filled[where] == ids[where]).sum())
    return holes, correct


def _fill(model, ids, where):
    """ids with the positions `where` filled by the model (infill_accuracy's two ways)."""
    if model.config.causal:
        out = ids.copy()
        for h in where:
            out[h] = int(np.argmax(model.logits(out[:h])[-1]))
        return out
    canvas = ids.copy()
    canvas[where] = model.mask_id
    return np.asarray(model.infill(canvas.tolist()), np.int64)
