"""Candidate lines → facts. One grammar per framework; each fact gets its Evidence."""
from __future__ import annotations

from typing import Iterable, Iterator

import attrs

from capdiag import facts as F
from capdiag.parsing.sglang import parse_sglang_line
from capdiag.source import Line


def read_facts(lines: Iterable[Line]) -> Iterator[F.Fact]:
    for line in lines:
        parsed = parse_sglang_line(line.text)
        if parsed is None:
            continue
        values = dict(parsed.values)
        role = values.pop("_role", None)
        extra = {"role": role, "role_stated": True} if role else {}
        yield parsed.cls(evidence=F.Evidence(line.number, line.raw), rank=parsed.rank, **values, **extra)


def with_launch(fact: F.Fact, launch: int) -> F.Fact:
    return attrs.evolve(fact, evidence=attrs.evolve(fact.evidence, launch=launch))
