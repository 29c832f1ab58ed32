"""capdiag: where an LLM server's GPU memory went, from its start-up log.

    >>> import capdiag
    >>> report = capdiag.explain("sglang.log", gpu="h100_sxm")   # doctest: +SKIP

The API (docs/api.md) is imported on first use, so `import capdiag` stays light.
"""
from capdiag.errors import InputError

__version__ = "0.1.0"
# The project's home (pyproject.toml's [project.urls] says the same; a test keeps them equal).
PROJECT_URL = "https://github.com/capdiag/capdiag"
RULES_DOC_URL = PROJECT_URL + "/blob/main/docs/rules.md"
__all__ = ["explain", "gate", "plan", "diff", "explain_many", "Report", "InputError", "__version__"]
_API = {"explain", "gate", "plan", "diff", "explain_many", "Report", "GateResult", "Plan", "Diff", "Category",
        "Finding", "EvidenceLine", "Outcome"}


def __getattr__(name: str):
    if name in _API:
        from capdiag import api

        return getattr(api, name)
    raise AttributeError(f"module 'capdiag' has no attribute {name!r}")
