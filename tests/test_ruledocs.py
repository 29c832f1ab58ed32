"""The rules' documentation: every finding rule is documented in ruff's form, `capdiag rules`
prints it, and docs/rules.md is generated from it (this test fails when the file is stale)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from capdiag import ruledocs
from capdiag.rules import DERIVATIONS, FINDINGS, find_rule
from helpers import fixture, run_entry

DOCS = Path(__file__).resolve().parents[1] / "docs" / "rules.md"


def test_docs_page_is_current():
    assert DOCS.read_text(encoding="utf-8") == ruledocs.markdown(), \
        "docs/rules.md is stale: regenerate it with `capdiag rules --markdown > docs/rules.md`"


@pytest.mark.parametrize("r", FINDINGS, ids=[r.name for r in FINDINGS])
def test_rule_is_documented(r):
    sections = ruledocs.sections(r)
    assert set(sections) == {"What it checks", "Why it matters", "Example", "What to do"}
    assert all(len(text) > 20 for text in sections.values())
    assert re.fullmatch(r"CD1\d\d", r.code) and r.severity in ("info", "warning", "error")
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", r.name)
    for key in r.thresholds:  # every threshold is named in the documentation
        assert f"`{key}`" in r.doc, f"{r.name}: threshold {key} is not documented"


FINDING_FILES = sorted(p for p in (Path(__file__).resolve().parents[1] / "rules" / "findings").glob("*.py")
                       if not p.name.startswith("_"))


def test_codes_and_names_are_unique():
    assert len({r.code for r in FINDINGS}) == len({r.name for r in FINDINGS}) == len(FINDINGS)


def test_every_finding_file_holds_the_rule_its_name_spells():
    """One finding a file (CONTRIBUTING: a new finding is a new file): the tree, not a list kept
    by hand, says which findings there are."""
    homes = {r.name: r.func.__module__.rsplit(".", 1)[-1] for r in FINDINGS}
    assert sorted(homes.values()) == [p.stem for p in FINDING_FILES]
    assert all(stem.replace("_", "-") == name for name, stem in homes.items())


def test_find_rule_by_name_or_code():
    assert find_rule("CD110").name == "thin-headroom"
    assert find_rule("cd110") is find_rule("thin-headroom")
    assert find_rule("no-such-rule") is None


def test_cli_lists_rules(monkeypatch, capsys):
    code, out, _ = run_entry(monkeypatch, capsys, "rules")
    assert code == 0 and len(out.splitlines()) == len(FINDINGS)
    assert out.splitlines()[0].startswith("CD101  startup-incomplete")


def test_cli_prints_one_rule(monkeypatch, capsys):
    code, out, _ = run_entry(monkeypatch, capsys, "rules", "thin-headroom")
    assert code == 0 and out.startswith("CD110 thin-headroom (default severity: warning)")
    assert "What to do:" in out and "min_free_gib = 1.0" in out


def test_cli_unknown_rule_is_exit_2(monkeypatch, capsys):
    code, _, err = run_entry(monkeypatch, capsys, "rules", "no-such-rule")
    assert code == 2 and err.startswith("capdiag: error: no rule named")


DERIVE = [r for r in DERIVATIONS if ruledocs.kind(r) == "derive"]


@pytest.mark.parametrize("r", DERIVATIONS, ids=[r.name for r in DERIVATIONS])
def test_derivation_rule_is_documented(r):
    """The derivation rules hold the core formulas: each says what it concludes, how, and an example."""
    sections = ruledocs.sections(r)
    assert set(sections) == set(ruledocs.DERIVATION_SECTIONS)
    assert all(len(text) > 20 for text in sections.values())
    assert all(f"`{c.topic}" in sections["What it concludes"] for c in r.conclusions), r.name


def test_the_folder_says_what_a_rule_is():
    assert {ruledocs.kind(r) for r in FINDINGS} == {"finding"}
    assert {ruledocs.kind(r) for r in DERIVATIONS} == {"derive", "what-if", "plan", "diff"}
    assert DERIVE and len({r.name for r in DERIVATIONS}) == len(DERIVATIONS)


def test_cli_lists_and_prints_derivation_rules(monkeypatch, capsys):
    code, out, _ = run_entry(monkeypatch, capsys, "rules", "--derivations")
    rows = out.splitlines()
    assert code == 0 and len(rows) == len(DERIVATIONS)
    assert any(row.split()[:2] == ["derive", "breakdown.weights"] for row in rows)
    assert any(row.split()[:2] == ["what-if", "what-if.sglang"] for row in rows)
    assert any(row.split()[:2] == ["plan", "plan.kv-cells"] for row in rows)
    code, out, _ = run_entry(monkeypatch, capsys, "rules", "kv-pool.budget")
    assert code == 0
    assert out.startswith("kv-pool.budget (derive rule; concludes kv_pool:budget_gib, kv_pool:headroom_gib)")
    assert "How:\n  The KV budget SGLang sized the pool from: free memory after weights minus" in out
    assert out.index("What it concludes:") < out.index("How:") < out.index("Example:")


def test_trace_prints_firings_to_stderr(monkeypatch, capsys):
    code, out, err = run_entry(monkeypatch, capsys, "explain", fixture("single_gpu_ready.log"), "--format", "json",
                               "--trace")
    assert code == 0 and out.lstrip().startswith("{")
    blocks = [line for line in err.splitlines() if line.startswith("#")]
    fired = [b.split(" ", 2)[1] for b in blocks]  # in the order the declarations give
    assert "target-rank" in fired and fired.index("target-rank") < fired.index("breakdown.weights")
    assert any(" breakdown.weights → breakdown.weights = " in b for b in blocks)
    assert "from LoadWeightEnd (line" in err
