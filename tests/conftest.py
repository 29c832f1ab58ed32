"""pytest set-up: keep hypothesis's cache inside tests/ (it is git-ignored there too)."""
from pathlib import Path

from hypothesis import configuration

configuration.set_hypothesis_home_dir(str(Path(__file__).resolve().parent / ".hypothesis"))
