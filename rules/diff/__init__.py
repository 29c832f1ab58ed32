"""`capdiag diff`: the rules that compare two start-ups (rules.py) and the driver that feeds them
both analyses (driver.py)."""
