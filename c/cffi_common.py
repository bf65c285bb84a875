"""What every cffi builder of c/ shares: the folders on the include path, the compiler flags,
the CDEF blocks of the headers (each C header the one definition of its ABI), one builder.
No check of the machine here: the client's own distribution builds its ring module from this
without liburing (ssdemu_wire/build_ring.py)."""

import os
import pathlib

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent
# one folder per responsibility; every folder is on the include path, so a file includes a
# header by its name alone
FOLDERS = ("common", "wire", "engine", "model", "store", "fw", "dev", "tools")
COMPILE_ARGS = ["-O2", "-flto=auto", "-fvisibility=hidden", "-std=gnu11", "-Wall", "-Wextra",
                "-Wno-unused-parameter",
                # a call without a prototype returns an int: never let one through
                "-Werror=implicit-function-declaration"]

WIRE = {"headers": ["wire/sde_queue.h", "wire/sde_copy.h"],
        "sources": ["wire/sde_ring.c", "wire/sde_copy.c"]}


def cdef_block(header_text: str) -> str:
    """The part of the header between CDEF-BEGIN and CDEF-END, for cffi to parse."""
    start = header_text.index("/* CDEF-BEGIN */") + len("/* CDEF-BEGIN */")
    end = header_text.index("/* CDEF-END */")
    return header_text[start:end]


def builder(module: str, parts: dict, prelude: str = "", **kw) -> FFI:
    ffi = FFI()
    headers = [HERE / h for h in parts["headers"]]
    ffi.cdef(prelude + "".join(cdef_block(h.read_text()) for h in headers))
    ffi.set_source(
        module,
        # the headers the declarations came from, so that the wrappers see every prototype
        "".join(f'#include "{h.name}"\n' for h in headers),
        # relative to the project root, where setuptools runs the build
        sources=[os.path.relpath(HERE / s) for s in parts["sources"]],
        include_dirs=[str(HERE / f) for f in FOLDERS],
        # hidden: only the module's init is exported, so that calls between the C files (the
        # timing model's per-die bookings into the gap lists, 60M a replay) are direct, not
        # through the PLT
        extra_compile_args=COMPILE_ARGS,
        # link-time optimization: the layers' files are one job each, and the calls between
        # them on the hot paths (a command's start, its completion, the model's bookings)
        # inline across files as they did when each layer was one file
        extra_link_args=["-O2", "-flto=auto", "-fvisibility=hidden"],
        **kw,
    )
    return ffi
