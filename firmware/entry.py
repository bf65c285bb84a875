"""The firmware's C entry points: the data plane's own threads call these (`numba.cfunc`,
no Python object, no GIL) for the compute commands.  ssdemu/device/daemon.py hands their addresses
to the C side (sde_dev_set_firmware); c/fw/sde_fw.h declares the same signatures.

Why entry points called from C worker threads, rather than Python threads parked inside a
`nogil` kernel that polls a C queue: the data plane's firmware threads are plain pthreads
that sleep on a condition variable between commands and call straight into compiled code,
so a command costs one queue hand-off and one call, no Python thread exists per unit, and
nothing holds or waits for the GIL; a parked kernel would have to spin or call back into C
to sleep, and a Python thread per unit would still take the GIL at start and at exit.

All four return a byte count (>= 0) or a negative firmware/blockops.py code.
"""

import numpy as np
from numba import carray, cfunc, njit, types

# what a call tells the data plane about the block, for its cost: INFO_* (c/fw/sde_fw.h)
from firmware.abi import (
    INFO_BITS,
    INFO_COMPRESSED,
    INFO_ELEMENT_BYTES,
    INFO_ELEMENTS,
    INFO_FROM_GROUP,
    INFO_FROM_KIND,
    INFO_GROUP,
    INFO_KIND,
    INFO_RAW,
    INFO_SLOTS,
    INFO_SUMMARY_BYTES,
)
from firmware.blockops import (
    E_OUT_SMALL,
    E_REQUEST,
    NPARAM,
    P_BITS,
    P_BY_HEAD,
    P_DTYPE,
    P_GROUP,
    P_KIND,
    add_summaries,
    compressed_bytes,
    dequantize_block,
    dequantized_bytes,
    elements,
    open_header,
    parse_request,
    peek_header,
    quantize_block,
    summary_bytes,
)
from firmware.prefix_hash import hash_chain
from firmware.requant import requantize_block

u8p = types.CPointer(types.uint8)
i64p = types.CPointer(types.int64)
u32p = types.CPointer(types.uint32)



@njit(cache=True, nogil=True)
def _info(p, info, compressed):
    info[INFO_ELEMENTS] = elements(p)
    info[INFO_ELEMENT_BYTES] = 4 if p[P_DTYPE] == 2 else 2
    info[INFO_KIND] = p[P_KIND]
    info[INFO_GROUP] = p[P_GROUP]
    info[INFO_BITS] = p[P_BITS]
    info[INFO_COMPRESSED] = compressed
    info[INFO_RAW] = info[INFO_ELEMENTS] * info[INFO_ELEMENT_BYTES]
    info[INFO_SUMMARY_BYTES] = summary_bytes(p)


@njit(cache=True, nogil=True)
def _quantize(req, src, src_len, out, out_cap, info, by_head):
    p = np.zeros(NPARAM, np.int64)
    inf = carray(info, 8)
    e = parse_request(carray(req, 64), p)
    if e:
        return e
    p[P_BY_HEAD] = by_head
    _info(p, inf, compressed_bytes(p))
    if out_cap < inf[INFO_COMPRESSED]:
        return E_OUT_SMALL
    n = quantize_block(p, carray(src, src_len), carray(out, out_cap))
    if n > 0 and inf[INFO_SUMMARY_BYTES]:
        n = add_summaries(carray(out, n), np.zeros(NPARAM, np.int64))
    return n


@cfunc(types.int64(u8p, u8p, types.int64, u8p, types.int64, i64p), cache=True, nopython=True)
def fw_quantize(req, src, src_len, out, out_cap, info):
    """Quantize the block at src (src_len bytes) as the 64-byte request at req says, into
    out (out_cap bytes, 8-byte aligned), laid out by head where its kind allows
    (firmware/blockfmt.py).  out_cap 0: check the request only and give the sizes in info.
    Returns the compressed size."""
    return _quantize(req, src, src_len, out, out_cap, info, 1)


@cfunc(types.int64(u8p, u8p, types.int64, u8p, types.int64, i64p), cache=True, nopython=True)
def fw_quantize_token_major(req, src, src_len, out, out_cap, info):
    """fw_quantize keeping the token order (`ssdemu serve --kv-layout token`: the layout
    before version 2, for comparing the two)."""
    return _quantize(req, src, src_len, out, out_cap, info, 0)



@cfunc(types.int64(u8p, types.int64, u8p, types.int64, i64p), cache=True, nopython=True)
def fw_dequantize(blob, blob_len, out, out_cap, info):
    """Dequantize the compressed block at blob into out.  out_cap 0: verify the block only
    and give its sizes in info.  Returns the bytes written."""
    p = np.zeros(NPARAM, np.int64)
    inf = carray(info, 8)
    b = carray(blob, blob_len)
    # the checksum is verified by dequantize_block in its own pass; open_header's separate
    # pass runs only when there is nothing to dequantize into, or to name what is wrong
    e = peek_header(b, p)
    if e or out_cap < dequantized_bytes(p):
        e = open_header(b, p)  # a corrupt block says so before E_OUT_SMALL
        if e:
            return e
        _info(p, inf, blob_len)
        return E_OUT_SMALL
    _info(p, inf, blob_len)
    return dequantize_block(b, carray(out, out_cap), p)


@njit(cache=True, nogil=True)
def _requantize(name, blob, blob_len, out, out_cap, info, by_head):
    old = np.zeros(NPARAM, np.int64)
    new = np.zeros(NPARAM, np.int64)
    inf = carray(info, INFO_SLOTS)
    n = requantize_block(carray(blob, blob_len), carray(name, 32), carray(out, out_cap),
                         by_head, old, new)
    if n > 0 or n == E_OUT_SMALL:
        _info(new, inf, compressed_bytes(new))
        inf[INFO_FROM_KIND] = old[P_KIND]
        inf[INFO_FROM_GROUP] = old[P_GROUP]
    return n


@cfunc(types.int64(u8p, u8p, types.int64, u8p, types.int64, i64p), cache=True, nopython=True)
def fw_requantize(name, blob, blob_len, out, out_cap, info):
    """The stored block at blob rewritten at the lower scheme named by the 32 bytes at name
    (firmware/requant.py), into out, laid out by head where the new kind allows.  out_cap 0:
    check only (E_OUT_SMALL, the sizes in info).  Returns the new block's size."""
    return _requantize(name, blob, blob_len, out, out_cap, info, 1)


@cfunc(types.int64(u8p, u8p, types.int64, u8p, types.int64, i64p), cache=True, nopython=True)
def fw_requantize_token_major(name, blob, blob_len, out, out_cap, info):
    """fw_requantize keeping the token order (`ssdemu serve --kv-layout token`)."""
    return _requantize(name, blob, blob_len, out, out_cap, info, 0)


@cfunc(types.int64(u32p, types.int64, types.int64, u8p, u8p), cache=True, nopython=True)
def fw_hash_chain(tokens, ntokens, block_tokens, root, keys):
    """The chained 16-byte keys of the full blocks of tokens (firmware/prefix_hash.py) into
    keys (16 bytes per block).  Returns the number of blocks."""
    if block_tokens <= 0 or ntokens < 0:
        return E_REQUEST  # never a division by zero: nothing may raise in here
    nblocks = ntokens // block_tokens
    return hash_chain(carray(tokens, ntokens), block_tokens, carray(root, 16),
                      carray(keys, (nblocks, 16)))


def addresses(by_head: bool = True) -> tuple[int, int, int, int]:
    """The entry points' addresses, for sde_dev_set_firmware (by_head: the drive lays blocks
    out by head; False: token-major, as before format version 2)."""
    quantize = fw_quantize if by_head else fw_quantize_token_major
    requantize = fw_requantize if by_head else fw_requantize_token_major
    return quantize.address, fw_dequantize.address, fw_hash_chain.address, requantize.address
