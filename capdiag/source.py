"""Reads a log and yields the lines worth parsing, in constant memory.

Opening (path, `-` for stdin, `.gz`), decoding (UTF-8 with replacement), and removing what
transport added around the server's own text: ANSI colour, carriage-return rewrites of
progress bars, container and kubectl prefixes, Docker host timestamps, markdown-list pastes.
Then a cheap keyword test keeps request-time traffic away from the parser.
"""
from __future__ import annotations

import gzip
import io
import os
import re
import sys
from typing import IO, Iterable, Iterator

import attrs

from capdiag.errors import InputError

# Every line kind the grammars know contains one of these (tests/test_source.py checks it
# against the grammar's example lines). A line without any is never parsed.
KEYWORDS = (
    "server_args", "distributed begin", "distributed ends", "Load weight", "KV Cache",
    "SWAKVPool", "Mamba Cache", "Memory pool end", "graph begin", "graph end",
    "max_total_num_tokens", "Memory profiling", "memory calculation", "pool sizes",
    "Post-capture KV sizing", "KV cache dtype", "sliding window memory pool",
    "out of memory", "Not enough memory", "leave no GPU memory", "ready to roll",
    "hit an exception", "HF snapshot", "Tokenizer for", "DeepGEMM", "Required memory for warmup",
    "device_name=", "-m sglang", "sglang serve",
)
_KEYWORD_RE = re.compile("|".join(re.escape(k) for k in KEYWORDS), re.IGNORECASE)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")
# Transport prefixes, outermost first: markdown bullet, compose service (`sglang-1  | `),
# kubectl --timestamps (RFC 3339), Docker Desktop's host time in front of the log's own.
_TRANSPORT = re.compile(
    r"^(?:[-*] (?=\S))?"
    r"(?:[\w.\-]+\s+\|\s)?"
    r"(?:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s)?"
    r"(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?\s(?=\[))?"
)
# A log line glued after a progress bar that had no newline: split before its prefix.
_GLUED = re.compile(r"(?<=\S)(?=\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
MAX_LINE = 1 << 20  # characters kept of one physical line; a longer one is cut, not held


@attrs.frozen
class Line:
    number: int  # 1-based physical line number in the input
    text: str  # the cleaned text the grammar sees
    raw: str  # the line as read (decoded, truncated to MAX_LINE)


def open_input(path: str) -> IO[bytes]:
    """Open a path, `-` (stdin) or a .gz file for binary reading; InputError on failure."""
    if path == "-":
        return sys.stdin.buffer
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, not a log file")
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})") from None
    head = fh.peek(4)[:2] if hasattr(fh, "peek") else b""
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=fh)  # type: ignore[return-value]
    return fh


def physical_lines(stream: IO[bytes]) -> Iterator[tuple[int, str]]:
    """Decoded lines with their numbers; raises InputError for binary or unreadable data."""
    text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")
    number = 0
    try:
        while True:
            chunk = text.readline(MAX_LINE)
            if not chunk:
                return
            if not chunk.endswith(("\n", "\r")):
                # a line longer than MAX_LINE: keep its head, skip the rest of it
                rest = chunk
                while rest and not rest.endswith(("\n", "\r")):
                    rest = text.readline(MAX_LINE)
            number += 1
            if "\x00" in chunk:
                if number <= 5 and chunk.count("\x00") > len(chunk) // 8:
                    raise InputError("the input is binary data, not a text log")
                chunk = chunk.replace("\x00", "")
            yield number, chunk.rstrip("\r\n")
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise InputError(f"the input cannot be read: {exc}") from None


def clean(raw: str) -> list[str]:
    """The log lines inside one physical line, transport noise removed."""
    text = _ANSI.sub("", raw) if "\x1b" in raw else raw
    pieces = text.split("\r") if "\r" in text else [text]
    out = []
    for piece in pieces:
        for part in _GLUED.split(piece) if "[" in piece else [piece]:
            part = _TRANSPORT.sub("", part, count=1).strip()
            if part:
                out.append(part)
    return out


def candidate_lines(numbered: Iterable[tuple[int, str]]) -> Iterator[Line]:
    """Lines that may hold a fact. A line that ends in a comma continues on the next
    physical line when that one has no prefix of its own (author-wrapped pastes)."""
    pending: Line | None = None
    for number, raw in numbered:
        for text in clean(raw):
            if pending is not None:
                if not text.startswith("["):
                    pending = Line(pending.number, pending.text + " " + text, pending.raw + "\n" + raw)
                    if pending.text.endswith(","):
                        continue
                    yield pending
                    pending = None
                    continue
                yield pending
                pending = None
            if not _KEYWORD_RE.search(text):
                continue
            line = Line(number, text, raw[:MAX_LINE])
            if text.endswith(",") and "server_args" not in text:
                pending = line
            else:
                yield line
    if pending is not None:
        yield pending
