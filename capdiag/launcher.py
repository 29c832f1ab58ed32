"""The `capdiag` command's entry point: `capdiag --version` is answered before the CLI, and all
it imports to analyse a log, is loaded (tests/test_startup.py keeps the answer click's)."""
import sys


def run() -> None:
    if sys.argv[1:] == ["--version"]:
        from capdiag import __version__

        print(f"capdiag, version {__version__}")
        return
    from capdiag.cli import run as cli_run

    cli_run()
