# The C layers are built from c/ by cffi (API mode): the device's engine, and the wire
# format's ring functions that clients use; everything else is in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["c/build_engine.py:ffibuilder", "ssdemu_wire/build_ring.py:ffibuilder"])
