"""Codes and packings a client and the drive agree on outside the SQE itself: KV element
dtypes (as stored in compressed block headers) and 16-byte prefix keys."""

from __future__ import annotations

import numpy as np

DTYPE_FP16 = 0
DTYPE_BF16 = 1
DTYPE_FP32 = 2
DTYPE_NAMES = {DTYPE_FP16: "fp16", DTYPE_BF16: "bf16", DTYPE_FP32: "fp32"}
DTYPE_CODES = {v: k for k, v in DTYPE_NAMES.items()}


def dtype_code(name: str) -> int:
    try:
        return DTYPE_CODES[name]
    except KeyError:
        raise ValueError(f"unknown KV dtype {name!r}: expected fp16, bf16 or fp32") from None


def keys_array(keys) -> np.ndarray:
    """16-byte keys (bytes, a list of them, or uint8[n, 16]) -> uint64[n, 2] (lo, hi)."""
    if isinstance(keys, (bytes, bytearray)):
        keys = [bytes(keys)]
    if isinstance(keys, np.ndarray):
        if keys.dtype == np.uint64 and keys.ndim == 2 and keys.shape[1] == 2:
            return np.ascontiguousarray(keys)
        if keys.dtype != np.uint8 or keys.ndim != 2 or keys.shape[1] != 16:
            raise ValueError(f"key array must be uint8[n, 16] or uint64[n, 2], got "
                             f"{keys.dtype}{list(keys.shape)}")
        return np.ascontiguousarray(keys).view("<u8")
    for k in keys:
        if len(k) != 16:
            raise ValueError(f"prefix keys are 16 bytes, got {len(k)}")
    if not keys:
        return np.zeros((0, 2), np.uint64)
    return np.frombuffer(b"".join(keys), dtype="<u8").reshape(-1, 2).copy()
