"""Element conversions inside kernels: fp16 / bf16 bit patterns <-> float32.

Branch-free loops over small row buffers, so LLVM vectorizes them.  Numba has no scalar
bitcast, so float <-> bits goes through `.view()` of a buffer:
- fp16 -> fp32: shift the exponent/mantissa into place and multiply by 2^112 to re-bias the
  exponent (exact, subnormals included), then OR the sign back in.
- fp32 -> fp16: round to nearest even (F. Giesen's float_to_half_fast3_rtne): normals by
  integer rounding of the 13 dropped bits, subnormals by letting the FPU round an add of 0.5.
- bf16 is the top half of an fp32; fp32 -> bf16 rounds to nearest even.
Inputs are finite (the quantizers reject inf/NaN); fp16 outputs saturate to inf past 65504.
"""

import numpy as np
from numba import njit

_MAGIC_F16 = np.float32(2.0**112)  # 2^(127-15)
_HALF = np.float32(0.5)  # bits 126 << 23: the subnormal rounding magic
_HALF_BITS = np.uint32(126 << 23)


@njit(cache=True, nogil=True)
def fp16_to_f32(src, dst):
    """src uint16[n] fp16 bits -> dst float32[n].  Returns how many were inf or NaN."""
    du = dst.view(np.uint32)
    n = src.shape[0]
    bad = 0
    for i in range(n):
        h = np.uint32(src[i])
        bad += np.uint32((h & np.uint32(0x7C00)) == np.uint32(0x7C00))
        du[i] = (h & np.uint32(0x7FFF)) << np.uint32(13)
    for i in range(n):
        dst[i] = dst[i] * _MAGIC_F16
    for i in range(n):
        du[i] |= (np.uint32(src[i]) & np.uint32(0x8000)) << np.uint32(16)
    return bad


@njit(cache=True, nogil=True)
def bf16_to_f32(src, dst):
    """src uint16[n] bf16 bits -> dst float32[n].  Returns how many were inf or NaN."""
    du = dst.view(np.uint32)
    bad = 0
    for i in range(src.shape[0]):
        h = np.uint32(src[i])
        bad += np.uint32((h & np.uint32(0x7F80)) == np.uint32(0x7F80))
        du[i] = h << np.uint32(16)
    return bad


@njit(cache=True, nogil=True)
def f32_to_fp16(src, dst, scratch):
    """src float32[n] -> dst uint16[n] fp16 bits (RNE).  scratch: float32[>= n]."""
    n = src.shape[0]
    su = src.view(np.uint32)
    tu = scratch.view(np.uint32)
    for i in range(n):
        scratch[i] = abs(src[i]) + _HALF
    for i in range(n):
        f = su[i]
        sign = (f >> np.uint32(16)) & np.uint32(0x8000)
        a = f & np.uint32(0x7FFFFFFF)
        mant_odd = (a >> np.uint32(13)) & np.uint32(1)
        normal = (a + np.uint32(((15 - 127) << 23) + 0xFFF) + mant_odd) >> np.uint32(13)
        sub = tu[i] - _HALF_BITS
        r = normal
        if a < np.uint32(113 << 23):
            r = sub
        if a >= np.uint32((127 + 16) << 23):
            r = np.uint32(0x7C00)
        dst[i] = np.uint16(r | sign)


@njit(cache=True, nogil=True)
def f32_to_bf16(src, dst):
    """src float32[n] (finite) -> dst uint16[n] bf16 bits, round to nearest even."""
    su = src.view(np.uint32)
    for i in range(src.shape[0]):
        u = su[i]
        dst[i] = np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
                           >> np.uint32(16))
