# The wire format's ring functions (c/wire/sde_queue.h, c/wire/sde_ring.c), built by cffi.
from setuptools import setup

setup(cffi_modules=["ssdemu_wire/build_ring.py:ffibuilder"])
