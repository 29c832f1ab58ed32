"""Finding rules, one per file: each raises one finding (a stable code and slug) or says why it
could not judge. The docstring is the rule's user documentation (`capdiag rules`)."""
