"""`--what-if`: the start-up re-sized under changed settings (projection.py)."""
