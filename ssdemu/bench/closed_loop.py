"""The closed-loop client in C (c/tools/sde_client_loop.c) that `bench queue` and `bench kv`
drive through a connection's queue pair: QD commands kept in flight, Python out of the way."""

from __future__ import annotations

import errno
import os

import numpy as np

import hostlib.client
from ssdemu.bench import _client_loop

ffi, lib = _client_loop.ffi, _client_loop.lib


def run(dev, opcode: int, handle: int, bs: int, qd: int, span: int, seconds: float, *,
        nsid: int = 0, seed: int = 11, stamp: int = 0,
        hist: np.ndarray | None = None, spin_ns: int | None = None) -> tuple[int, float]:
    """(commands completed, seconds taken) of `seconds` of the loop on dev's queue pair.
    span: blocks of the range (block commands) or keys (KV); stamp: an address whose 8 bytes
    the loop rewrites before each command (0: none); hist: a histogram the latencies add to
    (lib.SDE_HIST_BUCKETS uint64).  Waiting for completions, the loop polls as hostlib
    does (SPIN_NS, or spin_ns) while the host has a CPU to spare.  Raises when the loop or
    any command failed."""
    if hist is None:
        hist = np.zeros(lib.SDE_HIST_BUCKETS, np.uint64)
    out = ffi.new("uint64_t[3]")
    qp = dev.qp
    r = lib.sde_client_loop(qp.mem, qp.doorbell_fd, qp.completion_fd, opcode, nsid, handle,
                            bs, qd, span, int(seconds * 1e9), seed,
                            hostlib.client.SPIN_NS if spin_ns is None else spin_ns,
                            ffi.cast("void *", stamp) if stamp else ffi.NULL,
                            ffi.cast("uint64_t *", hist.ctypes.data), out)
    if r == -errno.ETIMEDOUT:
        raise RuntimeError(f"client loop failed: no command completed for "
                           f"{lib.SDE_CLIENT_LOOP_STALL_NS / 1e9:.0f} s (the daemon is stuck)")
    if r < 0:
        raise RuntimeError(f"client loop failed: {os.strerror(-r)}")
    if out[1]:
        raise RuntimeError(f"{out[1]} of {out[0]} commands (opcode {opcode}) failed")
    return out[0], out[2] / 1e9
