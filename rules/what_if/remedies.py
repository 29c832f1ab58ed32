"""Advice that is proven before it is given: every change the catalogue (references/remedies.toml)
offers for a finding is projected through the memory model — the `--what-if` re-run, every rule
again on the projection — and advised only when the projection clears the finding and raises
nothing at warning or above. The projected figures are the remedy's evidence; when no candidate
works, the catalogue's sentence says what it would take.

Gives {finding rule: {"remedies": [...], "no_remedy": text or None}} in the report contract's
shape (changes in `--what-if` keys, projected, clears, introduces, text).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from capdiag import facts as F
from capdiag.engine import Finding, Knowledge, Rule, run
from capdiag.frozen import frozen
from capdiag.resources import reference_toml
from capdiag.rules._common import is_vllm, sizing_length
from capdiag.rules.what_if import counterfactual
from capdiag.vocabulary import MAX_FRACTION, SEVERITIES

# change → (SGLang's what-if key and flag, vLLM's)
SETTINGS = {"fraction": (("mem_fraction_static", "--mem-fraction-static"),
                         ("gpu_memory_utilization", "--gpu-memory-utilization")),
            "context": (("context_len", "--context-length"), ("max_model_len", "--max-model-len")),
            "requests": (("max_running_requests", "--max-running-requests"), ("max_num_seqs", "--max-num-seqs")),
            "kv_cache_dtype": (("kv_cache_dtype", "--kv-cache-dtype"), ("kv_cache_dtype", "--kv-cache-dtype")),
            "tp_size": (("tp_size", "--tp-size"), ("tp_size", "--tensor-parallel-size"))}
FP8 = {"sglang": "fp8_e4m3", "vllm": "fp8"}
# hundredths first (the least change), then twentieths up to the bound
STEPS = tuple(round(0.01 * i, 2) for i in range(1, 10)) + tuple(round(0.05 * i, 2) for i in range(2, 19))
SERIOUS = ("warning", "error")


def _mamba_limit(kb: Knowledge) -> bool:
    """The request limit is the one SGLang's Mamba state slots set (slots // 3, give or take its
    extra tracking slots): raising it takes memory from the KV pool, not from a cap."""
    mamba = kb.first(F.MambaCacheAllocated, role=None)
    limit = kb.value("config", "max_running_requests")
    return mamba is not None and isinstance(limit, int) and bool(mamba.max_cache_size) \
        and limit <= mamba.max_cache_size // 2


def _kv_fp8(kb: Knowledge) -> bool:
    return any("fp8" in str(kb.value(topic, key) or "").lower()
               for topic, key in (("kv_pool", "dtype"), ("config", "kv_cache_dtype")))


def _weights_fill(kb: Knowledge) -> bool:
    weights, total = kb.value("breakdown", "weights"), kb.value("gpu", "total_gib")
    return isinstance(weights, (int, float)) and isinstance(total, (int, float)) and weights >= MAX_FRACTION * total


UNLESS: dict[str, Callable[[Knowledge], bool]] = {
    "pool_fixed": lambda kb: kb.get("pool_cap") is not None,
    "kv_fp8": _kv_fp8,
    "limit_set_by_mamba_slots": _mamba_limit,
    "no_model_config": lambda kb: kb.first(F.ModelConfig, role=None) is None,
    "weights_fill_the_gpu": _weights_fill,
    # a rollout server colocated with training: memory past its budget is the trainer's
    "gpu_shared_with_trainer": lambda kb: kb.value("config", "sleep_mode") is True,
}


def _values(kb: Knowledge, candidate: dict[str, Any], key: str) -> list[Any]:
    """The values to try, nearest the current setting first."""
    kind = candidate["values"]
    current = kb.value("config", "max_running_requests" if key == "max_num_seqs" else key)
    if kind in ("raise", "lower"):
        if not isinstance(current, float) or not 0 < current < 1:
            return []
        sign = 1 if kind == "raise" else -1
        return [v for v in (round(current + sign * s, 2) for s in STEPS) if 0 < v <= MAX_FRACTION and v != current]
    if kind == "pool_fit":
        tokens = kb.value("kv_pool", "tokens")
        want = int(candidate.get("want", 1))
        if not isinstance(tokens, int) or not isinstance(current, int):
            return []
        fit = tokens // want // 1024 * 1024
        return [fit] if 0 < fit < current else []  # (a context of 0 is no context to lower)
    if kind == "token_limit":
        row = kb.get("concurrency", sizing_length(kb))
        limit = row.detail.get("token_limit") if row is not None and row.known else None
        return [limit] if isinstance(limit, int) and isinstance(current, int) and limit > current else []
    if kind == "fp8":
        return [FP8["vllm" if is_vllm(kb) else "sglang"]]
    if kind == "model_dtype":
        return ["auto"]
    if kind == "double":
        return [current * 2] if isinstance(current, int) else []
    raise ValueError(f"remedies.toml: unknown values rule {kind!r}")


@frozen
class Trial:
    """What one projected change did: the findings that went and came (those that came, or grew, to
    warning or above), each remaining finding's message, and the projected figures."""
    disappear: frozenset
    introduces: tuple[str, ...]
    messages: dict
    figures: dict


def _project(kb: Knowledge, rules: tuple[Rule, ...], changes: dict[str, Any], length: int) -> Optional[Trial]:
    """The changes projected (the what-if rules on the start-up's own conclusions) and every rule
    re-run on the projection; None when nothing could be projected. Only the outcome is kept: a
    re-run's knowledge is as large as the start-up's."""
    request = F.WhatIf(evidence=F.Evidence(F.INPUT_LINE, "remedy " + " ".join(f"{k}={v}" for k, v in changes.items()),
                                           0, "input"), changes=changes)
    trial = Knowledge(kb.facts + (request,), dict(kb.derived))  # the start-up's own conclusions stand
    run(rules, trial)
    counterfactual.compare(trial, rules)
    projection = trial.get("what_if")
    if projection is None or not projection.known or projection.value.get("not_projected") \
            or "then" not in projection.detail:
        return None
    then = projection.detail["then"]
    findings = [d for d in then.topic("finding") if isinstance(d, Finding)]
    appear = set(projection.value["findings_appear"])
    # a finding the change makes worse is as new as one it raises (a pool halved below one request
    # of max_model_len turns context-exceeds-kv from a note into a warning: vLLM would refuse)
    before = {d.rule: SEVERITIES.index(d.severity) for d in kb.topic("finding") if isinstance(d, Finding)}
    appear |= {d.rule for d in findings if d.rule in before and SEVERITIES.index(d.severity) > before[d.rule]}
    context = then.value("config", "context_len") or then.value("config", "max_model_len")
    # requests longer than the projected context are refused, not queued: no concurrency to claim
    row = then.get("concurrency", length) if not (isinstance(context, int) and 0 < context < length) else None
    return Trial(frozenset(projection.value["findings_disappear"]),
                 tuple(sorted({d.rule for d in findings if d.rule in appear and d.severity in SERIOUS})),
                 {d.rule: d.message for d in findings},
                 {"kv_tokens": then.value("kv_pool", "tokens"), "kv_cache_gib": then.value("breakdown", "kv_cache"),
                  "free_gib": then.value("breakdown", "free"),
                  "max_concurrent": row.value if row is not None and row.known else None})


def _fmt(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "unknown" if value is None \
        else str(value)


def propose(kb: Knowledge, rules: tuple[Rule, ...]) -> dict[str, dict[str, Any]]:
    """The proven remedies of every finding the catalogue has candidates for."""
    catalogue = reference_toml("remedies.toml")
    findings = [d for d in kb.topic("finding") if isinstance(d, Finding)]
    out: dict[str, dict[str, Any]] = {}
    vllm = is_vllm(kb)
    length = sizing_length(kb)
    tried: dict[tuple, Optional[Trial]] = {}
    for finding in findings:
        candidates = [c for c in catalogue["candidate"] if finding.rule in c["findings"]]
        if not candidates:
            continue
        remedies, judged = [], False
        for candidate in candidates:
            if any(UNLESS[name](kb) for name in candidate.get("unless", ())):
                continue
            key, flag = SETTINGS[candidate["change"]][1 if vllm else 0]
            for value in _values(kb, candidate, key):
                changes = {key: value}
                signature = tuple(changes.items())
                if signature not in tried:
                    tried[signature] = _project(kb, rules, changes, length)
                trial = tried[signature]
                if trial is None:
                    continue
                # a projection that leaves the finding word for word did not reach what it judges
                # (an error line, traffic measured at run time): it proves nothing either way
                judged = judged or finding.rule in trial.disappear or trial.messages.get(finding.rule) != finding.message
                if finding.rule not in trial.disappear or trial.introduces:
                    continue
                figures = trial.figures
                fit = figures["kv_tokens"] // value if candidate["values"] == "pool_fit" and figures["kv_tokens"] \
                    else None
                free = figures["free_gib"]
                text = candidate["text"].format(flag=flag, value=_fmt(value), fit=_fmt(fit),
                                                kv_tokens=_fmt(figures["kv_tokens"]),
                                                concurrent=_fmt(figures["max_concurrent"]), length=_fmt(length),
                                                free=f", {free} GiB still free after capture" if free is not None
                                                else "")
                remedies.append({"id": candidate["id"], "changes": changes, "text": text,
                                 "projected": {"fits": True, **figures, "request_tokens": length},
                                 "clears": sorted(trial.disappear), "introduces": []})
                break  # the smallest change of this kind that works
        # nothing judged (the log lacks what the projection needs, or the finding rests on what no
        # projection changes): no claim either way, and the rule's own advice stands, unproven
        if remedies or judged:
            out[finding.rule] = {"remedies": remedies,
                                 "no_remedy": None if remedies else catalogue["no_remedy"].get(finding.rule)}
    return out
