"""Helpers the rule modules share: the target rank's facts, and GiB arithmetic as printed."""
from __future__ import annotations

from typing import Optional

from capdiag import facts as F
from capdiag.engine import Knowledge


def target(kb: Knowledge) -> Optional[tuple]:
    """The rank key the breakdown describes (concluded by rules/target_rank.py)."""
    return kb.value("target_rank")


def gib(value: float) -> float:
    """Round a GiB figure to the two decimals SGLang prints, dropping float noise."""
    return round(value + 0.0, 2)


def line_ref(fact: F.Fact) -> str:
    return "input" if fact.evidence.line == F.INPUT_LINE else f"line {fact.evidence.line}"
