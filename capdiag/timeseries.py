"""Pictures of the run-time series: a one-line text sparkline and the HTML chart's geometry.

The numbers are the report's `runtime.series` (the largest KV usage, running and queued
requests of each stretch of traffic lines); this module only scales them to characters and to
SVG coordinates, so the templates draw without computing.
"""
from __future__ import annotations

from typing import Any, Optional

SPARKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60
CHART = {"width": 720, "height": 180, "left": 44, "right": 44, "top": 12, "bottom": 28}


def _resample(values: list[Optional[float]], width: int) -> list[Optional[float]]:
    """At most `width` values: each the largest of the stretch it stands for."""
    if len(values) <= width:
        return values
    out = []
    for i in range(width):
        part = [v for v in values[i * len(values) // width:(i + 1) * len(values) // width] if v is not None]
        out.append(max(part) if part else None)
    return out


def sparkline(series: list[dict[str, Any]], key: str = "kv_usage", top: Optional[float] = 1.0,
              width: int = SPARK_WIDTH) -> str:
    """One character per stretch, ▁ (empty) to █ (`top`, or the largest value); space where unknown."""
    values = _resample([p[key] for p in series], width)
    known = [v for v in values if v is not None]
    if not known:
        return ""
    scale = top or max(known) or 1
    return "".join(" " if v is None else SPARKS[min(len(SPARKS) - 1, int(v / scale * (len(SPARKS) - 1) + 0.5))]
                   for v in values)


def chart(runtime: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """SVG polylines for KV usage (left axis, 0–100 %) and running / queued requests (right axis)."""
    if not runtime or len(runtime.get("series") or ()) < 2:
        return None
    series = runtime["series"]
    c = CHART
    plot_w, plot_h = c["width"] - c["left"] - c["right"], c["height"] - c["top"] - c["bottom"]
    count_top = max([p["running"] for p in series] + [p["queued"] for p in series] + [1])

    def x(i: int) -> float:
        return round(c["left"] + plot_w * i / (len(series) - 1), 1)

    def y(share: float) -> float:
        return round(c["top"] + plot_h * (1 - share), 1)

    def line(key: str, scale: float) -> str:
        return " ".join(f"{x(i)},{y(p[key] / scale)}" for i, p in enumerate(series) if p[key] is not None)

    return {**c, "plot_w": plot_w, "plot_h": plot_h, "count_top": count_top,
            "kv": line("kv_usage", 1.0), "running": line("running", count_top), "queued": line("queued", count_top),
            "y90": y(0.9), "y100": y(1.0), "y0": y(0.0), "x_end": c["left"] + plot_w,
            "first_time": series[0]["time"], "last_time": series[-1]["time"], "points": len(series)}
