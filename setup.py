"""The one thing pyproject.toml cannot say: the optional compiled traffic scanner.

`optional=True`: where no C compiler is found (or the build fails), setuptools warns and installs
capdiag without it, and capdiag reads traffic lines with its Python path (capdiag/scanner.py says
which path a run takes: `capdiag --version --verbose`).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("capdiag._scan", ["capdiag/_scan.c"], optional=True)])
