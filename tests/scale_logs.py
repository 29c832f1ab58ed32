"""Generators of very large logs in the servers' real formats (issue 14's scale cases).

Built from the bundled example start-up (SGLang, Llama-3.1-8B on one H100), so every line is
one SGLang prints. The tests build them at small sizes and check the work is linear by its
structure; benchmarks/bench_scale.py builds them at full size and times them. Standard
library only, so the benchmark runs under any python.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

EXAMPLE = Path(__file__).resolve().parents[1] / "capdiag" / "examples" / "sglang-llama31-8b-h100.log"
TEXT = EXAMPLE.read_text(encoding="utf-8")
LINES = TEXT.splitlines()
TP = 8  # ranks per data-parallel replica in the many-ranks log


def _stamp(line: str) -> tuple[str, str]:
    """`[2026-03-02 09:14:16] body` → ("2026-03-02 09:14:16", "body")."""
    head, body = line[1:].split("] ", 1)
    return head, body


def _per_rank() -> list[tuple[str, str]]:
    """The example's lines that every rank prints (init, weights, KV pool, graphs), stamped."""
    start = next(i for i, l in enumerate(LINES) if "Init torch distributed begin" in l)
    end = next(i for i, l in enumerate(LINES) if "Capture cuda graph end" in l)
    return [_stamp(l) for l in LINES[start:end + 1] if l.startswith("[")]


def many_ranks(ranks: int) -> Iterator[str]:
    """One SGLang start-up over `ranks` GPUs: dp_size × tp_size 8, every rank's lines tagged
    `[time DPd TPt]` as SGLang tags them, the ranks interleaved kind by kind as they print
    at the same moment; then the main process's ready lines."""
    if ranks % TP:
        raise ValueError(f"ranks: a multiple of {TP}")
    yield LINES[0].replace("tp_size=1", f"tp_size={TP}").replace("dp_size=1", f"dp_size={ranks // TP}")
    for stamp, body in _per_rank():
        for rank in range(ranks):
            yield f"[{stamp} DP{rank // TP} TP{rank % TP}] {body}"
    end = next(i for i, l in enumerate(LINES) if l.startswith("[2026-03-02 09:14:28] max_total_num_tokens"))
    yield from LINES[end:]


def many_launches(launches: int) -> Iterator[str]:
    """The example start-up `launches` times over: a server restarted again and again (each
    restart prints its own server_args and start-up)."""
    for _ in range(launches):
        yield from LINES


def soft_wrapped_paste(size: int) -> Iterator[str]:
    """A paste of about `size` bytes: the example start-up repeated, each line longer than 80
    columns hard-wrapped at 80 as a terminal or chat window wraps a paste (the record lines,
    the batch list, the max_total_num_tokens line)."""
    written = 0
    while written < size:
        for line in LINES:
            for at in range(0, max(len(line), 1), 80):
                piece = line[at:at + 80]
                written += len(piece) + 1
                yield piece


def comma_continued(pieces: int) -> Iterator[str]:
    """One keyword line continued by `pieces` author-wrapped lines that each end in a comma."""
    yield from LINES[:18]
    yield "[2026-03-02 09:14:28] max_total_num_tokens=415615,"
    for n in range(pieces):
        yield f"chunked_prefill_size={8192 + n},"
    yield from LINES[19:]


def keyword_lines(count: int) -> Iterator[str]:
    """The example start-up, then `count` lines that hold a keyword a server prints while it
    serves: a warning naming an Exception and a timeout, every one different (no two share
    a parse), as a server under a failing client does for hours."""
    yield from LINES
    for n in range(count):
        yield (f"[2026-03-02 10:{n // 60000 % 60:02d}:{n // 1000 % 60:02d}] WARNING: Exception in ASGI "
               f"application: request {n} hit ReadTimeout after {n % 997} ms")


def tracebacks_after_ready(count: int) -> Iterator[str]:
    """The example start-up, then `count` tracebacks as uvicorn prints them for requests that
    fail while the server serves (each different in its request): `ERROR:    Exception in ASGI
    application`, the traceback's lines with no prefix, the exception."""
    yield from LINES
    for n in range(count):
        yield "ERROR:    Exception in ASGI application"
        yield "Traceback (most recent call last):"
        yield '  File "/usr/local/lib/python3.12/site-packages/uvicorn/protocols/http/httptools_impl.py", line 409, in run_asgi'
        yield "    result = await app(  # type: ignore[func-returns-value]"
        yield '  File "/sgl-workspace/sglang/python/sglang/srt/entrypoints/http_server.py", line 1012, in v1_chat_completions'
        yield "    return await raw_request.app.state.openai_serving_chat.handle_request(request, raw_request)"
        yield f"ValueError: request {n}: input of {4096 + n % 997} tokens is longer than the model's context length"


def write(path: Path, lines: Iterator[str]) -> int:
    """Write the lines to `path`; the number written."""
    count = 0
    with open(path, "w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(line + "\n")
            count += 1
    return count
