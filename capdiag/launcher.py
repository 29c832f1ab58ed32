"""The `capdiag` command's entry point: `capdiag --version` is answered before the CLI, and all
it imports to analyse a log, is loaded (tests/test_startup.py keeps the answer click's)."""
import sys


def run() -> None:
    if sys.argv[1:] == ["--version"]:
        _version()
        return
    from capdiag.cli import run as cli_run

    cli_run()


def _version() -> None:
    """The version line; an output that cannot take it ends as the CLI's do (capdiag.cli.run):
    quietly for a reader that went away, one line and exit code 2 for a full disk or EIO."""
    from capdiag import __version__
    from capdiag.errors import output_failed, reader_gone

    if sys.stdout is None:  # started with stdout closed (`>&-`): as capdiag.cli._write says
        print("capdiag: error: standard output is closed", file=sys.stderr)
        sys.exit(2)
    try:
        print(f"capdiag, version {__version__}")
        sys.stdout.flush()
    except BrokenPipeError:
        reader_gone()
    except OSError as exc:
        output_failed(exc)
