"""capdiag as a CI gate: the same analysis as `explain` over one or more logs, one verdict.

A finding fails the gate when its severity is at or above the fail-on level and no baseline
entry accepts it. Baseline entries are matched by fingerprint — rule, finding key, rank and the
deployment's identity (framework, model, TP/PP/DP) — never by line numbers, so a log that
shifts by a line keeps its accepted findings. Exit codes: 0 pass, 1 fail, 2 input error.
"""
from __future__ import annotations

import hashlib
from typing import Any, Optional

import attrs

from capdiag.analysis import analyse
from capdiag.errors import InputError
from capdiag.policy import SEVERITIES
from capdiag.report import build
from capdiag.side_input import read_json

BASELINE_SCHEMA = "capdiag.baseline/1"
EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


def fingerprint(report: dict[str, Any], finding: dict[str, Any]) -> str:
    config = report["config"]
    identity = "|".join(str(x) for x in (finding["rule"], finding.get("key"), finding.get("rank"),
                                          report["framework"], config.get("model"), config.get("tp_size"),
                                          config.get("pp_size"), config.get("dp_size")))
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:20]


@attrs.frozen
class LogResult:
    path: str
    report: Optional[dict]
    error: Optional[str]
    findings: tuple  # each: the report's finding + fingerprint, failing, suppressed


@attrs.frozen
class Verdict:
    fail_on: str
    results: tuple[LogResult, ...]
    stale: tuple  # baseline entries no log matched
    suppressed: int

    @property
    def failing(self) -> list[tuple[LogResult, dict]]:
        return [(r, f) for r in self.results for f in r.findings if f["failing"]]

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
    data = read_json(path, "baseline")
    if not isinstance(data, dict) or data.get("schema") != BASELINE_SCHEMA or not isinstance(data.get("entries"), list):
        raise InputError(f"{path}: not a capdiag baseline (schema {BASELINE_SCHEMA} expected)")
    for number, entry in enumerate(data["entries"], start=1):
        if not isinstance(entry, dict) or not isinstance(entry.get("fingerprint"), str):
            raise InputError(f"{path}: baseline entry {number} is not an object with a fingerprint")
    return data["entries"]


def baseline_document(verdict: "Verdict") -> dict[str, Any]:
    """A baseline that accepts every finding of the verdict's logs."""
    entries = {}
    for result in verdict.results:
        for f in result.findings:
            entries[f["fingerprint"]] = {"fingerprint": f["fingerprint"], "rule": f["rule"], "code": f["code"],
                                         "rank": f.get("rank"), "model": result.report["config"].get("model"),
                                         "title": f["title"], "log": result.path}
    return {"schema": BASELINE_SCHEMA, "entries": sorted(entries.values(), key=lambda e: (e["rule"], e["fingerprint"]))}


def run(paths: list[str], *, fail_on: str, baseline: Optional[list[dict]] = None, **analysis: Any) -> Verdict:
    threshold = SEVERITIES.index(fail_on)
    accepted = {e.get("fingerprint") for e in baseline or []}
    matched: set[str] = set()
    results, suppressed = [], 0
    for path in paths:
        try:
            report = build(analyse(path, **analysis))
        except InputError as exc:
            results.append(LogResult(path, None, str(exc), ()))
            continue
        findings = []
        for f in report["findings"]:
            fp = fingerprint(report, f)
            accepted_here = fp in accepted
            matched |= {fp} if accepted_here else set()
            suppressed += accepted_here
            findings.append({**f, "fingerprint": fp, "suppressed": accepted_here,
                             "failing": not accepted_here and SEVERITIES.index(f["severity"]) >= threshold})
        results.append(LogResult(path, report, None, tuple(findings)))
    stale = tuple(e for e in baseline or [] if e.get("fingerprint") not in matched)
    return Verdict(fail_on, tuple(results), stale, suppressed)
