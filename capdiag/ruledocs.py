"""The rules' documentation, from their docstrings and metadata: `capdiag rules` (the finding
rules; `--derivations` the rules that derive values, which hold the core formulas) and the
generated docs/rules.md (a test fails when that file is stale)."""
from __future__ import annotations

import re

from capdiag import RULES_DOC_URL
from capdiag.engine import Rule
from capdiag.rules import DERIVATIONS, FINDINGS

_SECTIONS = ("What it checks", "Why it matters", "Example", "What to do")
# a derivation rule's sections (rules/derive/ documents every rule in them)
DERIVATION_SECTIONS = ("What it concludes", "How", "Example")
_HEADINGS = re.compile(r"^(" + "|".join(dict.fromkeys(_SECTIONS + DERIVATION_SECTIONS)) + "):", re.M)


def sections(r: Rule) -> dict[str, str]:
    """The docstring's ruff-style sections, each as one paragraph of text."""
    parts = _HEADINGS.split(r.doc)
    found = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        found[name] = " ".join(body.split())
    return found


def anchor(r: Rule) -> str:
    """The rule's heading anchor in docs/rules.md (GitHub's slug of `## CD101 startup-incomplete`)."""
    return f"{r.code.lower()}-{r.name}"


def help_uri(r: Rule) -> str:
    return f"{RULES_DOC_URL}#{anchor(r)}"


def kind(r: Rule) -> str:
    """What the rule is, by the folder it lives in: finding, derive, what-if, plan or diff."""
    return r.func.__module__.split(".")[2].replace("findings", "finding").replace("_", "-")


def summary(r: Rule) -> str:
    """The first sentence of "What it checks" or "What it concludes" (else of the docstring); a
    period inside `code` does not end it."""
    found = sections(r)
    checks = found.get("What it checks") or found.get("What it concludes") or " ".join(r.doc.split())
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


def derivation_listing() -> str:
    rows = [f"{kind(r):<8} {r.name:<30} {summary(r)}" for r in DERIVATIONS]
    return "\n".join(rows) + "\n"


def _concludes(r: Rule) -> str:
    return ", ".join(str(c) for c in r.conclusions)


def one(r: Rule) -> str:
    s = sections(r)
    if r.code is None:
        lines = [f"{r.name} ({kind(r)} rule; concludes {_concludes(r)})", ""]
        if not s:
            return "\n".join(lines + [r.doc]).rstrip() + "\n"
    else:
        lines = [f"{r.code} {r.name} (default severity: {r.severity})", ""]
    for name in _SECTIONS if r.code else DERIVATION_SECTIONS:
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
        out += ["", f"## {r.code} {r.name}", "", f"Default severity: **{r.severity}**."]
        if r.thresholds:
            out.append("Thresholds: " + ", ".join(f"`{k}` = {v}" for k, v in r.thresholds.items()) + ".")
        out += _paragraphs(r, _SECTIONS)
    out += ["", "# Derivation rules", "",
            "The rules that derive the values findings rest on: the memory breakdown, the KV pool, the "
            "configuration, the GPU, the ranks, the failure (rules/derive/), the `--what-if` projection "
            "(rules/what_if/), the plan worksheet (rules/plan/) and the diff (rules/diff/). "
            "`capdiag rules --derivations` lists them, `capdiag rules NAME` prints one.", "",
            "| kind | name | concludes | what it concludes |", "|---|---|---|---|"]
    out += [f"| {kind(r)} | `{r.name}` | {_concludes(r)} | {summary(r)} |" for r in DERIVATIONS]
    for r in DERIVATIONS:
        out += ["", f"## {r.name}", "", f"Kind: {kind(r)}. Concludes: {_concludes(r)}."]
        out += _paragraphs(r, DERIVATION_SECTIONS)
    return "\n".join(out) + "\n"


def _paragraphs(r: Rule, names: tuple[str, ...]) -> list[str]:
    """The docstring's sections as markdown paragraphs; a docstring without them, as one."""
    s = sections(r)
    return [line for name in names if name in s for line in ("", f"**{name}.** {s[name]}")] or \
        ["", " ".join(r.doc.split())]
