"""fp8 e4m3 (the "fn" variant: no infinities, max 448, one NaN pattern) with a float32 scale
per tensor or per KV head.

Encoding: v = x * (1 / scale), clamped to [-448, 448] (saturating), rounded to the nearest
e4m3 value, ties to even.  Normal values (|v| >= 2^-6) round the float32 mantissa to 3 bits
in the integer domain; subnormals (multiples of 2^-9) round by a float add of 2^23 (the FPU
rounds to nearest even).  scale = max|x| / 448 over the tensor or the head (1 when that is 0),
so the largest value maps to 448 (up to float rounding of 1/scale).  Decoding is a 256-entry
table times the scale.
"""

import numpy as np
from numba import njit

from firmware.bits import f32_as_u32
from firmware.convert import bf16_to_f32, f32_to_bf16, f32_to_fp16, fp16_to_f32

FP8_MAX = np.float32(448.0)
_SUB_MAGIC = np.float32(8388608.0)  # 2^23: adding it rounds a value < 2^22 to an integer
_SUB_MAGIC_BITS = np.uint32(0x4B000000)
_MIN_NORMAL_BITS = np.uint32(0x3C800000)  # 2^-6 as float32 bits


def e4m3_table() -> np.ndarray:
    """float32 value of every e4m3fn code, from the format's definition (NaN for 0x7F/0xFF)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    value = np.where(exp == 0, man / 8.0 * 2.0**-6, (1 + man / 8.0) * 2.0 ** (exp - 7))
    value = sign * value
    value[(codes & 0x7F) == 0x7F] = np.nan
    return value.astype(np.float32)


E4M3_VALUES = e4m3_table()


@njit(cache=True, nogil=True)
def encode_e4m3(x, inv_scale, out):
    """x float32[n] -> out uint8[n] e4m3 codes of x * inv_scale."""
    lim = FP8_MAX
    for i in range(x.shape[0]):
        v = abs(x[i] * inv_scale)
        v = v if v < lim else lim
        u = f32_as_u32(v)
        # normal: round the 23-bit mantissa to 3 bits, nearest even
        r = (u + np.uint32(0x7FFFF) + ((u >> np.uint32(20)) & np.uint32(1))) & np.uint32(
            0xFFF00000)
        normal = (((r >> np.uint32(23)) - np.uint32(127 - 7)) << np.uint32(3)) | (
            (r >> np.uint32(20)) & np.uint32(7))
        sub = f32_as_u32(v * np.float32(512.0) + _SUB_MAGIC) - _SUB_MAGIC_BITS
        code = sub if u < _MIN_NORMAL_BITS else normal
        sign = np.uint32(0x80) if x[i] < 0 else np.uint32(0)
        out[i] = np.uint8(code | sign)


@njit(cache=True, nogil=True)
def decode_e4m3(codes, scale, table, out):
    """codes uint8[n] -> out float32[n] = table[code] * scale."""
    for i in range(codes.shape[0]):
        out[i] = table[codes[i]] * scale


@njit(cache=True, nogil=True)
def _row_to_f32(src, dtype, buf):
    """One row of a block (uint16 fp16/bf16 bits or float32) -> buf; returns inf/NaN count."""
    if dtype == 0:
        return fp16_to_f32(src, buf)
    if dtype == 1:
        return bf16_to_f32(src, buf)
    bad = 0
    for i in range(src.shape[0]):
        v = src[i]
        bad += not np.isfinite(v)
        buf[i] = v
    return bad


@njit(cache=True, nogil=True)
def quantize_fp8(src, dtype, row, heads, per_head, scales, out):
    """src: flat block, rows of `row` (= head_dim) elements; row r belongs to KV head
    r % heads (heads = 2 * layers * kv_heads).  scales: float32[heads] (per head) or [1].
    Writes e4m3 codes to out uint8[n].  Returns the number of inf/NaN inputs."""
    n = src.shape[0]
    nrows = n // row
    buf = np.empty(row, np.float32)
    amax = np.zeros(heads if per_head else 1, np.float32)
    bad = 0
    for r in range(nrows):
        bad += _row_to_f32(src[r * row:(r + 1) * row], dtype, buf)
        h = r % heads if per_head else 0
        m = amax[h]
        for i in range(row):
            v = abs(buf[i])
            m = v if v > m else m
        amax[h] = m
    if bad:
        return bad
    inv = np.empty(amax.shape[0], np.float32)
    for h in range(amax.shape[0]):
        scales[h] = amax[h] / FP8_MAX if amax[h] > 0 else np.float32(1.0)
        inv[h] = FP8_MAX / amax[h] if amax[h] > 0 else np.float32(1.0)
    for r in range(nrows):
        _row_to_f32(src[r * row:(r + 1) * row], dtype, buf)
        h = r % heads if per_head else 0
        encode_e4m3(buf, inv[h], out[r * row:(r + 1) * row])
    return 0


@njit(cache=True, nogil=True)
def dequantize_fp8(codes, dtype, row, heads, per_head, scales, table, out):
    """Inverse of quantize_fp8 into out: uint16[n] (fp16/bf16 bits) or float32[n]."""
    nrows = codes.shape[0] // row
    buf = np.empty(row, np.float32)
    for r in range(nrows):
        h = r % heads if per_head else 0
        decode_e4m3(codes[r * row:(r + 1) * row], scales[h], table, buf)
        dst = out[r * row:(r + 1) * row]
        if dtype == 0:
            f32_to_fp16(buf, dst)
        elif dtype == 1:
            f32_to_bf16(buf, dst)
        else:
            for i in range(row):
                dst[i] = buf[i]
