from capdiag.cli import run

run()
