"""Rules are registered by the tree: every rule a module of a rule folder defines is found
(capdiag/rules/__init__.py), so no rule file can be left out of the sets, and none can be
defined anywhere it would not be found."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from capdiag import rules as registry
from capdiag.engine import RuleSetError
from capdiag.ruledocs import listing
from helpers import TESTS

ROOT = TESTS.parent
# the build maps the top-level folders into the package (pyproject.toml's package-dir)
PACKAGES = {"capdiag": ROOT / "capdiag", "capdiag.rules": ROOT / "rules"}


def _declared() -> set[tuple[str, str]]:
    """(module, function) of every function in capdiag/ and rules/ decorated with `@rule(...)`,
    read from the source, however deeply nested."""
    found = set()
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            module = ".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef) and any(
                        isinstance(d, ast.Call) and getattr(d.func, "id", getattr(d.func, "attr", None)) == "rule"
                        for d in node.decorator_list):
                    found.add((module, node.name))
    return found


def test_every_rule_in_the_source_is_registered():
    registered = {(r.func.__module__, r.func.__name__) for r in registry.ALL + registry.PLAN + registry.DIFF}
    declared = _declared()
    assert declared, "no @rule found in the source"
    assert declared - registered == set(), "rules that no rule set holds (outside the rule folders?)"
    assert registered <= declared


def test_every_folder_of_rules_is_a_rule_folder():
    folders = {p.name for p in (ROOT / "rules").iterdir() if (p / "__init__.py").exists()}
    assert folders == set(registry.FOLDERS)


def test_capdiag_rules_lists_the_findings_by_code():
    codes = [line.split()[0] for line in listing().splitlines()]
    assert codes == sorted(codes) and len(codes) == len(set(codes)) == len(registry.FINDINGS)


def _package(tmp_path: Path, monkeypatch, name: str, files: dict[str, str]) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    for file, text in files.items():
        (folder / file).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


RULE_FILE = '''
from capdiag.engine import rule
from capdiag.rules.derive.gpu import identity  # imported: not this file's own


@rule("extra.second", concludes=("extra:second",), reads=("extra:first",))
def second(kb):
    """What it concludes: the second."""


@rule("extra.first", concludes=("extra:first",))
def first(kb):
    """What it concludes: the first."""
'''


def test_a_new_rule_file_is_found_without_registering_it(tmp_path, monkeypatch):
    package = _package(tmp_path, monkeypatch, "extra_rules_found", {"b_rules.py": RULE_FILE, "a_driver.py": "X = 1\n",
                                               "_helper.py": "def helper():\n    return 1\n"})
    assert [r.name for r in registry.discover(package)] == ["extra.second", "extra.first"]


def test_a_rule_in_a_helper_module_is_refused(tmp_path, monkeypatch):
    package = _package(tmp_path, monkeypatch, "extra_rules_refused", {"_helper.py": RULE_FILE})
    with pytest.raises(RuleSetError, match="helper module"):
        registry.discover(package)


def test_the_plan_reads_its_inputs_itself():
    # the plan sizes the GPU from the process's view of it (plan.device), not explain's gpu.total
    assert all(r.name.startswith("plan.") for r in registry.PLAN)
    assert {"plan.device", "plan.budget", "plan.pool", "plan.verdict"} <= {r.name for r in registry.PLAN}
    assert all(r.name.startswith("diff.") for r in registry.DIFF)
