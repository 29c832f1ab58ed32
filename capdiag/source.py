"""Reads a log and yields the lines worth parsing, in constant memory.

Opening (path, `-` for stdin, `.gz`), decoding (UTF-8 with replacement), and removing what
transport added around the server's own text: ANSI colour, carriage-return rewrites of
progress bars, container and kubectl prefixes, Docker host timestamps, markdown-list pastes.
Then a cheap keyword test keeps request-time traffic away from the parser.
"""
from __future__ import annotations

import gzip
import io
import itertools
import os
import re
import sys
import zlib
from typing import IO, Iterable, Iterator

import attrs

from capdiag.errors import InputError

# Every line kind the grammars know contains one of these (tests/test_source.py checks it
# against the grammar's example lines). A line without any is never parsed.
KEYWORDS = (
    "server_args", "distributed begin", "distributed ends", "Load weight", "KV Cache is allocated", "KV Cache VA upper bound",
    "SWAKVPool", "Mamba Cache", "Memory pool end", "graph begin", "graph end",
    "max_total_num_tokens", "Memory profiling", "memory calculation", "pool sizes",
    "Post-capture KV sizing", "KV cache dtype", "sliding window memory pool",
    "out of memory", "Not enough memory", "leave no GPU memory", "ready to roll",
    "hit an exception", "HF snapshot", "Tokenizer for", "DeepGEMM", "Required memory for warmup",
    "device_name=", "-m sglang", "sglang serve", "SGLANG_CACHE_DIR",
    # vLLM
    "version", "with config:", "non-default args", "args: Namespace", "max model len", "Model loading took",
    "Loading model weights took", "vLLM instance can use", "model weights take", "total_gpu_memory",
    "gpu_memory_utilization", "non_torch_memory", "activation peak memory", "available_kv_cache_memory",
    "Available KV cache memory", "KV cache size", "Maximum concurrency", "blocks:", "num_gpu_blocks",
    "Graph capturing finished", "graph pool memory", "Estimated CUDA graph memory", "graph memory profiling is",
    "Free memory on device", "Initial free memory", "No available memory for the cache blocks", "max seq len", "serve at least one request",
    "EngineCore failed", "Engine core initialization failed", "init engine", "Application startup complete",
    "vllm serve", "-m vllm.", "attention block size",
)
# Matched without regard to case with str.find, which runs in C: first on a batch of lines
# joined, then on each piece of the few lines that batch test let through. (A regular
# expression alternation of the keywords, run line by line, was thirty times slower.)
_LOWER_KEYWORDS = tuple(sorted({k.lower() for k in KEYWORDS}))
BATCH = 4096  # physical lines tested at once

# (never across a newline: the prefilter strips it from a batch of joined lines)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\n]*\x07")
# Transport prefixes, outermost first: markdown bullet, compose service (`sglang-1  | `),
# kubectl --timestamps (RFC 3339), Docker Desktop's host time in front of the log's own header
# (SGLang's `[date`, vLLM's `(process` or `LEVEL `).
_TRANSPORT = re.compile(
    r"^(?:[-*] (?=\S))?"
    r"(?:[\w.\-]+\s+\|\s)?"
    r"(?:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s)?"
    r"(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?\s(?=\[|\(\w|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) ))?"
)
# A log line glued after a progress bar that had no newline: split before its prefix.
_GLUED = re.compile(r"(?<=\S)(?=\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
# Ray's de-duplication note at the end of a line.
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]$")
# Records that vLLM and SGLang print on one very long line; a paste that hard-wrapped them
# continues on lines without a header of their own.
_RECORD = re.compile(r"with config:|non-default args:|args: Namespace\(|server_args[=:]")
_HEADER = re.compile(r"^(?:\(\w[^)]*pid=\d+|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) |\[\d{4}-\d\d-\d\d |\[\d\d:\d\d:\d\d)")
MAX_CONTINUATION = 400  # physical lines one wrapped record may span
WRAPPED = 100  # a record line and its header-less successor both this long: a hard wrap
# A hard wrap inside an ordinary line leaves the rest on a line that opens with punctuation.
_CUT_REST = re.compile(r"^[:,;.)\]}]")
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
    # split on "\n" only: a "\r" inside a line is a progress-bar rewrite that clean() splits,
    # and must not shift the line numbers the report cites
    text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="\n")
    number = 0
    try:
        while True:
            chunk = text.readline(MAX_LINE)
            if not chunk:
                return
            if not chunk.endswith("\n"):
                # a line longer than MAX_LINE: keep its head, skip the rest of it
                rest = chunk
                while rest and not rest.endswith("\n"):
                    rest = text.readline(MAX_LINE)
            number += 1
            if "\x00" in chunk:
                if number <= 5 and chunk.count("\x00") > len(chunk) // 8:
                    raise InputError("the input is binary data, not a text log")
                chunk = chunk.replace("\x00", "")
            yield number, chunk.rstrip("\r\n")
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"the input cannot be read: {exc}") from None


def clean(raw: str) -> list[str]:
    """The log lines inside one physical line, transport noise removed."""
    text = _ANSI.sub("", raw) if "\x1b" in raw else raw
    pieces = text.split("\r") if "\r" in text else [text]
    out = []
    for piece in pieces:
        for part in _GLUED.split(piece) if "[" in piece else [piece]:
            part = _TRANSPORT.sub("", part, count=1).strip()
            if part.endswith("cluster]"):
                part = _RAY_REPEAT.sub("", part)
            if part:
                out.append(part)
    return out


def open_brackets(text: str) -> int:
    """Brackets opened and not closed, outside quoted strings: > 0 means the record is cut."""
    depth, quote, escaped = 0, "", False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
    return depth


def has_keyword(text: str) -> bool:
    """Whether a cleaned line holds one of KEYWORDS (in any case)."""
    lower = text.lower()
    return any(keyword in lower for keyword in _LOWER_KEYWORDS)


def _keyword_rows(joined: str) -> set[int]:
    """Indices of the newline-separated rows of `joined` that hold a keyword."""
    if "\x1b" in joined:
        joined = _ANSI.sub("", joined)
    lower = joined.lower()
    starts: list[int] = []
    for keyword in _LOWER_KEYWORDS:
        at = lower.find(keyword)
        while at >= 0:
            starts.append(at)
            end = lower.find("\n", at)
            if end < 0:
                break
            at = lower.find(keyword, end)
    rows, row, done = set(), 0, 0
    for at in sorted(starts):
        row += lower.count("\n", done, at)
        done = at
        rows.add(row)
    return rows


def _with_hits(numbered: Iterable[tuple[int, str]]) -> Iterator[tuple[int, str, bool]]:
    """Each line with whether it holds a keyword, tested a batch at a time."""
    iterator = iter(numbered)
    while batch := list(itertools.islice(iterator, BATCH)):
        joined = "\n".join(raw for _, raw in batch)
        if joined.count("\n") == len(batch) - 1:
            rows = _keyword_rows(joined)
        else:  # a caller's line with a newline in it would shift the rows: test one by one
            rows = {i for i, (_, raw) in enumerate(batch) if _keyword_rows(raw.replace("\n", " "))}
        for index, (number, raw) in enumerate(batch):
            yield number, raw, index in rows


def candidate_lines(numbered: Iterable[tuple[int, str]]) -> Iterator[Line]:
    """Lines that may hold a fact, with wrapped continuations joined.

    Three kinds of wrapping are undone: a long record (engine config, argument dict,
    server_args) hard-wrapped by a paste continues on the following lines that have no header
    of their own, joined as they are — while its brackets are still open, or while the lines
    run at the wrap width; any line hard-wrapped mid-sentence continues on a line
    that opens with punctuation (`: 29053`); a line an author wrapped after a comma continues
    on the next line when that one has no prefix, joined with a space.
    """
    pending: Line | None = None
    record = False
    spans = 0
    last_piece = ""
    for number, raw, hit in _with_hits(numbered):
        if pending is None and not hit:
            continue
        for text in clean(raw):
            if pending is not None:
                if not record and _CUT_REST.match(text):
                    pending = Line(pending.number, pending.text + text, pending.raw + "\n" + raw)
                    continue
                if record and spans < MAX_CONTINUATION and text and not _HEADER.match(text) and (
                        open_brackets(pending.text) > 0
                        or (len(last_piece) >= WRAPPED and (len(text) >= WRAPPED or spans > 0))):
                    pending = Line(pending.number, pending.text + text, pending.raw + "\n" + raw)
                    spans += 1
                    last_piece = text
                    continue
                if not record and pending.text.endswith(",") and not text.startswith(("[", "(")):
                    pending = Line(pending.number, pending.text + " " + text, pending.raw + "\n" + raw)
                    continue
                yield pending
                pending = None
            if not has_keyword(text):
                continue
            line = Line(number, text, raw[:MAX_LINE])
            if _RECORD.search(text):
                pending, record, spans, last_piece = line, True, 0, raw
            else:  # held one line: it may continue on the next (soft or hard wrap)
                pending, record = line, False
    if pending is not None:
        yield pending
