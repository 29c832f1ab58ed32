"""The GitHub Action's entry: action.yml's inputs (as CAPDIAG_* variables) → `capdiag gate`.

Runs the gate once for annotations and the step summary (`--format github`, which appends to
$GITHUB_STEP_SUMMARY) and, when a SARIF path is given, once more for the SARIF file; paths are
made relative to $GITHUB_WORKSPACE, as annotations and code scanning need. Writes `verdict` and
`sarif-file` to $GITHUB_OUTPUT. Exit code: the gate's (0 pass, 1 fail, 2 input error), or 0 for
a failed gate under exit-zero.
"""
from __future__ import annotations

import glob
import os
import shlex
import subprocess
import sys

VERDICTS = {0: "pass", 1: "fail", 2: "error"}


def _flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value not in ("", "true", "false"):
        _fail(f"{name} must be 'true' or 'false', not {value!r}")
    return value == "true"


def _fail(message: str) -> None:
    print(f"::error title=capdiag::{message}")
    _output("verdict", "error")
    sys.exit(2)


def _output(name: str, value: str) -> None:
    target = os.environ.get("GITHUB_OUTPUT")
    if target:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(f"{name}={value}\n")


def _logs() -> list[str]:
    """Every path the patterns name, in the order given; a pattern that matches nothing is an error
    (a gate that silently checks no log would pass)."""
    patterns = shlex.split(os.environ.get("CAPDIAG_LOGS", ""))
    if not patterns:
        _fail("the logs input is empty")
    logs: list[str] = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        if not found:
            _fail(f"no log matches {pattern!r}")
        logs += [p for p in found if p not in logs]
    return logs


def _options() -> list[str]:
    options = []
    for variable, option in (("CAPDIAG_POLICY", "--policy"), ("CAPDIAG_BASELINE", "--baseline"),
                             ("CAPDIAG_FAIL_ON", "--fail-on"), ("CAPDIAG_DEPLOYMENT", "--deployment")):
        value = os.environ.get(variable, "").strip()
        if value:
            options += [option, value]
    if _flag("CAPDIAG_FAIL_ON_UNKNOWN"):
        options.append("--fail-on-unknown")
    return options + ["--repo-root", os.environ.get("GITHUB_WORKSPACE") or os.getcwd()]


def main() -> int:
    logs, options, exit_zero = _logs(), _options(), _flag("CAPDIAG_EXIT_ZERO")
    gate = [sys.executable, "-m", "capdiag", "gate", *logs, *options]
    sarif = os.environ.get("CAPDIAG_SARIF", "").strip()
    if sarif:
        subprocess.run([*gate, "--format", "sarif", "--output", sarif, "--exit-zero"], check=False)
        if os.path.isfile(sarif):
            _output("sarif-file", sarif)
    code = subprocess.run([*gate, "--format", "github"], check=False).returncode
    _output("verdict", VERDICTS.get(code, "error"))
    return 0 if code == 1 and exit_zero else code


if __name__ == "__main__":
    sys.exit(main())
