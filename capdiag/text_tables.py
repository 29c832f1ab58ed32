"""Tables for the text report, laid out to the width they are given.

A table is its columns — a heading, where each row keeps the column's value, how it is
aligned, and whether it may go when space is short — and its rows, each read once into its
cells. Where the natural widths pass the width, headings break over two or three lines at spaces,
then the droppable columns go (lowest `drop` first), then the last column, when it is prose, wraps under
itself. A row is never wrapped onto the next line at the indent, where it would no longer line
up. The template holds the headings and the wording around the table; this holds the layout.
"""
from __future__ import annotations

import textwrap
from typing import Any, Iterable

GAP = 1  # spaces between columns
PROSE_GAP = 2  # before the prose column
MIN_PROSE = 36  # narrower than this, prose reads as a column of fragments: drop a column instead
NARROWEST_PROSE = 12  # with nothing left to drop, prose still wraps within the width down to this


def _value(row: Any, path: str) -> Any:
    for part in path.split("."):
        if row is None:
            return None
        row = row[int(part)] if part.isdigit() else row.get(part) if isinstance(row, dict) else getattr(row, part)
    return row


def _cell(row: Any, column: dict[str, Any]) -> str:
    value = _value(row, column["value"])
    if value is None:
        text = "—"
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and column.get("signed"):
        text = f"{value:+.{column.get('digits', 2)}f}"
    elif isinstance(value, float):
        text = f"{value:.{column.get('digits', 2)}f}"
    else:
        text = str(value)
    if column.get("mark") and _value(row, column["mark"]):
        text += column.get("mark_text", "*")
    if column.get("nest") and _value(row, column["nest"]) is not None:
        text = "└ " + text
    if column.get("clip") and len(text) > column["clip"]:
        text = text[: column["clip"] - 1] + "…"
    return text


def _heading_lines(heading: str, most: int) -> list[str]:
    """The heading over at most `most` lines, broken at spaces as narrowly as that allows."""
    words = heading.split(" ")
    for narrow in range(max(map(len, words)), len(heading) + 1):
        lines = textwrap.wrap(heading, narrow, break_long_words=False, break_on_hyphens=False)
        if len(lines) <= most:
            return lines
    return [heading]


def table(width: int, rows: Iterable[Any], columns: list[dict[str, Any]], indent: int = 2) -> dict[str, Any]:
    """The table's `lines` within `width` columns (the indent included), and the headings of the
    columns `left_out` to fit. Each column: `heading`, `value` (a key path into the row: `gib`,
    `nvidia_smi.used_mib`, `columns.3`), optional `align` (`<` or `>`, default `>`), `digits` for
    floats, `signed` (a number with its sign), `drop` (droppable: lower goes first), `prose` (the last column only: wraps), `nest`
    (a key whose value marks a row nested in another), `mark` with `mark_text` (a suffix when the
    key is true) and `clip` (a length past which the cell is cut with an ellipsis)."""
    cells = [[_cell(row, c) for c in columns] for row in rows]
    natural = [max([len(r[i]) for r in cells], default=0) for i in range(len(columns))]
    prose = bool(columns) and bool(columns[-1].get("prose"))
    kept = list(range(len(columns)))

    def widths(most: int) -> list[int]:
        return [max(natural[i], *map(len, _heading_lines(columns[i]["heading"], most))) for i in kept]

    def needed(most: int) -> int:
        w = widths(most)
        if prose:
            return indent + sum(w[:-1]) + GAP * (len(w) - 2) + PROSE_GAP + MIN_PROSE
        return indent + sum(w) + GAP * (len(w) - 1)

    most = next((n for n in (1, 2, 3) if needed(n) <= width), 3)
    droppable = sorted((c.get("drop"), i) for i, c in enumerate(columns) if c.get("drop") is not None)
    while needed(most) > width and droppable:
        kept.remove(droppable.pop(0)[1])
    w = widths(most)
    if prose:
        start = indent + sum(w[:-1]) + GAP * (len(w) - 2) + PROSE_GAP
        w[-1] = max(NARROWEST_PROSE, width - start)

    def line(parts: list[str]) -> str:
        out = " " * indent
        for n, (i, text) in enumerate(zip(kept, parts)):
            last = n == len(kept) - 1
            if n:
                out += " " * (PROSE_GAP if last and prose else GAP)
            align = "<" if last and prose else columns[i].get("align", ">")
            out += text if last and prose else f"{text:{align}{w[n]}}"
        return out.rstrip()

    heads = [textwrap.wrap(columns[i]["heading"], w[n], break_long_words=False, break_on_hyphens=False)
             if not (prose and n == len(kept) - 1) else [columns[i]["heading"]] for n, i in enumerate(kept)]
    depth = max(map(len, heads))
    heads = [[""] * (depth - len(h)) + h for h in heads]  # a short heading sits on the bottom line
    lines = [line([h[k] for h in heads]) for k in range(depth)]
    for r in cells:
        parts = [r[i] for i in kept]
        if not prose:
            lines.append(line(parts))
            continue
        wrapped = textwrap.wrap(parts[-1], w[-1], break_long_words=False, break_on_hyphens=False) or [""]
        lines.append(line(parts[:-1] + [wrapped[0]]))
        lines.extend(" " * start + more for more in wrapped[1:])
    return {"lines": lines, "left_out": [columns[i]["heading"] for i in range(len(columns)) if i not in kept]}

