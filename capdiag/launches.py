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

import bisect
from collections import Counter, defaultdict
from typing import Iterable, Optional

import attrs

from capdiag import facts as F
from capdiag.failures import PIECES, RootCause, failure_of
from capdiag.frozen import frozen
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


def _states_draft(fields: dict) -> bool:
    """Whether server_args names a second model for the rank to load: a speculative algorithm,
    or a draft checkpoint under any option of the `*_draft_model_path` family (forks add their
    own draft workers beside the speculative one, and print the path the same way)."""
    return fields.get("speculative_algorithm") is not None or any(
        name.endswith("draft_model_path") and value not in (None, "", "None")
        for name, value in fields.items())


def _replica(said: F.Fact, fact: F.Fact) -> bool:
    """Whether a start-up record repeated before any rank printed comes from another server
    process than the first (their outermost process tags differ): a replica starting beside it
    (verl's rollout servers, Ray Serve), not a start-up that got no further."""
    first, again = said.evidence.host, fact.evidence.host
    return first is not None and again is not None and first != again


def ends_startup(fact: F.Fact) -> bool:
    """Whether a fact says a start-up is over: the server is ready, or it failed."""
    return fact.PHASE == "ready" or isinstance(fact, _FAILURES) or (
        isinstance(fact, F.VllmStartupMemory) and bool(fact.error))


@frozen
class Launch:
    index: int  # 1-based, in file order
    facts: tuple[F.Fact, ...]

    @property
    def phase(self) -> str:
        return phase_of(self.facts)

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


@frozen
class Outline:
    """What the report says of every launch, kept once its facts are let go."""

    index: int
    first_line: int
    last_line: int
    phase: str
    failure: Optional[F.Fact]
    ended_by: Optional[str] = None  # why the next launch began here (None for the last)

    @classmethod
    def of(cls, launch: Launch) -> "Outline":
        return cls(launch.index, launch.first_line, launch.last_line, launch.phase, launch.failure)


def phase_of(facts: Iterable[F.Fact]) -> str:
    """As the startup.phase rule: the furthest phase line, or `ready` for request traffic alone."""
    facts = tuple(facts)
    reached = [F.PHASES.index(f.PHASE) for f in facts if f.PHASE]
    if not reached and any(isinstance(f, F.TrafficSummary) for f in facts):
        return "ready"
    return F.PHASES[max(reached)] if reached else "init"


_FINISHED = _READY + _FAILURES
# Traceback lines kept once a start-up has ended (ready, or failed): the failure after ready,
# or what stopped the start-up, is named by the first of them; a server that serves for days
# can print millions more (a request failing again and again), and those are counted, not kept.
AFTER_END = 4096


class LaunchSplitter:
    """Facts in line order → launches, as they stream past, in memory that does not grow with
    the number of launches: each launch is outlined when the next begins, and its facts are kept
    only while it is the one to analyse — `wanted` (1-based), else the last of those that got
    furthest — or all of them with `keep_all` (`capdiag facts`).

    A new launch starts at a line that opens a start-up (_OPENERS) once per-rank lines have been
    seen, or a second time (a start-up record of the same kind again, before any rank printed:
    the first start-up got no further — unless another server process printed it, a replica
    starting beside the first); or when a rank begins loading weights (or torch distributed)
    again after the start-up finished or failed, or once more than its start-up loads models:
    twice with a draft model (speculative decoding, or a draft checkpoint any
    `*_draft_model_path` option names), once when server_args states there is none. A line
    that repeats such a line word for word (one line printed twice, by two log handlers or a
    paste) is read once; the repeat is named as unread. Facts
    that are not a log's lines (`log=False`: a running server's endpoints, each stating what it
    knows) repeat kinds by nature, and only the rules of the first paragraph split them.
    """

    def __init__(self, wanted: Optional[int] = None, keep_all: bool = False, log: bool = True):
        self.wanted, self.keep_all, self.log = wanted, keep_all, log
        self.outlines: list[Outline] = []
        self.kept: list[Launch] = []
        self._open()

    def _open(self) -> None:
        self.group: list[F.Fact] = []
        self.begins: Counter = Counter()
        self.said: dict[tuple, F.Fact] = {}  # the first opener or begin line of each kind and rank
        self.loads = 2  # model loads a rank makes: target and draft, unless none is stated
        self.finished = self.scheduler_seen = False
        self.tail = 0  # traceback lines kept after the start-up ended
        # those past AFTER_END: the places in the group of the first and the last (held there
        # for the notes said at the close, so the launch still ends where it does), and the count
        self.dropped: list = []

    def add(self, fact: F.Fact) -> None:
        if self.finished and isinstance(fact, PIECES):
            self.tail += 1
            if self.tail > AFTER_END:
                if not self.dropped:
                    self.dropped = [len(self.group), len(self.group), 0]
                    self.group.append(fact)
                elif self.dropped[1] == len(self.group) - 1 and self.dropped[1] != self.dropped[0]:
                    self.group[-1] = fact
                else:
                    self.dropped[1] = len(self.group)
                    self.group.append(fact)
                self.dropped[2] += 1
                return
        opener, begin = isinstance(fact, _OPENERS), isinstance(fact, _BEGINS)
        key = (type(fact), fact.rank.key())
        said = self.said.get(key) if self.log and (opener or begin) else None
        if self.group and ((opener and self.scheduler_seen) or (begin and self.finished)):
            self._close(f"line {fact.evidence.line} starts another start-up")
        elif said is not None and said.evidence.text == fact.evidence.text:
            fact = F.UnreadLine(evidence=fact.evidence, rank=fact.rank,
                                reason=f"{type(fact).__name__}: repeats line {said.evidence.line} word for word "
                                       "(one line printed twice); read once")
            opener = begin = False
        elif self.group and opener and said is not None and not _replica(said, fact):
            self._close(f"line {fact.evidence.line} opens another start-up record before any rank printed")
        elif self.group and begin and self.begins[key] >= (self.loads if self.log else 2):
            self._close(f"line {fact.evidence.line}: {fact.rank.label} begins loading again"
                        + (" (server_args states no draft model)" if self.loads == 1 else ""))
        if opener or begin:
            self.said.setdefault(key, fact)
        if begin:
            self.begins[key] += 1
        if isinstance(fact, F.ServerArgs) and "speculative_algorithm" in fact.fields:
            self.loads = 2 if _states_draft(fact.fields) else 1
        self.finished = self.finished or isinstance(fact, _FINISHED)
        self.scheduler_seen = self.scheduler_seen or not isinstance(fact, _NEUTRAL)
        self.group.append(fact)

    def _close(self, ended_by: Optional[str] = None) -> None:
        if self.dropped:
            at, last_at, count = self.dropped
            first, last = self.group[at], self.group[last_at]
            self.group[at] = F.UnreadLine(evidence=first.evidence, rank=first.rank, reason=(
                f"{type(first).__name__}: this and {count - 1} more traceback lines up to line {last.evidence.line}, "
                f"after the first {AFTER_END} once the start-up had ended, are counted, not kept"))
            if last_at != at:
                self.group[last_at] = F.UnreadLine(evidence=last.evidence, rank=last.rank, reason=(
                    f"{type(last).__name__}: the last of the {count} traceback lines from line {first.evidence.line} "
                    "on that are counted, not kept"))
        launch = Launch(len(self.outlines) + 1, tuple(self.group))
        outline = attrs.evolve(Outline.of(launch), ended_by=ended_by)
        self.outlines.append(outline)
        if self.keep_all:
            self.kept.append(launch)
        elif self.wanted == launch.index if self.wanted is not None else (
                not self.kept or F.PHASES.index(outline.phase) >= F.PHASES.index(self.outlines[self.kept[0].index - 1].phase)):
            self.kept = [launch]
        self._open()

    @property
    def kept_from(self) -> int:
        """The first line of the launch kept, else of the one being read: no launch that ended
        before it can be analysed any more."""
        if self.keep_all:
            return 0
        if self.kept:
            return self.kept[0].first_line
        return self.group[0].evidence.line if self.group else 0

    def finish(self, late: Iterable[F.Fact] = ()) -> tuple[list[Outline], list[Launch]]:
        """The outline of every launch, and the launches kept, each with its roles assigned.
        `late` are facts known only once the input has been read (the run-time traffic sums,
        capdiag.traffic): each joins the launch its line falls in."""
        if self.group:
            self._close()
        late = sorted(late, key=lambda f: f.evidence.line)
        if late and self.outlines:
            starts = [o.first_line for o in self.outlines]
            joined: dict[int, list[F.Fact]] = {}
            for fact in late:
                joined.setdefault(max(bisect.bisect_right(starts, fact.evidence.line), 1), []).append(fact)
            self.outlines = [attrs.evolve(o, last_line=max(o.last_line, joined[o.index][-1].evidence.line))
                             if o.index in joined else o for o in self.outlines]
            self.kept = [Launch(l.index, tuple(sorted(l.facts + tuple(joined.get(l.index, ())),
                                                      key=lambda f: f.evidence.line))) for l in self.kept]
        return self.outlines, [Launch(l.index, tuple(assign_roles(with_launch(f, l.index) for f in l.facts)))
                               for l in self.kept]


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
