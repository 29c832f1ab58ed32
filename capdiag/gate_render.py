"""A gate verdict → text, JSON, SARIF 2.1.0, JUnit XML, or GitHub workflow commands.

SARIF and JUnit are built as data and serialised by json / xml.etree, so everything that came
from a log is escaped by the serialiser; the text and the GitHub step summary use templates.
"""
from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from typing import Any

import attrs

from capdiag import __version__, ruledocs
from capdiag.gate import Verdict
from capdiag.printable import printable, printable_data
from capdiag.render import _env
from capdiag.rules import FINDINGS

GATE_FORMATS = ("text", "json", "sarif", "junit", "github")
SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
GITHUB_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"


def render_gate(verdict: Verdict, fmt: str) -> str:
    return {"text": _text, "json": _json, "sarif": _sarif, "junit": _junit, "github": _github}[fmt](_printable(verdict))


def summary_markdown(verdict: Verdict) -> str:
    return _env().get_template("gate_summary.md.j2").render(v=_printable(verdict))


def _printable(verdict: Verdict) -> Verdict:
    """The verdict with every string that came from the inputs made printable."""
    results = tuple(attrs.evolve(r, path=printable(r.path), report=printable_data(r.report),
                                 error=printable_data(r.error), findings=printable_data(r.findings))
                    for r in verdict.results)
    return attrs.evolve(verdict, results=results, stale=printable_data(verdict.stale))


def _text(verdict: Verdict) -> str:
    return _env().get_template("gate.txt.j2").render(v=verdict)


def _json(verdict: Verdict) -> str:
    doc = {"schema": "capdiag.gate/1", "verdict": verdict.status, "fail_on": verdict.fail_on,
           "suppressed": verdict.suppressed,
           "stale_baseline": list(verdict.stale),
           "logs": [{"path": r.path, "error": r.error,
                     "status": "error" if r.error else "fail" if any(f["failing"] for f in r.findings) else "pass",
                     "framework": r.report["framework"] if r.report else None,
                     "findings": [{k: f[k] for k in ("rule", "code", "severity", "title", "message", "action", "rank",
                                                      "fingerprint", "failing", "suppressed", "evidence")}
                                  for f in r.findings]} for r in verdict.results]}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _main_evidence(finding: dict[str, Any], log: str) -> list[dict[str, Any]]:
    """The finding's evidence lines in the log, its main line first (other inputs are not
    artifacts of the run)."""
    lines = [e for e in finding["evidence"] if e["source"] == "log" and e["line"] > 0]
    main = finding.get("main_evidence")
    if main and main["source"] == "log" and main["line"] > 0:
        lines.sort(key=lambda e: e["line"] != main["line"])
    return lines


def _sarif(verdict: Verdict) -> str:
    rules = [{"id": r.code, "name": r.name,
              "shortDescription": {"text": ruledocs.summary(r)},
              "fullDescription": {"text": ruledocs.sections(r).get("What it checks", "")},
              "help": {"text": ruledocs.one(r), "markdown": _rule_markdown(r)},
              "defaultConfiguration": {"level": SARIF_LEVEL[r.severity]},
              "properties": {"tags": ["capdiag", "gpu-memory"]}} for r in FINDINGS]
    index = {r.code: i for i, r in enumerate(FINDINGS)}
    results, artifacts = [], []
    for res in verdict.results:
        if res.report is None:
            continue
        artifacts.append({"location": {"uri": _uri(res.path)}})
        for f in res.findings:
            lines = _main_evidence(f, res.path)
            location = {"physicalLocation": {"artifactLocation": {"uri": _uri(res.path)},
                                             "region": {"startLine": lines[0]["line"]}}} if lines else \
                {"physicalLocation": {"artifactLocation": {"uri": _uri(res.path)}}}
            result = {"ruleId": f["code"], "ruleIndex": index[f["code"]], "level": SARIF_LEVEL[f["severity"]],
                      "message": {"text": f"{f['title']}. {f['message']} What to do: {f['action']}"},
                      "locations": [location],
                      "partialFingerprints": {"capdiagFindingHash/v1": f["fingerprint"]},
                      "properties": {"rank": f.get("rank"), "failing": f["failing"]}}
            if len(lines) > 0:
                result["relatedLocations"] = [
                    {"id": i, "physicalLocation": {"artifactLocation": {"uri": _uri(res.path)},
                                                   "region": {"startLine": e["line"], "snippet": {"text": e["text"]}}},
                     "message": {"text": e["kind"]}} for i, e in enumerate(lines)]
            if f["suppressed"]:
                result["suppressions"] = [{"kind": "external", "justification": "accepted in the capdiag baseline"}]
            results.append(result)
    doc = {"$schema": SARIF_SCHEMA, "version": "2.1.0",
           "runs": [{"tool": {"driver": {"name": "capdiag", "version": __version__, "rules": rules,
                                         "informationUri": "https://example.invalid/capdiag"}},
                     "artifacts": artifacts, "results": results}]}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _rule_markdown(r) -> str:
    s = ruledocs.sections(r)
    return "\n\n".join(f"**{name}.** {text}" for name, text in s.items())


def _uri(path: str) -> str:
    return path.replace(os.sep, "/")


def _junit(verdict: Verdict) -> str:
    suites = ET.Element("testsuites", name="capdiag gate")
    for res in verdict.results:
        suite = ET.SubElement(suites, "testsuite", name=res.path)
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        framework = res.report["framework"] if res.report else None
        given = set(res.report.get("inputs", [])) if res.report else set()
        for r in FINDINGS:
            case = ET.SubElement(suite, "testcase", classname=f"capdiag.{r.code}", name=f"{r.name} ({res.path})")
            counts["tests"] += 1
            if res.error:
                ET.SubElement(case, "error", message=res.error).text = res.error
                counts["errors"] += 1
                continue
            fired = [f for f in res.findings if f["rule"] == r.name and f["failing"]]
            if fired:
                f = fired[0]
                failure = ET.SubElement(case, "failure", message=f"{f['severity']}: {f['title']}", type=f["severity"])
                failure.text = _chain(fired)
                counts["failures"] += 1
            elif r.frameworks and framework not in r.frameworks:
                ET.SubElement(case, "skipped", message=f"applies to {', '.join(r.frameworks)} logs only")
                counts["skipped"] += 1
            elif [n for n in r.needs if n not in given]:
                missing = ", ".join(n for n in r.needs if n not in given)
                ET.SubElement(case, "skipped", message=f"insufficient evidence: needs {missing}")
                counts["skipped"] += 1
        for key, value in counts.items():
            suite.set(key, str(value))
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _chain(findings: list[dict]) -> str:
    lines = []
    for f in findings:
        lines += [f"{f['code']} {f['rule']}: {f['title']}", f"  {f['message']}", f"  what to do: {f['action']}"]
        lines += [f"  because {b['rule']} → {b['topic']}{'' if b['key'] is None else '.' + str(b['key'])} = "
                  f"{b['value'] if b['value'] is not None else 'unknown: ' + str(b['unknown'])}" for b in f["because"]]
        lines += [f"  {e['where']}: {e['text']}" for e in f["evidence"]]
    return "\n".join(lines)


def _escape_data(text: str) -> str:
    """As @actions/core escapes a command's message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """As @actions/core escapes a command's properties (file, line, title)."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _github(verdict: Verdict) -> str:
    out = []
    for res in verdict.results:
        if res.error:
            out.append(f"::error file={_escape_property(res.path)},title={_escape_property('capdiag: input error')}::"
                       f"{_escape_data(res.error)}")
            continue
        for f in res.findings:
            if f["suppressed"]:
                continue
            lines = _main_evidence(f, res.path)
            props = [f"file={_escape_property(res.path)}"]
            if lines:
                props.append(f"line={lines[0]['line']}")
            title = f"{f['code']} {f['title']}"
            props.append(f"title={_escape_property(title)}")
            out.append(f"::{GITHUB_LEVEL[f['severity']]} {','.join(props)}::"
                       f"{_escape_data(f['message'] + ' What to do: ' + f['action'])}")
    out.append(f"capdiag gate: {verdict.status} (fail-on {verdict.fail_on}; {len(verdict.failing)} failing finding(s), "
               f"{verdict.suppressed} accepted by the baseline)")
    return "\n".join(out) + "\n"
