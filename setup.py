# The C layers are built from c/ by cffi (API mode), one module per layer (c/cffi_build.py
# says what each holds), and the wire format's ring functions that clients use; everything
# else is in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["c/cffi_build.py:device", "c/cffi_build.py:model",
                    "c/cffi_build.py:client_loop", "c/cffi_build.py:engine_bench",
                    "ssdemu_wire/build_ring.py:ffibuilder"])
