"""Shared helpers for the capdiag test suite.

The shared real-log corpus lives next to the repository (`../shared`); tests that need it are
skipped when it is absent (CI may not have it).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs
import pytest

from capdiag.parsing.literal import Call, Elided

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
