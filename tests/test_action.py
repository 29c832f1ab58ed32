"""The GitHub Action: its entry script (action/entry.py) run as the runner runs it — a fresh
process with the GITHUB_* environment a workflow has and the action's inputs as CAPDIAG_*
variables, in a workspace holding the logs — and action.yml wiring every input to it."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from helpers import SGLANG_CORPUS, TESTS, fixture, needs_shared

ROOT = TESTS.parent
ENTRY = ROOT / "action" / "entry.py"
ACTION = ROOT / "action.yml"


def run_action(workspace: Path, **inputs: str):
    """The Gate step: `python action/entry.py` in the workspace, as action.yml runs it."""
    summary, outputs = workspace.parent / "summary.md", workspace.parent / "outputs.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "CAPDIAG_"))}
    env.update({"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(workspace), "GITHUB_STEP_SUMMARY": str(summary),
                "GITHUB_OUTPUT": str(outputs), "GITHUB_ACTION_PATH": str(ROOT), "RUNNER_TEMP": str(workspace.parent)})
    env.update({f"CAPDIAG_{k.upper()}": v for k, v in inputs.items()})
    done = subprocess.run([sys.executable, str(ENTRY)], cwd=workspace, env=env, capture_output=True, text=True,
                          timeout=120)
    written = dict(line.split("=", 1) for line in outputs.read_text(encoding="utf-8").splitlines()) \
        if outputs.exists() else {}
    return done, (summary.read_text(encoding="utf-8") if summary.exists() else ""), written


def workspace_with(tmp_path: Path, *logs: str) -> Path:
    workspace = tmp_path / "repo"
    (workspace / "logs").mkdir(parents=True)
    for log in logs:
        shutil.copy(log, workspace / "logs" / Path(log).name)
    return workspace


def test_a_failing_log_annotates_summarises_and_writes_sarif(tmp_path):
    workspace = workspace_with(tmp_path, fixture("oom_capture.log"), fixture("single_gpu_ready.log"))
    done, summary, outputs = run_action(workspace, logs="logs/*.log", sarif="capdiag.sarif")
    assert done.returncode == 1, done.stderr
    error = next(line for line in done.stdout.splitlines() if line.startswith("::error ") and "CD102" in line)
    assert error.startswith("::error file=logs/oom_capture.log,line=")  # relative to the workspace
    assert summary.startswith("## capdiag gate: FAIL") and "| logs/oom\\_capture.log | fail |" in summary
    assert outputs == {"sarif-file": "capdiag.sarif", "verdict": "fail"}
    doc = json.loads((workspace / "capdiag.sarif").read_text(encoding="utf-8"))
    jsonschema.validate(doc, json.loads((TESTS / "schemas" / "sarif-schema-2.1.0.json").read_text(encoding="utf-8")))
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in doc["runs"][0]["results"]}
    assert uris == {"logs/oom_capture.log", "logs/single_gpu_ready.log"}


def test_policy_baseline_and_exit_zero_reach_the_gate(tmp_path):
    workspace = workspace_with(tmp_path, fixture("oom_capture.log"))
    (workspace / "capdiag.toml").write_text('fail-on = "error"\n[rules.out-of-memory]\nenabled = false\n'
                                            '[rules.startup-incomplete]\nenabled = false\n'
                                            '[rules.startup-failed]\nenabled = false\n', encoding="utf-8")
    done, _, outputs = run_action(workspace, logs="logs/oom_capture.log", policy="capdiag.toml")
    assert done.returncode == 0 and outputs["verdict"] == "pass", done.stdout + done.stderr
    # not named, it is found in the workspace, as the CLI finds it from the working directory
    done, _, outputs = run_action(workspace, logs="logs/oom_capture.log")
    assert done.returncode == 0 and outputs["verdict"] == "pass", done.stdout + done.stderr
    (workspace / "capdiag.toml").unlink()
    done, _, outputs = run_action(workspace, logs="logs/oom_capture.log", exit_zero="true")
    assert done.returncode == 0 and outputs["verdict"] == "fail"
    done, _, outputs = run_action(workspace, logs="logs/oom_capture.log", fail_on="error", fail_on_unknown="true",
                                  deployment="canary")
    assert done.returncode == 1 and outputs["verdict"] == "fail"


@pytest.mark.parametrize("inputs, message", [
    ({"logs": "logs/*.gz"}, "no log matches 'logs/*.gz'"),
    ({"logs": ""}, "the logs input is empty"),
    ({"logs": "logs/oom_capture.log", "exit_zero": "yes"}, "CAPDIAG_EXIT_ZERO must be 'true' or 'false', not 'yes'"),
])
def test_bad_inputs_fail_the_step_with_one_error(tmp_path, inputs, message):
    done, _, outputs = run_action(workspace_with(tmp_path, fixture("oom_capture.log")), **inputs)
    assert done.returncode == 2 and done.stdout == f"::error title=capdiag::{message}\n"
    assert outputs == {"verdict": "error"}


def test_an_unreadable_log_is_an_error_not_a_pass(tmp_path):
    workspace = workspace_with(tmp_path, fixture("single_gpu_ready.log"))
    done, _, outputs = run_action(workspace, logs="logs/single_gpu_ready.log logs/missing.log", exit_zero="true")
    assert done.returncode == 2 and outputs["verdict"] == "error"
    assert "::error file=logs/missing.log,title=capdiag%3A input error::" in done.stdout


@needs_shared
def test_green_on_a_corpus_log(tmp_path):
    log = next(SGLANG_CORPUS.glob("003-*.log"))
    workspace = workspace_with(tmp_path, str(log))
    (workspace / "out").mkdir()
    done, summary, outputs = run_action(workspace, logs="logs/*.log", sarif="out/capdiag.sarif")
    assert done.returncode == 0, done.stdout + done.stderr
    assert outputs == {"sarif-file": "out/capdiag.sarif", "verdict": "pass"}
    assert summary.startswith("## capdiag gate: PASS") and done.stdout.splitlines()[-1].startswith("capdiag gate: pass")


def test_action_yml_wires_every_input_to_the_entry_script():
    action = ACTION.read_text(encoding="utf-8")
    inputs = re.findall(r"^  ([a-z-]+):\n    description:", action.split("\noutputs:")[0], flags=re.M)
    assert inputs == ["logs", "policy", "baseline", "fail-on", "fail-on-unknown", "deployment", "gpu",
                      "nvidia-smi-file", "config-json", "framework", "target-rank", "args", "sarif",
                      "upload-sarif", "exit-zero", "capdiag-version"]
    for name in inputs:
        assert f"${{{{ inputs.{name} }}}}" in action or f"inputs.{name} ==" in action, name
    read = set(re.findall(r'"(CAPDIAG_[A-Z_]+)"', ENTRY.read_text(encoding="utf-8")))
    passed = set(re.findall(r"^        (CAPDIAG_[A-Z_]+):", action, flags=re.M)) - {"CAPDIAG_SPEC"}
    assert read == passed
    assert "using: composite" in action and '"$GITHUB_ACTION_PATH/action/entry.py"' in action
    assert "github/codeql-action/upload-sarif@v3" in action


def test_a_log_named_like_an_option_is_a_log(tmp_path):
    """A file called `--exit-zero` (or `--output=x`) that a glob matches is gated as a log: every
    path goes after `--`, so a failing gate stays failed and its annotations are printed."""
    workspace = workspace_with(tmp_path, fixture("oom_capture.log"))
    for name in ("--exit-zero", "--output=ann.log"):
        shutil.copy(fixture("oom_capture.log"), workspace / "logs" / name)
    done, _, outputs = run_action(workspace, logs="logs/*")
    assert done.returncode == 1 and outputs == {"verdict": "fail"}, done.stdout + done.stderr
    assert "::error file=logs/--exit-zero,line=" in done.stdout and not (workspace / "ann.log").exists()


def test_a_quote_in_a_file_name_and_a_newline_in_an_input(tmp_path):
    workspace = workspace_with(tmp_path, fixture("single_gpu_ready.log"))
    shutil.copy(fixture("single_gpu_ready.log"), workspace / "logs" / "it's.log")
    done, _, outputs = run_action(workspace, logs="logs/it's.log")
    assert done.returncode == 0 and outputs == {"verdict": "pass"}, done.stdout + done.stderr
    # a newline in a one-line input would write a second output line (verdict=pass)
    done, _, outputs = run_action(workspace, logs="logs/it's.log", sarif="x.sarif\nverdict=pass")
    assert done.returncode == 2 and outputs == {"verdict": "error"}
    assert done.stdout == "::error title=capdiag::CAPDIAG_SARIF must be one line\n"
    # a message from input is escaped: it cannot start a workflow command of its own
    done, _, _ = run_action(workspace, logs="nothing/*.log\n::warning::x")
    assert done.returncode == 2 and done.stdout.count("\n") == 1 and "::warning::" not in done.stdout.split("::", 2)[2]


def test_side_inputs_and_args_reach_the_gate(tmp_path):
    workspace = workspace_with(tmp_path, fixture("single_gpu_ready.log"))
    done, _, outputs = run_action(workspace, logs="logs/single_gpu_ready.log", gpu="h100_sxm", framework="sglang",
                                  target_rank="tp0", args="--token-lengths 8192 --fail-on info")
    assert done.returncode == 1 and outputs == {"verdict": "fail"}, done.stdout + done.stderr  # info fails
    assert "::notice file=logs/single_gpu_ready.log" in done.stdout or "::error file=logs/single_gpu_ready.log" in done.stdout
    done, _, outputs = run_action(workspace, logs="logs/single_gpu_ready.log", gpu="h100_sxm")
    assert done.returncode == 0 and outputs == {"verdict": "pass"}
    done, _, outputs = run_action(workspace, logs="logs/single_gpu_ready.log", gpu="no-such-gpu")
    assert done.returncode == 2 and outputs == {"verdict": "error"}
    for args, message in (("--format json", "args may not contain '--format': the action sets it"),
                          ("-- logs/x.log", "args may not contain '--': the action sets it"),
                          # a short option with its value joined swallowed every annotation
                          ("-oann.log", "args may not contain '-o': the action sets it"),
                          # either made a failing gate exit 0 and write verdict=pass
                          ("--exit-zero", "args may not contain '--exit-zero': the action sets it"),
                          ("-h", "args may not contain '-h': the action sets it"),
                          ("logs/x.log", "args must be options (they start with -), not 'logs/x.log': "
                                         "give logs in the logs input")):
        done, _, outputs = run_action(workspace, logs="logs/single_gpu_ready.log", args=args)
        assert done.returncode == 2 and done.stdout == f"::error title=capdiag::{message}\n", args
