"""Derivation rules: what the facts mean — the memory breakdown, the KV pool, the configuration
in force, the GPU, the ranks, the failure's phase and cause. They conclude values, not findings;
each docstring holds the formula it applies."""
