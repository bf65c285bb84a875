"""The compressed KV block: a 64-byte self-describing header, then the scheme's sections.

Header (little-endian):

| offset | size | field |
|---|---|---|
| 0 | 4 | magic `SDKV` |
| 4 | 2 | format version (1) |
| 6 | 2 | header bytes (64) |
| 8 | 1 | scheme: 1 group-wise int, 2 KIVI, 3 fp8 e4m3 |
| 9 | 1 | bits (8 or 4; 8 for fp8) |
| 10 | 1 | flags: bit 0 symmetric (int), bit 1 one scale per KV head (fp8) |
| 11 | 1 | element dtype of the original block (0 fp16, 1 bf16, 2 fp32) |
| 12 | 4 | group size (32, 64, 128; 0 for fp8) |
| 16 | 16 | tokens, layers, kv_heads, head_dim (u32 each) |
| 32 | 8 | body bytes |
| 40 | 8 | checksum of header and body, this field counted as zero (firmware/checksum.py) |
| 48 | 4 | KIVI: tokens kept in full precision at the end of the block (0 otherwise) |
| 52 | 12 | reserved (0) |

Bodies (firmware/quant.py lays them out, each section padded to 8 bytes):
- int: scales float32[groups], zeros float32[groups] (asymmetric only), codes (one byte per
  element, or two per byte for int4).
- KIVI: an int section (asymmetric) for K of the quantized tokens, transposed so that groups
  run along tokens per channel; an int section for V of those tokens, groups along channels;
  then the full-precision tokens, raw, in the original element type.
- fp8: scales float32[1 or 2 * layers * kv_heads], then one e4m3 code per element.
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
SCHEME_KIVI = 2
SCHEME_FP8 = 3
SCHEME_NAMES = {SCHEME_INT: "int", SCHEME_KIVI: "kivi", SCHEME_FP8: "fp8"}
FLAG_SYMMETRIC = 1
FLAG_PER_HEAD = 2
INT_GROUPS = (32, 64, 128)

_HEADER = struct.Struct("<4sHHBBBBI4IQQI12x")
assert _HEADER.size == HEADER_BYTES
_CHECKSUM_WORD = 5  # the checksum's 8 bytes at offset 40


class CorruptBlockError(ValueError):
    """A compressed block whose header or checksum does not hold."""


@dataclass(frozen=True)
class BlockHeader:
    scheme: int
    bits: int
    flags: int
    dtype: int
    group: int
    shape: KVShape
    body_bytes: int
    residual: int = 0

    @property
    def symmetric(self) -> bool:
        return bool(self.flags & FLAG_SYMMETRIC)

    @property
    def per_head(self) -> bool:
        return bool(self.flags & FLAG_PER_HEAD)

    def pack(self, checksum: int = 0) -> bytes:
        s = self.shape
        return _HEADER.pack(MAGIC, VERSION, HEADER_BYTES, self.scheme, self.bits, self.flags,
                            self.dtype, self.group, s.tokens, s.layers, s.kv_heads, s.head_dim,
                            self.body_bytes, checksum, self.residual)


def new_block(body_bytes: int) -> np.ndarray:
    """An uninitialised block of the right size, so kernels write the body in place."""
    return np.empty(HEADER_BYTES + body_bytes, dtype=np.uint8)


def seal(header: BlockHeader, block: np.ndarray) -> np.ndarray:
    """Write the header (with its checksum) into a block whose body is filled in."""
    block[:HEADER_BYTES] = np.frombuffer(header.pack(0), dtype=np.uint8)
    checksum = sum64(block, _CHECKSUM_WORD)
    block[:HEADER_BYTES] = np.frombuffer(header.pack(int(checksum)), dtype=np.uint8)
    return block


def _check_fields(scheme, bits, flags, dtype, group, residual, tokens) -> str | None:
    """What is wrong with these header fields, or None."""
    if scheme not in SCHEME_NAMES or dtype not in DTYPE_NAMES or flags & ~3:
        return f"scheme {scheme}, dtype {dtype}, flags {flags}"
    if scheme == SCHEME_FP8:
        if bits != 8 or group != 0 or residual or flags & FLAG_SYMMETRIC:
            return f"fp8 with bits {bits}, group {group}, residual {residual}, flags {flags}"
    elif bits not in (4, 8) or group not in INT_GROUPS or flags & FLAG_PER_HEAD:
        return f"bits {bits}, group {group}, flags {flags}"
    if scheme == SCHEME_INT and residual:
        return f"residual {residual} on an int block"
    if scheme == SCHEME_KIVI and (residual > tokens or flags & FLAG_SYMMETRIC):
        return f"KIVI with residual {residual} of {tokens} tokens, flags {flags}"
    return None


def open_block(blob) -> tuple[BlockHeader, np.ndarray]:
    """Parse and verify a compressed block; returns its header and body (a view)."""
    buf = np.frombuffer(blob, dtype=np.uint8) if not isinstance(blob, np.ndarray) else blob
    buf = buf.reshape(-1).view(np.uint8)
    if buf.ctypes.data % 8:  # the checksum and the float32 sections want aligned words
        buf = buf.copy()
    if buf.nbytes < HEADER_BYTES:
        raise CorruptBlockError(f"compressed block too short: {buf.nbytes} bytes")
    (magic, version, hbytes, scheme, bits, flags, dtype, group, tokens, layers, heads, hdim,
     body_bytes, checksum, residual) = _HEADER.unpack(buf[:HEADER_BYTES].tobytes())
    if magic != MAGIC:
        raise CorruptBlockError(f"not a compressed KV block (magic {magic!r})")
    if version != VERSION or hbytes != HEADER_BYTES:
        raise CorruptBlockError(f"unsupported compressed block version {version}")
    if buf.nbytes != HEADER_BYTES + body_bytes:
        raise CorruptBlockError(
            f"compressed block is {buf.nbytes} bytes, header says {HEADER_BYTES + body_bytes}")
    if int(sum64(buf, _CHECKSUM_WORD)) != checksum:
        raise CorruptBlockError("compressed block checksum mismatch")
    # fields are checked after the checksum too: a block can be well-sealed and still wrong
    problem = _check_fields(scheme, bits, flags, dtype, group, residual, tokens)
    if problem:
        raise CorruptBlockError(f"bad header: {problem}")
    try:
        shape = KVShape(tokens, layers, heads, hdim)
    except ValueError as e:
        raise CorruptBlockError(f"bad header: {e}") from None
    return BlockHeader(scheme, bits, flags, dtype, group, shape, body_bytes, residual), \
        buf[HEADER_BYTES:]
