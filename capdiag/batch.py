"""Many logs at once (`capdiag explain LOG LOG… | DIR`): one report per log, made in worker
processes (one per core by default), given back in input order; a log that cannot be read is
reported with its one-line error and the others go on."""
from __future__ import annotations

import collections
import functools
import itertools
import multiprocessing
import os
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any, Callable, Iterator, Optional, Sequence

from capdiag.errors import InputError
from capdiag.frozen import frozen
from capdiag.parsing import build_parsers
from capdiag.source import PathArg

LOG_SUFFIXES = (".log", ".log.gz")
SUMMARY_COLUMNS = ("log", "model", "framework", "gpu", "tp", "weights_gib", "kv_gib", "kv_tokens", "request_tokens",
                   "concurrency", "concurrency_upper_bound", "worst_severity", "worst_code", "worst_finding", "phase",
                   "error")


@frozen
class Item:
    """One log's outcome: its report (as data, the JSON contract) or the one-line error."""

    path: str
    report: Optional[dict]
    error: Optional[str]


def expand(logs: Sequence[str]) -> list[str]:
    """The logs named, a directory standing for its `*.log` and `*.log.gz` files in name order."""
    paths: list[str] = []
    for log in logs:
        if log != "-" and os.path.isdir(log):
            found = sorted(PathArg(os.path.join(log, n)) for n in os.listdir(log)
                           if n.endswith(LOG_SUFFIXES) and os.path.isfile(os.path.join(log, n)))
            if not found:
                raise InputError(f"{log}: a directory with no {' or '.join('*' + s for s in LOG_SUFFIXES)} file")
            paths.extend(found)
        else:
            paths.append(log)
    return paths


# what makes one log's report (capdiag.api.report_of): given by the caller, so that this module,
# which the API's own explain_many uses, does not import the API back
Explain = Callable[..., dict]


def _explain(explain: Explain, job: tuple[str, dict[str, Any]]) -> Item:
    path, inputs = job
    try:
        return Item(path, explain(path, **inputs), None)
    except InputError as exc:
        message = str(exc)
        return Item(path, None, message if message.startswith(path) else f"{path}: {message}")


def explain_many(logs: Sequence[str], explain: Explain, *, jobs: Optional[int] = None,
                 executor: Optional[Executor] = None, **inputs: Any) -> Iterator[Item]:
    """Each log's Item, in the order given (directories expanded), its report made by
    `explain(path, **inputs)` (a module-level function: workers are handed it by name) in
    `jobs` worker processes (default: one per core; 1 works in this process), or by `executor`
    (any concurrent.futures.Executor: a Dask or Ray cluster's runs it unchanged). At most a few
    batches per worker are in flight, so the reports held at once do not grow with the logs."""
    paths = expand(logs)
    work = [(path, inputs) for path in paths]
    task = functools.partial(_explain, explain)
    if executor is not None:
        yield from _in_order(executor, task, work, batch=1, window=4 * max(1, jobs or os.cpu_count() or 1))
        return
    jobs = min(jobs or os.cpu_count() or 1, len(paths))
    if jobs <= 1:
        yield from map(task, work)
        return
    # forked workers inherit the imports and the parsers built here; a log is ~30 ms of work,
    # so they take several at a time
    build_parsers()
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        yield from _in_order(pool, task, work, batch=max(1, min(16, len(work) // (jobs * 4))), window=jobs * 2)


def _run_batch(task: Callable, jobs: list) -> list:
    return [task(job) for job in jobs]


def _in_order(pool: Executor, task: Callable, work: list, batch: int, window: int) -> Iterator[Item]:
    """`task` over `work` on `pool`, `batch` jobs a submission, at most `window` submissions
    in flight, the results in the order of `work` (Executor.map would submit them all at once
    and hold every result the reader has not taken yet)."""
    batches = iter([work[i:i + batch] for i in range(0, len(work), batch)])
    pending: collections.deque = collections.deque()
    for jobs in itertools.islice(batches, window):
        pending.append(pool.submit(_run_batch, task, jobs))
    while pending:
        done = pending.popleft().result()
        for jobs in itertools.islice(batches, 1):
            pending.append(pool.submit(_run_batch, task, jobs))
        yield from done


def summary_row(item: Item) -> dict[str, Any]:
    """One log as a row of the summary table and the CSV (SUMMARY_COLUMNS; None: not known)."""
    if item.report is None:
        return {**dict.fromkeys(SUMMARY_COLUMNS), "log": item.path, "error": item.error}
    r = item.report
    rows = {b["category"]: b["gib"] for b in r["breakdown"]}
    first = r["concurrency"][0] if r["concurrency"] else {}
    worst = r["findings"][0] if r["findings"] else None
    return {"log": item.path, "model": r["config"].get("model"), "framework": r["framework"],
            "gpu": r["gpu"].get("alias") or r["gpu"].get("name"), "tp": r["config"].get("tp_size"),
            "weights_gib": rows.get("weights"), "kv_gib": rows.get("kv_cache"), "kv_tokens": r["kv_pool"].get("tokens"),
            "request_tokens": first.get("request_tokens"), "concurrency": first.get("max_concurrent"),
            "concurrency_upper_bound": first.get("upper_bound"),
            "worst_severity": worst["severity"] if worst else None, "worst_code": worst["code"] if worst else None,
            "worst_finding": worst["name"] if worst else None, "phase": r["source"]["phase_reached"], "error": None}


# the terminal table's columns: key -> heading (the CSV has every SUMMARY_COLUMNS key)
TABLE_HEADINGS = {"log": "log", "model": "model", "framework": "framework", "gpu": "GPU", "tp": "TP",
                  "weights_gib": "weights GiB", "kv_gib": "KV GiB", "kv_tokens": "KV tokens",
                  "concurrency": "concurrent", "worst": "worst finding", "phase": "phase"}


def table_cells(row: dict[str, Any]) -> dict[str, str]:
    """A summary row as the table's text cells; an unreadable log's error takes the place of
    its figures."""
    if row["error"] is not None:
        return {**dict.fromkeys(TABLE_HEADINGS, ""), "log": row["log"], "model": "error: " + row["error"]}

    def text(value):
        return "—" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)

    cells = {key: text(row.get(key)) for key in TABLE_HEADINGS}
    if row["concurrency"] is not None:
        cells["concurrency"] = (f"{row['concurrency']}{'*' if row['concurrency_upper_bound'] else ''}"
                                f" @{row['request_tokens']}")
    cells["worst"] = (f"{row['worst_severity']} {row['worst_code']} {row['worst_finding']}" if row["worst_finding"]
                      else "none")
    return cells
