"""The pictures' numbers (capdiag.bars) and the terminal bars in the text report."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capdiag import bars
from capdiag.analysis import analyse
from capdiag.render import render
from capdiag.report import build
from helpers import fixture

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def report(segments_by_rank, total=None, **extra):
    """A minimal report dict: what the bars read."""
    ranks = [{"label": f"TP{i}", "target": i == 0, "binding": i == len(segments_by_rank) - 1,
              "segments": [{"category": c, "gib": g} for c, g in segs]} for i, segs in enumerate(segments_by_rank)]
    return {"gpu": {"total_gib": total}, "ranks": ranks, **extra}


# ---- allocate -----------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1000, allow_nan=False), min_size=1, max_size=11),
       st.integers(min_value=1, max_value=200))
def test_allocate_sums_to_the_width(values, width):
    cells = bars.allocate(values, width)
    assert len(cells) == len(values) and all(c >= 0 for c in cells)
    if sum(values) > 0:
        assert sum(cells) == width
    else:
        assert sum(cells) == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0.5, max_value=500, allow_nan=False), min_size=1, max_size=8))
def test_allocate_is_proportional(values):
    """Every share within one cell of its exact value when no share is below one cell."""
    width = 60
    total = sum(values)
    if any(v * width / total < 1 for v in values):
        return
    for v, c in zip(values, bars.allocate(values, width)):
        assert abs(c - v * width / total) < 1


def test_allocate_keeps_tiny_segments_visible():
    cells = bars.allocate([50.0, 0.1, 29.9], 60)
    assert sum(cells) == 60 and cells[1] == 1
    assert bars.allocate([0.0, 0.0], 10) == [0, 0]
    assert bars.allocate([-3.0, 6.0], 10) == [0, 10]  # negative counts as nothing drawn


def test_allocate_example():
    # 15.1 weights, 48.82 KV, 1.6 graphs, 12.4 free of 77.92 GiB over 60 cells
    assert bars.allocate([15.1, 48.82, 1.6, 12.4], 60) == [12, 38, 1, 9]  # exact 11.63, 37.59, 1.23, 9.55


# ---- rank bars ----------------------------------------------------------------------------

def test_known_total_draws_every_rank_to_one_scale():
    r = report([[("weights", 40.0), ("kv_cache", 30.0), ("free", 10.0)], [("weights", 40.0)]], total=80.0)
    tb = bars.text_bars(r, width=80)
    assert tb["common_scale"] and tb["cell_gib"] == 1.0
    first, second = tb["rows"]
    assert first["plain"] == "W" * 40 + "K" * 30 + "." * 10
    # the second rank states only its weights: the rest of the total is drawn as not stated
    assert second["plain"] == "W" * 40 + "?" * 40
    assert [s["category"] for s in second["segments"]] == ["weights", "unstated"]
    assert second["segments"][1]["gib"] == 40.0


def test_unstated_sits_before_free():
    parts = bars.rank_parts({"segments": [{"category": "weights", "gib": 10.0}, {"category": "free", "gib": 5.0}]},
                            total=20.0)
    assert [s["category"] for s in parts["segments"]] == ["weights", "unstated", "free"]


def test_unknown_total_draws_each_rank_against_its_own_sum():
    r = report([[("weights", 10.0), ("kv_cache", 30.0)], [("weights", 5.0), ("kv_cache", 5.0)]])
    tb = bars.text_bars(r, width=40)
    assert not tb["common_scale"] and tb["cell_gib"] is None
    assert [row["against"] for row in tb["rows"]] == ["rank_sum", "rank_sum"]
    assert tb["rows"][0]["plain"] == "W" * 10 + "K" * 30
    assert tb["rows"][1]["plain"] == "W" * 20 + "K" * 20
    assert all("unstated" not in [s["category"] for s in row["segments"]] for row in tb["rows"])


def test_figures_over_the_total_stretch_the_scale():
    r = report([[("weights", 60.0), ("free", 40.0)], [("weights", 60.0)]], total=90.0)
    tb = bars.text_bars(r, width=50)
    assert tb["scale_gib"] == 100.0 and tb["any_over_total"]
    first, second = tb["rows"]
    assert first["over_total"] and first["plain"] == "W" * 30 + "." * 20
    # 60 weights + 30 not stated = the 90 GiB total = 45 of 50 cells; the rest is blank
    assert second["plain"] == "W" * 30 + "?" * 15 + " " * 5
    svg = bars.bars_svg(r)
    assert svg["total_x"] == pytest.approx(svg["bar_x"] + svg["bar_width"] * 0.9)


def test_empty_rank_and_negative_segment():
    r = report([[], [("weights", 10.0), ("unattributed", -0.5), ("free", 10.0)]], total=20.0)
    tb = bars.text_bars(r, width=20)
    assert tb["rows"][0]["empty"] and len(tb["rows"][0]["plain"]) == 20
    second = tb["rows"][1]
    assert second["plain"] == "W" * 10 + "." * 10
    assert next(s for s in second["segments"] if s["category"] == "unattributed")["negative"]


def test_plain_and_coloured_bars():
    r = report([[("framework", 1.0), ("weights", 20.0), ("kv_cache", 30.0), ("cuda_graph", 2.0), ("free", 7.0)]],
               total=60.0)
    plain = bars.text_bars(r, color=False)
    coloured = bars.text_bars(r, color=True)
    assert "\x1b" not in plain["rows"][0]["bar"] and all("\x1b" not in i["key"] for i in plain["legend"])
    bar = coloured["rows"][0]["bar"]
    assert "\x1b[34m" in bar and "\x1b[32m" in bar and bar.endswith(bars.RESET)
    stripped = ANSI.sub("", bar)
    assert len(stripped) == bars.TEXT_WIDTH and set(stripped) <= {"█", "▓", "░", "·"}
    # the same cells either way
    assert coloured["rows"][0]["cells"] == plain["rows"][0]["cells"]
    assert [i["category"] for i in plain["legend"]] == ["framework", "weights", "kv_cache", "cuda_graph", "free"]
    assert [i["key"] for i in plain["legend"]] == ["F", "W", "K", "G", "."]


# ---- the text report ----------------------------------------------------------------------

def _section(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("MEMORY PER RANK"))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].strip())
    return lines[start:end]


def test_text_report_draws_a_bar_per_rank():
    rep = build(analyse(fixture("mla_tp2.log"), gpu_total_gib=80))
    text = render(rep, "text", width=120)  # room for full-width bars
    assert text == render(rep, "text", color=False, width=120) and "\x1b" not in text
    section = _section(text)
    assert "to scale" in section[0] and "one character ≈ 1.33 GiB" in section[0]
    rows = [line for line in section[1:] if "|" in line]
    assert len(rows) == len(rep["ranks"]) == 2
    for line, rank in zip(rows, rep["ranks"]):
        assert line.split()[0] == rank["label"]
        assert len(line.split("|")[1]) == bars.TEXT_WIDTH
    assert "◀ target" in rows[0]
    binding = next(i for i, rk in enumerate(rep["ranks"]) if rk["binding"])
    assert "◀ binding" in rows[binding]
    assert "K KV cache" in section[-1] and "W weights" in section[-1]


def test_text_report_in_colour():
    rep = build(analyse(fixture("mla_tp2.log"), gpu_total_gib=80))
    coloured = render(rep, "text", color=True)
    assert "\x1b[" in coloured
    # colour changes the bars only: without the escapes and glyphs the rest of the report is the same
    plain = render(rep, "text")
    strip = lambda t: [line for line in ANSI.sub("", t).splitlines() if "|" not in line and "█" not in line]
    assert strip(coloured) == [line for line in plain.splitlines() if "|" not in line and "W weights" not in line]


def test_text_report_says_when_the_total_is_unknown():
    rep = build(analyse(fixture("mla_tp2.log")))
    header = _section(render(rep, "text"))[0]
    assert "GPU total unknown" in header and "own stated sum" in header


# ---- concurrency chart, ticks, excerpts -----------------------------------------------------

def test_concurrency_chart_follows_the_pool():
    rows = [{"request_tokens": L, "token_limit": 415615 // L, "request_limit": 64,
             "max_concurrent": min(415615 // L, 64), "binding": "tokens", "upper_bound": False}
            for L in (4096, 6144, 8192)]
    chart = bars.concurrency_chart({"concurrency": rows, "kv_pool": {"tokens": 415615}})
    assert chart["pool_tokens"] == 415615 and chart["from_tokens"] == 4096 and chart["to_tokens"] == 8192
    pts = [tuple(map(float, p.split(","))) for p in chart["token_points"].split()]
    assert len(pts) >= 10 and pts == sorted(pts)  # sampled left to right
    mins = [tuple(map(float, p.split(","))) for p in chart["min_points"].split()]
    assert all(m[1] >= t[1] - 1e-9 for m, t in zip(mins, pts))  # min never above the token curve (SVG y grows down)
    assert chart["request_limit"]["value"] == 64 and not chart["request_limit"]["clipped"]
    assert [m["max_concurrent"] for m in chart["markers"]] == [64, 64, 50]
    top = float(chart["y_ticks"][-1]["label"])
    for m in chart["markers"]:  # y of a point is its value over the axis top
        assert m["y"] == pytest.approx(chart["bottom"] - (chart["bottom"] - chart["top"]) * m["max_concurrent"] / top,
                                       abs=0.1)


def test_concurrency_chart_absent_without_numbers():
    rows = [{"request_tokens": 4096, "token_limit": None, "request_limit": None, "max_concurrent": None}]
    assert bars.concurrency_chart({"concurrency": rows, "kv_pool": {}}) is None


def test_nice_ticks():
    assert bars.nice_ticks(79.65) == [0, 20, 40, 60, 80]
    assert bars.nice_ticks(321) == [0, 100, 200, 300, 400]
    assert bars.nice_ticks(6) == [0, 2, 4, 6]


def test_excerpts_hold_every_cited_line_once():
    rep = build(analyse(fixture("oom_capture.log"), gpu_total_gib=23.56))
    blocks = bars.excerpts(rep)
    anchors = [row["anchor"] for block in blocks for row in block]
    assert len(anchors) == len(set(anchors))
    cited = {e["line"] for f in rep["findings"] for e in f["evidence"] if e["source"] == "log" and e["line"] > 0}
    assert cited and {f"L{n}" for n in cited} <= set(anchors)
    lines = [row["line"] for block in blocks for row in block]
    assert lines == sorted(lines)
