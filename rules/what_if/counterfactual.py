"""The counterfactual run behind `--what-if`: the same facts, the changed settings and the
projected values pinned (projection.py concludes them), the same rules re-run by the engine;
then the two finding sets are compared, so any finding can appear or go away.

A pinned conclusion stands in the second run: the rule that would conclude it is not heard on
it, and every rule that reads it follows. What no projection replaces stays as the log
measured it (CUDA graphs, activation peaks, what other processes hold).
"""
from __future__ import annotations

from typing import Any, Iterable

import attrs

from capdiag.engine import Derived, Knowledge, Rule, run


def _projections(rules: Iterable[Rule]) -> set[str]:
    return {r.name for r in rules if any(c.topic == "what_if" for c in r.conclusions)}


def compare(kb: Knowledge, rules: tuple[Rule, ...]) -> None:
    """Re-run `rules` on `kb`'s facts with the projection's conclusions pinned, and complete the
    `what_if` conclusion with the concurrency rows and the findings that appear and go away
    (citing the findings that go away). Nothing to do without a projection that changed
    anything."""
    projection = kb.get("what_if")
    if projection is None or not projection.detail.get("pins"):
        return
    pinned = {(topic, key): Derived(topic, key, value, projection.rule, (projection,), formula, detail)
              for (topic, key), (value, formula, detail) in projection.detail["pins"].items()}
    then = Knowledge(kb.facts)
    skip = _projections(rules)
    run([r for r in rules if r.name not in skip], then, pinned=pinned)
    now = {d.rule: d for d in kb.topic("finding")}
    later = {d.rule: d for d in then.topic("finding")}
    rows = sorted((d for d in then.topic("concurrency") if d.known), key=lambda d: d.key)
    value: dict[str, Any] = dict(projection.value)
    after = {k: value.pop(k) for k in ("full_context_requests", "not_projected") if k in value}
    value["concurrency"] = [{"request_tokens": d.key, "token_limit": d.detail.get("token_limit"),
                             "request_limit": d.detail.get("request_limit"), "max_concurrent": d.value} for d in rows]
    value.update({k: after[k] for k in ("full_context_requests",) if k in after})
    value["findings_appear"] = sorted(set(later) - set(now))
    value["findings_disappear"] = sorted(set(now) - set(later))
    value["not_projected"] = after["not_projected"]
    gone = tuple(now[name] for name in value["findings_disappear"])
    kb.derived[("what_if", None)] = attrs.evolve(projection, value=value, premises=projection.premises + gone,
                                                 detail={**projection.detail, "then": then})
