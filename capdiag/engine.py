"""The rules engine: rules declare what they read and conclude; the engine orders them from
those declarations and records what it handed each rule as the premises of its conclusions.

Every conclusion is a `Derived` that records the rule that drew it and the premises it was
drawn from (facts or other conclusions). Walking the premises back ends at facts, and so at
log lines: that walk is the evidence chain the report shows.

How a run goes (`run`):
- `order` sorts the rules topologically: a rule runs after every rule that concludes
  something it reads. Ties are broken by rule name, so the order — and every answer — is the
  same however the rules were registered. A cycle, two rules concluding the same identity, or
  a required read that no rule in the set concludes is a `RuleSetError`.
- Each rule is called once, with a `View` of the knowledge base restricted to its
  declarations: reading a fact class or a conclusion it did not declare raises
  `UndeclaredRead`; concluding an identity outside `concludes` raises `UndeclaredConclusion`.
- Every conclusion the view handed the rule before it yielded a result (known or `Unknown`)
  is added to that result's premises, after the facts and conclusions the rule cited itself.
  So a chain cannot leave out a conclusion its rule read. Facts are cited by the rule (the
  lines its value comes from); the view checks that each cited fact is one it handed over.

Completeness: rules are pure functions of the facts and the conclusions they declare. When a
rule runs, every rule that could conclude one of its reads has already run (that is what the
topological order means), so running it again, or running any rule again, adds nothing: one
pass in this order reaches the fixpoint. `run` checks it on request (`check_fixpoint=True`:
every rule fired again on the final knowledge concludes the same; the test suite does so on
every log).
"""
from __future__ import annotations

import functools
import heapq
import inspect
from array import array
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import attrs

from capdiag import facts as F
from capdiag.frozen import frozen


@frozen
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


@frozen
class Parts:
    """A finding as its rule words it. The rule states its identity once, in `@rule(name,
    code=, severity=, thresholds=)`; the engine adds the name and the default severity when it
    records the finding, so the rule never restates them."""

    premises: tuple  # the facts and conclusions it rests on; None entries are left out
    title: str
    message: str
    action: str
    detail: dict = attrs.Factory(dict)
    key: Any = None  # tells several findings of one rule apart (a reading, a rank)
    severity: Optional[str] = None  # this case's severity, where it is not the rule's default
    value: Any = None

    def finding(self, r: "Rule") -> Finding:
        return Finding("finding", r.name if self.key is None else (r.name, self.key), self.value, r.name,
                       tuple(p for p in self.premises if p is not None), self.message, self.detail,
                       severity=self.severity or r.severity or "info", title=self.title, action=self.action)


@frozen
class NotJudged:
    """A finding rule could not judge. `needed` pairs what an input is with its conclusion
    (None when nothing concluded it, or the reason it is missing)."""

    needed: tuple[tuple[str, Union[Derived, str, None]], ...]

    def conclusion(self, r: "Rule") -> Derived:
        """`not_judged:<rule>`: of the inputs needed, those absent or unknown, each with why.
        Its value is `Unknown`, so no output counts the rule as passed."""
        missing = [(what, d) for what, d in self.needed if not isinstance(d, Derived) or not d.known] \
            or list(self.needed)
        reasons = [f"{what} ({d})" if isinstance(d, str) else f"{what} (not stated in the inputs)" if d is None
                   else f"{what} ({d.value.reason})" if not d.known else what for what, d in missing]
        return Derived("not_judged", r.name, Unknown("needs " + "; ".join(reasons)), r.name,
                       tuple(d for _, d in missing if isinstance(d, Derived)))


def cannot_judge(*needed: tuple[str, Union[Derived, str, None]]) -> NotJudged:
    """What a finding rule yields when an input it needs is absent or unknown."""
    return NotJudged(tuple(needed))


class RuleSetError(Exception):
    """The declarations of a rule set do not make a well-formed set (a cycle, two rules
    concluding one identity, a required read nobody concludes)."""


class UndeclaredRead(Exception):
    """A rule read a fact class or conclusion its `reads` does not declare."""


class UndeclaredConclusion(Exception):
    """A rule concluded an identity its `concludes` does not declare."""


@frozen
class Topic:
    """A declared conclusion pattern: a whole topic (`key` None) or one key in it. A key also
    covers the family of tuple keys that start with it (`finding:rank-imbalance` covers
    ("rank-imbalance", "TP3"))."""

    topic: str
    key: Optional[str] = None
    optional: bool = False

    @classmethod
    def parse(cls, text: str) -> "Topic":
        optional = text.endswith("?")
        topic, _, key = text.rstrip("?").partition(":")
        return cls(topic, key or None, optional)

    def covers(self, topic: str, key: Any) -> bool:
        if topic != self.topic or self.key is None:
            return topic == self.topic
        return key == self.key or (isinstance(key, tuple) and bool(key) and key[0] == self.key)

    def overlaps(self, other: "Topic") -> bool:
        return self.topic == other.topic and (self.key is None or other.key is None or self.key == other.key)

    def __str__(self) -> str:
        return self.topic + (f":{self.key}" if self.key is not None else "") + ("?" if self.optional else "")


@frozen
class Rule:
    """A named pure function of a knowledge view; its docstring is its documentation.

    `reads` holds fact classes and conclusion patterns ("topic", "topic:key", "?" at the end
    for an optional read); `concludes` the patterns of what it may conclude. A rule with
    `thresholds` receives them, merged with the policy's overrides, as its second argument.
    """

    name: str
    func: Callable[..., Iterable[Derived]]
    code: Optional[str] = None  # set for rules that raise findings, e.g. "CD101"
    severity: Optional[str] = None  # their default severity
    thresholds: dict = attrs.field(factory=dict, hash=False)
    # the frameworks it applies to (empty: both); a rule that cannot judge for want of an
    # input says so itself, by concluding `not_judged`
    frameworks: tuple = ()
    reads: tuple = ()
    concludes: tuple = ()
    # a finding's figure that says how bad it is: (its `detail` key, "lower" or "higher" is
    # worse), so a baseline that accepted it can refuse it once it has got worse
    worse: Optional[tuple[str, str]] = None

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.func.__doc__ or "")

    @property
    def fact_reads(self) -> tuple[type, ...]:
        return tuple(r for r in self.reads if isinstance(r, type))

    @property
    def topic_reads(self) -> tuple[Topic, ...]:
        return _parsed(self.reads)

    @property
    def conclusions(self) -> tuple[Topic, ...]:
        return _parsed(self.concludes)

    def __call__(self, kb: "Knowledge") -> Iterable[Derived]:
        if self.thresholds:
            return self.func(kb, kb.settings(self))
        return self.func(kb)


@functools.lru_cache(maxsize=None)
def _parsed(declared: tuple) -> tuple[Topic, ...]:
    """The conclusion patterns among declarations, parsed once per declaration."""
    return tuple(Topic.parse(d) for d in declared if isinstance(d, str))


def finding_identities(name: str) -> tuple[str, ...]:
    """What a finding rule concludes: its findings, or that it could not judge."""
    return (f"finding:{name}", f"not_judged:{name}")


def rule(name: str, code: Optional[str] = None, severity: Optional[str] = None,
         thresholds: Optional[dict] = None, frameworks: tuple = (),
         reads: tuple = (), concludes: tuple = (), worse: Optional[tuple[str, str]] = None) -> Callable[[Callable], Rule]:
    """Declare a rule. A rule with a `code` raises findings: it concludes its own
    `finding:<name>` and `not_judged:<name>` without saying so."""
    def wrap(func: Callable) -> Rule:
        for r in reads:
            if not (isinstance(r, str) or (isinstance(r, type) and issubclass(r, F.Fact))):
                raise RuleSetError(f"rule {name}: reads {r!r}: a fact class or a 'topic[:key][?]' string")
        own = finding_identities(name) if code else ()
        if worse is not None and (not code or len(worse) != 2 or worse[1] not in ("lower", "higher")):
            raise RuleSetError(f"rule {name}: worse={worse!r}: a finding rule's (detail key, 'lower' or 'higher')")
        return Rule(name, func, code, severity, dict(thresholds or {}), tuple(frameworks),
                    tuple(reads), own + tuple(c for c in concludes if c not in own), worse)
    return wrap


class _FirstLast:
    """`first`/`last` over `of`, for the knowledge base and a rule's view of it alike."""

    def first(self, kind: type, rank: Optional[tuple] = None, role: Optional[str] = "target"):
        found = self.of(kind, rank=rank, role=role)
        return found[0] if found else None

    def last(self, kind: type, rank: Optional[tuple] = None, role: Optional[str] = "target"):
        found = self.of(kind, rank=rank, role=role)
        return found[-1] if found else None


@attrs.define
class Knowledge(_FirstLast):
    """What the rules see: the analysed launch's facts, the user's inputs, conclusions so far."""

    facts: tuple[F.Fact, ...]
    derived: dict[tuple, Derived] = attrs.Factory(dict)
    # built on first use, for a lookup by class or by rank must not scan every fact (10,000
    # ranks would cost 10^8 steps): by class, its facts and their positions (to merge classes
    # in line order); by rank key, the rank's facts in order. A few words a fact: a list or a
    # tuple per (class, rank) would cost more than the fact itself.
    _by_class: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)
    _by_rank: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)

    def of(self, *kinds: type, rank: Optional[tuple] = None, role: Optional[str] = "target") -> list:
        if not self._by_class and self.facts:
            for position, f in enumerate(self.facts):
                found, positions = self._by_class.get(type(f)) or self._by_class.setdefault(type(f), ([], array("L")))
                found.append(f)
                positions.append(position)
                self._by_rank.setdefault(f.rank.key(), []).append(f)
        if rank is not None:
            return [f for f in self._by_rank.get(rank, ()) if isinstance(f, kinds) and (role is None or f.role == role)]
        groups = [self._by_class[c] for c in self._by_class if issubclass(c, kinds)]
        if len(groups) == 1:
            rows = groups[0][0]
        else:
            rows = [f for _, f in sorted((p, f) for found, positions in groups for p, f in zip(positions, found))]
        return [f for f in rows if role is None or f.role == role]

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


class View(_FirstLast):
    """The knowledge base as one rule may see it: only what the rule declared, and a record of
    every conclusion handed over (in the order handed, each once)."""

    def __init__(self, kb: Knowledge, r: Rule):
        self._kb, self._rule = kb, r
        self._kinds, self._topics = r.fact_reads, r.topic_reads
        self.handed: list[Derived] = []
        self._handed_ids: set[int] = set()
        self._facts_ids: Optional[set[int]] = None

    # ---- facts
    def _check_kinds(self, kinds: tuple[type, ...]) -> None:
        for kind in kinds:
            if not any(issubclass(kind, declared) for declared in self._kinds):
                raise UndeclaredRead(f"rule {self._rule.name} reads {kind.__name__}, which its `reads` does not "
                                     "declare")

    @property
    def facts(self) -> tuple[F.Fact, ...]:
        """Every fact of the declared classes (declare `F.Fact` to see them all)."""
        return tuple(f for f in self._kb.facts if isinstance(f, self._kinds))

    def of(self, *kinds: type, rank: Optional[tuple] = None, role: Optional[str] = "target") -> list:
        self._check_kinds(kinds)
        return self._kb.of(*kinds, rank=rank, role=role)

    def handed_fact(self, fact: F.Fact) -> bool:
        """The fact is of a declared class, or one that a conclusion handed over rests on."""
        return isinstance(fact, self._kinds) or any(fact is f for d in self.handed for f in evidence_chain(d))

    # ---- conclusions
    def _hand(self, d: Optional[Derived]) -> Optional[Derived]:
        if d is not None and id(d) not in self._handed_ids:
            self._handed_ids.add(id(d))
            self.handed.append(d)
        return d

    def get(self, topic: str, key: Any = None) -> Optional[Derived]:
        if not any(t.covers(topic, key) for t in self._topics):
            raise UndeclaredRead(f"rule {self._rule.name} reads {topic}:{key}, which its `reads` does not declare")
        return self._hand(self._kb.get(topic, key))

    def value(self, topic: str, key: Any = None) -> Any:
        d = self.get(topic, key)
        return d.value if d is not None and d.known else None

    def topic(self, topic: str) -> list[Derived]:
        if not any(t.topic == topic and t.key is None for t in self._topics):
            raise UndeclaredRead(f"rule {self._rule.name} reads all of {topic!r}, which its `reads` does not "
                                 "declare (declare the topic without a key)")
        return [self._hand(d) for d in self._kb.topic(topic)]

    # ---- the rule's settings (the policy is an input of the engine, not a premise)
    def policy(self, rule_name: str) -> dict:
        return self._kb.policy(rule_name)

    def settings(self, r: Rule) -> dict:
        return self._kb.settings(r)


@frozen
class Firing:
    rule: str
    conclusion: Derived


def order(rules: Iterable[Rule], tie: Callable[[str], Any] = str) -> list[Rule]:
    """The rules in firing order, derived from their declarations (see the module text).
    Among rules ready at once the least `tie(name)` goes first (the name itself by default;
    the test suite draws random ties to show the answers do not depend on them)."""
    rules = tuple(rules)
    return list(_order(rules) if tie is str else _order.__wrapped__(rules, tie))


@functools.lru_cache(maxsize=16)
def _order(rules: tuple[Rule, ...], tie: Callable[[str], Any] = str) -> tuple[Rule, ...]:
    """The declarations' order, computed once per rule set (the name breaks ties)."""
    rules = list(rules)
    names = [r.name for r in rules]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RuleSetError(f"rule names registered twice: {', '.join(dupes)}")
    # only patterns of one topic can overlap: each rule is compared with the rules concluding
    # in the topics it names, not with all (a small log's run paid ~10 ms for all pairs)
    topics = [{c.topic for c in r.conclusions} for r in rules]
    concluding: dict[str, list[tuple[Rule, Topic]]] = {}
    for r in rules:
        for c in r.conclusions:
            concluding.setdefault(c.topic, []).append((r, c))
    for i, a in enumerate(rules):
        for j in range(i + 1, len(rules)):
            if topics[i].isdisjoint(topics[j]):
                continue
            b = rules[j]
            clash = [f"{x}" for x in a.conclusions for y in b.conclusions if x.overlaps(y)]
            if clash:
                raise RuleSetError(f"rules {a.name} and {b.name} both conclude {clash[0]}")
    after: dict[str, set[str]] = {r.name: set() for r in rules}  # rule -> the rules it waits for
    for r in rules:
        for read in r.topic_reads:
            found = [o for o, c in concluding.get(read.topic, ()) if read.overlaps(c)]
            if not read.optional and not found:
                raise RuleSetError(f"rule {r.name} reads {read}, which no rule in the set concludes "
                                   "(mark it optional with '?' if it may be absent)")
            after[r.name].update(o.name for o in found if o is not r)
    waiters: dict[str, list[str]] = {r.name: [] for r in rules}  # rule -> the rules waiting for it
    for name, deps in after.items():
        for dep in deps:
            waiters[dep].append(name)
    by_name = {r.name: r for r in rules}
    waiting = {n: len(deps) for n, deps in after.items()}
    ready = [(tie(n), n) for n, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    ordered: list[Rule] = []
    while ready:
        _, name = heapq.heappop(ready)
        ordered.append(by_name[name])
        for other in waiters[name]:
            waiting[other] -= 1
            if waiting[other] == 0:
                heapq.heappush(ready, (tie(other), other))
    if len(ordered) < len(rules):
        stuck = sorted(n for n, count in waiting.items() if count > 0)
        raise RuleSetError(f"the rules' reads form a cycle among: {', '.join(stuck)}")
    return tuple(ordered)


def fire(r: Rule, kb: Knowledge, pinned: frozenset = frozenset()) -> list[Derived]:
    """One rule's conclusions, each with the conclusions its view handed over added to its
    premises. Within one rule the first conclusion of an identity stands (a rule may yield
    candidates in order of preference); an identity in `pinned` is left as it stands."""
    view = View(kb, r)
    drawn: list[Derived] = []
    for said in r(view) or ():  # type: ignore[arg-type]
        conclusion = _stamped(r, said)
        ident = (conclusion.topic, conclusion.key)
        if not any(c.covers(*ident) for c in r.conclusions):
            raise UndeclaredConclusion(f"rule {r.name} concluded {conclusion.topic}:{conclusion.key}, which its "
                                       "`concludes` does not declare")
        if conclusion.rule != r.name:
            raise UndeclaredConclusion(f"rule {r.name} concluded {conclusion.topic}:{conclusion.key} in the name "
                                       f"of {conclusion.rule!r}")
        if ident in kb.derived:
            if ident in pinned or kb.derived[ident].rule == r.name:
                continue
            raise UndeclaredConclusion(f"rule {r.name} concluded {ident}, already concluded by "
                                       f"{kb.derived[ident].rule}")
        for p in conclusion.premises:
            if isinstance(p, F.Fact) and not view.handed_fact(p):
                raise UndeclaredRead(f"rule {r.name} cites a {type(p).__name__}, which neither its `reads` nor "
                                     "a conclusion it read hands over")
        cited = {id(p) for p in conclusion.premises}
        extra = tuple(d for d in view.handed if id(d) not in cited and d is not conclusion)
        if extra:
            conclusion = attrs.evolve(conclusion, premises=conclusion.premises + extra)
        override = kb.policy(r.name).get("severity")
        if override and isinstance(conclusion, Finding):
            conclusion = attrs.evolve(conclusion, severity=override)
        kb.derived[ident] = conclusion
        drawn.append(conclusion)
    return drawn


def _stamped(r: Rule, said: Union[Derived, Parts, NotJudged]) -> Derived:
    """What a rule yielded, with its identity added: a finding rule yields `Parts` or
    `NotJudged`, never a `Finding` of its own making (its name and severity would be restated)."""
    if isinstance(said, (Parts, NotJudged)):
        if r.code is None:
            raise UndeclaredConclusion(f"rule {r.name} yields a finding's parts but has no code")
        return said.finding(r) if isinstance(said, Parts) else said.conclusion(r)
    if isinstance(said, Finding):
        raise UndeclaredConclusion(f"rule {r.name} made a Finding itself: yield its Parts, the engine adds "
                                   "the rule's name and severity")
    return said


def run(rules: Iterable[Rule], kb: Knowledge, *, pinned: Optional[dict[tuple, Derived]] = None,
        check_fixpoint: bool = False) -> list[Firing]:
    """Fire every rule once, in the order `order` derives; returns the firings in order.

    `pinned` conclusions are placed in the knowledge base first and stand: a rule that would
    conclude one of them is not heard on it (the what-if run pins projected values this way).
    A policy can disable a rule or change its findings' severity. With `check_fixpoint`, each
    rule is fired again on the final knowledge base and must conclude exactly what it did.
    """
    ordered = [r for r in order(rules) if kb.policy(r.name).get("enabled", True)]
    kb.derived.update(pinned or {})
    held = frozenset(pinned or ())
    drawn = {r.name: fire(r, kb, held) for r in ordered}
    if check_fixpoint:
        for r in ordered:
            others = {k: d for k, d in kb.derived.items() if d.rule != r.name or k in held}
            again = fire(r, Knowledge(kb.facts, others), held)
            if [(d.topic, d.key, d.value) for d in again] != [(d.topic, d.key, d.value) for d in drawn[r.name]]:
                raise RuleSetError(f"rule {r.name} concludes otherwise when fired again on the final knowledge: "
                                   "it reads something its declarations do not order it after")
    return [Firing(r.name, d) for r in ordered for d in drawn[r.name]]


def primary_fact(d: Premise) -> Optional[F.Fact]:
    """The fact a conclusion's value comes from: its first cited premise, followed back to a
    fact. A rule cites the line of the value it judges first (the conclusions it was merely
    handed come after what it cites), so this is the line to point at."""
    node: Any = d
    while isinstance(node, Derived):
        if not node.premises:
            return None
        node = node.premises[0]
    return node


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
