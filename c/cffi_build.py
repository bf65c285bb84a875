"""The cffi modules built from c/ (API mode), one per layer, and what each is made of.

- `ssdemu.device._device`: what `ssdemu serve` runs: the io_uring engine (liburing), the
  device core and its data plane, the store, the firmware's C entry, and the timing model it
  books commands on.
- `ssdemu.sim._model`: the timing model alone (resources, NAND, FTL, write cache, the TOPS
  budget, the command recipes): no liburing, so that model-mode replay, `bench device` and
  sweeps run on any machine with a C compiler.
- `ssdemu.bench._client_loop`: the client side of `bench queue` and `bench kv`, a tool above
  both the device and the client library: the ring functions and the latency buckets.
- `ssdemu.bench._engine_bench`: `bench io`'s closed loop on an engine's ring (c/tools), with
  its own copy of the engine, so that the device's module carries no benchmark.
- `ssdemu_wire._ring` (built by ssdemu_wire/build_ring.py, so that the client's own
  distribution builds it): the queue layout and ring functions.

The declarations given to cffi are the CDEF blocks of the headers themselves, so each C header
stays the one definition of its ABI.  setup.py names the builders below.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from cffi_common import WIRE, builder  # noqa: E402  (c/ is not a package)

MISSING_LIBURING = (
    "ssdemu: liburing headers not found: install them with 'apt-get install liburing-dev'"
)
# the timing model, one file per responsibility (c/model/model_private.h joins them)
MODEL_PARTS = ("core", "helper", "bulk", "batch", "nand", "ftl", "commands", "cache", "fixed",
               "loop", "life")
MODEL = {"headers": ["model/sde_model.h", "model/sde_kinds.h", "model/sde_budget.h",
                     "model/sde_recipe.h", "model/sde_segmap.h"],
         "sources": [*(f"model/model_{part}.c" for part in MODEL_PARTS), "model/sde_ftl.c",
                     "model/sde_segmap.c", "model/sde_gaps.c", "model/sde_budget.c",
                     "model/sde_recipe.c"]}
# the device core, one file per responsibility (c/dev/dev_internal.h joins them)
DEV_PARTS = ("finish", "bounce", "ctx", "args", "timing", "media", "kinds", "ops", "journal",
             "pins", "block", "counters", "kv", "compute", "faults", "loop", "core")
# the store (c/store/store_private.h joins them)
STORE_PARTS = ("io", "index", "alloc", "records", "journal", "checkpoint", "open", "kv", "api")
DEVICE = {"headers": ["common/sde_spin.h", "engine/sde_hist.h", "engine/sde_engine.h",
                      "wire/sde_queue.h",
                      *MODEL["headers"], "store/sde_store.h", "fw/sde_fw.h",
                      "dev/sde_fault.h", "dev/sde_undo.h", "dev/sde_dev.h"],
          "sources": ["engine/sde_hist.c", "engine/sde_engine.c", *WIRE["sources"],
                      *MODEL["sources"], *(f"store/store_{part}.c" for part in STORE_PARTS),
                      "store/sde_hash_avx2.c",
                      "fw/sde_fw.c", "dev/sde_fault.c", "dev/sde_undo.c",
                      *(f"dev/dev_{part}.c" for part in DEV_PARTS)]}
CLIENT_LOOP = {"headers": ["engine/sde_hist.h", "wire/sde_queue.h", "tools/sde_client_loop.h"],
               "sources": ["engine/sde_hist.c", "wire/sde_ring.c", "tools/sde_client_loop.c"]}
ENGINE_BENCH = {"headers": ["engine/sde_hist.h", "engine/sde_engine.h",
                            "tools/sde_engine_bench.h"],
                "sources": ["engine/sde_hist.c", "engine/sde_engine.c",
                            "tools/sde_engine_bench.c"]}


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


model = builder("ssdemu.sim._model", MODEL)
client_loop = builder("ssdemu.bench._client_loop", CLIENT_LOOP)
# struct iovec comes from <sys/uio.h>; cffi learns its layout from the compiler ("...").
# sde_fw_load_python: ssdemu/device/daemon.py's loader of the firmware's entry points, which
# the C side calls on the first compute command (c/fw/sde_fw.h, sde_fw_set_loader)
engine_bench = builder("ssdemu.bench._engine_bench", ENGINE_BENCH,
                       prelude="struct iovec { void *iov_base; size_t iov_len; ...; };\n",
                       libraries=["uring"])
device = builder("ssdemu.device._device", DEVICE,
                 prelude="struct iovec { void *iov_base; size_t iov_len; ...; };\n"
                         'extern "Python" int sde_fw_load_python(uint64_t *);\n',
                 libraries=["uring"])

if not have_liburing():
    # setuptools shows this one line and stops the build
    sys.exit(MISSING_LIBURING)
# the store's content hash (XXH3, header-only: c/store/store_private.h includes it inline)
if not any(pathlib.Path(d, "xxhash.h").exists() for d in ("/usr/include", "/usr/local/include")):
    sys.exit("ssdemu: xxhash.h not found: install it with 'apt-get install libxxhash-dev'")

if __name__ == "__main__":
    for ffi in (model, client_loop, engine_bench, device):
        ffi.compile(verbose=True)
