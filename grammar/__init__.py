"""Lark grammars, shipped as package data of capdiag (installed as `capdiag.grammar`)."""
