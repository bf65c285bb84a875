# The C engine is built from c/ by cffi (API mode); everything else is in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["c/build_engine.py:ffibuilder"])
