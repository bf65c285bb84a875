"""What the whole-block code (firmware/blockops.py) and the quantization kinds
(firmware/kinds.py) share: a block's parameters as an int64 array (`P_*`), the header's
constants, the failure codes, little-endian fields, the scheme-name grammar's pieces and the
block's sizes.  No kind's code here: each kind is a module of its own."""

import numpy as np
from numba import njit
from numba.extending import register_jitable

from firmware import sizes
from firmware.abi import (  # noqa: F401  (re-exported: the firmware's names for them)
    E_NONFINITE,
    E_NOT_LOWER,
    E_OUT_SMALL,
    E_REQUEST,
    E_SCHEME,
    E_VALUE_SIZE,
    QUANT_LAYOUT_2LT,
    QUANT_LAYOUT_T2L,
    QUANT_MAGIC,
)
from firmware.convert import bf16_to_f32, fp16_to_f32

HEADER_BYTES = sizes.HEADER_BYTES
MAGIC = 0x564B4453  # b"SDKV" little-endian
# 2: FLAG_BY_HEAD may be set (version 1 blocks, written before it, are token-major and
# still read)
VERSION = 2
REQUEST_MAGIC = QUANT_MAGIC  # b"SQRQ": sde_quant_req (c/wire/sde_queue.h)
FLAG_SYMMETRIC = 1
FLAG_PER_HEAD = 2
# the block is (2, layers, tokens, heads, head_dim), LMCache's KV_2LTD, not the drive's
# (tokens, 2, layers, heads, head_dim).  Integer schemes honour it as it is (their groups
# run along head_dim in either order, and the body keeps the order it was given); fp8's
# per-head scales and KIVI's per-channel keys need token order, so their kernels take the
# block's rows in that order first (inside the drive: the host sends and gets its own
# layout either way)
FLAG_LAYOUT_2LT = 4
# the body is laid out by head, (layers, kv_heads, 2, tokens, head_dim), whatever order the
# host sent (FLAG_LAYOUT_2LT then says the host's, which retrieves give back): one layer's
# page of one KV head is one contiguous run of the body (a few runs for the integer kind:
# its codes, scales and zero points), so the retrieval commands read only the bytes they
# score, as a drive built for them would.  Set by the drive for the kinds whose values do
# not depend on the order (plain; int when its groups divide head_dim)
FLAG_BY_HEAD = 8
LAYOUT_T2L, LAYOUT_2LT = QUANT_LAYOUT_T2L, QUANT_LAYOUT_2LT
LAYOUT_BY_HEAD = 2  # on the media only: never a request's layout
CHECKSUM_WORD = 5  # the checksum's 8 bytes at offset 40
MAX_DIM = 1 << 31  # a shape field past this is refused (products then fit an int64)
MAX_ELEMENTS = 1 << 40

# the scheme and shape of a block, as an int64 array
P_DTYPE, P_KIND, P_BITS, P_GROUP, P_SYM, P_RESIDUAL, P_PER_HEAD = 0, 1, 2, 3, 4, 5, 6
P_TOKENS, P_LAYERS, P_HEADS, P_HDIM, P_BODY, P_CHECKSUM = 7, 8, 9, 10, 11, 12
P_LAYOUT = 13
P_SUMMARY_PAGE = 14  # tokens per page of the block's page summaries (0: none)
P_BY_HEAD = 15  # quantize: lay the body out by head where the kind allows; opened: it is
NPARAM = 16

# failures (negative returns); 1..9 describe a corrupt compressed block
E_SHORT, E_MAGIC, E_VERSION, E_LENGTH, E_CHECKSUM = -1, -2, -3, -4, -5
E_FIELDS, E_SHAPE, E_BODY, E_KIVI_GROUPS = -6, -7, -8, -9
# -10 to -14, shared with the data plane (c/fw/sde_fw.h, through firmware/abi.py):
# E_OUT_SMALL, the output buffer is smaller than the result; E_NONFINITE, inf or NaN in a
# block to quantize; E_REQUEST, a malformed quantized-store request (magic, dtype, scheme,
# shape); E_VALUE_SIZE, the block's bytes do not match the request's shape and dtype;
# E_SCHEME, an unknown scheme name; -16, E_NOT_LOWER, a requantize's scheme is not below the
# stored block's (firmware/requant.py)


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


# ---- scheme names: the grammar's pieces ---------------------------------------------------

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


_G = np.frombuffer(b"_g", np.uint8)


@njit(cache=True, nogil=True, error_model="numpy")
def parse_bits_group(name, n, pos, p):
    """`B_gG` at name[pos:] (B 8, 4 or 2, G 32, 64 or 128) into p; the position after it, or
    -1.  The grammar integer kinds share (int8_g64, kivi2_g32_r128)."""
    if pos >= n or (name[pos] != 56 and name[pos] != 52 and name[pos] != 50):  # "8" "4" "2"
        return -1
    p[P_BITS] = name[pos] - 48
    pos += 1
    if not _is(name, n, pos, _G):
        return -1
    pos = _digits(name, n, pos + 2, p, P_GROUP)
    if pos < 0 or not (p[P_GROUP] == 32 or p[P_GROUP] == 64 or p[P_GROUP] == 128):
        return -1
    return pos


# ---- sizes -------------------------------------------------------------------------------

# the sizes' arithmetic is plain Python (firmware/sizes.py: model mode reads it without
# Numba); compiled inline into the firmware's functions that call it, with their error model
for _f in sizes.ARITHMETIC:
    register_jitable(inline="always", nogil=True, error_model="numpy")(_f)
_pad8, _element_bytes = sizes.pad8, sizes.element_bytes


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _per_token(p):
    return p[P_LAYERS] * p[P_HEADS] * p[P_HDIM]


@njit(cache=True, nogil=True, error_model="numpy")
def elements(p):
    return p[P_TOKENS] * 2 * _per_token(p)


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


# ---- what a kind whose tokens are all quantized alike has (firmware/kind_*.py) -------------

@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def all_tokens(p):
    """quantized_tokens of a kind that quantizes every token (all but KIVI)."""
    return p[P_TOKENS]


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def no_body_check(p, quantized):
    """check_body of a kind whose body has no constraint beyond its size."""
    return 0

