"""The pictures (tinydiff.measure.plot): the roofline as well-formed SVG, points on the right side of the ridge,
PNG only with matplotlib, written atomically; a training log's loss curves."""
import builtins
import os
import xml.etree.ElementTree as ET

import pytest

from tinydiff.errors import UsageError
from tinydiff.measure import plot as P
from tinydiff.measure.roofline import Roofline

NS = {"svg": "http://www.w3.org/2000/svg"}
# 20 GB/s, 200 GFLOP/s: balance 10 FLOPs per byte
ROOF = Roofline(mem_gbs=20.0, llc_gbs=60.0, peak_gflops=200.0, balance=10.0, llc_balance=200 / 60,
                cpu="Test CPU <&>", threads=2, simd="avx2", when="now", llc_level="L3")
# (label, flops, bytes, seconds): decode reads 1 GB for 0.5 GFLOP; a canvas of 256 does 128 GFLOP
POINTS = [("AR decode", 0.5e9, 1e9, 0.06),
          ("diffusion L=64", 32e9, 1.1e9, 0.3),
          ("diffusion L=256 <dual>", 128e9, 1.3e9, 0.8)]


def points_of(path):
    root = ET.parse(path).getroot()
    ridge = float(root.find("svg:line[@class='ridge']", NS).get("x1"))
    dots = {g.get("data-label"): float(g.find("svg:circle", NS).get("cx"))
            for g in root.findall("svg:g[@class='point']", NS)}
    return root, ridge, dots


def test_svg_is_xml_with_every_label_on_its_side_of_the_ridge(tmp_path):
    path = tmp_path / "roofline.svg"
    P.roofline_svg(ROOF, POINTS, path)
    root, ridge, dots = points_of(path)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    for label, *_ in POINTS:
        assert label in texts
    assert "memory 20.0 GB/s" in texts and "peak f32 matmul 200.0 GFLOP/s" in texts and "balance 10.0" in texts
    assert dots["AR decode"] < ridge < dots["diffusion L=64"] < dots["diffusion L=256 <dual>"]
    assert os.listdir(tmp_path) == ["roofline.svg"]


def test_higher_rate_is_drawn_higher(tmp_path):
    path = tmp_path / "r.svg"
    P.roofline_svg(ROOF, [("slow", 1e9, 1e8, 1.0), ("fast", 1e9, 1e8, 0.01)], path)
    root = ET.parse(path).getroot()
    cy = {g.get("data-label"): float(g.find("svg:circle", NS).get("cy")) for g in root.findall("svg:g", NS)}
    assert cy["fast"] < cy["slow"]  # SVG y grows downward


def test_a_roofline_with_failed_measurements_still_draws(tmp_path):
    partial = Roofline(mem_gbs=20.0, llc_gbs=None, peak_gflops=None, balance=None, llc_balance=None,
                       cpu="x", threads=1, simd="c", when="now")
    for r in (partial, Roofline(None, None, None, None, None, "x", 1, "c", "now")):
        P.roofline_svg(r, POINTS, tmp_path / "p.svg")
        ET.parse(tmp_path / "p.svg")
    P.roofline_svg(ROOF, [], tmp_path / "empty.svg")
    ET.parse(tmp_path / "empty.svg")


def test_bad_points_and_paths_are_one_line_errors(tmp_path):
    with pytest.raises(UsageError, match="'zero'"):
        P.roofline_svg(ROOF, [("zero", 1e9, 0, 1.0)], tmp_path / "a.svg")
    with pytest.raises(UsageError, match="'inf'"):
        P.roofline_svg(ROOF, [("inf", float("inf"), 1e9, 1.0)], tmp_path / "a.svg")
    with pytest.raises(UsageError, match=r"\.svg or \.png"):
        P.roofline_svg(ROOF, POINTS, tmp_path / "a.pdf")
    with pytest.raises(UsageError, match="cannot write"):
        P.roofline_svg(ROOF, POINTS, tmp_path / "no" / "such" / "dir.svg")
    with pytest.raises(UsageError, match="cannot write"):                  # no one writes there, root included
        P.check_plot_path("/proc/tinydiff-plot.svg")
    with pytest.raises(UsageError, match=r"must end in \.svg$"):           # it draws SVG only, never a .png
        P.curves_svg([("a", "#000", [(1, 2)])], "t", "x", "y", tmp_path / "a.png")
    assert os.listdir(tmp_path) == []


def test_png_without_matplotlib_says_what_to_do(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(UsageError, match="matplotlib.*svg") as e:
        P.roofline_svg(ROOF, POINTS, tmp_path / "r.png")
    assert "\n" not in str(e.value) and os.listdir(tmp_path) == []


def test_png_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    P.roofline_svg(ROOF, POINTS, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(tmp_path) == ["r.png"]


def test_loss_curves_follow_the_log(tmp_path):
    rows = [{"tokens": "0", "train_loss": "", "val_loss": "7.5"},
            {"tokens": "1000000", "train_loss": "4.0", "val_loss": "3.5"},
            {"tokens": "2000000", "train_loss": "2.0", "val_loss": "2.5"}]
    path = tmp_path / "loss.svg"
    P.loss_svg(rows, "run: loss", path)
    root = ET.parse(path).getroot()
    lines = {p.get("class"): [tuple(map(float, xy.split(","))) for xy in p.get("points").split()]
             for p in root.findall("svg:polyline", NS)}
    assert len(lines["train_loss"]) == 2 and len(lines["val_loss"]) == 3   # the empty train loss is skipped
    (x0, y0), (x1, y1), (x2, y2) = lines["val_loss"]
    assert x0 < x1 < x2 and y0 < y1 < y2                                   # more tokens further right; lower loss lower down (y px grows downward)
    assert lines["train_loss"][0][0] == x1                                 # same tokens, same x
    with pytest.raises(UsageError, match="no losses"):
        P.loss_svg([{"tokens": "0", "train_loss": "", "val_loss": ""}], "t", tmp_path / "none.svg")
