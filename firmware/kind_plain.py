"""`plain`: the block as it is, in its own element type and layout, in the drive's block
format: how a block is stored with its layout so that the drive keeps its page summaries
(firmware/summaries.py).  A kind module: see firmware/kind_int.py."""

import numpy as np
from numba import njit

from firmware import sizes
from firmware.blockparams import (
    E_FIELDS,
    P_BITS,
    P_DTYPE,
    P_GROUP,
    P_KIND,
    P_RESIDUAL,
    _element_bytes,
    _is,
    _nonfinite,
    all_tokens,
    elements,
    no_body_check,
)

CODE = 4
NAME = "plain"
GRAMMAR = "plain"
KEEPS_ORDER = True
BODY_IS_ELEMENTS = True  # its keys are read from the body as they are
COST_QUANTIZE = (2, 0, 0)  # the finiteness check and the copy
COST_DEQUANTIZE = (1, 0, 0)  # the copy

_PLAIN = np.frombuffer(b"plain", np.uint8)

quantized_tokens = all_tokens  # every token is quantized alike
check_body = no_body_check

def scheme_name(s) -> str:
    return "plain"


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def parse(name, n, p):
    if not (n == _PLAIN.shape[0] and _is(name, n, 0, _PLAIN)):
        return 1
    p[P_KIND] = CODE
    p[P_BITS] = 0  # the header gives the element's bits
    return 0


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def body_bytes(p, quantized):
    return sizes.plain_body_bytes(elements(p), _element_bytes(p[P_DTYPE]))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def header(p):
    return 8 * _element_bytes(p[P_DTYPE]), 0, 0


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def check_fields(p, bits, flags, dtype):
    if bits != 8 * _element_bytes(dtype) or p[P_GROUP] != 0 or p[P_RESIDUAL] or flags & 3:
        return E_FIELDS
    return 0


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def quantize(p, x, src, body):
    body[:src.shape[0]] = src
    body[src.shape[0]:] = 0
    none = np.uint64(0)
    return (np.int64(_nonfinite(x, p[P_DTYPE])), np.int64(0), np.int64(0), np.int64(0), none,
            none)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def dequantize(p, body, x, out_bytes):
    out_bytes[:] = body[:out_bytes.shape[0]]
