"""cffi builder of ssdemu_wire._ring: the queue-pair layout (c/wire/sde_queue.h, whose CDEF
block is the one definition) and the ring functions (c/wire/sde_ring.c).  No liburing, no
daemon: what a client needs to talk to a drive.  Here rather than in c/cffi_build.py so that
the client's own distribution (clients/python) builds it alone."""

import pathlib
import sys

C = pathlib.Path(__file__).resolve().parent.parent / "c"
sys.path.insert(0, str(C))
from cffi_common import WIRE, builder  # noqa: E402  (c/ is not a package)

ffibuilder = builder("ssdemu_wire._ring", WIRE)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
