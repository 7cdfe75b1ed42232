"""The cost ledger: FLOPs and bytes, booked by each kernel call where it is made.

    with tinydiff.Ledger() as led:
        model.generate("Once upon a time", 16)
    print(led.table())

Every forward pass opens an entry in `led.passes`:

    {"tokens": positions processed,
     "flops": int,
     "bytes": {"weights": .., "kv_read": .., "kv_write": .., "activations": ..},
     "by_op": {"matmul": {"flops": .., "bytes": {...}}, "attention": ..., "norm": ..., "rope": ...,
               "mlp": ..., "lm_head": ..., "embedding": ..., "residual": ...}}

A pass run under `with ledger.role(name):` also says what it was for, "role": "verify" (speculative
decoding's pass over the newest token and k drafts: k+1 rows, logits for each) or "draft" (a drafter
model's); other passes have no "role". `led.speculative` counts speculative decoding's rounds and the
tokens drafted and accepted in them ({"rounds", "drafted", "accepted"}; rejected = drafted - accepted).

The kernel wrappers (kernels.py) book into the open pass; the sampler books its work under
"sampling" in `led.sampling`, outside the passes (a pass is the model's forward alone, so it can be
compared with cost.forward). `led.total()` sums the passes and the sampling in the same shape.

A ledger sees only the thread that opened it: two threads generating at once each count their own.
Ledgers nest: an inner ledger's costs are also booked in every ledger around it. With no ledger
open, booking is one attribute lookup; with one open, it appends to a list, and the sums are made
when `passes` is read (booking sits in the decode loop; reading the ledger does not).
"""
import threading

from ..errors import UsageError

BYTE_KINDS = ("weights", "kv_read", "kv_write", "activations")


class _Local(threading.local):
    stack = ()   # this thread's open ledgers, innermost last (a class default: reading it is cheap)
    role = None  # what the passes begun now are for (role())


_local = _Local()


def _empty():
    return {"flops": 0, "bytes": dict.fromkeys(BYTE_KINDS, 0)}


def _add(into, flops, nbytes):
    into["flops"] += flops
    for kind, n in nbytes.items():
        into["bytes"][kind] += n


def begin_pass(tokens):
    """Opens a new pass entry in every open ledger (transformer.forward calls this first)."""
    for led in _local.stack:
        led._log.append((None, (tokens, _local.role)))


class role:
    """`with role("verify"):` marks the passes begun in the block with that role (nested: the innermost)."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.outer, _local.role = _local.role, self.name

    def __exit__(self, *exc):
        _local.role = self.outer


def book_draft(drafted, accepted):
    """Books one speculative round: `drafted` tokens proposed, the first `accepted` of them taken."""
    for led in _local.stack:
        s = led.speculative
        s["rounds"], s["drafted"], s["accepted"] = s["rounds"] + 1, s["drafted"] + drafted, s["accepted"] + accepted


def book(op, cost):
    """Books one operation's cost, (flops, {byte kind: bytes}) as tinydiff.engine.cost gives it, in the
    current pass of every open ledger."""
    for led in _local.stack:
        led._log.append((op, cost))


def book_all(entries):
    """book(op, cost) for each (op, cost) of entries."""
    for led in _local.stack:
        led._log.extend(entries)


def book_sampling(cost):
    """Books the sampler's work, (flops, {byte kind: bytes}): it reads logits, it runs no model."""
    flops, nbytes = cost
    for led in _local.stack:
        _add(led.sampling, flops, nbytes)


def active():
    return bool(_local.stack)


class Ledger:
    def __init__(self):
        self._log = []          # [(op, (flops, bytes))] as booked; op None: a new pass of `tokens` positions
        self._passes = []       # the log summed up to _summed
        self._summed = 0
        self.sampling = _empty()
        self.speculative = {"rounds": 0, "drafted": 0, "accepted": 0}

    @property
    def passes(self):
        """One dict per forward pass (module docstring); costs booked before any pass make one of 0 tokens."""
        for op, cost in self._log[self._summed:]:
            if op is None:
                tokens, role = cost
                self._passes.append({"tokens": tokens, **_empty(), "by_op": {}, **({"role": role} if role else {})})
                continue
            if not self._passes:
                self._passes.append({"tokens": 0, **_empty(), "by_op": {}})
            entry = self._passes[-1]
            _add(entry, *cost)
            _add(entry["by_op"].setdefault(op, _empty()), *cost)
        self._summed = len(self._log)
        return self._passes

    def __enter__(self):
        if self in _local.stack:
            raise UsageError("this Ledger is already open: a ledger is entered once at a time")
        if not _local.stack:
            _local.stack = []
        _local.stack.append(self)
        return self

    def __exit__(self, *exc):
        if self not in _local.stack:
            raise UsageError("this Ledger is not open in this thread: leave it once, where it was entered")
        _local.stack.remove(self)

    def total(self):
        """All passes and the sampling summed, in the shape of one pass (tokens: positions processed)."""
        passes = self.passes
        total = {"tokens": sum(p["tokens"] for p in passes), **_empty(), "by_op": {}}
        for p in passes:
            _add(total, p["flops"], p["bytes"])
            for op, cost in p["by_op"].items():
                _add(total["by_op"].setdefault(op, _empty()), cost["flops"], cost["bytes"])
        if self.sampling["flops"] or any(self.sampling["bytes"].values()):
            _add(total, self.sampling["flops"], self.sampling["bytes"])
            total["by_op"]["sampling"] = {"flops": self.sampling["flops"], "bytes": dict(self.sampling["bytes"])}
        return total

    def table(self):
        """The totals per operation: FLOPs, bytes by kind, arithmetic intensity."""
        t = self.total()
        head = f"{'op':11s} {'GFLOP':>9s} " + " ".join(f"{k + ' MB':>14s}" for k in BYTE_KINDS) + f" {'FLOP/B':>8s}"
        rows = [head, "-" * len(head)]
        for op, cost in sorted(t["by_op"].items(), key=lambda kv: -kv[1]["flops"]) + [("total", t)]:
            nbytes = sum(cost["bytes"].values())
            rows.append(f"{op:11s} {cost['flops'] / 1e9:9.4f} "
                        + " ".join(f"{cost['bytes'][k] / 1e6:14.3f}" for k in BYTE_KINDS)
                        + f" {cost['flops'] / nbytes if nbytes else 0:8.2f}")
        rows.append(f"{len(self.passes)} forward passes, {t['tokens']} positions processed")
        s = self.speculative
        if s["rounds"]:
            verify = [p["tokens"] for p in self.passes if p.get("role") == "verify"]
            draft = sum(p.get("role") == "draft" for p in self.passes)
            rows.append(f"speculative: {s['rounds']} verify passes ({sum(verify)} rows), {draft} draft passes; "
                        f"{s['drafted']} drafted, {s['accepted']} accepted, {s['drafted'] - s['accepted']} rejected")
        return "\n".join(rows)
