"""Files shipped inside the package: templates and references (grammars: capdiag.parsing.lalr).

The repository keeps `grammar/`, `rules/` and `references/` at its top level; the build maps
them to `capdiag.grammar`, `capdiag.rules` and `capdiag.references` so a wheel carries them.
"""
from __future__ import annotations

import json
import sys
from functools import lru_cache
from typing import Any


def toml_reader() -> Any:
    """Python's TOML reader (tomli before 3.11), imported when first needed: a start-up that
    did not fail, read without a policy, reads no TOML."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib


@lru_cache(maxsize=None)
def reference_toml(name: str) -> Any:
    return toml_reader().loads(_reference_text(name))


@lru_cache(maxsize=None)
def reference_json(name: str) -> Any:
    return json.loads(_reference_text(name))


def _reference_text(name: str) -> str:
    # importlib.resources is loaded only when a reference is read (a small log reads none)
    from importlib import resources

    return resources.files("capdiag.references").joinpath(name).read_text(encoding="utf-8")
