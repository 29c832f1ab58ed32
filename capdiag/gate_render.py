"""A gate verdict → text, JSON, SARIF 2.1.0, JUnit XML, GitHub workflow commands, or a GitLab
code quality report.

SARIF and JUnit are built as data and serialised by json / xml.etree, so everything that came
from a log is escaped by the serialiser; the text and the GitHub step summary use templates.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

import attrs

from capdiag import PROJECT_URL, __version__, ruledocs
from capdiag.gating import Verdict
from capdiag.printable import printable, printable_data
from capdiag.render import _env
from capdiag.rules import FINDINGS

GATE_FORMATS = ("text", "json", "sarif", "junit", "github", "gitlab")
SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
GITHUB_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}
# GitLab's code quality severities: info, minor, major, critical, blocker.
GITLAB_SEVERITY = {"error": "critical", "warning": "major", "info": "info"}
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"


def render_gate(verdict: Verdict, fmt: str, root: Optional[str] = None) -> str:
    """`root`: the repository root that SARIF, GitHub and GitLab paths are made relative to."""
    verdict = _printable(verdict)
    if fmt in ("sarif", "github", "gitlab"):
        return {"sarif": _sarif, "github": _github, "gitlab": _gitlab}[fmt](verdict, root)
    return {"text": _text, "json": _json, "junit": _junit}[fmt](verdict)


def summary_markdown(verdict: Verdict) -> str:
    return _env().get_template("gate_summary.md.j2").render(v=_printable(verdict))


def _printable(verdict: Verdict) -> Verdict:
    """The verdict with every string that came from the inputs made printable."""
    results = tuple(attrs.evolve(r, path=printable(r.path, lines=False), report=printable_data(r.report),
                                 error=printable_data(r.error), findings=printable_data(r.findings),
                                 identity=printable_data(r.identity), not_judged=printable_data(r.not_judged))
                    for r in verdict.results)
    return attrs.evolve(verdict, results=results, stale=printable_data(verdict.stale),
                        policy=printable_data(verdict.policy))


def _text(verdict: Verdict) -> str:
    return _env().get_template("gate.txt.j2").render(v=verdict)


def _json(verdict: Verdict) -> str:
    doc = {"schema": "capdiag.gate/1", "verdict": verdict.status, "fail_on": verdict.fail_on,
           "fail_on_unknown": verdict.fail_on_unknown, "policy": verdict.policy, "suppressed": verdict.suppressed,
           "stale_baseline": list(verdict.stale),
           "logs": [{"path": r.path, "error": r.error, "status": r.status,
                     "framework": r.report["framework"] if r.report else None,
                     "identity": r.identity or None,
                     "findings": [{k: f[k] for k in ("rule", "code", "severity", "title", "message", "action", "rank",
                                                      "fingerprint", "failing", "suppressed", "baseline", "evidence")}
                                  for f in r.findings],
                     "not_judged": [{k: n[k] for k in ("rule", "code", "reason", "failing")} for n in r.not_judged]}
                    for r in verdict.results]}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _main_evidence(finding: dict[str, Any], log: str) -> list[dict[str, Any]]:
    """The finding's evidence lines in the log, its main line first (other inputs are not
    artifacts of the run)."""
    lines = [e for e in finding["evidence"] if e["source"] == "log" and e["line"] > 0]
    main = finding.get("main_evidence")
    if main and main["source"] == "log" and main["line"] > 0:
        lines.sort(key=lambda e: e["line"] != main["line"])
    return lines


# Notifications the tool itself raises (not findings): a log it could not read, a rule that
# could not judge a log.
_INPUT_ERROR = ("An input could not be read or recognised; the log was not analysed.",
                "The file is missing, unreadable, empty, or neither an SGLang nor a vLLM start-up log. The gate "
                "exits 2: a gate that cannot read its input has not passed.")
_NOT_JUDGED = ("A rule could not judge a log: an input it needs is unknown.",
               "The message names the inputs that were missing and why. Such a rule has not passed; under the "
               "policy's fail-on-unknown it fails the gate.")
SARIF_NOTIFICATIONS = tuple({"id": code, "name": name, "shortDescription": {"text": short},
                             "fullDescription": {"text": f"{short} {full}"}, "help": {"text": full},
                             "helpUri": f"{PROJECT_URL}/blob/main/docs/ci-gate.md#{anchor}"}
                            for code, name, (short, full), anchor in (
                                ("CD001", "input-error", _INPUT_ERROR, "exit-codes"),
                                ("CD002", "not-judged", _NOT_JUDGED, "unknown-is-never-a-pass")))
SRCROOT = "SRCROOT"


def _sarif(verdict: Verdict, root: Optional[str] = None) -> str:
    rules = [{"id": r.code, "name": r.name,
              "shortDescription": {"text": ruledocs.summary(r)},
              "fullDescription": {"text": " ".join(ruledocs.sections(r).get(k, "")
                                                   for k in ("What it checks", "Why it matters")).strip()},
              "help": {"text": ruledocs.one(r), "markdown": _rule_markdown(r)},
              "helpUri": ruledocs.help_uri(r),
              "defaultConfiguration": {"level": SARIF_LEVEL[r.severity]},
              "properties": {"tags": ["capdiag", "gpu-memory", "reliability"]}} for r in FINDINGS]
    index = {r.code: i for i, r in enumerate(FINDINGS)}
    results, artifacts, notifications = [], [], []
    for res in verdict.results:
        where = _artifact(res.path, root)
        at = [{"physicalLocation": {"artifactLocation": where}}] if where else []
        if res.report is None:
            notifications.append({"descriptor": {"id": "CD001", "index": 0}, "level": "error",
                                  "message": {"text": res.error}, "locations": at})
            continue
        if where:
            artifacts.append({"location": where})
        for f in res.findings:
            lines = _main_evidence(f, res.path)
            result = {"ruleId": f["code"], "ruleIndex": index[f["code"]], "level": SARIF_LEVEL[f["severity"]],
                      "message": {"text": f"{f['title']}. {f['message']} What to do: {f['action']}"},
                      "locations": [{"physicalLocation": {"artifactLocation": where,
                                                          **({"region": {"startLine": lines[0]["line"],
                                                                         "snippet": {"text": lines[0]["text"]}}}
                                                             if lines else {})}}] if where else [],
                      "partialFingerprints": {"capdiagFindingHash/v2": f["fingerprint"]},
                      "properties": {"rank": f.get("rank"), "failing": f["failing"]}}
            if lines and where:
                result["relatedLocations"] = [
                    {"id": i, "physicalLocation": {"artifactLocation": where,
                                                   "region": {"startLine": e["line"], "snippet": {"text": e["text"]}}},
                     "message": {"text": e["kind"]}} for i, e in enumerate(lines)]
            if f["suppressed"]:
                result["suppressions"] = [{"kind": "external", "justification": "accepted in the capdiag baseline"}]
            results.append(result)
        for n in res.not_judged:
            rule_ref = {"id": n["code"], "index": index[n["code"]]}
            notifications.append({"descriptor": {"id": "CD002", "index": 1}, "associatedRule": rule_ref,
                                  "level": "error" if n["failing"] else "note",
                                  "message": {"text": f"{n['code']} {n['rule']} could not judge {res.path}: "
                                                      f"{n['reason']}"}, "locations": at})
            if n["failing"]:
                results.append({"ruleId": n["code"], "ruleIndex": index[n["code"]], "kind": "fail",
                                "level": SARIF_LEVEL[n["severity"]],
                                "message": {"text": f"{n['rule']} could not judge this log, and the policy fails on "
                                                    f"rules that cannot judge: {n['reason']}"},
                                "locations": at, "partialFingerprints": {"capdiagFindingHash/v2": n["fingerprint"]},
                                "properties": {"rank": None, "failing": True, "not_judged": True}})
    run: dict[str, Any] = {
        "tool": {"driver": {"name": "capdiag", "version": __version__, "semanticVersion": __version__,
                            "informationUri": PROJECT_URL, "rules": rules, "notifications": list(SARIF_NOTIFICATIONS)}},
        "invocations": [{"executionSuccessful": not verdict.errors, "toolExecutionNotifications": notifications}],
        "artifacts": artifacts, "results": results}
    if root is not None:
        run["originalUriBaseIds"] = {SRCROOT: {"uri": Path(os.path.abspath(root)).as_uri().rstrip("/") + "/"}}
    doc = {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _rule_markdown(r) -> str:
    s = ruledocs.sections(r)
    return "\n\n".join(f"**{name}.** {text}" for name, text in s.items())


def repo_path(path: str, root: Optional[str]) -> Optional[str]:
    """The log's path relative to the repository root, "/"-separated; None when it lies outside."""
    if root is None:
        return None
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    return None if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel.replace(os.sep, "/")


def _artifact(path: str, root: Optional[str]) -> Optional[dict[str, str]]:
    """A SARIF artifactLocation: relative to SRCROOT under the repository root, a relative
    reference for a relative path, a file: URI otherwise; None for standard input."""
    if path == "-":
        return None
    inside = repo_path(path, root)
    if inside is not None:
        return {"uri": quote(inside), "uriBaseId": SRCROOT}
    if os.path.isabs(path) or root is not None:
        return {"uri": Path(os.path.abspath(path)).as_uri()}
    return {"uri": quote(path.replace(os.sep, "/"))}


def _junit(verdict: Verdict) -> str:
    import xml.etree.ElementTree as ET  # only JUnit output needs it: kept out of every other run's start-up

    suites = ET.Element("testsuites", name="capdiag gate")
    for res in verdict.results:
        suite = ET.SubElement(suites, "testsuite", name=res.path)
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        framework = res.report["framework"] if res.report else None
        not_judged = {n["rule"]: n for n in res.not_judged}
        for r in FINDINGS:
            case = ET.SubElement(suite, "testcase", classname=f"capdiag.{r.code}", name=f"{r.name} ({res.path})")
            counts["tests"] += 1
            if res.error:
                ET.SubElement(case, "error", message=res.error).text = res.error
                counts["errors"] += 1
                continue
            fired = [f for f in res.findings if f["rule"] == r.name and f["failing"]]
            unjudged = not_judged.get(r.name)
            if fired:
                f = fired[0]
                failure = ET.SubElement(case, "failure", message=f"{f['severity']}: {f['title']}", type=f["severity"])
                failure.text = _chain(fired)
                counts["failures"] += 1
            elif unjudged is not None and unjudged["failing"]:
                ET.SubElement(case, "failure", message=f"could not judge (fail-on-unknown): {unjudged['reason']}",
                              type="unknown").text = unjudged["reason"]
                counts["failures"] += 1
            elif r.frameworks and framework not in r.frameworks:
                ET.SubElement(case, "skipped", message=f"applies to {', '.join(r.frameworks)} logs only")
                counts["skipped"] += 1
            elif unjudged is not None:
                ET.SubElement(case, "skipped", message=f"insufficient evidence: {unjudged['reason']}")
                counts["skipped"] += 1
            elif r.name in verdict.disabled:
                ET.SubElement(case, "skipped", message="disabled by the policy")
                counts["skipped"] += 1
        for key, value in counts.items():
            suite.set(key, str(value))
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _chain(findings: list[dict]) -> str:
    labels = _env().get_template("labels.j2").module  # premises worded as the reports word them
    lines = []
    for f in findings:
        lines += [f"{f['code']} {f['rule']}: {f['title']}", f"  {f['message']}", f"  what to do: {f['action']}"]
        lines += [f"  because {b['rule']} → {labels.premise_name(b)} = {labels.premise_value(b, 160)}"
                  for b in f["because"]]
        lines += [f"  {e['where']}: {e['text']}" for e in f["evidence"]]
    return "\n".join(lines)


def _escape_data(text: str) -> str:
    """As @actions/core escapes a command's message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """As @actions/core escapes a command's properties (file, line, title)."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _github(verdict: Verdict, root: Optional[str] = None) -> str:
    out = []
    for res in verdict.results:
        path = repo_path(res.path, root) or res.path
        if res.error:
            out.append(f"::error file={_escape_property(path)},title={_escape_property('capdiag: input error')}::"
                       f"{_escape_data(res.error)}")
            continue
        for f in res.findings:
            if f["suppressed"]:
                continue
            lines = _main_evidence(f, res.path)
            props = [f"file={_escape_property(path)}"]
            if lines:
                props.append(f"line={lines[0]['line']}")
            title = f"{f['code']} {f['title']}"
            props.append(f"title={_escape_property(title)}")
            out.append(f"::{GITHUB_LEVEL[f['severity']]} {','.join(props)}::"
                       f"{_escape_data(f['message'] + ' What to do: ' + f['action'])}")
        for n in res.not_judged:
            if n["failing"]:
                title = f"{n['code']} {n['rule']} could not judge (fail-on-unknown)"
                out.append(f"::error file={_escape_property(path)},title={_escape_property(title)}::"
                           f"{_escape_data(n['reason'])}")
        skipped = [n for n in res.not_judged if not n["failing"]]
        if skipped:
            title = f"capdiag: {len(skipped)} rule(s) skipped, insufficient evidence"
            out.append(f"::notice file={_escape_property(path)},title={_escape_property(title)}::"
                       + _escape_data("\n".join(f"{n['code']} {n['rule']}: {n['reason']}" for n in skipped)))
    out.append(f"capdiag gate: {verdict.status} (fail-on {verdict.fail_on}; {len(verdict.failing)} failing, "
               f"{verdict.suppressed} accepted by the baseline, {verdict.not_judged} rule(s) could not judge)")
    return "\n".join(out) + "\n"


def _gitlab(verdict: Verdict, root: Optional[str] = None) -> str:
    """GitLab's code quality report (a subset of Code Climate's issue format): one issue per
    finding the baseline does not accept and per rule that could not judge. GitLab requires a
    line: an issue that rests on no log line is placed on line 1. GitLab keeps one issue per
    fingerprint, so each is the finding's own (stable across logs of one deployment, for the
    baseline) together with the log's path: two restarts' logs keep both of their issues."""
    issues = []

    def issue_print(own: str, path: str) -> str:
        return hashlib.sha256(f"{own}|{path}".encode("utf-8")).hexdigest()[:20]
    for res in verdict.results:
        path = repo_path(res.path, root) or res.path
        if res.error:
            issues.append({"description": f"capdiag could not read the log: {res.error}",
                           "check_name": "CD001 input-error", "severity": "blocker", "type": "issue",
                           "categories": ["Bug Risk"],
                           "fingerprint": hashlib.sha256(f"input-error|{path}".encode("utf-8")).hexdigest()[:20],
                           "location": {"path": path, "lines": {"begin": 1}}})
            continue
        for f in res.findings:
            if f["suppressed"]:
                continue
            lines = _main_evidence(f, res.path)
            issues.append({"description": f"{f['code']} {f['title']}: {f['message']} What to do: {f['action']}",
                           "check_name": f"{f['code']} {f['rule']}", "severity": GITLAB_SEVERITY[f["severity"]],
                           "type": "issue", "categories": ["Performance"], "fingerprint": issue_print(f["fingerprint"], path),
                           "location": {"path": path, "lines": {"begin": lines[0]["line"] if lines else 1}}})
        for n in res.not_judged:
            issues.append({"description": f"{n['code']} {n['rule']} could not judge this log"
                                          f"{' (fail-on-unknown)' if n['failing'] else ''}: {n['reason']}",
                           "check_name": f"{n['code']} {n['rule']} (not judged)",
                           "severity": GITLAB_SEVERITY[n["severity"]] if n["failing"] else "info",
                           "type": "issue", "categories": ["Performance"], "fingerprint": issue_print(n["fingerprint"], path),
                           "location": {"path": path, "lines": {"begin": 1}}})
    return json.dumps(issues, indent=2, ensure_ascii=False) + "\n"
