"""Element conversions inside kernels: fp16 / bf16 bit patterns <-> float32.

Branch-free single loops (scalar casts from firmware.bits), so LLVM vectorizes them:
- fp16 <-> fp32: LLVM's half conversions (fpext / fptrunc, round to nearest even), which the
  F16C unit runs eight at a time.
- bf16 is the top half of an fp32; fp32 -> bf16 rounds to nearest even.
Inputs are finite (the quantizers reject inf/NaN); fp16 outputs saturate to inf past 65504.
"""

import numpy as np
from numba import njit

from firmware.bits import f32_as_fp16_bits, f32_as_u32, fp16_bits_as_f32, u32_as_f32


@njit(cache=True, nogil=True)
def fp16_to_f32(src, dst):
    """src uint16[n] fp16 bits -> dst float32[n].  Returns how many were inf or NaN."""
    bad = 0
    for i in range(src.shape[0]):
        h = np.uint32(src[i])
        bad += np.uint32((h & np.uint32(0x7C00)) == np.uint32(0x7C00))
        dst[i] = fp16_bits_as_f32(src[i])
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


@njit(cache=True, nogil=True)
def f32_to_fp16(src, dst):
    """src float32[n] -> dst uint16[n] fp16 bits (RNE, overflow to inf)."""
    for i in range(src.shape[0]):
        dst[i] = f32_as_fp16_bits(src[i])


@njit(cache=True, nogil=True)
def f32_to_bf16(src, dst):
    """src float32[n] (finite) -> dst uint16[n] bf16 bits, round to nearest even."""
    for i in range(src.shape[0]):
        u = f32_as_u32(src[i])
        dst[i] = np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
                           >> np.uint32(16))
