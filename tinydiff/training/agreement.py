"""How closely a model follows a reference model (`tinydiff eval --against`): KL and top-1 agreement.

Takes two loaded autoregressive models that share a tokenizer (the command checks it) and the
stories to score; guarantees an Agreement over the same next-token predictions of both.

--against REF_DIR: on the held-out text, the mean KL(ref || model) of the next-token distributions
and the top-1 agreement (the two argmaxes equal), as llama.cpp's perplexity --kl-divergence reports
them; both autoregressive, same tokenizer, all in float64.
"""
import dataclasses
import math

import numpy as np

from .sequences import causal_rows, log_softmax, story_bytes, story_seqs


@dataclasses.dataclass
class Agreement:
    tokens: int
    bytes: int
    model_nats: float
    ref_nats: float
    kl: np.ndarray          # [tokens] float64 KL(ref || model) per predicted position
    same_top1: np.ndarray   # [tokens] bool

    def as_dict(self):
        n, kl, p = self.tokens, self.kl, self.same_top1.mean()
        return {"tokens": n, "bytes": self.bytes,
                "model_nats_per_token": self.model_nats / n, "ref_nats_per_token": self.ref_nats / n,
                "model_bits_per_byte": self.model_nats / math.log(2) / self.bytes,
                "ref_bits_per_byte": self.ref_nats / math.log(2) / self.bytes,
                "kl_mean": float(kl.mean()), "kl_se": float(kl.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan"),
                "kl_median": float(np.median(kl)), "kl_p99": float(np.percentile(kl, 99)), "kl_max": float(kl.max()),
                "top1_agreement": float(p), "top1_se": float(math.sqrt(p * (1 - p) / n))}


def against(model, ref, stories, limit=None, unit="story"):
    seqs = story_seqs(model, stories, limit, unit)
    ctx = min(model.config.max_position_embeddings, ref.config.max_position_embeddings)
    kl, same, nats, ref_nats = [], [], 0.0, 0.0
    # both models run the same windows in the same order, so their rows line up
    for (_, targets, logits), (_, _, ref_logits) in zip(causal_rows(model, seqs, ctx), causal_rows(ref, seqs, ctx)):
        lp, lq = log_softmax(logits), log_softmax(ref_logits)       # [m, V] model, reference
        kl.append((np.exp(lq) * (lq - lp)).sum(axis=1))
        same.append(lp.argmax(axis=1) == lq.argmax(axis=1))
        rows = np.arange(len(targets))
        nats -= lp[rows, targets].sum()
        ref_nats -= lq[rows, targets].sum()
    kl, same = np.concatenate(kl), np.concatenate(same)
    return Agreement(len(kl), story_bytes(stories[:limit], unit), nats, ref_nats, kl, same)
