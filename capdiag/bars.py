"""The numbers behind the pictures: per-rank stacked bars (terminal and SVG), the concurrency
chart, and the log excerpts evidence links land on.

Everything numeric the templates draw — bar widths, shares, colours, chart coordinates, axis
ticks — is computed here from the report dict; the templates only lay the results out and
hold the wording. Nothing here reads the log or decides anything the rules did not conclude.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional

from capdiag.vocabulary import SEGMENTS

# Stacked order, bottom (left) to top (right): a rank's segments, with the part of the GPU total
# no rank figure accounts for drawn below the free memory.
UNSTATED = "unstated"
DRAW_ORDER = (*SEGMENTS[:-1], UNSTATED, "free")

# category: (plain letter, coloured glyph, ANSI SGR colour, light fill, dark fill).
# The fills follow the Okabe–Ito colour-blind-safe palette; drafts are paler tints of their
# target-model counterparts.
STYLE: dict[str, tuple[str, str, str, str, str]] = {
    "framework": ("F", "█", "35", "#cc79a7", "#d98fbb"),
    "weights": ("W", "█", "34", "#0072b2", "#3a9ad9"),
    "kv_cache": ("K", "█", "32", "#009e73", "#2fbf8f"),
    "mamba_state": ("M", "█", "36", "#56b4e9", "#7cc8f2"),
    "cuda_graph": ("G", "█", "33", "#e69f00", "#f0b429"),
    "draft_weights": ("w", "▓", "94", "#7fb8d8", "#8fc3e6"),
    "draft_kv_cache": ("k", "▓", "92", "#7fcfb9", "#8fdcc6"),
    "draft_cuda_graph": ("g", "▓", "93", "#f2cf80", "#f5d99a"),
    "activation": ("A", "▒", "33", "#f0e442", "#f5ec6e"),
    "unattributed": ("U", "█", "31", "#d55e00", "#f0782a"),
    "free": (".", "░", "90", "#e4e4e4", "#3c3c3c"),
    UNSTATED: ("?", "·", "2", "#ffffff", "#1b1b1b"),
}
RESET = "\x1b[0m"
TEXT_WIDTH = 60
MIN_TEXT_WIDTH = 20
ROW_TAIL = 45  # after a bar: `66.20 GiB held of 79.65  ◀ target  ◀ binding`
EPSILON_GIB = 0.005  # below the log's printed precision: not drawn as a remainder


def allocate(values: Iterable[float], width: int) -> list[int]:
    """Split `width` cells among `values` in proportion (largest-remainder method), so the cells
    sum to `width` exactly when any value is positive. A positive value whose share rounds to
    nothing still gets one cell (taken from the value whose rounding gained the most), so every
    segment the log states stays visible. Negative values count as zero."""
    vals = [max(0.0, float(v)) for v in values]
    total = sum(vals)
    if total <= 0 or width <= 0:
        return [0] * len(vals)
    exact = [v * width / total for v in vals]
    cells = [math.floor(e) for e in exact]
    short = width - sum(cells)
    for i in sorted(range(len(vals)), key=lambda i: (-(exact[i] - cells[i]), i))[:short]:
        cells[i] += 1
    for i in range(len(vals)):
        if vals[i] > 0 and cells[i] == 0:
            donors = [j for j in range(len(vals)) if cells[j] > 1]
            if not donors:
                break
            j = max(donors, key=lambda j: (cells[j] - exact[j], cells[j]))
            cells[j] -= 1
            cells[i] = 1
    return cells


def _round(x: float, digits: int = 2) -> float:
    return round(x + 0.0, digits)


def _stated(rank: dict[str, Any]) -> float:
    return sum(max(0.0, s["gib"]) for s in rank.get("segments", []) if s.get("gib") is not None)


def common_scale(report: dict[str, Any]) -> Optional[float]:
    """The GiB every bar is drawn against when the GPU total is known: the total, or the largest
    sum of one rank's figures where that exceeds it (figures read at different times can); None
    when the total is unknown (each bar is then drawn against its own rank's sum)."""
    total = (report.get("gpu") or {}).get("total_gib")
    if not total or total <= 0:
        return None
    return max([float(total)] + [_stated(r) for r in report.get("ranks", [])])


def rank_parts(rank: dict[str, Any], total: Optional[float], scale: Optional[float] = None) -> dict[str, Any]:
    """One rank's bar: its segments in stacked order with their share of the scale, and the part
    of the GPU total no figure of the rank accounts for (`unstated`). The scale is `scale` (see
    common_scale) when the GPU total is known, else the rank's own sum."""
    segments = [{"category": s["category"], "gib": s["gib"]} for s in rank.get("segments", [])
                if s.get("gib") is not None]
    stated = _stated(rank)
    if total and total > 0:
        against, scale = "gpu_total", float(scale or max(total, stated))
        if total - stated >= EPSILON_GIB:  # drawn before the free memory, which ends the bar
            at = next((i for i, seg in enumerate(segments) if seg["category"] == "free"), len(segments))
            segments.insert(at, {"category": UNSTATED, "gib": _round(total - stated)})
    else:
        against, scale = "rank_sum", stated
    for s in segments:
        s["share"] = max(0.0, s["gib"]) / scale if scale > 0 else 0.0
        s["percent"] = _round(100 * max(0.0, s["gib"]) / (total if against == "gpu_total" else scale), 1) \
            if scale > 0 else 0.0
        s["negative"] = s["gib"] < 0
    return {"label": rank.get("label"), "target": bool(rank.get("target")), "binding": bool(rank.get("binding")),
            "segments": segments, "against": against, "scale_gib": _round(scale), "scale": scale, "stated_gib": _round(stated),
            "over_total": bool(total) and stated > total + EPSILON_GIB, "empty": stated <= 0,
            "used_gib": _round(sum(max(0.0, s["gib"]) for s in segments if s["category"] not in ("free", UNSTATED)))}


# ---- terminal -------------------------------------------------------------------------------

def _paint(category: str, cells: int, color: bool) -> str:
    letter, glyph, sgr, _, _ = STYLE[category]
    if not color:
        return letter * cells
    return f"\x1b[{sgr}m{glyph * cells}{RESET}" if cells else ""


def legend_key(category: str, color: bool) -> str:
    """How a category appears in the legend: its letter, or its coloured glyph."""
    return _paint(category, 1, color)


def bar_cells(report: dict[str, Any], columns: int) -> int:
    """How many cells a bar gets so that its row (label, bar, figures, markers) fits in
    `columns`: TEXT_WIDTH when there is room, never fewer than MIN_TEXT_WIDTH."""
    label = max([len(r.get("label") or "") for r in report.get("ranks", [])] + [4])
    return max(MIN_TEXT_WIDTH, min(TEXT_WIDTH, columns - label - 5 - ROW_TAIL))


def text_bars(report: dict[str, Any], color: bool = False, width: int = TEXT_WIDTH) -> dict[str, Any]:
    """Per-rank bars for the text report: one string of `width` cells per rank (letters, or
    ANSI-coloured blocks when `color`), and the legend of the categories drawn. With the GPU
    total known every bar shares one scale, so a rank holding less stops short."""
    total = (report.get("gpu") or {}).get("total_gib")
    scale = common_scale(report)
    rows, seen = [], set()
    for rank in report.get("ranks", []):
        parts = rank_parts(rank, total, scale)
        values = [s["gib"] for s in parts["segments"]]
        span = round(width * sum(s["share"] for s in parts["segments"])) if scale else width
        cells = allocate(values, span)
        bar = "".join(_paint(s["category"], n, color) for s, n in zip(parts["segments"], cells))
        plain = "".join(_paint(s["category"], n, False) for s, n in zip(parts["segments"], cells))
        pad = " " * (width - sum(cells))
        seen.update(s["category"] for s, n in zip(parts["segments"], cells) if n)
        rows.append({**parts, "bar": bar + pad, "plain": plain + pad, "cells": cells})
    return {"rows": rows, "width": width, "color": color,
            "label_width": max([len(r["label"] or "") for r in rows] + [4]),
            "common_scale": scale is not None, "total_gib": total, "scale_gib": _round(scale) if scale else None,
            "cell_gib": _round(scale / width, 2) if scale else None,
            "any_over_total": any(r["over_total"] for r in rows),
            "legend": [{"category": c, "key": legend_key(c, color)} for c in DRAW_ORDER if c in seen]}


# ---- HTML / SVG -----------------------------------------------------------------------------

SVG_WIDTH = 1000
BAR_X = 180          # the bars start here (the rank labels sit to the left)
BAR_WIDTH = 660      # the bar of a rank drawn against the full scale
BAR_HEIGHT = 24
ROW_PITCH = 44
AXIS_HEIGHT = 28


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least `top`: steps of 1, 2, 2.5 or 5 × 10^k."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    n = math.ceil(top / step - 1e-9)
    return [_round(i * step, 6) for i in range(n + 1)]


def _tick_label(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def bars_svg(report: dict[str, Any]) -> dict[str, Any]:
    """Geometry of the per-rank bar chart: one row per rank, segment rectangles in viewBox units
    (x, width) proportional to GiB over the scale, the GPU total's mark, and the axis ticks."""
    total = (report.get("gpu") or {}).get("total_gib")
    scale = common_scale(report)
    rows = []
    for i, rank in enumerate(report.get("ranks", [])):
        parts = rank_parts(rank, total, scale)
        y = AXIS_HEIGHT + i * ROW_PITCH
        x = float(BAR_X)
        for s in parts["segments"]:
            w = BAR_WIDTH * s["share"]
            s.update(x=_round(x, 3), width=_round(w, 3), cx=_round(x + w / 2, 1), labelled=w >= 34,
                     hatched=s["category"] == UNSTATED)
            x += w
        rows.append({**parts, "index": i, "y": y, "bar_y": y + 4, "text_y": y + 4 + BAR_HEIGHT / 2 + 4,
                     "badge_y": y + 4 + BAR_HEIGHT + 11, "end_x": _round(x, 3)})
    ticks = []
    if scale:
        for t in nice_ticks(scale):
            if t <= scale + 1e-9:
                ticks.append({"x": _round(BAR_X + BAR_WIDTH * t / scale, 2), "label": _tick_label(t)})
    else:
        for t in (0, 25, 50, 75, 100):
            ticks.append({"x": _round(BAR_X + BAR_WIDTH * t / 100, 2), "label": f"{t} %"})
    height = AXIS_HEIGHT + max(1, len(rows)) * ROW_PITCH + 6
    categories = [c for c in DRAW_ORDER if any(s["category"] == c for r in rows for s in r["segments"])]
    table = [{"label": r["label"], "target": r["target"], "binding": r["binding"], "over_total": r["over_total"],
              "cells": [next((s["gib"] for s in r["segments"] if s["category"] == c), None) for c in categories],
              "used_gib": r["used_gib"], "stated_gib": r["stated_gib"]} for r in rows]
    return {"width": SVG_WIDTH, "height": height, "bar_x": BAR_X, "bar_width": BAR_WIDTH, "bar_height": BAR_HEIGHT,
            "bar_end": BAR_X + BAR_WIDTH, "label_x": BAR_X + BAR_WIDTH + 10, "axis_y": AXIS_HEIGHT - 10,
            "grid_top": AXIS_HEIGHT - 4, "grid_bottom": height - 6, "rows": rows, "ticks": ticks,
            "common_scale": scale is not None, "total_gib": total, "scale_gib": _round(scale) if scale else None,
            "total_x": _round(BAR_X + BAR_WIDTH * total / scale, 2) if scale and scale > total + 1e-9 else None,
            "any_over_total": any(r["over_total"] for r in rows), "categories": categories, "table": table}


CHART_W, CHART_H = 720, 340
PLOT_LEFT, PLOT_RIGHT, PLOT_TOP, PLOT_BOTTOM = 70, 700, 20, 290
SAMPLES = 48


def _points(pairs: Iterable[tuple[float, float]]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in pairs)


def concurrency_chart(report: dict[str, Any]) -> Optional[dict[str, Any]]:
    """Max concurrent requests against request length: the token limit (pool tokens // L), the
    request limit, and their minimum, sampled between the smallest and largest length asked for;
    the asked-for lengths as marked points. None when no row has a number."""
    rows = [c for c in report.get("concurrency", []) if c.get("max_concurrent") is not None]
    if not rows:
        return None
    lengths = sorted({c["request_tokens"] for c in rows})
    lo, hi = lengths[0], lengths[-1]
    if lo == hi:
        lo, hi = max(1, lo // 2), lo * 2
    pool = (report.get("kv_pool") or {}).get("tokens")
    consistent = isinstance(pool, int) and pool > 0 and all(
        c.get("token_limit") is None or pool // c["request_tokens"] == c["token_limit"] for c in rows)
    limits = {c["request_limit"] for c in rows if c.get("request_limit") is not None}
    request_limit = min(limits) if limits else None
    if consistent:
        sample = sorted({*lengths, *(round(lo + (hi - lo) * i / (SAMPLES - 1)) for i in range(SAMPLES))})
        sample = [L for L in sample if lo <= L <= hi]
        token_curve = [(L, pool // L) for L in sample]
    else:
        token_curve = [(c["request_tokens"], c["token_limit"]) for c in rows if c.get("token_limit") is not None]
        token_curve.sort()
    token_max = max([t for _, t in token_curve] + [c["max_concurrent"] for c in rows])
    # The request limit sets the top unless it sits far above every token limit in range;
    # then it is drawn at the top edge and said to lie above.
    clipped = request_limit is not None and request_limit > 1.5 * token_max
    top_value = max(token_max, request_limit if request_limit is not None and not clipped else 0, 1)
    y_ticks = nice_ticks(top_value)
    y_top = y_ticks[-1]

    def X(L: float) -> float:
        return PLOT_LEFT + (PLOT_RIGHT - PLOT_LEFT) * (L - lo) / (hi - lo)

    def Y(v: float) -> float:
        return PLOT_BOTTOM - (PLOT_BOTTOM - PLOT_TOP) * min(v, y_top) / y_top

    min_curve = [(L, min(t, request_limit) if request_limit is not None else t) for L, t in token_curve]
    x_ticks = sorted({lo, hi, *lengths})
    return {
        "width": CHART_W, "height": CHART_H, "left": PLOT_LEFT, "right": PLOT_RIGHT, "top": PLOT_TOP,
        "bottom": PLOT_BOTTOM, "x_label_y": PLOT_BOTTOM + 18, "x_title_y": PLOT_BOTTOM + 40,
        "from_tokens": lo, "to_tokens": hi, "pool_tokens": pool if consistent else None,
        "token_points": _points((X(L), Y(t)) for L, t in token_curve),
        "min_points": _points((X(L), Y(v)) for L, v in min_curve),
        "request_limit": None if request_limit is None else {
            "value": request_limit, "y": _round(Y(request_limit), 1), "clipped": clipped},
        "x_ticks": [{"x": _round(X(L), 1), "label": str(L)} for L in x_ticks],
        "y_ticks": [{"y": _round(Y(v), 1), "label": _tick_label(v)} for v in y_ticks],
        "markers": [{"x": _round(X(c["request_tokens"]), 1), "y": _round(Y(c["max_concurrent"]), 1), **c}
                    for c in rows],
        "upper_bound": any(c.get("upper_bound") for c in rows),
        "per_dp_worker": any(c.get("per_dp_worker") for c in rows),
    }


def line_anchor(evidence: Optional[dict[str, Any]]) -> Optional[str]:
    """The excerpt anchor (`L12`) of a cited log line; None for other sources (nvidia-smi,
    config.json, references, the command line)."""
    if not evidence:
        return None
    line = evidence.get("line")
    if evidence.get("source", "log") != "log" or not isinstance(line, int) or line <= 0:
        return None
    return f"L{line}"


def _cited(report: dict[str, Any]) -> dict[int, str]:
    """Every log line the report links to, with its text."""
    out: dict[int, str] = {}
    chains = [e for f in report.get("findings", []) for e in f.get("evidence", [])]
    chains += [f["main_evidence"] for f in report.get("findings", []) if f.get("main_evidence")]
    chains += [e for row in report.get("breakdown", []) for e in row.get("evidence", [])]
    source = report.get("source") or {}
    if source.get("server_args"):
        line = source["server_args"]["line"]
        text = next((e["text"] for e in report.get("framework_evidence", []) if e["line"] == line), "")
        chains.append({"line": line, "text": text, "source": "log"})
    if source.get("stopped_at"):
        chains.append({**source["stopped_at"], "source": "log"})
    chains += [{**l["failure"], "source": "log"} for l in source.get("all_launches", []) if l.get("failure")]
    for e in chains:
        if line_anchor(e):
            out.setdefault(e["line"], e.get("text", ""))
    return out


def excerpts(report: dict[str, Any], context: int = 2) -> list[list[dict[str, Any]]]:
    """Blocks of recognised log lines around every cited line (`context` recognised lines either
    side), merged where they touch; each line once, in line order, marked when cited. The report
    does not hold the raw log, so the neighbours are the lines capdiag recognised."""
    cited = _cited(report)
    known: dict[int, dict[str, Any]] = {}
    for e in report.get("framework_evidence", []):
        known.setdefault(e["line"], {"line": e["line"], "text": e["text"], "kind": e.get("kind")})
    for line, text in cited.items():
        known.setdefault(line, {"line": line, "text": text, "kind": None})
    order = sorted(known)
    index = {line: i for i, line in enumerate(order)}
    keep: set[int] = set()
    for line in cited:
        i = index[line]
        keep.update(range(max(0, i - context), min(len(order), i + context + 1)))
    blocks: list[list[dict[str, Any]]] = []
    previous = None
    for i in sorted(keep):
        row = {**known[order[i]], "cited": order[i] in cited, "anchor": f"L{order[i]}"}
        if previous is None or i != previous + 1:
            blocks.append([])
        blocks[-1].append(row)
        previous = i
    return blocks


def _ink(fill: str) -> str:
    """Black or white, whichever reads better on `fill` (WCAG relative luminance)."""
    def channel(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(int(fill[i:i + 2], 16) / 255) for i in (1, 3, 5))
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "#000000" if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else "#ffffff"


def palette() -> list[dict[str, str]]:
    """Fill and label ink of every category, for the light and the dark scheme."""
    return [{"category": c, "light": STYLE[c][3], "dark": STYLE[c][4], "ink_light": _ink(STYLE[c][3]),
             "ink_dark": _ink(STYLE[c][4])} for c in (*SEGMENTS, UNSTATED)]


def html_view(report: dict[str, Any]) -> dict[str, Any]:
    """Everything the HTML template draws that is not in the report itself."""
    blocks = excerpts(report)
    return {"bars": bars_svg(report), "chart": concurrency_chart(report), "excerpts": blocks,
            "anchors": {row["anchor"] for block in blocks for row in block},
            "palette": palette(),
            "severities": [(sev, [f for f in report.get("findings", []) if f.get("severity") == sev])
                           for sev in ("error", "warning", "info")]}
