"""A process tag at a line's head → the process that printed it: its label, rank and pid, read
through grammar/process_tag.lark once per distinct tag. The line grammars take the tag as one
token (vLLM's and the traceback grammar's PROC_TAG, SGLang's RAY_TAG); this is the one place its
parts are read, so the rank a line is filed under and the pid nvidia-smi's processes are matched
against come from the same reading."""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

import attrs
from lark import Lark, Token, Transformer

from capdiag import facts as F
from capdiag.parsing.lalr import lalr_parser

# Engine-level processes (API server, engine core) are TP 0's, not a worker's.
ENGINE_PROCESSES = frozenset(("APIServer", "ApiServer", "EngineCore", "MainProcess", "LLMEngine"))
# The engine-level process whose label's first segment, a DP part, names its data-parallel rank
# (`EngineCore_DP1`; `EngineCore_1` is DP's engine 1 of a data-parallel size the log does not state).
DP_ENGINE = "EngineCore"
# The rank kinds a tag's parts name, as the report's rank fields (DCP and PCP are no rank of its).
RANK_KINDS = {"DP": "dp", "PP": "pp", "TP": "tp", "EP": "ep"}
# The worker's label when every parallel size is 1: the only worker, which is TP 0.
ONLY_WORKER = "Worker"


@attrs.frozen
class ProcessTag:
    label: str  # the tag as printed, without its brackets (`VllmWorkerProcess pid=7`)
    rank: F.Rank
    pid: int


@attrs.frozen
class _Label:
    name: Optional[str]  # before the first `_`
    segments: tuple[Optional[tuple[str, int]], ...]  # after it: a rank part (`DP1`) as (kind, index), else None

    @property
    def parts(self) -> tuple[tuple[str, int], ...]:
        return tuple(s for s in self.segments if s is not None)


class _Tag(Transformer):
    def part(self, items):
        return str(items[0]), int(items[1])

    def segment(self, items):
        return items[0] if items and isinstance(items[0], tuple) else None

    def label(self, items):
        name = str(items[0]) if items and isinstance(items[0], Token) else None
        return _Label(name, tuple(i for i in items if not isinstance(i, Token)))

    def position(self, items):
        return tuple(items)

    def numbered(self, items):
        return int(items[0])

    def ip(self, _):
        return None

    def start(self, items):
        label = next((i for i in items if isinstance(i, _Label)), _Label(None, ()))
        position = next((i for i in items if isinstance(i, tuple)), None)
        numbered = next((i for i in items if isinstance(i, int) and not isinstance(i, Token)), None)
        pid = int(next(i for i in items if isinstance(i, Token) and i.type == "INT"))
        return label, position, numbered, pid


def _rank(text: str, label: _Label, position: Optional[tuple], numbered: Optional[int]) -> F.Rank:
    """The rank a tag names. An engine-level process is TP 0's (of its DP rank, where its label
    names one); a worker's rank is `rank=N` (its TP index), else the parts after its label, else
    those in it; a worker whose index the tag does not give keeps its label instead."""
    if label.name in ENGINE_PROCESSES:
        first = label.segments[0] if label.name == DP_ENGINE and label.segments else None
        return F.Rank(dp=first[1]) if first is not None and first[0] == "DP" else F.NO_RANK
    if numbered is not None:
        return F.Rank(tp=numbered)
    ranks = {RANK_KINDS[kind]: n for kind, n in (position if position is not None else label.parts)
             if kind in RANK_KINDS}
    if ranks:
        return F.Rank(**ranks)
    if label.name == ONLY_WORKER:  # every parallel size is 1: the only worker
        return F.NO_RANK
    return F.Rank(worker=text[1:-1])


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return lalr_parser("process_tag.lark", lexer="contextual")


@lru_cache(maxsize=1 << 16)
def read_tag(text: str) -> ProcessTag:
    """The process a tag token (`(Worker_TP1 pid=7)`) names."""
    label, position, numbered, pid = _Tag().transform(_parser().parse(text))
    return ProcessTag(text[1:-1], _rank(text, label, position, numbered), pid)
