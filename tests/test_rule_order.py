"""The rules engine on every log the suite knows (the shared corpus when present, every fixture,
every rule case with its side inputs):

- the answers do not depend on the order the rules are registered in, nor on which of the
  valid firing orders the engine picks: shuffled registrations and random ties between rules
  ready at once give byte-identical JSON;
- every conclusion cites every conclusion its rule read (the knowledge base itself is
  instrumented, behind the engine's recording view), and nothing a rule reads is undeclared
  (an undeclared read raises, so it fails here on the first log that takes that path);
- one pass in the derived order is the fixpoint: each rule, fired again on the final
  knowledge, concludes the same.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest

import capdiag.analysis
from capdiag import engine
from capdiag.analysis import analyse
from capdiag.engine import Derived, Knowledge, run
from capdiag.render import render
from capdiag.report import build
from capdiag.rules import ALL, DIFF, FINDINGS, PLAN, rules_for
from helpers import FIXTURES, SHARED
from capdiag.whatif import parse_what_if
from test_rule_cases import CASES, parse_args

EXAMPLE = Path(__file__).resolve().parents[1] / "capdiag" / "examples" / "sglang-llama31-8b-h100.log"

SEEDS = (1, 2)


def _inputs() -> list:
    out = [pytest.param(str(p), {}, id=f"corpus/{p.parent.name}/{p.name[:3]}")
           for p in sorted((SHARED / "corpus").glob("*/*.log"))]
    out += [pytest.param(str(p), {}, id=f"fixture/{p.name}") for p in sorted(FIXTURES.glob("*.log"))]
    for log in sorted(CASES.glob("*/*.log")):
        stem = log.with_suffix("")
        kw = parse_args(stem.with_name(stem.name + ".args")) if stem.with_name(stem.name + ".args").exists() else {}
        for suffix, key in ((".smi.csv", "nvidia_smi"), (".config.json", "config_json")):
            if stem.with_name(stem.name + suffix).exists():
                kw[key] = str(stem.with_name(stem.name + suffix))
        out.append(pytest.param(str(log), kw, id=f"case/{log.parent.name}/{log.stem}"))
    # the counterfactual run of --what-if re-runs the rules too
    for log, changes in ((EXAMPLE, ("kv_cache_dtype=fp8_e4m3",)), (EXAMPLE, ("mem_fraction_static=0.99",
                                                                              "max_running_requests=8")),
                         (FIXTURES / "vllm_v011_oom_capture.log", ("gpu_memory_utilization=0.5",))):
        out.append(pytest.param(str(log), {"what_if": parse_what_if(changes)},
                                id=f"what-if/{log.name}/{'+'.join(changes)}"))
    return out


INPUTS = _inputs()


def _json(path: str, kw: dict) -> str:
    return render(build(analyse(path, **kw)), "json")


@pytest.mark.parametrize("path,kw", INPUTS)
def test_shuffled_rules_and_random_ties_give_identical_json(path, kw, monkeypatch):
    expected = _json(path, kw)
    for seed in SEEDS:
        rng = random.Random(seed)

        def shuffled(framework, _rng=rng):
            rules = list(rules_for(framework))
            _rng.shuffle(rules)
            return tuple(rules)

        def random_ties(rules, tie=str, _order=engine.order, _rng=rng):
            draws: dict[str, float] = {}
            return _order(rules, tie=lambda name: draws.setdefault(name, _rng.random()))

        monkeypatch.setattr(capdiag.analysis, "rules_for", shuffled)
        monkeypatch.setattr(engine, "order", random_ties)
        assert _json(path, kw) == expected, f"seed {seed}"
        monkeypatch.undo()


@pytest.mark.parametrize("path,kw", INPUTS)
def test_every_conclusion_cites_what_its_rule_read_and_one_pass_is_the_fixpoint(path, kw, monkeypatch):
    read: dict[int, list[Derived]] = {}  # id(conclusion) -> the conclusions handed out while its rule ran
    handed: list[Derived] = []
    real_get, real_topic, real_fire = Knowledge.get, Knowledge.topic, engine.fire

    def get(self, topic, key=None):
        d = real_get(self, topic, key)
        if d is not None:
            handed.append(d)
        return d

    def topic(self, name):
        found = real_topic(self, name)
        handed.extend(found)
        return found

    class Recording(dict):
        """Notes, as each conclusion is stored, what had been handed out while its rule ran."""

        def __setitem__(self, ident, conclusion):
            read[id(conclusion)] = [d for d in handed if d is not conclusion]
            super().__setitem__(ident, conclusion)

    def fire(r, kb, pinned=frozenset()):
        handed.clear()
        kb.derived = Recording(kb.derived)
        try:
            return real_fire(r, kb, pinned)
        finally:
            kb.derived = dict(kb.derived)

    monkeypatch.setattr(Knowledge, "get", get)
    monkeypatch.setattr(Knowledge, "topic", topic)
    monkeypatch.setattr(engine, "fire", fire)
    a = analyse(path, **kw)
    monkeypatch.undo()
    what_if = a.knowledge.get("what_if")
    runs = [a.knowledge] + ([what_if.detail["then"]] if what_if is not None and "then" in what_if.detail else [])
    uncited = [(d.rule, f"{d.topic}:{d.key}", f"{p.topic}:{p.key}") for kb in runs for d in kb.derived.values()
               for p in read.get(id(d), ()) if not any(p is q for q in d.premises)]
    assert not uncited
    assert read, "the instrumented knowledge base saw no rule fire"
    again = Knowledge(a.knowledge.facts)
    run(rules_for(a.framework), again, check_fixpoint=True)


def test_every_rule_declares_what_it_concludes_and_every_set_is_well_formed():
    for r in ALL + PLAN + DIFF:
        assert r.concludes, f"{r.name} declares no conclusions"
    for r in FINDINGS:
        assert r.concludes == (f"finding:{r.name}", f"not_judged:{r.name}"), r.name
    for rules in (rules_for("sglang"), rules_for("vllm"), PLAN, DIFF):
        assert len(engine.order(rules)) == len(rules)


def test_fixtures_and_cases_are_all_here():
    assert len(INPUTS) >= len(list(FIXTURES.glob("*.log"))) + len(list(CASES.glob("*/*.log")))
    assert all(Path(p.values[0]).exists() for p in INPUTS)


def test_speculative_draft_memory_cites_the_target_rows_it_divides_by():
    """Its share of model memory is the draft rows over the target's weights, KV and graph rows:
    all six are its premises, so the chain shows both sides of the division."""
    a = analyse(str(Path(__file__).resolve().parent / "rule_cases" / "speculative-draft-memory" / "fires.log"))
    finding = a.knowledge.get("finding", "speculative-draft-memory")
    cited = {(p.topic, p.key) for p in finding.premises if isinstance(p, Derived)}
    assert {("breakdown", k) for k in ("weights", "kv_cache", "cuda_graph", "draft_weights", "draft_kv_cache",
                                        "draft_cuda_graph")} <= cited
