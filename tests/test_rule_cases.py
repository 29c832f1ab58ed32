"""Every finding rule against case files, in the style of pylint's functional tests: a case is
a file.

    tests/rule_cases/<rule-name>/fires[-N].log   must raise that rule's finding
    tests/rule_cases/<rule-name>/quiet[-N].log   must not (a near miss: just below the
                                                 threshold, or the evidence absent)

Side inputs share the case's stem: `.smi.csv` (nvidia-smi output), `.config.json` (the model's
config.json), `.args` (one line of CLI-style options: --gpu, --gpu-total-gib, --target-rank,
--token-lengths, --framework, --launch) and, for fires cases, `.expect` (JSON):

    {"severity": "warning",            the finding's severity
     "message_contains": ["..."],      substrings of its message (also title_contains, action_contains)
     "message_excludes": ["..."],      substrings its message must not hold (also action_excludes)
     "evidence_lines": [12, 14],       log lines its evidence must cite
     "detail": {"direction": "raise"}, entries its detail must hold
     "cites_log": false}               the finding rests on side inputs only, or on what the log
                                       lacks: it cites no log line (checked, so a change shows)

A case whose first line is `# KNOWN-BUG: <reason>` is expected to fail (xfail, strict): the
rule misbehaves on it. When the rule is fixed the case passes, strict xfail turns that into a
failure, and the marker line must go.

Every fires case must cite real lines: each log line its evidence names exists in the case
file with the same text. The same holds for every finding on every log of the shared corpus
(../shared/corpus), which also checks that crashed start-ups are reported and that SGLang logs
without a stated mem_fraction_static say so.
"""
from __future__ import annotations

import json
import re
import shlex
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple, Optional

import pytest

from capdiag.analysis import analyse
from capdiag.parsing import read_facts
from capdiag.report import build
from capdiag.rules import FINDINGS
from capdiag.source import MAX_CONTINUATION, candidate_lines

CASES = Path(__file__).resolve().parent / "rule_cases"
SHARED = Path(__file__).resolve().parents[2] / "shared"
CORPUS = SHARED / "corpus"

KNOWN_BUG = "# KNOWN-BUG:"
STEM = re.compile(r"^(fires|quiet)(?:-(\d+))?$")
SIDE_SUFFIXES = (".log", ".smi.csv", ".config.json", ".args", ".expect")
EXPECT_KEYS = {"severity", "message_contains", "title_contains", "action_contains", "message_excludes",
               "action_excludes", "evidence_lines", "detail", "cites_log"}
RULE_NAMES = [r.name for r in FINDINGS]


class Case(NamedTuple):
    rule: str
    kind: str  # "fires" or "quiet"
    log: Path

    @property
    def id(self) -> str:
        return f"{self.rule}/{self.log.stem}"

    def side(self, suffix: str) -> Optional[Path]:
        path = self.log.with_name(self.log.stem + suffix)
        return path if path.exists() else None


def discover() -> list[Case]:
    cases = []
    for log in sorted(CASES.glob("*/*.log")):
        match = STEM.match(log.stem)
        if match:
            cases.append(Case(log.parent.name, match.group(1), log))
    return cases


def known_bug(log: Path) -> Optional[str]:
    with log.open(encoding="utf-8", errors="replace") as fh:
        first = fh.readline().strip()
    if not first.startswith(KNOWN_BUG):
        return None
    return first[len(KNOWN_BUG):].strip() or "known bug"


def params(kind: str) -> list:
    out = []
    for case in discover():
        if case.kind != kind:
            continue
        reason = known_bug(case.log)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(case, id=case.id, marks=marks))
    return out


# ---- running a case ---------------------------------------------------------------------------

_OPTIONS = {"--gpu": ("gpu", str), "--gpu-total-gib": ("gpu_total_gib", float), "--target-rank": ("target_rank", str),
            "--token-lengths": ("token_lengths", lambda v: tuple(int(x) for x in v.split(","))),
            "--framework": ("framework", str), "--launch": ("launch", int)}


def parse_args(path: Optional[Path]) -> dict[str, Any]:
    """One line of CLI-style options → analyse() keyword arguments."""
    if path is None:
        return {}
    words = shlex.split(path.read_text(encoding="utf-8"), comments=True)
    kwargs: dict[str, Any] = {}
    i = 0
    while i < len(words):
        option, _, value = words[i].partition("=")
        assert option in _OPTIONS, f"{path}: unknown option {option!r} (known: {', '.join(_OPTIONS)})"
        if not value:
            i += 1
            assert i < len(words), f"{path}: {option} needs a value"
            value = words[i]
        name, convert = _OPTIONS[option]
        kwargs[name] = convert(value)
        i += 1
    return kwargs


@lru_cache(maxsize=None)
def report_of(log: str, smi: Optional[str] = None, config: Optional[str] = None, args: Optional[str] = None) -> dict:
    kwargs = parse_args(Path(args) if args else None)
    return build(analyse(log, nvidia_smi=smi, config_json=config, **kwargs))


def case_report(case: Case) -> dict:
    side = {k: (str(p) if p else None) for k, p in (("smi", case.side(".smi.csv")), ("config", case.side(".config.json")),
                                                    ("args", case.side(".args")))}
    return report_of(str(case.log), **side)


def findings_named(rep: dict, name: str) -> list[dict]:
    return [f for f in rep["findings"] if f["name"] == name]


def summary(rep: dict) -> str:
    return ", ".join(f"{f['name']}({f['severity']})" for f in rep["findings"]) or "none"


# ---- evidence against the files it names ------------------------------------------------------

@lru_cache(maxsize=None)
def physical_lines(path: str) -> tuple[str, ...]:
    """The file's lines as capdiag numbers them (split on "\\n" only) and as its evidence quotes
    them: decoded with replacement, ANSI colour removed."""
    text = Path(path).read_bytes().decode("utf-8", errors="replace").replace("\x00", "")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return tuple(ANSI.sub("", line.rstrip("\r")) for line in lines)


# ANSI colour as ECMA-48 spells it (CSI … final byte, OSC … BEL), written out here so the test
# does not take capdiag's own pattern on trust
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\n]*\x07")


def unreal_evidence(evidence: list[dict], sources: dict[str, Optional[str]]) -> list[str]:
    """What in an evidence list does not match the file it cites (a wrapped record cites its first
    physical line, and its text spans the lines that follow, in order; an argument list Ray
    interleaved with other processes' lines skips those)."""
    problems = []
    for e in evidence:
        path = sources.get(e["source"])
        if path is None or e["line"] == 0:
            continue
        lines = physical_lines(path)
        number, pieces = e["line"], e["text"].split("\n")
        if not 1 <= number <= len(lines):
            problems.append(f"{e['source']} line {number} does not exist ({len(lines)} lines): {e['text'][:120]!r}")
            continue
        at, following = number, True
        for piece in pieces[1:]:
            try:
                at = lines.index(piece, at, at + MAX_CONTINUATION) + 1
            except ValueError:
                following = False
                break
        if pieces[0] != lines[number - 1] or not following:
            problems.append(f"{e['source']} line {number} reads {lines[number - 1][:120]!r}, "
                            f"evidence says {pieces[0][:120]!r}")
    return problems


def cited_log_lines(finding: dict) -> set[int]:
    return {e["line"] for e in finding["evidence"] if e["source"] == "log" and e["line"] > 0}


def unmet(finding: dict, expect: dict) -> list[str]:
    """The expectations a finding does not meet."""
    misses = []
    if "severity" in expect and finding["severity"] != expect["severity"]:
        misses.append(f"severity {finding['severity']!r} != {expect['severity']!r}")
    for key, field in (("message_contains", "message"), ("title_contains", "title"), ("action_contains", "action")):
        for text in expect.get(key, []):
            if text not in (finding.get(field) or ""):
                misses.append(f"{field} lacks {text!r}: {finding.get(field)!r}")
    for key, field in (("message_excludes", "message"), ("action_excludes", "action")):
        for text in expect.get(key, []):
            if text in (finding.get(field) or ""):
                misses.append(f"{field} holds {text!r}: {finding.get(field)!r}")
    missing = set(expect.get("evidence_lines", [])) - cited_log_lines(finding)
    if missing:
        misses.append(f"evidence does not cite line(s) {sorted(missing)}; cites {sorted(cited_log_lines(finding))}")
    for key, value in expect.get("detail", {}).items():
        if finding["detail"].get(key) != value:
            misses.append(f"detail {key}={finding['detail'].get(key)!r}, expected {value!r}")
    return misses


# ---- the cases ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case", params("fires"))
def test_fires(case: Case):
    rep = case_report(case)
    found = findings_named(rep, case.rule)
    assert found, f"{case.id}: {case.rule} did not fire; findings: {summary(rep)}"
    expect_path = case.side(".expect")
    expect = json.loads(expect_path.read_text(encoding="utf-8")) if expect_path else {}
    assert not set(expect) - EXPECT_KEYS, f"{expect_path}: unknown keys {sorted(set(expect) - EXPECT_KEYS)}"
    sources = {"log": str(case.log), "nvidia-smi": str(case.side(".smi.csv")) if case.side(".smi.csv") else None}
    for f in found:
        problems = unreal_evidence(f["evidence"], sources)
        assert not problems, f"{case.id}: evidence cites what the files do not hold:\n" + "\n".join(problems)
        if expect.get("cites_log", True):
            assert cited_log_lines(f), (f"{case.id}: the finding cites no line of the log: "
                                        f"{[(e['where'], e['text'][:80]) for e in f['evidence']]}")
        else:  # it rests on side inputs only, or on what the log lacks: say so, and keep it that way
            assert not cited_log_lines(f), f"{case.id}: .expect says cites_log false, but the finding cites the log"
    misses = [unmet(f, expect) for f in found]
    assert any(not m for m in misses), f"{case.id}: no {case.rule} finding meets {expect}:\n" + "\n".join(
        "; ".join(m) for m in misses)


@pytest.mark.parametrize("case", params("quiet"))
def test_quiet(case: Case):
    rep = case_report(case)
    found = findings_named(rep, case.rule)
    assert not found, f"{case.id}: {case.rule} fired: " + " | ".join(f["message"] for f in found)


def test_every_rule_has_a_fires_and_a_quiet_case():
    kinds: dict[str, set[str]] = {name: set() for name in RULE_NAMES}
    for case in discover():
        kinds.setdefault(case.rule, set()).add(case.kind)
    missing = {name: sorted({"fires", "quiet"} - kinds[name]) for name in RULE_NAMES
               if {"fires", "quiet"} - kinds[name]}
    assert not missing, f"rules without cases in {CASES}: {missing}"


def test_case_files_are_well_formed():
    problems = []
    for folder in sorted(p for p in CASES.iterdir() if p.is_dir()):
        if folder.name not in RULE_NAMES:
            problems.append(f"{folder.name}/: no finding rule has this name")
        for path in sorted(folder.iterdir()):
            suffix = next((s for s in SIDE_SUFFIXES if path.name.endswith(s)), None)
            stem = path.name[: -len(suffix)] if suffix else path.name
            if suffix is None or not STEM.match(stem):
                problems.append(f"{folder.name}/{path.name}: not <fires|quiet>[-N]{{{','.join(SIDE_SUFFIXES)}}}")
            elif suffix != ".log" and not path.with_name(stem + ".log").exists():
                problems.append(f"{folder.name}/{path.name}: no {stem}.log beside it")
            elif suffix == ".expect" and not stem.startswith("fires"):
                problems.append(f"{folder.name}/{path.name}: only fires cases take expectations")
            elif suffix == ".log" and known_bug(path):
                header = physical_lines(str(path))[0]
                if list(read_facts(candidate_lines([(1, header)]))):
                    problems.append(f"{folder.name}/{path.name}: its KNOWN-BUG line reads as a log line; reword it")
    assert not problems, "\n".join(problems)


# ---- the shared corpus of real logs ------------------------------------------------------------

def corpus_params() -> list:
    logs = sorted(CORPUS.glob("*/*.log")) if CORPUS.is_dir() else []
    if not logs:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"shared corpus ({CORPUS}) is absent"))]
    return [pytest.param(log, id=f"{log.parent.name}/{log.name[:3]}") for log in logs]


def corpus_report(log: Path) -> dict:
    smi = log.with_name(log.name[: -len(".log")] + ".smi.csv")
    return report_of(str(log), smi=str(smi) if smi.exists() else None)


_CRASH = re.compile(r"Traceback \(most recent call last\)|\b\w+(?:Error|Exception): |(?:CUDA|HIP|NPU|XPU) out of memory\."
                    r"|hit an exception|EngineCore failed to start|Not enough memory\.|No available memory for the cache"
                    r"|is larger than the maximum number of tokens|less than desired GPU memory utilization")
_READY = re.compile(r"ready to roll|Application startup complete|init engine \(profile, create kv cache, warmup model\)")


def crashed(log: Path) -> bool:
    """A start-up that crashed: a traceback, exception or out-of-memory line, and no ready line."""
    lines = physical_lines(str(log))
    return any(_CRASH.search(l) for l in lines) and not any(_READY.search(l) for l in lines)


@pytest.mark.parametrize("log", corpus_params())
def test_corpus_evidence_is_in_the_log(log: Path):
    rep = corpus_report(log)
    smi = log.with_name(log.name[: -len(".log")] + ".smi.csv")
    sources = {"log": str(log), "nvidia-smi": str(smi) if smi.exists() else None}
    problems = [f"{f['name']}: {p}" for f in rep["findings"] for p in unreal_evidence(f["evidence"], sources)]
    assert not problems, f"{log.name}: findings cite what the log does not hold:\n" + "\n".join(problems)


@pytest.mark.parametrize("log", corpus_params())
def test_corpus_crash_is_reported(log: Path):
    if not crashed(log):
        pytest.skip("the start-up did not crash")
    rep = corpus_report(log)
    # one failure, one finding: startup-failed, or the figured finding that names the same cause,
    # and the report opens with it
    opened = rep["summary"]
    assert opened["outcome"] in ("failed", "stopped") and opened["finding"] in {f["code"] for f in rep["findings"]}, \
        f"{log.name}: crashed, but findings are {summary(rep)}"


@pytest.mark.parametrize("log", corpus_params())
def test_corpus_unstated_fraction_is_reported(log: Path):
    truth = log.with_name(log.name[: -len(".log")] + ".truth.json")
    if log.parent.name != "sglang" or not truth.exists():
        pytest.skip("not an SGLang log with a truth file")
    if json.loads(truth.read_text(encoding="utf-8")).get("mem_fraction_static") is not None:
        pytest.skip("truth states mem_fraction_static")
    rep = corpus_report(log)
    assert "mem-fraction-unstated" in {f["name"] for f in rep["findings"]}, \
        f"{log.name}: mem_fraction_static is not in the log, but findings are {summary(rep)}"
