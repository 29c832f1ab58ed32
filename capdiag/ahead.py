"""A map in order whose work runs on worker threads a few items ahead of the one who reads it.

A long log's reading costs are C calls that let go of the GIL while they run: hyperscan's
keyword scan, numpy's newline count, the file's reads. On worker threads they overlap with
each other and with what the reading thread does in Python, so a second core shortens the
pass instead of idling. The results, and their order, are those of the plain map.
"""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from itertools import chain
from typing import Callable, Iterable, Iterator, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

WORKERS = 2  # on two cores, two beat one by a fifth (the reading thread sleeps while it waits)
# items handed out per worker before the reader takes one back: each holds a 1 MiB block; on a
# 1 GiB log, one left the workers idle a tenth of the time, two cost 1 MiB of peak RSS more
DEPTH = 2


@lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="capdiag-ahead")


# a forked child has none of its parent's threads: a pool inherited from before the fork would
# take work that no thread ever does
if hasattr(os, "register_at_fork"):  # (no fork on Windows)
    os.register_at_fork(after_in_child=_pool.cache_clear)


def mapped(fn: Callable[[Item], Result], items: Iterable[Item], ahead: bool) -> Iterator[tuple[Item, Result]]:
    """(item, fn(item)) for each item, in order. With `ahead`, items are taken from `items` and
    handed to the workers up to WORKERS * DEPTH before the consumer reaches them, so only an
    iterable that may be read early is given with it (a file, not a live pipe whose reader
    waits). An exception, fn's or the items' own, comes out where it would have in order: after
    the items before it."""
    if not ahead:
        for item in items:
            yield item, fn(item)
        return
    pool, pending = _pool(), deque()
    items, failure, rest = iter(items), None, ()
    while True:
        try:
            item = next(items)
        except StopIteration:
            break
        except Exception as exc:  # the items' own error (a read failed): the items before it go first
            failure = exc
            break
        try:
            pending.append((item, pool.submit(fn, item)))
        except RuntimeError:  # no thread to be had (the interpreter is shutting down): the rest in order
            rest = chain((item,), items)
            break
        if len(pending) > WORKERS * DEPTH:
            done, future = pending.popleft()
            yield done, future.result()
    while pending:
        done, future = pending.popleft()
        yield done, future.result()
    if failure is not None:
        raise failure
    yield from mapped(fn, rest, False)
