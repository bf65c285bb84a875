"""Quantize / dequantize KV blocks into self-describing compressed blocks (firmware/blockfmt).

Scheme names:
- `int8_g64`, `int4_g128_sym`: group-wise int over the flat block (firmware/quant_int.py),
  asymmetric unless `_sym`; groups of 32, 64 or 128.
- `kivi4_g32_r128`: KIVI. Keys grouped per channel (groups run along tokens), values per
  token (groups run along channels), both asymmetric; the last tokens stay in full precision:
  at least R of them, plus however many do not fill a whole group of G tokens.
- `fp8_tensor`, `fp8_head`: e4m3fn with one scale per block or per KV head
  (firmware/quant_fp8.py).
`parse_scheme` raises a clear ValueError for anything else.  Validation happens here, once,
before the kernels run; the kernels trust their inputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from firmware.blockfmt import (
    FLAG_PER_HEAD,
    FLAG_SYMMETRIC,
    HEADER_BYTES,
    INT_GROUPS,
    SCHEME_FP8,
    SCHEME_INT,
    SCHEME_KIVI,
    BlockHeader,
    CorruptBlockError,
    new_block,
    open_block,
    seal,
)
from firmware.convert import bf16_to_f32, fp16_to_f32
from firmware.layout import DTYPE_NAMES, ELEMENT_BYTES, KVShape, dtype_code, storage_dtype
from firmware.quant_fp8 import E4M3_VALUES, dequantize_fp8, quantize_fp8
from firmware.quant_int import dequantize_int, quantize_int

GROUP_SIZES = INT_GROUPS
_INT_RE = re.compile(r"^int(8|4)_g(\d+)(_sym)?$")
_KIVI_RE = re.compile(r"^kivi(8|4)_g(\d+)_r(\d+)$")
_FP8_RE = re.compile(r"^fp8_(tensor|head)$")


@dataclass(frozen=True)
class Scheme:
    kind: str  # "int", "kivi" or "fp8"
    bits: int = 8
    group: int = 0
    symmetric: bool = False
    residual: int = 0  # KIVI: tokens kept in full precision at least
    per_head: bool = False  # fp8: a scale per KV head

    @property
    def name(self) -> str:
        if self.kind == "int":
            return f"int{self.bits}_g{self.group}" + ("_sym" if self.symmetric else "")
        if self.kind == "kivi":
            return f"kivi{self.bits}_g{self.group}_r{self.residual}"
        return "fp8_head" if self.per_head else "fp8_tensor"


def parse_scheme(name: str) -> Scheme:
    m = _INT_RE.match(name)
    if m and int(m.group(2)) in GROUP_SIZES:
        return Scheme("int", int(m.group(1)), int(m.group(2)), m.group(3) is not None)
    m = _KIVI_RE.match(name)
    if m and int(m.group(2)) in GROUP_SIZES:
        return Scheme("kivi", int(m.group(1)), int(m.group(2)), residual=int(m.group(3)))
    m = _FP8_RE.match(name)
    if m:
        return Scheme("fp8", 8, per_head=m.group(1) == "head")
    raise ValueError(
        f"unknown quantization scheme {name!r}: expected int8_gN / int4_gN [_sym], "
        f"kivi8_gN_rR / kivi4_gN_rR (N in {GROUP_SIZES}), fp8_tensor or fp8_head"
    )


# ---- body layout (pure) -----------------------------------------------------------------


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def _int_section_used(n: int, group: int, bits: int, symmetric: bool) -> int:
    groups = (n + group - 1) // group
    return 4 * groups * (1 if symmetric else 2) + (n if bits == 8 else (n + 1) // 2)


def _int_section_bytes(n: int, group: int, bits: int, symmetric: bool) -> int:
    return _pad8(_int_section_used(n, group, bits, symmetric))


def _int_section(body: np.ndarray, n: int, group: int, bits: int, symmetric: bool,
                 writing: bool = False):
    """Views of an int section's scales, zero points (empty when symmetric) and codes.  When
    writing, its padding is zeroed, so that a block's bytes depend on its contents only."""
    if writing:
        body[_int_section_used(n, group, bits, symmetric):
             _int_section_bytes(n, group, bits, symmetric)] = 0
    ng = (n + group - 1) // group
    nz = 0 if symmetric else ng
    scales = body[:4 * ng].view(np.float32)
    zeros = body[4 * ng:4 * (ng + nz)].view(np.float32) if nz else np.empty(0, np.float32)
    codes = body[4 * (ng + nz):4 * (ng + nz) + (n if bits == 8 else (n + 1) // 2)]
    return scales, zeros, codes


def kivi_quantized_tokens(tokens: int, group: int, residual: int) -> int:
    """Tokens KIVI quantizes: whole groups of `group` tokens before the last `residual`."""
    return max(0, tokens - residual) // group * group


def _fp8_scales(shape: KVShape, per_head: bool) -> int:
    return 2 * shape.layers * shape.kv_heads if per_head else 1


def _fp8_sections(body: np.ndarray, nscales: int, n: int, writing: bool = False):
    """Views of an fp8 body's scales and codes (padding zeroed when writing)."""
    start = _pad8(4 * nscales)
    if writing:
        body[4 * nscales:start] = 0
        body[start + n:] = 0
    return body[:4 * nscales].view(np.float32), body[start:start + n]


def body_bytes(shape: KVShape, scheme: Scheme) -> int:
    n = shape.elements
    if scheme.kind == "int":
        return _int_section_bytes(n, scheme.group, scheme.bits, scheme.symmetric)
    if scheme.kind == "fp8":
        return _pad8(4 * _fp8_scales(shape, scheme.per_head)) + _pad8(n)
    raise ValueError("KIVI sizes depend on the element type: use compressed_nbytes")


def _kivi_bytes(shape: KVShape, group: int, bits: int, quantized: int, dtype: int) -> int:
    qn = quantized * shape.per_token_per_kv
    raw = (shape.tokens - quantized) * 2 * shape.per_token_per_kv * ELEMENT_BYTES[dtype]
    return 2 * _int_section_bytes(qn, group, bits, False) + _pad8(raw)


def compressed_nbytes(shape: KVShape, scheme: Scheme | str, dtype: str = "fp16") -> int:
    """Size of the compressed block for a KV block of this shape, scheme and element type."""
    if isinstance(scheme, str):
        scheme = parse_scheme(scheme)
    if scheme.kind == "kivi":
        q = kivi_quantized_tokens(shape.tokens, scheme.group, scheme.residual)
        return HEADER_BYTES + _kivi_bytes(shape, scheme.group, scheme.bits, q, dtype_code(dtype))
    return HEADER_BYTES + body_bytes(shape, scheme)


# ---- public API -----------------------------------------------------------------------------


def _block_shape(block: np.ndarray) -> KVShape:
    if block.ndim != 5 or block.shape[1] != 2:
        raise ValueError(f"KV block must be (tokens, 2, layers, kv_heads, head_dim), got "
                         f"{block.shape}")
    return KVShape(*(int(v) for v in (block.shape[0], block.shape[2], block.shape[3],
                                       block.shape[4])))


def _check_out(out: np.ndarray, dtype: np.dtype, size: int, what: str) -> np.ndarray:
    if (not isinstance(out, np.ndarray) or out.dtype != dtype or out.size != size
            or not out.flags.c_contiguous or out.ctypes.data % 8):
        raise ValueError(f"out must be a C-contiguous, 8-byte aligned {dtype} array of {size} "
                         f"elements for this {what}")
    return out.reshape(-1)


def _refuse_bad(bad: int) -> None:
    if bad:
        raise ValueError(f"KV block holds {bad} inf/NaN values: refusing to quantize it")


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
    x = np.ascontiguousarray(block)
    size = compressed_nbytes(shape, scheme, dtype) - HEADER_BYTES
    if out is None:
        blob = new_block(size)
    else:
        blob = _check_out(out, np.dtype(np.uint8), HEADER_BYTES + size, "compressed block")
    body = blob[HEADER_BYTES:]
    flags, residual = 0, 0
    if scheme.kind == "int":
        flags = FLAG_SYMMETRIC if scheme.symmetric else 0
        _refuse_bad(quantize_int(x.reshape(-1), code, scheme.group, scheme.bits,
                                 scheme.symmetric,
                                 *_int_section(body, shape.elements, scheme.group, scheme.bits,
                                               scheme.symmetric, writing=True)))
        kind = SCHEME_INT
    elif scheme.kind == "kivi":
        kind = SCHEME_KIVI
        residual = _quantize_kivi(x, code, shape, scheme, body)
    else:
        kind = SCHEME_FP8
        flags = FLAG_PER_HEAD if scheme.per_head else 0
        nscales = _fp8_scales(shape, scheme.per_head)
        scales, codes = _fp8_sections(body, nscales, shape.elements, writing=True)
        _refuse_bad(quantize_fp8(x.reshape(-1), code, shape.head_dim,
                                 2 * shape.layers * shape.kv_heads, scheme.per_head, scales,
                                 codes))
    header = BlockHeader(kind, scheme.bits, flags, code, scheme.group, shape, size, residual)
    return seal(header, blob)


def _kivi_sections(body: np.ndarray, shape: KVShape, group: int, bits: int, quantized: int,
                   writing: bool = False):
    qn = quantized * shape.per_token_per_kv
    sec = _int_section_bytes(qn, group, bits, False)
    k = _int_section(body[:sec], qn, group, bits, False, writing)
    v = _int_section(body[sec:2 * sec], qn, group, bits, False, writing)
    return k, v, body[2 * sec:]


def _quantize_kivi(x: np.ndarray, code: int, shape: KVShape, scheme: Scheme,
                   body: np.ndarray) -> int:
    """Returns the number of tokens kept in full precision."""
    quantized = kivi_quantized_tokens(shape.tokens, scheme.group, scheme.residual)
    c = shape.per_token_per_kv
    k_sec, v_sec, raw = _kivi_sections(body, shape, scheme.group, scheme.bits, quantized,
                                       writing=True)
    # keys per channel: transpose so that a channel's tokens are contiguous
    keys = np.ascontiguousarray(x[:quantized, 0].reshape(quantized, c).T).reshape(-1)
    values = np.ascontiguousarray(x[:quantized, 1]).reshape(-1)
    _refuse_bad(quantize_int(keys, code, scheme.group, scheme.bits, False, *k_sec))
    _refuse_bad(quantize_int(values, code, scheme.group, scheme.bits, False, *v_sec))
    tail = x[quantized:].reshape(-1)
    _refuse_bad(_nonfinite(tail, code))
    raw[:tail.nbytes] = tail.view(np.uint8)
    raw[tail.nbytes:] = 0
    return shape.tokens - quantized


def _nonfinite(x: np.ndarray, code: int) -> int:
    """inf/NaN count of a flat block part, with the kernels' own conversions."""
    scratch = np.empty(x.size, np.float32)
    if code == 0:
        return int(fp16_to_f32(x, scratch))
    if code == 1:
        return int(bf16_to_f32(x, scratch))
    return int(x.size - np.count_nonzero(np.isfinite(x)))


def dequantize(blob, out: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """Compressed block -> (block array in its original element type, dtype name), written
    into `out` when given.  A corrupt block raises CorruptBlockError."""
    header, body = open_block(blob)
    shape = header.shape
    n = shape.elements
    if header.scheme == SCHEME_KIVI:
        quantized = shape.tokens - header.residual
        if quantized % header.group:
            raise CorruptBlockError(f"bad header: KIVI quantized tokens {quantized} are not "
                                    f"whole groups of {header.group}")
        expect = _kivi_bytes(shape, header.group, header.bits, quantized, header.dtype)
    elif header.scheme == SCHEME_INT:
        expect = _int_section_bytes(n, header.group, header.bits, header.symmetric)
    else:
        expect = body_bytes(shape, Scheme("fp8", 8, per_head=header.per_head))
    if body.nbytes != expect:
        raise CorruptBlockError(f"body is {body.nbytes} bytes, the header implies {expect}")
    want = storage_dtype(header.dtype)
    flat = np.empty(n, dtype=want) if out is None else _check_out(out, want, n, "KV block")
    if header.scheme == SCHEME_INT:
        dequantize_int(*_int_args(body, n, header), flat)
    elif header.scheme == SCHEME_KIVI:
        _dequantize_kivi(body, header, flat.reshape(shape.array_shape))
    else:
        scales, codes = _fp8_sections(body, _fp8_scales(shape, header.per_head), n)
        dequantize_fp8(codes, header.dtype, shape.head_dim, 2 * shape.layers * shape.kv_heads,
                       header.per_head, scales, E4M3_VALUES, flat)
    return flat.reshape(shape.array_shape), DTYPE_NAMES[header.dtype]


def _int_args(body, n, header):
    scales, zeros, codes = _int_section(body, n, header.group, header.bits, header.symmetric)
    return codes, n, header.dtype, header.group, header.bits, header.symmetric, scales, zeros


def _dequantize_kivi(body: np.ndarray, header: BlockHeader, out: np.ndarray) -> None:
    shape = header.shape
    quantized = shape.tokens - header.residual
    c = shape.per_token_per_kv
    qn = quantized * c
    k_sec, v_sec, raw = _kivi_sections(body, shape, header.group, header.bits, quantized)
    keys = np.empty(qn, out.dtype)
    dequantize_int(k_sec[2], qn, header.dtype, header.group, header.bits, False, k_sec[0],
                   k_sec[1], keys)
    out[:quantized, 0] = keys.reshape(c, quantized).T.reshape(out[:quantized, 0].shape)
    values = np.empty(qn, out.dtype)
    dequantize_int(v_sec[2], qn, header.dtype, header.group, header.bits, False, v_sec[0],
                   v_sec[1], values)
    out[:quantized, 1] = values.reshape(out[:quantized, 1].shape)
    tail = out[quantized:]
    tail.reshape(-1).view(np.uint8)[:] = raw[:tail.nbytes]
