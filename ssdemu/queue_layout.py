"""numpy views of the queue-pair layout, derived from the compiled C structs (c/sde_queue.h is
the one definition), and the names of opcodes and status codes."""

from __future__ import annotations

import numpy as np

from ssdemu import _engine
from ssdemu.engine import dtype_of_struct

ffi, lib = _engine.ffi, _engine.lib

SQE_DTYPE = dtype_of_struct("sde_sqe")
CQE_DTYPE = dtype_of_struct("sde_cqe")
RING_HDR_DTYPE = dtype_of_struct("sde_ring_hdr")
PROTOCOL_VERSION = lib.SDE_PROTOCOL_VERSION


def _constants(prefix: str) -> dict[str, int]:
    return {name[len(prefix):]: getattr(lib, name) for name in dir(lib)
            if name.startswith(prefix) and name != prefix + "LAST"}


OPCODES = _constants("SDE_CMD_")  # name -> opcode
STATUS = _constants("SDE_SC_")  # name -> status code
STATUS_NAMES = {v: k for k, v in STATUS.items()}
ADMIN_OPCODES = {OPCODES[n] for n in ("IDENTIFY", "NS_CREATE", "NS_DELETE", "NS_LIST",
                                      "GET_LOG")}


def new_sqes(n: int) -> np.ndarray:
    return np.zeros(n, dtype=SQE_DTYPE)
