"""Requantize: a stored compressed block rewritten at a lower precision, inside the drive.

The drive holds only the compressed block, so a demotion (QEvict's recoverable tier, int8 ->
int4) is the block dequantized to its element type and quantized again under the new scheme:
the same kernels as a dequantized retrieve followed by a quantized store, with no transfer in
between.  The new block keeps the old one's shape, element type, the host's layout and its
page summaries' page size; its summaries are computed afresh from the requantized keys, so
that they bound what attention will read (firmware/summaries.py).

"Lower" is fewer bits per element (a plain block counts its element's 16 or 32; fp8 8) and a
smaller block: fp8 -> int8 is a change of format, not a demotion, and a KIVI scheme whose
full-precision window covers the block would not save a byte.  Anything else is refused with
E_NOT_LOWER before any kernel runs (the data plane answers INVALID_FIELD).
"""

import numpy as np
from numba import njit

from firmware.blockops import (
    E_NOT_LOWER,
    E_OUT_SMALL,
    NPARAM,
    P_BITS,
    P_BY_HEAD,
    P_DTYPE,
    P_HDIM,
    P_HEADS,
    P_LAYERS,
    P_LAYOUT,
    P_SUMMARY_PAGE,
    P_TOKENS,
    add_summaries,
    check_shape,
    compressed_bytes,
    dequantize_block,
    dequantized_bytes,
    open_header,
    parse_scheme_name,
    peek_header,
    quantize_block,
    summary_bytes,
)
from firmware.blockparams import _element_bytes
from firmware.kind_dispatch import kind_body_is_elements

_J = dict(cache=True, nogil=True, error_model="numpy")
_KEPT = (P_DTYPE, P_LAYOUT, P_TOKENS, P_LAYERS, P_HEADS, P_HDIM, P_SUMMARY_PAGE)


@njit(**_J)
def precision_bits(p):
    """Bits per element of a block's scheme: its codes', or a plain block's element's."""
    return _element_bytes(p[P_DTYPE]) * 8 if kind_body_is_elements(p) else p[P_BITS]


@njit(**_J)
def requantize_params(blob, name, old, new):
    """The stored block's header into old (checksum not verified: the dequantize does that)
    and the scheme `name` (ASCII bytes, NUL-padded) over the same block into new.  Returns 0,
    a corrupt block's code, E_SCHEME, E_REQUEST (the scheme does not fit the block's shape)
    or E_NOT_LOWER."""
    e = peek_header(blob, old)
    if e:
        e = open_header(blob, old)  # the block's first failure, as a dequantize names it
        return e if e else -1
    for i in range(NPARAM):
        new[i] = 0
    for i in _KEPT:
        new[i] = old[i]
    e = parse_scheme_name(name, new)
    if e:
        return e
    e = check_shape(new)
    if e:
        return e
    if precision_bits(new) >= precision_bits(old) or compressed_bytes(new) >= blob.shape[0]:
        return E_NOT_LOWER
    return 0


@njit(**_J)
def requantize_block(blob, name, out, by_head, old, new):
    """blob (a stored compressed block, 8-byte aligned) at the lower scheme `name` into out
    (8-byte aligned; out.shape[0] 0: check only).  old and new get the two blocks' params.
    Returns the new block's size, or a failure (requantize_params', E_OUT_SMALL, a corrupt
    block's code from the dequantize, E_NONFINITE when the dequantized values overflow the
    element type)."""
    e = requantize_params(blob, name, old, new)
    if e:
        return e
    total = compressed_bytes(new)
    if out.shape[0] < total:
        return E_OUT_SMALL
    scratch = np.empty(dequantized_bytes(old), np.uint8)
    n = dequantize_block(blob, scratch, old)  # verifies the checksum
    if n < 0:
        return n
    new[P_BY_HEAD] = by_head
    n = quantize_block(new, scratch, out[:total])
    if n > 0 and summary_bytes(new):
        n = add_summaries(out[:n], np.zeros(NPARAM, np.int64))
    return n
