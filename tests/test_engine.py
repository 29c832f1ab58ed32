"""capdiag.engine: forward chaining to a fixpoint, one conclusion per (topic, key), evidence chains."""
from __future__ import annotations

from pathlib import Path

import pytest

from capdiag import facts as F
from capdiag.analysis import analyse
from capdiag.engine import Derived, Finding, Knowledge, Unknown, evidence_chain, rule, run
from capdiag.render import render
from capdiag.report import build
from helpers import FIXTURES, fixture


def fact(line: int, avail: float, tp: int = 0) -> F.LoadWeightBegin:
    return F.LoadWeightBegin(evidence=F.Evidence(line, f"[x TP{tp}] Load weight begin. avail mem={avail} GB"),
                             rank=F.Rank(tp=tp), avail_gib=avail)


# ---- a toy rule set -------------------------------------------------------------------------------

@rule("toy.total")
def total(kb):
    """Depends on toy.double, which comes later in the rule order."""
    d = kb.get("toy", "double")
    if d is not None:
        yield Derived("toy", "total", d.value + 1, "toy.total", (d,), f"{d.value} + 1")


@rule("toy.double")
def double(kb):
    begins = kb.of(F.LoadWeightBegin)
    if begins:
        yield Derived("toy", "double", begins[0].avail_gib * 2, "toy.double", (begins[0],), "× 2")
        yield Derived("toy", "double", -1, "toy.double", (begins[0],), "a second try is ignored")


@rule("toy.other-double")
def other_double(kb):
    yield Derived("toy", "double", 999, "toy.other-double", (), "comes after toy.double")


@rule("toy.sum")
def sum_rule(kb):
    a, b = kb.get("toy", "double"), kb.get("toy", "total")
    if a is not None and b is not None:
        yield Derived("toy", "sum", a.value + b.value, "toy.sum", (a, b), "diamond over double")


@rule("toy.unknown")
def unknown(kb):
    yield Derived("toy", "missing", Unknown("not in the log"), "toy.unknown")


def test_fixpoint_needs_a_second_pass_and_then_stops():
    kb = Knowledge((fact(3, 10.0),))
    firings = run([total, double, other_double, sum_rule, unknown], kb)
    assert kb.value("toy", "double") == 20.0  # the first rule to conclude it wins
    assert kb.value("toy", "total") == 21.0  # drawn on the second pass
    assert kb.value("toy", "sum") == 41.0
    assert [f.rule for f in firings] == ["toy.double", "toy.unknown", "toy.total", "toy.sum"]
    # at the fixpoint nothing new is concluded
    assert run([total, double, other_double, sum_rule, unknown], kb) == []


def test_no_duplicate_conclusions():
    kb = Knowledge((fact(3, 10.0),))
    firings = run([total, double, other_double, sum_rule, unknown], kb)
    idents = [(f.conclusion.topic, f.conclusion.key) for f in firings]
    assert len(idents) == len(set(idents))
    assert kb.get("toy", "double").rule == "toy.double"


def test_unknown_is_not_a_value():
    kb = Knowledge(())
    run([unknown], kb)
    d = kb.get("toy", "missing")
    assert not d.known and d.value.reason == "not in the log"
    assert kb.value("toy", "missing") is None and kb.value("toy", "absent") is None


def test_evidence_chain_walks_back_to_facts_once_in_line_order():
    f1, f2 = fact(7, 10.0), fact(3, 5.0, tp=1)
    a = Derived("t", "a", 1, "r", (f1,))
    b = Derived("t", "b", 2, "r", (f2, f1))
    top = Derived("t", "top", 3, "r", (a, b, a))  # a diamond: f1 reached three ways
    chain = list(evidence_chain(top))
    assert chain == [f2, f1]
    assert [f.evidence.line for f in chain] == [3, 7]
    assert list(evidence_chain(f1)) == [f1]


def test_finding_is_a_derived_with_a_message():
    f = Finding("finding", "x", None, "x", (), "the message", severity="warning", title="T", action="A")
    assert f.known and f.message == "the message" and f.severity == "warning"


def test_knowledge_filters_by_rank_and_role():
    target = fact(1, 10.0)
    draft = F.LoadWeightBegin(evidence=F.Evidence(5, "x"), rank=F.Rank(), avail_gib=9.0, role="draft")
    other = fact(2, 11.0, tp=1)
    kb = Knowledge((target, other, draft))
    assert kb.of(F.LoadWeightBegin) == [target, other]
    assert kb.of(F.LoadWeightBegin, role=None) == [target, other, draft]
    assert kb.of(F.LoadWeightBegin, rank=F.Rank(tp=1).key()) == [other]
    assert kb.first(F.LoadWeightBegin, role="draft") is draft
    assert kb.last(F.LoadWeightBegin) is other


# ---- on whole analyses ---------------------------------------------------------------------------

FIXTURE_LOGS = sorted(p.name for p in FIXTURES.glob("*.log"))


@pytest.mark.parametrize("name", FIXTURE_LOGS)
def test_same_input_gives_identical_json(name):
    first = render(build(analyse(fixture(name))), "json")
    second = render(build(analyse(fixture(name))), "json")
    assert first == second


@pytest.mark.parametrize("name", FIXTURE_LOGS)
def test_analysis_reaches_a_fixpoint_without_duplicates(name):
    a = analyse(fixture(name))
    idents = [(f.conclusion.topic, f.conclusion.key) for f in a.firings]
    assert len(idents) == len(set(idents)) == len(a.knowledge.derived)
    import capdiag.rules as R  # the rule set the analysis ran, run once more
    rules = R.rules_for(a.framework) if hasattr(R, "rules_for") else R.ALL
    assert run(rules, a.knowledge) == []


@pytest.mark.parametrize("name", FIXTURE_LOGS)
def test_every_conclusion_rests_on_facts_with_their_log_lines(name):
    path = fixture(name)
    physical = Path(path).read_text(encoding="utf-8").split("\n")
    a = analyse(path)
    for d in a.knowledge.derived.values():
        chain = list(evidence_chain(d))
        assert all(isinstance(f, F.Fact) for f in chain)
        lines = [f.evidence.line for f in chain]
        assert lines == sorted(lines)
        assert len({id(f) for f in chain}) == len(chain)
        for f in chain:
            if f.evidence.line == F.INPUT_LINE:  # command-line input, not a log line
                continue
            # the evidence quotes exactly the line at that number of the file
            assert physical[f.evidence.line - 1] == f.evidence.text.split("\n")[0], (d.topic, d.key)


def test_breakdown_evidence_reaches_the_printed_line():
    a = analyse(fixture("single_gpu_ready.log"))
    kv = a.knowledge.get("breakdown", "kv_cache")
    assert [(f.kind, f.evidence.line) for f in evidence_chain(kv)] == [("KVCacheAllocated", 5)]
    unattributed = a.knowledge.get("breakdown", "unattributed")
    assert [f.evidence.line for f in evidence_chain(unattributed)] == [3, 4, 5, 8, 10, 11]
