"""What pyproject.toml cannot say: the optional compiled traffic scanner.

Its wording matchers are generated at build time from capdiag/traffic_shapes.py (the same
declarations the Python path compiles to regular expressions), into _scan_wordings.h in the
build's temporary folder. `optional=True`: where no C compiler is found or the build fails,
setuptools warns and installs capdiag without it, and capdiag reads traffic lines with its
Python path (`capdiag --version --verbose` says which).
"""
import importlib.util
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _shapes():
    """capdiag/traffic_shapes.py by its path: the build environment has no capdiag to import."""
    spec = importlib.util.spec_from_file_location("_capdiag_traffic_shapes", os.path.join(HERE, "capdiag", "traffic_shapes.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


class BuildWithWordings(build_ext):
    def build_extension(self, ext):
        folder = os.path.join(self.build_temp, "wordings")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "_scan_wordings.h"), "w", encoding="ascii") as header:
            header.write(_shapes().c_source())
        ext.include_dirs = [folder, *ext.include_dirs]
        super().build_extension(ext)


setup(ext_modules=[Extension("capdiag._scan", ["capdiag/_scan.c"], optional=True)],
      cmdclass={"build_ext": BuildWithWordings})
