"""Quantize / dequantize KV blocks into self-describing compressed blocks (firmware/blockfmt).

Schemes are named like `int8_g64` (asymmetric) or `int4_g128_sym`; `parse_scheme` raises a
clear ValueError for anything else.  Validation happens here, once, before the kernels run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from firmware.blockfmt import SCHEME_INT, BlockHeader, CorruptBlockError, open_block, seal
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


def _groups(n: int, group: int) -> int:
    return (n + group - 1) // group


def _payload_bytes(n: int, bits: int) -> int:
    return n if bits == 8 else (n + 1) // 2


def quantize(block: np.ndarray, dtype: str, scheme: Scheme | str) -> np.ndarray:
    """block: (tokens, 2, layers, kv_heads, head_dim) as uint16 (fp16/bf16 bits) or float32.
    Returns the compressed block (uint8).  inf or NaN in the input raises ValueError."""
    if isinstance(scheme, str):
        scheme = parse_scheme(scheme)
    code = dtype_code(dtype)
    want = storage_dtype(code)
    if block.dtype != want:
        raise ValueError(f"a {dtype} block is carried as {want}, got {block.dtype}")
    if block.ndim != 5 or block.shape[1] != 2:
        raise ValueError(f"KV block must be (tokens, 2, layers, kv_heads, head_dim), got "
                         f"{block.shape}")
    shape = KVShape(*(int(v) for v in (block.shape[0], block.shape[2], block.shape[3],
                                        block.shape[4])))
    flat = np.ascontiguousarray(block).reshape(-1)
    n = flat.shape[0]
    ng = _groups(n, scheme.group)
    nz = 0 if scheme.symmetric else ng
    body = np.empty(4 * (ng + nz) + _payload_bytes(n, scheme.bits), dtype=np.uint8)
    scales = body[:4 * ng].view(np.float32)
    zeros = body[4 * ng:4 * (ng + nz)].view(np.float32) if nz else np.empty(0, np.float32)
    payload = body[4 * (ng + nz):]
    bad = quantize_int(flat, code, scheme.group, scheme.bits, scheme.symmetric, scales, zeros,
                       payload)
    if bad:
        raise ValueError(f"KV block holds {bad} inf/NaN values: refusing to quantize it")
    header = BlockHeader(SCHEME_INT, scheme.bits, scheme.symmetric, code, scheme.group, shape,
                         body.nbytes)
    return seal(header, body)


def dequantize(blob) -> tuple[np.ndarray, str]:
    """Compressed block -> (block array in its original element type, dtype name).
    A corrupt block raises CorruptBlockError."""
    header, body = open_block(blob)
    if body.ctypes.data % 4:  # the float32 sections need 4-byte alignment in the kernels
        body = body.copy()
    shape = header.shape
    n = shape.elements
    ng = _groups(n, header.group)
    nz = 0 if header.symmetric else ng
    expect = 4 * (ng + nz) + _payload_bytes(n, header.bits)
    if body.nbytes != expect:
        raise CorruptBlockError(f"body is {body.nbytes} bytes, the header implies {expect}")
    scales = body[:4 * ng].view(np.float32)
    zeros = body[4 * ng:4 * (ng + nz)].view(np.float32) if nz else np.empty(0, np.float32)
    payload = body[4 * (ng + nz):]
    out = np.empty(n, dtype=storage_dtype(header.dtype))
    dequantize_int(payload, n, header.dtype, header.group, header.bits, header.symmetric,
                   scales, zeros, out)
    return out.reshape(shape.array_shape), DTYPE_NAMES[header.dtype]
