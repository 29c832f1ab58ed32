"""Every remedy capdiag advises is a claim about what would happen: on every corpus log and
fixture, applying it with `--what-if` exactly as its `changes` say must clear its finding and
raise nothing at warning or above; and no advice quotes a fraction outside (0, 1), a change of
less than 0.01, no gain, or a setting the log shows already set that way."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from capdiag.analysis import analyse
from capdiag.report import build
from capdiag.whatif import parse_what_if
from helpers import FIXTURES, SHARED

LOGS = sorted((SHARED / "corpus").glob("*/*.log")) + sorted(FIXTURES.glob("*.log"))
FRACTION = re.compile(r"(?:mem[-_]fraction[-_]static|gpu[-_]memory[-_]utilization)\s+to\s+(?:about\s+|≤\s*)?"
                      r"(-?\d+(?:\.\d+)?)")


PARAMS = [pytest.param(log, id=f"{log.parent.name}/{log.name[:40]}") for log in LOGS]


@pytest.mark.parametrize("log", PARAMS)
def test_each_remedy_projected_again_clears_its_finding(log: Path):
    rep = build(analyse(str(log)))
    for finding in rep["findings"]:
        for remedy in finding["remedies"]:
            items = tuple(f"{k}={v}" for k, v in remedy["changes"].items())
            projection = analyse(str(log), what_if=parse_what_if(items)).knowledge.get("what_if")
            assert not projection.value["not_projected"], (finding["rule"], remedy)
            assert finding["rule"] in projection.value["findings_disappear"], (finding["rule"], remedy)
            then = projection.detail["then"]
            serious = {d.rule for d in then.topic("finding") if getattr(d, "severity", None) in ("warning", "error")}
            assert remedy["introduces"] == [] and not serious & set(projection.value["findings_appear"]), remedy


@pytest.mark.parametrize("log", PARAMS)
def test_no_advice_quotes_an_impossible_or_empty_change(log: Path):
    rep = build(analyse(str(log)))
    config = rep["config"]
    for finding in rep["findings"]:
        texts = [finding["action"]] + [r["text"] for r in finding["remedies"]]
        for text in texts:
            for value in FRACTION.findall(text):
                assert 0 < float(value) < 1, (finding["rule"], text)
        for remedy in finding["remedies"]:
            for key, value in remedy["changes"].items():
                current = config.get("max_running_requests" if key == "max_num_seqs" else key)
                assert current != value, (finding["rule"], key, value)  # not already set that way
                if isinstance(value, float) and isinstance(current, float):
                    assert abs(value - current) >= 0.01 - 1e-9, (finding["rule"], key, current, value)
            projected = remedy["projected"]
            assert projected["fits"] and (projected["kv_tokens"] or 0) > 0
