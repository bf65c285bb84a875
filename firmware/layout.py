"""The KV block: what the drive stores for a run of tokens.

A block is a C-ordered array of shape (tokens, 2, layers, kv_heads, head_dim): for each token,
K then V, each layer, each KV head, head_dim elements.  Elements are fp16 or bf16 (carried as
uint16 bit patterns: Numba has no CPU float16 array type) or fp32.  Byte size =
tokens * 2 * layers * kv_heads * head_dim * element bytes, little-endian, no padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# dtype codes as stored in compressed block headers: part of the wire format
from ssdemu_wire.codes import (  # noqa: F401  (re-exported for the firmware)
    DTYPE_BF16,
    DTYPE_CODES,
    DTYPE_FP16,
    DTYPE_FP32,
    DTYPE_NAMES,
    dtype_code,
)

ELEMENT_BYTES = {DTYPE_FP16: 2, DTYPE_BF16: 2, DTYPE_FP32: 4}


def storage_dtype(code: int) -> np.dtype:
    """The numpy dtype a block of this element type is carried in."""
    return np.dtype(np.float32) if code == DTYPE_FP32 else np.dtype(np.uint16)


@dataclass(frozen=True)
class KVShape:
    tokens: int
    layers: int
    kv_heads: int
    head_dim: int

    def __post_init__(self):
        for name in ("tokens", "layers", "kv_heads", "head_dim"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"KV shape {name} must be a positive integer, got {v!r}")

    @property
    def array_shape(self) -> tuple[int, int, int, int, int]:
        return (self.tokens, 2, self.layers, self.kv_heads, self.head_dim)

    @property
    def elements(self) -> int:
        return self.tokens * 2 * self.layers * self.kv_heads * self.head_dim

    @property
    def per_token_per_kv(self) -> int:
        """Elements of K (or V) for one token: layers * kv_heads * head_dim."""
        return self.layers * self.kv_heads * self.head_dim

    def nbytes(self, dtype: int) -> int:
        return self.elements * ELEMENT_BYTES[dtype]
