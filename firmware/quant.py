"""Quantize / dequantize KV blocks into self-describing compressed blocks (firmware/blockfmt).

Scheme names:
- `int8_g64`, `int4_g128_sym`: group-wise int over the flat block (firmware/quant_int.py),
  asymmetric unless `_sym`; groups of 32, 64 or 128.
- `kivi4_g32_r128`: KIVI. Keys grouped per channel (groups run along tokens), values per
  token (groups run along channels), both asymmetric; the last tokens stay in full precision:
  at least R of them, plus however many do not fill a whole group of G tokens.
- `fp8_tensor`, `fp8_head`: e4m3fn with one scale per block or per KV head
  (firmware/quant_fp8.py).
- `plain`: the block as it is (its own element type), in the block format: how a block is
  stored with its layout, so that the drive can keep its page summaries.
`parse_scheme` raises a clear ValueError for anything else.

This is the Python API over firmware/blockops.py, the compiled whole-block code the drive
itself runs (through firmware/entry.py): one definition of names, layout and kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from firmware import blockops as B
from firmware import kinds
from firmware.blockfmt import INT_GROUPS, CorruptBlockError, open_block
from firmware.layout import DTYPE_NAMES, KVShape, dtype_code, storage_dtype
from firmware.summaries import MAX_PAGE

GROUP_SIZES = INT_GROUPS
_MODULES = {m.NAME: m for m in kinds.modules()}  # the kinds (firmware/kinds.py), by name
_KINDS = {m.CODE: name for name, m in _MODULES.items()}
_KIND_CODES = {name: m.CODE for name, m in _MODULES.items()}


@dataclass(frozen=True)
class Scheme:
    kind: str  # a kind's NAME (firmware/kinds.py): "int", "kivi", "fp8", "plain"
    bits: int = 8
    group: int = 0
    symmetric: bool = False
    residual: int = 0  # KIVI: tokens kept in full precision at least
    per_head: bool = False  # fp8: a scale per KV head

    @property
    def name(self) -> str:
        return _MODULES[self.kind].scheme_name(self)


def parse_scheme(name: str) -> Scheme:
    """The scheme a name gives; the drive parses the same names (firmware/blockops.py)."""
    p = np.zeros(B.NPARAM, np.int64)
    raw = name.encode("ascii", "replace") if isinstance(name, str) else b"\xff"
    if not raw or len(raw) > 32 or B.parse_scheme_name(np.frombuffer(raw, np.uint8), p):
        raise ValueError(
            f"unknown quantization scheme {name!r}: expected "
            + ", ".join(m.GRAMMAR for m in _MODULES.values()) + f" (N in {GROUP_SIZES})"
        )
    return _scheme_of(p)


def _scheme_of(p: np.ndarray) -> Scheme:
    return Scheme(_KINDS[int(p[B.P_KIND])], int(p[B.P_BITS]), int(p[B.P_GROUP]),
                  bool(p[B.P_SYM]), int(p[B.P_RESIDUAL]), bool(p[B.P_PER_HEAD]))


def params(shape: KVShape, scheme: Scheme | str, dtype: str, summary_page: int = 0,
           by_head: bool = True) -> np.ndarray:
    """The compiled code's int64 description of a scheme, a block shape and an element type
    (summary_page: tokens per page of the page summaries the block carries; 0: none;
    by_head: lay the body out by head where the kind allows, as the drive does)."""
    if not 0 <= summary_page <= MAX_PAGE:
        raise ValueError(f"summary_page is 0 (none) to {MAX_PAGE} tokens, got {summary_page}")
    if isinstance(scheme, str):
        scheme = parse_scheme(scheme)
    p = np.zeros(B.NPARAM, np.int64)
    p[B.P_DTYPE] = dtype_code(dtype)
    p[B.P_KIND] = _KIND_CODES[scheme.kind]
    p[B.P_BITS], p[B.P_GROUP] = scheme.bits, scheme.group
    p[B.P_SYM], p[B.P_RESIDUAL] = scheme.symmetric, scheme.residual
    p[B.P_PER_HEAD] = scheme.per_head
    p[B.P_TOKENS], p[B.P_LAYERS] = shape.tokens, shape.layers
    p[B.P_HEADS], p[B.P_HDIM] = shape.kv_heads, shape.head_dim
    p[B.P_SUMMARY_PAGE] = summary_page
    p[B.P_BY_HEAD] = by_head
    return p


def kivi_quantized_tokens(tokens: int, group: int, residual: int) -> int:
    """Tokens KIVI quantizes: whole groups of `group` tokens before the last `residual`."""
    return int(B.kivi_quantized_tokens(tokens, group, residual))


def compressed_nbytes(shape: KVShape, scheme: Scheme | str, dtype: str = "fp16",
                      summary_page: int = 0) -> int:
    """Size of the compressed block for a KV block of this shape, scheme and element type
    (with page summaries of summary_page tokens per page, when not 0)."""
    return int(B.compressed_bytes(params(shape, scheme, dtype, summary_page)))


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


def quantize(block: np.ndarray, dtype: str, scheme: Scheme | str,
             out: np.ndarray | None = None, summary_page: int = 0,
             by_head: bool = True) -> np.ndarray:
    """block: (tokens, 2, layers, kv_heads, head_dim) as uint16 (fp16/bf16 bits) or float32.
    Returns the compressed block (uint8), written into `out` when given (see
    compressed_nbytes), with its page summaries when summary_page is not 0
    (firmware/summaries.py; block_summaries reads them), laid out by head where the kind
    allows unless by_head is False (firmware/blockfmt.py).  inf or NaN in the input raises
    ValueError."""
    code = dtype_code(dtype)
    want = storage_dtype(code)
    if block.dtype != want:
        raise ValueError(f"a {dtype} block is carried as {want}, got {block.dtype}")
    p = params(_block_shape(block), scheme, dtype, summary_page, by_head)
    size = int(B.compressed_bytes(p))
    if out is None:
        blob = np.empty(size, np.uint8)
    else:
        blob = _check_out(out, np.dtype(np.uint8), size, "compressed block")
    src = np.ascontiguousarray(block).reshape(-1).view(np.uint8)
    if not src.flags.writeable:  # as in dequantize: one compiled specialization, not two
        src = src.copy()
    n = B.quantize_block(p, src, blob)
    if n == B.E_NONFINITE:
        raise ValueError("KV block holds inf/NaN values: refusing to quantize it")
    if n > 0 and summary_page:
        n = B.add_summaries(blob, np.zeros(B.NPARAM, np.int64))
    assert n == size, n  # every other failure was checked above
    return blob


def dequantize(blob, out: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """Compressed block -> (block array in its original element type, dtype name), written
    into `out` when given.  A corrupt block raises CorruptBlockError."""
    buf = np.frombuffer(blob, np.uint8) if not isinstance(blob, np.ndarray) else blob
    buf = buf.reshape(-1).view(np.uint8)
    # a copy when misaligned, or read-only (a bytes object's buffer): Numba compiles another
    # specialization of the whole dequantize path for read-only arrays (~50 s on a fresh
    # cache, which firmware.warm does not cover); the copy costs a memcpy of the block
    if buf.ctypes.data % 8 or not buf.flags.writeable:
        buf = buf.copy()
    p = np.zeros(B.NPARAM, np.int64)
    if B.peek_header(buf, p):
        open_block(buf)  # raises with the block's first failure, as the drive reports it
    # the checksum is verified by the dequantize itself, in the same pass over the block
    shape = KVShape(*(int(p[i]) for i in (B.P_TOKENS, B.P_LAYERS, B.P_HEADS, B.P_HDIM)))
    want = storage_dtype(int(p[B.P_DTYPE]))
    try:
        flat = (np.empty(shape.elements, dtype=want) if out is None
                else _check_out(out, want, shape.elements, "KV block"))
    except ValueError:
        open_block(buf)  # a corrupt block says so before a wrong buffer, as the drive does
        raise
    n = B.dequantize_block(buf, flat.view(np.uint8), p)
    if n < 0:
        open_block(buf)  # raises with the reason
        raise CorruptBlockError(f"corrupt compressed block (code {n})")
    assert n == flat.nbytes, n
    return flat.reshape(shape.array_shape), DTYPE_NAMES[int(p[B.P_DTYPE])]


def requantize(blob, scheme: Scheme | str, by_head: bool = True) -> np.ndarray:
    """A compressed block rewritten at a lower scheme, as the drive's KV_REQUANTIZE does
    (firmware/requant.py: dequantized, quantized again, its page summaries recomputed).
    Raises ValueError for a scheme that is unknown, does not fit the block, or is not lower
    (fewer bits per element and a smaller block), CorruptBlockError for a corrupt block."""
    from firmware import requant  # its compiled path only when it is used

    if isinstance(scheme, Scheme):
        scheme = scheme.name
    parse_scheme(scheme)  # an unknown name says so, with the grammar
    buf = np.frombuffer(blob, np.uint8) if not isinstance(blob, np.ndarray) else blob
    buf = buf.reshape(-1).view(np.uint8)
    if buf.ctypes.data % 8 or not buf.flags.writeable:  # as in dequantize
        buf = buf.copy()
    name = np.zeros(32, np.uint8)
    name[:len(scheme)] = np.frombuffer(scheme.encode("ascii"), np.uint8)
    old, new = np.zeros(B.NPARAM, np.int64), np.zeros(B.NPARAM, np.int64)
    e = requant.requantize_params(buf, name, old, new)
    if e == B.E_NOT_LOWER:
        raise ValueError(f"{scheme!r} is not below the block's {_scheme_of(old).name!r}: a "
                         "requantize needs fewer bits per element and a smaller block")
    if e == B.E_REQUEST:
        raise ValueError(f"{scheme!r} does not fit the block's shape")
    if e:
        open_block(buf)  # raises with the block's first failure
        raise CorruptBlockError(f"corrupt compressed block (code {e})")
    out = np.empty(int(B.compressed_bytes(new)), np.uint8)
    n = requant.requantize_block(buf, name, out, int(by_head), old, new)
    if n == B.E_NONFINITE:
        raise ValueError("the block's values overflow its element type at the new scheme")
    if n < 0:
        open_block(buf)
        raise CorruptBlockError(f"corrupt compressed block (code {n})")
    assert n == out.size, n
    return out
