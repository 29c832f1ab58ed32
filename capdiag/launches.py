"""Splits a file's facts into start-ups ("launches") and tells target lines from draft lines.

A file can hold a crash and then a restart. A new launch starts at a line that opens a
start-up (SGLang's `server_args`, vLLM's version banner, arguments or engine config) once
per-rank lines have been seen, or when a rank begins loading weights again after the
previous start-up finished or failed.

Under speculative decoding a rank runs two model workers, and the draft worker prints the
same lines as the target: the first weight load of a rank is the target's, the second the
draft's; pool lines belong to the worker whose `Memory pool end` closes them. Graph lines
from v0.5.14 name their role themselves.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable, Optional

import attrs

from capdiag import facts as F
from capdiag.failures import RootCause, failure_of
from capdiag.parsing import with_launch

# The kinds' own declarations (Fact.RANK_NEUTRAL, OPENS_LAUNCH, BEGINS_RANK, FAILS_STARTUP, PHASE).
# Lines that say nothing about which process printed them (main-process lines, unread ones).
_NEUTRAL = F.kinds_where("RANK_NEUTRAL")
# A line that opens a start-up: once per-rank lines have been seen, it opens the next one.
_OPENERS = F.kinds_where("OPENS_LAUNCH")
# A rank beginning its start-up: after the start-up ended, or a third time, the file restarted.
_BEGINS = F.kinds_where("BEGINS_RANK")
_FAILURES = F.kinds_where("FAILS_STARTUP")
_READY = F.kinds_in_phase("ready")
# The draft worker's lines (speculative decoding): the second of a kind on a rank, or those a
# pool closes second (Fact.DRAFT_BY).
_BY_ORDER = F.kinds_where("DRAFT_BY", "order")
_BY_POOL = F.kinds_where("DRAFT_BY", "pool")


def ends_startup(fact: F.Fact) -> bool:
    """Whether a fact says a start-up is over: the server is ready, or it failed."""
    return fact.PHASE == "ready" or isinstance(fact, _FAILURES) or (
        isinstance(fact, F.VllmStartupMemory) and bool(fact.error))


@attrs.frozen
class Launch:
    index: int  # 1-based, in file order
    facts: tuple[F.Fact, ...]

    @property
    def phase(self) -> str:
        reached = [F.PHASES.index(f.PHASE) for f in self.facts if f.PHASE]
        return F.PHASES[max(reached)] if reached else "init"

    @property
    def root_cause(self) -> Optional[RootCause]:
        """The root cause of the launch's failure (capdiag/failures.py); for a launch that
        became ready, of a failure after its ready line only."""
        return failure_of(self.facts)

    @property
    def failure(self) -> Optional[F.Fact]:
        """The line of the root cause: the first exception that is not a consequence of
        another. None when the log shows no failure, or only consequences of one."""
        cause = self.root_cause
        return cause.line if cause is not None else None

    @property
    def first_line(self) -> int:
        return min(f.evidence.line for f in self.facts)

    @property
    def last_line(self) -> int:
        return max(f.evidence.line for f in self.facts)


def split_launches(facts: Iterable[F.Fact]) -> list[Launch]:
    launches: list[list[F.Fact]] = [[]]
    begins: Counter = Counter()
    finished = scheduler_seen = False
    for fact in facts:
        restart = (isinstance(fact, _OPENERS) and scheduler_seen) or (
            isinstance(fact, _BEGINS)
            and (finished or begins[(type(fact), fact.rank.key())] >= 2))
        if restart:
            launches.append([])
            begins.clear()
            finished = scheduler_seen = False
        if isinstance(fact, _BEGINS):
            begins[(type(fact), fact.rank.key())] += 1
        finished = finished or isinstance(fact, _READY + _FAILURES)
        scheduler_seen = scheduler_seen or not isinstance(fact, _NEUTRAL)
        launches[-1].append(fact)
    return [Launch(i, tuple(assign_roles(with_launch(f, i) for f in group)))
            for i, group in enumerate((g for g in launches if g), start=1)]


def assign_roles(facts: Iterable[F.Fact]) -> list[F.Fact]:
    """Mark the draft worker's lines (speculative decoding) within one launch."""
    seen: dict[tuple, int] = defaultdict(int)
    pools_closed: dict[tuple, int] = defaultdict(int)
    out = []
    for fact in facts:
        rank = fact.rank.key()
        role = fact.role
        if isinstance(fact, _BY_ORDER):
            seen[(type(fact), rank)] += 1
            role = "draft" if seen[(type(fact), rank)] == 2 else "target"
        elif isinstance(fact, _BY_POOL):
            role = "draft" if pools_closed[rank] == 1 else "target"
        elif isinstance(fact, (F.GraphCaptureBegin, F.GraphCaptureEnd)) and not fact.role_stated:
            role = "draft" if pools_closed[rank] >= 2 and seen[(F.LoadWeightEnd, rank)] >= 2 else "target"
        if isinstance(fact, F.MemoryPoolEnd):
            pools_closed[rank] += 1
        out.append(fact if role == fact.role else attrs.evolve(fact, role=role))
    return out


def pick_launch(launches: list[Launch], wanted: Optional[int]) -> Launch:
    """The launch asked for, else the last of those that got furthest."""
    if wanted is not None:
        return launches[wanted - 1]
    best = max(F.PHASES.index(l.phase) for l in launches)
    return [l for l in launches if F.PHASES.index(l.phase) == best][-1]
