"""The GitHub Action's entry: action.yml's inputs (as CAPDIAG_* variables) → `capdiag gate`.

Runs the gate once for annotations and the step summary (`--format github`, which appends to
$GITHUB_STEP_SUMMARY) and, when a SARIF path is given, once more for the SARIF file; paths are
made relative to $GITHUB_WORKSPACE, as annotations and code scanning need. Writes `verdict` and
`sarif-file` to $GITHUB_OUTPUT. Exit code: the gate's (0 pass, 1 fail, 2 input error), or 0 for
a failed gate under exit-zero.

Every log path goes after `--`, so a file named like an option (`--exit-zero`) is a log, never
an option; a value that would start a second line of a workflow command or of $GITHUB_OUTPUT is
refused, and every message is escaped as workflow commands require.
"""
from __future__ import annotations

import glob
import os
import shlex
import subprocess
import sys

VERDICTS = {0: "pass", 1: "fail", 2: "error"}
# input variable → the gate's option taking one value
VALUED = (("CAPDIAG_POLICY", "--policy"), ("CAPDIAG_BASELINE", "--baseline"), ("CAPDIAG_FAIL_ON", "--fail-on"),
          ("CAPDIAG_DEPLOYMENT", "--deployment"), ("CAPDIAG_GPU", "--gpu"),
          ("CAPDIAG_NVIDIA_SMI_FILE", "--nvidia-smi-file"), ("CAPDIAG_CONFIG_JSON", "--config-json"),
          ("CAPDIAG_FRAMEWORK", "--framework"), ("CAPDIAG_TARGET_RANK", "--target-rank"))
# options the action sets itself: `args` may not override where the reports go or how they read,
# nor make the gate's exit say anything but its verdict (exit-zero is an input of its own, applied
# after the verdict is read; help prints no verdict at all)
OWN = ("--format", "--output", "-o", "--repo-root", "--sarif-root", "--exit-zero", "-h", "--help")


def _escape(text: str) -> str:
    """A workflow command's message: `%`, CR and LF encoded (GitHub's toolkit escapeData)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _fail(message: str) -> None:
    print(f"::error title=capdiag::{_escape(message)}")
    _output("verdict", "error")
    sys.exit(2)


def _one_line(name: str, value: str) -> str:
    if "\n" in value or "\r" in value:
        _fail(f"{name} must be one line")
    return value


def _flag(name: str) -> bool:
    value = _one_line(name, os.environ.get(name, "")).strip().lower()
    if value not in ("", "true", "false"):
        _fail(f"{name} must be 'true' or 'false', not {value!r}")
    return value == "true"


def _output(name: str, value: str) -> None:
    target = os.environ.get("GITHUB_OUTPUT")
    if target:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(f"{name}={value}\n")


def _words(text: str) -> list[str]:
    """An input's items, one line at a time: shell words where the line quotes them, else the
    line's whitespace-separated words (`it's.log` is a file name, not an open quote)."""
    words: list[str] = []
    for line in text.splitlines():
        try:
            words += shlex.split(line)
        except ValueError:
            words += line.split()
    return words


def _logs() -> list[str]:
    """Every path the patterns name, in the order given; a pattern that matches nothing is an error
    (a gate that silently checks no log would pass)."""
    patterns = _words(os.environ.get("CAPDIAG_LOGS", ""))
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
    for variable, option in VALUED:
        value = _one_line(variable, os.environ.get(variable, "")).strip()
        if value:
            options.append(f"{option}={value}")  # one word: a value starting with `-` stays a value
    if _flag("CAPDIAG_FAIL_ON_UNKNOWN"):
        options.append("--fail-on-unknown")
    extra = _words(os.environ.get("CAPDIAG_ARGS", ""))
    if extra and not extra[0].startswith("-"):
        _fail(f"args must be options (they start with -), not {extra[0]!r}: give logs in the logs input")
    for word in (word for word in extra if word.startswith("-")):
        # a short option may carry its value joined (`-oann.log`): its first two characters name it
        name = word.split("=", 1)[0] if word.startswith("--") else word[:2]
        if name == "--" or name in OWN:
            _fail(f"args may not contain {name!r}: the action sets it")
    return options + extra + ["--repo-root", os.environ.get("GITHUB_WORKSPACE") or os.getcwd()]


def main() -> int:
    logs, options, exit_zero = _logs(), _options(), _flag("CAPDIAG_EXIT_ZERO")
    gate = [sys.executable, "-m", "capdiag", "gate", *options]
    sarif = _one_line("CAPDIAG_SARIF", os.environ.get("CAPDIAG_SARIF", "")).strip()
    if sarif:
        subprocess.run([*gate, "--format", "sarif", "--output", sarif, "--exit-zero", "--", *logs], check=False)
        if os.path.isfile(sarif):
            _output("sarif-file", sarif)
    code = subprocess.run([*gate, "--format", "github", "--", *logs], check=False).returncode
    _output("verdict", VERDICTS.get(code, "error"))
    return 0 if code == 1 and exit_zero else code


if __name__ == "__main__":
    sys.exit(main())
