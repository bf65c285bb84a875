"""Plain numpy references of the quantization kinds (tests/test_firmware_quant.py holds the
firmware's kernels to them; tests/test_firmware_requant.py its requantize)."""

import numpy as np


def ref_to_f32(bits_or_f32: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "fp16":
        return bits_or_f32.view(np.float16).astype(np.float32)
    if dtype == "bf16":
        return (bits_or_f32.astype(np.uint32) << 16).view(np.float32)
    return bits_or_f32.astype(np.float32)


def ref_from_f32(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).view(np.uint16)
    if dtype == "bf16":
        u = x.view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return x


def ref_quant_dequant(x: np.ndarray, bits: int, group: int, symmetric: bool):
    """Group-wise quantize then dequantize in float32, as the docs define it.
    Returns (dequantized float32, per-element scale)."""
    n = x.size
    pad = (-n) % group
    xp = np.concatenate([x, np.repeat(x[-1:], pad)]).reshape(-1, group)  # pad with a member
    lo, hi = xp.min(1, keepdims=True), xp.max(1, keepdims=True)
    half = np.float32(0.5)
    with np.errstate(divide="ignore"):
        if symmetric:
            qmax = np.float32(2 ** (bits - 1) - 1)
            scale = np.maximum(np.abs(lo), np.abs(hi)) / qmax
            inv = np.where(scale > 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
            q = np.floor(xp * inv + half)
            q = np.clip(q, -qmax, qmax)
            y = q * scale
        else:
            qmax = np.float32(2**bits - 1)
            scale = (hi - lo) / qmax
            inv = np.where(scale > 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
            q = np.minimum(np.floor((xp - lo) * inv + half), qmax)
            y = q * scale + lo
    per_elem_scale = np.broadcast_to(scale, xp.shape).reshape(-1)[:n]
    return y.astype(np.float32).reshape(-1)[:n], per_elem_scale



def make_block(shape, dtype, fill, seed):
    tokens, layers, heads, dim = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, 2, layers, heads, dim)).astype(np.float32)
    if fill == "zeros":
        x[:] = 0
    elif fill == "const":
        x[:] = np.float32(rng.standard_normal())
    elif fill == "outliers":
        x[..., 0] *= 100  # an outlier channel
    elif fill == "tiny":
        x *= np.float32(1e-6)  # fp16 subnormals
    elif fill == "large":
        x *= np.float32(6e3)
    if dtype == "fp16":
        return x.astype(np.float16).view(np.uint16)
    if dtype == "bf16":
        return ref_from_f32(x.reshape(-1), "bf16").reshape(x.shape)
    return x


E4M3 = __import__("firmware.quant_fp8", fromlist=["E4M3_VALUES"]).E4M3_VALUES


def ref_e4m3(v: np.ndarray) -> np.ndarray:
    """Nearest e4m3fn code of each value (saturating at 448), ties to the even code."""
    codes = np.arange(0x7F)
    mags = E4M3[:0x7F].astype(np.float64)
    a = np.minimum(np.abs(v.astype(np.float64)), 448.0)
    d = np.abs(a[:, None] - mags[None, :])
    best = d == d.min(1, keepdims=True)
    tie = best.sum(1) > 1
    pick = np.where(tie, np.argmax(best & (codes % 2 == 0)[None, :], 1), np.argmax(best, 1))
    return (pick | np.where(v < 0, 0x80, 0)).astype(np.uint8)




def ref_int_block(x: np.ndarray, bits: int, group: int, symmetric: bool) -> np.ndarray:
    """A block (float32, any shape) group-wise over its flat elements, dequantized."""
    y, _ = ref_quant_dequant(x.reshape(-1), bits, group, symmetric)
    return y.reshape(x.shape)


def ref_kivi_block(x: np.ndarray, dtype: str, bits: int, group: int, residual: int,
                   raw: np.ndarray) -> np.ndarray:
    """KIVI of a (tokens, 2, layers, heads, dim) float32 block, dequantized, as the block's
    carrier (raw: the block's own bits, which the full-precision window keeps)."""
    from firmware.quant import kivi_quantized_tokens

    q = kivi_quantized_tokens(x.shape[0], group, residual)
    want = x.copy()
    c = x[0, 0].size
    if q:
        keys = x[:q, 0].reshape(q, c).T.reshape(-1)  # per channel: groups along tokens
        ky, _ = ref_quant_dequant(keys, bits, group, False)
        want[:q, 0] = ky.reshape(c, q).T.reshape(want[:q, 0].shape)
        vy, _ = ref_quant_dequant(x[:q, 1].reshape(-1), bits, group, False)
        want[:q, 1] = vy.reshape(want[:q, 1].shape)
    out = ref_from_f32(want.reshape(-1), dtype).reshape(x.shape)
    out[q:] = raw[q:]  # the full-precision window comes back bit for bit
    return out


def ref_fp8_block(x: np.ndarray, per_head: bool) -> np.ndarray:
    """fp8 e4m3 of a (tokens, 2, layers, heads, dim) float32 block, dequantized (float32)."""
    tokens, _two, layers, heads, dim = x.shape
    x = x.reshape(tokens, 2 * layers * heads, dim)
    amax = (np.abs(x).max(axis=(0, 2)) if per_head else np.array([np.abs(x).max()]))
    amax = amax.astype(np.float32)
    scale = np.where(amax > 0, amax / np.float32(448), np.float32(1)).astype(np.float32)
    inv = np.where(amax > 0, np.float32(448) / np.where(amax > 0, amax, 1),
                   np.float32(1)).astype(np.float32)
    v = (x * inv[None, :, None] if per_head else x * inv[0]).astype(np.float32)
    codes = ref_e4m3(v.reshape(-1)).reshape(v.shape)
    decoded = E4M3[codes] * (scale[None, :, None] if per_head else scale[0])
    return decoded.astype(np.float32).reshape(tokens, 2, layers, heads, dim)


def ref_scheme(raw: np.ndarray, dtype: str, scheme: str) -> np.ndarray:
    """The block (its carrier: uint16 bits or float32) quantized at `scheme` and
    dequantized, by the references above, as the carrier again."""
    from firmware.quant import parse_scheme

    s = parse_scheme(scheme)
    x = ref_to_f32(raw.reshape(-1), dtype).reshape(raw.shape)
    if s.kind == "plain":
        return raw.copy()
    if s.kind == "kivi":
        return ref_kivi_block(x, dtype, s.bits, s.group, s.residual, raw)
    y = (ref_fp8_block(x, s.per_head) if s.kind == "fp8"
         else ref_int_block(x, s.bits, s.group, s.symmetric))
    return ref_from_f32(y.reshape(-1), dtype).reshape(raw.shape)
