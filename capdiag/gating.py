"""capdiag as a CI gate: the same analysis as `explain` over one or more logs, one verdict.

A finding fails the gate when its severity is at or above the fail-on level and no baseline
entry accepts it. Baseline entries are matched by fingerprint — rule, finding key, rank and the
deployment's identity (every identifying value the report states, plus `--deployment`) — never
by line numbers, so a log that shifts by a line keeps its accepted findings. A rule that could not judge a log (its inputs
are unknown) is never a pass: it is reported as not judged, with the reason, and fails the gate
under `fail-on-unknown` when its severity is at or above the fail-on level. A log that states
no identity at all is identified by its path instead, so two anonymous logs never share a
fingerprint by accident. Exit codes: 0 pass, 1 fail, 2 input error.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
from typing import Any, Optional

import attrs

from capdiag.analysis import analyse
from capdiag.errors import InputError
from capdiag.frozen import frozen
from capdiag.policy import SEVERITIES
from capdiag.report import build
from capdiag.rules import find_rule
from capdiag.side_input import read_json

BASELINE_SCHEMA = "capdiag.baseline/2"
# Version 1 fingerprinted only framework, model and TP/PP/DP: logs without server_args shared one.
OLD_BASELINE_SCHEMAS = ("capdiag.baseline/1",)
EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2
# The report's values that tell one deployment from another: (identity key, where in the report).
IDENTITY_KEYS = (("model", ("config", "model")), ("framework_version", ("config", "framework_version")),
                 ("tp_size", ("config", "tp_size")), ("pp_size", ("config", "pp_size")),
                 ("dp_size", ("config", "dp_size")), ("ep_size", ("config", "ep_size")),
                 ("quantization", ("config", "quantization")), ("gpu", ("gpu", "alias")),
                 ("gpu_name", ("gpu", "name")))


def identity(report: dict[str, Any], path: str, deployment: Optional[str] = None) -> dict[str, Any]:
    """What identifies the deployment a log comes from: the framework, every identifying value
    the report states, and the user's deployment name. A log that states none of them is
    identified by its path (normalised as given), and says so with `anonymous`."""
    found = {key: report[section][name] for key, (section, name) in IDENTITY_KEYS
             if report.get(section, {}).get(name) is not None}
    if deployment:
        found["deployment"] = deployment
    if not found:
        return {"framework": report["framework"], "log": log_name(path), "anonymous": True}
    return {"framework": report["framework"], **found}


def log_name(path: str) -> str:
    return "-" if path == "-" else os.path.normpath(path).replace(os.sep, "/")


def fingerprint(ident: dict[str, Any], finding: dict[str, Any]) -> str:
    """Rule, finding key, rank and the deployment's identity; absent values are left out, so a
    value a later capdiag learns to read changes only the fingerprints of logs that state it."""
    data = {"rule": finding["rule"], "key": finding.get("key"), "rank": finding.get("rank"), "identity": ident}
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


@frozen
class LogResult:
    path: str
    report: Optional[dict]
    error: Optional[str]
    findings: tuple  # each: the report's finding + fingerprint, failing, suppressed
    identity: dict = attrs.Factory(dict)
    not_judged: tuple = ()  # each: the report's not-judged rule + failing

    @property
    def anonymous(self) -> bool:
        return bool(self.identity.get("anonymous"))

    @property
    def status(self) -> str:
        return "error" if self.error else "fail" if any(f["failing"] for f in (*self.findings, *self.not_judged)) \
            else "pass"


@frozen
class Verdict:
    fail_on: str
    results: tuple[LogResult, ...]
    stale: tuple  # baseline entries no log matched
    suppressed: int
    fail_on_unknown: bool = False
    disabled: tuple = ()  # rules the policy turns off
    policy: Optional[str] = None  # the policy file read (given, or found from the working directory)

    @property
    def failing(self) -> list[tuple[LogResult, dict]]:
        """Failing findings and, under fail-on-unknown, failing rules that could not judge."""
        return [(r, f) for r in self.results for f in (*r.findings, *r.not_judged) if f["failing"]]

    @property
    def not_judged(self) -> int:
        return sum(len(r.not_judged) for r in self.results)

    @property
    def errors(self) -> list[LogResult]:
        return [r for r in self.results if r.error]

    @property
    def status(self) -> str:
        return "error" if self.errors else "fail" if self.failing else "pass"

    def exit_code(self, exit_zero: bool = False) -> int:
        if self.errors:
            return EXIT_ERROR
        return EXIT_FAIL if self.failing and not exit_zero else EXIT_PASS


def read_baseline(path: str) -> list[dict[str, Any]]:
    """The baseline's entries, each checked: a fingerprint, and where given a `reason` (text)
    and an `expires` date (YYYY-MM-DD), after which the entry accepts nothing."""
    data = read_json(path, "baseline")
    if isinstance(data, dict) and data.get("schema") in OLD_BASELINE_SCHEMAS:
        raise InputError(f"{path}: a {data['schema']} baseline, whose fingerprints could match unrelated "
                         "deployments; write it again with `capdiag baseline`")
    if not isinstance(data, dict) or data.get("schema") != BASELINE_SCHEMA or not isinstance(data.get("entries"), list):
        raise InputError(f"{path}: not a capdiag baseline (schema {BASELINE_SCHEMA} expected)")
    for number, entry in enumerate(data["entries"], start=1):
        if not isinstance(entry, dict) or not isinstance(entry.get("fingerprint"), str):
            raise InputError(f"{path}: baseline entry {number} is not an object with a fingerprint")
        if entry.get("reason") is not None and not isinstance(entry["reason"], str):
            raise InputError(f"{path}: baseline entry {number}: `reason` is text")
        if entry.get("expires") is not None:
            expiry(entry["expires"], f"{path}: baseline entry {number}: `expires`")
    return data["entries"]


def expiry(text: Any, what: str) -> datetime.date:
    """A baseline entry's `expires` as a date, or an InputError naming `what`."""
    if isinstance(text, str) and len(text) == 10:
        try:
            return datetime.date.fromisoformat(text)
        except ValueError:
            pass
    raise InputError(f"{what} {str(text)[:40]!r}: a date, YYYY-MM-DD")


def _measure(rule_name: str, finding: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The figure that says how bad a finding is (its rule's `worse`), when the finding has it."""
    r = find_rule(rule_name)
    if r is None or r.worse is None:
        return None
    value = (finding.get("detail") or {}).get(r.worse[0])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return {"key": r.worse[0], "value": value, "worse": r.worse[1]}


def _worse(accepted: Optional[dict], now: Optional[dict]) -> bool:
    """The finding's figure is worse than the one its baseline entry accepted, beyond the
    printed rounding (0.01)."""
    if not isinstance(accepted, dict) or now is None or accepted.get("key") != now["key"]:
        return False
    was = accepted.get("value")
    if isinstance(was, bool) or not isinstance(was, (int, float)):
        return False
    return now["value"] < was - 0.01 if now["worse"] == "lower" else now["value"] > was + 0.01


def baseline_document(verdict: "Verdict", reason: Optional[str] = None,
                      expires: Optional[str] = None) -> dict[str, Any]:
    """A baseline that accepts every finding of the verdict's logs as bad as they are now (each
    entry keeps the figure it accepted), each with the `reason` and `expires` given."""
    if expires is not None:
        expiry(expires, "--expires")
    entries = {}
    for result in verdict.results:
        for f in result.findings:
            entry = {"fingerprint": f["fingerprint"], "rule": f["rule"], "code": f["code"],
                     "key": f.get("key"), "rank": f.get("rank"), "identity": result.identity,
                     "title": f["title"], "log": log_name(result.path)}
            measure = _measure(f["rule"], f)
            entry.update({k: v for k, v in (("measure", measure), ("reason", reason), ("expires", expires))
                          if v is not None})
            entries[f["fingerprint"]] = entry
    return {"schema": BASELINE_SCHEMA, "entries": sorted(entries.values(), key=lambda e: (e["rule"], e["fingerprint"]))}


def _refusal(entry: dict[str, Any], finding: dict[str, Any], today: datetime.date) -> Optional[dict[str, Any]]:
    """Why a baseline entry that matches a finding does not accept it (expired, or the finding
    got worse than the entry accepted); None when it accepts it."""
    if entry.get("expires") is not None and expiry(entry["expires"], "baseline `expires`") < today:
        return {"status": "expired", "expires": entry["expires"], "reason": entry.get("reason")}
    now = _measure(finding["rule"], finding)
    if _worse(entry.get("measure"), now):
        return {"status": "worse", "key": now["key"], "accepted": entry["measure"]["value"], "now": now["value"],
                "reason": entry.get("reason")}
    return None


def _why_stale(entry: dict[str, Any], results: list["LogResult"]) -> str:
    """Why no finding matched a baseline entry: a log raises the same finding under another
    identity (the deployment name, version, GPU… changed: the differing parts named), or none
    raises it any more."""
    was = entry.get("identity") or {}
    for result in results:
        for f in result.findings:
            if (f["rule"], f.get("key"), f.get("rank")) == (entry.get("rule"), entry.get("key"), entry.get("rank")):
                changed = sorted(k for k in set(was) | set(result.identity) if was.get(k) != result.identity.get(k))
                if changed:
                    return (f"{log_name(result.path)} raises it under another identity: "
                            + ", ".join(f"{k} {was.get(k)!r} → {result.identity.get(k)!r}" for k in changed))
    return "no log raises it any more"


def _severity(rule_name: str, policy: Any) -> str:
    """A rule's severity as the policy sets it, else its default."""
    override = policy.rules.get(rule_name, {}).get("severity") if policy is not None else None
    return override or find_rule(rule_name).severity


def run(paths: list[str], *, fail_on: str, baseline: Optional[list[dict]] = None, deployment: Optional[str] = None,
        fail_on_unknown: bool = False, **analysis: Any) -> Verdict:
    threshold = SEVERITIES.index(fail_on)
    accepted = {e.get("fingerprint"): e for e in baseline or []}
    today = datetime.date.today()
    matched: set[str] = set()
    results, suppressed = [], 0
    for path in paths:
        try:
            report = build(analyse(path, **analysis))
        except InputError as exc:
            results.append(LogResult(path, None, str(exc), ()))
            continue
        ident = identity(report, path, deployment)
        findings = []
        for f in report["findings"]:
            fp = fingerprint(ident, f)
            entry = accepted.get(fp)
            refused = None if entry is None else _refusal(entry, f, today)
            accepted_here = entry is not None and refused is None
            matched |= {fp} if entry is not None else set()
            suppressed += accepted_here
            findings.append({**f, "fingerprint": fp, "suppressed": accepted_here, "baseline": refused,
                             "failing": not accepted_here and SEVERITIES.index(f["severity"]) >= threshold})
        unjudged = []
        for n in report["not_judged"]:
            severity = _severity(n["rule"], analysis.get("policy"))
            unjudged.append({**n, "severity": severity,
                             "fingerprint": fingerprint(ident, {"rule": n["rule"], "key": "not-judged"}),
                             "failing": fail_on_unknown and SEVERITIES.index(severity) >= threshold})
        results.append(LogResult(path, report, None, tuple(findings), ident, tuple(unjudged)))
    stale = tuple({**e, "why": _why_stale(e, results)} for e in baseline or [] if e.get("fingerprint") not in matched)
    policy = analysis.get("policy")
    disabled = tuple(name for name, entry in policy.rules.items() if entry.get("enabled") is False) if policy else ()
    source = policy.evidence.text.removeprefix("policy ") if policy else None
    return Verdict(fail_on, tuple(results), stale, suppressed, fail_on_unknown, disabled, source)
