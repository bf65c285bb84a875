"""KIVI (`kivi4_g32_r128`; Liu et al., ICML 2024): keys quantized per channel (groups run
along tokens), values per token (groups run along channels), both asymmetric with
firmware/quant_int.py's kernels; the last tokens stay in the original element type: at
least R of them, plus however many do not fill a whole group of G tokens.  The body is in
token order (the per-channel keys need it), whatever the block's layout.  A kind module:
see firmware/kind_int.py."""

import numpy as np
from numba import njit

from firmware import sizes
from firmware.blockparams import (
    E_FIELDS,
    E_KIVI_GROUPS,
    E_SCHEME,
    FLAG_PER_HEAD,
    FLAG_SYMMETRIC,
    P_BITS,
    P_DTYPE,
    P_GROUP,
    P_KIND,
    P_RESIDUAL,
    P_TOKENS,
    _digits,
    _element_bytes,
    _is,
    _nonfinite,
    _per_token,
    parse_bits_group,
)
from firmware.int_sections import _int_views, _int_views_zeroed, int_section_bytes
from firmware.quant_int import dequantize_int, quantize_int

CODE = 2
NAME = "kivi"
GRAMMAR = "kivi8_gN_rR / kivi4_gN_rR / kivi2_gN_rR"
KEEPS_ORDER = False
BODY_IS_ELEMENTS = False
COST_QUANTIZE = (9, 6, 0)  # the int kind's, and the keys' transpose
COST_DEQUANTIZE = (4, 1, 0)

_KIVI = np.frombuffer(b"kivi", np.uint8)
_R = np.frombuffer(b"_r", np.uint8)


def scheme_name(s) -> str:
    return f"kivi{s.bits}_g{s.group}_r{s.residual}"


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def parse(name, n, p):
    if not _is(name, n, 0, _KIVI):
        return 1
    pos = parse_bits_group(name, n, 4, p)
    if pos < 0 or not _is(name, n, pos, _R):
        return E_SCHEME
    pos = _digits(name, n, pos + 2, p, P_RESIDUAL)
    if pos < 0 or pos != n:
        return E_SCHEME
    p[P_KIND] = CODE
    return 0


kivi_quantized_tokens = sizes.kivi_quantized_tokens  # plain Python, compiled inline


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def quantized_tokens(p):
    return kivi_quantized_tokens(p[P_TOKENS], p[P_GROUP], p[P_RESIDUAL])


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def body_bytes(p, quantized):
    return sizes.kivi_body_bytes(p[P_TOKENS], quantized, _per_token(p), p[P_GROUP],
                                 p[P_BITS], _element_bytes(p[P_DTYPE]))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def header(p):
    return p[P_BITS], 0, p[P_GROUP]


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def check_fields(p, bits, flags, dtype):
    group = p[P_GROUP]
    if (bits != 2 and bits != 4 and bits != 8) or not (group == 32 or group == 64 or group == 128) \
            or flags & FLAG_PER_HEAD:
        return E_FIELDS
    if p[P_RESIDUAL] > p[P_TOKENS] or flags & FLAG_SYMMETRIC:
        return E_FIELDS
    return 0


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def check_body(p, quantized):
    return E_KIVI_GROUPS if quantized % p[P_GROUP] else 0


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def quantize(p, x, src, body):
    """Keys grouped per channel (a channel's tokens made contiguous), values per token.
    Returns (inf/NaN count, tokens kept in full precision, 0, 0, 0, 0)."""
    dtype = p[P_DTYPE]
    group, bits = p[P_GROUP], p[P_BITS]
    q = kivi_quantized_tokens(p[P_TOKENS], group, p[P_RESIDUAL])
    c = _per_token(p)
    qn = q * c
    # asymmetric: a False known only at run time, because a literal False would compile
    # every int helper below a second time, for Literal[bool]
    sym = p[P_KIND] != CODE
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
    none = np.uint64(0)
    return (np.int64(bad), np.int64(p[P_TOKENS] - q), np.int64(0), np.int64(0), none,
            none)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def dequantize(p, body, x, out_bytes):
    dtype = p[P_DTYPE]
    group, bits = p[P_GROUP], p[P_BITS]
    n = x.shape[0]
    q = p[P_TOKENS] - p[P_RESIDUAL]
    c = _per_token(p)
    qn = q * c
    sym = p[P_KIND] != CODE  # False, at run time (see quantize)
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
