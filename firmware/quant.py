"""Quantize / dequantize KV blocks into self-describing compressed blocks (firmware/blockfmt).

Schemes are named like `int8_g64` (asymmetric) or `int4_g128_sym`; `parse_scheme` raises a
clear ValueError for anything else.  Validation happens here, once, before the kernels run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from firmware.blockfmt import (
    HEADER_BYTES,
    SCHEME_INT,
    BlockHeader,
    CorruptBlockError,
    new_block,
    open_block,
    seal,
)
from firmware.layout import DTYPE_NAMES, KVShape, dtype_code, storage_dtype
from firmware.quant_int import dequantize_int, quantize_int

GROUP_SIZES = (32, 64, 128)
_INT_RE = re.compile(r"^int(8|4)_g(\d+)(_sym)?$")


@dataclass(frozen=True)
class Scheme:
    bits: int
    group: int
    symmetric: bool = False

    @property
    def name(self) -> str:
        return f"int{self.bits}_g{self.group}" + ("_sym" if self.symmetric else "")


def parse_scheme(name: str) -> Scheme:
    m = _INT_RE.match(name)
    if not m or int(m.group(2)) not in GROUP_SIZES:
        raise ValueError(
            f"unknown quantization scheme {name!r}: expected int8_gN or int4_gN, N in "
            f"{GROUP_SIZES}, with an optional _sym suffix"
        )
    return Scheme(int(m.group(1)), int(m.group(2)), m.group(3) is not None)


def _body_bytes(n: int, group: int, bits: int, symmetric: bool) -> int:
    groups = (n + group - 1) // group
    return 4 * groups * (1 if symmetric else 2) + (n if bits == 8 else (n + 1) // 2)


def _sections(body: np.ndarray, n: int, group: int, bits: int, symmetric: bool):
    """Views of a body's scales, zero points (empty when symmetric) and codes."""
    ng = (n + group - 1) // group
    nz = 0 if symmetric else ng
    scales = body[:4 * ng].view(np.float32)
    zeros = body[4 * ng:4 * (ng + nz)].view(np.float32) if nz else np.empty(0, np.float32)
    return scales, zeros, body[4 * (ng + nz):]


def _block_shape(block: np.ndarray) -> KVShape:
    if block.ndim != 5 or block.shape[1] != 2:
        raise ValueError(f"KV block must be (tokens, 2, layers, kv_heads, head_dim), got "
                         f"{block.shape}")
    return KVShape(*(int(v) for v in (block.shape[0], block.shape[2], block.shape[3],
                                       block.shape[4])))


def compressed_nbytes(shape: KVShape, scheme: Scheme | str) -> int:
    """Size of the compressed block for a KV block of this shape under this scheme."""
    if isinstance(scheme, str):
        scheme = parse_scheme(scheme)
    return HEADER_BYTES + _body_bytes(shape.elements, scheme.group, scheme.bits,
                                      scheme.symmetric)


def _check_out(out: np.ndarray, dtype: np.dtype, size: int, what: str) -> np.ndarray:
    if (not isinstance(out, np.ndarray) or out.dtype != dtype or out.size != size
            or not out.flags.c_contiguous or out.ctypes.data % 8):
        raise ValueError(f"out must be a C-contiguous, 8-byte aligned {dtype} array of {size} "
                         f"elements for this {what}")
    return out.reshape(-1)


def quantize(block: np.ndarray, dtype: str, scheme: Scheme | str,
             out: np.ndarray | None = None) -> np.ndarray:
    """block: (tokens, 2, layers, kv_heads, head_dim) as uint16 (fp16/bf16 bits) or float32.
    Returns the compressed block (uint8), written into `out` when given (see
    compressed_nbytes).  inf or NaN in the input raises ValueError."""
    if isinstance(scheme, str):
        scheme = parse_scheme(scheme)
    code = dtype_code(dtype)
    want = storage_dtype(code)
    if block.dtype != want:
        raise ValueError(f"a {dtype} block is carried as {want}, got {block.dtype}")
    shape = _block_shape(block)
    flat = np.ascontiguousarray(block).reshape(-1)
    n = flat.shape[0]
    size = _body_bytes(n, scheme.group, scheme.bits, scheme.symmetric)
    if out is None:
        block_out = new_block(size)
    else:
        block_out = _check_out(out, np.dtype(np.uint8), HEADER_BYTES + size, "compressed block")
    body = block_out[HEADER_BYTES:]
    scales, zeros, payload = _sections(body, n, scheme.group, scheme.bits, scheme.symmetric)
    bad = quantize_int(flat, code, scheme.group, scheme.bits, scheme.symmetric, scales, zeros,
                       payload)
    if bad:
        raise ValueError(f"KV block holds {bad} inf/NaN values: refusing to quantize it")
    header = BlockHeader(SCHEME_INT, scheme.bits, scheme.symmetric, code, scheme.group, shape,
                         size)
    return seal(header, block_out)


def dequantize(blob, out: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """Compressed block -> (block array in its original element type, dtype name), written
    into `out` when given.  A corrupt block raises CorruptBlockError."""
    header, body = open_block(blob)
    shape = header.shape
    n = shape.elements
    expect = _body_bytes(n, header.group, header.bits, header.symmetric)
    if body.nbytes != expect:
        raise CorruptBlockError(f"body is {body.nbytes} bytes, the header implies {expect}")
    scales, zeros, payload = _sections(body, n, header.group, header.bits, header.symmetric)
    want = storage_dtype(header.dtype)
    flat = np.empty(n, dtype=want) if out is None else _check_out(out, want, n, "KV block")
    dequantize_int(payload, n, header.dtype, header.group, header.bits, header.symmetric,
                   scales, zeros, flat)
    return flat.reshape(shape.array_shape), DTYPE_NAMES[header.dtype]
