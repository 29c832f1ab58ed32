"""Per-rank `observed` values: each rank's figures exactly as the log prints them, under the
report keys of the JSON contract (shared spec: report-json.md). Filing, not computing: which
attribute of which line kind fills which key is what each fact class declares
(`Fact.OBSERVED`, gathered in capdiag.facts.kinds); the KV and graph lines, whose key depends
on which line of several is the main one, are filed here.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from capdiag import facts as F
from capdiag.engine import Derived, rule
from capdiag.rules.derive.kv_pool import main_kv_line
from capdiag.rules.derive.stand_in import STAND_IN_KINDS

_LAST_WINS = (F.OutOfMemory,)  # "the last such message of the launch"


def _kv(lines: list[F.KVCacheAllocated], budget) -> dict[str, Any]:
    main = main_kv_line(lines, budget) or next((f for f in lines if not f.va_upper_bound), None)
    if main is None:
        return {}
    return {"kv_tokens": main.tokens, "k_size_gib": main.k_gib, "v_size_gib": main.v_gib, "kv_size_gib": main.kv_gib}


def _graphs(ends: list[F.GraphCaptureEnd], role: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if role == "draft":
        usage = [e.mem_usage_gib for e in ends if e.mem_usage_gib is not None]
        if usage:
            out["cuda_graph_mem_usage_gib"] = round(sum(usage), 2)
        return out
    main = next((e for e in ends if e.graph in ("decode", "verify")), None)
    if main is not None:
        out["cuda_graph_mem_usage_gib"] = main.mem_usage_gib
        out["cuda_graph_end_avail_gib"] = main.avail_gib
    for kind in ("piecewise", "prefill"):
        end = next((e for e in ends if e.graph == kind), None)
        if end is not None:
            out[f"{kind}_cuda_graph_mem_usage_gib"] = end.mem_usage_gib
            out[f"{kind}_cuda_graph_end_avail_gib"] = end.avail_gib
    return out


def _get(fact: F.Fact, attr: str) -> Any:
    """An attribute, or `values.key` for a fact that keeps its figures in a mapping."""
    if attr.startswith("values."):
        return fact.values.get(attr[len("values."):])
    return getattr(fact, attr)


def owner(fact: F.Fact) -> tuple:
    """The rank a fact is filed under: an untagged OOM message belongs to the GPU it names."""
    if isinstance(fact, F.OutOfMemory) and not fact.rank.tagged and fact.gpu is not None:
        return (0, 0, fact.gpu, "")
    return fact.rank.key()


def file_by_rank(facts: Iterable[F.Fact]) -> dict[tuple, dict[str, Any]]:
    """Each rank's printed figures by observed key; the draft worker's under `draft_…`."""
    grouped: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for fact in facts:
        grouped[owner(fact)][fact.role].append(fact)
    result: dict[tuple, dict[str, Any]] = {}
    for rank, by_role in grouped.items():
        values: dict[str, Any] = {}
        for role in ("target", "draft"):
            items = by_role.get(role, [])
            prefix = "draft_" if role == "draft" else ""
            own: dict[str, Any] = {}
            for kind, attr, key in F.OBSERVED:
                found = [f for f in items if isinstance(f, kind) and _get(f, attr) is not None]
                if found and key not in own:
                    own[key] = _get(found[-1] if kind in _LAST_WINS else found[0], attr)
            budget = next((f for f in items if isinstance(f, F.TokenBudget)), None)
            own.update(_kv([f for f in items if isinstance(f, F.KVCacheAllocated)], budget))
            own.update(_graphs([f for f in items if isinstance(f, F.GraphCaptureEnd)], role))
            begin = next((f for f in items if isinstance(f, F.GraphCaptureBegin)
                          and f.graph in ("decode", "verify") and f.avail_gib is not None), None)
            if begin is not None:
                own["cuda_graph_begin_avail_gib"] = begin.avail_gib
            values.update({prefix + k: v for k, v in own.items() if v is not None})
        result[rank] = values
    return result


def _launch_facts(kb) -> list[F.Fact]:
    """The start-up's facts (the log's lines, or a running server's endpoints): not the other
    inputs' (command line, nvidia-smi, config.json, references), nor the traffic lines, which
    are the run-time section's."""
    return [f for f in kb.facts if not isinstance(f, F.INPUT_KINDS) and f.role != F.RUNTIME_ROLE]


@rule("observed.by-rank", reads=(F.Fact,), concludes=("observed",))
def by_rank(kb):
    """What it concludes: `observed`: each rank's figures exactly as its lines print them, under the
    report's `observed` keys (rank key → key → value).

    How: The first line of a kind on a rank fills the keys its fact class declares (`OBSERVED`;
    the last, for PyTorch's out-of-memory message, and an untagged one is the GPU's it names);
    the full-attention KV line and the decode graph capture fill the pool's and the graphs' keys;
    the draft worker's lines fill `draft_…` keys. Nothing is computed.

    Example: `[TP1] Load weight end. … avail mem=63.44 GB, mem usage=14.99 GB.` fills TP1's
    `load_weight_end_avail_gib` 63.44 and `weight_mem_usage_gib` 14.99."""
    facts = _launch_facts(kb)
    yield Derived("observed", None, file_by_rank(facts), "observed.by-rank", tuple(facts),
                  "the figures each rank's lines print")


@rule("observed.target", reads=(F.Fact, "observed", "target_rank", "stand_in?"), concludes=("target_observed",))
def target(kb):
    """What it concludes: `target_observed`: the target rank's printed figures, for the report's
    top-level `observed`.

    How: The target rank's `observed` figures and, for each kind of line it printed none of, the
    figures of the rank that stands in for it (the `stand_in` conclusions), key by key where the
    target has none.

    Example: a vLLM log whose `Model loading took 14.99 GiB` only a worker process printed gives
    the target's `model_loading_gib` 14.99 from that worker's line."""
    per_rank, rank = kb.value("observed") or {}, kb.value("target_rank")
    own = dict(per_rank.get(rank, {})) if rank is not None else {}
    facts = _launch_facts(kb)
    for kind in STAND_IN_KINDS:
        stand = kb.get("stand_in", kind.__name__)
        if stand is not None and stand.known:
            lines = [f for f in facts if isinstance(f, kind) and f.rank.key() == stand.value]
            for key, value in file_by_rank(lines).get(stand.value, {}).items():
                own.setdefault(key, value)
    yield Derived("target_observed", None, own, "observed.target", (), "the target rank's figures, with stand-ins")
