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
    _warm_retrieval(rng)
    return time.perf_counter() - t0


def _warm_retrieval(rng) -> None:
    """TOPK_PAGES and ATTEND's kernels (ssdemu/device/retrieval.py calls these), and the
    element conversions they read blocks with."""
    from firmware import retrieval as R
    from firmware.convert import bf16_to_f32, fp16_to_f32

    src = np.zeros(8, np.uint16)
    fp16_to_f32(src, np.empty(8, np.float32))
    bf16_to_f32(src, np.empty(8, np.float32))
    H, T, D, page, k = 2, 40, 16, 16, 2
    keys = rng.standard_normal((H, T, D)).astype(np.float32)
    q = rng.standard_normal((2 * H, D)).astype(np.float32)
    P = R.pages_of(T, page)
    lo, hi = np.empty((H, P, D), np.float32), np.empty((H, P, D), np.float32)
    R.page_bounds(keys, page, lo, hi)
    cmin, cmax = np.empty(lo.shape, np.int8), np.empty(lo.shape, np.int8)
    scales = np.empty((H, P), np.float32)
    R.bounds_to_int8(lo, hi, cmin, cmax, scales)
    R.int8_to_bounds(cmin, cmax, scales, lo, hi)
    scores = np.empty((H, P), np.float32)
    R.quest_scores(q, lo, hi, scores)
    ids, sc = np.empty((H, k), np.int32), np.empty((H, k), np.float32)
    R.topk_pages(scores, k, 0, 0, ids, sc)
    R.rerank_pages(q, keys, page, ids, 1, ids[:, :1].copy(), sc[:, :1].copy())
    R.attend_pages(q, keys, keys, page, ids, np.empty((2 * H, D), np.float32),
                   np.empty(2 * H, np.float32))


if __name__ == "__main__":
    print(f"firmware kernels compiled and cached in {warm():.1f} s")
