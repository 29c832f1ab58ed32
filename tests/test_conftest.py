"""The suite's own set-up: on a clone without ../shared, a test over the shared corpus says why
it did not run, rather than pytest's "got empty parameter set"."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_a_test_over_an_absent_corpus_is_skipped_saying_so(tmp_path):
    clone = tmp_path / "clone" / "main" / "tests"  # ../shared beside `main` does not exist
    clone.mkdir(parents=True)
    for name in ("conftest.py", "helpers.py"):
        shutil.copy(TESTS / name, clone / name)
    (clone / "test_over_corpus.py").write_text(
        "import pytest\nfrom helpers import corpus_logs\n\n"
        "@pytest.mark.parametrize('log', corpus_logs())\ndef test_each(log):\n    assert log\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(clone)],
                          cwd=clone, capture_output=True, text=True, timeout=120)
    assert "1 skipped" in done.stdout, done.stdout + done.stderr
    assert f"shared corpus ({tmp_path / 'clone' / 'shared'}) is absent: no cases to run" in done.stdout
    assert "got empty parameter set" not in done.stdout
