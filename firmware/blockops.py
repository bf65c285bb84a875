"""Whole-block quantize and dequantize, compiled end to end: the one definition the drive runs.

`quantize_block` and `dequantize_block` take raw bytes (a KV block, a compressed block) and
do everything the firmware does for one command — scheme and shape checks, section layout,
each quantization kind's own code (firmware/kinds.py: one module per kind, called through
the generated firmware/kind_dispatch.py), the header and its checksum — with no Python
object, so that the data plane can call them from its own threads through the C entry
points in firmware/entry.py.  firmware/quant.py is the Python API over the same functions
(its error messages are made from the codes returned here).

A scheme and a block shape travel as an int64 array (`P_*`, firmware/blockparams.py).  The
wire form of a quantized-store request (an sde_quant_req, `SQRQ`; c/wire/sde_queue.h) is parsed
here too.  Failures are negative return codes (`E_*`), never exceptions: nothing raised
inside a C callback can reach a caller (hence numpy's error model: no ZeroDivisionError
path).
"""

import numpy as np
from numba import njit

from firmware import kind_int
from firmware.abi import (  # noqa: F401  (re-exported: the firmware's names for them)
    QREQ_BYTES,
    QREQ_DTYPE,
    QREQ_HEAD_DIM,
    QREQ_HEADS,
    QREQ_LAYERS,
    QREQ_LAYOUT,
    QREQ_MAGIC,
    QREQ_SCHEME,
    QREQ_SUMMARY_PAGE,
    QREQ_TOKENS,
    SCHEME_FP8,
    SCHEME_INT,
    SCHEME_KIVI,
    SCHEME_PLAIN,
)
from firmware.blockparams import *  # noqa: F403  (re-exported: B.P_KIND and the rest)
from firmware.blockparams import (
    CHECKSUM_WORD,
    E_BODY,
    E_CHECKSUM,
    E_FIELDS,
    E_LENGTH,
    E_MAGIC,
    E_NONFINITE,
    E_OUT_SMALL,
    E_REQUEST,
    E_SCHEME,
    E_SHAPE,
    E_SHORT,
    E_VALUE_SIZE,
    E_VERSION,
    FLAG_BY_HEAD,
    FLAG_LAYOUT_2LT,
    FLAG_PER_HEAD,
    FLAG_SYMMETRIC,
    HEADER_BYTES,
    LAYOUT_2LT,
    LAYOUT_BY_HEAD,
    LAYOUT_T2L,
    MAGIC,
    NPARAM,
    P_BITS,
    P_BODY,
    P_BY_HEAD,
    P_CHECKSUM,
    P_DTYPE,
    P_GROUP,
    P_HDIM,
    P_HEADS,
    P_KIND,
    P_LAYERS,
    P_LAYOUT,
    P_PER_HEAD,
    P_RESIDUAL,
    P_SUMMARY_PAGE,
    P_SYM,
    P_TOKENS,
    REQUEST_MAGIC,
    VERSION,
    _element_bytes,
    _get,
    _put,
    check_shape,
    elements,
)
from firmware.checksum import sum64, sum64_around
from firmware.int_sections import (  # noqa: F401  (re-exported)
    _int_views,
    int_section_bytes,
    int_section_used,
)
from firmware.kind_dispatch import (
    kind_body_bytes,
    kind_body_is_elements,
    kind_check_body,
    kind_check_fields,
    kind_dequantize,
    kind_header,
    kind_keeps_order,
    kind_known,
    kind_parse,
    kind_quantize,
    kind_quantized_tokens,
)
from firmware.kind_kivi import kivi_quantized_tokens  # noqa: F401  (re-exported)
from firmware.quant_int import dequantize_int
from firmware.summaries import MAX_PAGE, section_bytes, write_summaries

# ---- scheme names and sizes ------------------------------------------------------------------

@njit(cache=True, nogil=True, error_model="numpy")
def parse_scheme_name(name, p):
    """A scheme name (ASCII bytes, NUL-padded or not) into p's scheme fields, by the kind
    whose grammar it follows (firmware/kinds.py: `int8_g64`, `int4_g128_sym`,
    `kivi4_g32_r128`, `fp8_tensor`, `fp8_head`, `plain`).  Returns 0 or E_SCHEME."""
    n = 0
    while n < name.shape[0] and name[n] != 0:
        n += 1
    for i in range(n, name.shape[0]):
        if name[i] != 0:
            return E_SCHEME  # bytes after the terminating NUL
    p[P_KIND] = 0
    p[P_BITS] = 8
    p[P_GROUP] = 0
    p[P_SYM] = 0
    p[P_RESIDUAL] = 0
    p[P_PER_HEAD] = 0
    return kind_parse(name, n, p)


@njit(cache=True, nogil=True, error_model="numpy")
def body_bytes(p, quantized):
    """The body of a block with these fields (`quantized`: the tokens its kind quantizes,
    where that matters: KIVI's)."""
    return kind_body_bytes(p, quantized)


@njit(cache=True, nogil=True, error_model="numpy")
def summary_bytes(p):
    """The page summaries' section after the body (firmware/summaries.py; 0: none)."""
    return section_bytes(p[P_TOKENS], p[P_LAYERS], p[P_HEADS], p[P_HDIM], p[P_SUMMARY_PAGE],
                         _element_bytes(p[P_DTYPE]))


@njit(cache=True, nogil=True, error_model="numpy")
def compressed_bytes(p):
    """The compressed block a quantize of p's scheme and shape makes."""
    return HEADER_BYTES + kind_body_bytes(p, kind_quantized_tokens(p)) + summary_bytes(p)


# ---- quantizing ----------------------------------------------------------------------------

@njit(cache=True, nogil=True, error_model="numpy")
def _write_header(p, out, total, residual, lo, hi, s1, s2):
    """The header of a block whose body out[64:total] is written, its checksum last (words
    [lo, hi) summed already: s1, s2)."""
    out[:HEADER_BYTES] = 0
    _put(out, 0, 4, MAGIC)
    _put(out, 4, 2, VERSION)
    _put(out, 6, 2, HEADER_BYTES)
    out[8] = p[P_KIND]
    bits, flags, group = kind_header(p)
    out[9] = bits
    if p[P_LAYOUT] == LAYOUT_2LT:
        flags |= FLAG_LAYOUT_2LT
    if p[P_BY_HEAD]:
        flags |= FLAG_BY_HEAD
    out[10] = flags
    out[11] = p[P_DTYPE]
    _put(out, 12, 4, group)
    _put(out, 16, 4, p[P_TOKENS])
    _put(out, 20, 4, p[P_LAYERS])
    _put(out, 24, 4, p[P_HEADS])
    _put(out, 28, 4, p[P_HDIM])
    _put(out, 32, 8, total - HEADER_BYTES - summary_bytes(p))  # the summaries follow it
    _put(out, 48, 4, residual)
    _put(out, 52, 2, p[P_SUMMARY_PAGE])
    _put(out, 40, 8, sum64_around(out[:total], CHECKSUM_WORD, lo, hi, s1, s2))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _row_at(layout, t, kv, layer, head, tokens, layers, heads):
    """The place, in head_dim rows, of row (token, K or V, layer, head) in a layout."""
    if layout == LAYOUT_T2L:
        return ((t * 2 + kv) * layers + layer) * heads + head
    if layout == LAYOUT_2LT:
        return ((kv * layers + layer) * tokens + t) * heads + head
    return ((layer * heads + head) * 2 + kv) * tokens + t  # LAYOUT_BY_HEAD


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _words(a, row):
    """a as 8-byte words when a row is whole words (every head_dim of 4 or more), else an
    empty view: rows then move byte by byte.  A slice assignment per row cost ~200 ns (60 ms
    for a 32 MiB block, six times the int8 quantize itself)."""
    return a.view(np.uint64) if row % 8 == 0 else a[:0].view(np.uint64)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _copy_row(src, s64, a, dst, d64, b, row):
    """Row a of src (bytes; s64 its words from _words) to row b of dst."""
    if row % 8 == 0:
        w = row // 8
        for i in range(w):
            d64[b * w + i] = s64[a * w + i]
    else:
        for i in range(row):
            dst[b * row + i] = src[a * row + i]


TILE = 16  # tokens whose rows move_rows moves together


@njit(cache=True, nogil=True, error_model="numpy")
def move_rows(p, src, src_layout, dst, dst_layout):
    """Copy a block's head_dim rows from one layout to another (bytes to bytes).  A tile of
    TILE tokens at a time: its rows of every layer and head (a few MiB at most) stay in cache
    while they are spread out, where token after token of one head strode a whole token's
    rows apart on each read."""
    tokens, layers, heads = p[P_TOKENS], p[P_LAYERS], p[P_HEADS]
    row = p[P_HDIM] * _element_bytes(p[P_DTYPE])
    s64, d64 = _words(src, row), _words(dst, row)
    for t0 in range(0, tokens, TILE):
        for layer in range(layers):
            for head in range(heads):
                for kv in range(2):
                    for t in range(t0, min(tokens, t0 + TILE)):
                        _copy_row(src, s64,
                                  _row_at(src_layout, t, kv, layer, head, tokens, layers, heads),
                                  dst, d64,
                                  _row_at(dst_layout, t, kv, layer, head, tokens, layers, heads),
                                  row)


@njit(cache=True, nogil=True, error_model="numpy")
def by_head_allowed(p):
    """Whether a kind's values are the same whatever the order of the rows: plain, and
    the integer kind when its groups divide head_dim (they then never span two rows).  fp8's
    per-head scales and KIVI's per-channel keys index the token order: they keep it."""
    if kind_body_is_elements(p):
        return True
    return p[P_KIND] == kind_int.CODE and p[P_HDIM] % p[P_GROUP] == 0


@njit(cache=True, nogil=True, error_model="numpy")
def _in_media_order(p, src):
    """The block's rows in the order its kind quantizes them: by head (p[P_BY_HEAD]), token
    order for kinds that need it, or as the host sent them."""
    if p[P_BY_HEAD]:
        ordered = np.empty(src.shape[0], np.uint8)
        move_rows(p, src, p[P_LAYOUT], ordered, LAYOUT_BY_HEAD)
        return ordered
    if p[P_LAYOUT] == LAYOUT_2LT and not kind_keeps_order(p):
        ordered = np.empty(src.shape[0], np.uint8)
        move_rows(p, src, LAYOUT_2LT, ordered, LAYOUT_T2L)
        return ordered
    return src


@njit(cache=True, nogil=True, error_model="numpy")
def quantize_block(p, src, out):
    """Quantize a KV block (src: its bytes, fp16/bf16/fp32 as p[P_DTYPE] says, shape as p
    says) into out (8-byte aligned).  Returns the compressed size, or E_VALUE_SIZE,
    E_OUT_SMALL, E_NONFINITE, E_REQUEST."""
    if check_shape(p):
        return E_REQUEST
    dtype = p[P_DTYPE]
    n = elements(p)
    if src.shape[0] != n * _element_bytes(dtype):
        return E_VALUE_SIZE
    total = compressed_bytes(p)
    if out.shape[0] < total:
        return E_OUT_SMALL
    body = out[HEADER_BYTES:total - summary_bytes(p)]
    p[P_BY_HEAD] = 1 if p[P_BY_HEAD] and by_head_allowed(p) else 0
    src = _in_media_order(p, src)
    if dtype == 2:
        bad, residual, lo, hi, s1, s2 = kind_quantize(p, src.view(np.float32), src, body)
    else:
        bad, residual, lo, hi, s1, s2 = kind_quantize(p, src.view(np.uint16), src, body)
    if bad:
        return E_NONFINITE
    out[total - summary_bytes(p):total] = 0  # add_summaries fills the section in
    _write_header(p, out, total, residual, lo, hi, s1, s2)
    return total


@njit(cache=True, nogil=True, error_model="numpy")
def add_summaries(block, p):
    """Fill in the page summaries of a block quantize_block just made (block: exactly its
    bytes; p: scratch, gets its header) and seal it again.  Returns its size, or a corrupt
    block's code.  A separate step from quantize_block, not called from it: it reads the
    keys back through the dequantize kernels, and firmware/warm.py compiles the quantize
    and the dequantize paths in parallel processes that must share no function."""
    e = _read_header(block, p)
    if e:
        return e
    if p[P_SUMMARY_PAGE]:
        body = block[HEADER_BYTES:HEADER_BYTES + p[P_BODY]]
        _summarize(p, p[P_RESIDUAL], body, block[HEADER_BYTES + p[P_BODY]:])
        _put(block, 40, 8, sum64(block, CHECKSUM_WORD))
    return block.shape[0]


@njit(cache=True, nogil=True, error_model="numpy")
def _summarize(p, residual, body, section):
    """The page summaries of a block whose body is written, from its keys as a dequantize
    gives them back (the bound must hold for the keys attention reads); a plain block's
    keys are its body's own (kind_body_is_elements)."""
    dtype = p[P_DTYPE]
    p[P_RESIDUAL] = residual
    nbytes = elements(p) * _element_bytes(dtype)
    plain = kind_body_is_elements(p)
    x = body[:nbytes] if plain else np.empty(nbytes, np.uint8)
    two_lt = p[P_LAYOUT] == LAYOUT_2LT and kind_keeps_order(p)
    if p[P_BY_HEAD]:  # the summaries read the keys in token order
        if not plain:
            if dtype == 2:
                kind_dequantize(p, body, x.view(np.float32), x)
            else:
                kind_dequantize(p, body, x.view(np.uint16), x)
        t2l = np.empty(nbytes, np.uint8)
        move_rows(p, x, LAYOUT_BY_HEAD, t2l, LAYOUT_T2L)
        x, plain, two_lt = t2l, True, False
    if dtype == 2:
        xs = x.view(np.float32)
        if not plain:
            kind_dequantize(p, body, xs, x)
        write_summaries(xs, dtype, two_lt, p[P_TOKENS], p[P_LAYERS], p[P_HEADS], p[P_HDIM],
                        p[P_SUMMARY_PAGE], section)
    else:
        xs = x.view(np.uint16)
        if not plain:
            kind_dequantize(p, body, xs, x)
        write_summaries(xs, dtype, two_lt, p[P_TOKENS], p[P_LAYERS], p[P_HEADS], p[P_HDIM],
                        p[P_SUMMARY_PAGE], section)


@njit(cache=True, nogil=True, error_model="numpy")
def parse_request(req, p):
    """A quantized-store request (an sde_quant_req, c/wire/sde_queue.h: magic SQRQ, dtype,
    layout, scheme name, shape, summary page) into p.  Returns 0, E_REQUEST or E_SCHEME."""
    if req.shape[0] < QREQ_BYTES or _get(req, QREQ_MAGIC, 4) != REQUEST_MAGIC:
        return E_REQUEST
    p[P_DTYPE] = req[QREQ_DTYPE]
    e = parse_scheme_name(req[QREQ_SCHEME:QREQ_TOKENS], p)
    if e:
        return e
    p[P_LAYOUT] = req[QREQ_LAYOUT]
    if p[P_LAYOUT] > LAYOUT_2LT or req[QREQ_LAYOUT + 1] or req[QREQ_LAYOUT + 2]:
        return E_REQUEST  # an unknown layout, or the reserved bytes after it set
    p[P_TOKENS] = _get(req, QREQ_TOKENS, 4)
    p[P_LAYERS] = _get(req, QREQ_LAYERS, 4)
    p[P_HEADS] = _get(req, QREQ_HEADS, 4)
    p[P_HDIM] = _get(req, QREQ_HEAD_DIM, 4)
    p[P_SUMMARY_PAGE] = _get(req, QREQ_SUMMARY_PAGE, 2)
    for i in range(QREQ_SUMMARY_PAGE + 2, QREQ_BYTES):
        if req[i]:
            return E_REQUEST  # reserved bytes set
    if p[P_SUMMARY_PAGE] > MAX_PAGE:
        return E_REQUEST  # a page past MAX_PAGE
    return check_shape(p)


# ---- opening and dequantizing --------------------------------------------------------------

@njit(cache=True, nogil=True, error_model="numpy")
def _read_header(blob, p):
    """A compressed block's header fields into p (see open_header); 0, or E_SHORT,
    E_MAGIC, E_VERSION or E_LENGTH.  The checksum and the fields are not checked here."""
    for i in range(NPARAM):
        p[i] = 0
    if blob.shape[0] < HEADER_BYTES:
        return E_SHORT
    if _get(blob, 0, 4) != MAGIC:
        return E_MAGIC
    version = _get(blob, 4, 2)
    if version < 1 or version > VERSION or _get(blob, 6, 2) != HEADER_BYTES:
        return E_VERSION
    flags = blob[10]
    p[P_KIND], p[P_BITS], p[P_DTYPE] = blob[8], blob[9], blob[11]
    p[P_GROUP] = _get(blob, 12, 4)
    p[P_TOKENS] = _get(blob, 16, 4)
    p[P_LAYERS] = _get(blob, 20, 4)
    p[P_HEADS] = _get(blob, 24, 4)
    p[P_HDIM] = _get(blob, 28, 4)
    p[P_BODY] = _get(blob, 32, 8)
    p[P_CHECKSUM] = _get(blob, 40, 8)
    p[P_RESIDUAL] = _get(blob, 48, 4)
    p[P_SUMMARY_PAGE] = _get(blob, 52, 2)
    p[P_SYM] = 1 if flags & FLAG_SYMMETRIC else 0
    p[P_PER_HEAD] = 1 if flags & FLAG_PER_HEAD else 0
    p[P_LAYOUT] = LAYOUT_2LT if flags & FLAG_LAYOUT_2LT else LAYOUT_T2L
    p[P_BY_HEAD] = 1 if flags & FLAG_BY_HEAD else 0
    # a wrong shape or page is _check_fields' to name; the length is checked without them
    sb = summary_bytes(p) if p[P_SUMMARY_PAGE] <= MAX_PAGE and check_shape(p) == 0 else 0
    if p[P_BODY] < 0 or blob.shape[0] != HEADER_BYTES + p[P_BODY] + sb:
        return E_LENGTH
    return 0


@njit(cache=True, nogil=True, error_model="numpy")
def _check_fields(blob, p):
    """0, or the first wrong field of a header read by _read_header (E_FIELDS ..
    E_KIVI_GROUPS): the fields every block has, then its kind's."""
    kind, bits, flags, dtype = blob[8], blob[9], blob[10], blob[11]
    if not kind_known(kind) or dtype > 2 or flags & ~15 or p[P_SUMMARY_PAGE] > MAX_PAGE:
        return E_FIELDS
    e = kind_check_fields(p, bits, flags & ~FLAG_BY_HEAD, dtype)
    if e:
        return e
    if check_shape(p):
        return E_SHAPE
    # by head only from version 2 on, and only for the kinds that allow it
    if p[P_BY_HEAD] and (_get(blob, 4, 2) < 2 or not by_head_allowed(p)):
        return E_FIELDS
    quantized = p[P_TOKENS] - p[P_RESIDUAL]
    e = kind_check_body(p, quantized)
    if e:
        return e
    if p[P_BODY] != kind_body_bytes(p, quantized):
        return E_BODY
    return 0


@njit(cache=True, nogil=True, error_model="numpy")
def peek_header(blob, p):
    """open_header without the checksum: enough to size a dequantize, which verifies the
    checksum itself.  A nonzero result is not the reason to report (a corrupt block shows
    its checksum failure before its fields): call open_header for that."""
    e = _read_header(blob, p)
    return e if e else _check_fields(blob, p)


@njit(cache=True, nogil=True, error_model="numpy")
def open_header(blob, p):
    """Verify a compressed block (blob: uint8, 8-byte aligned) and read its header into p
    (P_RESIDUAL: the tokens kept in full precision; P_BODY, P_CHECKSUM).  Returns 0 or the
    first failure (E_SHORT .. E_KIVI_GROUPS)."""
    e = _read_header(blob, p)
    if e:
        return e
    if np.int64(sum64(blob, CHECKSUM_WORD)) != p[P_CHECKSUM]:
        return E_CHECKSUM
    # fields are checked after the checksum too: a block can be well-sealed and still wrong
    return _check_fields(blob, p)


@njit(cache=True, nogil=True, error_model="numpy")
def dequantize_block(blob, out, p):
    """Dequantize a compressed block into out (uint8, at least the block's bytes).  p gets
    its header (see open_header).  Returns the bytes written, or a corrupt-block code, or
    E_OUT_SMALL (then the bytes needed are elements(p) times the element size).

    An integer block whose header holds is verified while it is dequantized (its codes summed
    piece by piece, in cache): a checksum failure is then found after `out` was written,
    and returned all the same.  Every other block is verified first."""
    e = _read_header(blob, p)
    if e:
        return e
    # the integer kind's fast path: its codes summed for the checksum as they are decoded
    fused = (_check_fields(blob, p) == 0 and p[P_KIND] == kind_int.CODE
             and kind_int.can_fuse(p) and not p[P_BY_HEAD])
    dtype = p[P_DTYPE]
    need = elements(p) * _element_bytes(dtype) if fused else 0
    if not fused or out.shape[0] < need:  # a corrupt block says so before E_OUT_SMALL
        e = open_header(blob, p)
        if e:
            return e
        need = elements(p) * _element_bytes(dtype)
    if out.shape[0] < need:
        return E_OUT_SMALL
    dst = out[:need]
    body = blob[HEADER_BYTES:]
    if fused:
        if dtype == 2:
            lo, hi, s1, s2 = kind_int.dequantize_summed(p, body, dst.view(np.float32))
        else:
            lo, hi, s1, s2 = kind_int.dequantize_summed(p, body, dst.view(np.uint16))
        if np.int64(sum64_around(blob, CHECKSUM_WORD, lo, hi, s1, s2)) != p[P_CHECKSUM]:
            return E_CHECKSUM
        return need
    if p[P_BY_HEAD] and kind_body_is_elements(p):  # plain: its rows straight back
        move_rows(p, body[:need], LAYOUT_BY_HEAD, dst, p[P_LAYOUT])
        return need
    if p[P_BY_HEAD] and p[P_KIND] == kind_int.CODE:
        if dtype == 2:
            _dequantize_int_by_head(p, body, dst, np.empty(p[P_TOKENS] * p[P_HDIM], np.float32))
        else:
            _dequantize_int_by_head(p, body, dst, np.empty(p[P_TOKENS] * p[P_HDIM], np.uint16))
        return need
    reorder = p[P_BY_HEAD] or (p[P_LAYOUT] == LAYOUT_2LT and not kind_keeps_order(p))
    into = np.empty(need, np.uint8) if reorder else dst
    if dtype == 2:
        kind_dequantize(p, body, into.view(np.float32), into)
    else:
        kind_dequantize(p, body, into.view(np.uint16), into)
    if p[P_BY_HEAD]:  # back to the host's order
        move_rows(p, into, LAYOUT_BY_HEAD, dst, p[P_LAYOUT])
    elif reorder:
        move_rows(p, into, LAYOUT_T2L, dst, LAYOUT_2LT)
    return need


@njit(cache=True, nogil=True, error_model="numpy")
def _dequantize_int_by_head(p, body, dst, slab):
    """An integer block laid out by head, dequantized one (layer, head, K/V) run of tokens
    at a time into `slab` (in cache) and its rows put where the host's order has them: no
    block-sized scratch and no second pass over memory (that was two thirds of the
    dequantize).  The groups divide head_dim, so a run is whole groups."""
    tokens, layers, heads, dim = p[P_TOKENS], p[P_LAYERS], p[P_HEADS], p[P_HDIM]
    group, bits, sym, dtype = p[P_GROUP], p[P_BITS], p[P_SYM] != 0, p[P_DTYPE]
    s, z, c = _int_views(body, elements(p), group, bits, sym)
    n = tokens * dim
    src = slab.view(np.uint8)
    row = dim * _element_bytes(dtype)
    s64, d64 = _words(src, row), _words(dst, row)
    for layer in range(layers):
        for head in range(heads):
            for kv in range(2):
                e0 = (((layer * heads + head) * 2 + kv) * tokens) * dim
                g0, g1 = e0 // group, (e0 + n) // group
                dequantize_int(c[e0 * bits // 8:(e0 + n) * bits // 8], n, dtype, group, bits,
                               sym, s[g0:g1], z[g0:g1] if not sym else z, slab)
                for t in range(tokens):
                    _copy_row(src, s64, t, dst, d64,
                              _row_at(p[P_LAYOUT], t, kv, layer, head, tokens, layers, heads),
                              row)


@njit(cache=True, nogil=True, error_model="numpy")
def dequantized_bytes(p):
    """The bytes a dequantize of an opened block (p from open_header) writes."""
    return elements(p) * _element_bytes(p[P_DTYPE])
