"""The flow has one direction: no module of capdiag/ or rules/ imports, directly or through
others, a module that imports it back — a lazy import inside a function counts too; and no
rule module reaches what is built on the rules (source → parsing → facts → engine+rules →
report → render): the analysis, the report, rendering, the CLI, or any module that runs rules."""
from __future__ import annotations

import ast
from pathlib import Path

from helpers import TESTS

ROOT = TESTS.parent
RULES = "capdiag.rules"
# built on the rules, whether or not they import a rule module today
DOWNSTREAM = ("capdiag.analysis", "capdiag.report", "capdiag.render", "capdiag.cli", "capdiag.api")
# the build maps the top-level folders into the package (pyproject.toml's package-dir)
PACKAGES = {"capdiag": ROOT / "capdiag", "capdiag.rules": ROOT / "rules"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that `name` imports anywhere in its text. `from pkg import x`
    imports pkg and, when x is a module, pkg.x. Importing a module runs its packages'
    `__init__` first, so those count too — except a package `name` itself is inside (it is
    already being run when `name` is)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kept = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(kept + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in (t for t in targets if t in modules):
            parts = target.split(".")
            out.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
                       if p in modules and not name.startswith(p + ".") and p != name)
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle, as the modules around it; [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return []


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_no_import_cycle_in_capdiag_or_rules():
    assert _cycle(_graph()) == []


def test_a_cycle_is_found():
    """The check itself: a back-edge makes a cycle it names."""
    graph = _graph()
    graph["capdiag.facts.base"] = graph["capdiag.facts.base"] | {"capdiag.report"}
    cycle = _cycle(graph)
    assert cycle[0] == cycle[-1] and "capdiag.report" in cycle


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def _rules_package(name: str) -> bool:
    return name == RULES or name.startswith(RULES + ".")


def _back_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each rule module's reach into what is built on the rules: the DOWNSTREAM modules and
    every module outside rules/ that imports a rule module, directly or through others."""
    built_on = {m for m in graph if not _rules_package(m) and any(map(_rules_package, _reach(graph, m)))}
    built_on |= set(DOWNSTREAM)
    found = {m: _reach(graph, m) & built_on for m in graph if _rules_package(m)}
    return {m: bad for m, bad in found.items() if bad}


def test_rules_never_reach_what_is_built_on_them():
    assert _back_edges(_graph()) == {}


def test_a_back_edge_is_found():
    """The check itself: a driver importing the analysis (what rules/plan and rules/diff once
    did) is a back-edge, though it makes no cycle."""
    graph = _graph()
    graph["capdiag.rules.plan.driver"] = graph["capdiag.rules.plan.driver"] | {"capdiag.analysis"}
    assert _cycle(graph) == []
    assert "capdiag.analysis" in _back_edges(graph)["capdiag.rules.plan.driver"]
