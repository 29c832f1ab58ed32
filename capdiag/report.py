"""The report: a plain data object (dicts and lists; the per-rank rows a capdiag.rows.Rows, made
as they are read) built from an Analysis.

Its JSON serialisation is the public contract (docs/report-json.md); the text and markdown
templates read the same object. Nothing here decides anything a rule did not conclude.
"""
from __future__ import annotations

import fnmatch
from typing import Any, Optional

from capdiag import facts as F
from capdiag.analysis import Analysis
from capdiag.engine import Derived, Finding, Knowledge, Premise, Rule, Unknown, evidence_chain, primary_fact
from capdiag.observed import with_contract_keys
from capdiag.parsing import framework_of
from capdiag.rows import Rows
from capdiag.rules import DIFF, FINDING_RULES
from capdiag.rules.diff.driver import compare
from capdiag.rules.derive.stand_in import STAND_IN_KINDS
from capdiag.vocabulary import BREAKDOWN, CONFIG_KEYS, NESTED, SEGMENTS, SEVERITIES

SCHEMA = "capdiag.report/1"
DIFF_SCHEMA = "capdiag.diff/1"
MAX_UNREAD = 50  # lines not read, listed in the report (the first ones)
SEVERITY_ORDER = {s: -i for i, s in enumerate(SEVERITIES)}  # most severe first


def _value(d: Optional[Derived]) -> Any:
    return d.value if d is not None and d.known else None


def _reason(d: Optional[Derived]) -> Optional[str]:
    return d.value.reason if d is not None and isinstance(d.value, Unknown) else None


def where(e: F.Evidence) -> str:
    """`line 12` in the log, `nvidia-smi line 3`, `config.json`, or `input` (command line, references);
    a damaged line says how far it was read."""
    if e.line == F.INPUT_LINE:
        return "input" if e.source in ("input", "log") else e.source
    damage = f" (damaged: read up to column {e.read_to})" if e.read_to is not None else ""
    return (f"line {e.line}" if e.source == "log" else f"{e.source} line {e.line}") + damage


def evidence(d: Derived) -> list[dict[str, Any]]:
    rows = [{"line": f.evidence.line, "source": f.evidence.source, "where": where(f.evidence), "text": f.evidence.text,
             "kind": f.kind, "rank": f.rank.label if f.rank.tagged else None} for f in evidence_chain(d)]
    # a traffic line can be cited for several reasons (first, peak, last): once is enough
    traffic = ("TrafficSummary", "TrafficMark")
    return [row for i, row in enumerate(rows) if row["kind"] not in traffic or
            all((row["line"], row["source"]) != (r["line"], r["source"]) for r in rows[:i] if r["kind"] in traffic)]


def main_evidence(d: Derived) -> Optional[dict[str, Any]]:
    """The line a conclusion rests on first (engine.primary_fact)."""
    fact = primary_fact(d)
    if fact is None:
        return None
    e = fact.evidence
    return {"line": e.line, "source": e.source, "where": where(e), "text": e.text}


def because(d: Derived, ranks: dict[tuple, F.Rank]) -> list[dict[str, Any]]:
    """The derived premises of a conclusion, one level deep (their own chains are in `evidence`);
    a premise about one rank names it by its label."""
    return [{"rule": p.rule, "topic": p.topic, "key": p.key if not isinstance(p.key, tuple) else list(p.key),
             "rank": _premise_rank(p, ranks), "value": _premise_value(p), "unknown": _reason(p), "formula": p.formula}
            for p in d.premises if isinstance(p, Derived)]


def _premise_rank(p: Derived, ranks: dict[tuple, F.Rank]) -> Optional[str]:
    """The label of the rank a conclusion is about: the rank it names (a run-time summary's), or
    the rank its key is; None for a conclusion about no one rank."""
    rank = p.detail.get("rank")
    if isinstance(rank, F.Rank):
        return rank.label if rank.tagged else "TP0"
    return _label_of(p.key, ranks) if isinstance(p.key, tuple) and len(p.key) == 4 else None


def _premise_value(p: Derived) -> Any:
    """A premise's value; a run-time summary's without its series (the report's `runtime.series`
    holds it: a premise repeats the summary's figures, not its picture)."""
    value = _value(p)
    if p.topic == "runtime" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "series"}
    return value


def _tagged_ranks(facts: list[F.Fact]) -> dict[tuple, F.Rank]:
    """Each rank key's tags, from its first tagged line (looked up once, not per rank)."""
    tagged: dict[tuple, F.Rank] = {}
    for f in facts:
        if f.rank.tagged:
            tagged.setdefault(f.rank.key(), f.rank)
    return tagged


def _rank_tags(rank: tuple, ranks: dict[tuple, F.Rank]) -> dict[str, Any]:
    tagged = ranks.get(rank)
    if tagged is None:
        return {"tp": rank[2], "dp": None, "pp": None, "ep": None, "process": None}
    return {"tp": tagged.tp_index, "dp": tagged.dp, "pp": tagged.pp, "ep": tagged.ep, "process": tagged.worker}


def _label(tags: dict[str, Any]) -> str:
    parts = [f"{k.upper()}{tags[k]}" for k in ("dp", "pp", "tp", "ep") if tags.get(k) is not None]
    if tags.get("process"):
        parts.append(f"({tags['process']})")
    return " ".join(parts)


# Per-rank table columns: (heading, observed key or keys summed), per framework.
RANK_COLUMNS = {
    "sglang": (("free before weights", ("load_weight_begin_avail_gib",)), ("weights", ("weight_mem_usage_gib",)),
               ("free after weights", ("load_weight_end_avail_gib",)), ("KV", ("kv_size_gib",)),
               ("K+V", ("k_size_gib", "v_size_gib")), ("free after pools", ("memory_pool_end_avail_gib",)),
               ("graphs", ("cuda_graph_mem_usage_gib",)), ("free at end", ("available_gpu_mem_gib",))),
    "vllm": (("weights", ("model_loading_gib",)), ("KV available", ("available_kv_cache_gib",)),
             ("graphs", ("graph_capture_gib",)), ("activation peak", ("activation_peak_gib",)),
             ("non-torch", ("non_torch_memory_gib",)), ("total", ("total_gpu_memory_gib",)),
             ("KV tokens", ("kv_cache_tokens",))),
}


def build(a: Analysis) -> dict[str, Any]:
    kb = a.knowledge
    facts = list(a.launch.facts)
    tagged = _tagged_ranks(facts)
    total_d = kb.get("gpu", "total_gib")
    total = _value(total_d)
    ident = kb.get("gpu", "identity")
    device = kb.first(F.DeviceName, role=None)

    config = {key: _value(kb.get("config", key)) for key in CONFIG_KEYS}
    config_sources = {key: kb.get("config", key).formula for key in CONFIG_KEYS
                      if kb.get("config", key) is not None and kb.get("config", key).known}

    per_rank = kb.value("observed") or {}
    target = kb.value("target_rank")
    binding = kb.get("binding_rank")
    shown = [c for c in RANK_COLUMNS[a.framework] if any(_column(o, c[1]) is not None for o in per_rank.values())]
    def rank_row(rank: tuple) -> dict[str, Any]:
        tags = _rank_tags(rank, tagged)
        smi = kb.get("nvidia_smi", rank)
        segments = kb.value("rank_memory", rank) or {}
        return {"rank": tags, "label": _label(tags) or "TP0",
                "observed": with_contract_keys(per_rank[rank], a.framework),
                "segments": [{"category": c, "gib": segments[c]} for c in SEGMENTS if c in segments],
                "binding": binding is not None and binding.detail.get("rank") == rank,
                "target": rank == target,
                "columns": [_column(per_rank[rank], keys) for _, keys in shown],
                "nvidia_smi": None if smi is None else {k: smi.value[k] for k in
                                                        ("index", "used_mib", "free_mib", "total_mib")}}

    # made as each is read (capdiag.rows): 10,000 ranks' rows are never all held at once
    ranks = Rows(sorted(per_rank), rank_row)

    breakdown = []
    for category in BREAKDOWN:
        d = kb.get("breakdown", category)
        if d is None:
            continue
        gib = _value(d)
        breakdown.append({
            "category": category, "parent": NESTED[category][a.framework] if category in NESTED else None,
            "gib": gib,
            "mib": round(gib * 1024) if gib is not None else None,
            "percent": round(100 * gib / total, 1) if gib is not None and total else None,
            "status": d.detail.get("status", "unknown"),
            "derivation": d.formula if d.known else _reason(d),
            "rule": d.rule, "evidence": evidence(d)})

    concurrency = []
    for d in sorted(kb.topic("concurrency"), key=lambda d: d.key):
        concurrency.append({"request_tokens": d.key, "token_limit": d.detail.get("token_limit"),
                            "request_limit": d.detail.get("request_limit"), "max_concurrent": _value(d),
                            "binding": d.detail.get("binding"), "upper_bound": d.detail.get("upper_bound", False),
                            "per_dp_worker": d.detail.get("per_dp_worker", False),
                            **({"state_limit": d.detail["state_limit"]} if "state_limit" in d.detail else {}),
                            "longer_than_context": d.detail.get("longer_than_context", False),
                            "derivation": d.formula if d.known else f"{_reason(d)}; {d.formula}".strip("; ")})

    findings = []
    for d in sorted((d for d in kb.topic("finding") if isinstance(d, Finding)),
                    key=lambda d: (SEVERITY_ORDER[d.severity], d.rule)):
        proven = (a.remedies or {}).get(d.rule)
        # a finding the catalogue has changes for says the one its projection proved, or why none works
        action = (proven["remedies"][0]["text"] if proven and proven["remedies"] else
                  proven["no_remedy"] if proven and proven["no_remedy"] else d.action)
        findings.append({"rule": d.rule, "name": d.rule, "code": _rule_code(d.rule), "severity": d.severity,
                         "key": d.key[1] if isinstance(d.key, tuple) else None,
                         "title": d.title, "message": d.message, "action": action,
                         "remedies": proven["remedies"] if proven else [],
                         "no_remedy": proven["no_remedy"] if proven else None,
                         "rank": _label_of(target, tagged) if target is not None else None,
                         "main_evidence": main_evidence(d), "evidence": evidence(d), "because": because(d, tagged),
                         "detail": d.detail})

    fired = {f["rule"] for f in findings}
    not_judged = [{"rule": d.key, "code": _rule_code(d.key), "reason": d.value.reason, "evidence": evidence(d)}
                  for d in sorted(kb.topic("not_judged"), key=lambda d: _rule_code(d.key) or d.key)
                  if d.key not in fired]

    budget = kb.get("breakdown", "budget")
    check = kb.get("concurrency_check")
    kv_keys = [k for k in ("tokens", "bytes_per_token", "theoretical_bytes_per_token", "dtype", "budget_gib",
                           "headroom_gib") if kb.get("kv_pool", k)]
    theory = kb.get("kv_pool", "theoretical_bytes_per_token")
    comparison = kb.get("kv_pool", "comparison")
    spread = kb.get("nvidia_smi", "spread")
    ready = kb.value("phase") == "ready"
    last = a.launch.failure or max(facts, key=lambda f: f.evidence.line)
    summary = _summary(findings, ready, last, kb.get("failure"))
    return {
        "schema": SCHEMA,
        "framework": a.framework,
        "source": {"path": a.path, "lines": a.lines_read, "read_from": _read_from(facts),
                   "endpoints": [{"path": path, "status": status} for path, status in a.endpoints],
                   "launches": len(a.launches),
                   "analyzed_launch": a.launch.index, "first_line": a.launch.first_line,
                   "last_line": a.launch.last_line, "phase_reached": kb.value("phase"), "ready": ready,
                   "traffic_only": bool(kb.get("phase") and kb.get("phase").detail.get("traffic_only")),
                   "stopped_at": None if ready else {"line": last.evidence.line, "text": last.evidence.text},
                   "server_args": _server_args_note(kb.first(F.ServerArgs, role=None)),
                   "unread_lines": [{"line": f.evidence.line, "reason": f.reason}
                                    for f in kb.of(F.UnreadLine, role=None)][:MAX_UNREAD],
                   "all_launches": [{"launch": l.index, "first_line": l.first_line, "last_line": l.last_line,
                                     "phase_reached": l.phase,
                                     "failure": None if l.failure is None else {"line": l.failure.evidence.line,
                                                                                "text": l.failure.evidence.text},
                                     "ended_by": l.ended_by}
                                    for l in a.launches]},
        "inputs": sorted({name for f in kb.facts for kind, name in ((F.SmiGpu, "nvidia-smi"),
                                                                     (F.ModelConfig, "config.json"),
                                                                     (F.GpuTotal, "gpu"), (F.GpuSpec, "gpu"),
                                                                     (F.Policy, "policy")) if isinstance(f, kind)}),
        "config": config,
        "config_sources": config_sources,
        "gpu": {"alias": ident.value["alias"] if ident is not None and ident.known else None,
                "name": (ident.value["name"] if ident is not None and ident.known
                         else device.name if device else None),
                "identity": ident.formula if ident is not None and ident.known else _reason(ident),
                "ambiguous": bool(ident is not None and ident.known and ident.value["ambiguous"]),
                "shared_system_memory": bool(ident is not None and ident.known and ident.value["shared_system_memory"]),
                "total_gib": total,
                "total_source": (total_d.detail.get("source") if total_d is not None and total_d.known else None),
                "total_derivation": total_d.formula if total_d is not None and total_d.known else _reason(total_d)},
        "target_rank": _label_of(target, tagged) if target is not None else None,
        "observed": with_contract_keys(kb.value("target_observed") or {}, a.framework),
        "stand_ins": [{"kind": STAND_IN_KINDS[kind], "rank": d.detail.get("rank") if d.known else None,
                       "derivation": d.formula if d.known else _reason(d)}
                      for kind in STAND_IN_KINDS if (d := kb.get("stand_in", kind.__name__)) is not None],
        "worker_ranks": [{"process": d.key, "rank": d.value if d.known else None,
                          "derivation": d.formula if d.known else _reason(d)} for d in kb.topic("worker_ranks")],
        "ranks": ranks,
        "rank_columns": [heading for heading, _ in shown],
        "binding_rank": None if binding is None else {"label": binding.value, "derivation": binding.formula,
                                                      **{k: binding.detail[k] for k in ("gib", "spread_gib", "reading")}},
        "breakdown": breakdown,
        "budget": None if budget is None else {"gib": _value(budget),
                                               "derivation": budget.formula if budget.known else _reason(budget)},
        "kv_pool": {key: _value(kb.get("kv_pool", key)) for key in kv_keys}
        | {"log_bytes_per_token": _value(kb.get("kv_pool", "bytes_per_token")),
           "replication": theory.detail.get("replication") if theory is not None and theory.known else None,
           "comparison": _value(comparison),
           "derivation": {key: (kb.get("kv_pool", key).formula if kb.get("kv_pool", key).known
                                else _reason(kb.get("kv_pool", key))) for key in kv_keys}
           | ({"comparison": comparison.formula} if comparison is not None else {})},
        "nvidia_smi": None if not kb.of(F.SmiGpu, F.SmiMigDevice, F.SmiProcess, role=None) else {
            "gpus": len(kb.of(F.SmiGpu, role=None)), "spread": spread.formula if spread is not None else None,
            "mig_instances": len(kb.of(F.SmiMigDevice, role=None)),
            "processes": _value(kb.get("smi_processes", "all")) if kb.get("smi_processes", "all") else [],
            "processes_derivation": (kb.get("smi_processes", "all").formula
                                     if kb.get("smi_processes", "all") is not None else None),
            "note": "nvidia-smi was sampled at another time than the log's start-up lines; the server may have "
                    "served traffic since, so the figures are compared, not assumed equal"},
        "weights_check": None if kb.get("weights", "theoretical_gib") is None else {
            "theoretical_gib": _value(kb.get("weights", "theoretical_gib")),
            "ratio": kb.get("weights", "theoretical_gib").detail.get("ratio"),
            "derivation": (kb.get("weights", "theoretical_gib").formula if kb.get("weights", "theoretical_gib").known
                           else _reason(kb.get("weights", "theoretical_gib")))},
        "what_if": _what_if(kb.get("what_if")),
        "concurrency": concurrency,
        "concurrency_check": None if check is None else {**check.value, "derivation": check.formula},
        "findings": findings,
        "summary": summary,
        "not_judged": not_judged,
        "runtime": _runtime(kb),
        **_framework_evidence(facts, a.framework, [target, binding.detail.get("rank") if binding else None]),
    }


# framework_evidence lists the lines of at most this many ranks (the target and the binding
# rank first, then in rank order) and at most this many lines, in line order: enough to audit
# any rank's figures beside its neighbours', while 10,000 ranks' lines would be most of the
# report. What is left out is counted in framework_evidence_omitted.
EVIDENCE_RANKS = 64
EVIDENCE_LINES = 4096


def _framework_evidence(facts: list[F.Fact], framework: str, first: list[Optional[tuple]]) -> dict[str, Any]:
    own = [f for f in facts if framework_of(f) == framework]
    tagged = sorted({f.rank.key() for f in own if f.rank.tagged})
    shown = set(list(dict.fromkeys([k for k in first if k is not None] + tagged))[:EVIDENCE_RANKS])
    listed = [f for f in own if not f.rank.tagged or f.rank.key() in shown][:EVIDENCE_LINES]
    out: dict[str, Any] = {"framework_evidence": [{"line": f.evidence.line, "where": where(f.evidence), "kind": f.kind,
                                                   "rank": f.rank.label if f.rank.tagged else None,
                                                   "text": f.evidence.text} for f in listed]}
    if len(listed) < len(own):
        kept = {id(f) for f in listed}
        left = [f for f in own if id(f) not in kept]
        out["framework_evidence_omitted"] = {
            "lines": len(left), "ranks": len({f.rank.key() for f in left if f.rank.tagged}),
            "note": f"the lines of at most {EVIDENCE_RANKS} ranks (the target and the binding rank first) and at "
                    f"most {EVIDENCE_LINES} lines are listed; every line is still read, and each rank's figures "
                    "are under `ranks`"}
    return out


# The findings that say what stopped a start-up, most specific first.
def build_diff(before: Analysis, after: Analysis) -> dict[str, Any]:
    """`capdiag diff`'s report: the diff rules' conclusions on two analyses, each row with its
    evidence on both sides."""
    kb = compare(DIFF, before.knowledge, after.knowledge)

    def cited(d: Derived) -> list[dict[str, Any]]:
        """A change's lines: each side's value, then the configuration change that explains it —
        not every conclusion the rule was handed on its way."""
        values = [p for p in d.premises if isinstance(p, F.Compared) and p.key == d.key]
        cause = [p for p in d.premises if isinstance(p, Derived) and p.key == d.value.get("explained_by")]
        return [e for p in values + cause for e in evidence(p)] if values else evidence(d)

    def rows(topic):
        return [{"key": d.key, **d.value, "derivation": d.formula, "evidence": cited(d)} for d in kb.topic(topic)]

    return {"schema": DIFF_SCHEMA,
            "before": {"path": before.path, "framework": before.framework, "launch": before.launch.index},
            "after": {"path": after.path, "framework": after.framework, "launch": after.launch.index},
            "config": rows("diff_config"), "memory": rows("diff_memory"), "kv_pool": rows("diff_kv_pool"),
            "concurrency": rows("diff_concurrency"), "findings": rows("diff_finding")}


_STOPPERS = ("startup-failed", "out-of-memory", "utilization-too-high", "context-exceeds-kv", "weights-exceed-budget",
             "startup-incomplete")


def _answer(findings: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The finding that matters most (findings come most severe first; among equals a failure,
    then a capacity limit, then a tuning note: the catalogue's remedies make it one that asks for
    a change), with its proven remedy's figures."""
    asking = [f for f in findings if f["severity"] in ("error", "warning") or f["remedies"]]
    if not asking:
        return None
    top = asking[0]
    remedy = top["remedies"][0] if top["remedies"] else None
    return {"code": top["code"], "rule": top["rule"], "severity": top["severity"], "title": top["title"],
            "message": top["message"], "action": top["action"],
            "projected": remedy["projected"] if remedy else None, "changes": remedy["changes"] if remedy else None}


def _summary(findings: list[dict[str, Any]], ready: bool, last: F.Fact, failure=None) -> dict[str, Any]:
    """What the report opens with: how the start-up ended, the line that says why, the next
    step (and beside it, as the framework's own, the advice its error message gives), the
    finding that matters most with its proven remedy, and the headlines of the error and
    warning findings."""
    headlines = [{"severity": f["severity"], "code": f["code"], "title": f["title"]}
                 for f in findings if f["severity"] in ("error", "warning")][:6]
    answer = _answer(findings)
    stopper = next((f for name in _STOPPERS for f in findings if f["name"] == name
                    and (f["severity"] == "error" or name == "startup-incomplete")), None)
    if ready or stopper is None:
        return {"outcome": "ready" if ready else "stopped", "title": None, "message": None,
                "line": None if ready else {"line": last.evidence.line, "text": last.evidence.text},
                "next_step": None, "framework_says": None, "finding": None, "headlines": headlines, "answer": answer}
    failed = stopper["severity"] == "error"
    hint = failure.detail.get("framework_hint") if failed and failure is not None else None
    return {"outcome": "failed" if failed else "stopped", "title": stopper["title"], "message": stopper["message"],
            "line": stopper["main_evidence"] if failed else {"line": last.evidence.line, "text": last.evidence.text},
            "next_step": stopper["action"],
            "framework_says": hint,
            "finding": stopper["code"], "headlines": headlines,
            "answer": None if failed else answer}


def _read_from(facts: list[F.Fact]) -> str:
    """"endpoints" when every fact came from a running server's answers (capdiag probe), else "log"."""
    return "endpoints" if facts and all(f.evidence.line == F.INPUT_LINE and f.evidence.source not in ("log", "input")
                                        for f in facts) else "log"


def _runtime(kb) -> Optional[dict[str, Any]]:
    """The run-time section: all ranks' traffic lines together, then each rank's; None without any."""
    rows = kb.topic("runtime")
    if not rows:
        return None
    ranks = sorted((d for d in rows if d.key != "all"), key=lambda d: d.key)
    top = kb.get("runtime", "all") or ranks[0]
    return {**_runtime_entry(top), "ranks": [{"rank": d.detail["rank"].label if d.detail["rank"].tagged else "TP0",
                                              **_runtime_entry(d)} for d in ranks]}


def _runtime_entry(d: Derived) -> dict[str, Any]:
    return {**d.value, "derivation": d.formula,
            "sources": [{"line": f.evidence.line, "where": where(f.evidence), "text": f.evidence.text}
                        for f in d.detail["parts"]],
            "evidence": {name: {"line": m.evidence.line, "where": where(m.evidence), "text": m.evidence.text,
                                "value": m.value} for name, m in d.detail["marks"].items()}}


def _what_if(d: Optional[Derived]) -> Optional[dict[str, Any]]:
    if d is None:
        return None
    value = dict(d.value)
    value["derivation"] = d.detail.get("derivation", [])
    return value


def _column(observed: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """A per-rank table cell: the printed figure, or the sum of two (K + V) when both are printed."""
    values = [observed.get(k) for k in keys]
    if any(v is None for v in values):
        return None
    return values[0] if len(values) == 1 else round(sum(values), 2)


def _label_of(rank: tuple, ranks: dict[tuple, F.Rank]) -> str:
    return _label(_rank_tags(rank, ranks)) or "TP0"


def _server_args_note(args: Optional[F.ServerArgs]) -> Optional[dict[str, Any]]:
    if args is None:
        return None
    return {"line": args.evidence.line, "style": args.style, "fields": len(args.fields),
            "truncated_at": args.truncated_at, "elided": args.elided}


def _rule_code(name: str) -> Optional[str]:
    return next((r.code for r in FINDING_RULES if r.name == name), None)


def _shown(d: Derived) -> str:
    """A conclusion's value as the trace prints it: a finding by severity and title."""
    if isinstance(d, Finding):
        return f"[{d.severity.upper()}] {d.title}"
    return str(_value(d)) if d.known else f"unknown: {_reason(d)}"


def _premise(p: Premise) -> str:
    if isinstance(p, Derived):
        return f"{p.topic}{'' if p.key is None else f'.{p.key}'} = {_shown(p)}"
    return f"{p.kind} ({where(p.evidence)}): {p.evidence.text}"


def trace_rows(firings, rules=(), kb: Optional[Knowledge] = None, wanted: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The engine's firings as rows for the trace template: each with the inputs the rule was
    handed and the value it concluded; then, for each rule asked about (all when `wanted` is
    empty) that concluded nothing, what it needed and did not have."""
    chosen = [r for r in rules if rule_wanted(r, wanted)]
    names = {r.name for r in chosen} if wanted else None
    rows = []
    for n, firing in enumerate(firings, start=1):
        if (names is not None and firing.rule not in names) or firing.conclusion.topic == "not_judged":
            continue  # a rule that could not judge is listed with those that did not fire
        d = firing.conclusion
        rows.append({"n": n, "rule": firing.rule, "topic": d.topic, "key": d.key, "value": _shown(d),
                     "formula": d.formula, "premises": [_premise(p) for p in d.premises], "needs": None})
    judged = {f.rule for f in firings if f.conclusion.topic != "not_judged"}
    for r in chosen:
        if r.name in judged or kb is None:
            continue
        said = kb.get("not_judged", r.name)
        options = kb.first(F.Options, role=None)
        if r.frameworks and options is not None and options.framework not in r.frameworks:
            needs = [f"applies to {' and '.join(r.frameworks)} logs only"]
        else:
            needs = [said.value.reason] if said is not None else unmet_needs(r, kb)
        rows.append({"n": None, "rule": r.name, "needs": needs, "declared": bool(r.reads) or said is not None})
    return rows


def rule_wanted(r: Rule, wanted: tuple[str, ...]) -> bool:
    """Whether a rule matches one of `wanted`: its name, its code, or a shell pattern (`breakdown.*`)."""
    return not wanted or any(fnmatch.fnmatch(r.name, w.lower()) or fnmatch.fnmatch((r.code or "").lower(), w.lower())
                             for w in wanted)


def unmet_needs(r: Rule, kb: Knowledge) -> list[str]:
    """Why a rule that did not fire had nothing to judge, from what it declares it reads: the
    conclusions it needs that are missing or unknown, and — when the log holds none of the line
    kinds it reads — those kinds. Empty when everything it reads is there."""
    missing, kinds = [], []
    for read in r.reads:
        if isinstance(read, type):
            kinds.append(read)
            continue
        if read.endswith("?"):
            continue
        topic, _, key = read.partition(":")
        found = [d for d in kb.topic(topic) if not key or str(d.key) == key]
        if not found:
            missing.append("needs " + read.replace(":", "."))
        elif not any(d.known for d in found):
            missing.append(f"needs {read.replace(':', '.')} (unknown: {_reason(found[0])})")
    if kinds and not any(kb.of(kind, role=None) for kind in kinds):
        names = [k.__name__ for k in kinds]
        missing.append("no " + (", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0])
                       + " line in the log")
    return missing