# The wire format's ring functions (c/sde_queue.h, c/sde_ring.c), built by cffi.
from setuptools import setup

setup(cffi_modules=["ssdemu_wire/build_ring.py:ffibuilder"])
