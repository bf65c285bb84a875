"""Whole-block quantize and dequantize, compiled end to end: the one definition the drive runs.

`quantize_block` and `dequantize_block` take raw bytes (a KV block, a compressed block) and
do everything the firmware does for one command — scheme and shape checks, section layout,
the kernels (firmware/quant_int.py, firmware/quant_fp8.py), the KIVI transposes, the header
and its checksum — with no Python object, so that the data plane can call them from its own
threads through the C entry points in firmware/entry.py.  firmware/quant.py is the Python
API over the same functions (its error messages are made from the codes returned here).

A scheme and a block shape travel as an int64 array (`P_*` indices below).  The wire form of
a quantized-store request (64 bytes, `SQRQ`; ssdemu_wire/layout.py) is parsed here too.
Failures are negative return codes (`E_*`), never exceptions: nothing raised inside a C
callback can reach a caller (hence numpy's error model: no ZeroDivisionError path).
"""

import numpy as np
from numba import njit

from firmware.abi import (  # noqa: F401  (re-exported: the firmware's names for them)
    E_NONFINITE,
    E_OUT_SMALL,
    E_REQUEST,
    E_SCHEME,
    E_VALUE_SIZE,
    SCHEME_FP8,
    SCHEME_INT,
    SCHEME_KIVI,
    SCHEME_PLAIN,
)
from firmware.checksum import sum64, sum64_around, word_sums
from firmware.convert import bf16_to_f32, fp16_to_f32
from firmware.quant_fp8 import E4M3_VALUES, dequantize_fp8, quantize_fp8
from firmware.quant_int import dequantize_int, quantize_int
from firmware.summaries import MAX_PAGE, section_bytes, write_summaries

HEADER_BYTES = 64
MAGIC = 0x564B4453  # b"SDKV" little-endian
VERSION = 1
REQUEST_MAGIC = 0x51525153  # b"SQRQ"
FLAG_SYMMETRIC = 1
FLAG_PER_HEAD = 2
# the block is (2, layers, tokens, heads, head_dim), LMCache's KV_2LTD, not the drive's
# (tokens, 2, layers, heads, head_dim).  Integer schemes honour it as it is (their groups
# run along head_dim in either order, and the body keeps the order it was given); fp8's
# per-head scales and KIVI's per-channel keys need token order, so their kernels take the
# block's rows in that order first (inside the drive: the host sends and gets its own
# layout either way)
FLAG_LAYOUT_2LT = 4
LAYOUT_T2L, LAYOUT_2LT = 0, 1
CHECKSUM_WORD = 5  # the checksum's 8 bytes at offset 40
MAX_DIM = 1 << 31  # a shape field past this is refused (products then fit an int64)
MAX_ELEMENTS = 1 << 40

# the scheme and shape of a block, as an int64 array
P_DTYPE, P_KIND, P_BITS, P_GROUP, P_SYM, P_RESIDUAL, P_PER_HEAD = 0, 1, 2, 3, 4, 5, 6
P_TOKENS, P_LAYERS, P_HEADS, P_HDIM, P_BODY, P_CHECKSUM = 7, 8, 9, 10, 11, 12
P_LAYOUT = 13
P_SUMMARY_PAGE = 14  # tokens per page of the block's page summaries (0: none)
NPARAM = 15

# failures (negative returns); 1..9 describe a corrupt compressed block
E_SHORT, E_MAGIC, E_VERSION, E_LENGTH, E_CHECKSUM = -1, -2, -3, -4, -5
E_FIELDS, E_SHAPE, E_BODY, E_KIVI_GROUPS = -6, -7, -8, -9
# -10 to -14, shared with the data plane (c/fw/sde_fw.h, through firmware/abi.py):
# E_OUT_SMALL, the output buffer is smaller than the result; E_NONFINITE, inf or NaN in a
# block to quantize; E_REQUEST, a malformed quantized-store request (magic, dtype, scheme,
# shape); E_VALUE_SIZE, the block's bytes do not match the request's shape and dtype;
# E_SCHEME, an unknown scheme name


# ---- little-endian fields --------------------------------------------------------------

@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _get(b, off, n):
    v = np.int64(0)
    for i in range(n):
        v |= np.int64(b[off + i]) << np.int64(8 * i)
    return v


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _put(b, off, n, v):
    u = np.uint64(v)  # one signedness: int64 mixed with uint64 would make floats
    for i in range(n):
        b[off + i] = np.uint8((u >> np.uint64(8 * i)) & np.uint64(0xFF))


# ---- scheme names ------------------------------------------------------------------------

@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _is(name, n, pos, text):
    """Does name[pos:] start with the ASCII bytes of text (a uint8 array)?"""
    if pos + text.shape[0] > n:
        return False
    for i in range(text.shape[0]):
        if name[pos + i] != text[i]:
            return False
    return True


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _digits(name, n, pos, out, at):
    """A decimal number (1..9 digits) at name[pos:] into out[at]; returns the position after
    it, or -1."""
    v = 0
    i = pos
    while i < n and 48 <= name[i] <= 57 and i - pos < 9:
        v = v * 10 + (name[i] - 48)
        i += 1
    if i == pos or (i < n and 48 <= name[i] <= 57):
        return -1
    out[at] = v
    return i


_INT = np.frombuffer(b"int", np.uint8)
_KIVI = np.frombuffer(b"kivi", np.uint8)
_G = np.frombuffer(b"_g", np.uint8)
_R = np.frombuffer(b"_r", np.uint8)
_SYM = np.frombuffer(b"_sym", np.uint8)
_FP8_TENSOR = np.frombuffer(b"fp8_tensor", np.uint8)
_FP8_HEAD = np.frombuffer(b"fp8_head", np.uint8)
_PLAIN = np.frombuffer(b"plain", np.uint8)


@njit(cache=True, nogil=True, error_model="numpy")
def parse_scheme_name(name, p):
    """A scheme name (ASCII bytes, NUL-padded or not) into p's scheme fields: `int8_g64`,
    `int4_g128_sym`, `kivi4_g32_r128`, `fp8_tensor`, `fp8_head` (groups 32, 64 or 128), or
    `plain` (the block as it is, in the drive's block format).  Returns 0 or E_SCHEME."""
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
    if n == _FP8_TENSOR.shape[0] and _is(name, n, 0, _FP8_TENSOR):
        p[P_KIND] = SCHEME_FP8
        return 0
    if n == _FP8_HEAD.shape[0] and _is(name, n, 0, _FP8_HEAD):
        p[P_KIND] = SCHEME_FP8
        p[P_PER_HEAD] = 1
        return 0
    if n == _PLAIN.shape[0] and _is(name, n, 0, _PLAIN):
        p[P_KIND] = SCHEME_PLAIN
        p[P_BITS] = 0  # the header gives the element's bits (_write_header)
        return 0
    if _is(name, n, 0, _KIVI):
        kind, pos = SCHEME_KIVI, 4
    elif _is(name, n, 0, _INT):
        kind, pos = SCHEME_INT, 3
    else:
        return E_SCHEME
    if pos >= n or (name[pos] != 56 and name[pos] != 52):  # "8" or "4"
        return E_SCHEME
    p[P_BITS] = name[pos] - 48
    pos += 1
    if not _is(name, n, pos, _G):
        return E_SCHEME
    pos = _digits(name, n, pos + 2, p, P_GROUP)
    if pos < 0 or not (p[P_GROUP] == 32 or p[P_GROUP] == 64 or p[P_GROUP] == 128):
        return E_SCHEME
    if kind == SCHEME_KIVI:
        if not _is(name, n, pos, _R):
            return E_SCHEME
        pos = _digits(name, n, pos + 2, p, P_RESIDUAL)
        if pos < 0:
            return E_SCHEME
    elif pos < n:
        if not (n - pos == _SYM.shape[0] and _is(name, n, pos, _SYM)):
            return E_SCHEME
        p[P_SYM] = 1
        pos = n
    if pos != n:
        return E_SCHEME
    p[P_KIND] = kind
    return 0


# ---- sizes -------------------------------------------------------------------------------

@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _pad8(n):
    return (n + 7) & ~7


@njit(cache=True, nogil=True, error_model="numpy")
def int_section_used(n, group, bits, symmetric):
    groups = (n + group - 1) // group
    return 4 * groups * (1 if symmetric else 2) + (n if bits == 8 else (n + 1) // 2)


@njit(cache=True, nogil=True, error_model="numpy")
def int_section_bytes(n, group, bits, symmetric):
    return _pad8(int_section_used(n, group, bits, symmetric))


@njit(cache=True, nogil=True, error_model="numpy")
def kivi_quantized_tokens(tokens, group, residual):
    """Tokens KIVI quantizes: whole groups of `group` tokens before the last `residual`."""
    return max(0, tokens - residual) // group * group


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _element_bytes(dtype):
    return 4 if dtype == 2 else 2


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _keeps_order(p):
    """Integer and plain bodies keep the block's own order (LMCache's 2LT too); fp8's and
    KIVI's are in token order."""
    return p[P_KIND] == SCHEME_INT or p[P_KIND] == SCHEME_PLAIN


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _per_token(p):
    return p[P_LAYERS] * p[P_HEADS] * p[P_HDIM]


@njit(cache=True, nogil=True, error_model="numpy")
def elements(p):
    return p[P_TOKENS] * 2 * _per_token(p)


@njit(cache=True, nogil=True, error_model="numpy")
def _fp8_scales(p):
    return 2 * p[P_LAYERS] * p[P_HEADS] if p[P_PER_HEAD] else 1


@njit(cache=True, nogil=True, error_model="numpy")
def _kivi_body(p, quantized):
    c = _per_token(p)
    qn = quantized * c
    raw = (p[P_TOKENS] - quantized) * 2 * c * _element_bytes(p[P_DTYPE])
    return 2 * int_section_bytes(qn, p[P_GROUP], p[P_BITS], False) + _pad8(raw)


@njit(cache=True, nogil=True, error_model="numpy")
def body_bytes(p, quantized):
    """The body of a block with these fields (`quantized`: KIVI's quantized tokens)."""
    n = elements(p)
    if p[P_KIND] == SCHEME_PLAIN:
        return _pad8(n * _element_bytes(p[P_DTYPE]))
    if p[P_KIND] == SCHEME_INT:
        return int_section_bytes(n, p[P_GROUP], p[P_BITS], p[P_SYM] != 0)
    if p[P_KIND] == SCHEME_FP8:
        return _pad8(4 * _fp8_scales(p)) + _pad8(n)
    return _kivi_body(p, quantized)


@njit(cache=True, nogil=True, error_model="numpy")
def summary_bytes(p):
    """The page summaries' section after the body (firmware/summaries.py; 0: none)."""
    return section_bytes(p[P_TOKENS], p[P_LAYERS], p[P_HEADS], p[P_HDIM], p[P_SUMMARY_PAGE],
                         _element_bytes(p[P_DTYPE]))


@njit(cache=True, nogil=True, error_model="numpy")
def compressed_bytes(p):
    """The compressed block a quantize of p's scheme and shape makes."""
    q = 0
    if p[P_KIND] == SCHEME_KIVI:
        q = kivi_quantized_tokens(p[P_TOKENS], p[P_GROUP], p[P_RESIDUAL])
    return HEADER_BYTES + body_bytes(p, q) + summary_bytes(p)


@njit(cache=True, nogil=True, error_model="numpy")
def check_shape(p):
    """0, or E_REQUEST for a non-positive or oversized shape or an unknown dtype."""
    if p[P_DTYPE] < 0 or p[P_DTYPE] > 2:
        return E_REQUEST
    for i in (P_TOKENS, P_LAYERS, P_HEADS, P_HDIM):
        if p[i] < 1 or p[i] >= MAX_DIM:
            return E_REQUEST
    # stepwise, so that no product overflows
    n = p[P_TOKENS] * 2
    for i in (P_LAYERS, P_HEADS, P_HDIM):
        n *= p[i]
        if n > MAX_ELEMENTS:
            return E_REQUEST
    return 0


# ---- sections ------------------------------------------------------------------------------

@njit(cache=True, nogil=True, error_model="numpy")
def _int_views(body, n, group, bits, symmetric):
    """Scales, zero points (empty when symmetric) and codes of an int section."""
    used = int_section_used(n, group, bits, symmetric)
    ng = (n + group - 1) // group
    nz = 0 if symmetric else ng
    scales = body[:4 * ng].view(np.float32)
    zeros = body[4 * ng:4 * (ng + nz)].view(np.float32)
    codes = body[4 * (ng + nz):used]
    return scales, zeros, codes


@njit(cache=True, nogil=True, error_model="numpy")
def _int_views_zeroed(body, n, group, bits, symmetric):
    """_int_views of a section being written, its padding zeroed: a block's bytes depend on
    its contents only."""
    used = int_section_used(n, group, bits, symmetric)
    body[used:_pad8(used)] = 0
    return _int_views(body, n, group, bits, symmetric)


@njit(cache=True, nogil=True, error_model="numpy")
def _nonfinite(x, dtype):
    """inf/NaN count of a flat block part, with the kernels' own conversions."""
    scratch = np.empty(min(x.shape[0], 4096), np.float32)
    bad = 0
    for c0 in range(0, x.shape[0], 4096):
        part = x[c0:c0 + 4096]
        if dtype == 0:
            bad += fp16_to_f32(part, scratch[:part.shape[0]])
        elif dtype == 1:
            bad += bf16_to_f32(part, scratch[:part.shape[0]])
        else:
            for i in range(part.shape[0]):
                bad += not np.isfinite(part[i])
    return bad


PIECE = 1 << 15  # elements per kernel call when the codes are summed: they stay in L2


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _codes_at(n, group, symmetric):
    """The offset of an int block's codes in the block (after its scales and zeros)."""
    return HEADER_BYTES + 4 * ((n + group - 1) // group) * (1 if symmetric else 2)


@njit(cache=True, nogil=True, error_model="numpy")
def _quantize_int_summed(p, x, body):
    """An int scheme's section, piece by piece, each piece's codes summed for the checksum
    while still in cache (reading the block back afterwards cost ~20% of the quantize).
    Returns _quantize_typed's tuple: the summed words [lo, hi) of the whole block and their
    word_sums, or lo = hi = 0 when the codes do not start on a word."""
    dtype = p[P_DTYPE]
    group, bits = p[P_GROUP], p[P_BITS]
    sym = p[P_SYM] != 0
    n = x.shape[0]
    s, z, c = _int_views_zeroed(body, n, group, bits, sym)
    at = _codes_at(n, group, sym)
    summed = at % 8 == 0
    s1 = np.uint64(0)
    s2 = np.uint64(0)
    bad = 0
    for a in range(0, n, PIECE):  # PIECE is a multiple of every group and of 16
        b = min(a + PIECE, n)
        ga, gb = a // group, (b + group - 1) // group
        ca, cb = (a, b) if bits == 8 else (a >> 1, (b + 1) >> 1)
        bad += quantize_int(x[a:b], dtype, group, bits, sym, s[ga:gb],
                            z if sym else z[ga:gb], c[ca:cb])
        if summed:
            w1, w2 = word_sums(c[ca:ca + (cb - ca) // 8 * 8].view(np.uint64))
            s1 += w1
            s2 += w2 + np.uint64(ca // 8) * w1
    if not summed:
        return bad, 0, 0, 0, s1, s2
    return bad, 0, at // 8, at // 8 + c.shape[0] // 8, s1, s2


@njit(cache=True, nogil=True, error_model="numpy")
def _quantize_typed(p, x, src, body):
    """x: the block as its carrier (uint16 or float32), src: its bytes.  Returns (inf/NaN
    count, KIVI tokens kept in full precision, and the words [lo, hi) already summed for the
    checksum with their word_sums (lo = hi: none))."""
    dtype = p[P_DTYPE]
    group, bits = p[P_GROUP], p[P_BITS]
    n = x.shape[0]
    none = np.uint64(0)
    if p[P_KIND] == SCHEME_INT:
        return _quantize_int_summed(p, x, body)
    if p[P_KIND] == SCHEME_PLAIN:
        body[:src.shape[0]] = src
        body[src.shape[0]:] = 0
        return _nonfinite(x, dtype), 0, 0, 0, none, none
    if p[P_KIND] == SCHEME_FP8:
        nscales = _fp8_scales(p)
        start = _pad8(4 * nscales)
        body[4 * nscales:start] = 0
        body[start + n:] = 0
        scales = body[:4 * nscales].view(np.float32)
        bad = quantize_fp8(x, dtype, p[P_HDIM], 2 * p[P_LAYERS] * p[P_HEADS],
                           p[P_PER_HEAD] != 0, scales, body[start:start + n])
        return bad, 0, 0, 0, none, none
    # KIVI: keys grouped per channel (a channel's tokens made contiguous), values per token
    q = kivi_quantized_tokens(p[P_TOKENS], group, p[P_RESIDUAL])
    c = _per_token(p)
    qn = q * c
    # KIVI is asymmetric: a False known only at run time (this is the KIVI branch), because a
    # literal False would compile every int helper below a second time, for Literal[bool]
    sym = p[P_KIND] != SCHEME_KIVI
    sec = int_section_bytes(qn, group, bits, sym)
    keys = np.empty(qn, x.dtype)
    values = np.empty(qn, x.dtype)
    for t in range(q):
        row = x[t * 2 * c:(t + 1) * 2 * c]
        for ch in range(c):
            keys[ch * q + t] = row[ch]
        values[t * c:(t + 1) * c] = row[c:]
    ks, kz, kc = _int_views_zeroed(body[:sec], qn, group, bits, sym)
    bad = quantize_int(keys, dtype, group, bits, sym, ks, kz, kc)
    vs, vz, vc = _int_views_zeroed(body[sec:2 * sec], qn, group, bits, sym)
    bad += quantize_int(values, dtype, group, bits, sym, vs, vz, vc)
    tail = x[q * 2 * c:]
    bad += _nonfinite(tail, dtype)
    raw = body[2 * sec:]
    nraw = tail.shape[0] * _element_bytes(dtype)
    raw[:nraw] = src[src.shape[0] - nraw:]
    raw[nraw:] = 0
    return bad, p[P_TOKENS] - q, 0, 0, none, none


@njit(cache=True, nogil=True, error_model="numpy")
def _write_header(p, out, total, residual, lo, hi, s1, s2):
    """The header of a block whose body out[64:total] is written, its checksum last (words
    [lo, hi) summed already: s1, s2)."""
    out[:HEADER_BYTES] = 0
    _put(out, 0, 4, MAGIC)
    _put(out, 4, 2, VERSION)
    _put(out, 6, 2, HEADER_BYTES)
    out[8] = p[P_KIND]
    out[9] = 8 * _element_bytes(p[P_DTYPE]) if p[P_KIND] == SCHEME_PLAIN else p[P_BITS]
    flags = 0
    if p[P_KIND] == SCHEME_FP8:
        flags = FLAG_PER_HEAD if p[P_PER_HEAD] else 0
    elif p[P_KIND] == SCHEME_INT and p[P_SYM]:
        flags = FLAG_SYMMETRIC
    if p[P_LAYOUT] == LAYOUT_2LT:
        flags |= FLAG_LAYOUT_2LT
    out[10] = flags
    out[11] = p[P_DTYPE]
    _put(out, 12, 4, p[P_GROUP] if p[P_KIND] != SCHEME_FP8 else 0)  # plain: 0
    _put(out, 16, 4, p[P_TOKENS])
    _put(out, 20, 4, p[P_LAYERS])
    _put(out, 24, 4, p[P_HEADS])
    _put(out, 28, 4, p[P_HDIM])
    _put(out, 32, 8, total - HEADER_BYTES - summary_bytes(p))  # the summaries follow it
    _put(out, 48, 4, residual)
    _put(out, 52, 2, p[P_SUMMARY_PAGE])
    _put(out, 40, 8, sum64_around(out[:total], CHECKSUM_WORD, lo, hi, s1, s2))


@njit(cache=True, nogil=True, error_model="numpy")
def _reorder_rows(p, src, dst, to_tokens_first):
    """Move the (heads * head_dim)-element rows of a block between LMCache's (2, layers,
    tokens) order and the drive's (tokens, 2, layers) order."""
    tokens, layers = p[P_TOKENS], p[P_LAYERS]
    row = p[P_HEADS] * p[P_HDIM] * _element_bytes(p[P_DTYPE])
    for kv in range(2):
        for layer in range(layers):
            for t in range(tokens):
                a = ((kv * layers + layer) * tokens + t) * row
                b = ((t * 2 + kv) * layers + layer) * row
                if to_tokens_first:
                    dst[b:b + row] = src[a:a + row]
                else:
                    dst[a:a + row] = src[b:b + row]


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
    if p[P_LAYOUT] == LAYOUT_2LT and not _keeps_order(p):
        ordered = np.empty(src.shape[0], np.uint8)  # token order, for fp8 and KIVI
        _reorder_rows(p, src, ordered, True)
        src = ordered
    if dtype == 2:
        bad, residual, lo, hi, s1, s2 = _quantize_typed(p, src.view(np.float32), src, body)
    else:
        bad, residual, lo, hi, s1, s2 = _quantize_typed(p, src.view(np.uint16), src, body)
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
    keys are its body's own."""
    dtype = p[P_DTYPE]
    p[P_RESIDUAL] = residual
    nbytes = elements(p) * _element_bytes(dtype)
    plain = p[P_KIND] == SCHEME_PLAIN
    x = body[:nbytes] if plain else np.empty(nbytes, np.uint8)
    two_lt = p[P_LAYOUT] == LAYOUT_2LT and _keeps_order(p)
    if dtype == 2:
        xs = x.view(np.float32)
        if not plain:
            _dequantize_typed(p, body, xs, x)
        write_summaries(xs, dtype, two_lt, p[P_TOKENS], p[P_LAYERS], p[P_HEADS], p[P_HDIM],
                        p[P_SUMMARY_PAGE], section)
    else:
        xs = x.view(np.uint16)
        if not plain:
            _dequantize_typed(p, body, xs, x)
        write_summaries(xs, dtype, two_lt, p[P_TOKENS], p[P_LAYERS], p[P_HEADS], p[P_HDIM],
                        p[P_SUMMARY_PAGE], section)


@njit(cache=True, nogil=True, error_model="numpy")
def parse_request(req, p):
    """A 64-byte quantized-store request (magic SQRQ, dtype, scheme name, shape) into p.
    Returns 0, E_REQUEST or E_SCHEME."""
    if req.shape[0] < 64 or _get(req, 0, 4) != REQUEST_MAGIC:
        return E_REQUEST
    p[P_DTYPE] = req[4]
    e = parse_scheme_name(req[8:40], p)
    if e:
        return e
    p[P_LAYOUT] = req[5]
    if p[P_LAYOUT] > LAYOUT_2LT:
        return E_REQUEST  # an unknown layout
    p[P_TOKENS] = _get(req, 40, 4)
    p[P_LAYERS] = _get(req, 44, 4)
    p[P_HEADS] = _get(req, 48, 4)
    p[P_HDIM] = _get(req, 52, 4)
    p[P_SUMMARY_PAGE] = _get(req, 56, 2)
    if p[P_SUMMARY_PAGE] > MAX_PAGE or _get(req, 58, 2) or _get(req, 60, 4):
        return E_REQUEST  # a page past MAX_PAGE, or reserved bytes set
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
    if _get(blob, 4, 2) != VERSION or _get(blob, 6, 2) != HEADER_BYTES:
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
    # a wrong shape or page is _check_fields' to name; the length is checked without them
    sb = summary_bytes(p) if p[P_SUMMARY_PAGE] <= MAX_PAGE and check_shape(p) == 0 else 0
    if p[P_BODY] < 0 or blob.shape[0] != HEADER_BYTES + p[P_BODY] + sb:
        return E_LENGTH
    return 0


@njit(cache=True, nogil=True, error_model="numpy")
def _check_fields(blob, p):
    """0, or the first wrong field of a header read by _read_header (E_FIELDS ..
    E_KIVI_GROUPS)."""
    kind, bits, flags, dtype = blob[8], blob[9], blob[10], blob[11]
    group, residual = p[P_GROUP], p[P_RESIDUAL]
    if not (1 <= kind <= 4) or dtype > 2 or flags & ~7 or p[P_SUMMARY_PAGE] > MAX_PAGE:
        return E_FIELDS
    if kind == SCHEME_PLAIN:
        if bits != 8 * _element_bytes(dtype) or group != 0 or residual or flags & 3:
            return E_FIELDS
    elif kind == SCHEME_FP8:
        if bits != 8 or group != 0 or residual or flags & FLAG_SYMMETRIC:
            return E_FIELDS
    elif (bits != 4 and bits != 8) or not (group == 32 or group == 64 or group == 128) \
            or flags & FLAG_PER_HEAD:
        return E_FIELDS
    if kind == SCHEME_INT and residual:
        return E_FIELDS
    if kind == SCHEME_KIVI and (residual > p[P_TOKENS] or flags & FLAG_SYMMETRIC):
        return E_FIELDS
    if check_shape(p):
        return E_SHAPE
    quantized = p[P_TOKENS] - residual
    if kind == SCHEME_KIVI and quantized % group:
        return E_KIVI_GROUPS
    if p[P_BODY] != body_bytes(p, quantized):
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
def _dequantize_typed(p, body, x, out_bytes):
    dtype = p[P_DTYPE]
    group, bits = p[P_GROUP], p[P_BITS]
    n = x.shape[0]
    if p[P_KIND] == SCHEME_PLAIN:
        out_bytes[:] = body[:out_bytes.shape[0]]
        return
    if p[P_KIND] == SCHEME_INT:
        sym = p[P_SYM] != 0
        s, z, c = _int_views(body, n, group, bits, sym)
        dequantize_int(c, n, dtype, group, bits, sym, s, z, x)
        return
    if p[P_KIND] == SCHEME_FP8:
        nscales = _fp8_scales(p)
        start = _pad8(4 * nscales)
        dequantize_fp8(body[start:start + n], dtype, p[P_HDIM], 2 * p[P_LAYERS] * p[P_HEADS],
                       p[P_PER_HEAD] != 0, body[:4 * nscales].view(np.float32), E4M3_VALUES,
                       x)
        return
    q = p[P_TOKENS] - p[P_RESIDUAL]
    c = _per_token(p)
    qn = q * c
    sym = p[P_KIND] != SCHEME_KIVI  # False, at run time (see _quantize_typed)
    sec = int_section_bytes(qn, group, bits, sym)
    keys = np.empty(qn, x.dtype)
    values = np.empty(qn, x.dtype)
    ks, kz, kc = _int_views(body[:sec], qn, group, bits, sym)
    dequantize_int(kc, qn, dtype, group, bits, sym, ks, kz, keys)
    vs, vz, vc = _int_views(body[sec:2 * sec], qn, group, bits, sym)
    dequantize_int(vc, qn, dtype, group, bits, sym, vs, vz, values)
    for t in range(q):
        row = x[t * 2 * c:(t + 1) * 2 * c]
        for ch in range(c):
            row[ch] = keys[ch * q + t]
        row[c:] = values[t * c:(t + 1) * c]
    nraw = (n - q * 2 * c) * _element_bytes(dtype)
    out_bytes[out_bytes.shape[0] - nraw:] = body[2 * sec:2 * sec + nraw]


@njit(cache=True, nogil=True, error_model="numpy")
def _dequantize_int_summed(p, body, x):
    """An int block's codes dequantized piece by piece into x, each piece summed for the
    checksum first (which brings it into cache for the kernel).  Returns the word_sums of
    the codes' whole words and the words' range [lo, hi) in the block."""
    group, bits = p[P_GROUP], p[P_BITS]
    sym = p[P_SYM] != 0
    n = x.shape[0]
    s, z, c = _int_views(body, n, group, bits, sym)
    s1 = np.uint64(0)
    s2 = np.uint64(0)
    for a in range(0, n, PIECE):
        b = min(a + PIECE, n)
        ga, gb = a // group, (b + group - 1) // group
        ca, cb = (a, b) if bits == 8 else (a >> 1, (b + 1) >> 1)
        w1, w2 = word_sums(c[ca:ca + (cb - ca) // 8 * 8].view(np.uint64))
        s1 += w1
        s2 += w2 + np.uint64(ca // 8) * w1
        dequantize_int(c[ca:cb], b - a, p[P_DTYPE], group, bits, sym, s[ga:gb],
                       z if sym else z[ga:gb], x[a:b])
    lo = _codes_at(n, group, sym) // 8
    return lo, lo + c.shape[0] // 8, s1, s2


@njit(cache=True, nogil=True, error_model="numpy")
def dequantize_block(blob, out, p):
    """Dequantize a compressed block into out (uint8, at least the block's bytes).  p gets
    its header (see open_header).  Returns the bytes written, or a corrupt-block code, or
    E_OUT_SMALL (then the bytes needed are elements(p) times the element size).

    An int block whose header holds is verified while it is dequantized (its codes summed
    piece by piece, in cache): a checksum failure is then found after `out` was written,
    and returned all the same.  Every other block is verified first."""
    e = _read_header(blob, p)
    if e:
        return e
    fused = (_check_fields(blob, p) == 0 and p[P_KIND] == SCHEME_INT
             and _codes_at(elements(p), p[P_GROUP], p[P_SYM] != 0) % 8 == 0)
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
            lo, hi, s1, s2 = _dequantize_int_summed(p, body, dst.view(np.float32))
        else:
            lo, hi, s1, s2 = _dequantize_int_summed(p, body, dst.view(np.uint16))
        if np.int64(sum64_around(blob, CHECKSUM_WORD, lo, hi, s1, s2)) != p[P_CHECKSUM]:
            return E_CHECKSUM
        return need
    reorder = p[P_LAYOUT] == LAYOUT_2LT and not _keeps_order(p)
    into = np.empty(need, np.uint8) if reorder else dst
    if dtype == 2:
        _dequantize_typed(p, body, into.view(np.float32), into)
    else:
        _dequantize_typed(p, body, into.view(np.uint16), into)
    if reorder:
        _reorder_rows(p, into, dst, False)
    return need


@njit(cache=True, nogil=True, error_model="numpy")
def dequantized_bytes(p):
    """The bytes a dequantize of an opened block (p from open_header) writes."""
    return elements(p) * _element_bytes(p[P_DTYPE])
