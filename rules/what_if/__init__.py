"""`--what-if`: the start-up re-sized under changed settings (projection.py), and the
counterfactual run that re-runs every rule on it and compares the findings (counterfactual.py)."""
