"""pytest set-up: keep hypothesis's cache inside tests/ (it is git-ignored there too), and say
why a test over the shared corpus did not run."""
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
