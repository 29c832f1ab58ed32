"""Reads a log and yields the lines worth parsing, in constant memory.

Opening (path, `-` for stdin, `.gz`), decoding (UTF-8 with replacement; UTF-16 and a UTF-8 BOM
told by the byte-order mark), and removing what transport added around the server's own text:
JSON log records, ANSI colour, carriage-return rewrites of progress bars, host and container
prefixes (docker-compose, Docker Desktop, kubectl, journald, CRI files, GitHub Actions),
markdown-list pastes.
Then a cheap keyword test keeps request-time traffic away from the parser: the file is read a
MiB at a time, the keywords are found in each run of lines by one C-speed pass, and only the
lines that hold one (and the lines that may continue those) are visited in Python. A long
regular file is read a few blocks ahead, each block counted and searched on a worker thread
(capdiag.ahead), with the same blocks and results.
"""
from __future__ import annotations

import bisect
import codecs
import gzip
import io
import json
import os
import re
import select
import stat
import sys
import threading
import time
import zlib
from functools import lru_cache
from typing import IO, Iterable, Iterator, Union

import ahocorasick_rs
import attrs

from capdiag.ahead import mapped
from capdiag.errors import InputError
from capdiag.facts.kinds import KEYWORDS as FACT_KEYWORDS
from capdiag.frozen import frozen
from capdiag.lazyre import LazyPattern

# Every line kind the grammars know contains one of these (tests/test_source.py checks it
# against the grammar's example lines). A line without any is never parsed. Each fact class
# declares its own (Fact.KEYWORDS); this is their union.
KEYWORDS = FACT_KEYWORDS
# Matched without regard to (ASCII) case over lowered bytes. A whole block of raw lines is
# searched for ANCHORS, so that ahocorasick-rs can use its SIMD prefilter (only with a leftmost
# match kind and at most 64 patterns): ~1.4 GiB/s against ~350 MiB/s for the whole list. Every
# keyword holds an anchor, so no line with a keyword is missed; each cleaned piece of a line an
# anchor let through is then checked against the whole list (has_keyword), so the lines read
# are exactly those holding a keyword.
MAX_ANCHORS = 64  # patterns one automaton holds with its prefilter on
# The words of six letters or more that request-time lines print (SGLang's batch lines, vLLM's
# periodic metrics lines, capdiag.traffic): an anchor made of one would send every traffic line
# to be checked against the whole list, one by one (vLLM's `Engine 000: Avg prompt …` made
# "engine" cost the fallback 2.5x).
TRAFFIC_WORDS = frozenset({"engine", "prompt", "throughput", "generation", "running", "waiting", "pending",
                           "swapped", "prefill", "decode", "cached", "prefix", "retract", "retracted_reqs"})


def anchors(keywords: Iterable[str], limit: int = MAX_ANCHORS) -> tuple[str, ...]:
    """Lowercase strings, one inside every keyword: the keywords that hold no other, then, while
    more than `limit`, the word of six letters or more that most of them share in place of the
    keywords that hold it (a shorter word, like "graph", or one of TRAFFIC_WORDS, is in request
    traffic too). What no shared word folds stays as it is: anchor_groups() searches the rest
    in a further automaton."""
    lowered = {k.lower() for k in keywords}
    found = {k for k in lowered if not any(other != k and other in k for other in lowered)}
    while len(found) > limit:
        counts: dict[str, int] = {}
        for pattern in found:
            for word in set(re.findall(r"[a-z_]{6,}", pattern)) - TRAFFIC_WORDS:
                counts[word] = counts.get(word, 0) + 1
        word = max(sorted(counts), key=lambda w: counts[w], default=None)
        if word is None or counts[word] < 2:
            break
        found = {p for p in found if word not in p} | {word}
    return tuple(sorted(found))


# The SIMD prefilter (Teddy) fingerprints every pattern by as many leading bytes as the
# shortest pattern has (up to 3): one 2-byte anchor (`['`, a Ray argv list) made the
# fingerprints 2 bytes, and the `[2` opening every SGLang line a candidate to verify — the
# search ran at ~270 MiB/s. The anchors shorter than SHORT_ANCHOR get an automaton of their own:
# two passes, ~1 GiB/s together. Each finds the lines holding one of its anchors, so the passes
# together find the lines holding any.
SHORT_ANCHOR = 4


def anchor_groups(found: Iterable[str], limit: int = MAX_ANCHORS) -> tuple[tuple[str, ...], ...]:
    """The anchors in automata of at most `limit`: the short ones apart, the long ones in order,
    `limit` at a time. An automaton of a few long anchors beyond the first 64 is a cheap pass
    (5 of them: ~0.12 s/GiB against ~0.8 s/GiB for the first, measured on corpus start-ups
    and SGLang decode lines)."""
    long_ones = sorted(a for a in found if len(a) >= SHORT_ANCHOR)
    short_ones = sorted(a for a in found if len(a) < SHORT_ANCHOR)
    return tuple(tuple(group[i:i + limit]) for group in (long_ones, short_ones) for i in range(0, len(group), limit))


ANCHORS = anchors(KEYWORDS)
_SCANNER = ahocorasick_rs.BytesAhoCorasick(sorted({k.lower().encode() for k in KEYWORDS}))
_ANCHOR_SCANNERS = tuple(ahocorasick_rs.BytesAhoCorasick([a.encode() for a in group],
                                                         matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)
                         for group in anchor_groups(ANCHORS))
FAST_FROM = 1 << 16  # a block this long is searched with hyperscan, when it is installed


@lru_cache(maxsize=1)
def _hyperscan():
    """The whole keyword list compiled by hyperscan (the `fast` extra; Vectorscan ignores case
    itself, so no lowered copy of the block is made), or None when it is not installed."""
    try:
        import hyperscan
    except ImportError:
        return None
    patterns = sorted({k.lower() for k in KEYWORDS})
    database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    database.compile(expressions=[re.escape(p).encode() for p in patterns],
                     flags=[hyperscan.HS_FLAG_CASELESS] * len(patterns))
    return database


def _keyword_offsets(scan: bytes) -> list[int]:
    """Ascending offsets, each inside a match of a keyword (or an anchor) in the block; both
    paths find the same lines, so the report never depends on which ran."""
    database = _hyperscan() if len(scan) >= FAST_FROM else None
    if database is None:
        lowered = scan.lower()
        return sorted(start for scanner in _ANCHOR_SCANNERS for _, start, _ in scanner.find_matches_as_indexes(lowered))
    ends: list[int] = []
    database.scan(scan, match_event_handler=lambda _id, _start, end, _flags, _context: ends.append(end - 1),
                  scratch=_scratch(database))
    return sorted(ends)


# what each thread that scans blocks keeps (the reading thread, capdiag.ahead's workers)
_PER_THREAD = threading.local()


def _scratch(database):
    """This thread's hyperscan scratch space: a scan in progress holds its own, so threads that
    scan at once need one each."""
    held = getattr(_PER_THREAD, "scratch", None)
    if held is None or held[0] is not database:
        import hyperscan
        held = _PER_THREAD.scratch = (database, hyperscan.Scratch(database))
    return held[1]


# Counting newlines is the reader's largest cost after the keyword search (`bytes.count`
# 0.3-0.7 s/GiB); numpy (the `fast` extra) counts at a quarter of that but costs 0.04-0.1 s
# and ~15 MiB to import, so it is used on a file of this size or more (from its first block:
# a regular file's size is known) or once this much of a stream has been read (on a 128 MiB
# log, from 64 MiB on, it measured slower). The count is the same either way.
NUMPY_FROM = 256 << 20
# numpy compares a slice at a time into one buffer a thread: an array as long as the block, on
# each worker, grew the peak RSS by a MiB each
COUNT_SLICE = 1 << 18


@lru_cache(maxsize=1)
def _numpy():
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _size(stream) -> int:
    """The bytes of the file under `stream` (a .gz's compressed size, which the text exceeds),
    0 when it is no regular file."""
    try:
        found = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):  # no descriptor (in memory, a live stream)
        return 0
    return found.st_size if stat.S_ISREG(found.st_mode) else 0


# A regular file this long is read ahead (capdiag.ahead): on two cores the scan and count of
# one block overlap the reading of the next; a shorter log is done before a thread would help.
AHEAD_FROM = 64 << 20


def reads_ahead(stream) -> bool:
    """Whether the stream's blocks may be read and scanned ahead of their use: a long regular
    file (a live pipe's reader must not wait for more than it has been given)."""
    size = _size(stream)  # 0: no regular file
    return not isinstance(stream, LiveStream) and 0 < size and AHEAD_FROM <= size


def _newlines(block: bytes, read: int) -> int:
    """The newlines in block; `read` the bytes of the input read so far, or its size if more."""
    numpy = _numpy() if read >= NUMPY_FROM else None
    if numpy is None:
        return block.count(b"\n")
    flags = getattr(_PER_THREAD, "flags", None)
    if flags is None:
        flags = _PER_THREAD.flags = numpy.empty(COUNT_SLICE, bool)
    data, count = numpy.frombuffer(block, numpy.uint8), 0
    for at in range(0, len(data), COUNT_SLICE):
        part = data[at:at + COUNT_SLICE]
        found = flags[:len(part)]
        numpy.equal(part, 10, out=found)
        count += int(numpy.count_nonzero(found))
    return count


BATCH = 4096  # lines put in one block when they come one by one

# (never across a newline: the prefilter strips it from a block of lines)
# CSI (colours, cursor moves) and OSC (window title, hyperlinks), the OSC ended by BEL or by ST (`ESC \`)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)")
_ANSI_BYTES = re.compile(_ANSI.pattern.encode())
# The same colours as a syslog relay writes a control character it escaped (rsyslog, then
# CloudWatch): ESC as the text `#033`
_ESCAPED_ANSI = re.compile(r"#033\[[0-9;?]*[ -/]*[@-~]")
# What a host, a container runtime or a paste puts in front of the server's own line, outermost
# first; each is removed at most once, in this order. The one place that knows them.
_TRANSPORT = re.compile("".join(f"(?:{part})?" for part in (
    r"[-*] (?=\S)",  # a markdown list item
    # DJL Serving (SageMaker's LMI containers) around its Python worker's output: `[INFO ] PyProcess
    # - W-210-model-stdout: `; a paste may have lost the `[`
    r"\[?(?:TRACE|DEBUG|INFO|WARN|ERROR) *\] PyProcess - W-\d+-\S+?-std(?:out|err): ",
    # docker-compose service (`vllm-1  | `), or a process manager's in brackets (`[vllm]   | `)
    r"(?:[\w.\-]+|\[[\w.\-]+\])\s+\|\s",
    r"\[pod/[^\]\s]+\]\s",  # kubectl logs --prefix
    # journald (`Apr 19 17:30:52 host unit[pid]: `, short and ISO forms)
    r"(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)"
    r" [\w.\-]+ [\w.@\-]+\[\d+\]: ",
    # kubectl --timestamps and GitHub Actions (RFC 3339); a CRI log file's stream and tag after it
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s(?:(?:stdout|stderr) [FP] )?",
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? \| ",  # Docker Desktop's log view
    # Docker's host time without the bar, only in front of the log's own header (SGLang's
    # `[date`, vLLM's `(process` or `LEVEL `): a line of the server's own may start with a date
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?\s(?=\[|\(\w|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) )",
    # torch.distributed's per-rank stream prefix (torchrun --tee/--log-dir and LLM() under a
    # distributed launch: `[rank0]: `, `[default0]:`), right in front of the process's own line
    r"\[(?:rank|default)\d+\]:\s?",
)))
# A container log file in JSON (Docker's json-file driver, Kubernetes node logs, log shippers):
# the line is inside one string field.
_JSON_LINE = re.compile(r'^\s*\{.*"(?:log|message|msg|textPayload)"\s*:')
_JSON_FIELDS = ("log", "message", "msg", "textPayload")
# A log line glued after a progress bar, or after another process's line, that had no newline
# (Ray interleaves its actors' output): split before its prefix.
_GLUED = re.compile(r"(?<=\S)(?=\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\(\w[\w.:\-]* pid=\d+(?:, ip=[\d.]+)?\) )")
# Ray's de-duplication mark at the end of a line (the first time, with its explanation after it):
# the line stands for N more lines of other processes that differ from it only in their numbers.
_RAY_REPEAT = re.compile(r"\s*\[repeated (\d+)x across cluster\](?:\s*\(Ray deduplicates logs[^)]*\))?\s*$")
# Records that vLLM and SGLang print on one very long line; a paste that hard-wrapped them
# continues on lines without a header of their own.
_RECORD = re.compile(r"with config:|non-default args:|args: Namespace\(|server_args[=:]")
# Of those, the ones that open a bracket and end where it closes (an argument dict, a Namespace,
# ServerArgs): once it has closed, the record is whole, and a long line after it (a progress bar
# the paste kept) is a line of its own, not the rest of a hard wrap. vLLM's engine config is a
# bare list of fields, whose nested brackets may close at any cut.
_ENCLOSED_RECORD = re.compile(r"non-default args: (?=\{)|args: Namespace(?=\()|server_args=ServerArgs(?=\()")
_HEADER = re.compile(r"^(?:\(\w[^)]*pid=\d+|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) |\[\d{4}-\d\d-\d\d |\[\d\d:\d\d:\d\d)")
MAX_CONTINUATION = 400  # physical lines one wrapped line or record may span
MAX_JOINED = 1 << 16  # characters a joined line may reach (real records: under 20,000)
WRAPPED = 100  # a record line and its header-less successor both this long: a hard wrap
# A traceback printed without a prefix (SGLang, an excerpt) never continues a cut record.
_TRACEBACK = re.compile(r'^(?:File "|Traceback \(most recent call last\)|(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)\b)')
# A hard wrap inside an ordinary line leaves the rest on a line that opens with punctuation,
# or, wrapped at a space, with that one space and a word or figure (` secs, took 1.00 GiB`,
# ` 25809`) after a long line: two spaces or a capital open a line of its own (a traceback
# frame, an indented block, a progress bar).
_CUT_REST = re.compile(r"^[:,;.)\]}]")
# ROCm's runtime logs as `:<level>:<file>.cpp :<line>: …` (`:0:rocdevice.cpp :3586: … aborting with
# error`): a colon opens it, yet it is a line of its own, not the rest of the one above
_NATIVE_LOG = re.compile(r"^:\d+:[\w.]+\.(?:cpp|cc|c|h)\s*:\d+:")
_CUT_AT_SPACE = re.compile(r"^ (?=[a-z0-9])")
# A shell command that starts a server; it continues after a trailing `\` and on the lines an
# author wrapped it onto, which open with an option.
_COMMAND = re.compile(r"(?:^|\s)(?:python[\d.]*\s+-m\s+(?:sglang|vllm)\.|(?:sglang|vllm)\s+serve\b|docker\s+run\s)")
# An argument vector printed as a Python list, one element or a few per line (pprint, a Ray
# actor's argv): the list opens on a line ending with a comma, and goes on over lines of quoted
# elements, each behind the same process prefix, until `]`.
_QUOTED_ITEM = r"""(?:'[^'\n]*'|"[^"\n]*")"""
_ARGV_OPEN = re.compile(rf"\[\s*(?:{_QUOTED_ITEM}\s*,\s*)+$")
# (compiled once an argument vector opens: ~1 ms no other log pays)
# (a long element pprint splits into adjacent strings ends a line with no comma)
_ARGV_PIECE = LazyPattern(rf"^(?:{_QUOTED_ITEM}\s*,?\s*)*{_QUOTED_ITEM}\s*[,\]]?$")
_PROCESS_TAG = re.compile(r"^(?:\(\w[^)]*pid=\d+[^)]*\)\s*)+")
MAX_LINE = 1 << 20  # bytes kept of one physical line; a longer one is cut, not held
CHUNK = 1 << 20  # bytes read at a time


@frozen
class Line:
    number: int  # 1-based physical line number in the input
    text: str  # the cleaned text the grammar sees
    raw: str  # the line as read (decoded, truncated to MAX_LINE)


class _Encoded:
    """Text (a text-mode file, or lines) read as the UTF-8 bytes the source expects."""

    def __init__(self, pieces: Iterable[str]):
        self.pieces = iter(pieces)

    def read(self, size: int) -> bytes:
        out, held = [], 0
        for piece in self.pieces:
            out.append(piece)
            held += len(piece)
            if held >= size:
                break
        return "".join(out).encode("utf-8", "surrogateescape")

    def close(self) -> None:
        pass


def _text_pieces(fh: IO[str]) -> Iterator[str]:
    while piece := fh.read(CHUNK):
        yield piece


def _lines(lines: Iterable[str]) -> Iterator[str]:
    for line in lines:
        if not isinstance(line, str):
            raise InputError(f"lines must be text, not {type(line).__name__}")
        yield line if line.endswith("\n") else line + "\n"


# a path, `-`, the log's text, bytes, a file object, or lines
LogInput = Union[str, "os.PathLike[str]", bytes, IO[bytes], IO[str], Iterable[str]]


class PathArg(str):
    """A log named on the command line or found in a directory: always a path, even one whose
    name holds a newline (a plain str holding one is the log's text)."""

    def __fspath__(self) -> str:
        return str(self)


def log_name(log: LogInput) -> str:
    """What the report calls a log: its path, `-`, or the kind of object it was given as."""
    if isinstance(log, os.PathLike) or (isinstance(log, str) and "\n" not in log):
        return str(os.fspath(log))
    if isinstance(log, str):
        return "<text>"
    if isinstance(log, (bytes, bytearray)):
        return "<bytes>"
    return str(getattr(log, "name", "<stream>")) if hasattr(log, "read") else "<lines>"


def open_log(log: LogInput) -> tuple[IO[bytes], str, bool]:
    """Any form of log → (binary stream, name for the report, whether the caller closes it).

    A path (str or os.PathLike; `-` is stdin), a str holding a newline (the log's text),
    bytes, a binary or text file object, or an iterable of lines.
    """
    name = log_name(log)
    if isinstance(log, os.PathLike) or (isinstance(log, str) and "\n" not in log):
        return open_input(name), name, name != "-"
    if isinstance(log, str):
        return _Encoded([log]), name, False
    if isinstance(log, (bytes, bytearray)):
        return io.BytesIO(bytes(log)), name, False
    if hasattr(log, "read"):
        if isinstance(log.read(0), str):
            return _Encoded(_text_pieces(log)), name, False
        return log, name, False
    if isinstance(log, Iterable):
        return _Encoded(_lines(log)), name, False
    raise InputError(f"a log is a path, text, bytes, a file object or lines, not {type(log).__name__}")


def open_input(path: str) -> IO[bytes]:
    """Open a path or `-` (stdin) for binary reading, decompressed when it is gzip data (told by
    its magic bytes, not its name: a .gz piped in is read too); InputError on failure. A path is a
    str or path object: an int would be taken by open() as a file descriptor (the caller's stdout,
    closed after)."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bool):
        raise InputError(f"a file is given by its path (a str or a path object), not {type(path).__name__}")
    if path == "-":
        if sys.stdin is None:
            raise InputError("standard input is closed")
        return _stdin(sys.stdin.buffer)
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, not a log file")
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        head = fh.peek(len(_GZIP_MAGIC))[:len(_GZIP_MAGIC)]
    except OSError as exc:
        fh.close()
        raise InputError(f"{path}: cannot be read ({exc.strerror})") from None
    return _Gunzip(fh, path) if head == _GZIP_MAGIC else fh


_GZIP_MAGIC = b"\x1f\x8b"


def _stdin(fh: IO[bytes]) -> IO[bytes]:
    """Standard input, its first bytes read to tell gzip data. They are taken out of the
    stream's buffer whole (read1: what has arrived, never waiting for more than some), because
    a live pipe is then read from its descriptor, past that buffer."""
    head = b""
    try:
        while len(head) < len(_GZIP_MAGIC) and (piece := fh.read1(CHUNK)):
            head += piece
    except OSError as exc:
        raise InputError(f"standard input cannot be read ({exc.strerror or exc})") from None
    stream = _Prefixed(head, fh)
    return _Gunzip(stream, "standard input") if head.startswith(_GZIP_MAGIC) else stream


class _Prefixed:
    """A stream with the bytes already read from it put back in front."""

    def __init__(self, head: bytes, stream: IO[bytes]):
        self.head, self.stream = head, stream

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            head, self.head = self.head, b""
            return head + self.stream.read()
        head, self.head = self.head[:size], self.head[size:]
        return head + self.stream.read(size - len(head)) if len(head) < size else head

    def take_head(self) -> bytes:
        head, self.head = self.head, b""
        return head

    def fileno(self) -> int:
        return self.stream.fileno()

    def close(self) -> None:
        self.stream.close()


class _Gunzip:
    """gzip data decompressed (members one after another, trailing NUL padding ignored, as
    gunzip does). Bytes after the last member that are no gzip member are refused, like a
    truncated or corrupt file: the file is not what it claims to be (`gunzip -c FILE |
    capdiag explain` reads the part before them: gunzip warns and decompresses it). No
    fileno(): what it reads is not the descriptor's bytes, so it is read like a file, never as
    a live pipe."""

    def __init__(self, fh: IO[bytes], name: str):
        self.fh, self.gz, self.name = fh, gzip.GzipFile(fileobj=fh), name

    def read(self, size: int = -1) -> bytes:
        try:
            return self.gz.read(size)
        except gzip.BadGzipFile as exc:
            # the first member's magic was checked before: this is what follows the last one
            if str(exc).startswith("Not a gzipped file"):
                raise InputError(f"{self.name}: not a whole gzip file: data that is not gzip follows its compressed "
                                 "stream (trailing garbage); `gunzip -c` decompresses the part before it") from None
            raise

    def close(self) -> None:
        self.gz.close()  # leaves the file it read alone
        self.fh.close()


IDLE_S = 0.25  # a live stream that sends nothing for this long has paused
LINGER_S = 2.0  # how long a live stream is read on after finish() when it never pauses


class LiveStream:
    """A pipe read as its writer sends: `read` returns what has arrived (None when nothing
    has for IDLE_S, so a held line can be let through), and after `finish()` the stream ends
    at its next pause, or LINGER_S later, without waiting for the writer to close it.
    A regular file has no pauses to wait for: after `finish()` it ends at once."""

    def __init__(self, stream: IO[bytes]):
        self.stream, self.deadline = stream, None
        try:
            self.fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # no descriptor of its own (decompressed, in memory)
            self.fd = None
        self.regular = self.fd is None or stat.S_ISREG(os.fstat(self.fd).st_mode)

    @staticmethod
    def wanted(stream: IO[bytes]) -> bool:
        """Whether `stream` is a pipe or socket, which can stay open after the start-up."""
        try:
            mode = os.fstat(stream.fileno()).st_mode
        except (AttributeError, OSError, ValueError):  # no file descriptor (a test's BytesIO)
            return False
        return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)

    def finish(self) -> None:
        if self.deadline is None:
            self.deadline = time.monotonic() + LINGER_S

    def read(self, size: int) -> bytes | None:
        if self.deadline is not None and (self.regular or time.monotonic() > self.deadline):
            return b""
        if self.regular:
            return self.stream.read(size)
        if isinstance(self.stream, _Prefixed) and self.stream.head:  # read before the descriptor was
            return self.stream.take_head()
        if not select.select([self.fd], [], [], IDLE_S)[0]:
            return b"" if self.deadline is not None else None
        return os.read(self.fd, size)

    def close(self) -> None:
        self.stream.close()


_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
SNIFF = 512  # bytes of the start a BOM-less UTF-16 file is recognised by


class _Recoded:
    """The rest of a stream whose first chunk was read to learn its encoding, as UTF-8 bytes:
    as it is (UTF-8, its BOM dropped), or decoded from UTF-16 (a log saved by PowerShell's `>`
    is UTF-16LE with a BOM and CRLF line ends). A read that returns None (a paused live
    stream) passes through."""

    def __init__(self, stream, first: bytes | None, encoding: str | None):
        self.stream, self.first, self.whole = stream, first, False
        self.decoder = codecs.getincrementaldecoder(encoding)("replace") if encoding else None

    def read(self, size: int) -> bytes | None:
        while True:
            chunk, self.first = (self.first, None) if self.first is not None else (self.stream.read(size), None)
            if chunk is None or self.decoder is None:
                return chunk
            text = self.decoder.decode(chunk, final=chunk == b"")
            if text or chunk == b"":  # an odd byte alone decodes to nothing yet: read on
                return text.encode("utf-8", "surrogatepass")

    def fill(self, buffer: bytearray, held: int) -> int | None:
        """Put the next chunk (what read(CHUNK) would return) into `buffer` after its first
        `held` bytes, growing it if need be; its length (0 at the end, None when a live stream
        paused). A file or BytesIO read as it is is read straight into the buffer: no new
        bytes object a chunk. (Only after a whole chunk: a short one was the end, and a small
        log is not worth a buffer of CHUNK bytes.)"""
        if self.whole and self.first is None and self.decoder is None and isinstance(self.stream, _READ_INTO):
            if len(buffer) < held + CHUNK:
                buffer.extend(bytes(held + CHUNK - len(buffer)))
            with memoryview(buffer) as view:
                got = self.stream.readinto(view[held:held + CHUNK])
        else:
            chunk = self.read(CHUNK)
            if chunk:
                buffer[held:held + len(chunk)] = chunk
            got = None if chunk is None else len(chunk)
        self.whole = got == CHUNK
        return got

    def close(self) -> None:
        self.stream.close()


# streams whose readinto() fills what it is given as read() would return it
_READ_INTO = (io.BufferedReader, io.BytesIO)


def recoded(stream) -> _Recoded:
    """The stream as UTF-8 bytes, its encoding told by a byte-order mark (UTF-8, UTF-16LE/BE) or,
    without one, by the NULs of UTF-16 in every other byte of text. A real binary has NULs with
    no such order and is refused later (physical_runs)."""
    first = stream.read(CHUNK)
    if not first:
        return _Recoded(stream, first, None)
    if first.startswith(codecs.BOM_UTF8):
        return _Recoded(stream, first[len(codecs.BOM_UTF8):], None)
    for bom, encoding in _BOMS[1:]:
        # `\xff\xfe` can also open a UTF-8 file of garbage: the text after it must look UTF-16
        rest = first[len(bom):]
        if first.startswith(bom) and (len(rest) < 8 or _utf16_order(rest) == encoding):
            return _Recoded(stream, rest, encoding)
    return _Recoded(stream, first, _utf16_order(first))


def _utf16_order(data: bytes) -> str | None:
    """`utf-16-le`/`utf-16-be` when the start of data is mostly ASCII text in UTF-16 — a NUL in
    every other byte and none between — else None (UTF-8, a binary, or too short to tell)."""
    head = data[:SNIFF - SNIFF % 2]
    if len(head) < 8:
        return None
    even, odd = head[0::2], head[1::2]
    for nuls, text, encoding in ((odd, even, "utf-16-le"), (even, odd, "utf-16-be")):
        if nuls.count(0) >= 0.9 * len(nuls) and text.count(0) == 0:
            return encoding
    return None


def physical_runs(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """The input a block of whole lines at a time: the number of the block's first line, and
    its bytes (each line ends with "\n" but perhaps the file's last). Not decoded: only the
    lines worth reading are (line_text()). Raises InputError for binary or unreadable data.
    A stream whose `read` returns None has paused: an empty block says so (candidate_runs
    then lets a held line through instead of waiting for the next one).

    A block is the lines that end in one more CHUNK of the input (so the blocks, and the
    run-time series cut from them, do not depend on how the input is read).
    """
    for first, block, _ in _numbered(stream, False):
        yield first, block


def scanned_runs(stream: IO[bytes]) -> Iterator[tuple[int, bytes, list[int]]]:
    """physical_runs() read a few blocks ahead, on worker threads, for a long regular file (see
    reads_ahead(); never a live stream): each block with the offsets of its lines that hold an
    anchor (what candidate_runs() would search it for), counted and searched while the blocks
    before it are read. (Read in order, a block is searched only once the one before it is let
    go: here one more block is held.)"""
    return _numbered(stream, True)


def _numbered(stream: IO[bytes], ahead: bool) -> Iterator[tuple[int, bytes, list[int] | None]]:
    """The numbered blocks; `ahead`: read, counted and searched on the workers (else the blocks
    are only counted, in order, and candidate_runs searches each once it is let go)."""
    # split on "\n" only: a "\r" inside a line is a progress-bar rewrite that clean() splits,
    # and must not shift the line numbers the report cites
    size, number = _size(stream), 0
    if ahead:  # imported and compiled once, here, rather than by two workers at once
        _hyperscan()
        if size >= NUMPY_FROM:
            _numpy()

    def measured(run: tuple[bytes, int]) -> tuple[int, list[int] | None]:
        block, read = run
        return _newlines(block, max(read, size)), _hit_starts(block) if ahead and block else None

    for (block, _), (count, starts) in mapped(measured, _blocks(stream), ahead):
        if block:
            _refuse_binary(block, number)
        yield number + 1, block, starts
        number += count


def _blocks(stream: IO[bytes]) -> Iterator[tuple[bytes, int]]:
    """physical_runs()'s blocks (b"" where the stream paused), each with the bytes of the input
    read so far. The input is read into one reused buffer behind the start of a line the last
    chunk cut (at most MAX_LINE bytes), and each block is copied out of it once."""
    held, skipping, read = 0, False, 0
    buffer = bytearray()
    try:
        stream = recoded(stream)
        while (got := stream.fill(buffer, held)) != 0:
            if got is None:
                yield b"", read
                continue
            start, end, read = 0, held + got, read + got
            if skipping:  # the rest of a line longer than MAX_LINE, whose head was kept (held is 0)
                cut = buffer.find(b"\n", 0, end)
                if cut < 0:
                    continue
                start, skipping = cut + 1, False
            cut = buffer.rfind(b"\n", max(start, held), end)  # the held bytes hold no newline
            if cut < 0:
                if start:
                    buffer[:end - start] = buffer[start:end]
                held = end - start
                if held <= MAX_LINE:
                    continue
                block, held, skipping = bytes(buffer[:MAX_LINE]) + b"\n", 0, True
            else:
                with memoryview(buffer) as view:
                    block = bytes(view[start:cut + 1])
                held = end - cut - 1
                buffer[:held] = buffer[cut + 1:end]
            yield block, read
        if held:
            yield bytes(buffer[:held]), read
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"the input cannot be read: {exc}") from None


_CONTROL_BYTES = bytes(b for b in range(1, 32) if b not in b"\t\n\r\x1b\x0c")


def _refuse_binary(block: bytes, before: int) -> None:
    """InputError when one of the file's first five lines is mostly NUL bytes, or the file's
    first 64 KiB is mostly neither UTF-8 nor text (random bytes hold few NULs)."""
    if before == 0:
        sample = block[:1 << 16]
        controls = len(sample) - len(sample.translate(None, _CONTROL_BYTES))
        if controls + sample.decode("utf-8", "replace").count("\ufffd") > len(sample) // 4:
            raise InputError("the input is binary data, not a text log")
    if before < 5 and b"\x00" in block:
        for line in block.split(b"\n", 5)[:5 - before]:
            if line.count(b"\x00") > (len(line) + 1) // 8:
                raise InputError("the input is binary data, not a text log")


def line_text(data: bytes) -> str:
    """One physical line's bytes (no "\n") as the text the rest of capdiag sees, evidence
    included: decoded, a JSON log record's line taken out of it, ANSI colour and NULs removed
    (so no output format ever shows them)."""
    text = data[:MAX_LINE].decode("utf-8", "replace").rstrip("\r")
    if "{" in text and _JSON_LINE.match(text):
        text = _json_log(text)
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "#033[" in text:
        text = _ESCAPED_ANSI.sub("", text)
    return text.replace("\x00", "") if "\x00" in text else text


def _json_log(text: str) -> str:
    """The log line a JSON record carries (`{"log": "INFO …\\n", "stream": "stderr", …}`), or the
    text as it is when it is no such record. json.loads only: nothing from a log is evaluated."""
    try:
        record = json.loads(text)
    except ValueError:
        return text
    message = next((record[k] for k in _JSON_FIELDS if isinstance(record.get(k), str)), None) \
        if isinstance(record, dict) else None
    if message is None:
        return text
    message = message.rstrip("\r\n")
    # vLLM's own JSON formatter keeps the header in fields: put it back as its text form
    # prints it, so the process tag still names the rank
    head = [f"{record[k]}" for k in ("levelname", "asctime") if isinstance(record.get(k), str)]
    process, pid = record.get("processName"), record.get("process")
    if isinstance(process, str) and process != "MainProcess" and isinstance(pid, int):
        head.insert(0, f"({process} pid={pid})")
    return " ".join(head + [message])


def physical_lines(stream: IO[bytes]) -> Iterator[tuple[int, str]]:
    """Decoded lines with their numbers (see physical_runs)."""
    for first, block in physical_runs(stream):
        lines = block.split(b"\n")
        if block.endswith(b"\n"):
            lines.pop()
        yield from enumerate(map(line_text, lines), first)


def clean(raw: str) -> list[str]:
    """The log lines inside one physical line (as line_text() gives it), transport noise removed."""
    text = _ANSI.sub("", raw) if "\x1b" in raw else raw  # a caller's line that did not pass line_text()
    pieces = text.split("\r") if "\r" in text else [text]
    out = []
    for piece in pieces:
        for part in _GLUED.split(piece) if "[" in piece or "pid=" in piece else [piece]:
            part = _TRANSPORT.sub("", part, count=1).strip()
            if "across cluster]" in part:
                part = _RAY_REPEAT.sub("", part)
            if part:
                out.append(part)
    return out


def ray_repeats(raw: str) -> int:
    """How many more lines Ray folded into this one (`[repeated 3x across cluster]`), else 0."""
    found = _RAY_REPEAT.search(raw) if "across cluster]" in raw else None
    return int(found.group(1)) if found else 0


def open_brackets(text: str) -> int:
    """Brackets opened and not closed, outside quoted strings: > 0 means the record is cut."""
    return bracket_state(text)[0]


def bracket_state(text: str, state: tuple[int, str, bool] = (0, "", False)) -> tuple[int, str, bool]:
    """(depth, open quote, escape pending) after `text`, from `state`: a record joined piece by
    piece is scanned once, not once per piece."""
    depth, quote, escaped = state
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
    return depth, quote, escaped


def _closed(record: str) -> bool:
    """Whether a record that opens a bracket (_ENCLOSED_RECORD) has closed it where its text ends
    (the header's own brackets, `[utils.py:328]`, before it are not counted)."""
    opening = _ENCLOSED_RECORD.search(record)
    body = record[opening.end():].rstrip() if opening else ""
    return body[-1:] in (")", "}") and bracket_state(body)[0] == 0


def has_keyword(text: str) -> bool:
    """Whether a cleaned line holds one of KEYWORDS (in any case)."""
    return bool(_SCANNER.find_matches_as_indexes(text.encode("utf-8", "surrogatepass").lower()))


def _hit_starts(block: bytes) -> list[int]:
    """Sorted offsets of the starts of the block's lines that hold an anchor (all those that
    hold a keyword, and a few more)."""
    scan = block
    if b"\x1b" in scan:
        scan = _ANSI_BYTES.sub(b"", scan)
    if b"\x00" in scan:
        scan = scan.replace(b"\x00", b"")
    # non-overlapping matches miss none of the lines that hold one: no keyword spans a newline
    found = _keyword_offsets(scan)
    if scan is block:
        return sorted({block.rfind(b"\n", 0, at) + 1 for at in found})
    # the removals moved the offsets but kept the newlines: go by line index instead
    rows, row, done = set(), 0, 0
    for at in found:
        row += scan.count(b"\n", done, at)
        done = at
        rows.add(row)
    starts, row, at = [], 0, 0
    for wanted in sorted(rows):
        while row < wanted:
            at = block.index(b"\n", at) + 1
            row += 1
        starts.append(at)
    return starts


def _runs(numbered: Iterable[tuple[int, str]]) -> Iterator[tuple[int, bytes]]:
    """Numbered lines regrouped into blocks of consecutive numbers, each at most BATCH lines."""
    first, lines = 0, []
    for number, raw in numbered:
        if lines and (number != first + len(lines) or len(lines) == BATCH):
            yield first, _block(lines)
            lines = []
        if not lines:
            first = number
        lines.append(raw.replace("\n", " "))  # a newline would shift the numbers
    if lines:
        yield first, _block(lines)


def _block(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")


def candidate_lines(numbered: Iterable[tuple[int, str]]) -> Iterator[Line]:
    """candidate_runs() for lines given one by one with their numbers."""
    return candidate_runs(_runs(numbered))


def _joined(pending: Line, text: str, raw: str, separator: str) -> Line | None:
    """The held line continued by one more physical line; None past MAX_JOINED."""
    if len(pending.text) + len(text) > MAX_JOINED or len(pending.raw) + len(raw) > MAX_JOINED:
        return None
    return Line(pending.number, pending.text + separator + text, pending.raw + "\n" + raw)


def candidate_runs(runs: Iterable[tuple], traffic=None) -> Iterator[Line]:
    """Lines that may hold a fact, with wrapped continuations joined.

    `traffic` (a capdiag.traffic.TrafficAggregator, or None) is handed every block, ANSI codes
    taken out, and told where each start-up record begins, so request-time lines are summed on
    the way past without becoming lines here.

    Three kinds of wrapping are undone: a long record (engine config, argument dict,
    server_args) hard-wrapped by a paste continues on the following lines that have no header
    of their own, joined as they are — while its brackets are still open, or while the lines
    run at the wrap width; any line hard-wrapped mid-sentence continues on a line
    that opens with punctuation (`: 29053`); a line an author wrapped after a comma continues
    on the next line when that one has no prefix, joined with a space; a launch command
    continues after a trailing `\\` and on the lines that open with an option (`--tp 8`); an
    argument vector printed as a Python list continues over the lines of its quoted elements,
    each behind its process prefix, until the list closes.

    `runs` are physical_runs()' (line number, block) pairs, or scanned_runs()' triples, whose
    blocks have been searched already.
    """
    pending: Line | None = None
    record = command = False
    argv: str | None = None  # while a list is open: the process prefix its elements come behind
    spans = 0
    last_piece = ""
    brackets = None  # the held record's bracket_state(), once needed
    for run in runs:
        first, block = run[0], run[1]
        if not block:  # the input paused: a held line is complete as far as anyone knows
            if pending is not None:
                yield pending
                pending = None
            continue
        starts = run[2] if len(run) > 2 else _hit_starts(block)
        cursor, number, fed, fed_line = 0, first - 1, 0, first
        while cursor < len(block):
            if pending is None:  # nothing held: skip to the next line with a keyword
                at = bisect.bisect_left(starts, cursor)
                if at == len(starts):
                    break
                number += block.count(b"\n", cursor, starts[at])
                cursor = starts[at]
            end = block.find(b"\n", cursor)
            end = len(block) if end < 0 else end
            raw = line_text(block[cursor:end])
            line_start, cursor, number = cursor, end + 1, number + 1
            for text in clean(raw):
                if pending is not None:
                    joined = None
                    piece = _PROCESS_TAG.sub("", text, count=1) if argv is not None else ""
                    if spans >= MAX_CONTINUATION:
                        pass
                    elif argv is not None and _ARGV_PIECE.match(piece) and text.startswith(argv):
                        joined = _joined(pending, piece, raw, " ")
                        argv = None if piece.endswith("]") else argv
                    elif argv and not text.startswith(argv):
                        # another process's line inside the list (Ray interleaves its actors):
                        # read on its own, and the list goes on after it
                        spans += 1
                        if has_keyword(text):
                            yield Line(number, text[:MAX_JOINED], raw[:MAX_JOINED])
                        continue
                    elif not record and _CUT_REST.match(text) and not _NATIVE_LOG.match(text):
                        joined = _joined(pending, text, raw, "")
                    elif (not record and _CUT_AT_SPACE.match(raw) and len(pending.raw) - pending.raw.rfind("\n") > WRAPPED
                          and not _HEADER.match(text) and not _TRACEBACK.match(text)):
                        joined = _joined(pending, text, raw, " ")
                    elif record and text and not _HEADER.match(text) and not _TRACEBACK.match(text):
                        brackets = brackets or bracket_state(pending.text)  # only when a line may continue it
                        if brackets[0] > 0 or (len(last_piece) >= WRAPPED and (len(text) >= WRAPPED or spans > 0)
                                               and not _closed(pending.text)):
                            joined = _joined(pending, text, raw, "")
                            brackets, last_piece = bracket_state(text, brackets), text
                    elif not record and pending.text.endswith(",") and not text.startswith(("[", "(")):
                        joined = _joined(pending, text, raw, " ")
                    if joined is not None:
                        pending, spans = joined, spans + 1
                        continue
                    if command and spans < MAX_CONTINUATION and (pending.text.endswith("\\") or text.startswith("--")):
                        joined = _joined(attrs.evolve(pending, text=pending.text.rstrip("\\ ")), text, raw, " ")
                        if joined is not None:
                            pending, spans = joined, spans + 1
                            continue
                    yield pending
                    pending = None
                if not has_keyword(text):
                    continue
                line = Line(number, text[:MAX_JOINED], raw[:MAX_JOINED])
                command = False
                opened = _ARGV_OPEN.search(text)
                tag = _PROCESS_TAG.match(text) if opened else None
                argv = (tag.group(0).rstrip() if tag else "") if opened else None
                spans = 0
                if _RECORD.search(text):
                    if traffic is not None:
                        _feed_traffic(traffic, fed_line, block, fed, line_start)
                        fed, fed_line = line_start, number
                        traffic.restart(number)
                    pending, record, last_piece, brackets = line, True, raw, None
                else:  # held one line: it may continue on the next (soft or hard wrap)
                    pending, record, spans, command = line, False, 0, bool(_COMMAND.search(text))
        if traffic is not None:
            _feed_traffic(traffic, fed_line, block, fed, len(block))
    if pending is not None:
        yield pending


def _feed_traffic(traffic, line: int, block: bytes, start: int, stop: int) -> None:
    """Hand block[start:stop], whose first line is number `line`, to the traffic sink without
    ANSI codes. (The number is carried, not counted from the block's start: a block holding
    many start-up records would be counted over once per record.)"""
    if stop > start:
        piece = block if (start, stop) == (0, len(block)) else block[start:stop]
        if b"\x1b" in piece:
            piece = _ANSI_BYTES.sub(b"", piece)
        traffic.feed(line, piece)
