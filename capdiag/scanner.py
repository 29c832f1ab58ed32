"""Which traffic scanner reads the traffic lines: the compiled one (capdiag/_scan.c), where it
was built, from the wordings capdiag/traffic_shapes.py declares now, else the Python path in
capdiag/traffic.py. Both give the same report; the compiled one is ~20x faster.

`CAPDIAG_PURE_PYTHON=1` takes the Python path whatever was built (the tests and the benchmark
run both).
"""
from __future__ import annotations

import os
from functools import lru_cache
from typing import Optional, Sequence

from capdiag import traffic_shapes as shapes

PURE_ENV = "CAPDIAG_PURE_PYTHON"


@lru_cache(maxsize=1)
def loaded() -> tuple[object, str]:
    """(the compiled module or None, the sentence that says which path and why)."""
    try:
        from capdiag import _scan
    except ImportError:
        _scan = None
    if os.environ.get(PURE_ENV, "").strip() not in ("", "0"):
        return None, f"Python (the compiled scanner is built but {PURE_ENV} is set)" if _scan else \
            f"Python ({PURE_ENV} is set)"
    if _scan is None:
        return None, "Python (the compiled scanner was not built: no C compiler when capdiag was installed)"
    if _scan.digest() != shapes.digest():
        return None, ("Python (the compiled scanner was built from other wordings than capdiag/traffic_shapes.py "
                      "declares: reinstall capdiag to rebuild it)")
    return _scan, "compiled (capdiag/_scan.c)"


def built() -> bool:
    """Whether the compiled scanner reads traffic lines in this run."""
    return loaded()[0] is not None


def histogram():
    """A new compiled histogram of (usage, queued, running) counts, or None without the scanner."""
    native, _ = loaded()
    return None if native is None else native.Histogram()


@lru_cache(maxsize=32)
def _key(needle: bytes) -> int:
    return shapes.key(needle)


def contains(block: bytes, needle: bytes) -> bool:
    """`needle in block`, found by memchr of the needle's rarest byte where the scanner is built
    (Python's own search costs a pass of ~0.35 s a GiB)."""
    native, _ = loaded()
    return needle in block if native is None else native.contains(block, needle, _key(needle))


def first_engine(block: bytes) -> bytes:
    """The tag of the block's first `Engine N: Avg prompt` (what traffic._V_ENGINES.search finds),
    b"" where none; needs the compiled scanner."""
    return loaded()[0].first_engine(block) or b""


def scan(vllm: bool, block: bytes, cuts: Sequence[tuple[int, int]], counts, engine: bytes = b"") -> Optional[list]:
    """Per stretch of `block` (`cuts`: (start, stop) of whole lines), what its traffic lines
    sum to (None for a stretch without one), the block's lines counted into `counts` (the rank's
    histogram(): {(usage as printed, queued, running as printed): lines}); None, with `counts`
    as it was, when the Python path must read the block (no compiled scanner, or a line it does
    not read wholly).
    The tuples: SGLang (lines, top queue, top running, top usage, throughput low, high,
    context tokens, context requests, prompt tokens, prompt requests, most new tokens in one
    prefill, prefill lines); vLLM (lines, top queue, top running, top usage, generation
    throughput low, high, preemptions printed, their sum). Usage and throughput as floats of
    the figures printed, None where none was. vLLM's `engine`: the tag the block's first
    `Engine N: Avg prompt` gives (b"" where none): lines of another engine hand the block back."""
    native, _ = loaded()
    if native is None or counts is None:
        return None
    return native.scan(vllm, block, cuts, counts, engine)
