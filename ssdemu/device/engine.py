"""Python face of the C io_uring engine (c/engine/sde_engine.c).

I/Os travel as a numpy structured array whose dtype is derived from the compiled `sde_io`
struct, so a batch of any size is one C call: no Python work per I/O.
"""

from __future__ import annotations

import errno

import numpy as np

from ssdemu.device import _device
from ssdemu.device.buffers import address_of
from ssdemu.device.media import Media
from ssdemu.errors import EngineError, raise_for_errno
from ssdemu_wire.layout import dtype_of_struct as _dtype_of_struct

ffi, lib = _device.ffi, _device.lib

OP_READ = lib.SDE_OP_READ
OP_WRITE = lib.SDE_OP_WRITE
OP_READV = lib.SDE_OP_READV
OP_WRITEV = lib.SDE_OP_WRITEV
OP_FSYNC = lib.SDE_OP_FSYNC
IOF_SHORT = lib.SDE_IOF_SHORT
IOF_UNREGISTERED = lib.SDE_IOF_UNREGISTERED

def dtype_of_struct(ctype: str) -> np.dtype:
    """A numpy dtype with the exact field offsets and size of a compiled C struct."""
    return _dtype_of_struct(ctype, ffi)


IO_DTYPE = dtype_of_struct("sde_io")
IOVEC_DTYPE = np.dtype([("base", np.uint64), ("len", np.uint64)])
assert IOVEC_DTYPE.itemsize == ffi.sizeof("struct iovec")


def make_ios(n: int) -> np.ndarray:
    """n zeroed I/O descriptors, unregistered (buf_index -1)."""
    ios = np.zeros(n, dtype=IO_DTYPE)
    ios["buf_index"] = -1
    return ios


class Engine:
    """An io_uring ring on one open media.

    `register_buffers` returns False when the kernel refused (locked-memory limit); the engine
    then runs those I/Os unregistered and counts them (`stats()['unregistered_fallback_ios']`).
    """

    _module = _device  # the compiled engine it runs on (bench io's has its own copy)

    def __init__(self, media: Media, queue_depth: int = 128, sqpoll: bool = False,
                 fixed_file: bool = True, inline: bool = True):
        self._ffi, self._lib = self._module.ffi, self._module.lib
        self._eng = None
        self.media = media
        # inline: shared-memory media's I/O in the caller's thread (stats()['inline_io'])
        flags = ((self._lib.SDE_ENG_SQPOLL if sqpoll else 0)
                 | (0 if fixed_file else self._lib.SDE_ENG_NO_FIXED_FILE)
                 | (0 if inline else self._lib.SDE_ENG_NO_INLINE))
        out = self._ffi.new("sde_engine **")
        raise_for_errno(
            self._lib.sde_engine_new(media.fd, media.size, media.lba_size, queue_depth, flags, out),
            "cannot create io_uring engine",
        )
        self._eng = out[0]
        self.queue_depth = queue_depth
        self._buffers: list[np.ndarray] = []
        self._inflight_batches: list[np.ndarray] = []
        self._reaped = self._ffi.new("sde_io *[]", queue_depth)

    # -- lifecycle --
    def close(self) -> None:
        if self._eng is not None:
            self._lib.sde_engine_free(self._eng)
            self._eng = None
            self._inflight_batches.clear()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()

    # -- buffers --
    def register_buffers(self, arrays: list[np.ndarray]) -> bool:
        """Register fixed buffers (index = position in `arrays`).  False: fell back."""
        iovs = self._ffi.new("struct iovec[]", max(1, len(arrays)))
        for i, a in enumerate(arrays):
            if not a.flags.c_contiguous:
                raise ValueError("buffers must be C-contiguous")
            iovs[i].iov_base = self._ffi.cast("void *", address_of(a))
            iovs[i].iov_len = a.nbytes
        ret = self._lib.sde_register_buffers(self._eng, iovs, len(arrays))
        if ret == -errno.EBUSY:
            raise EngineError(errno.EBUSY, "cannot register buffers with I/O in flight")
        self._buffers = list(arrays)
        return ret == 0

    # -- I/O --
    def _ptr(self, ios: np.ndarray):
        if ios.dtype != IO_DTYPE or not ios.flags.c_contiguous:
            raise TypeError("ios must be a contiguous array of engine.IO_DTYPE (see make_ios)")
        return self._ffi.cast("sde_io *", address_of(ios))

    def run(self, ios: np.ndarray) -> np.ndarray:
        """Run every I/O to completion at the engine's queue depth; results land in `ios`."""
        if len(ios):
            raise_for_errno(self._lib.sde_run(self._eng, self._ptr(ios), len(ios)),
                            "I/O batch failed")
        return ios

    def submit(self, ios: np.ndarray) -> int:
        """Queue what fits under the queue depth; returns how many were taken.  The array must
        stay alive until its I/Os are reaped."""
        n = raise_for_errno(self._lib.sde_submit(self._eng, self._ptr(ios), len(ios)),
                            "submit failed")
        if n:
            self._inflight_batches.append(ios)
        return n

    def reap(self, min_complete: int = 1) -> int:
        """Wait for at least min_complete completions; returns how many completed."""
        n = raise_for_errno(
            self._lib.sde_reap(self._eng, self._reaped, self.queue_depth, min_complete),
            "reap failed")
        if self.inflight == 0:
            self._inflight_batches.clear()
        return n

    @property
    def inflight(self) -> int:
        return self._lib.sde_inflight(self._eng)

    def stats(self) -> dict:
        s = self._ffi.new("sde_stats *")
        self._lib.sde_get_stats(self._eng, s)
        return {name: getattr(s, name) for name, _ in self._ffi.typeof("sde_stats").fields}

    # -- one-shot helpers (tests, tools) --
    def pread(self, buf: np.ndarray, offset: int, buf_index: int = -1) -> int:
        return self._one(OP_READ, buf, offset, buf_index)

    def pwrite(self, buf: np.ndarray, offset: int, buf_index: int = -1) -> int:
        return self._one(OP_WRITE, buf, offset, buf_index)

    def fsync(self) -> None:
        ios = make_ios(1)
        ios["op"] = OP_FSYNC
        self.run(ios)
        raise_for_errno(int(ios["res"][0]), "fsync")

    def _one(self, op: int, buf: np.ndarray, offset: int, buf_index: int) -> int:
        ios = make_ios(1)
        ios["op"] = op
        ios["addr"] = address_of(buf)
        ios["len"] = buf.nbytes
        ios["offset"] = offset
        ios["buf_index"] = buf_index
        self.run(ios)
        what = "read" if op == OP_READ else "write"
        return raise_for_errno(int(ios["res"][0]), f"{what} of {buf.nbytes} B at {offset}")
