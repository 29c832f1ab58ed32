"""Report → text, markdown, JSON or HTML. Wording lives in the Jinja templates; this module only
chooses the template and supplies formatting filters, and the pictures' numbers (capdiag.bars)."""
from __future__ import annotations

import csv
import io
import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterator

from capdiag import bars, text_tables, timeseries
from capdiag.cache import cache_dir
from capdiag.printable import printable_data
from capdiag.rows import iterencode, pieces
from capdiag.terminal import DEFAULT_WIDTH, for_terminal, wrap

if TYPE_CHECKING:
    import jinja2

FORMATS = ("text", "markdown", "json", "html")
MANY_FORMATS = ("table", "jsonl", "csv")  # one row or line per log: for many logs (text means table there)


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _clip(text: Any, width: int = 160) -> str:
    text = str(text).replace("\n", " ⏎ ")
    return text if len(text) <= width else text[: width - 1] + "…"


def _pct(value: Any, digits: int = 0) -> str:
    """A fraction 0–1 as a percent."""
    return "—" if value is None else f"{100 * value:.{digits}f} %"


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
def _env() -> "jinja2.Environment":
    # imported here, and templates compiled once into the user's cache: a JSON report needs neither
    import jinja2

    directory = cache_dir()
    env = jinja2.Environment(loader=jinja2.PackageLoader("capdiag", "templates"), autoescape=_autoescape,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined,
                             bytecode_cache=jinja2.FileSystemBytecodeCache(str(directory)) if directory else None)
    env.filters.update(num=_num, clip=_clip, md=_md, pct=_pct, line_anchor=bars.line_anchor)
    env.globals.update(text_bars=bars.text_bars, bar_cells=bars.bar_cells, html_view=bars.html_view,
                       sparkline=timeseries.sparkline, runtime_chart=timeseries.chart,
                       table=text_tables.table)
    return env


def render(report: dict[str, Any], fmt: str, color: bool = False, width: int = DEFAULT_WIDTH) -> str:
    """The report in `fmt`. The text report is wrapped to `width` columns (log lines quoted in
    it are cut to one line); `color` paints its bars and severities with ANSI colours."""
    return "".join(render_pieces(report, fmt, color, width))


def render_pieces(report: dict[str, Any], fmt: str, color: bool = False, width: int = DEFAULT_WIDTH) -> Iterator[str]:
    """render() a piece at a time, for writing as it goes: the JSON report is encoded as it is
    written, never held whole (for 10,000 ranks it is tens of MB, and json.dumps with an
    indent holds every one of its millions of fragments in a list before joining them)."""
    report = printable_data(report, lines=fmt == "json")
    if fmt != "json":
        text = _env().get_template(f"{fmt}.j2").render(r=report, color=color, width=width)
        yield for_terminal(text, width, color) if fmt == "text" else text
        return
    yield from pieces(iterencode(report))
    yield "\n"


def render_notebook(report: dict[str, Any]) -> str:
    """The report as a notebook cell shows it: an HTML fragment, every input escaped."""
    return _env().get_template("html_notebook.j2").render(r=printable_data(report, lines=False))


def render_trace(rows: list[dict[str, Any]], width: int = DEFAULT_WIDTH) -> str:
    """One block per firing, in order: rule → conclusion, its inputs; then the rules asked
    about that did not fire, with what they needed (report.trace_rows)."""
    return wrap(_env().get_template("trace.j2").render(rows=printable_data(rows, lines=False), width=width), width)


def render_plan(report: dict[str, Any], fmt: str) -> str:
    report = printable_data(report, lines=fmt == "json")
    if fmt == "json":
        return json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    return _env().get_template("plan.md.j2" if fmt == "markdown" else "plan.txt.j2").render(p=report)


def render_diff(report: dict[str, Any], fmt: str, width: int = DEFAULT_WIDTH) -> str:
    """The diff document; its text laid out and wrapped to `width` columns."""
    report = printable_data(report, lines=fmt == "json")
    if fmt == "json":
        return json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    if fmt == "markdown":
        return _env().get_template("diff.md.j2").render(d=report)
    return wrap(_env().get_template("diff.txt.j2").render(d=report, width=width), width)


# A spreadsheet runs a cell that opens with one of these as a formula (`=HYPERLINK(…)` from a
# model name in a log): such text gets a leading `'`, which shows it as text (OWASP's advice).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    return "'" + value if isinstance(value, str) and value.startswith(_FORMULA_START) else value


def render_many_pieces(items, fmt: str) -> Iterator[str]:
    """Many logs' outcomes (batch.Item, in order) as they come: `jsonl` one report per line (an
    error as {"schema": "capdiag.error/1", "path", "error"}), `csv` the summary rows, each written
    as its log is done, so neither holds the reports; `table` for a terminal (summary.txt.j2),
    whose column widths need every (small) summary row first."""
    from capdiag.batch import SUMMARY_COLUMNS, summary_row

    if fmt == "jsonl":
        for i in items:
            yield json.dumps(i.report if i.report is not None else
                             {"schema": "capdiag.error/1", "path": i.path, "error": i.error}, ensure_ascii=False) + "\n"
        return
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, SUMMARY_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for i in items:
            writer.writerow({k: _cell(v) for k, v in summary_row(i).items()})
            yield out.getvalue()
            out.seek(0)
            out.truncate()
        yield out.getvalue()
        return
    yield _summary_table([summary_row(i) for i in items])


def _summary_table(rows: list[dict[str, Any]]) -> str:
    from capdiag.batch import TABLE_HEADINGS, table_cells

    cells = [table_cells(row) for row in rows]
    widths = {key: max([len(heading)] + [len(c[key]) for c in cells]) for key, heading in TABLE_HEADINGS.items()}
    table = _env().get_template("summary.txt.j2").render(headings=TABLE_HEADINGS, rows=cells, widths=widths,
                                                         upper_bound=any(r["concurrency_upper_bound"] for r in rows))
    return "\n".join(line.rstrip() for line in table.split("\n"))
