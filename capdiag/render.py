"""Report → text, markdown, JSON or HTML. Wording lives in the Jinja templates; this module only
chooses the template and supplies formatting filters, and the pictures' numbers (capdiag.bars)."""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jinja2

from capdiag import bars
from capdiag.printable import printable_data

FORMATS = ("text", "markdown", "json", "html")


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _clip(text: Any, width: int = 160) -> str:
    text = str(text).replace("\n", " ⏎ ")
    return text if len(text) <= width else text[: width - 1] + "…"


def _md(text: Any) -> str:
    """Escape input text for a markdown table cell or line: no HTML, no table breaks."""
    s = "" if text is None else str(text)
    for ch, rep in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("`", "\\`"),
                    ("*", "\\*"), ("_", "\\_"), ("[", "\\["), ("]", "\\]")):
        s = s.replace(ch, rep)
    return s.replace("\n", " ")


def _autoescape(name: Any) -> bool:
    """HTML templates (html.j2, html_*.j2) escape everything they print; the others print text."""
    return isinstance(name, str) and name.startswith("html")


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("capdiag", "templates"), autoescape=_autoescape,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(num=_num, clip=_clip, md=_md, line_anchor=bars.line_anchor)
    env.globals.update(text_bars=bars.text_bars, html_view=bars.html_view)
    return env


def render(report: dict[str, Any], fmt: str, color: bool = False) -> str:
    """The report in `fmt`; `color` paints the text report's bars with ANSI colours (the CLI
    asks for it only when stdout is a terminal and NO_COLOR is unset)."""
    report = printable_data(report)
    if fmt == "json":
        return json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    return _env().get_template(f"{fmt}.j2").render(r=report, color=color)


def render_trace(firings) -> str:
    """One block per firing, in order: rule → conclusion, then the premises it rests on."""
    from capdiag.report import trace_rows

    return _env().get_template("trace.j2").render(rows=printable_data(trace_rows(firings)))


def render_plan(report: dict[str, Any], fmt: str) -> str:
    report = printable_data(report)
    if fmt == "json":
        return json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    return _env().get_template("plan.md.j2" if fmt == "markdown" else "plan.txt.j2").render(p=report)


def render_diff(report: dict[str, Any], fmt: str) -> str:
    report = printable_data(report)
    if fmt == "json":
        return json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    return _env().get_template("diff.md.j2" if fmt == "markdown" else "diff.txt.j2").render(d=report)
