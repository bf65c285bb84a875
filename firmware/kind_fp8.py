"""fp8 (`fp8_tensor`, `fp8_head`): e4m3fn codes saturating at +-448, with one float32
scale per block or per (K/V, layer, KV head) (firmware/quant_fp8.py's kernels).  The
per-head scales need token order, so the body is in token order whatever the block's
layout.  A kind module: see firmware/kind_int.py."""

import numpy as np
from numba import njit

from firmware import sizes
from firmware.blockparams import (
    E_FIELDS,
    FLAG_PER_HEAD,
    FLAG_SYMMETRIC,
    P_DTYPE,
    P_GROUP,
    P_HDIM,
    P_HEADS,
    P_KIND,
    P_LAYERS,
    P_PER_HEAD,
    P_RESIDUAL,
    _is,
    _pad8,
    all_tokens,
    elements,
    no_body_check,
)
from firmware.quant_fp8 import E4M3_VALUES, dequantize_fp8, quantize_fp8

CODE = 3
NAME = "fp8"
GRAMMAR = "fp8_tensor, fp8_head"
KEEPS_ORDER = False
BODY_IS_ELEMENTS = False
COST_QUANTIZE = (7, 0, 2)
COST_DEQUANTIZE = (3, 0, 0)

_FP8_TENSOR = np.frombuffer(b"fp8_tensor", np.uint8)
_FP8_HEAD = np.frombuffer(b"fp8_head", np.uint8)

quantized_tokens = all_tokens  # every token is quantized alike
check_body = no_body_check

def scheme_name(s) -> str:
    return "fp8_head" if s.per_head else "fp8_tensor"


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def parse(name, n, p):
    if n == _FP8_TENSOR.shape[0] and _is(name, n, 0, _FP8_TENSOR):
        p[P_KIND] = CODE
        return 0
    if n == _FP8_HEAD.shape[0] and _is(name, n, 0, _FP8_HEAD):
        p[P_KIND] = CODE
        p[P_PER_HEAD] = 1
        return 0
    return 1


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _scales(p):
    return 2 * p[P_LAYERS] * p[P_HEADS] if p[P_PER_HEAD] else 1


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def body_bytes(p, quantized):
    return sizes.fp8_body_bytes(elements(p), _scales(p))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def header(p):
    return 8, FLAG_PER_HEAD if p[P_PER_HEAD] else 0, 0


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def check_fields(p, bits, flags, dtype):
    if bits != 8 or p[P_GROUP] != 0 or p[P_RESIDUAL] or flags & FLAG_SYMMETRIC:
        return E_FIELDS
    return 0


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def quantize(p, x, src, body):
    n = x.shape[0]
    nscales = _scales(p)
    start = _pad8(4 * nscales)
    body[4 * nscales:start] = 0
    body[start + n:] = 0
    scales = body[:4 * nscales].view(np.float32)
    bad = quantize_fp8(x, p[P_DTYPE], p[P_HDIM], 2 * p[P_LAYERS] * p[P_HEADS],
                       p[P_PER_HEAD] != 0, scales, body[start:start + n])
    none = np.uint64(0)
    return np.int64(bad), np.int64(0), np.int64(0), np.int64(0), none, none


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def dequantize(p, body, x, out_bytes):
    n = x.shape[0]
    nscales = _scales(p)
    start = _pad8(4 * nscales)
    dequantize_fp8(body[start:start + n], p[P_DTYPE], p[P_HDIM], 2 * p[P_LAYERS] * p[P_HEADS],
                   p[P_PER_HEAD] != 0, body[:4 * nscales].view(np.float32), E4M3_VALUES, x)
