"""nvidia-smi output → SmiGpu, SmiMigDevice and SmiProcess facts, through grammar/nvidia_smi.lark.

Accepted: the documented `--query-gpu=index,memory.used,memory.free --format=csv,noheader`,
the same with its header row and with extra columns (`name`, `memory.total`), the per-process
`--query-compute-apps=pid,process_name,used_memory --format=csv[,noheader]` (alone or after the
GPU query), and the default table with its `MIG devices:` and `Processes:` sections (names may
be truncated with `...`). Anything else is an InputError.
"""
from __future__ import annotations

import io
from functools import lru_cache
from typing import Optional

from lark import Lark, Transformer
from lark.exceptions import LarkError

from capdiag import facts as F
from capdiag.errors import InputError
from capdiag.parsing.lalr import lalr_parser
from capdiag.side_input import read_bytes
from capdiag.source import physical_lines

_COLUMNS = {"index": "index", "memory.used": "used_mib", "memory.free": "free_mib", "memory.total": "total_mib",
            "name": "name"}
_NOHEADER = ("index", "memory.used", "memory.free")  # the documented query, in its order


class _Cells(Transformer):
    def table_row(self, items):
        return ("table", [str(c).strip() for c in items])

    def csv_row(self, items):
        return ("csv", [str(c).strip() for c in items])

    def start(self, items):
        return items[0]


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return lalr_parser("nvidia_smi.lark")


_NOT_A_FIGURE = ("[n/a]", "n/a", "not supported", "[not supported]", "[unknown error]", "[gpu is lost]")


def _mib(cell: str, number: int) -> Optional[int]:
    """`63092 MiB` → 63092; `[N/A]`, `Not Supported` → None; anything else (a negative or
    text figure, Unicode digits) is an InputError naming the line."""
    figure = cell.replace("MiB", "").strip()
    if figure.isascii() and figure.isdigit() and len(figure) <= 12:
        return int(figure)
    if figure.lower() in _NOT_A_FIGURE:
        return None
    raise InputError(f"nvidia-smi line {number}: {cell!r:.40} is not a memory figure in MiB")


def _evidence(number: int, text: str) -> F.Evidence:
    return F.Evidence(number, text, 0, "nvidia-smi")


def read_nvidia_smi(path: str) -> list[F.Fact]:
    rows = []
    for number, raw in physical_lines(io.BytesIO(read_bytes(path, "nvidia-smi"))):
        if not raw.strip():
            continue
        try:
            rows.append((number, raw, *_Cells().transform(_parser().parse(raw.strip()))))
        except LarkError:
            continue
    processes, rows = _processes_csv(rows)
    gpus = _from_csv(rows) or _from_table(rows)
    if not gpus and not processes:
        raise InputError(f"{path}: no GPU found; expected `nvidia-smi --query-gpu=index,memory.used,memory.free "
                         "--format=csv[,noheader]` output or nvidia-smi's default table")
    return gpus + processes


_PROCESS_COLUMNS = {"pid": "pid", "process_name": "name", "used_gpu_memory": "used_mib", "used_memory": "used_mib"}


def _processes_csv(rows) -> tuple[list[F.SmiProcess], list]:
    """The rows of a `--query-compute-apps=pid,process_name,used_memory` block (its header
    `pid, process_name, used_gpu_memory [MiB]`, or without one: a pid, a name, a MiB figure),
    and the rows left for the GPU query."""
    out, rest, columns, gpu_block = [], [], None, False
    for row in rows:
        number, raw, shape, cells = row
        if shape != "csv":
            rest.append(row)
            continue
        header = [c.split(" [")[0].strip().lower() for c in cells]
        if "pid" in header and all(h in _PROCESS_COLUMNS for h in header):
            columns = [_PROCESS_COLUMNS[h] for h in header]
            continue
        if "index" in header:  # the GPU query's header: its rows follow
            columns, gpu_block = None, True
        # without a header: a pid, a name (never a MiB figure, as the GPU query's second column is), MiB
        if columns is None and not gpu_block and len(cells) == 3 and _is_pid(cells[0]) \
                and not cells[1].endswith("MiB") and cells[2].endswith("MiB"):
            columns = ["pid", "name", "used_mib"]
        if columns is None or len(cells) != len(columns) or not _is_pid(cells[columns.index("pid")]):
            rest.append(row)
            continue
        values = dict(zip(columns, cells))
        out.append(F.SmiProcess(evidence=_evidence(number, raw), pid=int(values["pid"]), name=values.get("name", ""),
                                used_mib=_mib(values["used_mib"], number) if "used_mib" in values else None))
    return out, rest


def _from_csv(rows) -> list[F.SmiGpu]:
    csv = [(n, raw, cells) for n, raw, shape, cells in rows if shape == "csv"]
    if not csv:
        return []
    header = [c.split(" [")[0].strip().lower() for c in csv[0][2]]
    if all(h in _COLUMNS for h in header) and "index" in header:
        columns, data = header, csv[1:]
    elif len(csv[0][2]) == len(_NOHEADER):
        columns, data = list(_NOHEADER), csv
    else:
        raise InputError("nvidia-smi CSV without a header must be the documented query "
                         "`--query-gpu=index,memory.used,memory.free`; with other columns keep the header row")
    gpus = []
    for number, raw, cells in data:
        index = cells[columns.index("index")] if len(cells) == len(columns) else ""
        if not (index.isascii() and index.isdigit() and len(index) <= 6):
            raise InputError(f"nvidia-smi line {number}: expected {len(columns)} columns ({', '.join(columns)})")
        values = {}
        for column, cell in zip(columns, cells):
            key = _COLUMNS[column]
            values[key] = int(cell) if key == "index" else cell if key == "name" else _mib(cell, number)
        gpus.append(F.SmiGpu(evidence=_evidence(number, raw), **values))
    return gpus


def _is_pid(cell: str) -> bool:
    """A process id as nvidia-smi prints it: ASCII digits, at most 10 (Linux's largest is 2^22)."""
    return cell.isascii() and cell.isdigit() and len(cell) <= 10


def _ints(words: list[str]) -> bool:
    return bool(words) and all(w.isascii() and w.isdigit() and len(w) <= 6 for w in words)


def _from_table(rows) -> list[F.Fact]:
    """The default table: a GPU's first row starts `| <index>  <name>  On|Off |`, its second
    row holds `<used>MiB / <total>MiB`; a `MIG devices:` row starts `| <gpu> <gi> <ci> <mig> |`
    and holds the instance's `<used>MiB / <total>MiB` (the row under it is BAR1); a `Processes:`
    row is `| <gpu> <gi|N/A> <ci|N/A> <pid> <type> <name> <used>MiB |`."""
    gpus, pending, section = [], None, "gpus"
    for number, raw, shape, cells in rows:
        if shape != "table" or not cells:
            continue
        heading = cells[0].strip().rstrip(":").lower()
        if heading in ("mig devices", "processes"):
            section = heading
            continue
        words = cells[0].split()
        if section == "mig devices":
            if len(words) == 4 and _ints(words) and len(cells) > 1 and "/" in cells[1]:
                used, total = (_mib(part, number) for part in cells[1].split("/"))
                gpus.append(F.SmiMigDevice(evidence=_evidence(number, raw), gpu=int(words[0]),
                                           gpu_instance=int(words[1]), compute_instance=int(words[2]),
                                           mig_device=int(words[3]), used_mib=used, total_mib=total))
            continue
        if section == "processes":
            if len(cells) == 1 and len(words) >= 7 and _ints(words[:1]) and words[3].isascii() \
                    and words[3].isdigit() and len(words[3]) <= 10:
                gi = int(words[1]) if _ints([words[1]]) else None
                gpus.append(F.SmiProcess(evidence=_evidence(number, raw), pid=int(words[3]), name=" ".join(words[5:-1]),
                                         used_mib=_mib(words[-1], number), gpu=int(words[0]), gpu_instance=gi))
            continue
        if len(words) >= 3 and words[0].isascii() and words[0].isdigit() and len(words[0]) <= 6 \
                and words[-1] in ("On", "Off"):
            pending = (number, raw, int(words[0]), " ".join(words[1:-1]))
            continue
        memory = next((c for c in cells if "MiB /" in c or "Not Supported" in c), None)
        if pending is not None and memory is not None:
            n, first, index, name = pending
            used, total = (_mib(part, number) for part in memory.split("/")) if "/" in memory else (None, None)
            # the table prints no free figure, and total − used is not it (the driver reserves some)
            gpus.append(F.SmiGpu(evidence=_evidence(n, first + "\n" + raw), index=index, used_mib=used,
                                 total_mib=total, name=name))
            pending = None
    return gpus
