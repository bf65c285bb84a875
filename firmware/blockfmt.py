"""The compressed KV block: a 64-byte self-describing header, then the scheme's sections.

Header (little-endian):

| offset | size | field |
|---|---|---|
| 0 | 4 | magic `SDKV` |
| 4 | 2 | format version (2; version 1 blocks, token-major, are still read) |
| 6 | 2 | header bytes (64) |
| 8 | 1 | scheme: 1 group-wise int, 2 KIVI, 3 fp8 e4m3, 4 plain |
| 9 | 1 | bits (8, 4 or 2; 8 for fp8; the element's for plain) |
| 10 | 1 | flags: 0 symmetric (int), 1 scale per KV head (fp8), 2 host's rows 2LT, 3 by head |
| 11 | 1 | element dtype of the original block (0 fp16, 1 bf16, 2 fp32) |
| 12 | 4 | group size (32, 64, 128; 0 for fp8 and plain) |
| 16 | 16 | tokens, layers, kv_heads, head_dim (u32 each) |
| 32 | 8 | body bytes |
| 40 | 8 | checksum of header and body, this field counted as zero (firmware/checksum.py) |
| 48 | 4 | KIVI: tokens kept in full precision at the end of the block (0 otherwise) |
| 52 | 2 | tokens per page of the page summaries after the body (0: none) |
| 54 | 10 | reserved (0) |

Bodies (firmware/quant.py lays them out, each section padded to 8 bytes):
- int: scales float32[groups], zeros float32[groups] (asymmetric only), codes (one byte per
  element, or two per byte for int4).
- KIVI: an int section (asymmetric) for K of the quantized tokens, transposed so that groups
  run along tokens per channel; an int section for V of those tokens, groups along channels;
  then the full-precision tokens, raw, in the original element type.
- fp8: scales float32[1 or 2 * layers * kv_heads], then one e4m3 code per element.
- plain: the block's elements as they were given (either layout).

Flag bit 2: the host sent LMCache's (2, layers, tokens) rows.  Flag bit 3 (version 2): the
body is laid out by head.  The drive lays a plain or integer block's rows out as (layers,
kv_heads, 2, tokens, head_dim) before it quantizes them, whatever the host's order (bit 2
keeps that, and retrieves give it back): one layer's page of one KV head is then one run of
keys and one of values a block's tokens apart (plain), or runs of codes, scales and zero
points (integer); the re-rank reads the keys' runs, ATTEND both (page_extents).  The values
are the same either way (the integer kind's groups divide head_dim, or the block stays
token-major); fp8 and KIVI index the token order and stay token-major.

Page summaries (firmware/summaries.py), when the header gives a page: after the body, the
per-channel min and max of each page's keys, (layers, 2, kv_heads, pages, head_dim) in the
block's element type, padded to 8 bytes; the checksum covers them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from firmware import blockops as B
from firmware import kinds
from firmware.checksum import sum64
from firmware.layout import KVShape

MAGIC = b"SDKV"
VERSION = B.VERSION
HEADER_BYTES = 64
SCHEME_NAMES = {m.CODE: m.NAME for m in kinds.modules()}  # firmware/kinds.py
FLAG_SYMMETRIC = B.FLAG_SYMMETRIC
FLAG_PER_HEAD = B.FLAG_PER_HEAD
FLAG_LAYOUT_2LT = B.FLAG_LAYOUT_2LT
FLAG_BY_HEAD = B.FLAG_BY_HEAD
INT_GROUPS = (32, 64, 128)
SCHEME_PLAIN = next(c for c, n in SCHEME_NAMES.items() if n == "plain")

_HEADER = struct.Struct("<4sHHBBBBI4IQQIH10x")
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
    summary_page: int = 0  # tokens per page of the page summaries (0: none)

    @property
    def symmetric(self) -> bool:
        return bool(self.flags & FLAG_SYMMETRIC)

    @property
    def per_head(self) -> bool:
        return bool(self.flags & FLAG_PER_HEAD)

    @property
    def by_head(self) -> bool:
        return bool(self.flags & FLAG_BY_HEAD)

    def pack(self, checksum: int = 0) -> bytes:
        s = self.shape
        return _HEADER.pack(MAGIC, VERSION, HEADER_BYTES, self.scheme, self.bits, self.flags,
                            self.dtype, self.group, s.tokens, s.layers, s.kv_heads, s.head_dim,
                            self.body_bytes, checksum, self.residual, self.summary_page)


def new_block(body_bytes: int) -> np.ndarray:
    """An uninitialised block of the right size, so kernels write the body in place."""
    return np.empty(HEADER_BYTES + body_bytes, dtype=np.uint8)


def seal(header: BlockHeader, block: np.ndarray) -> np.ndarray:
    """Write the header (with its checksum) into a block whose body is filled in."""
    block[:HEADER_BYTES] = np.frombuffer(header.pack(0), dtype=np.uint8)
    checksum = sum64(block, _CHECKSUM_WORD)
    block[:HEADER_BYTES] = np.frombuffer(header.pack(int(checksum)), dtype=np.uint8)
    return block


_FIELD_NAMES = {B.P_BITS: "bits", B.P_GROUP: "group", B.P_KIND: "scheme", B.P_DTYPE: "dtype",
                B.P_RESIDUAL: "residual", B.P_SUMMARY_PAGE: "summary page"}


def open_block(blob) -> tuple[BlockHeader, np.ndarray]:
    """Parse and verify a compressed block (firmware/blockops.open_header, the drive's own
    check); returns its header and body (a view).  CorruptBlockError says what is wrong."""
    buf = np.frombuffer(blob, dtype=np.uint8) if not isinstance(blob, np.ndarray) else blob
    buf = buf.reshape(-1).view(np.uint8)
    if buf.ctypes.data % 8:  # the checksum and the float32 sections want aligned words
        buf = buf.copy()
    p = np.zeros(B.NPARAM, np.int64)
    e = B.open_header(buf, p)
    if e:
        raise CorruptBlockError(_problem(e, buf, p))
    flags = ((FLAG_SYMMETRIC if p[B.P_SYM] else 0) | (FLAG_PER_HEAD if p[B.P_PER_HEAD] else 0)
             | (FLAG_LAYOUT_2LT if p[B.P_LAYOUT] else 0)
             | (FLAG_BY_HEAD if p[B.P_BY_HEAD] else 0))
    shape = KVShape(*(int(p[i]) for i in (B.P_TOKENS, B.P_LAYERS, B.P_HEADS, B.P_HDIM)))
    header = BlockHeader(int(p[B.P_KIND]), int(p[B.P_BITS]), flags, int(p[B.P_DTYPE]),
                         int(p[B.P_GROUP]), shape, int(p[B.P_BODY]), int(p[B.P_RESIDUAL]),
                         int(p[B.P_SUMMARY_PAGE]))
    return header, buf[HEADER_BYTES:HEADER_BYTES + header.body_bytes]


_CARRIERS = {0: np.uint16, 1: np.uint16, 2: np.float32}


def page_runs(header: BlockHeader, layer: int, kv, head, t0, t1) -> tuple[np.ndarray, np.ndarray]:
    """page_extents of many pages at once (kv, head, t0, t1: arrays of one length, or
    scalars): the runs' offsets and bytes, each an int64 array, in no particular order."""
    s = header.shape
    kv, head, t0, t1 = (np.asarray(x, np.int64) for x in (kv, head, t0, t1))
    if not header.by_head:
        per = max(1, header.body_bytes // s.tokens)  # a token row's share of the body
        t0, t1 = np.broadcast_arrays(t0, t1)
        return (HEADER_BYTES + t0 * per).ravel(), ((t1 - t0) * per).ravel()
    row0 = ((layer * s.kv_heads + head) * 2 + kv) * s.tokens + t0  # head_dim rows
    e0, n = row0 * s.head_dim, (t1 - t0) * s.head_dim  # elements
    e0, n = np.broadcast_arrays(e0, n)
    if header.scheme == SCHEME_PLAIN:
        eb = np.dtype(_CARRIERS[header.dtype]).itemsize
        return (HEADER_BYTES + e0 * eb).ravel(), (n * eb).ravel()
    # integer: scales float32[groups], zero points (asymmetric), codes (8 or 4 bits)
    total = s.tokens * 2 * s.layers * s.kv_heads * s.head_dim
    groups = -(-total // header.group)
    g0, ng = e0 // header.group, -(-n // header.group)
    offs = [HEADER_BYTES + 4 * g0]
    lens = [4 * ng]
    if not header.symmetric:
        offs.append(HEADER_BYTES + 4 * (groups + g0))
        lens.append(4 * ng)
    codes = HEADER_BYTES + 4 * groups * (1 if header.symmetric else 2)
    offs.append(codes + e0 * header.bits // 8)
    lens.append(n * header.bits // 8)
    return np.concatenate([o.ravel() for o in offs]), np.concatenate([x.ravel() for x in lens])


def page_extents(header: BlockHeader, layer: int, kv: int, head: int, t0: int,
                 t1: int) -> list[tuple[int, int]]:
    """Where in the block (offset, bytes) the drive reads tokens [t0, t1) of one layer's K
    (kv 0) or V (kv 1) of one KV head: one run of a plain block laid out by head; its
    scales, zero points and codes for an integer one; a token-major block (version 1, fp8,
    KIVI) holds them in its whole token rows (every layer and head: the rows' share of its
    body, as stored)."""
    offs, lens = page_runs(header, layer, kv, head, t0, t1)
    return [(int(o), int(n)) for o, n in zip(offs, lens, strict=True)]


def summaries_at(header: BlockHeader, layer: int) -> tuple[int, int]:
    """(offset in the block, bytes) of one layer's page summaries: the run a drive reads to
    score that layer (the header says there are summaries)."""
    s = header.shape
    per_layer = (2 * s.kv_heads * -(-s.tokens // header.summary_page) * s.head_dim
                 * np.dtype(_CARRIERS[header.dtype]).itemsize)
    return HEADER_BYTES + header.body_bytes + layer * per_layer, per_layer


def layer_summaries(blob, layer: int) -> tuple[BlockHeader, np.ndarray | None]:
    """A verified compressed block's header, and one layer's page summaries as its element
    carrier (uint16 fp16/bf16 bits, or float32), shaped (2, kv_heads, pages, head_dim): min
    then max.  None when the block carries none."""
    header, _ = open_block(blob)
    if not header.summary_page:
        return header, None
    return header, summaries_run(header, blob, layer)


def summaries_run(header: BlockHeader, blob, layer: int) -> np.ndarray:
    """layer_summaries' run, of a block already verified (open_block gave its header)."""
    if not 0 <= layer < header.shape.layers:
        raise ValueError(f"layer {layer} of a block of {header.shape.layers}")
    off, n = summaries_at(header, layer)
    s = header.shape
    raw = np.frombuffer(blob, np.uint8)[off:off + n] if not isinstance(blob, np.ndarray) \
        else blob.reshape(-1).view(np.uint8)[off:off + n]
    pages = -(-s.tokens // header.summary_page)
    return raw.view(_CARRIERS[header.dtype]).reshape(2, s.kv_heads, pages, s.head_dim)


def _problem(e: int, buf: np.ndarray, p: np.ndarray) -> str:
    if e == B.E_SHORT:
        return f"compressed block too short: {buf.nbytes} bytes"
    if e == B.E_MAGIC:
        return f"not a compressed KV block (magic {buf[:4].tobytes()!r})"
    if e == B.E_VERSION:
        return "unsupported compressed block version"
    if e == B.E_LENGTH:
        sums = int(B.summary_bytes(p)) if 0 < p[B.P_SUMMARY_PAGE] <= B.MAX_PAGE \
            and B.check_shape(p) == 0 else 0
        return (f"compressed block is {buf.nbytes} bytes, header says "
                f"{HEADER_BYTES + int(p[B.P_BODY]) + sums}")
    if e == B.E_CHECKSUM:
        return "compressed block checksum mismatch"
    fields = ", ".join(f"{name} {int(p[i])}" for i, name in _FIELD_NAMES.items())
    if e == B.E_FIELDS:
        return f"bad header: {fields}, flags {int(buf[10])}"
    if e == B.E_SHAPE:
        return "bad header: a shape field is 0 or too large"
    if e == B.E_KIVI_GROUPS:
        return "bad header: KIVI quantized tokens are not whole groups"
    return f"bad header: the body is {int(p[B.P_BODY])} bytes, not what {fields} imply"
