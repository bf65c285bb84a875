"""Group-wise integer quantization kernels (int8; int4 two per byte; int2 four per byte;
symmetric or asymmetric, 2-bit asymmetric only).

Groups are `group` consecutive elements of the flat input (the last one may be shorter).
Asymmetric: scale = (max - min) / (2^bits - 1), zero = min, code = floor((x - min) / scale +
1/2) in [0, 2^bits - 1], x' = code * scale + zero.  Symmetric: scale = max|x| / (2^(bits-1) - 1),
code = floor(x / scale + 1/2) in [-qmax, qmax], stored offset by 2^(bits-1).  Either way
|x - x'| <= scale / 2 plus float rounding.  A constant group comes back exact when
asymmetric (scale 0), and within float rounding when symmetric.
int4 packs element 2j in the low nibble and 2j+1 in the high nibble of byte j; int2 packs
element 4j + i in bits 2i..2i+1 of byte j (KIVI's 2-bit codes; Liu et al., ICML 2024).  A
symmetric 2-bit code would have three levels (-1, 0, 1): no scheme names it.

Kernels convert a chunk of whole groups to float32 at a time (firmware.convert), then work
group by group on that chunk; all outputs are preallocated by the caller.
"""

import numpy as np
from numba import njit, types
from numba.extending import overload

import firmware.blockparams  # noqa: F401  (registers firmware.sizes' arithmetic with Numba)
from firmware.bits import fp16_bits_as_f32, u32_as_f32
from firmware.convert import f32_to_bf16, f32_to_fp16
from firmware.sizes import code_bytes

CHUNK = 2048  # elements per pass, a multiple of every group size: 8 KiB of float32, in L1
# (measured: 2048 elements 4.1 GB/s, 4096 3.4, 8192 2.9 for int8_g64 on fp16)


SUB = 32  # every group size is a multiple of this; min/max run over SUB-wide pieces


@njit(cache=True, nogil=True, inline="always")
def _float_key(v):
    """int32 bits of a float32 -> an int32 that sorts as the float does (for finite values)."""
    return v ^ ((v >> np.int32(31)) & np.int32(0x7FFFFFFF))


@njit(cache=True, nogil=True, inline="always")
def _group_min_max(buf, n, group, lohi):
    """Per-group min and max of buf[:n] into lohi[2g], lohi[2g+1].

    Float min/max reductions do not vectorize under Numba's lowering (~0.4 ns/element here),
    and neither does an integer one whose trip count is 32 (LLVM unrolls it first).  An
    integer reduction over a constant 64 does (~0.15 ns/element): so the floats are compared
    as order-preserving int32 keys, 64 at a time (for groups of 32, the two halves kept apart
    by masks), and the 32-element pieces are combined per group.  Compiled per group size, so
    `group` is a constant here."""
    bu = buf.view(np.int32)
    keys = lohi.view(np.int32)
    big = np.int32(0x7FFFFFFF)
    nsub = (n + SUB - 1) // SUB
    sub_lo = np.empty(nsub + 1, np.int32)
    sub_hi = np.empty(nsub + 1, np.int32)
    npiece = n // (2 * SUB)
    if group == SUB:
        for p in range(npiece):
            b = p * 2 * SUB
            la = big
            ha = -big
            lb = big
            hb = -big
            for j in range(2 * SUB):
                k = _float_key(bu[b + j])
                first = j < SUB
                la = min(la, k if first else big)
                ha = max(ha, k if first else -big)
                lb = min(lb, big if first else k)
                hb = max(hb, -big if first else k)
            sub_lo[2 * p] = la
            sub_hi[2 * p] = ha
            sub_lo[2 * p + 1] = lb
            sub_hi[2 * p + 1] = hb
    else:  # groups of 64 or 128 need no halves: half the reductions
        for p in range(npiece):
            b = p * 2 * SUB
            lo = big
            hi = -big
            for j in range(2 * SUB):
                k = _float_key(bu[b + j])
                lo = min(lo, k)
                hi = max(hi, k)
            sub_lo[2 * p] = lo
            sub_hi[2 * p] = hi
            sub_lo[2 * p + 1] = lo
            sub_hi[2 * p + 1] = hi
    for s in range(2 * npiece, nsub):  # the tail: fewer than 64 elements
        lo = big
        hi = -big
        for i in range(s * SUB, min((s + 1) * SUB, n)):
            k = _float_key(bu[i])
            lo = min(lo, k)
            hi = max(hi, k)
        sub_lo[s] = lo
        sub_hi[s] = hi
    per = group // SUB
    for g in range((n + group - 1) // group):
        s1 = min((g + 1) * per, nsub)
        lo = big
        hi = -big
        for s in range(g * per, s1):
            lo = min(lo, sub_lo[s])
            hi = max(hi, sub_hi[s])
        keys[2 * g] = _float_key(lo)  # the key map is its own inverse
        keys[2 * g + 1] = _float_key(hi)


@njit(cache=True, nogil=True, inline="always")
def _quant_group(buf, g0, g1, gi, qmax_u, qmax_s, offset, symmetric, lo, hi, scales, zeros,
                 codes):
    """Quantize buf[g0:g1], one group with min lo and max hi, into codes[g0:g1]."""
    # loops index slices from 0: an offset index is not known to be non-negative, and
    # Numba's negative-index wraparound then keeps LLVM from vectorizing
    x = buf[g0:g1]
    c = codes[g0:g1]
    half = np.float32(0.5)
    zero32 = np.float32(0.0)
    if symmetric:
        amax = max(abs(lo), abs(hi))
        scale = amax / qmax_s
        inv = np.float32(1.0) / scale if scale > zero32 else zero32
        scales[gi] = scale
        # plain compares, not min/max: Numba's float min/max test for NaN, which (with a
        # run-time bound) keeps the loop scalar; the input holds no NaN here
        for i in range(g1 - g0):
            q = np.floor(x[i] * inv + half)
            q = q if q > -qmax_s else -qmax_s
            q = q if q < qmax_s else qmax_s
            c[i] = np.uint8(np.int32(q + offset))
    else:
        scale = (hi - lo) / qmax_u
        inv = np.float32(1.0) / scale if scale > zero32 else zero32
        scales[gi] = scale
        zeros[gi] = lo
        # (x - min) * inv + 1/2 >= 0, so truncation is floor
        for i in range(g1 - g0):
            q = (x[i] - lo) * inv + half
            q = q if q < qmax_u else qmax_u
            c[i] = np.uint8(np.int32(q))


@njit(cache=True, nogil=True, inline="always")
def _quant_groups(buf, n, base, group, bits, symmetric, scales, zeros, codes, lohi):
    """Quantize buf[:n] (float32, element `base` of the stream) into codes[:n], with the
    per-group min and max in lohi.  Compiled per (group, bits, symmetric) as constants (below):
    with a constant trip count the per-group loops vectorize, with a run-time one they do not
    (measured: 0.26 vs 1.4 ns/element); with `symmetric` known at compile time too, rather
    than at run time, the hot loop runs twice as fast (0.32 vs 0.61 ns/element)."""
    qmax_u = np.float32((1 << bits) - 1)
    qmax_s = np.float32((1 << (bits - 1)) - 1)
    offset = np.float32(1 << (bits - 1))
    g0 = base // group
    for g in range(n // group):
        b = g * group
        _quant_group(buf, b, b + group, g0 + g, qmax_u, qmax_s, offset, symmetric,
                     lohi[2 * g], lohi[2 * g + 1], scales, zeros, codes)
    if n % group:
        g = n // group
        _quant_group(buf, g * group, n, g0 + g, qmax_u, qmax_s, offset, symmetric,
                     lohi[2 * g], lohi[2 * g + 1], scales, zeros, codes)


@njit(cache=True, nogil=True, inline="always")
def _half_key(x):
    """int16 bits of an fp16 or bf16 -> an int16 that sorts as the value does (for finite
    values; infinities and NaN sort past them)."""
    return np.int16(x ^ ((x >> np.int16(15)) & np.int16(0x7FFF)))


@njit(cache=True, nogil=True, inline="always")
def _half_min_max(src, n, group, dtype, lohi):
    """Per-group min and max of 16-bit floats (fp16 dtype 0, bf16 dtype 1) straight from
    their bits, into lohi as float32; returns 1 if any is inf or NaN.

    The 16-bit order keys reduce sixteen to a vector register, twice the width of the float32
    keys of _group_min_max, and need no conversion first (measured: 0.11 vs 0.41
    ns/element).  Compiled with `group` a constant, so the reductions have a constant trip
    count and vectorize."""
    k = src.view(np.int16)
    # fp16: exponent 0x1f is inf/NaN; bf16: 0xff.  Their keys lie past every finite one.
    top = np.int16(0x7C00) if dtype == 0 else np.int16(0x7F80)
    bottom = _half_key(np.int16(-1024)) if dtype == 0 else _half_key(np.int16(-128))
    bad = 0
    ng = (n + group - 1) // group
    if group == 32:
        # a reduction of trip count 32 does not vectorize (LLVM unrolls it first): two
        # groups at a time over 64, each half kept apart by a select
        big = np.int16(32767)
        small = np.int16(-32768)
        for p in range(n // 64):
            b = np.uint64(p * 64)
            la = big
            ha = small
            lb = big
            hb = small
            for i in range(64):
                v = _half_key(k[b + np.uint64(i)])
                first = i < 32
                la = min(la, v if first else big)
                ha = max(ha, v if first else small)
                lb = min(lb, big if first else v)
                hb = max(hb, small if first else v)
            bad |= (max(ha, hb) >= top) | (min(la, lb) <= bottom)
            _store_half(lohi, 2 * p, la, ha, dtype)
            _store_half(lohi, 2 * p + 1, lb, hb, dtype)
    first = 2 * (n // 64) if group == 32 else 0
    for g in range(first, ng):
        b = g * group
        ub = np.uint64(b)
        lo = np.int16(32767)
        hi = np.int16(-32768)
        # unsigned indices, not a slice per group: they need no wraparound (which would keep
        # the loop scalar), and a slice costs a reference-count call per group (~15% of this
        # function, measured)
        if b + group <= n:
            for i in range(group):
                v = _half_key(k[ub + np.uint64(i)])
                lo = min(lo, v)
                hi = max(hi, v)
        else:
            for i in range(n - b):
                v = _half_key(k[ub + np.uint64(i)])
                lo = min(lo, v)
                hi = max(hi, v)
        bad |= (hi >= top) | (lo <= bottom)
        _store_half(lohi, g, lo, hi, dtype)
    return 1 if bad else 0


@njit(cache=True, nogil=True, inline="always")
def _store_half(lohi, g, lo, hi, dtype):
    """Group g's min and max keys, as float32 values, into lohi."""
    lo_bits = _half_key(lo)  # the key map is its own inverse
    hi_bits = _half_key(hi)
    if dtype == 0:
        lohi[2 * g] = fp16_bits_as_f32(lo_bits)
        lohi[2 * g + 1] = fp16_bits_as_f32(hi_bits)
    else:
        lohi[2 * g] = u32_as_f32(np.uint32(np.uint16(lo_bits)) << np.uint32(16))
        lohi[2 * g + 1] = u32_as_f32(np.uint32(np.uint16(hi_bits)) << np.uint32(16))


# ---- one compiled kernel per constant --------------------------------------------------------
#
# The loops above vectorize only with the group size, the bit width and the symmetry known at
# compile time (measured in _quant_groups' docstring).  Each is compiled once per combination
# as a closure over those constants (Numba caches a closure under its cell values).  They used
# to be inlined at Numba's IR level, three group sizes into each of the nine quantizers and
# two symmetries into the dequantizer: Numba's inliner re-types a callee at every call site,
# and that pass alone took 22 of the 29 s each quantizer took to compile (firmware.warm:
# 470-720 s on a fresh cache, 135-175 s now).
#
# The selectors (`*_of`) are still inlined at Numba's level (a tree of calls: cheap), so that
# in a quantizer whose dtype, bits and symmetry are constants only the three group sizes'
# calls are left; the kernels are inlined by LLVM (`forceinline`), after they were compiled
# with their constants.  Called instead, once per chunk, they ran 10-28% slower (the
# reference counts of four arrays per call, in a 1 us chunk; fp16 in cache, interleaved).
# The min/max over groups of 32 stays a call: inlined by LLVM, its two-groups-at-once loop
# stopped vectorizing (int4_g32 quantize 0.63 -> 4.99 ns/element), called it costs nothing
# measurable.

GROUPS = (32, 64, 128)


def _half_min_max_kernel(group, dtype):
    @njit(cache=True, nogil=True, forceinline=group != 32)
    def min_max(src, n, lohi):
        return _half_min_max(src, n, group, dtype, lohi)
    return min_max


def _f32_min_max_kernel(group):
    @njit(cache=True, nogil=True, forceinline=group != 32)
    def min_max(buf, n, lohi):
        _group_min_max(buf, n, group, lohi)
    return min_max


def _quant_groups_kernel(group, bits, symmetric):
    @njit(cache=True, nogil=True, forceinline=True)
    def quant_groups(buf, n, base, scales, zeros, codes, lohi):
        _quant_groups(buf, n, base, group, bits, symmetric, scales, zeros, codes, lohi)
    return quant_groups


_MM_FP16_32, _MM_FP16_64, _MM_FP16_128 = (_half_min_max_kernel(g, 0) for g in GROUPS)
_MM_BF16_32, _MM_BF16_64, _MM_BF16_128 = (_half_min_max_kernel(g, 1) for g in GROUPS)
_MM_F32_32, _MM_F32_64, _MM_F32_128 = (_f32_min_max_kernel(g) for g in GROUPS)
(_QG_32_8, _QG_32_8S, _QG_32_4, _QG_32_4S, _QG_64_8, _QG_64_8S, _QG_64_4, _QG_64_4S,
 _QG_128_8, _QG_128_8S, _QG_128_4, _QG_128_4S) = (
    _quant_groups_kernel(g, b, s) for g in GROUPS for b in (8, 4) for s in (False, True))
_QG_32_2, _QG_64_2, _QG_128_2 = (_quant_groups_kernel(g, 2, False) for g in GROUPS)


@njit(cache=True, nogil=True, inline="always")
def _half_min_max_of(src, n, group, dtype, lohi):
    """_half_min_max by the kernel compiled for this group size and 16-bit type."""
    if dtype == 0:
        if group == 32:
            return _MM_FP16_32(src, n, lohi)
        if group == 64:
            return _MM_FP16_64(src, n, lohi)
        return _MM_FP16_128(src, n, lohi)
    if group == 32:
        return _MM_BF16_32(src, n, lohi)
    if group == 64:
        return _MM_BF16_64(src, n, lohi)
    return _MM_BF16_128(src, n, lohi)


@njit(cache=True, nogil=True, inline="always")
def _f32_min_max_of(buf, n, group, lohi):
    """_group_min_max by the kernel compiled for this group size."""
    if group == 32:
        _MM_F32_32(buf, n, lohi)
    elif group == 64:
        _MM_F32_64(buf, n, lohi)
    else:
        _MM_F32_128(buf, n, lohi)


@njit(cache=True, nogil=True, inline="always")
def _quant_groups_of(buf, n, base, group, bits, symmetric, scales, zeros, codes, lohi):
    """_quant_groups by the kernel compiled for this group size, bit width and symmetry
    (2-bit: asymmetric only)."""
    if bits == 2:
        if group == 32:
            _QG_32_2(buf, n, base, scales, zeros, codes, lohi)
        elif group == 64:
            _QG_64_2(buf, n, base, scales, zeros, codes, lohi)
        else:
            _QG_128_2(buf, n, base, scales, zeros, codes, lohi)
    elif group == 32:
        if bits == 8:
            if symmetric:
                _QG_32_8S(buf, n, base, scales, zeros, codes, lohi)
            else:
                _QG_32_8(buf, n, base, scales, zeros, codes, lohi)
        elif symmetric:
            _QG_32_4S(buf, n, base, scales, zeros, codes, lohi)
        else:
            _QG_32_4(buf, n, base, scales, zeros, codes, lohi)
    elif group == 64:
        if bits == 8:
            if symmetric:
                _QG_64_8S(buf, n, base, scales, zeros, codes, lohi)
            else:
                _QG_64_8(buf, n, base, scales, zeros, codes, lohi)
        elif symmetric:
            _QG_64_4S(buf, n, base, scales, zeros, codes, lohi)
        else:
            _QG_64_4(buf, n, base, scales, zeros, codes, lohi)
    elif bits == 8:
        if symmetric:
            _QG_128_8S(buf, n, base, scales, zeros, codes, lohi)
        else:
            _QG_128_8(buf, n, base, scales, zeros, codes, lohi)
    elif symmetric:
        _QG_128_4S(buf, n, base, scales, zeros, codes, lohi)
    else:
        _QG_128_4(buf, n, base, scales, zeros, codes, lohi)


@njit(cache=True, nogil=True, inline="always")
def _pack4_into(codes, m, payload, at):
    """codes[:m] (one int4 code per byte) two per byte into payload[at:], element 2j in the
    low nibble.  A pair is read as one little-endian uint16 (contiguous loads, which
    vectorize, where codes[2j] and codes[2j+1] were strided), at unsigned indices (no
    wraparound check), inlined (no slices, no call): int4_g64 quantize of fp16 in cache
    0.55 -> 0.48 ns/element, interleaved."""
    w = codes.view(np.uint16)  # codes holds CHUNK bytes, an even number
    base = np.uint64(at)
    for j in range(m >> 1):
        x = w[j]
        payload[base + np.uint64(j)] = np.uint8((x & np.uint16(0x0F))
                                                | ((x >> np.uint16(4)) & np.uint16(0xF0)))
    if m % 2:
        payload[base + np.uint64(m >> 1)] = codes[m - 1]


@njit(cache=True, nogil=True, inline="always")
def _pack2_into(codes, m, payload, at):
    """codes[:m] (one int2 code per byte) four per byte into payload[at:], element 4j in the
    low two bits; four codes read as one little-endian uint32 (contiguous loads, as
    _pack4_into)."""
    w = codes.view(np.uint32)  # codes holds CHUNK bytes, a multiple of 4
    base = np.uint64(at)
    for j in range(m >> 2):
        x = w[j]
        payload[base + np.uint64(j)] = np.uint8(
            (x & np.uint32(0x3)) | ((x >> np.uint32(6)) & np.uint32(0xC))
            | ((x >> np.uint32(12)) & np.uint32(0x30)) | ((x >> np.uint32(18)) & np.uint32(0xC0)))
    if m % 4:
        j = m >> 2
        v = 0
        for i in range(m - 4 * j):
            v |= np.int64(codes[4 * j + i]) << (2 * i)
        payload[base + np.uint64(j)] = np.uint8(v)


@njit(cache=True, nogil=True, inline="always")
def _pack_into(codes, m, payload, c0, bits):
    """A chunk's sub-byte codes (bits 4 or 2) packed into the payload at element c0."""
    if bits == 4:
        _pack4_into(codes, m, payload, c0 >> 1)
    else:
        _pack2_into(codes, m, payload, c0 >> 2)


@njit(cache=True, nogil=True, inline="always")
def quantize_int(src, dtype, group, bits, symmetric, scales, zeros, payload):
    """src: uint16[n] (fp16 dtype 0 / bf16 dtype 1) or float32[n] (dtype 2) -> per-group
    scales (and zeros when asymmetric) and payload: uint8 codes, one per element (int8), two
    per byte (int4) or four (int2).  Returns the number of inf/NaN inputs (the caller refuses
    the block when it is not 0).

    A 16-bit block (every KV block a model sends) is quantized by one compiled function per
    (dtype, bits, symmetric), each with the three as compile-time constants: compiled as one
    function with them known only at run time, though its inner loops saw bits and
    symmetric as literals, the kernel ran 1.4x slower (int8_g64 on fp16, interleaved runs:
    0.72-0.75 vs 0.51-0.52 ns/element).  Each holds only the 16-bit path: with the float32
    path beside it, one took minutes to compile.

    Inlined at Numba's level where it is called: Numba links a callee's code into its
    caller's module and optimizes the whole again, so a wrapper compiled on its own was one
    more pass of LLVM over every quantizer below it (the quantize half of firmware.warm's
    fresh compile, three interleaved rounds: 82-96 s before, 74-83 s after)."""
    return _by_carrier(src, dtype, group, bits, symmetric, scales, zeros, payload)


def _by_carrier(src, dtype, group, bits, symmetric, scales, zeros, payload):
    """The quantizer for src's carrier type (an overload below: a uint16 block compiles the
    eight 16-bit quantizers, a float32 one only the float32 kernel)."""
    raise NotImplementedError("compiled code only")


def _half_quantizer(dtype, bits, symmetric):
    """_quantize_half compiled for one (dtype, bits, symmetric); Numba caches each closure
    under its own constants."""
    @njit(cache=True, nogil=True)
    def quantize(src, group, scales, zeros, payload):
        return _quantize_half(src, dtype, group, bits, symmetric, scales, zeros, payload)
    return quantize


_FP16_8, _FP16_8S, _FP16_4, _FP16_4S = (_half_quantizer(0, b, s)
                                        for b in (8, 4) for s in (False, True))
_BF16_8, _BF16_8S, _BF16_4, _BF16_4S = (_half_quantizer(1, b, s)
                                        for b in (8, 4) for s in (False, True))
_FP16_2, _BF16_2 = _half_quantizer(0, 2, False), _half_quantizer(1, 2, False)


@overload(_by_carrier, jit_options={"nogil": True})
def _by_carrier_typed(src, dtype, group, bits, symmetric, scales, zeros, payload):
    if src.dtype == types.float32:
        def by_float32(src, dtype, group, bits, symmetric, scales, zeros, payload):
            return _quantize_float32(src, group, bits, symmetric, scales, zeros, payload)
        return by_float32

    def by_half(src, dtype, group, bits, symmetric, scales, zeros, payload):
        if bits == 2:
            if dtype == 0:
                return _FP16_2(src, group, scales, zeros, payload)
            return _BF16_2(src, group, scales, zeros, payload)
        if dtype == 0:
            if bits == 8:
                if symmetric:
                    return _FP16_8S(src, group, scales, zeros, payload)
                return _FP16_8(src, group, scales, zeros, payload)
            if symmetric:
                return _FP16_4S(src, group, scales, zeros, payload)
            return _FP16_4(src, group, scales, zeros, payload)
        if bits == 8:
            if symmetric:
                return _BF16_8S(src, group, scales, zeros, payload)
            return _BF16_8(src, group, scales, zeros, payload)
        if symmetric:
            return _BF16_4S(src, group, scales, zeros, payload)
        return _BF16_4(src, group, scales, zeros, payload)
    return by_half


@njit(cache=True, nogil=True, inline="always")
def _quantize_half(src, dtype, group, bits, symmetric, scales, zeros, payload):
    """16-bit floats (fp16 dtype 0, bf16 dtype 1): per chunk, min and max from their bits,
    then converted and quantized.  Inlined where dtype, bits and symmetric are constants."""
    n = src.shape[0]
    assert group == 32 or group == 64 or group == 128
    step = CHUNK  # a multiple of 4, so int4 and int2 chunks start on a byte boundary
    buf = np.empty(step, np.float32)
    codes = np.empty(step, np.uint8)
    lohi = np.empty(2 * (CHUNK // SUB), np.float32)
    bad = 0
    for c0 in range(0, n, step):
        c1 = min(c0 + step, n)
        m = c1 - c0
        # int8 codes go straight into the payload; int4 and int2 codes are packed after
        target = payload[c0:c1] if bits == 8 else codes[:m]
        part = src[c0:c1]
        bad += _half_min_max_of(part, m, group, dtype, lohi)
        # converted into the float32 chunk buffer first (fp16: F16C; bf16: a shift).
        # Converting inside the quantizing loop instead measured slower (0.73 vs 0.44
        # ns/element, int8_g64): the mixed 16/32/8-bit loop vectorizes worse
        if dtype == 0:
            for i in range(m):
                buf[i] = fp16_bits_as_f32(part[i])
        else:
            for i in range(m):
                buf[i] = u32_as_f32(np.uint32(part[i]) << np.uint32(16))
        _quant_groups_of(buf, m, c0, group, bits, symmetric, scales, zeros, target, lohi)
        if bits != 8:
            _pack_into(codes, m, payload, c0, bits)
    return bad


@njit(cache=True, nogil=True)
def _quantize_float32(src, group, bits, symmetric, scales, zeros, payload):
    """float32 blocks: copied (and checked) into the chunk buffer, then quantized."""
    n = src.shape[0]
    assert group == 32 or group == 64 or group == 128
    step = CHUNK
    buf = np.empty(step, np.float32)
    codes = np.empty(step, np.uint8)
    lohi = np.empty(2 * (CHUNK // SUB), np.float32)
    bad = 0
    for c0 in range(0, n, step):
        c1 = min(c0 + step, n)
        m = c1 - c0
        target = payload[c0:c1] if bits == 8 else codes[:m]
        # loops index slices from 0 (an offset index is not known to be non-negative, and
        # Numba's wraparound for negative indices then keeps LLVM from vectorizing)
        chunk = src[c0:c1]
        for i in range(m):
            v = chunk[i]
            bad += not np.isfinite(v)
            buf[i] = v
        _f32_min_max_of(buf, m, group, lohi)
        _quant_groups_of(buf, m, c0, group, bits, symmetric, scales, zeros, target, lohi)
        if bits != 8:
            _pack_into(codes, m, payload, c0, bits)
    return bad


@njit(cache=True, nogil=True, inline="always")
def _dequant_chunk(pay, m, gbase, group, bits, symmetric, scales, zeros, buf):
    """Codes of one chunk (pay: its payload bytes) -> float32 values in buf[:m]."""
    offset = np.float32(1 << (bits - 1))
    mask = np.uint8(0x0F)
    if bits == 2:
        three = np.uint8(3)
        for j in range(m // 4):
            b = pay[j]
            buf[4 * j] = np.float32(b & three)
            buf[4 * j + 1] = np.float32((b >> np.uint8(2)) & three)
            buf[4 * j + 2] = np.float32((b >> np.uint8(4)) & three)
            buf[4 * j + 3] = np.float32(b >> np.uint8(6))
        for i in range(m // 4 * 4, m):
            buf[i] = np.float32((pay[i // 4] >> np.uint8(2 * (i % 4))) & three)
    elif bits == 4:
        for j in range(m // 2):
            b = pay[j]
            buf[2 * j] = np.float32(b & mask)
            buf[2 * j + 1] = np.float32(b >> np.uint8(4))
        if m % 2:
            buf[m - 1] = np.float32(pay[m // 2] & mask)
    else:
        for i in range(m):
            buf[i] = np.float32(pay[i])
    # unsigned indices into buf, not a slice per group: a slice costs a reference-count call
    # per group, and a signed index a wraparound test that keeps the loop scalar
    for g in range((m + group - 1) // group):
        if g * group + group <= m:  # a whole group: `group` is a literal trip count
            _scale_group(buf, g * group, group, symmetric, offset, scales[gbase + g],
                         zeros[gbase + g] if not symmetric else offset)
        else:
            _scale_group(buf, g * group, m - g * group, symmetric, offset, scales[gbase + g],
                         zeros[gbase + g] if not symmetric else offset)


@njit(cache=True, nogil=True, inline="always")
def _scale_group(buf, start, k, symmetric, offset, scale, zero):
    """buf[start:start + k] from codes to values, in place."""
    b = np.uint64(start)
    if symmetric:
        for i in range(k):
            j = b + np.uint64(i)
            buf[j] = (buf[j] - offset) * scale
    else:
        for i in range(k):
            j = b + np.uint64(i)
            buf[j] = buf[j] * scale + zero


def _dequant_chunk_kernel(group, bits, symmetric):
    @njit(cache=True, nogil=True, forceinline=True)
    def dequant_chunk(pay, m, gbase, scales, zeros, buf):
        _dequant_chunk(pay, m, gbase, group, bits, symmetric, scales, zeros, buf)
    return dequant_chunk


(_DQ_32_8, _DQ_32_8S, _DQ_32_4, _DQ_32_4S, _DQ_64_8, _DQ_64_8S, _DQ_64_4, _DQ_64_4S,
 _DQ_128_8, _DQ_128_8S, _DQ_128_4, _DQ_128_4S) = (
    _dequant_chunk_kernel(g, b, s) for g in GROUPS for b in (8, 4) for s in (False, True))
_DQ_32_2, _DQ_64_2, _DQ_128_2 = (_dequant_chunk_kernel(g, 2, False) for g in GROUPS)


@njit(cache=True, nogil=True, inline="always")
def _dequant_chunk_of(pay, m, gbase, group, bits, symmetric, scales, zeros, buf):
    """_dequant_chunk by the kernel compiled for this group size, bit width and symmetry
    (see "one compiled kernel per constant"; 2-bit: asymmetric only)."""
    if bits == 2:
        if group == 32:
            _DQ_32_2(pay, m, gbase, scales, zeros, buf)
        elif group == 64:
            _DQ_64_2(pay, m, gbase, scales, zeros, buf)
        else:
            _DQ_128_2(pay, m, gbase, scales, zeros, buf)
    elif group == 32:
        if bits == 8:
            if symmetric:
                _DQ_32_8S(pay, m, gbase, scales, zeros, buf)
            else:
                _DQ_32_8(pay, m, gbase, scales, zeros, buf)
        elif symmetric:
            _DQ_32_4S(pay, m, gbase, scales, zeros, buf)
        else:
            _DQ_32_4(pay, m, gbase, scales, zeros, buf)
    elif group == 64:
        if bits == 8:
            if symmetric:
                _DQ_64_8S(pay, m, gbase, scales, zeros, buf)
            else:
                _DQ_64_8(pay, m, gbase, scales, zeros, buf)
        elif symmetric:
            _DQ_64_4S(pay, m, gbase, scales, zeros, buf)
        else:
            _DQ_64_4(pay, m, gbase, scales, zeros, buf)
    elif bits == 8:
        if symmetric:
            _DQ_128_8S(pay, m, gbase, scales, zeros, buf)
        else:
            _DQ_128_8(pay, m, gbase, scales, zeros, buf)
    elif symmetric:
        _DQ_128_4S(pay, m, gbase, scales, zeros, buf)
    else:
        _DQ_128_4(pay, m, gbase, scales, zeros, buf)


@njit(cache=True, nogil=True)
def dequantize_int(payload, n, dtype, group, bits, symmetric, scales, zeros, out):
    """Inverse of quantize_int into out: uint16[n] (fp16/bf16) or float32[n]."""
    assert group == 32 or group == 64 or group == 128
    step = CHUNK  # a multiple of 4: int4 and int2 chunks start on a byte boundary
    buf = np.empty(step, np.float32)
    for c0 in range(0, n, step):
        c1 = min(c0 + step, n)
        m = c1 - c0
        pay = payload[c0 * bits // 8:code_bytes(c1, bits)]
        gbase = c0 // group
        _dequant_chunk_of(pay, m, gbase, group, bits, symmetric, scales, zeros, buf)
        dst = out[c0:c1]
        if dtype == 0:
            f32_to_fp16(buf[:m], dst)
        elif dtype == 1:
            f32_to_bf16(buf[:m], dst)
        else:
            for i in range(m):
                dst[i] = buf[i]
