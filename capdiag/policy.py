"""A gate policy (capdiag.toml) → a validated Policy fact.

    fail-on = "warning"              # info | warning | error: the lowest severity that fails
    fail-on-unknown = true           # a rule that could not judge (inputs unknown) fails too
    deployment = "chat-prod-eu"      # names the deployment in every finding's fingerprint

    [rules.thin-headroom]            # a rule by slug or code
    severity = "error"               # override its findings' severity
    min_free_gib = 2.0               # a threshold the rule documents

    [rules.fp8-kv-opportunity]
    enabled = false

Every rule, key and type is checked when the file is loaded; a mistake is an error naming
its line. The same keys may sit in a `pyproject.toml` under `[tool.capdiag]` (its rules under
`[tool.capdiag.rules.NAME]`). Without `--policy`, the gate takes the nearest `capdiag.toml`, or
`pyproject.toml` holding `[tool.capdiag]`, in the working directory or a parent, as ruff finds
its configuration.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from capdiag import facts as F
from capdiag.errors import InputError
from capdiag.parsing.bounds import in_range
from capdiag.resources import toml_reader
from capdiag.side_input import read_text
from capdiag.rules import find_rule
from capdiag.vocabulary import SEVERITIES
MAX_THRESHOLD = 1e6  # GiB, percent, seconds, tokens, requests: every threshold is far below


POLICY_FILE = "capdiag.toml"
PYPROJECT = "pyproject.toml"


def find_policy(start: str) -> Optional[str]:
    """The nearest policy from `start` up to the filesystem root: a `capdiag.toml`, else a
    `pyproject.toml` with a `[tool.capdiag]` table (one without it is passed over); None."""
    here = os.path.abspath(start)
    while True:
        own = os.path.join(here, POLICY_FILE)
        if os.path.isfile(own):
            return own
        project = os.path.join(here, PYPROJECT)
        if os.path.isfile(project) and _has_table(project):
            return project
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def _has_table(project: str) -> bool:
    try:
        data = toml_reader().loads(read_text(project, "policy"))
    except (InputError, ValueError, RecursionError):  # not ours to judge: passed over
        return False
    tool = data.get("tool")
    return isinstance(tool, dict) and isinstance(tool.get("capdiag"), dict)


def _line_of(text: str, table: Optional[str], key: Optional[str]) -> int:
    """The line where `key` is set inside `[table]` (or where the table opens); 0 if not found."""
    current = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            current = line.strip("[] ").replace('"', "")
            if key is None and current == table:
                return number
            continue
        if key is not None and current == table and line.split("=")[0].strip().strip('"') == key:
            return number
    return 0


def load_policy(path: str) -> F.Policy:
    text = read_text(path, "policy")
    tomllib = toml_reader()
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, ValueError) as exc:  # ValueError: int digit limit
        raise InputError(f"{path}: not valid TOML ({str(exc)[:120]})") from None

    # a pyproject.toml holds the policy as its [tool.capdiag] table
    prefix = "tool.capdiag" if os.path.basename(path) == PYPROJECT else None
    if prefix:
        tool = data.get("tool")
        data = tool.get("capdiag") if isinstance(tool, dict) else None
        if not isinstance(data, dict):
            raise InputError(f"{path}: no [tool.capdiag] table")

    def fail(message: str, table: Optional[str] = None, key: Optional[str] = None):
        line = _line_of(text, ".".join(p for p in (prefix, table) if p) or None, key)
        raise InputError(f"{path}:{line}: {message}" if line else f"{path}: {message}")

    for key in data:
        if key not in ("fail-on", "fail-on-unknown", "deployment", "rules"):
            fail(f"unknown key {key!r} (expected fail-on, fail-on-unknown, deployment or [rules.NAME] tables)",
                 None, key)
    fail_on = data.get("fail-on")
    if fail_on is not None and fail_on not in SEVERITIES:
        fail(f"fail-on must be one of {', '.join(SEVERITIES)}, not {fail_on!r}", None, "fail-on")
    fail_on_unknown = data.get("fail-on-unknown")
    if fail_on_unknown is not None and not isinstance(fail_on_unknown, bool):
        fail(f"fail-on-unknown must be true or false, not {fail_on_unknown!r}", None, "fail-on-unknown")
    deployment = data.get("deployment")
    if deployment is not None and (not isinstance(deployment, str) or not deployment.strip()):
        fail(f"deployment must be a non-empty string, not {deployment!r}", None, "deployment")
    rules: dict[str, dict[str, Any]] = {}
    tables = data.get("rules", {})
    if not isinstance(tables, dict):
        fail("rules must be tables: [rules.NAME]", None, "rules")
    for name, entry in tables.items():
        table = f"rules.{name}"
        r = find_rule(name)
        if r is None:
            fail(f"unknown rule {name!r} (`capdiag rules` lists them)", table)
        if not isinstance(entry, dict):
            fail(f"[{table}] must be a table", table)
        settings: dict[str, Any] = {"thresholds": {}}
        for key, value in entry.items():
            if key == "enabled":
                if not isinstance(value, bool):
                    fail(f"{key} must be true or false, not {value!r}", table, key)
                settings["enabled"] = value
            elif key == "severity":
                if value not in SEVERITIES:
                    fail(f"severity must be one of {', '.join(SEVERITIES)}, not {value!r}", table, key)
                settings["severity"] = value
            elif key in r.thresholds:
                default = r.thresholds[key]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not in_range(value, MAX_THRESHOLD) \
                        or value < (1 if isinstance(default, int) else 0):
                    low = "a whole number from 1" if isinstance(default, int) else "a number from 0"
                    fail(f"{key} must be {low} to {MAX_THRESHOLD:g}, like {default!r}, not {value!r:.40}", table, key)
                if isinstance(default, int) and not float(value).is_integer():
                    fail(f"{key} must be a whole number, like {default!r}, not {value!r}", table, key)
                settings["thresholds"][key] = type(default)(value) if isinstance(default, int) and \
                    float(value).is_integer() else value
            else:
                known = ", ".join(["enabled", "severity", *r.thresholds])
                fail(f"unknown key {key!r} for rule {r.name} (known: {known})", table, key)
        rules[r.name] = settings
    return F.Policy(evidence=F.Evidence(F.INPUT_LINE, f"policy {path}", 0, "policy"), rules=rules, fail_on=fail_on,
                    fail_on_unknown=fail_on_unknown, deployment=deployment)
