"""capdiag as a CI gate: exit codes, policy validation, every output format, baselines."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from capdiag.errors import InputError
from capdiag.rules import FINDINGS
from capdiag.gating import fingerprint, identity, read_baseline
from capdiag.policy import load_policy
from helpers import SHARED, TESTS, fixture, needs_shared, run_entry

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
    assert code == 0 and out.startswith("capdiag gate: PASS (fail-on warning; 0 failing, 2 rule(s) could not judge)")


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
                                         'enabled = false\n[rules.thin-headroom]\nenabled = false\n[rules.startup-failed]\nenabled = false\n')
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
    assert len(rules) == len(FINDINGS) and rules[1]["id"] == "CD102" and rules[1]["name"] == "out-of-memory"
    assert rules[1]["defaultConfiguration"]["level"] == "error" and "**What to do.**" in rules[1]["help"]["markdown"]
    oom = next(r for r in run["results"] if r["ruleId"] == "CD102")
    assert oom["level"] == "error"
    region = oom["locations"][0]["physicalLocation"]["region"]
    log_lines = Path(OOM).read_text(encoding="utf-8").splitlines()
    assert "out of memory" in log_lines[region["startLine"] - 1].lower()  # the main evidence line
    assert {r["physicalLocation"]["region"]["startLine"] for r in oom["relatedLocations"]} >= {region["startLine"]}
    assert set(oom["partialFingerprints"]) == {"capdiagFindingHash/v2"}


def test_sarif_is_ready_for_code_scanning(monkeypatch, capsys, tmp_path):
    from capdiag import PROJECT_URL, __version__
    code, out, _ = gate(monkeypatch, capsys, OOM, str(tmp_path / "missing.log"), "--format", "sarif")
    doc = json.loads(out)
    jsonschema.validate(doc, sarif_schema())
    run = doc["runs"][0]
    driver = run["tool"]["driver"]
    assert code == 2 and driver["informationUri"] == PROJECT_URL == "https://github.com/capdiag/capdiag"
    assert driver["semanticVersion"] == __version__
    headings = {line[3:].strip() for line in (TESTS.parent / "docs" / "rules.md").read_text(encoding="utf-8")
                .splitlines() if line.startswith("## ")}
    for rule in driver["rules"]:
        anchor = rule["helpUri"].split("#")[1]
        assert rule["helpUri"] == f"{PROJECT_URL}/blob/main/docs/rules.md#{anchor}"
        assert anchor == f"{rule['id'].lower()}-{rule['name']}" and f"{rule['id']} {rule['name']}" in headings
        assert "Why it matters" not in rule["fullDescription"]["text"] and len(rule["fullDescription"]["text"]) > \
            len(rule["shortDescription"]["text"])
    assert "security-severity" not in json.dumps(driver)  # these are not vulnerabilities
    invocation = run["invocations"][0]
    assert invocation["executionSuccessful"] is False
    errors = [n for n in invocation["toolExecutionNotifications"] if n["descriptor"]["id"] == "CD001"]
    assert len(errors) == 1 and errors[0]["level"] == "error" and "no such file" in errors[0]["message"]["text"]
    skipped = {n["associatedRule"]["id"]: n for n in invocation["toolExecutionNotifications"]
               if n["descriptor"]["id"] == "CD002"}
    assert skipped["CD106"]["level"] == "note" and "give --nvidia-smi-file" in skipped["CD106"]["message"]["text"]
    assert driver["rules"][skipped["CD106"]["associatedRule"]["index"]]["id"] == "CD106"
    assert {d["id"] for d in driver["notifications"]} == {"CD001", "CD002"}


def test_sarif_paths_are_relative_to_the_repository_root(monkeypatch, capsys, tmp_path):
    repo = tmp_path / "repo"
    (repo / "logs").mkdir(parents=True)
    inside = write(repo / "logs", "canary one.log", Path(OOM).read_text(encoding="utf-8"))
    outside = write(tmp_path, "elsewhere.log", Path(READY).read_text(encoding="utf-8"))
    doc = json.loads(gate(monkeypatch, capsys, inside, outside, "--format", "sarif", "--repo-root", str(repo))[1])
    jsonschema.validate(doc, sarif_schema())
    run = doc["runs"][0]
    assert run["originalUriBaseIds"] == {"SRCROOT": {"uri": repo.as_uri() + "/"}}
    locations = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]: r["locations"][0]
                 for r in run["results"]}
    assert set(locations) == {"logs/canary%20one.log", Path(outside).as_uri()}
    assert locations["logs/canary%20one.log"]["physicalLocation"]["artifactLocation"]["uriBaseId"] == "SRCROOT"
    main = next(r for r in run["results"] if r["ruleId"] == "CD102")["locations"][0]["physicalLocation"]["region"]
    assert "out of memory" in main["snippet"]["text"].lower()
    # --sarif-root is the same option; GitHub annotations name the file as the repository does
    out = gate(monkeypatch, capsys, inside, "--format", "github", "--sarif-root", str(repo))[1]
    assert "::error file=logs/canary one.log,line=" in out


def test_sarif_fail_on_unknown_is_a_result(monkeypatch, capsys, tmp_path):
    policy = write(tmp_path, "capdiag.toml", 'fail-on-unknown = true\n')
    doc = json.loads(gate(monkeypatch, capsys, WEIGHTS_ONLY, "--policy", policy, "--format", "sarif")[1])
    jsonschema.validate(doc, sarif_schema())
    unknown = next(r for r in doc["runs"][0]["results"] if r["ruleId"] == "CD110")
    assert unknown["kind"] == "fail" and unknown["level"] == "warning" and unknown["properties"]["not_judged"]
    assert "could not judge" in unknown["message"]["text"]


@needs_shared
def test_sarif_of_every_corpus_log_passes_the_schema(monkeypatch, capsys):
    logs = sorted(str(p) for d in ("sglang", "vllm") for p in (SHARED / "corpus" / d).glob("*.log"))
    code, out, _ = gate(monkeypatch, capsys, *logs, "--format", "sarif", "--repo-root", str(SHARED))
    doc = json.loads(out)
    jsonschema.validate(doc, sarif_schema())
    run = doc["runs"][0]
    assert len(run["artifacts"]) == len(logs) and code in (0, 1)
    assert run["invocations"][0]["executionSuccessful"] is True
    assert all(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].startswith("corpus/")
               for r in run["results"])


def test_fingerprints_do_not_depend_on_line_numbers(tmp_path):
    from capdiag.analysis import analyse
    from capdiag.report import build
    shifted = write(tmp_path, "shifted.log", "unrelated preamble\n\n" + Path(OOM).read_text(encoding="utf-8"))
    a, b = build(analyse(OOM)), build(analyse(shifted))
    lines = [[e["line"] for f in r["findings"] for e in f["evidence"] if e["source"] == "log"] for r in (a, b)]
    assert lines[1] == [n + 2 for n in lines[0]] and lines[0]
    # the same log name (as CI writes it again) with the lines shifted: the same fingerprints
    ids = identity(a, "canary.log"), identity(b, "canary.log")
    assert [fingerprint(ids[0], f) for f in a["findings"]] == [fingerprint(ids[1], f) for f in b["findings"]]


def test_junit_parses_back_with_failure_skipped_and_error(monkeypatch, capsys, tmp_path):
    code, out, _ = gate(monkeypatch, capsys, OOM, str(tmp_path / "missing.log"), "--format", "junit")
    root = ET.fromstring(out.encode("utf-8"))
    suites = root.findall("testsuite")
    assert code == 2 and len(suites) == 2
    oom, missing = suites
    assert oom.get("tests") == str(len(FINDINGS)) and int(oom.get("failures")) >= 2 and oom.get("errors") == "0"
    failure = oom.find("testcase[@classname='capdiag.CD102']/failure")
    assert failure.get("type") == "error" and "out of memory" in failure.text.lower() and "line " in failure.text
    skipped = oom.find("testcase[@classname='capdiag.CD106']/skipped")
    assert skipped.get("message") == ("insufficient evidence: needs the memory no log line explains (`other`) "
                                      "(needs the GPU's measured used memory: give --nvidia-smi-file)")
    assert oom.find("testcase[@classname='capdiag.CD105']/skipped").get("message") == "applies to vllm logs only"
    assert missing.get("errors") == str(len(FINDINGS)) and "no such file" in missing.find("testcase/error").get("message")


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


# ---- deployment identity ----------------------------------------------------------------------

ANON_TP2 = fixture("anon_graph_oom_tp2.log")  # OOM in piecewise capture on two ranks, no identifying line
ANON_TP4 = fixture("anon_graph_crash_tp4.log")  # a crash in graph capture on four ranks, no identifying line


def test_a_baseline_of_one_anonymous_log_does_not_accept_another(monkeypatch, capsys, tmp_path):
    # both crash in CUDA graph capture (startup-failed, error) and state no model, TP, GPU, …
    baseline = str(tmp_path / "baseline.json")
    assert run_entry(monkeypatch, capsys, "baseline", ANON_TP2, "-o", baseline)[0] == 0
    code, out, _ = gate(monkeypatch, capsys, ANON_TP4, "--baseline", baseline)
    assert code == 1 and out.startswith("capdiag gate: FAIL")
    assert "FAIL  [error] CD125 startup-failed: The installed build has no GPU kernels for this GPU's architecture" in out
    assert "accepted" not in out.split("Stale")[0] and "no deployment identity" in out
    # the same anonymous log, gated again under the same path, is still accepted
    code, out, _ = gate(monkeypatch, capsys, ANON_TP2, "--baseline", baseline)
    assert code == 0 and "accepted by the baseline" in out


def test_anonymous_entries_match_only_the_same_log_path(monkeypatch, capsys, tmp_path):
    baseline = str(tmp_path / "baseline.json")
    run_entry(monkeypatch, capsys, "baseline", ANON_TP2, "-o", baseline)
    entry = read_baseline(baseline)[0]
    assert entry["identity"] == {"framework": "sglang", "log": ANON_TP2.replace("\\", "/"), "anonymous": True}
    copy = write(tmp_path, "anon_graph_oom_tp2.log", Path(ANON_TP2).read_text(encoding="utf-8"))
    code, out, _ = gate(monkeypatch, capsys, copy, "--baseline", baseline, "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["suppressed"] == 0 and doc["logs"][0]["identity"]["anonymous"] is True
    assert len(doc["stale_baseline"]) == len(read_baseline(baseline))


def test_deployment_name_identifies_logs_and_keeps_deployments_apart(monkeypatch, capsys, tmp_path):
    baseline = str(tmp_path / "baseline.json")
    run_entry(monkeypatch, capsys, "baseline", ANON_TP2, "--deployment", "glm-air-3090", "-o", baseline)
    assert {e["identity"]["deployment"] for e in read_baseline(baseline)} == {"glm-air-3090"}
    # a named deployment matches under another path (CI checks the log out elsewhere) …
    copy = write(tmp_path, "tp2-again.log", Path(ANON_TP2).read_text(encoding="utf-8"))
    code, out, _ = gate(monkeypatch, capsys, copy, "--baseline", baseline, "--deployment", "glm-air-3090")
    assert code == 0 and "no deployment identity" not in out
    # … the policy's `deployment` names it too; another deployment's name does not match
    policy = write(tmp_path, "capdiag.toml", 'deployment = "glm-air-3090"\n')
    assert gate(monkeypatch, capsys, copy, "--baseline", baseline, "--policy", policy)[0] == 0
    assert gate(monkeypatch, capsys, copy, "--baseline", baseline, "--deployment", "r1-dcu")[0] == 1


def test_identity_holds_every_identifying_value_the_report_states():
    report = {"framework": "vllm", "config": {"model": "Qwen/Qwen2.5-7B", "framework_version": "0.13.0", "tp_size": 2,
                                              "pp_size": 1, "dp_size": None, "ep_size": None, "quantization": "fp8"},
              "gpu": {"alias": "h100_sxm", "name": "NVIDIA H100 80GB HBM3"}}
    ident = identity(report, "a.log")
    assert ident == {"framework": "vllm", "model": "Qwen/Qwen2.5-7B", "framework_version": "0.13.0", "tp_size": 2,
                     "pp_size": 1, "quantization": "fp8", "gpu": "h100_sxm", "gpu_name": "NVIDIA H100 80GB HBM3"}
    finding = {"rule": "thin-headroom", "key": None, "rank": "TP0"}
    base = fingerprint(ident, finding)
    for key, other in (("model", "Qwen/Qwen2.5-14B"), ("framework_version", "0.14.0"), ("tp_size", 4),
                       ("quantization", None), ("gpu", "h200")):
        assert fingerprint({**ident, key: other}, finding) != base, key
    assert fingerprint(identity(report, "b.log"), finding) == base  # identified logs do not depend on the path


def test_old_baselines_are_refused_with_the_reason(monkeypatch, capsys, tmp_path):
    old = write(tmp_path, "baseline.json", '{"schema": "capdiag.baseline/1", "entries": []}')
    code, _, err = gate(monkeypatch, capsys, READY, "--baseline", old)
    assert code == 2 and "could match unrelated deployments" in err and "capdiag baseline" in err


def test_policy_deployment_must_be_a_name(tmp_path):
    with pytest.raises(InputError, match=r":1: deployment must be a non-empty string"):
        load_policy(write(tmp_path, "capdiag.toml", 'deployment = 3\n'))


@needs_shared
def test_the_reported_collision_on_the_corpus_fails(monkeypatch, capsys, tmp_path):
    # issue 16: an SGLang OOM on 2x3090 and a vLLM OOM accepted a DeepSeek-R1 TP8 crash on Hygon DCUs
    corpus = SHARED / "corpus"
    logs = [str(next((corpus / d).glob(f"{n}-*.log"))) for d, n in (("sglang", "305"), ("vllm", "401"))]
    baseline = str(tmp_path / "baseline.json")
    assert run_entry(monkeypatch, capsys, "baseline", *logs, "-o", baseline)[0] == 0
    crash = str(next((corpus / "sglang").glob("018-*.log")))
    code, out, _ = gate(monkeypatch, capsys, crash, "--baseline", baseline, "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == "fail" and doc["suppressed"] == 0
    assert any(f["rule"] == "startup-failed" and f["failing"] for f in doc["logs"][0]["findings"])


# ---- rules that could not judge ---------------------------------------------------------------

WEIGHTS_ONLY = fixture("weights_then_crash_tp2.log")  # crashes after weight loading: no pool, no free memory


def test_rules_that_cannot_judge_say_which_input_is_missing():
    from capdiag.analysis import analyse
    from capdiag.report import build
    report = build(analyse(WEIGHTS_ONLY))
    reasons = {n["rule"]: n["reason"] for n in report["not_judged"]}
    assert reasons["thin-headroom"] == ("needs the memory free at the end of start-up (no free-memory "
                                        "reading after the pools is stated)")
    assert reasons["low-concurrency"] == "needs the KV pool's token count (no pool token count is stated)"
    assert reasons["context-exceeds-kv"].startswith("needs the KV pool's token count")
    assert "give --nvidia-smi-file" in reasons["unexplained-memory"]
    assert reasons["kv-head-replication"] == "needs the model's config.json (give --config-json)"
    # a rule that judged is not listed, whether it fired or not
    assert not {"startup-incomplete", "out-of-memory", "rank-imbalance"} & set(reasons)
    assert [n["code"] for n in report["not_judged"]] == sorted(n["code"] for n in report["not_judged"])


def test_a_rule_that_fires_is_never_listed_as_not_judged():
    from capdiag.analysis import analyse
    from capdiag.report import build
    report = build(analyse(ANON_TP2))  # thin-headroom fires on 0.52 GiB free
    assert "thin-headroom" in {f["rule"] for f in report["findings"]}
    assert "thin-headroom" not in {n["rule"] for n in report["not_judged"]}


def test_every_gate_format_shows_unknowns_as_skipped_with_the_reason(monkeypatch, capsys, tmp_path):
    reason = "needs the memory free at the end of start-up (no free-memory reading after the pools is stated)"
    code, out, _ = gate(monkeypatch, capsys, WEIGHTS_ONLY)
    assert code == 1 and f"skipped  CD110 thin-headroom: could not judge — {reason}" in out
    assert "8 rule(s) could not judge" in out.splitlines()[0]  # excess-headroom does not apply to a failure; fp8-kv-opportunity needs a stated KV dtype
    doc = json.loads(gate(monkeypatch, capsys, WEIGHTS_ONLY, "--format", "json")[1])
    assert {"rule": "thin-headroom", "code": "CD110", "reason": reason, "failing": False} in doc["logs"][0]["not_judged"]
    root = ET.fromstring(gate(monkeypatch, capsys, WEIGHTS_ONLY, "--format", "junit")[1].encode("utf-8"))
    suite = root.find("testsuite")
    for code_ in ("CD110", "CD124", "CD104"):
        case = suite.find(f"testcase[@classname='capdiag.{code_}']")
        assert len(case) == 1 and case[0].tag == "skipped", code_  # never an empty (passed) test case
        assert case[0].get("message").startswith("insufficient evidence: needs ")
    assert suite.find("testcase[@classname='capdiag.CD110']/skipped").get("message") == \
        f"insufficient evidence: {reason}"
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out = gate(monkeypatch, capsys, WEIGHTS_ONLY, "--format", "github")[1]
    notice = next(line for line in out.splitlines() if line.startswith("::notice ") and "skipped" in line)
    assert "title=capdiag%3A 8 rule(s) skipped%2C insufficient evidence::" in notice
    assert "CD110 thin-headroom: " + reason in notice.replace("%0A", "\n")
    text = summary.read_text(encoding="utf-8")
    assert "### Rules that could not judge" in text and "CD110 `thin-headroom`" in text


def test_fail_on_unknown_fails_rules_at_the_threshold_that_could_not_judge(monkeypatch, capsys, tmp_path):
    # thin-headroom and low-concurrency are warnings: they fail at fail-on warning, not at error
    code, out, _ = gate(monkeypatch, capsys, WEIGHTS_ONLY, "--fail-on-unknown", "--fail-on", "error",
                        "--format", "json")
    doc = json.loads(out)
    assert not any(n["failing"] for n in doc["logs"][0]["not_judged"]) and doc["fail_on_unknown"] is True
    policy = write(tmp_path, "capdiag.toml", 'fail-on = "error"\nfail-on-unknown = true\n'
                                             '[rules.thin-headroom]\nseverity = "error"\n'
                                             '[rules.startup-incomplete]\nenabled = false\n'
                                             '[rules.startup-failed]\nenabled = false\n')
    code, out, _ = gate(monkeypatch, capsys, WEIGHTS_ONLY, "--policy", policy)
    assert code == 1 and "FAIL  CD110 thin-headroom: could not judge (fail-on-unknown) — needs the memory free" in out
    assert "skipped  CD124 low-concurrency" in out
    root = ET.fromstring(gate(monkeypatch, capsys, WEIGHTS_ONLY, "--policy", policy, "--format", "junit")[1]
                         .encode("utf-8"))
    failure = root.find("testsuite/testcase[@classname='capdiag.CD110']/failure")
    assert failure.get("type") == "unknown" and failure.get("message").startswith("could not judge (fail-on-unknown)")
    assert root.find("testsuite/testcase[@classname='capdiag.CD101']/skipped").get("message") == \
        "disabled by the policy"
    out = gate(monkeypatch, capsys, WEIGHTS_ONLY, "--policy", policy, "--format", "github")[1]
    assert any(line.startswith("::error ") and "CD110 thin-headroom could not judge" in line
               for line in out.splitlines())
    # without fail-on-unknown the same policy passes: nothing judged fails
    relaxed = write(tmp_path, "relaxed.toml", open(policy).read().replace("fail-on-unknown = true\n", ""))
    assert gate(monkeypatch, capsys, WEIGHTS_ONLY, "--policy", relaxed)[0] == 0


def test_policy_fail_on_unknown_must_be_a_boolean(tmp_path):
    with pytest.raises(InputError, match=r":1: fail-on-unknown must be true or false"):
        load_policy(write(tmp_path, "capdiag.toml", 'fail-on-unknown = "yes"\n'))


# ---- GitLab code quality and the pre-commit policy check ------------------------------------

def test_gitlab_code_quality_report(monkeypatch, capsys, tmp_path):
    baseline = str(tmp_path / "baseline.json")
    run_entry(monkeypatch, capsys, "baseline", OOM, "-o", baseline)
    code, out, _ = gate(monkeypatch, capsys, OOM, WEIGHTS_ONLY, str(tmp_path / "missing.log"), "--format", "gitlab",
                        "--repo-root", str(TESTS.parent), "--baseline", baseline)
    issues = json.loads(out)
    assert code == 2 and isinstance(issues, list)
    for issue in issues:  # the keys GitLab requires, with its severities
        assert {"description", "check_name", "fingerprint", "severity", "location"} <= set(issue)
        assert issue["severity"] in ("info", "minor", "major", "critical", "blocker")
        assert isinstance(issue["location"]["lines"]["begin"], int) and issue["location"]["lines"]["begin"] >= 1
    assert len({i["fingerprint"] for i in issues}) == len(issues)
    crash = next(i for i in issues if i["check_name"] == "CD125 startup-failed")
    assert crash["severity"] == "critical" and crash["location"]["path"] == "tests/fixtures/weights_then_crash_tp2.log"
    assert Path(WEIGHTS_ONLY).read_text(encoding="utf-8").splitlines()[crash["location"]["lines"]["begin"] - 1] \
        .startswith("RuntimeError: NCCL error in:")  # the root cause line
    skipped = next(i for i in issues if i["check_name"] == "CD110 thin-headroom (not judged)")
    assert skipped["severity"] == "info" and "could not judge" in skipped["description"]
    assert next(i for i in issues if i["check_name"] == "CD001 input-error")["severity"] == "blocker"
    # the baseline accepts the OOM log's findings: none of them is an issue
    assert not [i for i in issues if i["location"]["path"].endswith("oom_capture.log")
                and "(not judged)" not in i["check_name"]]


def test_gitlab_keeps_every_issue_of_two_logs_of_one_deployment(monkeypatch, capsys, tmp_path):
    """Two restarts of one deployment raise the same findings (one baseline fingerprint each);
    GitLab keeps one issue per fingerprint, so each log's issues must have their own."""
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    for path in (first, second):
        path.write_text(Path(WEIGHTS_ONLY).read_text(encoding="utf-8"), encoding="utf-8")
    _, out, _ = gate(monkeypatch, capsys, str(first), str(second), "--format", "gitlab")
    issues = json.loads(out)
    by_log = {p: [i for i in issues if i["location"]["path"].endswith(p)] for p in ("first.log", "second.log")}
    assert by_log["first.log"] and len(by_log["first.log"]) == len(by_log["second.log"])
    assert len({i["fingerprint"] for i in issues}) == len(issues)
    # the same finding in both logs: one check, two issues
    assert sorted(i["check_name"] for i in by_log["first.log"]) == sorted(i["check_name"] for i in by_log["second.log"])


def test_check_policy_validates_each_file(monkeypatch, capsys, tmp_path):
    good = str(EXAMPLE_POLICY)
    bad = write(tmp_path, "capdiag.toml", 'fail-on = "warning"\n[rules.thin-headroom]\nmin_free = 1\n')
    code, out, err = run_entry(monkeypatch, capsys, "check-policy", good)
    assert code == 0 and out == f"{good}: ok (6 rule setting(s), fail-on warning)\n"
    code, out, err = run_entry(monkeypatch, capsys, "check-policy", bad, good)
    assert code == 2 and out.startswith(good) and err == f"capdiag: error: {bad}:3: unknown key 'min_free' for rule " \
        "thin-headroom (known: enabled, severity, min_free_gib)\n"


def test_pre_commit_hook_runs_check_policy_on_policy_files():
    hooks = (TESTS.parent / ".pre-commit-hooks.yaml").read_text(encoding="utf-8")
    assert "- id: capdiag-policy" in hooks and "entry: capdiag check-policy" in hooks and "language: python" in hooks
    import re
    files = re.search(r"files: (.+)", hooks).group(1)
    for name in ("capdiag.toml", ".github/capdiag.toml", "ci/capdiag-prod.toml", ".capdiag.toml"):
        assert re.search(files, name), name
    for name in ("pyproject.toml", "capdiag.toml.bak", "docs/other.toml"):
        assert not re.search(files, name), name


def test_explain_reports_show_the_rules_that_could_not_judge(monkeypatch, capsys):
    from capdiag.analysis import analyse
    from capdiag.report import build
    n = len(build(analyse(WEIGHTS_ONLY))["not_judged"])
    assert n >= 3  # thin-headroom, low-concurrency, context-exceeds-kv at least
    for fmt, heading, line in (("text", f"NOT JUDGED ({n}: these rules could not judge this log",
                                "CD110 thin-headroom: needs the memory free at the end of start-up"),
                               ("markdown", f"## Not judged ({n})", "- CD110 `thin-headroom` — needs the memory free"),
                               ("html", f"<h3>Not judged ({n})</h3>",
                                '<span class="code">CD110</span> <code>thin-headroom</code> — needs the memory free')):
        code, out, _ = run_entry(monkeypatch, capsys, "explain", WEIGHTS_ONLY, "--format", fmt, "--color", "never")
        assert code == 0 and heading in out and line in out, fmt


def test_an_annotation_points_at_the_line_of_the_value_it_judges(tmp_path, monkeypatch, capsys):
    """rank-imbalance on a TP2 start-up whose TP1 is short: each annotation lands on TP1's line
    (the rank that binds), not on TP0's, which is the normal one."""
    log = tmp_path / "tp2.log"
    log.write_text(Path(fixture("mla_tp2.log")).read_text()
                   .replace("TP1] Load weight begin. avail mem=77.50", "TP1] Load weight begin. avail mem=76.00")
                   .replace("avail mem=61.25 GB, mem usage=16.25", "avail mem=59.75 GB, mem usage=16.25"))
    code, out, _ = run_entry(monkeypatch, capsys, "gate", str(log), "--format", "github", "--fail-on", "error")
    lines = log.read_text().splitlines()
    found = [line for line in out.splitlines() if "title=CD112" in line]
    assert len(found) == 2, out
    for annotation in found:
        at = int(annotation.split(",line=")[1].split(",")[0])
        assert lines[at - 1].startswith("[2025-09-11 10:0") and " TP1] " in lines[at - 1], (annotation, lines[at - 1])


# ---- baseline entries: a reason, an expiry, and never a finding that got worse -----------------

THIN = str(TESTS / "rule_cases" / "thin-headroom" / "fires.log")  # 0.81 GiB free after start-up


def _baseline(monkeypatch, capsys, tmp_path, *extra) -> tuple[str, dict]:
    path = str(tmp_path / "baseline.json")
    code, _, _ = run_entry(monkeypatch, capsys, "baseline", THIN, "-o", path, *extra)
    assert code == 0
    return path, json.loads(Path(path).read_text())


def test_a_baseline_entry_keeps_its_reason_and_the_figure_it_accepted(monkeypatch, capsys, tmp_path):
    path, document = _baseline(monkeypatch, capsys, tmp_path, "--reason", "canary, see TICKET-12",
                               "--expires", "2999-01-01")
    entry = next(e for e in document["entries"] if e["rule"] == "thin-headroom")
    assert entry["measure"] == {"key": "free_gib", "value": 0.81, "worse": "lower"}
    assert (entry["reason"], entry["expires"]) == ("canary, see TICKET-12", "2999-01-01")
    code, out, _ = gate(monkeypatch, capsys, THIN, "--baseline", path, "--fail-on", "warning")
    assert code == 0 and "accepted  [warning] CD110 thin-headroom" in out


def test_a_finding_worse_than_its_baseline_accepted_fails(monkeypatch, capsys, tmp_path):
    worse = tmp_path / "worse.log"
    worse.write_text(Path(THIN).read_text().replace("0.81 GB", "0.31 GB"))
    # the log names no deployment: named on both sides, the two logs are one deployment's
    path, _ = _baseline(monkeypatch, capsys, tmp_path, "--reason", "known tight", "--deployment", "same")
    code, out, _ = gate(monkeypatch, capsys, str(worse), "--baseline", path, "--fail-on", "warning",
                        "--deployment", "same")
    assert code == 1 and "FAIL  [warning] CD110 thin-headroom" in out
    assert "worse than the baseline accepted: free_gib 0.81 then, 0.31 now (accepted because: known tight)" in out
    code, out, _ = gate(monkeypatch, capsys, str(worse), "--baseline", path, "--fail-on", "warning",
                        "--deployment", "same", "--format", "json")
    refused = next(f for f in json.loads(out)["logs"][0]["findings"] if f["rule"] == "thin-headroom")
    assert refused["baseline"] == {"status": "worse", "key": "free_gib", "accepted": 0.81, "now": 0.31,
                                   "reason": "known tight"} and refused["failing"]


def test_an_expired_entry_accepts_nothing_and_a_bad_date_is_refused(monkeypatch, capsys, tmp_path):
    path, _ = _baseline(monkeypatch, capsys, tmp_path, "--expires", "2020-01-31")
    code, out, _ = gate(monkeypatch, capsys, THIN, "--baseline", path, "--fail-on", "warning")
    assert code == 1 and "the baseline's entry expired on 2020-01-31" in out
    code, _, err = run_entry(monkeypatch, capsys, "baseline", THIN, "-o", str(tmp_path / "b.json"),
                             "--expires", "next week")
    assert code == 2 and "--expires 'next week': a date, YYYY-MM-DD" in err
    document = json.loads(Path(path).read_text())
    document["entries"][0]["expires"] = "2020-02-30"
    Path(path).write_text(json.dumps(document))
    code, _, err = gate(monkeypatch, capsys, THIN, "--baseline", path)
    assert code == 2 and "baseline entry 1: `expires` '2020-02-30': a date, YYYY-MM-DD" in err


def test_a_stale_entry_says_why_nothing_matched_it(monkeypatch, capsys, tmp_path):
    path, _ = _baseline(monkeypatch, capsys, tmp_path, "--deployment", "canary")
    code, out, _ = gate(monkeypatch, capsys, THIN, "--baseline", path, "--deployment", "production")
    assert "Stale baseline entries (no finding matched them):" in out
    assert "raises it under another identity: deployment 'canary' → 'production'" in out


# ---- a policy found from the working directory, as ruff finds its configuration ---------------

def test_the_nearest_policy_is_found_and_named(monkeypatch, capsys, tmp_path):
    project = tmp_path / "repo"
    (project / "deploy" / "logs").mkdir(parents=True)
    (project / "capdiag.toml").write_text('fail-on = "info"\n')
    monkeypatch.chdir(project / "deploy" / "logs")
    code, out, _ = gate(monkeypatch, capsys, THIN)
    assert code == 1 and f"fail-on info; policy {project / 'capdiag.toml'}" in out.splitlines()[0]
    code, out, _ = gate(monkeypatch, capsys, THIN, "--format", "json")
    assert json.loads(out)["policy"] == str(project / "capdiag.toml")
    # --no-policy reads none: the default fail-on (warning) then passes the info findings
    code, out, _ = gate(monkeypatch, capsys, str(TESTS / "rule_cases" / "fp8-kv-opportunity" / "fires.log"),
                        "--no-policy")
    assert "policy" not in out.splitlines()[0]


def test_a_pyproject_table_is_a_policy_and_one_without_it_is_passed_over(monkeypatch, capsys, tmp_path):
    outer, inner = tmp_path / "outer", tmp_path / "outer" / "inner"
    inner.mkdir(parents=True)
    (outer / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.capdiag]\nfail-on = "error"\n\n'
                                          '[tool.capdiag.rules.thin-headroom]\nmin_free_gib = 0.5\n')
    (inner / "pyproject.toml").write_text('[project]\nname = "inner"\n')  # no [tool.capdiag]: not a policy
    monkeypatch.chdir(inner)
    code, out, _ = gate(monkeypatch, capsys, THIN, "--fail-on", "warning")
    # the outer table's threshold (0.5 GiB) lets 0.81 GiB free pass
    assert code == 0 and f"policy {outer / 'pyproject.toml'}" in out and "CD110" not in out
    (outer / "pyproject.toml").write_text('[tool.capdiag]\nfail-on = "error"\n\n[tool.capdiag.rules.thin-headroom]\n'
                                          'min_free = 0.5\n')
    code, _, err = gate(monkeypatch, capsys, THIN)
    assert code == 2 and f"{outer / 'pyproject.toml'}:5: unknown key 'min_free' for rule thin-headroom" in err
