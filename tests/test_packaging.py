"""The published package's metadata and contents, read from pyproject.toml (`.ci/run` builds the
sdist and wheel with `python -m build` and runs the example from each in a fresh virtualenv)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import capdiag
from helpers import TESTS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = TESTS.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_metadata_is_complete_and_agrees_with_the_code():
    meta = PROJECT["project"]
    assert meta["version"] == capdiag.__version__
    assert meta["license"] == "Apache-2.0" and (ROOT / "LICENSE").read_text(encoding="utf-8").lstrip() \
        .startswith("Apache License")
    assert meta["authors"] and meta["keywords"] and meta["readme"] == "README.md"
    assert meta["urls"]["Homepage"] == meta["urls"]["Repository"] == capdiag.PROJECT_URL
    assert meta["urls"]["Rules reference"] == capdiag.RULES_DOC_URL
    lowest = int(meta["requires-python"].removeprefix(">=3."))
    versions = sorted(int(c.rsplit(".", 1)[1]) for c in meta["classifiers"]
                      if c.startswith("Programming Language :: Python :: 3.") and c.count("::") == 2)
    assert versions[0] == lowest and versions == list(range(lowest, versions[-1] + 1))
    assert not [c for c in meta["classifiers"] if c.startswith("License ::")]  # the SPDX license says it
    module, _, function = meta["scripts"]["capdiag"].partition(":")
    assert callable(getattr(importlib.import_module(module), function))  # the installed command resolves


def test_every_data_file_is_shipped():
    setuptools = PROJECT["tool"]["setuptools"]
    folders = {package: ROOT / path for package, path in setuptools["package-dir"].items()}
    for package, patterns in setuptools["package-data"].items():
        base = folders[package]
        shipped = {p for pattern in patterns for p in base.glob(pattern)}
        # the package's own folder and its data folders (sub-packages are checked as packages below)
        # (C sources are setup.py's extension's, built into the wheel; .so/.pyd their build)
        data = {p for p in base.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc", ".c", ".so", ".pyd")
                and (p.parent == base or p.parent.name in ("templates", "examples"))}
        assert data <= shipped, sorted(str(p.relative_to(ROOT)) for p in data - shipped)
    packages = set(setuptools["packages"])
    for package, base in folders.items():
        for init in base.rglob("__init__.py"):
            dotted = ".".join([package, *init.parent.relative_to(base).parts])
            assert dotted in packages, dotted


def test_every_c_source_is_an_extension_of_setup_py():
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    sources = sorted(str(p.relative_to(ROOT)) for p in ROOT.joinpath("capdiag").rglob("*.c"))
    assert sources and all(f'"{source}"' in setup for source in sources)
    assert "optional=True" in setup  # no compiler: the Python path, not a failed install
