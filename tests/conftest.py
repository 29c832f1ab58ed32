"""pytest set-up: keep hypothesis's cache inside tests/ (it is git-ignored there too), give every
test the width of a CI log whatever runs it, and say why a test over the shared corpus did not
run."""
from pathlib import Path

import pytest
from hypothesis import configuration

from helpers import SHARED

configuration.set_hypothesis_home_dir(str(Path(__file__).resolve().parent / ".hypothesis"))

_EMPTY = "got empty parameter set"


def pytest_collection_modifyitems(items):
    """A test parametrized over the shared corpus has no cases on a clone without ../shared:
    pytest would skip it as "got empty parameter set", which says nothing about why. Where
    ../shared is there, an empty parameter set keeps pytest's own reason."""
    if SHARED.is_dir():
        return
    for item in items:
        skip = item.get_closest_marker("skip")
        if skip is not None and str(skip.kwargs.get("reason", "")).startswith(_EMPTY):
            item.add_marker(pytest.mark.skip(reason=f"shared corpus ({SHARED}) is absent: no cases to run"),
                            append=False)


@pytest.fixture(autouse=True)
def _no_terminal_width(monkeypatch):
    """Reports are laid out to COLUMNS; a test sees it unset (a CI log, 100 columns) unless it sets
    it. pytest-xdist hands its workers the controller's terminal width as COLUMNS, and a developer's
    shell may export one: without this, what a test reads would depend on who runs it."""
    monkeypatch.delenv("COLUMNS", raising=False)
