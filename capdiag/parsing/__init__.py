"""Candidate lines → facts. One grammar per framework; each fact gets its Evidence.

A line is offered to each framework's grammar in turn (only the one named, with
`framework=`), and to the traceback grammar both frameworks share. The framework of a log is the one whose own line kinds it holds most of.
"""
from __future__ import annotations

import functools
import re
from typing import Iterable, Iterator, Optional

import ahocorasick_rs
import attrs
from lark.exceptions import VisitError

from capdiag import facts as F
from capdiag.parsing.bounds import OutOfRange, check_values, rank_in_range
from capdiag.parsing.parsed import Parsed
from capdiag.parsing.sglang import parse_sglang_line
from capdiag.parsing.traceback import parse_traceback_line
from capdiag.parsing.vllm import parse_vllm_line
from capdiag.facts.kinds import KEYWORDS, TRACEBACK_KEYWORDS
from capdiag.source import Line, ray_repeats

FRAMEWORKS = ("sglang", "vllm")


# The keywords of the frameworks' own line kinds: a line holding none of them (only a traceback
# word: a warning naming an exception, a timeout) is no SGLang or vLLM line kind, and is not
# handed to their parsers, whose failing on a line costs ~100 times this search.
_LINE_KINDS = ahocorasick_rs.BytesAhoCorasick(sorted({k.lower().encode() for k in KEYWORDS} -
                                                     {k.lower().encode() for k in TRACEBACK_KEYWORDS}))


def _parse(text: str, framework: Optional[str]) -> list[Parsed]:
    """The facts of a line: its framework's kind, and the traceback piece it also is (the last
    line of a traceback is often a kind of its own too: `ValueError: No available memory …`)."""
    found: list[Parsed] = []
    if not _LINE_KINDS.find_matches_as_indexes(text.encode("utf-8", "surrogatepass").lower()):
        piece = parse_traceback_line(text)
        return [piece] if piece is not None else found
    if framework != "vllm":
        parsed = parse_sglang_line(text)
        if parsed is not None:
            found.append(parsed)
    if framework != "sglang" and not found:
        found.extend(parse_vllm_line(text))
    piece = parse_traceback_line(text)
    return found + [piece] if piece is not None else found


# What turning a parsed line into a fact can raise on hostile input (a number too long for
# int(), infinity converted to int, nesting past the recursion limit, an unhashable dict key, …)
_CONVERSION_ERRORS = (VisitError, RecursionError, ValueError, ArithmeticError, TypeError, KeyError, IndexError)


def _reason(exc: BaseException) -> str:
    exc = getattr(exc, "orig_exc", exc)
    return f"{type(exc).__name__}: {str(exc)[:160]}" if not isinstance(exc, OutOfRange) else str(exc)


@functools.lru_cache(maxsize=None)
def _optional(cls: type) -> frozenset:
    """The attributes a fact class may lack (their default is None)."""
    return frozenset(a.name for a in attrs.fields(cls) if a.default is None)


@functools.lru_cache(maxsize=1 << 16)
def _shared(rank: F.Rank) -> F.Rank:
    """One Rank object for all the lines of a rank (10,000 ranks print ~10 lines each), its
    tags checked once."""
    if not rank_in_range(attrs.asdict(rank)):
        raise OutOfRange(f"rank tag {rank.label} is out of range")
    return rank


def _facts_of(line: Line, framework: Optional[str]) -> list[F.Fact]:
    out: list[F.Fact] = []
    for parsed in _parse(line.text, framework):
        values, notes = check_values(parsed.values, _optional(parsed.cls))
        rank = _shared(parsed.rank)
        role = values.pop("_role", None)
        extra = {"role": role, "role_stated": True} if role else {}
        evidence = F.Evidence(line.number, line.raw, read_to=parsed.read_to, repeated=ray_repeats(line.raw),
                              pid=parsed.pid, host=parsed.host)
        out.append(parsed.cls(evidence=evidence, rank=rank, **values, **extra))
        out.extend(F.UnreadLine(evidence=evidence, rank=rank, reason=f"{parsed.cls.__name__}: {note}")
                   for note in notes)
    return out


def read_facts(lines: Iterable[Line], framework: Optional[str] = None) -> Iterator[F.Fact]:
    """The facts each line states. This is the one place a parse tree becomes facts: a line
    whose conversion fails, or whose figures are out of range, becomes an UnreadLine naming
    why instead of an error."""
    for line in lines:
        try:
            yield from _facts_of(line, framework)
        except _CONVERSION_ERRORS as exc:
            yield F.UnreadLine(evidence=F.Evidence(line.number, line.raw), reason=_reason(exc))


def build_parsers() -> None:
    """Build every log grammar's parser now (each is built once, on first use): a process
    that forks workers does it first, so they inherit the parsers instead of each building
    its own."""
    from capdiag.parsing import literal, sglang, vllm

    sglang._parser(), vllm._parser(), literal._parser()


def framework_of(fact: F.Fact) -> Optional[str]:
    """The framework whose own line kind a fact is; None for kinds both print."""
    return type(fact).FRAMEWORK


class FrameworkVotes:
    """The framework whose own line kinds a log holds most of, counted as its facts stream past;
    for a log that holds none (a traceback alone), the one whose source files its frames run
    through; else the one its launch command runs (`$ VLLM_USE_V1=1 vllm serve …` pasted above an
    error)."""

    def __init__(self) -> None:
        self.counts = {name: 0 for name in FRAMEWORKS}
        self.frames = {name: 0 for name in FRAMEWORKS}
        self.commands = {name: 0 for name in FRAMEWORKS}

    def add(self, fact: F.Fact) -> None:
        name = framework_of(fact)
        if name:
            self.counts[name] += 1
        elif isinstance(fact, F.TracebackFrame):
            for candidate in FRAMEWORKS:
                self.frames[candidate] += f"/{candidate}/" in fact.path
        elif isinstance(fact, F.LaunchCommand):
            named = [c for c in FRAMEWORKS if re.search(rf"(?<![\w-]){c}(?![\w-])", fact.evidence.text, re.I)]
            if len(named) == 1:  # a command naming both (an SGLang image running vllm) says nothing
                self.commands[named[0]] += 1

    def winner(self) -> Optional[str]:
        counts = next((c for c in (self.counts, self.frames, self.commands) if max(c.values())), self.counts)
        best = max(counts.values())
        return None if best == 0 else max(FRAMEWORKS, key=lambda n: counts[n])


def worker_ranks(facts: list[F.Fact]) -> list[F.Fact]:
    """The facts with each worker process placed at the rank its own line states (`rank 1 in
    world size 4 is assigned as DP rank 0, PP rank 0, TP rank 1`): a Ray or multiprocessing
    worker's prefix names only its process (`RayWorkerWrapper pid=714, ip=10.0.3.17`). The label
    stays with the rank; a process stated at two different ranks is left unplaced. Workers whose
    line the log does not hold (Ray folds all but one into `[repeated Nx across cluster]`) stay
    of unknown index: their rank is never guessed."""
    stated: dict[str, set] = {}
    for fact in facts:
        if isinstance(fact, F.VllmRankAssignment) and fact.rank.worker and fact.rank.tp is None and fact.tp is not None:
            stated.setdefault(fact.rank.worker, set()).add((fact.dp, fact.pp, fact.tp))
    placed = {label: next(iter(ranks)) for label, ranks in stated.items() if len(ranks) == 1}
    if not placed:
        return facts
    out = []
    for fact in facts:
        where = placed.get(fact.rank.worker) if fact.rank.worker and fact.rank.tp is None else None
        if where is not None:
            fact = attrs.evolve(fact, rank=attrs.evolve(fact.rank, dp=where[0], pp=where[1], tp=where[2]))
        out.append(fact)
    return out


def with_launch(fact: F.Fact, launch: int) -> F.Fact:
    # the fact itself when it is already so (a launch's facts are not copied to say it)
    if fact.evidence.launch == launch:
        return fact
    return attrs.evolve(fact, evidence=attrs.evolve(fact.evidence, launch=launch))
