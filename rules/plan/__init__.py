"""`capdiag plan`: the worksheet's rules (rules.py) and the driver that builds their inputs from
the request and runs them (driver.py)."""
