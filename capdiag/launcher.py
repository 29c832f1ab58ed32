"""The `capdiag` command's entry point: `capdiag --version` is answered before the CLI, and all
it imports to analyse a log, is loaded (tests/test_startup.py keeps the answer click's).
`capdiag --version --verbose` adds which readers this installation has: the compiled traffic
scanner or its Python path, and the `fast` extra's libraries."""
import sys


def run() -> None:
    if sys.argv[1:] == ["--version"]:
        _version()
        return
    if sorted(sys.argv[1:]) == ["--verbose", "--version"]:
        _version(verbose=True)
        return
    from capdiag.cli import run as cli_run

    cli_run()


def _readers() -> list[str]:
    from importlib.util import find_spec

    from capdiag.scanner import loaded

    extras = [f"{name}: {'installed' if find_spec(name) else 'not installed'}" for name in ("hyperscan", "numpy")]
    return [f"traffic scanner: {loaded()[1]}", *extras]


def _version(verbose: bool = False) -> None:
    """The version line; an output that cannot take it ends as the CLI's do (capdiag.cli.run):
    quietly for a reader that went away, one line and exit code 2 for a full disk or EIO."""
    from capdiag import __version__
    from capdiag.errors import output_failed, reader_gone

    if sys.stdout is None:  # started with stdout closed (`>&-`): as capdiag.cli._write says
        print("capdiag: error: standard output is closed", file=sys.stderr)
        sys.exit(2)
    try:
        print(f"capdiag, version {__version__}")
        if verbose:
            print("\n".join(_readers()))
        sys.stdout.flush()
    except BrokenPipeError:
        reader_gone()
    except OSError as exc:
        output_failed(exc)
