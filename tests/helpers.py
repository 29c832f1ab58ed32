"""Shared helpers for the capdiag test suite.

The shared real-log corpus lives next to the repository (`../shared`); tests that need it are
skipped when it is absent (CI may not have it).
"""
from __future__ import annotations

import json
import math
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import attrs
import pytest

from capdiag import cli
from capdiag.analysis import analyse
from capdiag.parsing.literal import Call, Elided
from capdiag.render import render
from capdiag.report import build

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"
GRAMMAR_CASES = TESTS / "grammar_cases"
SHARED = Path(__file__).resolve().parents[2] / "shared"
SGLANG_CORPUS = SHARED / "corpus" / "sglang"

needs_shared = pytest.mark.skipif(not SGLANG_CORPUS.is_dir(), reason="shared corpus (../shared) is absent")


def corpus_logs(with_truth: bool = True) -> list[Path]:
    if not SGLANG_CORPUS.is_dir():
        return []
    logs = sorted(SGLANG_CORPUS.glob("*.log"))
    if with_truth:
        logs = [p for p in logs if p.with_name(p.name[: -len(".log")] + ".truth.json").exists()]
    return logs


def fixture(name: str) -> str:
    path = FIXTURES / name
    assert path.exists(), f"missing fixture {path}"
    return str(path)


def rank_tags(rank) -> dict[str, int]:
    """The rank tags a fact carries, without the absent ones."""
    return {k: v for k, v in attrs.asdict(rank).items() if v is not None}


def jsonable(value: Any) -> Any:
    """Literal-parser output in a form a JSON expectation can spell.

    Call -> {"__call__": name, **kwargs} (+ "__args__" when positional args exist),
    tuple -> {"__tuple__": [...]}, Elided -> "...", floats compare by value (inf/nan kept).
    """
    if isinstance(value, Call):
        out = {"__call__": value.name, **{k: jsonable(v) for k, v in value.kwargs.items()}}
        if value.args:
            out["__args__"] = [jsonable(a) for a in value.args]
        return out
    if isinstance(value, Elided):
        return "..."
    if isinstance(value, tuple):
        return {"__tuple__": [jsonable(v) for v in value]}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


def same(a: Any, b: Any) -> bool:
    """Exact equality that tells 1 from True and treats nan == nan."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def dump(value: Any) -> str:
    return json.dumps(value, default=repr, ensure_ascii=False)


def write_log(tmp_path: Path, text: str, name: str = "test.log") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# ---- the command line, in process --------------------------------------------------------------

def run_entry(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """capdiag.cli.run() in process, as the console script calls it: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["capdiag", *args])
    code = 0
    try:
        cli.run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


# ---- looking things up in a report (`capdiag explain --format json`) ----------------------------

def row(rep: dict, category: str):
    """The breakdown row of that category, or None."""
    return next((r for r in rep["breakdown"] if r["category"] == category), None)


def conc(rep: dict, tokens: int):
    """The concurrency entry for that request length (it must exist)."""
    return next(c for c in rep["concurrency"] if c["request_tokens"] == tokens)


def finding(rep: dict, name: str):
    """The finding of that rule, or None."""
    return next((f for f in rep["findings"] if f["rule"] == name), None)


def lines_of(r) -> list[int]:
    """The log lines a row or finding cites as evidence (not the command-line inputs it rests on)."""
    return [e["line"] for e in r["evidence"] if e["source"] == "log" and e["line"] != 0]


def check_breakdown_row(r: dict) -> None:
    """A breakdown row is measured/derived with a number, a derivation and evidence (each item a
    line number and its text), or unknown with a reason and no number."""
    assert r["status"] in ("measured", "derived", "unknown"), r
    if r["status"] == "unknown":
        assert r["gib"] is None and r["mib"] is None and r["derivation"], r
    else:
        assert isinstance(r["gib"], (int, float)) and r["mib"] == round(r["gib"] * 1024), r
        assert r["derivation"] and r["evidence"], r
        assert all(e["line"] >= 0 and e["text"] for e in r["evidence"]), r


# ---- grammar case files (tests/grammar_cases/, tests/vllm_cases/) -------------------------------

def case_params(cases) -> list:
    """pytest params (line, expect) from [(id, line, expect, xfail_reason)]; an xfail case is strict."""
    return [pytest.param(line, expect, id=case_id,
                         marks=[pytest.mark.xfail(strict=True, reason=xfail)] if xfail else [])
            for case_id, line, expect, xfail in cases]


def check_case_fact(parsed, expect: dict, values: dict) -> None:
    """One parsed fact against a case's EXPECT object.

    The class name and the rank tags must match exactly; every listed value must match exactly
    (a value the line does not print may be left out of the values or be None); `fields` (config
    records only) must all be there with exactly these values; `field_count` is how many fields
    were read.
    """
    assert parsed.cls.__name__ == expect["cls"], f"class: want {expect['cls']}, got {parsed.cls.__name__}"
    assert rank_tags(parsed.rank) == expect.get("rank", {}), f"rank: got {rank_tags(parsed.rank)}"
    for key, want in values.items():
        assert key in parsed.values or want is None, f"no value {key!r} in {sorted(parsed.values)}"
        got = jsonable(parsed.values.get(key))
        assert same(got, want), f"{key}: want {want!r}, got {got!r}"
    if "fields" in expect:
        fields = jsonable(parsed.values["fields"])
        for key, want in expect["fields"].items():
            assert key in fields, f"field {key!r} missing; have {sorted(fields)}"
            assert same(fields[key], want), f"field {key}: want {want!r}, got {fields[key]!r}"
    if "field_count" in expect:
        assert len(parsed.values["fields"]) == expect["field_count"], sorted(parsed.values["fields"])


def load_case_files(directory: Path) -> list[tuple]:
    """[(id, line, expect, xfail_reason)] for every case file in a folder, in file order.

    A case is `LINE: <line>` (or `LINE_JSON: "<json string>"`), then `EXPECT: <json>`; an
    `XFAIL: <reason>` line goes before the LINE it marks; blank and `#` lines are comments.
    """
    cases = []
    for path in sorted(directory.glob("*.txt")):
        line, xfail, line_no = None, None, 0
        for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if raw.startswith(("LINE: ", "LINE_JSON: ")):
                assert line is None, f"{path.name}:{n}: a LINE without its EXPECT before it"
                line = raw[len("LINE: "):] if raw.startswith("LINE: ") else json.loads(raw[len("LINE_JSON: "):])
                line_no = n
            elif raw.startswith("XFAIL: "):
                assert line is None, f"{path.name}:{n}: XFAIL goes before its LINE"
                xfail = raw[len("XFAIL: "):]
            elif raw.startswith("EXPECT: "):
                assert line is not None, f"{path.name}:{n}: EXPECT without LINE"
                cases.append((f"{path.stem}:{line_no}", line, json.loads(raw[len("EXPECT: "):]), xfail))
                line, xfail = None, None
            else:
                assert raw.strip() == "" or raw.startswith("#"), f"{path.name}:{n}: unknown line {raw!r}"
        assert line is None, f"{path.name}: the last LINE has no EXPECT"
        assert xfail is None, f"{path.name}: an XFAIL at the end has no case"
    return cases


# ---- the shared corpus, scored as ../shared/tools/corpus_check.py scores it -------------------

def corpus_id(path: Path) -> str:
    """A corpus log's test id: the number its name starts with."""
    return path.name.split("-")[0]


@lru_cache(maxsize=None)
def corpus_report(path: str) -> dict:
    """The JSON contract exactly as `capdiag explain --format json` prints it."""
    return json.loads(render(build(analyse(path)), "json"))


def truth_same(a, b) -> bool:
    """corpus_check.py's equality: numbers within 1e-9, strings without surrounding blanks."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, str) and isinstance(b, str):
        return a.strip() == b.strip()
    return a == b


def close(want, got, tol=0.011) -> bool:
    """`got` is a number (not a bool) within tol of want."""
    return isinstance(got, (int, float)) and not isinstance(got, bool) and abs(float(want) - float(got)) <= tol


def breakdown_gib(report: dict, category: str):
    """The GiB of that breakdown row, or None (no such row, no number, no breakdown)."""
    return next((r.get("gib") for r in report.get("breakdown") or [] if r.get("category") == category), None)


def max_concurrent(report: dict, tokens: int):
    """The max concurrency at that request length, or None."""
    return next((r.get("max_concurrent") for r in report.get("concurrency") or [] if r.get("request_tokens") == tokens),
                None)
