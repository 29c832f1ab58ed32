"""capdiag.engine: forward chaining to a fixpoint, one conclusion per (topic, key), evidence chains."""
from __future__ import annotations

from pathlib import Path

import pytest

from capdiag import facts as F
from capdiag.analysis import analyse
from capdiag.engine import (Derived, Finding, Knowledge, Parts, RuleSetError, UndeclaredConclusion, UndeclaredRead,
                            Unknown, cannot_judge, evidence_chain, order, rule, run)
from capdiag.render import render
from capdiag.rules import rules_for
from capdiag.report import build
from helpers import FIXTURES, fixture


def fact(line: int, avail: float, tp: int = 0) -> F.LoadWeightBegin:
    return F.LoadWeightBegin(evidence=F.Evidence(line, f"[x TP{tp}] Load weight begin. avail mem={avail} GB"),
                             rank=F.Rank(tp=tp), avail_gib=avail)


# ---- a toy rule set -------------------------------------------------------------------------------

@rule("toy.total", reads=("toy:double",), concludes=("toy:total",))
def total(kb):
    """Reads toy.double, registered after it: the declarations, not the list, order them."""
    d = kb.get("toy", "double")
    if d is not None:
        yield Derived("toy", "total", d.value + 1, "toy.total", (d,), f"{d.value} + 1")


@rule("toy.double", reads=(F.LoadWeightBegin,), concludes=("toy:double",))
def double(kb):
    begins = kb.of(F.LoadWeightBegin)
    if begins:
        yield Derived("toy", "double", begins[0].avail_gib * 2, "toy.double", (begins[0],), "× 2")
        yield Derived("toy", "double", -1, "toy.double", (begins[0],), "a second candidate is not heard")


@rule("toy.other-double", concludes=("toy:double",))
def other_double(kb):
    yield Derived("toy", "double", 999, "toy.other-double", (), "a second rule for the same identity")


@rule("toy.sum", reads=("toy:double", "toy:total"), concludes=("toy:sum",))
def sum_rule(kb):
    """Cites only toy.total; the engine adds toy.double, which it also read."""
    a, b = kb.get("toy", "double"), kb.get("toy", "total")
    if a is not None and b is not None:
        yield Derived("toy", "sum", a.value + b.value, "toy.sum", (b,), "diamond over double")


@rule("toy.unknown", concludes=("toy:missing",))
def unknown(kb):
    yield Derived("toy", "missing", Unknown("not in the log"), "toy.unknown")


@rule("toy.because-unknown", reads=("toy:missing",), concludes=("toy:blocked",))
def because_unknown(kb):
    """Reads an unknown and concludes unknown, citing nothing itself."""
    missing = kb.get("toy", "missing")
    yield Derived("toy", "blocked", Unknown(f"needs toy.missing: {missing.value.reason}"), "toy.because-unknown")


TOYS = [total, double, sum_rule, unknown, because_unknown]


def test_order_follows_the_declarations_not_the_list():
    assert [r.name for r in order(TOYS)] == ["toy.double", "toy.total", "toy.sum", "toy.unknown",
                                             "toy.because-unknown"]
    assert [r.name for r in order(reversed(TOYS))] == [r.name for r in order(TOYS)]
    kb = Knowledge((fact(3, 10.0),))
    firings = run(TOYS, kb, check_fixpoint=True)
    assert (kb.value("toy", "double"), kb.value("toy", "total"), kb.value("toy", "sum")) == (20.0, 21.0, 41.0)
    assert [f.rule for f in firings] == ["toy.double", "toy.total", "toy.sum", "toy.unknown", "toy.because-unknown"]


def test_a_rule_yields_an_identity_once_its_first_candidate_stands():
    kb = Knowledge((fact(3, 10.0),))
    firings = run(TOYS, kb)
    idents = [(f.conclusion.topic, f.conclusion.key) for f in firings]
    assert len(idents) == len(set(idents))
    assert kb.get("toy", "double").formula == "× 2"


def test_premises_hold_everything_the_rule_was_handed():
    kb = Knowledge((fact(3, 10.0),))
    run(TOYS, kb)
    total_d, double_d = kb.get("toy", "total"), kb.get("toy", "double")
    assert kb.get("toy", "sum").premises == (total_d, double_d)  # cited first, then what else it read
    blocked = kb.get("toy", "blocked")  # unknown because an unknown: the chain says so
    assert blocked.premises == (kb.get("toy", "missing"),) and not blocked.premises[0].known


def test_unknown_is_not_a_value():
    kb = Knowledge(())
    run([unknown], kb)
    d = kb.get("toy", "missing")
    assert not d.known and d.value.reason == "not in the log"
    assert kb.value("toy", "missing") is None and kb.value("toy", "absent") is None


def test_two_rules_concluding_one_identity_are_refused():
    with pytest.raises(RuleSetError, match="toy.double and toy.other-double both conclude toy:double"):
        order([double, other_double])


def test_a_cycle_is_refused():
    @rule("toy.a", reads=("toy:b",), concludes=("toy:a",))
    def a(kb):
        return ()

    @rule("toy.b", reads=("toy:a",), concludes=("toy:b",))
    def b(kb):
        return ()

    with pytest.raises(RuleSetError, match="cycle among: toy.a, toy.b"):
        order([a, b])


def test_a_required_read_nobody_concludes_is_refused_an_optional_one_is_not():
    with pytest.raises(RuleSetError, match="reads toy:double, which no rule in the set concludes"):
        order([total])

    @rule("toy.maybe", reads=("toy:double?",), concludes=("toy:maybe",))
    def maybe(kb):
        yield Derived("toy", "maybe", kb.value("toy", "double") is None, "toy.maybe")

    kb = Knowledge(())
    run([maybe], kb)
    assert kb.value("toy", "maybe") is True


def test_undeclared_reads_and_conclusions_raise():
    @rule("toy.sneaky", reads=("toy:double",), concludes=("toy:sneaky",))
    def sneaky(kb):
        kb.get("toy", "total")
        return ()

    @rule("toy.fact-sneaky", concludes=("toy:x",))
    def fact_sneaky(kb):
        kb.of(F.LoadWeightBegin)
        return ()

    @rule("toy.topic-sneaky", reads=("toy:double",), concludes=("toy:y",))
    def topic_sneaky(kb):
        kb.topic("toy")
        return ()

    @rule("toy.overreach", concludes=("toy:mine",))
    def overreach(kb):
        yield Derived("toy", "yours", 1, "toy.overreach")

    @rule("toy.misnamed", concludes=("toy:mine",))
    def misnamed(kb):
        yield Derived("toy", "mine", 1, "some-other-rule")

    @rule("toy.cites-unread", concludes=("toy:mine",))
    def cites_unread(kb):
        yield Derived("toy", "mine", 1, "toy.cites-unread", (fact(3, 1.0),))

    for bad, error in ((sneaky, UndeclaredRead), (fact_sneaky, UndeclaredRead), (topic_sneaky, UndeclaredRead),
                       (overreach, UndeclaredConclusion), (misnamed, UndeclaredConclusion),
                       (cites_unread, UndeclaredRead)):
        with pytest.raises(error):
            run([double, bad], Knowledge((fact(3, 10.0),)))


def test_a_key_covers_its_family_of_tuple_keys():
    @rule("toy.family", concludes=("toy:per-rank",))
    def family(kb):
        yield Derived("toy", ("per-rank", "TP0"), 1, "toy.family")
        yield Derived("toy", ("per-rank", "TP1"), 2, "toy.family")

    kb = Knowledge(())
    run([family], kb)
    assert kb.value("toy", ("per-rank", "TP1")) == 2


def test_pinned_conclusions_stand_and_what_reads_them_follows():
    kb = Knowledge((fact(3, 10.0),))
    pin = Derived("toy", "double", 100.0, "what-if", (), "pinned")
    run(TOYS, kb, pinned={("toy", "double"): pin})
    assert kb.get("toy", "double") is pin and kb.value("toy", "total") == 101.0


def test_a_rule_that_reads_behind_the_views_back_fails_the_fixpoint_check():
    @rule("toy.aaa-early", concludes=("toy:early",))
    def early(kb):  # reads toy.double without declaring it, so nothing orders it after toy.double
        yield Derived("toy", "early", kb._kb.value("toy", "double"), "toy.aaa-early")

    with pytest.raises(RuleSetError, match="toy.aaa-early concludes otherwise when fired again"):
        run([early, double], Knowledge((fact(3, 10.0),)), check_fixpoint=True)


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


@rule("toy-low-memory", code="CD999", severity="warning", thresholds={"min_gib": 5.0},
      reads=(F.LoadWeightBegin, "toy:double?"))
def low_memory(kb, t):
    """A finding rule states its name, code, severity and thresholds once, in the decorator."""
    begin = kb.first(F.LoadWeightBegin)
    if begin is None:
        yield cannot_judge(("the free memory before weights", None), ("the doubled figure", kb.get("toy", "double")))
        return
    if begin.avail_gib < t["min_gib"]:
        yield Parts((begin, None), title="Little memory", message=f"{begin.avail_gib} GiB free", action="Free some",
                    detail={"gib": begin.avail_gib})
    if begin.avail_gib < 1:
        yield Parts((begin,), title="Almost none", message="under 1 GiB", action="Free the GPU", key="critical",
                    severity="error")


def test_a_finding_rule_returns_its_parts_and_the_engine_adds_its_identity():
    kb = Knowledge((fact(3, 0.5),))
    run([low_memory, double], kb)
    plain, critical = kb.get("finding", "toy-low-memory"), kb.get("finding", ("toy-low-memory", "critical"))
    assert isinstance(plain, Finding) and plain.rule == "toy-low-memory" and plain.severity == "warning"
    assert (plain.title, plain.message, plain.action, plain.detail) == ("Little memory", "0.5 GiB free", "Free some",
                                                                       {"gib": 0.5})
    assert plain.premises[0] is kb.facts[0] and None not in plain.premises
    assert critical.severity == "error" and critical.rule == "toy-low-memory"
    quiet = Knowledge((fact(3, 40.0),))
    run([low_memory, double], quiet)
    assert quiet.topic("finding") == []


def test_a_finding_rule_that_cannot_judge_says_which_input_is_missing():
    kb = Knowledge(())
    run([low_memory, unknown], kb)
    d = kb.get("not_judged", "toy-low-memory")
    assert d.rule == "toy-low-memory" and not d.known
    assert d.value.reason == "needs the free memory before weights (not stated in the inputs); the doubled figure " \
                             "(not stated in the inputs)"


def test_a_finding_made_by_hand_or_parts_from_a_rule_without_a_code_are_refused():
    @rule("toy-by-hand", code="CD998", severity="info")
    def by_hand(kb):
        yield Finding("finding", "toy-by-hand", None, "toy-by-hand", (), "m", severity="info", title="t", action="a")

    @rule("toy.parts", concludes=("toy:parts",))
    def parts_without_code(kb):
        yield Parts((), title="t", message="m", action="a")

    for r in (by_hand, parts_without_code):
        with pytest.raises(UndeclaredConclusion):
            run([r], Knowledge(()))


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
    again = Knowledge(a.knowledge.facts)  # the same rule set on the same facts, each rule checked again
    firings = run(rules_for(a.framework), again, check_fixpoint=True)
    assert [(f.rule, f.conclusion.topic, f.conclusion.key) for f in firings] == \
        [(f.rule, f.conclusion.topic, f.conclusion.key) for f in a.firings]


@pytest.mark.parametrize("name", FIXTURE_LOGS)
def test_every_conclusion_rests_on_facts_with_their_log_lines(name):
    path = fixture(name)
    physical = Path(path).read_text(encoding="utf-8").split("\n")
    a = analyse(path)
    for d in a.knowledge.derived.values():
        chain = list(evidence_chain(d))
        assert all(isinstance(f, F.Fact) for f in chain)
        log = [f.evidence.line for f in chain if f.evidence.source == "log"]
        assert log == sorted(log) and chain[:len(log)] == [f for f in chain if f.evidence.source == "log"]
        assert len({id(f) for f in chain}) == len(chain)
        for f in chain:
            if f.evidence.line == F.INPUT_LINE:  # command-line input, not a log line
                continue
            # the evidence quotes exactly the line at that number of the file
            assert physical[f.evidence.line - 1] == f.evidence.text.split("\n")[0], (d.topic, d.key)


def test_breakdown_evidence_reaches_the_printed_line():
    a = analyse(fixture("single_gpu_ready.log"))
    kv = a.knowledge.get("breakdown", "kv_cache")
    # the default target rank rests on no option, so the chain ends at the printed line
    assert [(f.kind, f.evidence.line) for f in evidence_chain(kv)] == [("KVCacheAllocated", 5)]
    unattributed = a.knowledge.get("breakdown", "unattributed")
    assert [f.evidence.line for f in evidence_chain(unattributed)] == [3, 4, 5, 8, 10, 11]
    # a rank asked for is an input the row rests on, named as it was given
    asked = analyse(fixture("single_gpu_ready.log"), target_rank="tp0").knowledge.get("breakdown", "kv_cache")
    assert [(f.kind, f.evidence.text) for f in evidence_chain(asked)] == [
        ("KVCacheAllocated", Path(fixture("single_gpu_ready.log")).read_text().splitlines()[4]),
        ("Options", "--target-rank tp0 --token-lengths 4096,6144,8192 (the default)")]
