"""The group-wise integer kind (`int8_g64`, `int4_g128_sym`): groups of G consecutive
elements of the flat block, asymmetric (a scale and a zero point) or symmetric (a scale),
8- or 4-bit codes (firmware/quant_int.py's kernels).  Its groups run along head_dim in
either layout, so the body keeps the block's own order (LMCache's 2LT too).

A quantization kind is a module like this one and its line in firmware/kinds.py's REGISTRY:
its code and name, its cost for the C model, and these functions (firmware/kind_dispatch.py,
generated, calls them by the block's code): parse, body_bytes, quantized_tokens, header,
check_fields, check_body, quantize, dequantize."""

import numpy as np
from numba import njit

from firmware import sizes
from firmware.blockparams import (
    E_FIELDS,
    E_SCHEME,
    FLAG_PER_HEAD,
    FLAG_SYMMETRIC,
    P_BITS,
    P_DTYPE,
    P_GROUP,
    P_KIND,
    P_RESIDUAL,
    P_SYM,
    _is,
    all_tokens,
    elements,
    no_body_check,
    parse_bits_group,
)
from firmware.checksum import word_sums
from firmware.int_sections import (
    PIECE,
    _codes_at,
    _int_views,
    _int_views_zeroed,
)
from firmware.quant_int import dequantize_int, quantize_int
from firmware.sizes import code_bytes

CODE = 1
NAME = "int"
GRAMMAR = "int8_gN / int4_gN [_sym] / int2_gN"
KEEPS_ORDER = True
BODY_IS_ELEMENTS = False
# vector ops on the firmware's lanes (c/model/sde_kinds.h is generated from these):
# (per element, per group, per block) to quantize and to dequantize; a quantize reads the
# block and writes the body, a dequantize the reverse (c/model/sde_budget.c)
COST_QUANTIZE = (8, 6, 0)
COST_DEQUANTIZE = (4, 1, 0)

_INT = np.frombuffer(b"int", np.uint8)
_SYM = np.frombuffer(b"_sym", np.uint8)

quantized_tokens = all_tokens  # every token is quantized alike
check_body = no_body_check

def scheme_name(s) -> str:
    return f"int{s.bits}_g{s.group}" + ("_sym" if s.symmetric else "")


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def parse(name, n, p):
    """0 (p holds the scheme), 1 (not this kind's name) or E_SCHEME."""
    if not _is(name, n, 0, _INT):
        return 1
    pos = parse_bits_group(name, n, 3, p)
    if pos < 0:
        return E_SCHEME
    if pos < n:
        if not (n - pos == _SYM.shape[0] and _is(name, n, pos, _SYM)) or p[P_BITS] == 2:
            return E_SCHEME  # a symmetric 2-bit code has three levels: no scheme
        p[P_SYM] = 1
    p[P_KIND] = CODE
    return 0


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def body_bytes(p, quantized):
    return sizes.int_body_bytes(elements(p), p[P_GROUP], p[P_BITS], p[P_SYM] != 0)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def header(p):
    """(bits, flags, group) of the block's header."""
    return p[P_BITS], FLAG_SYMMETRIC if p[P_SYM] else 0, p[P_GROUP]


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def check_fields(p, bits, flags, dtype):
    group = p[P_GROUP]
    if (bits != 2 and bits != 4 and bits != 8) \
            or not (group == 32 or group == 64 or group == 128) \
            or flags & FLAG_PER_HEAD or p[P_RESIDUAL] or (bits == 2 and flags & FLAG_SYMMETRIC):
        return E_FIELDS
    return 0


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def quantize(p, x, src, body):
    """The section, piece by piece, each piece's codes summed for the checksum while still
    in cache (reading the block back afterwards cost ~20% of the quantize).  Returns (inf/NaN
    count, 0, the summed words [lo, hi) of the whole block and their word_sums; lo = hi = 0
    when the codes do not start on a word)."""
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
        ca, cb = a * bits // 8, code_bytes(b, bits)  # PIECE: whole bytes of codes
        bad += quantize_int(x[a:b], dtype, group, bits, sym, s[ga:gb],
                            z if sym else z[ga:gb], c[ca:cb])
        if summed:
            w1, w2 = word_sums(c[ca:ca + (cb - ca) // 8 * 8].view(np.uint64))
            s1 += w1
            s2 += w2 + np.uint64(ca // 8) * w1
    if not summed:
        return np.int64(bad), np.int64(0), np.int64(0), np.int64(0), s1, s2
    return (np.int64(bad), np.int64(0), np.int64(at // 8),
            np.int64(at // 8 + c.shape[0] // 8), s1, s2)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def dequantize(p, body, x, out_bytes):
    sym = p[P_SYM] != 0
    n = x.shape[0]
    s, z, c = _int_views(body, n, p[P_GROUP], p[P_BITS], sym)
    dequantize_int(c, n, p[P_DTYPE], p[P_GROUP], p[P_BITS], sym, s, z, x)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def can_fuse(p):
    """Whether dequantize_summed serves (the codes start on a word)."""
    return _codes_at(elements(p), p[P_GROUP], p[P_SYM] != 0) % 8 == 0


@njit(cache=True, nogil=True, error_model="numpy")
def dequantize_summed(p, body, x):
    """The codes dequantized piece by piece into x, each piece summed for the checksum first
    (which brings it into cache for the kernel): the whole-block code's fast path for this
    kind.  Returns the word_sums of the codes' whole words and the words' range [lo, hi)."""
    group, bits = p[P_GROUP], p[P_BITS]
    sym = p[P_SYM] != 0
    n = x.shape[0]
    s, z, c = _int_views(body, n, group, bits, sym)
    s1 = np.uint64(0)
    s2 = np.uint64(0)
    for a in range(0, n, PIECE):
        b = min(a + PIECE, n)
        ga, gb = a // group, (b + group - 1) // group
        ca, cb = a * bits // 8, code_bytes(b, bits)  # PIECE: whole bytes of codes
        w1, w2 = word_sums(c[ca:ca + (cb - ca) // 8 * 8].view(np.uint64))
        s1 += w1
        s2 += w2 + np.uint64(ca // 8) * w1
        dequantize_int(c[ca:cb], b - a, p[P_DTYPE], group, bits, sym, s[ga:gb],
                       z if sym else z[ga:gb], x[a:b])
    lo = _codes_at(n, group, sym) // 8
    return lo, lo + c.shape[0] // 8, s1, s2
