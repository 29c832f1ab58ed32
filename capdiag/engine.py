"""A small forward-chaining engine: rules over facts and earlier conclusions, to a fixpoint.

Every conclusion is a `Derived` that records the rule that drew it and the premises it was
drawn from (facts or other conclusions). Walking the premises back ends at facts, and so at
log lines: that walk is the evidence chain the report shows.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import attrs

from capdiag import facts as F


@attrs.frozen
class Unknown:
    """A value the inputs do not determine, with the reason. Never a zero, never a default."""

    reason: str


@attrs.frozen(eq=False)
class Derived:
    topic: str  # "breakdown", "concurrency", "config", "finding", …
    key: Any  # identifies the conclusion within its topic
    value: Any  # a number, text, mapping, or Unknown
    rule: str
    premises: tuple = ()
    formula: str = ""  # how the value follows from the premises, in words and numbers
    detail: dict = attrs.Factory(dict)

    @property
    def known(self) -> bool:
        return not isinstance(self.value, Unknown)


@attrs.frozen(eq=False)
class Finding(Derived):
    severity: str = "info"  # info | warning | error
    title: str = ""
    action: str = ""

    @property
    def message(self) -> str:
        return self.formula


Premise = Union[F.Fact, Derived]


@attrs.frozen
class Rule:
    """A named pure function of the knowledge base; its docstring is its documentation.

    A rule with `thresholds` receives them, merged with the policy's overrides, as its
    second argument.
    """

    name: str
    func: Callable[..., Iterable[Derived]]
    code: Optional[str] = None  # set for rules that raise findings, e.g. "CD101"
    severity: Optional[str] = None  # their default severity
    thresholds: dict = attrs.field(factory=dict, hash=False)
    # the frameworks it applies to (empty: both); a rule that cannot judge for want of an
    # input says so itself, by concluding `not_judged`
    frameworks: tuple = ()
    # what the rule reads and what it concludes: fact classes, and "topic" or "topic:key"
    # strings ("?" at the end marks an optional read); the engine orders rules from these
    reads: tuple = ()
    concludes: tuple = ()

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.func.__doc__ or "")

    def __call__(self, kb: "Knowledge") -> Iterable[Derived]:
        if self.thresholds:
            return self.func(kb, kb.settings(self))
        return self.func(kb)


def rule(name: str, code: Optional[str] = None, severity: Optional[str] = None,
         thresholds: Optional[dict] = None, frameworks: tuple = (),
         reads: tuple = (), concludes: tuple = ()) -> Callable[[Callable], Rule]:
    def wrap(func: Callable) -> Rule:
        return Rule(name, func, code, severity, dict(thresholds or {}), tuple(frameworks),
                    tuple(reads), tuple(concludes))
    return wrap


@attrs.define
class Knowledge:
    """What the rules see: the analysed launch's facts, the user's inputs, conclusions so far."""

    facts: tuple[F.Fact, ...]
    derived: dict[tuple, Derived] = attrs.Factory(dict)
    # (position, fact) by class and by (class, rank key), built on first use: a lookup per
    # rank must not scan every fact, or 10,000 ranks cost 10^8 steps
    _by_class: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)
    _by_rank: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)

    def of(self, *kinds: type, rank: Optional[tuple] = None, role: Optional[str] = "target") -> list:
        if not self._by_class and self.facts:
            for position, f in enumerate(self.facts):
                self._by_class.setdefault(type(f), []).append((position, f))
                self._by_rank.setdefault((type(f), f.rank.key()), []).append((position, f))
        classes = [c for c in self._by_class if issubclass(c, kinds)]
        rows = [row for c in classes for row in (self._by_class[c] if rank is None else self._by_rank.get((c, rank), ()))]
        if len(classes) > 1:
            rows.sort(key=lambda row: row[0])
        return [f for _, f in rows if role is None or f.role == role]

    def first(self, kind: type, rank: Optional[tuple] = None, role: Optional[str] = "target"):
        found = self.of(kind, rank=rank, role=role)
        return found[0] if found else None

    def last(self, kind: type, rank: Optional[tuple] = None, role: Optional[str] = "target"):
        found = self.of(kind, rank=rank, role=role)
        return found[-1] if found else None

    def get(self, topic: str, key: Any = None) -> Optional[Derived]:
        return self.derived.get((topic, key))

    def value(self, topic: str, key: Any = None) -> Any:
        d = self.get(topic, key)
        return d.value if d is not None and d.known else None

    def topic(self, topic: str) -> list[Derived]:
        return [d for (t, _), d in self.derived.items() if t == topic]

    def policy(self, rule_name: str) -> dict:
        """The policy's entry for a rule ({} without a policy)."""
        policy = self.first(F.Policy, role=None)
        return policy.rules.get(rule_name, {}) if policy is not None else {}

    def settings(self, r: Rule) -> dict:
        return {**r.thresholds, **self.policy(r.name).get("thresholds", {})}


@attrs.frozen
class Firing:
    rule: str
    conclusion: Derived


def run(rules: Iterable[Rule], kb: Knowledge) -> list[Firing]:
    """Fire every rule until none concludes anything new; returns the firings in order.

    A conclusion is identified by (topic, key) and drawn once: the first rule to draw it
    wins, so a rule never fires twice on the same premises. Rule order is fixed, so the
    result is deterministic. A policy can disable a rule or change its findings' severity.
    """
    rules = [r for r in rules if kb.policy(r.name).get("enabled", True)]
    firings: list[Firing] = []
    changed = True
    while changed:
        changed = False
        for r in rules:
            for conclusion in r(kb) or ():
                ident = (conclusion.topic, conclusion.key)
                if ident in kb.derived:
                    continue
                override = kb.policy(r.name).get("severity")
                if override and isinstance(conclusion, Finding):
                    conclusion = attrs.evolve(conclusion, severity=override)
                kb.derived[ident] = conclusion
                firings.append(Firing(r.name, conclusion))
                changed = True
    return firings


def evidence_chain(d: Premise) -> Iterator[F.Fact]:
    """The facts a conclusion rests on, depth first, each once, in line order."""
    seen: set[int] = set()
    stack: list[Premise] = [d]
    found: list[F.Fact] = []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, F.Fact):
            found.append(node)
        else:
            stack.extend(node.premises)
    return iter(sorted(found, key=lambda f: (f.evidence.source != "log", f.evidence.source, f.evidence.line)))
