from capdiag.launcher import run

run()
