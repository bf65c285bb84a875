"""cffi builder of ssdemu_wire._ring: the queue-pair layout (c/sde_queue.h, whose CDEF block
is the one definition) and the ring functions (c/sde_ring.c).  No liburing, no daemon: what a
client needs to talk to a drive."""

import os
import pathlib

from cffi import FFI

C = pathlib.Path(__file__).resolve().parent.parent / "c"


def cdef_block(header_text: str) -> str:
    start = header_text.index("/* CDEF-BEGIN */") + len("/* CDEF-BEGIN */")
    return header_text[start:header_text.index("/* CDEF-END */")]


ffibuilder = FFI()
ffibuilder.cdef(cdef_block((C / "sde_queue.h").read_text()))
ffibuilder.set_source(
    "ssdemu_wire._ring",
    '#include "sde_queue.h"',
    # relative to where setuptools runs the build (the project root)
    sources=[os.path.relpath(C / "sde_ring.c")],
    include_dirs=[str(C)],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
