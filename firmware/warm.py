"""Compile every firmware kernel the daemon calls, once, into Numba's on-disk cache
(`cache=True`): `make` runs this after the build (and whenever firmware/ changes), so that a
daemon on a fresh clone starts in seconds and its first compute command does not stall on
compilation.

Numba keys a cached function on its own file only: a cached entry point (firmware/entry.py)
would keep the old code of a kernel edited in another module.  So the cache is dropped
whenever any firmware source differs from the one it was built from.

    python -m firmware.warm
"""

from __future__ import annotations

import hashlib
import pathlib
import time

import numpy as np

from firmware.prefix_hash import hash_chain
from firmware.quant import dequantize, quantize

# every scheme kind, element type and code path the daemon's compute commands reach
SCHEMES = ("int8_g64", "int4_g64", "int8_g32_sym", "int4_g128_sym", "kivi4_g32_r128",
           "kivi8_g64_r128", "fp8_tensor", "fp8_head")
CARRIERS = {"fp16": np.uint16, "bf16": np.uint16, "fp32": np.float32}


HERE = pathlib.Path(__file__).resolve().parent
CACHE = HERE / "__pycache__"
SOURCES_STAMP = CACHE / "warm-sources.sha256"


def sources_digest() -> str:
    h = hashlib.sha256()
    for f in sorted(HERE.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def drop_stale_cache() -> bool:
    """Remove Numba's cached code when the firmware's sources changed since it was built;
    True if it did."""
    digest = sources_digest()
    if SOURCES_STAMP.exists() and SOURCES_STAMP.read_text() == digest:
        return False
    for f in list(CACHE.glob("*.nbi")) + list(CACHE.glob("*.nbc")):
        f.unlink()
    CACHE.mkdir(exist_ok=True)
    SOURCES_STAMP.write_text(digest)
    return True


def warm() -> float:
    t0 = time.perf_counter()
    drop_stale_cache()
    import firmware.entry  # noqa: F401  (the C entry points compile at import)

    rng = np.random.default_rng(0)
    for dtype, carrier in CARRIERS.items():
        x = rng.standard_normal((160, 2, 2, 2, 64)).astype(np.float32)
        if carrier is np.uint16:
            x = (x.astype(np.float16).view(np.uint16) if dtype == "fp16"
                 else (x.view(np.uint32) >> 16).astype(np.uint16))
        for scheme in SCHEMES:
            dequantize(quantize(x, dtype, scheme))
    keys = np.zeros((2, 16), np.uint8)
    hash_chain(np.arange(32, dtype=np.uint32), 16, np.zeros(16, np.uint8), keys)
    return time.perf_counter() - t0


if __name__ == "__main__":
    print(f"firmware kernels compiled and cached in {warm():.1f} s")
