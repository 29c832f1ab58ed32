"""The rules, found in the tree: each rule file declares itself with `@rule(...)`, and this
package imports every module of its rule folders and registers the rules each defines —
nothing lists them by hand, so a rule in one of these folders cannot be left out.

- `rules/derive/`: derivation rules (the breakdown, KV pool, configuration, GPU, ranks,
  failure); a framework's own reading of the memory lines says so with `frameworks=`.
- `rules/findings/`: the finding rules, one per file.
- `rules/what_if/`: the `--what-if` projections.
- `rules/plan/`, `rules/diff/`: the `capdiag plan` worksheet and the `capdiag diff` comparison,
  each with its driver.

A module whose name starts with `_` is a helper and defines no rule. The order the rules are
found in does not matter: the engine derives the firing order from each rule's `reads=` /
`concludes=` declarations (capdiag/engine.py). Each rule is a short pure function of the
knowledge base; its docstring is its documentation (`capdiag rules` prints it, docs/rules.md
is generated from it). Finding rules carry a stable code and slug.
"""
from __future__ import annotations

import importlib
import pkgutil

from capdiag.engine import Rule, RuleSetError

# The folders that hold rules, in the order `capdiag rules --derivations` lists their rules.
FOLDERS = ("derive", "findings", "what_if", "plan", "diff")


def discover(package: str) -> tuple[Rule, ...]:
    """The rules the modules of `package` define (each module's own, not those it imports):
    modules by name, each module's rules in the order it defines them. A helper module (`_`
    first in its name) that defines a rule is a `RuleSetError`: it would never be registered."""
    found: dict[Rule, None] = {}
    for info in sorted(pkgutil.iter_modules(importlib.import_module(package).__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package}.{info.name}")
        own = [v for v in vars(module).values() if isinstance(v, Rule) and v.func.__module__ == module.__name__]
        if own and info.name.startswith("_"):
            raise RuleSetError(f"{module.__name__} is a helper module (its name starts with _) and defines rules "
                               f"({', '.join(r.name for r in own)}): move them to a rule file")
        found.update(dict.fromkeys(own))
    return tuple(found)


def with_providers(rules: tuple[Rule, ...], pool: tuple[Rule, ...]) -> tuple[Rule, ...]:
    """`rules`, and the rules of `pool` that conclude what they read, directly or through each
    other (the plan worksheet borrows the GPU rules of rules/derive/ so)."""
    chosen = list(rules)
    while True:
        more = [p for p in pool if p not in chosen and any(read.overlaps(c) for r in chosen for read in r.topic_reads
                                                           for c in p.conclusions)]
        if not more:
            return tuple(chosen)
        chosen += more


BY_FOLDER = {folder: discover(f"{__name__}.{folder}") for folder in FOLDERS}

DERIVE = BY_FOLDER["derive"]
FINDINGS = tuple(sorted(BY_FOLDER["findings"], key=lambda r: r.code))  # by code
# Projections: they say which findings a change would add or remove.
WHAT_IF = BY_FOLDER["what_if"]
ALL = DERIVE + FINDINGS + WHAT_IF
FINDING_RULES = FINDINGS
PLAN = with_providers(BY_FOLDER["plan"], DERIVE)
DIFF = with_providers(BY_FOLDER["diff"], DERIVE)


def rules_for(framework: str, every: bool = False) -> tuple:
    """The rule set for one framework's logs: the derivation rules that apply to it, and the
    findings and projections that do (with `every`, also those that do not, for the trace to
    say why they did not fire; never another framework's derivations, which conclude what this
    one's do). The engine orders them from their declarations."""
    return tuple(r for r in ALL if not r.frameworks or framework in r.frameworks or (every and r not in DERIVE))


def find_rule(name_or_code: str):
    """A finding rule by slug or code (case-insensitive); None if there is none."""
    wanted = name_or_code.strip().lower()
    return next((r for r in FINDINGS if r.name == wanted or (r.code or "").lower() == wanted), None)


# The rules that derive values (everything but the findings), each once: `capdiag rules --derivations`.
DERIVATIONS = tuple(dict.fromkeys(r for r in ALL + PLAN + DIFF if r.code is None))


def find_any_rule(name_or_code: str):
    """A finding rule by slug or code, else a derivation rule by name (case-insensitive)."""
    wanted = name_or_code.strip().lower()
    return find_rule(name_or_code) or next((r for r in DERIVATIONS if r.name == wanted), None)
