"""Reference data with sources, shipped as package data (installed as `capdiag.references`)."""
