"""Compile every firmware kernel the daemon calls, once, into Numba's on-disk cache
(`cache=True`): `make` runs this after the build, so that a daemon on a fresh clone starts in
seconds and its first quantized command does not stall on compilation.

    python -m firmware.warm
"""

from __future__ import annotations

import time

import numpy as np

from firmware.prefix_hash import hash_chain
from firmware.quant import dequantize, quantize

# every scheme kind, element type and code path the daemon's compute commands reach
SCHEMES = ("int8_g64", "int4_g64", "int8_g32_sym", "int4_g128_sym", "kivi4_g32_r128",
           "kivi8_g64_r128", "fp8_tensor", "fp8_head")
CARRIERS = {"fp16": np.uint16, "bf16": np.uint16, "fp32": np.float32}


def warm() -> float:
    t0 = time.perf_counter()
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
