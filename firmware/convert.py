"""Element conversions inside kernels: fp16 / bf16 bit patterns <-> float32.

Branch-free single loops (scalar bit casts from firmware.bits), so LLVM vectorizes them:
- fp16 -> fp32: shift the exponent/mantissa into place and multiply by 2^112 to re-bias the
  exponent (exact, subnormals included), then OR the sign back in.
- fp32 -> fp16: round to nearest even (F. Giesen's float_to_half_fast3_rtne): normals by
  integer rounding of the 13 dropped bits, subnormals by letting the FPU round an add of 0.5.
- bf16 is the top half of an fp32; fp32 -> bf16 rounds to nearest even.
Inputs are finite (the quantizers reject inf/NaN); fp16 outputs saturate to inf past 65504.
"""

import numpy as np
from numba import njit

from firmware.bits import f32_as_u32, u32_as_f32

_MAGIC_F16 = np.float32(2.0**112)  # 2^(127-15)
_HALF = np.float32(0.5)  # bits 126 << 23: the subnormal rounding magic
_HALF_BITS = np.uint32(126 << 23)


@njit(cache=True, nogil=True)
def fp16_to_f32(src, dst):
    """src uint16[n] fp16 bits -> dst float32[n].  Returns how many were inf or NaN."""
    bad = 0
    for i in range(src.shape[0]):
        h = np.uint32(src[i])
        bad += np.uint32((h & np.uint32(0x7C00)) == np.uint32(0x7C00))
        f = u32_as_f32((h & np.uint32(0x7FFF)) << np.uint32(13)) * _MAGIC_F16
        dst[i] = u32_as_f32(f32_as_u32(f) | ((h & np.uint32(0x8000)) << np.uint32(16)))
    return bad


@njit(cache=True, nogil=True)
def bf16_to_f32(src, dst):
    """src uint16[n] bf16 bits -> dst float32[n].  Returns how many were inf or NaN."""
    bad = 0
    for i in range(src.shape[0]):
        h = np.uint32(src[i])
        bad += np.uint32((h & np.uint32(0x7F80)) == np.uint32(0x7F80))
        dst[i] = u32_as_f32(h << np.uint32(16))
    return bad


@njit(cache=True, nogil=True, inline="always")
def f32_to_fp16_bits(x):
    """One float32 -> fp16 bits (RNE)."""
    f = f32_as_u32(x)
    sign = (f >> np.uint32(16)) & np.uint32(0x8000)
    a = f & np.uint32(0x7FFFFFFF)
    mant_odd = (a >> np.uint32(13)) & np.uint32(1)
    normal = (a + np.uint32(((15 - 127) << 23) + 0xFFF) + mant_odd) >> np.uint32(13)
    sub = f32_as_u32(abs(x) + _HALF) - _HALF_BITS
    r = sub if a < np.uint32(113 << 23) else normal
    r = np.uint32(0x7C00) if a >= np.uint32((127 + 16) << 23) else r
    return np.uint16(r | sign)


@njit(cache=True, nogil=True)
def f32_to_fp16(src, dst):
    """src float32[n] -> dst uint16[n] fp16 bits (RNE)."""
    for i in range(src.shape[0]):
        dst[i] = f32_to_fp16_bits(src[i])


@njit(cache=True, nogil=True)
def f32_to_bf16(src, dst):
    """src float32[n] (finite) -> dst uint16[n] bf16 bits, round to nearest even."""
    for i in range(src.shape[0]):
        u = f32_as_u32(src[i])
        dst[i] = np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
                           >> np.uint32(16))
