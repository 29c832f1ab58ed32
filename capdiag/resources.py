"""Files shipped inside the package: templates and references (grammars: capdiag.parsing.lalr).

The repository keeps `grammar/`, `rules/` and `references/` at its top level; the build maps
them to `capdiag.grammar`, `capdiag.rules` and `capdiag.references` so a wheel carries them.
"""
from __future__ import annotations

import json
import sys
from functools import lru_cache
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@lru_cache(maxsize=None)
def reference_toml(name: str) -> Any:
    return tomllib.loads(resources.files("capdiag.references").joinpath(name).read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def reference_json(name: str) -> Any:
    return json.loads(resources.files("capdiag.references").joinpath(name).read_text(encoding="utf-8"))
