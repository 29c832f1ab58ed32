"""The rules' documentation, from their docstrings and metadata: `capdiag rules` and the
generated docs/rules.md (a test fails when that file is stale)."""
from __future__ import annotations

import re

from capdiag import RULES_DOC_URL
from capdiag.engine import Rule
from capdiag.rules import FINDINGS

_SECTIONS = ("What it checks", "Why it matters", "Example", "What to do")


def sections(r: Rule) -> dict[str, str]:
    """The docstring's ruff-style sections, each as one paragraph of text."""
    parts = re.split(r"^(What it checks|Why it matters|Example|What to do):", r.doc, flags=re.M)
    found = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        found[name] = " ".join(body.split())
    return found


def anchor(r: Rule) -> str:
    """The rule's heading anchor in docs/rules.md (GitHub's slug of `## CD101 startup-incomplete`)."""
    return f"{r.code.lower()}-{r.name}"


def help_uri(r: Rule) -> str:
    return f"{RULES_DOC_URL}#{anchor(r)}"


def summary(r: Rule) -> str:
    """The first sentence of "What it checks" (a period inside `code` does not end it)."""
    checks = sections(r).get("What it checks", "")
    in_code = False
    for i, ch in enumerate(checks):
        if ch == "`":
            in_code = not in_code
        elif ch == "." and not in_code and (i + 1 == len(checks) or checks[i + 1] == " "):
            return checks[: i + 1]
    return checks


def listing() -> str:
    rows = [f"{r.code}  {r.name:<26} {r.severity:<8} {summary(r)}" for r in FINDINGS]
    return "\n".join(rows) + "\n"


def one(r: Rule) -> str:
    s = sections(r)
    lines = [f"{r.code} {r.name} (default severity: {r.severity})", ""]
    for name in _SECTIONS:
        if name in s:
            lines += [f"{name}:", f"  {s[name]}", ""]
    if r.thresholds:
        lines.append("Thresholds (a policy can change them): "
                     + ", ".join(f"{k} = {v}" for k, v in r.thresholds.items()))
    return "\n".join(lines).rstrip() + "\n"


def markdown() -> str:
    out = ["# capdiag rules", "",
           "Generated from the rules' docstrings by `capdiag rules --markdown`; do not edit by hand.", "",
           "| code | name | default severity | what it checks |", "|---|---|---|---|"]
    out += [f"| {r.code} | [`{r.name}`](#{anchor(r)}) | {r.severity} | {summary(r)} |" for r in FINDINGS]
    for r in FINDINGS:
        s = sections(r)
        out += ["", f"## {r.code} {r.name}", "", f"Default severity: **{r.severity}**."]
        if r.thresholds:
            out.append("Thresholds: " + ", ".join(f"`{k}` = {v}" for k, v in r.thresholds.items()) + ".")
        for name in _SECTIONS:
            if name in s:
                out += ["", f"**{name}.** {s[name]}"]
    return "\n".join(out) + "\n"
