"""The compressed KV block: a 64-byte self-describing header, then the scheme's sections.

Header (little-endian):

| offset | size | field |
|---|---|---|
| 0 | 4 | magic `SDKV` |
| 4 | 2 | format version (1) |
| 6 | 2 | header bytes (64) |
| 8 | 1 | scheme (1 = group-wise int) |
| 9 | 1 | bits (8 or 4) |
| 10 | 1 | flags (bit 0: symmetric) |
| 11 | 1 | element dtype of the original block (0 fp16, 1 bf16, 2 fp32) |
| 12 | 4 | group size |
| 16 | 16 | tokens, layers, kv_heads, head_dim (u32 each) |
| 32 | 8 | body bytes |
| 40 | 8 | checksum of header and body, this field counted as zero (firmware/checksum.py) |
| 48 | 16 | reserved (0) |

Body of the int scheme: scales float32[groups], zeros float32[groups] (asymmetric only), then
the codes (one byte per element, or two per byte for int4).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from firmware.checksum import sum64
from firmware.layout import DTYPE_NAMES, KVShape

MAGIC = b"SDKV"
VERSION = 1
HEADER_BYTES = 64
SCHEME_INT = 1
SCHEME_NAMES = {SCHEME_INT: "int"}
FLAG_SYMMETRIC = 1

_HEADER = struct.Struct("<4sHHBBBBI4IQQ16x")
assert _HEADER.size == HEADER_BYTES
_CHECKSUM_WORD = 5  # the checksum's 8 bytes at offset 40


class CorruptBlockError(ValueError):
    """A compressed block whose header or checksum does not hold."""


@dataclass(frozen=True)
class BlockHeader:
    scheme: int
    bits: int
    symmetric: bool
    dtype: int
    group: int
    shape: KVShape
    body_bytes: int

    def pack(self, checksum: int = 0) -> bytes:
        s = self.shape
        return _HEADER.pack(MAGIC, VERSION, HEADER_BYTES, self.scheme, self.bits,
                            FLAG_SYMMETRIC if self.symmetric else 0, self.dtype, self.group,
                            s.tokens, s.layers, s.kv_heads, s.head_dim, self.body_bytes, checksum)


def new_block(body_bytes: int) -> np.ndarray:
    """An uninitialised block of the right size, so kernels write the body in place."""
    return np.empty(HEADER_BYTES + body_bytes, dtype=np.uint8)


def seal(header: BlockHeader, block: np.ndarray) -> np.ndarray:
    """Write the header (with its checksum) into a block whose body is filled in."""
    block[:HEADER_BYTES] = np.frombuffer(header.pack(0), dtype=np.uint8)
    checksum = sum64(block, _CHECKSUM_WORD)
    block[:HEADER_BYTES] = np.frombuffer(header.pack(int(checksum)), dtype=np.uint8)
    return block


def open_block(blob) -> tuple[BlockHeader, np.ndarray]:
    """Parse and verify a compressed block; returns its header and body (a view)."""
    buf = np.frombuffer(blob, dtype=np.uint8) if not isinstance(blob, np.ndarray) else blob
    buf = buf.reshape(-1).view(np.uint8)
    if buf.ctypes.data % 8:  # the checksum and the float32 sections want aligned words
        buf = buf.copy()
    if buf.nbytes < HEADER_BYTES:
        raise CorruptBlockError(f"compressed block too short: {buf.nbytes} bytes")
    (magic, version, hbytes, scheme, bits, flags, dtype, group, tokens, layers, heads, hdim,
     body_bytes, checksum) = _HEADER.unpack(buf[:HEADER_BYTES].tobytes())
    if magic != MAGIC:
        raise CorruptBlockError(f"not a compressed KV block (magic {magic!r})")
    if version != VERSION or hbytes != HEADER_BYTES:
        raise CorruptBlockError(f"unsupported compressed block version {version}")
    if scheme not in SCHEME_NAMES or bits not in (4, 8) or dtype not in DTYPE_NAMES:
        raise CorruptBlockError(f"bad header: scheme {scheme}, bits {bits}, dtype {dtype}")
    if buf.nbytes != HEADER_BYTES + body_bytes:
        raise CorruptBlockError(
            f"compressed block is {buf.nbytes} bytes, header says {HEADER_BYTES + body_bytes}")
    if int(sum64(buf, _CHECKSUM_WORD)) != checksum:
        raise CorruptBlockError("compressed block checksum mismatch")
    try:
        shape = KVShape(tokens, layers, heads, hdim)
    except ValueError as e:
        raise CorruptBlockError(f"bad header: {e}") from None
    if group <= 0 or group % 2:
        raise CorruptBlockError(f"bad header: group size {group}")
    header = BlockHeader(scheme, bits, bool(flags & FLAG_SYMMETRIC), dtype, group, shape,
                         body_bytes)
    return header, buf[HEADER_BYTES:]
