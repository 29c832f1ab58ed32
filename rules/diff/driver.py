"""`capdiag diff BEFORE AFTER`: two analysed start-ups' knowledge → Compared facts → the diff rules.

The driver is handed what it runs on (the diff rule set, each side's knowledge) and hands back
the diff's knowledge; the diff report is built from it on the report side (capdiag/report.py),
so rules never reach back into the analysis or the report that are built on them."""
from __future__ import annotations

import attrs

from capdiag import facts as F
from capdiag.engine import Derived, Knowledge, Rule, primary_fact, run
from capdiag.vocabulary import CONFIG_KEYS

_EXTRA_CONFIG = ("cuda_graph_max_bs", "disable_cuda_graph", "enforce_eager", "max_num_batched_tokens")


def _anchor(d: Derived) -> F.Evidence:
    """The line of the value compared: the fact the conclusion's value comes from."""
    fact = primary_fact(d)
    return fact.evidence if fact is not None else F.Evidence(F.INPUT_LINE, f"{d.topic}.{d.key}", 0, "input")


def compared_facts(side: str, kb: Knowledge) -> list[F.Compared]:
    """What one side's knowledge states that the diff rules compare, each a fact of that side."""
    out: list[F.Compared] = []

    def add(topic, key, d: Derived, value=None):
        if d is not None and d.known:
            ev = _anchor(d)
            out.append(F.Compared(evidence=attrs.evolve(ev, source=f"{side} {ev.source}"), side=side, topic=topic,
                                  key=key, value=d.value if value is None else value))

    for key in CONFIG_KEYS:
        add("config", key, kb.get("config", key))
    args = kb.first(F.ServerArgs, role=None)
    for key in _EXTRA_CONFIG:
        value = args.fields.get(key) if args is not None else None
        if isinstance(value, (int, float, str, bool)):
            out.append(F.Compared(evidence=attrs.evolve(args.evidence, source=f"{side} log"), side=side,
                                  topic="config", key=key, value=value))
    add("config", "gpu_total_gib", kb.get("gpu", "total_gib"))
    begins = kb.of(F.LoadWeightBegin)
    if begins:
        least = min(begins, key=lambda f: f.avail_gib)
        out.append(F.Compared(evidence=attrs.evolve(least.evidence, source=f"{side} log"), side=side, topic="config",
                              key="free_before_weights_gib", value=least.avail_gib))
    for d in kb.topic("breakdown"):
        add("breakdown", d.key, d)
    for key in ("tokens", "bytes_per_token"):
        add("kv_pool", key, kb.get("kv_pool", key))
    for d in kb.topic("concurrency"):
        add("concurrency", d.key, d)
    for d in kb.topic("finding"):  # one rule's several findings (one a reading, a rank) each compared
        key = f"{d.rule} ({d.key[1]})" if isinstance(d.key, tuple) else d.rule
        out.append(F.Compared(evidence=attrs.evolve(_anchor(d), source=f"{side} {_anchor(d).source}"), side=side,
                              topic="finding", key=key, value=d.title))
    return out


def compare(rules: tuple[Rule, ...], before: Knowledge, after: Knowledge) -> Knowledge:
    """The diff `rules` run on both sides' compared facts: the `diff_*` conclusions."""
    kb = Knowledge(tuple(compared_facts("before", before) + compared_facts("after", after)))
    run(rules, kb)
    return kb
