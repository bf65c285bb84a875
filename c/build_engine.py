"""cffi builder for the C layer (API mode, linked against the system liburing): the io_uring
engine, the queue-pair rings and the device core.

The declarations given to cffi are the CDEF blocks of the headers themselves, so each C header
stays the one definition of its ABI.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent
HEADERS = [HERE / name for name in ("sde_engine.h", "sde_queue.h", "sde_model.h", "sde_store.h",
                                    "sde_budget.h", "sde_recipe.h", "sde_fw.h", "sde_fault.h",
                                    "sde_undo.h", "sde_dev.h", "sde_client_loop.h")]
SOURCES = ["sde_engine.c", "sde_ring.c", "sde_dev.c", "sde_client_loop.c", "sde_model.c",
           "sde_store.c", "sde_hash_avx2.c", "sde_budget.c", "sde_fw.c", "sde_fault.c",
           "sde_undo.c", "sde_gaps.c", "sde_ftl.c", "sde_recipe.c"]
MISSING_LIBURING = (
    "ssdemu: liburing headers not found: install them with 'apt-get install liburing-dev'"
)


def cdef_block(header_text: str) -> str:
    """The part of the header between CDEF-BEGIN and CDEF-END, for cffi to parse."""
    start = header_text.index("/* CDEF-BEGIN */") + len("/* CDEF-BEGIN */")
    end = header_text.index("/* CDEF-END */")
    return header_text[start:end]


def have_liburing() -> bool:
    """True when a C compiler can include <liburing.h> and link -luring."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return pathlib.Path("/usr/include/liburing.h").exists()
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp, "probe.c")
        src.write_text(
            "#include <liburing.h>\nint main(void){struct io_uring r;"
            "return io_uring_queue_init(1,&r,0);}\n"
        )
        probe = subprocess.run(
            [cc, str(src), "-o", str(pathlib.Path(tmp, "probe")), "-luring"],
            capture_output=True,
        )
        return probe.returncode == 0


ffibuilder = FFI()
# struct iovec comes from <sys/uio.h>; cffi learns its layout from the compiler ("...").
ffibuilder.cdef(
    "struct iovec { void *iov_base; size_t iov_len; ...; };\n"
    + "".join(cdef_block(h.read_text()) for h in HEADERS)
)
ffibuilder.set_source(
    "ssdemu._engine",
    # the headers the declarations came from, so that the wrappers see every prototype
    "".join(f'#include "{h.name}"\n' for h in HEADERS),
    # relative to the project root, where setuptools runs the build
    sources=[os.path.relpath(HERE / name) for name in SOURCES],
    include_dirs=[str(HERE)],
    libraries=["uring"],
    # hidden: only the module's init is exported, so that calls between the C files (the
    # timing model's per-die bookings into the gap lists, 60M a replay) are direct, not
    # through the PLT
    extra_compile_args=["-O2", "-fvisibility=hidden", "-std=gnu11", "-Wall", "-Wextra",
                        "-Wno-unused-parameter",
                        # a call without a prototype returns an int: never let one through
                        "-Werror=implicit-function-declaration"],
)

if not have_liburing():
    # setuptools shows this one line and stops the build
    sys.exit(MISSING_LIBURING)
# the store's content hash (XXH3, header-only: c/sde_store.c includes it inline)
if not any(pathlib.Path(d, "xxhash.h").exists() for d in ("/usr/include", "/usr/local/include")):
    sys.exit("ssdemu: xxhash.h not found: install it with 'apt-get install libxxhash-dev'")

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
