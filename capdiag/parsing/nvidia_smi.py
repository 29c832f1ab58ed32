"""nvidia-smi output → SmiGpu facts, through grammar/nvidia_smi.lark.

Accepted: the documented `--query-gpu=index,memory.used,memory.free --format=csv,noheader`,
the same with its header row and with extra columns (`name`, `memory.total`), and the
default table (names may be truncated with `...`). Anything else is an InputError.
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


def read_nvidia_smi(path: str) -> list[F.SmiGpu]:
    rows = []
    for number, raw in physical_lines(io.BytesIO(read_bytes(path, "nvidia-smi"))):
        if not raw.strip():
            continue
        try:
            rows.append((number, raw, *_Cells().transform(_parser().parse(raw.strip()))))
        except LarkError:
            continue
    gpus = _from_csv(rows) or _from_table(rows)
    if not gpus:
        raise InputError(f"{path}: no GPU found; expected `nvidia-smi --query-gpu=index,memory.used,memory.free "
                         "--format=csv[,noheader]` output or nvidia-smi's default table")
    return gpus


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


def _from_table(rows) -> list[F.SmiGpu]:
    """The default table: a GPU's first row starts `| <index>  <name>  On|Off |`, its second
    row holds `<used>MiB / <total>MiB`."""
    gpus, pending = [], None
    for number, raw, shape, cells in rows:
        if shape != "table" or not cells:
            continue
        words = cells[0].split()
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
