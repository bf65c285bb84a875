"""Group-wise integer quantization kernels (int8, int4 two per byte; symmetric or asymmetric).

Groups are `group` consecutive elements of the flat input (the last one may be shorter).
Asymmetric: scale = (max - min) / (2^bits - 1), zero = min, code = floor((x - min) / scale +
1/2) in [0, 2^bits - 1], x' = code * scale + zero.  Symmetric: scale = max|x| / (2^(bits-1) - 1),
code = floor(x / scale + 1/2) in [-qmax, qmax], stored offset by 2^(bits-1).  Either way
|x - x'| <= scale / 2 plus float rounding.  A constant group has scale 0 and comes back exact.
int4 packs element 2j in the low nibble and 2j+1 in the high nibble of byte j.

Kernels convert a chunk of whole groups to float32 at a time (firmware.convert), then work
group by group on that chunk; all outputs are preallocated by the caller.
"""

import numpy as np
from numba import njit

from firmware.convert import bf16_to_f32, f32_to_bf16, f32_to_fp16, fp16_to_f32

CHUNK_GROUPS = 64  # groups converted per pass: a few KiB, stays in L1


@njit(cache=True, nogil=True)
def _group_min_max(buf, g0, g1):
    """min and max of buf[g0:g1] with four independent chains (a single running min is a
    serial dependency, ~4x slower here)."""
    lo0 = lo1 = lo2 = lo3 = buf[g0]
    hi0 = hi1 = hi2 = hi3 = buf[g0]
    i = g0
    while i + 4 <= g1:
        a, b, c, d = buf[i], buf[i + 1], buf[i + 2], buf[i + 3]
        lo0 = min(lo0, a)
        lo1 = min(lo1, b)
        lo2 = min(lo2, c)
        lo3 = min(lo3, d)
        hi0 = max(hi0, a)
        hi1 = max(hi1, b)
        hi2 = max(hi2, c)
        hi3 = max(hi3, d)
        i += 4
    while i < g1:
        lo0 = min(lo0, buf[i])
        hi0 = max(hi0, buf[i])
        i += 1
    return min(min(lo0, lo1), min(lo2, lo3)), max(max(hi0, hi1), max(hi2, hi3))


@njit(cache=True, nogil=True)
def _quant_chunk(buf, n, base, group, bits, symmetric, scales, zeros, codes):
    """Quantize buf[:n] (float32, element `base` of the stream) into codes[:n]."""
    qmax_u = np.float32((1 << bits) - 1)
    qmax_s = np.float32((1 << (bits - 1)) - 1)
    offset = np.float32(1 << (bits - 1))
    half = np.float32(0.5)
    zero32 = np.float32(0.0)
    for g0 in range(0, n, group):
        g1 = min(g0 + group, n)
        lo, hi = _group_min_max(buf, g0, g1)
        gi = (base + g0) // group
        if symmetric:
            amax = max(abs(lo), abs(hi))
            scale = amax / qmax_s
            inv = np.float32(1.0) / scale if scale > zero32 else zero32
            scales[gi] = scale
            for i in range(g0, g1):
                q = min(max(np.floor(buf[i] * inv + half), -qmax_s), qmax_s)
                codes[i] = np.uint8(q + offset)
        else:
            scale = (hi - lo) / qmax_u
            inv = np.float32(1.0) / scale if scale > zero32 else zero32
            scales[gi] = scale
            zeros[gi] = lo
            # (x - min) * inv + 1/2 >= 0, so truncation is floor
            for i in range(g0, g1):
                q = min((buf[i] - lo) * inv + half, qmax_u)
                codes[i] = np.uint8(q)


@njit(cache=True, nogil=True)
def _pack4(codes, packed):
    n = codes.shape[0]
    for j in range(n // 2):
        packed[j] = codes[2 * j] | (codes[2 * j + 1] << np.uint8(4))
    if n % 2:
        packed[n // 2] = codes[n - 1]


@njit(cache=True, nogil=True)
def quantize_int(src, dtype, group, bits, symmetric, scales, zeros, payload):
    """src: uint16[n] (fp16 dtype 0 / bf16 dtype 1) or float32[n] (dtype 2) -> per-group
    scales (and zeros when asymmetric) and payload: uint8 codes, one per element (int8) or
    two per byte (int4).  Returns the number of inf/NaN inputs (the caller refuses the block
    when it is not 0)."""
    n = src.shape[0]
    step = group * CHUNK_GROUPS  # even, so int4 chunks start on a byte boundary
    buf = np.empty(step, np.float32)
    codes = np.empty(step, np.uint8)
    bad = 0
    for c0 in range(0, n, step):
        c1 = min(c0 + step, n)
        m = c1 - c0
        if dtype == 0:
            bad += fp16_to_f32(src[c0:c1], buf[:m])
        elif dtype == 1:
            bad += bf16_to_f32(src[c0:c1], buf[:m])
        else:
            for i in range(m):
                v = src[c0 + i]
                bad += not np.isfinite(v)
                buf[i] = v
        _quant_chunk(buf, m, c0, group, bits, symmetric, scales, zeros, codes)
        if bits == 4:
            _pack4(codes[:m], payload[c0 >> 1:(c1 + 1) >> 1])
        else:
            payload[c0:c1] = codes[:m]
    return bad


@njit(cache=True, nogil=True)
def dequantize_int(payload, n, dtype, group, bits, symmetric, scales, zeros, out):
    """Inverse of quantize_int into out: uint16[n] (fp16/bf16) or float32[n]."""
    step = group * CHUNK_GROUPS
    buf = np.empty(step, np.float32)
    scratch = np.empty(step, np.float32)
    offset = np.float32(1 << (bits - 1))
    mask = np.uint8(0x0F)
    for c0 in range(0, n, step):
        c1 = min(c0 + step, n)
        m = c1 - c0
        # codes -> float32 codes
        if bits == 4:
            for i in range(0, m - 1, 2):
                b = payload[(c0 + i) >> 1]
                buf[i] = np.float32(b & mask)
                buf[i + 1] = np.float32(b >> np.uint8(4))
            if m % 2:
                buf[m - 1] = np.float32(payload[(c0 + m - 1) >> 1] & mask)
        else:
            for i in range(m):
                buf[i] = np.float32(payload[c0 + i])
        for g0 in range(0, m, group):
            g1 = min(g0 + group, m)
            gi = (c0 + g0) // group
            scale = scales[gi]
            if symmetric:
                for i in range(g0, g1):
                    buf[i] = (buf[i] - offset) * scale
            else:
                zero = zeros[gi]
                for i in range(g0, g1):
                    buf[i] = buf[i] * scale + zero
        if dtype == 0:
            f32_to_fp16(buf[:m], out[c0:c1], scratch)
        elif dtype == 1:
            f32_to_bf16(buf[:m], out[c0:c1])
        else:
            out[c0:c1] = buf[:m]
