"""Text for a terminal: the width to wrap to, whether to colour, wrapping and severity colours.

click does the terminal work (`click.style`, `click.unstyle`); wrapping is by visible width,
so lines already holding ANSI colours (the bars) wrap like any other.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from typing import IO, Callable, Optional

import click

DEFAULT_WIDTH = 100  # when the output is not a terminal and COLUMNS is unset
MIN_WIDTH = 40
COLOR_CHOICES = ("auto", "always", "never")
SEVERITY_STYLE = {"ERROR": {"fg": "red", "bold": True}, "WARNING": {"fg": "yellow", "bold": True},
                  "INFO": {"fg": "cyan"}}
_SEVERITY_TAG = re.compile(r"\[(ERROR|WARNING|INFO)\]")
_INDENT = 4  # continuation lines sit this much deeper than the line they continue


def width(stream: Optional[IO] = None) -> int:
    """COLUMNS when set, else the terminal's width when `stream` is one, else DEFAULT_WIDTH."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return max(MIN_WIDTH, int(columns))
    stream = stream or sys.stdout
    if _isatty(stream):
        return max(MIN_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)
    return DEFAULT_WIDTH


def use_color(choice: str, stream: Optional[IO] = None) -> bool:
    """`always`/`never` as said; `auto`: a terminal, and NO_COLOR unset (no-color.org)."""
    if choice != "auto":
        return choice == "always"
    return not os.environ.get("NO_COLOR") and _isatty(stream or sys.stdout)


def _isatty(stream: IO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def wrap(text: str, columns: int) -> str:
    """Every line longer than `columns` (visible characters) broken at spaces, the rest of it
    indented under the line's own indent. A word longer than a line (a long file path) stays
    whole on a line of its own: cut, it could no longer be copied or searched for."""
    out = []
    for line in text.split("\n"):
        out.extend(_wrap_line(line, columns) if len(click.unstyle(line)) > columns else [line])
    return "\n".join(out)


def _wrap_line(line: str, columns: int) -> list[str]:
    lead = len(line) - len(line.lstrip(" "))
    indent = " " * min(lead + _INDENT, columns // 2)
    lines, current, used, empty = [], " " * lead, lead, True
    for word in line[lead:].split(" "):
        size = len(click.unstyle(word))
        if empty and not word:  # no spaces at the start of a continuation
            continue
        if not empty and used + 1 + size > columns:
            lines.append(current)
            current, used, empty = indent, len(indent), True
        current += word if empty else " " + word
        used += size if empty else size + 1
        empty = False
    lines.append(current)
    return lines


def color_severities(text: str) -> str:
    """`[ERROR]`, `[WARNING]`, `[INFO]` in their colours."""
    return _SEVERITY_TAG.sub(lambda m: click.style(m.group(0), **SEVERITY_STYLE[m.group(1)]), text)


def for_terminal(text: str, columns: int, color: bool) -> str:
    """A rendered text report as the terminal gets it: wrapped, severities coloured."""
    text = wrap(text, columns)
    return color_severities(text) if color else text


def progress_line(stream: Optional[IO] = None) -> Optional[Callable[[str], None]]:
    """On a terminal, a function that shows one status line in place (and clears it when given
    ""); None elsewhere, where a line drawn over itself would be noise in a CI log or a pipe."""
    stream = sys.stderr if stream is None else stream
    if not _isatty(stream):
        return None

    def show(text: str) -> None:
        stream.write("\r\x1b[K" + (click.unstyle(text)[: width(stream) - 1] if text else ""))
        stream.flush()
    return show
