"""Data in and out of the device's memory: registered buffers (Device.alloc), pooled
staging buffers, and shares of a queue pair's bounce buffer; a mixin of hostlib.Device.

Data that is not in a registered buffer goes through registered memory: a share of the
queue pair's bounce buffer, or, for a KV value when the bounce has no room (or is too
small), a pooled staging buffer, so that commands in flight never wait for each other's
shares.  Block I/O waits for the bounce instead: it is GDS's compat mode, where the daemon
copies too (buffers registered as bounces)."""

from __future__ import annotations

import fcntl
import mmap
import os
from typing import TYPE_CHECKING

import numpy as np

from hostlib.errors import ConnectError
from ssdemu_wire import _ring

ffi, lib = _ring.ffi, _ring.lib


def copy_bytes(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src, at memory speed wherever the two lie when both are contiguous and of
    one size in bytes (c/wire/sde_copy.h: memcpy ran 12x slower from a page-aligned buffer
    into a numpy array starting 16 bytes into its page, on the EPYC this was measured on)."""
    if (dst.nbytes < 4096 or dst.nbytes != src.nbytes or not dst.flags.c_contiguous
            or not src.flags.c_contiguous):
        dst[...] = src
    else:
        lib.sde_copy(ffi.from_buffer(dst), ffi.from_buffer(src), dst.nbytes)


def _copy_at(dst: int, src: int, n: int) -> None:
    """copy_bytes between two addresses (both contiguous for n bytes, held alive by the
    caller): hostlib's staging, whose buffers' addresses it keeps."""
    if n:
        lib.sde_copy_at(dst, src, n)


def _addr(a: np.ndarray) -> int:
    # cffi's view of the buffer: 0.6 us, where __array_interface__ builds a dict (1.5 us)
    # on every command's path
    return int(ffi.cast("uintptr_t", ffi.from_buffer(a)))


def _as_bytes_array(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        if data.dtype == np.uint8 and data.ndim == 1 and data.flags.c_contiguous:
            return data  # the common case, without three new views
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(data).cast("B"), np.uint8)

if TYPE_CHECKING:
    from hostlib.client import QueuePair


class Staging:
    """Device.alloc, free, staging_take / staging_give, and the staging of a command's data."""

    def _handle_of(self, arr: np.ndarray) -> int:
        a = _addr(arr)
        for base, _size, handle in self._buffers:
            if base == a:
                return handle
        raise ValueError("not a registered buffer")

    def _alloc(self, nbytes: int, bounce: bool = False) -> np.ndarray:
        size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        fd = os.memfd_create("ssdemu-buf", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED)
            reply, _ = self._request({"op": "register_buffer", "bytes": size,
                                      "bounce": bounce}, [fd])
        finally:
            os.close(fd)
        arr = np.frombuffer(mm, dtype=np.uint8, count=nbytes)
        with self._lock:
            self._buffers.append((_addr(arr), size, reply["handle"]))
            self._arrays[reply["handle"]] = arr
            self._bases[reply["handle"]] = self._buffers[-1][0]
        return arr

    def alloc(self, nbytes: int) -> np.ndarray:
        """A zero-copy buffer: a uint8 array in memory the daemon reads and writes directly
        (whole pages: a KV value in it may be read back with its last store unit, 4 KiB, whole)."""
        if nbytes <= 0:
            raise ValueError(f"buffer size must be positive, got {nbytes}")
        return self._alloc(nbytes)

    def free(self, arr: np.ndarray) -> None:
        handle, _ = self._locate(arr)
        if handle is None:
            raise ValueError("not a buffer from Device.alloc")
        self._request({"op": "unregister_buffer", "handle": handle})
        with self._lock:
            self._buffers = [b for b in self._buffers if b[2] != handle]
            self._arrays.pop(handle, None)
            self._bases.pop(handle, None)

    STAGING_KEEP = 256 << 20  # bytes of staging buffers kept for reuse

    STAGING_MIN = 64 << 10  # the smallest staging buffer: sizes are powers of two from it

    SMALL_GET = 64 << 10  # a kv_get without `out` reads up to this much at first

    def staging_take(self, nbytes: int) -> np.ndarray:
        """A registered buffer of nbytes for one command's value (a view of a pooled one,
        a power of two: sizes repeat); give it back with staging_give once the command is
        done.  What KV commands use for values that do not fit the bounce buffer's free
        room, and what a client that copies into registered memory anyway can use
        (LMCache's)."""
        return self._staging_take(nbytes)[0]

    def _staging_take(self, nbytes: int) -> tuple[np.ndarray, int]:
        """staging_take's buffer and its handle (a command's path: no search of the
        registered buffers by address, which cost a plain 64 KiB put ~1 us each time)."""
        with self._lock:
            best = -1
            for j, b in enumerate(self._staging):  # the smallest that fits
                if b.nbytes >= nbytes and (best < 0 or b.nbytes < self._staging[best].nbytes):
                    best = j
            if best >= 0:
                buf = self._staging.pop(best)
                return buf[:nbytes], self._staging_handles[id(buf)]
        # registered as a bounce: the daemon counts what moves through it as copied (the
        # client's copy, GDS compat mode) and block I/O through it takes compat's path
        buf = self._alloc(max(self.STAGING_MIN, 1 << (nbytes - 1).bit_length()), bounce=True)
        handle, _ = self._locate(buf)
        with self._lock:
            self._staging_handles[id(buf)] = handle
        return buf[:nbytes], handle

    def staging_give(self, view: np.ndarray) -> None:
        base = getattr(view, "base", None)
        handle = self._staging_handles.get(id(base)) if base is not None else None
        if handle is None or self._arrays.get(handle) is not base:  # not staging_take's view
            handle, _ = self._locate(view)
        if handle is not None:
            self._staging_give(handle)

    def _staging_give(self, handle: int) -> None:
        with self._lock:
            buf = self._arrays.get(handle)
            if buf is None or self._staging_handles.get(id(buf)) != handle:
                return  # not a staging buffer (Device.alloc's stay the caller's)
            self._staging.append(buf)
            keep = sum(b.nbytes for b in self._staging)
            extra = []
            while keep > self.STAGING_KEEP and len(self._staging) > 1:
                b = self._staging.pop(0)  # the oldest
                keep -= b.nbytes
                extra.append(b)
        for b in extra:
            try:
                self.free(b)
                with self._lock:
                    self._staging_handles.pop(id(b), None)
            except ConnectError:  # commands in flight: keep it for now
                with self._lock:
                    self._staging.append(b)

    def _locate(self, arr) -> tuple[int | None, int]:
        """(handle, offset) of an array inside a registered buffer, or (None, 0)."""
        if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
            return None, 0
        return self._find(_addr(arr), arr.nbytes)

    def _find(self, a: int, nbytes: int) -> tuple[int | None, int]:
        """_locate's answer for nbytes at address a."""
        # no lock: the list only grows in place (an append: atomic) or is replaced whole (a
        # free), so this sees the table as it was or as it is, as it would under the lock
        for base, size, handle in self._buffers:
            if base <= a and a + nbytes <= base + size and handle not in self._bounce_handles:
                return handle, a - base
        return None, 0

    # Data that is not in a registered buffer goes through registered memory: a share of
    # the queue pair's bounce buffer, or, for a KV value when the bounce has no room (or is
    # too small), a pooled staging buffer, so that commands in flight never wait for each
    # other's shares.  Block I/O waits for the bounce instead: it is GDS's compat mode,
    # where the daemon copies too (buffers registered as bounces).
    def _stage(self, nbytes: int, qp: QueuePair, kv: bool):
        """(fields, view, bounced, the staging buffer's handle to give back, or None)."""
        fields, at, bounced, tmp = self._stage_at(nbytes, qp, kv)
        view = (qp.bounce[at - qp.bounce_addr:at - qp.bounce_addr + nbytes] if bounced
                else self._arrays[tmp][:nbytes])
        return fields, view, bounced, tmp

    def _stage_at(self, nbytes: int, qp: QueuePair, kv: bool):
        """_stage with the share's address instead of a view of it (a command's path: the
        copy goes by address)."""
        off = qp._bounce_try_at(nbytes) if kv or nbytes > qp.bounce_bytes else None
        if off is None and not (kv or nbytes > qp.bounce_bytes):
            off = qp.bounce_take(nbytes)[0]
        if off is None:
            try:
                _view, handle = self._staging_take(nbytes)
                return ({"buf": handle, "buf_offset": 0, "length": nbytes},
                        self._bases[handle], False, handle)
            except ConnectError:  # the uid's buffer quota: wait for the bounce if it can
                if nbytes > qp.bounce_bytes:
                    raise
                off = qp.bounce_take(nbytes)[0]
        return ({"buf": qp.bounce_handle, "buf_offset": off, "length": nbytes},
                qp.bounce_addr + off, True, None)

    def _staged_in(self, data, qp: QueuePair, kv: bool = False):
        """(fields, bounced, release) for data going to the device: its own buffer when
        registered, else a copy in registered memory (release: a staging buffer's return,
        for the Future to run at completion)."""
        arr = data if isinstance(data, np.ndarray) else _as_bytes_array(data)
        if not arr.flags.c_contiguous:
            arr = _as_bytes_array(arr)  # a contiguous copy: never registered memory
        a, n = _addr(arr), arr.nbytes
        handle, off = self._find(a, n)
        if handle is not None:
            return {"buf": handle, "buf_offset": off, "length": n}, False, None
        fields, at, bounced, tmp = self._stage_at(n, qp, kv)
        _copy_at(at, a, n)
        return fields, bounced, (None if tmp is None else (lambda: self._staging_give(tmp)))

    def _staged_out(self, out: np.ndarray, qp: QueuePair, kv: bool = False):
        """(fields, bounced, copy-back, release) for a buffer the device fills."""
        flags = out.flags  # (a new flags object at each look)
        if not flags.writeable:  # the copy (or the device) would write into it anyway
            raise ValueError("out is read-only: the device fills a writable array")
        if not flags.c_contiguous:  # filled through a contiguous one
            whole = np.empty(out.shape, out.dtype)
            fields, bounced, copy, release = self._staged_out(whole, qp, kv)

            def copy_strided(n):
                n = copy(n)
                out[...] = whole
                return n

            return fields, bounced, copy_strided, release
        a, nbytes = _addr(out), out.nbytes
        handle, off = self._find(a, nbytes)
        if handle is not None:
            return {"buf": handle, "buf_offset": off, "length": nbytes}, False, None, None
        fields, at, bounced, tmp = self._stage_at(nbytes, qp, kv)

        def copy_back(n, out=out):  # out held: its address is all the copy has of it
            n = min(int(n), nbytes)
            _copy_at(a, at, n)
            return n

        return (fields, bounced, copy_back,
                None if tmp is None else (lambda: self._staging_give(tmp)))
