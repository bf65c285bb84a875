"""numpy views of the queue-pair layout, derived from the compiled C structs (c/wire/sde_queue.h is
the one definition), and the names of opcodes and status codes."""

from __future__ import annotations

import struct

import numpy as np

from ssdemu_wire import _ring

ffi, lib = _ring.ffi, _ring.lib

_NUMPY_OF_C = {"uint64_t": np.uint64, "int64_t": np.int64, "uint32_t": np.uint32,
               "int32_t": np.int32, "uint16_t": np.uint16, "int16_t": np.int16,
               "uint8_t": np.uint8, "int8_t": np.int8}


def dtype_of_struct(ctype: str, of_ffi=None) -> np.dtype:
    """A numpy dtype with the exact field offsets and size of a compiled C struct (of this
    module's ffi, or of another cffi module's)."""
    f = of_ffi or ffi
    t = f.typeof(ctype)
    names, formats, offsets = [], [], []
    for name, field in t.fields:
        names.append(name)
        if field.type.kind == "array":
            formats.append((_NUMPY_OF_C[field.type.item.cname], field.type.length))
        else:
            formats.append(_NUMPY_OF_C[field.type.cname])
        offsets.append(field.offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": f.sizeof(ctype)})

SQE_DTYPE = dtype_of_struct("sde_sqe")
CQE_DTYPE = dtype_of_struct("sde_cqe")
RING_HDR_DTYPE = dtype_of_struct("sde_ring_hdr")
PROTOCOL_VERSION = lib.SDE_PROTOCOL_VERSION


def _constants(prefix: str) -> dict[str, int]:
    return {name[len(prefix):]: getattr(lib, name) for name in dir(lib)
            if name.startswith(prefix) and name not in (prefix + "LAST", prefix + "COUNT")}


OPCODES = _constants("SDE_CMD_")  # name -> opcode
STATUS = _constants("SDE_SC_")  # name -> status code
STATUS_NAMES = {v: k for k, v in STATUS.items()}
NS_SHARED = lib.SDE_NS_SHARED  # NS_CREATE's param1: a namespace every client may use


def new_sqes(n: int) -> np.ndarray:
    return np.zeros(n, dtype=SQE_DTYPE)


# KV_STORE_QUANTIZED's request header, at the start of the command's buffer (the raw KV
# block follows it) or apart: magic, element dtype code (ssdemu_wire.codes), the block's
# layout, scheme name, block shape.
QUANT_REQUEST = struct.Struct("<4sBB2x32s4I8x")
QUANT_REQUEST_MAGIC = b"SQRQ"
assert QUANT_REQUEST.size == 64
# the block's layout: the drive's (tokens, 2, layers, heads, head_dim), or LMCache's
# KV_2LTD (2, layers, tokens, heads, head_dim), which integer schemes take as it is
LAYOUTS = {"t2l": 0, "2lt": 1}


def pack_quant_request(dtype_code: int, scheme: str, tokens: int, layers: int, heads: int,
                       head_dim: int, layout: str = "t2l") -> bytes:
    return QUANT_REQUEST.pack(QUANT_REQUEST_MAGIC, dtype_code, LAYOUTS[layout],
                              scheme.encode("ascii"), tokens, layers, heads, head_dim)
