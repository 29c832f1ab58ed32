"""capdiag as a CI gate: exit codes, policy validation, every output format, baselines."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from capdiag.errors import InputError
from capdiag.gate import fingerprint, read_baseline
from capdiag.policy import load_policy
from helpers import TESTS, fixture, run_entry

READY = fixture("single_gpu_ready.log")  # a healthy start-up: no failing finding at the default level
OOM = fixture("oom_capture.log")  # out-of-memory during capture: errors
EXAMPLE_POLICY = Path(__file__).resolve().parents[1] / "docs" / "capdiag.example.toml"


def gate(monkeypatch, capsys, *args):
    return run_entry(monkeypatch, capsys, "gate", *args)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# ---- exit codes -----------------------------------------------------------------------------

def test_pass_exits_0(monkeypatch, capsys):
    code, out, _ = gate(monkeypatch, capsys, READY)
    assert code == 0 and out.startswith("capdiag gate: PASS (fail-on warning; 0 failing finding(s))")


def test_fail_exits_1_and_names_the_findings(monkeypatch, capsys):
    code, out, _ = gate(monkeypatch, capsys, OOM)
    assert code == 1 and out.startswith("capdiag gate: FAIL")
    assert "FAIL  [error] CD102 out-of-memory" in out


def test_exit_zero_reports_without_failing(monkeypatch, capsys):
    code, out, _ = gate(monkeypatch, capsys, OOM, "--exit-zero")
    assert code == 0 and "FAIL  [error] CD102" in out


def test_fail_on_error_lets_warnings_pass(monkeypatch, capsys, tmp_path):
    log = fixture("excerpt_pool.log")  # ends mid start-up: startup-incomplete is a warning
    assert gate(monkeypatch, capsys, log)[0] == 1
    assert gate(monkeypatch, capsys, log, "--fail-on", "error")[0] == 0


def test_unreadable_log_exits_2_and_still_reports_the_others(monkeypatch, capsys, tmp_path):
    code, out, _ = gate(monkeypatch, capsys, str(tmp_path / "missing.log"), READY, "--format", "json")
    doc = json.loads(out)
    assert code == 2 and doc["verdict"] == "error"
    assert [log["status"] for log in doc["logs"]] == ["error", "pass"]
    assert doc["logs"][0]["error"].endswith("missing.log: no such file")


def test_several_logs_one_verdict(monkeypatch, capsys):
    code, out, _ = gate(monkeypatch, capsys, READY, OOM, "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == "fail"
    assert [(Path(log["path"]).name, log["status"]) for log in doc["logs"]] == [
        ("single_gpu_ready.log", "pass"), ("oom_capture.log", "fail")]


# ---- policy ---------------------------------------------------------------------------------

def test_example_policy_loads():
    policy = load_policy(str(EXAMPLE_POLICY))
    assert policy.fail_on == "warning"
    assert policy.rules["thin-headroom"] == {"thresholds": {"min_free_gib": 2.0}, "severity": "error"}
    assert policy.rules["fp8-kv-opportunity"] == {"thresholds": {}, "enabled": False}


@pytest.mark.parametrize("text, message", [
    ('[rules.no-such-rule]\nenabled = false\n', r":1: unknown rule 'no-such-rule'"),
    ('fail-on = "warning"\n\n[rules.thin-headroom]\nmin_free = 2.0\n', r":4: unknown key 'min_free' for rule thin-headroom"),
    ('[rules.thin-headroom]\nmin_free_gib = "two"\n', r":2: min_free_gib must be a number"),
    ('[rules.thin-headroom]\nenabled = "no"\n', r":2: enabled must be true or false"),
    ('[rules.thin-headroom]\nseverity = "fatal"\n', r":2: severity must be one of info, warning, error"),
    ('fail-on = "sometimes"\n', r":1: fail-on must be one of info, warning, error"),
    ('verbose = true\n', r":1: unknown key 'verbose'"),
    ('[rules.thin-headroom\n', r"not valid TOML"),
])
def test_policy_errors_name_the_line(tmp_path, text, message):
    with pytest.raises(InputError, match=message):
        load_policy(write(tmp_path, "capdiag.toml", text))


def test_bad_policy_exits_2_in_one_line(monkeypatch, capsys, tmp_path):
    policy = write(tmp_path, "capdiag.toml", '[rules.thin-headroom]\nmin_free = 2.0\n')
    code, out, err = gate(monkeypatch, capsys, READY, "--policy", policy)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "capdiag.toml:2:" in err


def test_policy_threshold_severity_and_disable(monkeypatch, capsys, tmp_path):
    # the healthy log keeps 12.4 GiB free: a 20 GiB floor as an error fails it; the rule by code works too
    policy = write(tmp_path, "capdiag.toml", '[rules.CD110]\nmin_free_gib = 20.0\nseverity = "error"\n')
    code, out, _ = gate(monkeypatch, capsys, READY, "--policy", policy, "--fail-on", "error")
    assert code == 1 and "FAIL  [error] CD110 thin-headroom" in out
    policy = write(tmp_path, "off.toml", '[rules.out-of-memory]\nenabled = false\n[rules.startup-incomplete]\n'
                                         'enabled = false\n[rules.thin-headroom]\nenabled = false\n')
    code, out, _ = gate(monkeypatch, capsys, OOM, "--policy", policy)
    assert code == 0 and "CD102" not in out


def test_policy_fail_on_and_flag_override(monkeypatch, capsys, tmp_path):
    policy = write(tmp_path, "capdiag.toml", 'fail-on = "info"\n')
    assert gate(monkeypatch, capsys, READY, "--policy", policy)[0] == 1  # an info finding now fails
    assert gate(monkeypatch, capsys, READY, "--policy", policy, "--fail-on", "error")[0] == 0


# ---- outputs --------------------------------------------------------------------------------

def sarif_schema():
    return json.loads((TESTS / "schemas" / "sarif-schema-2.1.0.json").read_text(encoding="utf-8"))


def test_sarif_is_valid_2_1_0_with_rules_locations_and_fingerprints(monkeypatch, capsys):
    code, out, _ = gate(monkeypatch, capsys, OOM, READY, "--format", "sarif")
    doc = json.loads(out)
    jsonschema.validate(doc, sarif_schema())
    run = doc["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert len(rules) == 27 and rules[1]["id"] == "CD102" and rules[1]["name"] == "out-of-memory"
    assert rules[1]["defaultConfiguration"]["level"] == "error" and "**What to do.**" in rules[1]["help"]["markdown"]
    oom = next(r for r in run["results"] if r["ruleId"] == "CD102")
    assert oom["level"] == "error"
    region = oom["locations"][0]["physicalLocation"]["region"]
    log_lines = Path(OOM).read_text(encoding="utf-8").splitlines()
    assert "out of memory" in log_lines[region["startLine"] - 1].lower()  # the main evidence line
    assert {r["physicalLocation"]["region"]["startLine"] for r in oom["relatedLocations"]} >= {region["startLine"]}
    assert set(oom["partialFingerprints"]) == {"capdiagFindingHash/v1"}


def test_fingerprints_do_not_depend_on_line_numbers(tmp_path):
    from capdiag.analysis import analyse
    from capdiag.report import build
    shifted = write(tmp_path, "shifted.log", "unrelated preamble\n\n" + Path(OOM).read_text(encoding="utf-8"))
    a, b = build(analyse(OOM)), build(analyse(shifted))
    lines = [[e["line"] for f in r["findings"] for e in f["evidence"]] for r in (a, b)]
    assert lines[1] == [n + 2 for n in lines[0]] and lines[0]
    assert [fingerprint(a, f) for f in a["findings"]] == [fingerprint(b, f) for f in b["findings"]]


def test_junit_parses_back_with_failure_skipped_and_error(monkeypatch, capsys, tmp_path):
    code, out, _ = gate(monkeypatch, capsys, OOM, str(tmp_path / "missing.log"), "--format", "junit")
    root = ET.fromstring(out.encode("utf-8"))
    suites = root.findall("testsuite")
    assert code == 2 and len(suites) == 2
    oom, missing = suites
    assert oom.get("tests") == "27" and int(oom.get("failures")) >= 2 and oom.get("errors") == "0"
    failure = oom.find("testcase[@classname='capdiag.CD102']/failure")
    assert failure.get("type") == "error" and "out of memory" in failure.text.lower() and "line " in failure.text
    skipped = oom.find("testcase[@classname='capdiag.CD106']/skipped")
    assert skipped.get("message") == "insufficient evidence: needs nvidia-smi"
    assert oom.find("testcase[@classname='capdiag.CD105']/skipped").get("message") == "applies to vllm logs only"
    assert missing.get("errors") == "27" and "no such file" in missing.find("testcase/error").get("message")


def test_github_commands_are_escaped_and_summary_appended(monkeypatch, capsys, tmp_path):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    weird = write(tmp_path, "a,b:c%.log", Path(OOM).read_text(encoding="utf-8"))
    code, out, _ = gate(monkeypatch, capsys, weird, "--format", "github")
    error = next(line for line in out.splitlines() if line.startswith("::error ") and "CD102" in line)
    assert "file=" + weird.replace("%", "%25").replace(":", "%3A").replace(",", "%2C") + "," in error
    assert ",line=" in error and "title=CD102 Out of memory during start-up (graph capture)" in error
    assert "\n" not in error and code == 1
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("## capdiag gate: FAIL") and "### CD102 `out-of-memory`" in text


# ---- baselines ------------------------------------------------------------------------------

def test_baseline_suppresses_known_findings_and_names_stale_ones(monkeypatch, capsys, tmp_path):
    baseline = str(tmp_path / "baseline.json")
    code, _, err = run_entry(monkeypatch, capsys, "baseline", OOM, "-o", baseline)
    entries = read_baseline(baseline)
    assert code == 0 and "baseline entries" in err and {e["rule"] for e in entries} >= {"out-of-memory"}
    code, out, _ = gate(monkeypatch, capsys, OOM, "--baseline", baseline, "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["verdict"] == "pass" and doc["suppressed"] == len(entries)
    assert all(f["suppressed"] and not f["failing"] for f in doc["logs"][0]["findings"])
    code, out, _ = gate(monkeypatch, capsys, READY, "--baseline", baseline)
    assert code == 0 and "Stale baseline entries" in out and "out-of-memory" in out


def test_bad_baseline_exits_2(monkeypatch, capsys, tmp_path):
    bad = write(tmp_path, "baseline.json", '{"entries": []}')
    code, _, err = gate(monkeypatch, capsys, READY, "--baseline", bad)
    assert code == 2 and "not a capdiag baseline" in err
