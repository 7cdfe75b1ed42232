"""Pictures, SVG written by hand: the roofline with runs on it, and a training run's loss curves.

The roofline: runs placed against what this machine can do.

Log-log axes: arithmetic intensity (FLOPs per byte) across, GFLOP/s up. The memory bandwidth is the
slope GB/s x FLOPs/byte, the peak matmul rate the flat roof; they meet at the machine balance.
A run at (flops/bytes, flops/seconds) sits under the slope when memory-bound (autoregressive decode:
every weight read for one token) and climbs toward the roof as it reuses each byte more (diffusion
steps over a growing canvas). The dashed slope is the last-level-cache bandwidth.

SVG is written by hand (no dependency); PNG needs matplotlib, an optional extra.
"""
import math
import os
from xml.sax.saxutils import escape, quoteattr

from ..errors import UsageError
from .roofline import write_atomic

W, H = 760, 500                            # canvas, px
LEFT, RIGHT, TOP, BOTTOM = 70, 30, 40, 56  # margins around the plot area, px
XLABEL = "arithmetic intensity (FLOPs per byte)"


def _checked(points):
    """[(label, intensity, GFLOP/s)] from (label, flops, bytes, seconds), all three positive."""
    out = []
    for label, flops, nbytes, seconds in points:
        if not all(v > 0 and math.isfinite(v) for v in (flops, nbytes, seconds)):
            raise UsageError(f"plot: point {label!r} needs positive finite flops, bytes and seconds, "
                             f"got {flops}, {nbytes}, {seconds}")
        out.append((str(label), flops / nbytes, flops / seconds / 1e9))
    return out


def _decades(lo, hi):
    """(10^a, 10^b): whole decades around [lo, hi], with room to spare."""
    return 10.0 ** math.floor(math.log10(lo / 2)), 10.0 ** math.ceil(math.log10(hi * 2))


def _axes(r, pts):
    """x and y ranges holding the points, the ridge and the roofs."""
    xs = [x for _, x, _ in pts] + [v for v in (r.balance, r.llc_balance) if v]
    x0, x1 = _decades(min(xs, default=0.1), max(xs, default=100))
    ys = [y for _, _, y in pts] + [v for v in (r.peak_gflops, r.mem_gbs and r.mem_gbs * x0) if v]
    if r.mem_gbs and not r.peak_gflops:  # no roof: the slope runs to the right edge
        ys.append(r.mem_gbs * x1)
    y0, y1 = _decades(min(ys, default=1), max(ys, default=1000))
    return x0, x1, y0, y1


class _Frame:
    """Data (log-log) to pixels."""

    def __init__(self, x0, x1, y0, y1):
        self.x0, self.x1, self.y0, self.y1 = x0, x1, y0, y1

    def px(self, x):
        return LEFT + (W - LEFT - RIGHT) * math.log(x / self.x0) / math.log(self.x1 / self.x0)

    def py(self, y):
        return H - BOTTOM - (H - TOP - BOTTOM) * math.log(y / self.y0) / math.log(self.y1 / self.y0)


def _line(f, x0, y0, x1, y1, cls, style):
    return (f'<line class="{cls}" x1="{f.px(x0):.1f}" y1="{f.py(y0):.1f}" x2="{f.px(x1):.1f}" '
            f'y2="{f.py(y1):.1f}" {style}/>')


def _text(x, y, s, extra=""):
    return f'<text x="{x:.1f}" y="{y:.1f}" {extra}>{escape(s)}</text>'


def _grid(f):
    out, mid = [], (TOP + H - BOTTOM) / 2
    for e in range(round(math.log10(f.x0)), round(math.log10(f.x1)) + 1):
        v = 10.0 ** e
        out += [_line(f, v, f.y0, v, f.y1, "grid", 'stroke="#ddd"'),
                _text(f.px(v), H - BOTTOM + 16, f"{v:g}", 'text-anchor="middle"')]
    for e in range(round(math.log10(f.y0)), round(math.log10(f.y1)) + 1):
        v = 10.0 ** e
        out += [_line(f, f.x0, v, f.x1, v, "grid", 'stroke="#ddd"'),
                _text(LEFT - 6, f.py(v) + 4, f"{v:g}", 'text-anchor="end"')]
    out += [f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" '
            'fill="none" stroke="#444"/>',
            _text((LEFT + W - RIGHT) / 2, H - 14, XLABEL, 'text-anchor="middle"'),
            _text(18, mid, "GFLOP/s", f'text-anchor="middle" transform="rotate(-90 18 {mid})"')]
    return out


def _label(x, y, s, anchor, taken, angle=0.0):
    """Text with its baseline at (x, y), turned angle degrees up; its box (~7 px per character,
    12 px high, the bounds of the turned text) joins taken so point labels keep clear of it."""
    w, a = 7 * len(s), math.radians(angle)
    back = {"start": 0, "middle": w / 2, "end": w}[anchor]  # baseline length before (x, y)
    x0, y0 = x - back * math.cos(a), y + back * math.sin(a)
    x1, y1 = x0 + w * math.cos(a), y0 - w * math.sin(a)
    taken.append((min(x0, x1), min(y0, y1) - 11, max(x0, x1), max(y0, y1) + 2))
    turn = f' transform="rotate({-angle:.1f} {x:.1f} {y:.1f})"' if angle else ""
    return _text(x, y, s, f'text-anchor="{anchor}"{turn}')


def _slope(f, gbs, top, cls, name, style, taken):
    """The bandwidth line y = gbs * x from the left edge up to `top` GFLOP/s, labelled along it."""
    xa, xb = f.x0, min(top / gbs, f.x1)
    ya, top = gbs * xa, gbs * xb
    if ya < f.y0:  # starts below the plot: begin where it enters
        xa, ya = f.y0 / gbs, f.y0
    angle = math.degrees(math.atan2(f.py(ya) - f.py(top), f.px(xb) - f.px(xa)))
    xm = math.sqrt(xa * xb)  # halfway along, on log axes
    return [_line(f, xa, ya, xb, top, cls, style),
            _label(f.px(xm), f.py(gbs * xm) - 6, f"{name} {gbs:.1f} GB/s", "middle", taken, angle)]


def _roofs(f, r, taken):
    out = []
    peak = r.peak_gflops or f.y1
    if r.llc_gbs and r.llc_gbs * f.x0 < peak:
        out += _slope(f, r.llc_gbs, peak, "llc", r.llc_level, 'stroke="#888" stroke-dasharray="6 4"', taken)
    if r.mem_gbs:
        out += _slope(f, r.mem_gbs, peak, "memory", "memory", 'stroke="#1f5fa8" stroke-width="2.5"', taken)
    if r.peak_gflops:
        out += [_line(f, r.balance or f.x0, peak, f.x1, peak, "roof", 'stroke="#b3261e" stroke-width="2.5"'),
                _label(f.px(f.x1) - 4, f.py(peak) - 6, f"peak f32 matmul {peak:.1f} GFLOP/s", "end", taken)]
    if r.balance:
        out += [_line(f, r.balance, f.y0, r.balance, peak, "ridge", 'stroke="#444" stroke-dasharray="2 3"'),
                _label(f.px(r.balance) + 4, H - BOTTOM - 6, f"balance {r.balance:.1f} FLOPs/byte", "start", taken)]
    return out


# label spots tried around a point, in order: (dx, dy of the baseline, anchor)
_SPOTS = [(7, -6, "start"), (7, 16, "start"), (-7, -6, "end"), (-7, 16, "end"),
          (7, -22, "start"), (7, 32, "start"), (-7, -22, "end"), (-7, 32, "end")]


def _place(cx, cy, label, taken):
    """The first spot whose label box stays in the plot and clear of every box taken (which it
    joins); the first spot if none is free."""
    w = 7 * len(label)
    for dx, dy, anchor in _SPOTS:
        x = cx + dx if anchor == "start" else cx + dx - w
        box = (x, cy + dy - 11, x + w, cy + dy + 2)
        inside = LEFT <= box[0] and box[2] <= W - RIGHT and TOP <= box[1] and box[3] <= H - BOTTOM
        if inside and not any(b[0] < box[2] and box[0] < b[2] and b[1] < box[3] and box[1] < b[3] for b in taken):
            taken.append(box)
            return cx + dx, cy + dy, anchor
    return cx + 7, cy - 6, "start"


def _color(r, x):
    return "#888" if r.balance is None else "#1f5fa8" if x < r.balance else "#b3261e"


def _points(f, r, pts, taken):
    """A dot per point, blue when memory-bound, red when compute-bound (grey with no balance)."""
    out = []
    for _, x, y in pts:  # the dots first: no label covers a dot
        taken.append((f.px(x) - 5, f.py(y) - 5, f.px(x) + 5, f.py(y) + 5))
    for label, x, y in pts:
        color = _color(r, x)
        cx, cy = f.px(x), f.py(y)
        tx, ty, anchor = _place(cx, cy, label, taken)
        out.append(f'<g class="point" data-label={quoteattr(label)}>'
                   f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4.5" fill="{color}"/>'
                   + _text(tx, ty, label, f'text-anchor="{anchor}"') + "</g>")
    return out


def svg(r, points):
    """The SVG text of the roofline r with points [(label, flops, bytes, seconds)] on it."""
    pts = _checked(points)
    f = _Frame(*_axes(r, pts))
    title = f"roofline: {r.cpu}, {r.threads} thread{'s' * (r.threads != 1)}, {r.simd}"
    taken = []  # boxes of the labels drawn so far, [(x0, y0, x1, y1)] px
    body = _grid(f) + _roofs(f, r, taken) + _points(f, r, pts, taken)
    return "\n".join([f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
                      f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
                      f'<rect width="{W}" height="{H}" fill="white"/>',
                      _text(W / 2, 22, title, 'text-anchor="middle" font-size="14"'),
                      *body, "</svg>", ""])


def _png(r, pts, tmp):
    """The same picture through matplotlib (only for .png)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x0, x1, y0, y1 = _axes(r, pts)
    fig, ax = plt.subplots(figsize=(W / 100, H / 100), dpi=150)
    peak = r.peak_gflops or y1
    if r.llc_gbs:
        ax.plot([x0, peak / r.llc_gbs], [r.llc_gbs * x0, peak], "--", color="#888",
                label=f"{r.llc_level} {r.llc_gbs:.1f} GB/s")
    if r.mem_gbs:
        ax.plot([x0, peak / r.mem_gbs], [r.mem_gbs * x0, peak], color="#1f5fa8", lw=2.5,
                label=f"memory {r.mem_gbs:.1f} GB/s")
    if r.peak_gflops:
        ax.plot([r.balance or x0, x1], [peak, peak], color="#b3261e", lw=2.5,
                label=f"peak f32 matmul {peak:.1f} GFLOP/s")
    if r.balance:
        ax.axvline(r.balance, color="#444", ls=":", label=f"balance {r.balance:.1f} FLOPs/byte")
    for label, x, y in pts:
        ax.plot([x], [y], "o", color=_color(r, x))
        # turned 30 degrees, so the labels of points side by side do not run into each other
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8, rotation=30)
    ax.set(xscale="log", yscale="log", xlim=(x0, x1), ylim=(y0, y1), xlabel=XLABEL, ylabel="GFLOP/s",
           title=f"roofline: {r.cpu}, {r.threads} threads, {r.simd}")
    ax.grid(True, which="major", color="#ddd")
    ax.legend(loc="lower right", fontsize=8)
    fig.savefig(tmp, format="png", bbox_inches="tight")
    plt.close(fig)


def check_plot_path(path, png=True):
    """A picture can be written at path: .svg, or .png with matplotlib (png: the plot can draw one),
    in a writable folder. Its extension ('.svg' or '.png'). Called before a long measurement, so a
    bad path fails first."""
    ext = os.path.splitext(str(path))[1].lower()
    if ext not in ((".svg", ".png") if png else (".svg",)):
        raise UsageError(f"plot: {path} must end in .svg or .png" if png else f"plot: {path} must end in .svg")
    if ext == ".png":
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError(f"plot: {path}: PNG needs matplotlib (pip install matplotlib); "
                             "or give a .svg path") from None
    folder = os.path.dirname(os.path.abspath(str(path)))
    if os.path.isdir(str(path)) or not os.path.isdir(folder):
        raise UsageError(f"plot: cannot write {path}: "
                         f"{'a folder' if os.path.isdir(str(path)) else 'no folder ' + folder}")
    probe = f"{os.path.abspath(str(path))}.{os.getpid()}.probe"    # a file made and removed: root passes
    try:                                                            # os.access on /proc, and cannot write there
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"plot: cannot write {path}: {e.strerror}") from None
    return ext


def roofline_svg(roofline, points, path):
    """Draw roofline with points [(label, flops, bytes, seconds)] into path: SVG, or PNG when
    path ends in .png (needs matplotlib). Written atomically."""
    if check_plot_path(path) == ".png":
        pts = _checked(points)
        _write(path, lambda tmp: _png(roofline, pts, tmp))
    else:
        _write_text(path, svg(roofline, points))


def _write_text(path, text):
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    _write(path, write)


def _write(path, write):
    """write(tmp) into a temporary file renamed to path: a reader never sees half a picture."""
    try:
        write_atomic(str(path), write)
    except OSError as e:
        raise UsageError(f"plot: cannot write {path}: {e.strerror or e}") from None


# -- loss curves (the model cards in weights/) --------------------------------------------------

def _frame(title, xlabel, ylabel):
    """The opening lines of a one-panel SVG: canvas, title, plot frame, axis labels."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
            'font-family="sans-serif" font-size="12">', f'<rect width="{W}" height="{H}" fill="white"/>',
            _text(W / 2, 22, title, 'text-anchor="middle" font-size="14"'),
            f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" '
            'fill="none" stroke="#444"/>',
            _text((LEFT + W - RIGHT) / 2, H - 14, xlabel, 'text-anchor="middle"'),
            _text(18, (TOP + H - BOTTOM) / 2, ylabel,
                  f'text-anchor="middle" transform="rotate(-90 18 {(TOP + H - BOTTOM) / 2})"')]


def loss_svg(rows, title, path):
    """Train and validation loss (nats/token) against training tokens, from a trainer's log.csv rows
    (dicts with tokens, train_loss, val_loss; empty = not measured at that step). Written atomically."""
    series = [(key.replace("_", " "), color, [(float(r["tokens"]) / 1e6, float(r[key])) for r in rows if r.get(key)])
              for key, color in (("train_loss", "#1f5fa8"), ("val_loss", "#b3261e"))]
    curves_svg(series, title, "training tokens (millions)", "loss (nats/token)", path)


def curves_svg(series, title, xlabel, ylabel, path):
    """Lines [(label, color, [(x, y)])] on one axis from x = 0, y over whole units. Written atomically."""
    check_plot_path(path, png=False)
    pts = [p for _, _, s in series for p in s]
    if not pts:
        raise UsageError(f"plot: no losses to draw for {path}")
    x1 = max(x for x, _ in pts) or 1.0
    y0, y1 = math.floor(min(y for _, y in pts)), math.ceil(max(y for _, y in pts))
    step = 0.25 if y1 - y0 <= 2 else 1
    px = lambda x: LEFT + (W - LEFT - RIGHT) * x / x1                          # noqa: E731
    py = lambda y: H - BOTTOM - (H - TOP - BOTTOM) * (y - y0) / max(y1 - y0, 1)  # noqa: E731
    out = _frame(title, xlabel, ylabel)
    for k in range(round((y1 - y0) / step) + 1):
        y = y0 + k * step
        out += [f'<line x1="{LEFT}" y1="{py(y):.1f}" x2="{W - RIGHT}" y2="{py(y):.1f}" stroke="#ddd"/>',
                _text(LEFT - 6, py(y) + 4, f"{y:g}", 'text-anchor="end"')]
    for i in range(0, math.floor(x1) + 1, max(1, math.ceil(x1 / 10))):
        out.append(_text(px(i), H - BOTTOM + 16, str(i), 'text-anchor="middle"'))
    for n, (label, color, s) in enumerate(series):
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s)
        cls = label.replace(" ", "_")
        out += [f'<polyline class="{cls}" fill="none" stroke="{color}" stroke-width="2" points="{line}"/>',
                _text(W - RIGHT - 10, TOP + 18 + 16 * n, label, f'text-anchor="end" fill="{color}"')]
    _write_text(path, "\n".join(out + ["</svg>", ""]))


# -- time against quality (tinydiff compare) ------------------------------------------------------

GROUP_COLORS = ("#1f5fa8", "#c0392b", "#2e8b57", "#8e44ad")


def tradeoff_svg(points, path, title="time per token against judged perplexity (lower left is better)"):
    """points [(label, ms per generated token, judged perplexity[, group])] on a linear time axis
    from 0 and a log perplexity axis; a group has a colour of its own (named in a legend when
    there are several), an empty label no text. Written atomically."""
    check_plot_path(path)
    pts = [(p[0], float(p[1]), float(p[2]), p[3] if len(p) > 3 else "") for p in points
           if p[1] > 0 and p[2] > 0 and math.isfinite(p[2])]
    if not pts:
        raise UsageError(f"plot: no points to draw for {path}")
    x1 = max(p[1] for p in pts) * 1.15
    y0, y1 = _decades(min(p[2] for p in pts), max(p[2] for p in pts))
    groups = list(dict.fromkeys(p[3] for p in pts))
    px = lambda x: LEFT + (W - LEFT - RIGHT) * x / x1                                          # noqa: E731
    py = lambda y: H - BOTTOM - (H - TOP - BOTTOM) * math.log10(y / y0) / math.log10(y1 / y0)  # noqa: E731
    out = _frame(title, "measured ms per generated token", "judged perplexity")
    y = y0
    while y <= y1 * 1.0001:
        out += [f'<line x1="{LEFT}" y1="{py(y):.1f}" x2="{W - RIGHT}" y2="{py(y):.1f}" stroke="#ddd"/>',
                _text(LEFT - 6, py(y) + 4, f"{y:g}", 'text-anchor="end"')]
        y *= 10
    for i in range(6):
        x = x1 * i / 5
        out.append(_text(px(x), H - BOTTOM + 16, f"{x:.2g}", 'text-anchor="middle"'))
    for label, x, y, group in pts:
        right = px(x) > (LEFT + W - RIGHT) / 2                  # a label on the right half reads leftwards
        color = GROUP_COLORS[groups.index(group) % len(GROUP_COLORS)]
        out.append(f'<circle class="point" cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="{color}"/>')
        if label:
            out.append(_text(px(x) + (-7 if right else 7), py(y) - 6, label, 'text-anchor="end"' if right else ""))
    for i, group in enumerate(groups if len(groups) > 1 else ()):   # the legend, top right
        out += [f'<circle cx="{W - RIGHT - 150}" cy="{TOP + 12 + 16 * i}" r="4" '
                f'fill="{GROUP_COLORS[i % len(GROUP_COLORS)]}"/>', _text(W - RIGHT - 140, TOP + 16 + 16 * i, group)]
    _write_text(path, "\n".join(out + ["</svg>", ""]))
