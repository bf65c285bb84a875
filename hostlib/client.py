"""The client library: connect to a running `ssdemu serve`, get queue pairs and buffers,
issue commands.

Buffers that hostlib allocates (`Device.alloc`) are memfds shared with the daemon and
registered there as fixed buffers: a read, a write or a KV value moves between them and the
media with no copy.  Any other numpy array or bytes object goes through its queue pair's
bounce buffer (as GDS compat mode): hostlib copies into or out of it, counted by the daemon.

Threads: one thread per queue pair (`Device.queue_pair()`; every call takes `qp=`).  Each
queue pair has its own bounce buffer and command ids; control requests (alloc, free, new
queue pairs) are serialised by the Device.  Every KV and compute call has an `_async` form
returning a Future; `with dev.batch(qp):` publishes the commands issued inside it in one
ring update (as cuFileBatchIOSubmit).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import socket
import threading
import time

import numpy as np

from hostlib.errors import (
    CapacityError,
    ConnectError,
    DeviceGoneError,
    InvalidKeySizeError,
    InvalidValueSizeError,
    KeyNotFoundError,
    raise_for_status,
)
from ssdemu_wire import _ring, control
from ssdemu_wire import owner_key as owner_key_module
from ssdemu_wire.layout import (
    KV_DELETE_FORCE,
    NS_ALL_OWNERS,
    NS_QUOTA,
    NS_SHARED,
    OPCODES,
    PROTOCOL_VERSION,
    RING_HDR_DTYPE,
    STATUS,
)

ffi, lib = _ring.ffi, _ring.lib

BOUNCE_BYTES = 4 << 20  # per queue pair: values that are not in a registered buffer
MAX_KEY = 16
# the completion ring's indexes, as words of the ring header (QueuePair.poll looks at them)
_CQ_TAIL = RING_HDR_DTYPE.fields["cq_tail"][1] // 4
_CQ_HEAD = RING_HDR_DTYPE.fields["cq_head"][1] // 4
DEFAULT_ENTRIES = 256
SPIN_NS = 50_000
GONE = -1  # a future's status when the daemon shut down before completing it


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


class Future:
    """One command in flight (as kvikio's IOFuture): `done()` polls, `result()` waits."""

    __slots__ = ("qp", "cid", "_what", "status", "value", "finished", "_after", "device_ns",
                 "bounce", "_out", "release")

    def __init__(self, qp: QueuePair, cid: int, what, after=None, bounce: bool = False):
        # what: the command, for messages: a string, or (a format, its arguments), formatted
        # only when a message needs it (an f-string per command cost 0.3 us)
        self.qp, self.cid, self._what, self._after = qp, cid, what, after
        self.finished = False
        self.status = None
        self.value = None
        self.device_ns = 0
        self.bounce = bounce  # holds a share of its queue pair's bounce buffer
        self._out = None
        self.release = None  # called at completion whatever the status (temporary buffers)

    @property
    def what(self) -> str:
        w = self._what
        return w if isinstance(w, str) else w[0].format(*w[1:])

    def _complete(self, status: int, result: int, device_ns: int = 0) -> None:
        self.status, self.value = status, result
        self.device_ns = device_ns  # the CQE's: modelled compute time, or measured service
        try:
            if self.status == 0 and self._after is not None:
                # copy out of the bounce buffer now, before its share is reused
                self._out = self._after(result)
                self._after = None
            if self.bounce:
                self.qp._bounce_release()
                self.bounce = False
        finally:
            # only now: a thread waiting in result() on another core returns at once, and
            # must find the bytes copied out (it read a half-copied value before)
            self.finished = True
        if self.release is not None:
            self.release()
            self.release = None

    def done(self) -> bool:
        if not self.finished:
            self.qp.poll()
        return self.finished

    def result(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            seen = self.qp.reaped  # before looking: a completion after it wakes the wait
            if self.finished:
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"{self.what}: no completion within {timeout} s")
            self.qp.wait(left, seen)
        if self.status == GONE:
            raise DeviceGoneError(f"{self.what}: the device shut down before completing it")
        if self.status:
            raise_for_status(self.status, self.what, self.value or 0)
        self.qp.last_device_ns = self.device_ns
        return self.value if self._out is None else self._out


class _PerThread(threading.local):
    batch: list | None = None  # a class default: no exception to find it unset


class QueuePair:
    """A submission and a completion ring shared with the daemon.  Threads may share one:
    its ring, command ids, pending table and bounce arena change under one lock (never held
    while blocked or in a completion's callbacks), and a batch (Device.batch) is its own
    thread's.  A queue pair per thread
    is still the fast way: the threads then never wait for each other."""

    def __init__(self, qid: int, nbytes: int, entries: int, fds: list[int],
                 hangup_fd: int = -1):
        mem_fd, self.doorbell_fd, self.completion_fd = fds
        self.hangup_fd = hangup_fd  # the control socket: the daemon's death shows there
        # a thread asleep on the ring is kicked here by the waiter that reaped for it: an
        # event loop watching completion_fd (hostlib.aio) would take a kick sent there
        self.kick_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self.qid, self.entries = qid, entries
        self.mm = mmap.mmap(mem_fd, nbytes, mmap.MAP_SHARED)
        os.close(mem_fd)
        self.mem = ffi.cast("void *", ffi.from_buffer(self.mm))
        if lib.sde_qp_check(self.mem, nbytes) < 0:
            raise ConnectError("the daemon handed over a malformed queue pair")
        # the ring header's words, for poll's look at the completion indexes (0.1 us, where
        # the lock and sde_cq_reap took 0.7-1 us to find nothing)
        self._idx = memoryview(self.mm)[:RING_HDR_DTYPE.itemsize].cast("I")
        self._free_cids = list(range(entries - 1, -1, -1))
        self.pending: dict[int, Future] = {}
        self._cqes = ffi.new("sde_cqe[]", entries)
        self._kicked = ffi.new("int *")
        self.kicks = 0
        self.last_device_ns = 0  # of the last command whose result() returned
        self.bounce: np.ndarray | None = None  # set by Device: this queue pair's own
        self.bounce_handle = 0
        self.bounce_addr = 0  # its address and size (a share's address is bounce_addr + offset)
        self.bounce_bytes = 0
        self._bounce_used = 0  # a bump arena: reset when no command holds a share
        self._bounce_users = 0
        # the ring, command ids, pending table and bounce arena; never held while blocked,
        # nor while a completion's callbacks run (they take it again)
        self.lock = threading.Lock()
        self._local = _PerThread()  # each thread's batch (Device.batch)
        self.batching = 0  # threads in a batch now: none, and no command looks for its own
        # the wait protocol (wait): one thread at a time sleeps on the ring (the one holding
        # _ring); the others queue on _ring for it to come back; whoever reaps while another
        # thread sleeps there kicks the completion eventfd, so that no completion is waited
        # for after it was reaped
        self._ring = threading.Lock()
        self._sleeper: int | None = None  # the thread asleep on the ring
        self.reaped = 0  # completions settled so far (by any thread): see wait

    @property
    def _batch(self) -> list | None:
        """This thread's commands held back by Device.batch (None: not in a batch)."""
        return self._local.batch

    @_batch.setter
    def _batch(self, value: list | None) -> None:
        self._local.batch = value

    def _bounce_claim(self, size: int) -> int | None:
        """The offset of a share of `size` bytes (whole pages), or None when it has no room."""
        with self.lock:
            used = self._bounce_used
            if used + size > self.bounce_bytes and not self._bounce_users:
                used = 0  # every share is back: the arena starts over
            if used + size <= self.bounce_bytes:
                self._bounce_used = used + size
                self._bounce_users += 1
                return used
        return None

    def _bounce_try_at(self, nbytes: int) -> int | None:
        """bounce_try's offset alone (a command's path: no view made)."""
        size = -(-max(nbytes, 1) // 4096) * 4096
        return self._bounce_claim(size) if size <= self.bounce_bytes else None

    def bounce_try(self, nbytes: int) -> tuple[int, np.ndarray] | None:
        """A share of the bounce buffer, (offset, view), or None when it has no room now."""
        off = self._bounce_try_at(nbytes)
        return None if off is None else (off, self.bounce[off:off + nbytes])

    def bounce_take(self, nbytes: int) -> tuple[int, np.ndarray]:
        """A share of the bounce buffer for one command: (offset, view).  Waits for the
        commands holding shares when it is full."""
        size = -(-max(nbytes, 1) // 4096) * 4096
        if size > self.bounce.nbytes:
            raise ValueError(f"{nbytes} bytes do not fit the {self.bounce.nbytes}-byte bounce "
                             "buffer: use Device.alloc")
        while True:
            seen = self.reaped
            off = self._bounce_claim(size)
            if off is not None:
                return off, self.bounce[off:off + nbytes]
            if self._batch:
                raise ValueError("a batch outgrew its queue pair's bounce buffer: use "
                                 "Device.alloc buffers for its values")
            self.wait(None, seen)  # for the commands holding shares (not under the lock)

    def _bounce_release(self) -> None:
        with self.lock:
            self._bounce_users -= 1
            if not self._bounce_users:
                self._bounce_used = 0

    def submit(self, sqes, futures: list[Future]) -> int:
        """Publish commands (a cffi sde_sqe array, cids already set); returns how many the
        ring took."""
        # acquire/release rather than `with`: 0.2 us less a lock on every command's path
        self.lock.acquire()
        try:
            # pending first: another thread's poll may reap the completion at once
            for f in futures:
                self.pending[f.cid] = f
            n = lib.sde_sq_submit(self.mem, sqes, len(futures), self.doorbell_fd,
                                  self._kicked)
            if n < 0:
                raise DeviceGoneError(f"doorbell failed: {os.strerror(-n)}")
            if n < len(futures):  # the ring took fewer: the rest are not in flight
                for f in futures[n:]:
                    del self.pending[f.cid]
            self.kicks += self._kicked[0]
        finally:
            self.lock.release()
        return n

    def new_cid(self) -> int:
        while True:
            seen = self.reaped
            try:
                return self._free_cids.pop()  # one bytecode: atomic under the GIL
            except IndexError:
                pass
            if not self.poll():
                self.wait(None, seen)  # a full queue is back-pressure: wait for completions

    def poll(self) -> int:
        idx = self._idx
        if idx[_CQ_TAIL] == idx[_CQ_HEAD]:
            # nothing posted (as far as this read shows): no lock, no call into C.  A tail
            # read stale here is a completion left for the next look, never lost: every
            # caller that waits goes on to sde_cq_wait, which reads the ring with acquire
            return 0
        self.lock.acquire()
        try:
            n = lib.sde_cq_reap(self.mem, self._cqes, self.entries)
            if not n:
                return 0
            done = []
            for i in range(n):
                c = self._cqes[i]
                f = self.pending.pop(c.cid, None)
                if f is not None:
                    done.append((f, c.status, c.result, c.device_time_ns))
                    self._free_cids.append(f.cid)
        finally:
            self.lock.release()
        for f, status, result, device_ns in done:  # callbacks, outside the lock
            f._complete(status, result, device_ns)
        self._reaped_more(n)
        return n

    def _reaped_more(self, n: int) -> None:
        """Count completions settled (after their futures are): a waiter that read the
        count before looking at what it waits for sees it change, or is kicked awake."""
        self.lock.acquire()
        self.reaped += n  # (cannot raise)
        self.lock.release()
        sleeper = self._sleeper
        if sleeper is not None and sleeper != threading.get_ident():
            # the thread asleep on the ring may be waiting for what this settled: wake it
            os.eventfd_write(self.kick_fd, 1)

    def wait(self, timeout: float | None, seen: int | None = None) -> int:
        """Wait for completions (or timeout seconds); returns how many this call reaped, 0
        when another thread reaped them or on timeout: callers look at what they wait for
        and call again.  seen: `reaped` as the caller read it before it last looked at
        what it waits for (a completion settled since then returns at once).  Any number
        of threads, and an event loop (hostlib.aio), may wait on one queue pair at once:
        one sleeps on the ring, the rest on it."""
        if seen is None:
            seen = self.reaped
        n = self.poll()
        if n:
            return n
        if not self._ring.acquire(False) and not self._ring.acquire(
                timeout=-1 if timeout is None else timeout):
            return self.poll()  # another thread slept on the ring all that time
        try:
            # first say who sleeps, then look: a reaper first counts, then looks who sleeps
            self._sleeper = threading.get_ident()
            if self.reaped != seen:
                return self.poll()  # reaped while this thread queued: the caller looks
            r = lib.sde_cq_wait(self.mem, self.completion_fd, self.hangup_fd, self.kick_fd,
                                SPIN_NS,
                                0 if timeout is None else max(1, int(timeout * 1e9)))
        finally:
            self._sleeper = None
            self._ring.release()
        if r == -107:  # ENOTCONN: the daemon marked the queue dead
            self._fail_all()
            raise DeviceGoneError("the device shut down or dropped this queue")
        if r < 0:
            raise DeviceGoneError(f"waiting for completions failed: {os.strerror(-r)}")
        return self.poll()

    def _fail_all(self) -> None:
        with self.lock:
            failed = list(self.pending.values())
            self.pending.clear()
        for f in failed:
            f._complete(GONE, 0)
        with self.lock:
            self._bounce_users = 0
            self._bounce_used = 0
        self._reaped_more(len(failed))

    def close(self) -> None:
        self.mem = None
        self._idx.release()
        try:
            self.mm.close()
        except BufferError:
            pass
        for fd in (self.doorbell_fd, self.completion_fd, self.kick_fd):
            os.close(fd)


_LOW64 = (1 << 64) - 1


def _key_bytes(key):
    """A key as a message names it (its bytes now: a bytearray may change later)."""
    return key if type(key) is bytes else bytes(key)


def _key_fields(key) -> dict:
    """The SQE fields of a key: refused here as the daemon would (never truncated)."""
    if type(key) is not bytes:
        if not isinstance(key, (bytes, bytearray, memoryview)):
            raise TypeError(f"keys are bytes, not {type(key).__name__}"
                            + (" (encode it first)" if isinstance(key, str) else ""))
        key = bytes(key)  # a memoryview's bytes, whatever its format
    n = len(key)
    if not 1 <= n <= MAX_KEY:
        raise InvalidKeySizeError(STATUS["KV_INVALID_KEY_SIZE"],
                                  f"a key of {n} bytes (keys are 1 to {MAX_KEY})")
    # bytes 0-7 little-endian in lba, 8-15 in key_hi, zero-padded: one integer's two halves
    v = int.from_bytes(key, "little")
    return {"lba": v & _LOW64, "key_hi": v >> 64, "param1": n}


def _as_bytes_array(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        if data.dtype == np.uint8 and data.ndim == 1 and data.flags.c_contiguous:
            return data  # the common case, without three new views
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(data).cast("B"), np.uint8)


class Device:
    """A connection to the emulated drive.  Commands go through one queue pair by default;
    `queue_pair()` makes more (one per thread), each with its own bounce buffer."""

    def __init__(self, sock: socket.socket, info: dict, entries: int):
        self.sock = sock
        self.info = info
        self.block = info["logical_block_bytes"]
        self.max_value = info.get("max_value_bytes", 2 << 20)
        self._lock = threading.Lock()  # control requests and the buffer table
        self._buffers: list[tuple[int, int, int]] = []  # (base address, bytes, handle)
        self._arrays: dict[int, np.ndarray] = {}
        self._bases: dict[int, int] = {}  # handle -> address (staging shares are copied by it)
        self._bounce_handles: set[int] = set()
        # registered staging buffers for values larger than a bounce buffer, kept for the
        # next one (registering is a control round trip; unregistering is refused while
        # any command of this connection is in flight, which other threads make likely)
        self._staging: list[np.ndarray] = []
        self._staging_handles: dict[int, int] = {}  # id of a staging buffer: its handle
        # On a drive with a virtual clock (serve --clock virtual) every command carries this
        # submission time (ns); an experiment advances it, e.g. to a trace's timestamps.
        self.submit_time_ns = 0
        self.qp = self.queue_pair(entries)

    # -- control plane --
    def _request(self, msg: dict, fds: list[int] = ()) -> tuple[dict, list[int]]:
        with self._lock:
            try:
                control.send(self.sock, msg, fds)
                reply, rfds = control.recv(self.sock)
            except OSError as e:
                raise DeviceGoneError(f"lost the daemon: {e}") from None
        if reply is None:
            raise DeviceGoneError("the daemon closed the connection")
        if not reply.get("ok"):
            for fd in rfds:
                os.close(fd)
            raise ConnectError(reply.get("error", "request refused"))
        return reply, rfds

    def queue_pair(self, entries: int = DEFAULT_ENTRIES,
                   bounce_bytes: int = BOUNCE_BYTES) -> QueuePair:
        """A new queue pair with its own bounce buffer: give each thread its own."""
        reply, fds = self._request({"op": "create_qp", "entries": entries})
        qp = QueuePair(reply["qid"], reply["bytes"], reply["entries"], fds,
                       self.sock.fileno())
        qp.bounce = self._alloc(bounce_bytes, bounce=True)
        qp.bounce_addr, qp.bounce_bytes = _addr(qp.bounce), qp.bounce.nbytes
        with self._lock:
            qp.bounce_handle = self._handle_of(qp.bounce)
            self._bounce_handles.add(qp.bounce_handle)
        return qp

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

    # -- commands --
    def submit(self, opcode: int, what: str, after=None, qp: QueuePair | None = None,
               bounce: bool = False, release=None, **fields) -> Future:
        """One command (fields as in sde_sqe); returns its Future.  after(result), if given,
        runs at completion and gives the Future's result; release() runs at completion
        whatever its status (a staging buffer goes back: only then is the device done
        with it)."""
        qp = qp or self.qp
        cid = qp.new_cid()
        fields["opcode"] = opcode
        fields["cid"] = cid
        fields.setdefault("submit_time_ns", self.submit_time_ns)
        f = Future(qp, cid, what, after, bounce)
        f.release = release
        if qp.batching and qp._batch is not None:
            qp._batch.append((fields, f))
            return f
        sqe = ffi.new("sde_sqe *", fields)
        while qp.submit(sqe, [f]) == 0:  # SQ full: back-pressure
            qp.wait(None)
        return f

    @contextlib.contextmanager
    def batch(self, qp: QueuePair | None = None):
        """Commands issued on qp inside the block are published together at its end, in one
        ring update and at most one doorbell."""
        qp = qp or self.qp
        if qp._batch is not None:
            raise RuntimeError("batches do not nest")
        qp._batch = []
        with qp.lock:
            qp.batching += 1
        try:
            yield qp
        finally:
            with qp.lock:
                qp.batching -= 1
            held, qp._batch = qp._batch, None
            if held:
                sqes = ffi.new("sde_sqe[]", [fields for fields, _ in held])
                futures = [f for _, f in held]
                done = 0
                while done < len(futures):
                    done += qp.submit(sqes + done, futures[done:])
                    if done < len(futures):
                        qp.wait(None)

    def submit_batch(self, commands: list[dict], qp: QueuePair | None = None) -> list[Future]:
        """Many commands in one ring update (as cuFileBatchIOSubmit): each a dict of sde_sqe
        fields with an `opcode`.  Returns their Futures, in order."""
        qp = qp or self.qp
        if len(commands) > qp.entries:
            raise ValueError(f"a batch holds at most {qp.entries} commands (the queue size)")
        with self.batch(qp):
            return [self.submit(c.get("opcode", OPCODES["NOP"]),
                                f"batch command {c.get('opcode', 0)}", qp=qp,
                                **{k: v for k, v in c.items() if k != "opcode"})
                    for c in commands]

    def reap(self, futures: list[Future], min_done: int = 1,
             timeout: float | None = None, qp: QueuePair | None = None) -> list[Future]:
        """Wait until at least min_done of these futures are done (as cuFileBatchIOGetStatus);
        returns the done ones.  The futures' queue pairs are all watched."""
        deadline = None if timeout is None else time.monotonic() + timeout
        qps = {id(f.qp): f.qp for f in futures} or {id(qp or self.qp): qp or self.qp}
        while True:
            seen = {k: q.reaped for k, q in qps.items()}  # before looking (QueuePair.wait)
            for q in qps.values():
                q.poll()
            done = [f for f in futures if f.finished]
            if len(done) >= min(min_done, len(futures)):
                return done
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return done
            waiting = next((f.qp for f in futures if not f.finished), self.qp)
            waiting.wait(left if len(qps) == 1 else min(left or 0.001, 0.001),
                         seen.get(id(waiting)))

    def nop(self, qp: QueuePair | None = None) -> None:
        self.submit(OPCODES["NOP"], "nop", qp=qp).result()

    # -- data in and out: registered in place, or a share of the queue pair's bounce --
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

    # -- block I/O --
    def read_async(self, nsid: int, lba: int, out: np.ndarray,
                   qp: QueuePair | None = None) -> Future:
        qp = qp or self.qp
        fields, bounced, copy, release = self._staged_out(out, qp)
        return self.submit(OPCODES["READ"], ("read ns {} lba {}", nsid, lba), qp=qp,
                           bounce=bounced, after=(lambda _: copy(out.nbytes)) if copy else None,
                           release=release, nsid=nsid, lba=lba, **fields)

    def write_async(self, nsid: int, lba: int, data: np.ndarray,
                    qp: QueuePair | None = None) -> Future:
        qp = qp or self.qp
        fields, bounced, release = self._staged_in(data, qp)
        return self.submit(OPCODES["WRITE"], ("write ns {} lba {}", nsid, lba), qp=qp,
                           bounce=bounced, release=release, nsid=nsid, lba=lba, **fields)

    def read(self, nsid: int, lba: int, out: np.ndarray, qp: QueuePair | None = None) -> int:
        return self.read_async(nsid, lba, out, qp).result()

    def write(self, nsid: int, lba: int, data: np.ndarray, qp: QueuePair | None = None) -> int:
        return self.write_async(nsid, lba, data, qp).result()

    def flush(self, nsid: int = 0, qp: QueuePair | None = None) -> None:
        self.submit(OPCODES["FLUSH"], f"flush ns {nsid}", qp=qp, nsid=nsid).result()

    def write_zeroes(self, nsid: int, lba: int, nbytes: int) -> None:
        self.submit(OPCODES["WRITE_ZEROES"], "write zeroes", nsid=nsid, lba=lba,
                    length=nbytes).result()

    def deallocate(self, nsid: int, lba: int, nbytes: int) -> None:
        self.submit(OPCODES["DEALLOCATE"], "deallocate", nsid=nsid, lba=lba,
                    length=nbytes).result()

    # -- KV (the NVMe KV command set) --
    _key_fields = staticmethod(_key_fields)

    def kv_put_async(self, key: bytes, value, only_if_exists: bool = False,
                     only_if_not_exists: bool = False, qp: QueuePair | None = None, *,
                     nsid: int = 0) -> Future:
        """Store a value (bytes, or a uint8 array: zero copy when it lies in a Device.alloc
        buffer); the Future's result is True if the key existed."""
        qp = qp or self.qp
        kf = _key_fields(key)
        mode = 1 if only_if_exists else 2 if only_if_not_exists else 0
        fields, bounced, release = self._staged_in(value, qp, kv=True)
        return self.submit(OPCODES["KV_STORE"], ("kv store {!r}", _key_bytes(key)), qp=qp,
                           bounce=bounced, after=bool, release=release, param0=mode,
                           nsid=nsid, **fields, **kf)

    def kv_put(self, key: bytes, value, only_if_exists: bool = False,
               only_if_not_exists: bool = False, qp: QueuePair | None = None, *,
               nsid: int = 0) -> bool:
        """Store a value (1 byte to identify's max_value_bytes); True if the key existed."""
        return self.kv_put_async(key, value, only_if_exists, only_if_not_exists, qp,
                                 nsid=nsid).result()

    def kv_get_async(self, key: bytes, out: np.ndarray | None = None,
                     qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        """Retrieve into `out` (any uint8-viewable array; zero copy in a Device.alloc buffer):
        the result is the value's length.  Without `out`, the result is the value (bytes)
        when it is at most SMALL_GET bytes (kv_get and AsyncDevice.kv_get read a larger one
        again, sized by the error).  A buffer too small raises InvalidValueSizeError
        carrying `value_length`."""
        qp = qp or self.qp
        kf = _key_fields(key)
        what = ("kv retrieve {!r}", _key_bytes(key))
        if out is None:
            # a small share (the bounce's or a staging buffer's), never the whole bounce: a
            # get of a name record must not hold every other command's staging up
            fields, share, bounced, tmp = self._stage(min(self.SMALL_GET, qp.bounce.nbytes),
                                                      qp, kv=True)
            return self.submit(OPCODES["KV_RETRIEVE"], what, qp=qp, bounce=bounced,
                               after=lambda n: bytes(share[:n]),
                               release=None if tmp is None else (lambda: self._staging_give(tmp)),
                               nsid=nsid, **fields, **kf)
        fields, bounced, copy, release = self._staged_out(out, qp, kv=True)
        return self.submit(OPCODES["KV_RETRIEVE"], what, qp=qp, bounce=bounced, after=copy,
                           release=release, nsid=nsid, **fields, **kf)

    def kv_get(self, key: bytes, out: np.ndarray | None = None,
               qp: QueuePair | None = None, *, nsid: int = 0) -> bytes | int:
        """The value (bytes), or, with `out`, its length."""
        try:
            return self.kv_get_async(key, out, qp, nsid=nsid).result()
        except InvalidValueSizeError as e:
            if out is not None or not e.value_length:
                raise
            tmp = np.empty(e.value_length, np.uint8)  # staged as any array
            n = self.kv_get_async(key, tmp, qp, nsid=nsid).result()
            return tmp[:n].tobytes()

    def kv_delete_async(self, key: bytes, qp: QueuePair | None = None, *, nsid: int = 0,
                        force: bool = False) -> Future:
        """force: delete even though other clients pinned the key (their pins go); the
        namespace's owner's or an admin's (AccessDeniedError otherwise; the default key
        space 0 is an admin's).  Without it a pinned key raises KeyPinnedError."""
        return self.submit(OPCODES["KV_DELETE"], ("kv delete {!r}", _key_bytes(key)), qp=qp,
                           nsid=nsid, param0=KV_DELETE_FORCE if force else 0,
                           **_key_fields(key))

    def kv_delete(self, key: bytes, qp: QueuePair | None = None, *, nsid: int = 0,
                  force: bool = False) -> None:
        self.kv_delete_async(key, qp, nsid=nsid, force=force).result()

    def kv_exists_async(self, key: bytes, qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        """The result is 0 when the key exists; KeyNotFoundError otherwise."""
        return self.submit(OPCODES["KV_EXIST"], ("kv exist {!r}", _key_bytes(key)), qp=qp,
                           nsid=nsid, **_key_fields(key))

    def kv_exists(self, key: bytes, qp: QueuePair | None = None, *, nsid: int = 0) -> bool:
        try:
            self.kv_exists_async(key, qp, nsid=nsid).result()
            return True
        except KeyNotFoundError:
            return False

    def kv_list(self, start: bytes = b"", max_keys: int = 1024,
                qp: QueuePair | None = None, *, nsid: int = 0) -> list[bytes]:
        qp = qp or self.qp
        fields = _key_fields(start) if start else {}
        nbytes = min(qp.bounce.nbytes, 17 * max_keys)
        boff, share = qp.bounce_take(nbytes)

        def keys(n):
            raw = bytes(share[:17 * n])
            return [raw[i * 17 + 1:i * 17 + 1 + raw[i * 17]] for i in range(n)]

        return self.submit(OPCODES["KV_LIST"], "kv list", qp=qp, bounce=True, after=keys,
                           buf=qp.bounce_handle, buf_offset=boff, length=nbytes,
                           nsid=nsid, **fields).result()

    # -- compute: the drive's firmware --
    def kv_put_quantized_async(self, key: bytes, block: np.ndarray, dtype: str, scheme: str,
                               qp: QueuePair | None = None, *, nsid: int = 0,
                               layout: str = "t2l", summary_page: int | bool = 0) -> Future:
        """Store a KV block (tokens, 2, layers, kv_heads, head_dim; fp16/bf16 as uint16 bits)
        quantized in the drive; the result is the compressed size.  kv_get returns the
        compressed block, kv_get_dequantized the block.  A block inside a Device.alloc
        buffer is read by the drive where it lies (no copy, any size up to the drive's
        largest value); the 64-byte request then travels in the queue pair's bounce.
        layout "2lt": the block is (2, layers, tokens, kv_heads, head_dim), LMCache's
        KV_2LTD, which the drive takes as it is and kv_get_dequantized gives back in that
        order (every scheme).  summary_page: the drive also keeps the block's page summaries
        (per page of that many tokens, per layer and KV head, the keys' per-channel min and
        max, after the compressed body), so that TOPK_PAGES with the same page_tokens scores
        the block from them rather than reading and summarizing it; True: the page the
        drive's profile gives (identify's page_tokens); 0: none."""
        from ssdemu_wire.codes import dtype_code
        from ssdemu_wire.layout import QUANT_REQUEST_BYTES, pack_quant_request

        qp = qp or self.qp
        kf = _key_fields(key)
        what = f"kv store quantized {key!r}"
        if layout == "2lt":  # LMCache's KV_2LTD: integer schemes take it as it is
            _two, layers, t, heads, dim = block.shape
        elif layout == "t2l":
            t, _two, layers, heads, dim = block.shape
        else:
            raise ValueError(f"layout is 't2l' (tokens, 2, layers, heads, head_dim) or '2lt' "
                             f"(2, layers, tokens, heads, head_dim), got {layout!r}")
        if summary_page is True:  # the drive's (its hello carries identify)
            summary_page = int(self.info.get("page_tokens", 16))
        if not 0 <= summary_page <= 4096:
            raise ValueError(f"summary_page is 0 (none) to 4096 tokens, got {summary_page}")
        request = np.frombuffer(pack_quant_request(dtype_code(dtype), scheme, t, layers, heads,
                                                   dim, layout, summary_page), np.uint8)
        handle, off = self._locate(block)
        if handle is None and QUANT_REQUEST_BYTES + block.nbytes <= qp.bounce.nbytes:
            # small and not registered: request and block together in one bounce share
            boff, share = qp.bounce_take(QUANT_REQUEST_BYTES + block.nbytes)
            share[:QUANT_REQUEST_BYTES] = request
            copy_bytes(share[QUANT_REQUEST_BYTES:], _as_bytes_array(block))
            return self.submit(OPCODES["KV_STORE_QUANTIZED"], what, qp=qp, bounce=True,
                               buf=qp.bounce_handle, buf_offset=boff, length=share.nbytes,
                               nsid=nsid, **kf)
        tmp = None
        if handle is None:  # larger than the bounce: a registered buffer for it
            stage, tmp = self._staging_take(block.nbytes)
            copy_bytes(stage, _as_bytes_array(block))
            handle, off = tmp, 0
        roff, rshare = qp.bounce_take(QUANT_REQUEST_BYTES)
        rshare[:] = request
        return self.submit(OPCODES["KV_STORE_QUANTIZED"], what, qp=qp, bounce=True,
                           release=None if tmp is None else (lambda: self._staging_give(tmp)),
                           buf=handle, buf_offset=off, length=block.nbytes,
                           param0=(qp.bounce_handle << 40) | roff, nsid=nsid, **kf)

    def kv_put_quantized(self, key: bytes, block: np.ndarray, dtype: str, scheme: str,
                         qp: QueuePair | None = None, *, nsid: int = 0,
                         layout: str = "t2l", summary_page: int | bool = 0) -> int:
        return self.kv_put_quantized_async(key, block, dtype, scheme, qp, nsid=nsid,
                                           layout=layout, summary_page=summary_page).result()

    def kv_get_dequantized_async(self, key: bytes, out: np.ndarray,
                                 qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        """Dequantized in the drive, into `out` (the block's shape and carrier dtype); the
        result is the bytes written."""
        qp = qp or self.qp
        kf = _key_fields(key)
        fields, bounced, copy, release = self._staged_out(out, qp, kv=True)
        return self.submit(OPCODES["KV_RETRIEVE_DEQUANTIZED"],
                           f"kv retrieve dequantized {key!r}", qp=qp, bounce=bounced,
                           after=copy, release=release, nsid=nsid, **fields, **kf)

    def kv_get_dequantized(self, key: bytes, out: np.ndarray,
                           qp: QueuePair | None = None, *, nsid: int = 0) -> np.ndarray:
        self.kv_get_dequantized_async(key, out, qp, nsid=nsid).result()
        return out

    def prefix_match_async(self, keys, qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        from ssdemu_wire.codes import keys_array

        qp = qp or self.qp
        arr = keys_array(keys).view(np.uint8).reshape(-1)
        fields, bounced, release = self._staged_in(arr, qp, kv=True)
        return self.submit(OPCODES["PREFIX_MATCH"], "prefix match", qp=qp, bounce=bounced,
                           release=release, nsid=nsid, **fields)

    def prefix_match(self, keys, qp: QueuePair | None = None, *, nsid: int = 0) -> int:
        """How many leading keys of a chain (16-byte keys) the drive holds."""
        return self.prefix_match_async(keys, qp, nsid=nsid).result()

    def prefix_match_tokens_async(self, tokens, block_tokens: int, root: bytes,
                                  qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        qp = qp or self.qp
        payload = np.concatenate([np.frombuffer(root, np.uint8),
                                  np.asarray(tokens, dtype="<u4").view(np.uint8)])
        fields, bounced, release = self._staged_in(payload, qp, kv=True)
        return self.submit(OPCODES["PREFIX_MATCH_TOKENS"], "prefix match (tokens)", qp=qp,
                           bounce=bounced, release=release, param0=block_tokens, nsid=nsid,
                           **fields)

    def prefix_match_tokens(self, tokens, block_tokens: int, root: bytes,
                            qp: QueuePair | None = None, *, nsid: int = 0) -> int:
        """Like prefix_match, the drive hashing the token ids itself (hostlib.prefix_hash)."""
        return self.prefix_match_tokens_async(tokens, block_tokens, root, qp,
                                              nsid=nsid).result()

    def pin_async(self, key: bytes, qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        return self.submit(OPCODES["PIN"], "pin", qp=qp, nsid=nsid, **_key_fields(key))

    def pin(self, key: bytes, qp: QueuePair | None = None, *, nsid: int = 0) -> int:
        return self.pin_async(key, qp, nsid=nsid).result()

    def unpin_async(self, key: bytes, qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        return self.submit(OPCODES["UNPIN"], "unpin", qp=qp, nsid=nsid, **_key_fields(key))

    def unpin(self, key: bytes, qp: QueuePair | None = None, *, nsid: int = 0) -> int:
        return self.unpin_async(key, qp, nsid=nsid).result()

    # -- retrieval inside the drive (TOPK_PAGES, ATTEND: c/wire/sde_queue.h) --
    def _retrieval(self, opcode: int, what: str, payload: np.ndarray, out: np.ndarray,
                   parse, qp: QueuePair | None, nsid: int) -> Future:
        """The request and the result in one share of the bounce buffer (one command, one
        share), or in a registered buffer of their own when they do not fit it."""
        qp = qp or self.qp
        n_in = -(-payload.nbytes // 64) * 64  # the result starts 64-byte aligned
        total = n_in + out.nbytes
        tmp = None
        if total <= qp.bounce.nbytes:
            off, share = qp.bounce_take(total)
            handle, bounced = qp.bounce_handle, True
        else:
            share, tmp = self._staging_take(total)
            handle, off, bounced = tmp, 0, False
        share[:payload.nbytes] = payload
        result = share[n_in:n_in + out.nbytes]

        def after(pages):
            copy_bytes(out.reshape(-1).view(np.uint8), result)
            return parse(pages)

        release = None if tmp is None else (lambda: self._staging_give(tmp))
        return self.submit(opcode, what, qp=qp, bounce=bounced, after=after, release=release,
                           nsid=nsid,
                           buf=handle, buf_offset=off, length=payload.nbytes,
                           param0=(handle << 40) | (off + n_in), param1=out.nbytes)

    def topk_pages_async(self, keys, queries: np.ndarray, *, layer: int, layers: int,
                         kv_heads: int, k: int, dtype: str = "fp16", page_tokens: int = 16,
                         sink_pages: int = 1, recent_pages: int = 1, rerank: int = 1,
                         int8: bool = False, qp: QueuePair | None = None,
                         nsid: int = 0) -> Future:
        """The drive scores every page of the sequence stored under `keys` (its blocks, in
        order; plain blocks of `layers` x `kv_heads` x head_dim in `dtype`, or quantized ones)
        against one layer's queries (q_heads x head_dim, float32) and keeps the k best pages
        per KV head, never the sink or recent pages (the caller always has those): rerank > 1
        re-ranks rerank x k candidates (half by the bound, half by a channel-selective score)
        by their exact share of each query head's attention.  The Future's result: (page
        ids (kv_heads, k) int32, -1 past the candidates; their scores), and the pages."""
        from ssdemu_wire.codes import dtype_code
        from ssdemu_wire.layout import pack_retrieval_request

        q = np.ascontiguousarray(queries, np.float32)
        payload = pack_retrieval_request(
            dtype_code=dtype_code(dtype), layer=layer, layers=layers, kv_heads=kv_heads,
            q_heads=q.shape[0], head_dim=q.shape[1], page_tokens=page_tokens, keys=keys, k=k,
            sink_pages=sink_pages, recent_pages=recent_pages, rerank=rerank, int8=int8,
            queries=q)
        out = np.zeros(kv_heads * k * 2, np.int32)

        def parse(pages):
            ids = out[:kv_heads * k].reshape(kv_heads, k).copy()
            scores = out[kv_heads * k:].view(np.float32).reshape(kv_heads, k).copy()
            return ids, scores, int(pages)

        return self._retrieval(OPCODES["TOPK_PAGES"], "topk pages", payload, out, parse, qp,
                               nsid)

    def topk_pages(self, keys, queries: np.ndarray, **kw) -> tuple[np.ndarray, np.ndarray]:
        ids, scores, _ = self.topk_pages_async(keys, queries, **kw).result()
        return ids, scores

    def attend_async(self, keys, queries: np.ndarray, page_ids: np.ndarray, *, layer: int,
                     layers: int, dtype: str = "fp16", page_tokens: int = 16,
                     sink_pages: int = 1, recent_pages: int = 1, qp: QueuePair | None = None,
                     nsid: int = 0) -> Future:
        """Softmax attention of one layer's queries over the given pages of each KV head
        (page_ids (kv_heads, n) int32, -1: none) and the sink and recent pages, inside the
        drive: only queries, ids and outputs cross the link.  The Future's result: (outputs
        (q_heads, head_dim) float32, log-sum-exp per query head), for the host to merge with
        attention over tokens it holds (hostlib.merge_attention)."""
        from ssdemu_wire.codes import dtype_code
        from ssdemu_wire.layout import pack_retrieval_request

        q = np.ascontiguousarray(queries, np.float32)
        ids = np.ascontiguousarray(page_ids, np.int32)
        if ids.ndim != 2:
            raise ValueError("page_ids is (kv_heads, n)")
        payload = pack_retrieval_request(
            dtype_code=dtype_code(dtype), layer=layer, layers=layers, kv_heads=ids.shape[0],
            q_heads=q.shape[0], head_dim=q.shape[1], page_tokens=page_tokens, keys=keys,
            k=ids.shape[1], sink_pages=sink_pages, recent_pages=recent_pages, queries=q,
            page_ids=ids)
        qh, d = q.shape
        out = np.zeros(qh * (d + 1), np.float32)

        def parse(_pages):
            return out[:qh * d].reshape(qh, d).copy(), out[qh * d:].copy()

        return self._retrieval(OPCODES["ATTEND"], "attend", payload, out, parse, qp, nsid)

    def attend(self, keys, queries: np.ndarray, page_ids: np.ndarray,
               **kw) -> tuple[np.ndarray, np.ndarray]:
        return self.attend_async(keys, queries, page_ids, **kw).result()

    # -- admin --
    def _admin_json(self, opcode: int, what: str, **fields):
        qp = self.qp
        boff, share = qp.bounce_take(qp.bounce.nbytes)
        return self.submit(opcode, what, qp=qp, bounce=True,
                           after=lambda n: json.loads(bytes(share[:n])), buf=qp.bounce_handle,
                           buf_offset=boff, length=share.nbytes, **fields).result()

    def identify(self) -> dict:
        return self._admin_json(OPCODES["IDENTIFY"], "identify")

    def namespaces(self, all_owners: bool = False) -> list[dict]:
        """The namespaces this client may use (nsid, bytes, start, shared).  all_owners (an
        admin's request): every namespace on the drive, each with its owner's `uid` and
        whether this client may use it (`mine`)."""
        return self._admin_json(OPCODES["NS_LIST"], "namespace list",
                                param1=NS_ALL_OWNERS if all_owners else 0)

    def ns_create(self, nbytes: int = 0, shared: bool = False) -> int:
        """A new namespace: nbytes of blocks (0: for keys only; KV calls name it with
        `nsid=`).  It belongs to this client's owner (its uid, and the owner key given to
        `connect`): other owners cannot see it, unless it is created shared (then every
        client may use it, and only its creator or an admin may delete it)."""
        try:
            return self.submit(OPCODES["NS_CREATE"], "namespace create", param0=nbytes,
                               param1=NS_SHARED if shared else 0).result()
        except CapacityError as e:
            if e.result != NS_QUOTA:
                raise
            raise CapacityError(e.status, "namespace create: this uid's namespace quota "
                                "(serve --max-namespaces-per-uid, --max-namespace-bytes-per-"
                                "uid; the daemon's log has the figures)", e.result) from None

    def ns_delete(self, nsid: int, any_owner: bool = False) -> None:
        """Delete a namespace of this client's owner, or a shared one it created (another's
        shared one: AccessDeniedError).  any_owner (an admin's request): any namespace,
        whoever owns it."""
        self.submit(OPCODES["NS_DELETE"], f"namespace delete {nsid}", nsid=nsid,
                    param1=NS_ALL_OWNERS if any_owner else 0).result()

    # -- fault injection: for testing the software above the drive --
    def inject_fault(self, kind: str, *, nsid: int | None = None,
                     lba: tuple[int, int] | None = None, key: bytes | None = None,
                     count: int = 0, probability: float = 1.0,
                     latency_us: float | None = None, directions: str = "both",
                     seed: int = 0) -> int:
        """Make matching commands fail or complete late, from now on; returns the rule's id.
        kind: "read-error" / "write-error" (MEDIA_ERROR: block reads or writes, KV
        retrieves or stores) or "latency" (latency_us more; directions "read", "write" or
        "both").  nsid None: every namespace; lba (first, count): block commands touching
        that range of nsid; key: KV commands on that key (of nsid, 0 when None).  count:
        the rule ends after hitting that many commands (0: at clear_faults); probability:
        each matching command is hit with it, drawn from `seed` (the same seed, the same
        faults).  An admin (the holder of the daemon's --admin-key; without one, the
        daemon's uid and root) may name any namespace or none; any other owner only a
        namespace of its own."""
        msg = {"op": "fault", "action": "add", "kind": kind, "nsid": nsid, "count": count,
               "probability": probability, "seed": seed}
        if lba is not None:
            msg["lba"] = [int(lba[0]), int(lba[1])]
        if key is not None:
            msg["key"] = bytes(key).hex()
        if kind == "latency":
            msg["latency_us"] = latency_us
            msg["directions"] = directions
        return self._request(msg)[0]["id"]

    def clear_faults(self, rule_id: int = 0) -> int:
        """Remove one fault rule, or every one (0) this client may see; how many went."""
        return self._request({"op": "fault", "action": "clear", "id": rule_id})[0]["cleared"]

    def faults(self) -> list[dict]:
        """The fault rules in force, with how many commands each has hit: an admin sees
        every rule, another owner its own."""
        return self._request({"op": "fault", "action": "list"})[0]["rules"]

    def surprise_removal(self, seconds: float = 0) -> None:
        """Pull the drive: every client (this one too) sees the device gone at once; new
        queue pairs are refused until `seconds` pass (0: until hostlib.reinsert).  Admin
        only."""
        self._request({"op": "fault", "action": "remove", "seconds": seconds})

    def power_cut(self, seed: int = 0) -> None:
        """Cut the drive's power (a daemon started with --power-cut): every client sees it
        gone; writes no completed flush covered may be lost (seeded); it powers on again.
        Admin only."""
        self._request({"op": "fault", "action": "power-cut", "seed": seed})

    def counters_async(self, qp: QueuePair | None = None) -> Future:
        """The drive model's books at the command's turn (COUNTERS): a dict of its busy
        times (ns, summed), the latest time booked, bytes over the link and on NAND.  On the
        virtual clock it waits behind the compute commands fetched before it, so it holds
        what every command sent before it on this queue pair booked, and nothing sent
        after: sample the books without waiting for the commands to complete.  Admin only."""
        from ssdemu_wire.layout import COUNTERS_DTYPE

        qp = qp or self.qp
        out = np.zeros(1, COUNTERS_DTYPE)
        fields, bounced, copy, release = self._staged_out(out.view(np.uint8), qp, kv=True)

        def books(n):
            if copy is not None:
                copy(n)
            return {name: out[0][name].item() for name in COUNTERS_DTYPE.names
                    if name != "reserved"}

        return self.submit(OPCODES["COUNTERS"], "counters", qp=qp, bounce=bounced,
                           after=books, release=release, **fields)

    def counters(self, qp: QueuePair | None = None) -> dict:
        return self.counters_async(qp).result()

    def log(self, page: int = 1) -> dict:
        return self._admin_json(OPCODES["GET_LOG"], f"log page {page}", param0=page)

    def close(self) -> None:
        try:
            control.send(self.sock, {"op": "bye"})
        except OSError:
            pass
        self.qp.close()
        self.sock.close()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def control_request(socket_path: str, msg: dict, timeout: float = 5.0,
                    owner_key: str | bytes | None = None,
                    owner_key_file: str | None = None) -> dict:
    """One control-plane request on a connection of its own, no queue pair (what `ssdemu
    ctl fault` uses: it works while the device is removed).  The owner key as in
    `connect`."""
    hello = _hello(owner_key, owner_key_file)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(socket_path)
            control.send(sock, hello)
            reply, _ = control.recv(sock)
            if reply and reply.get("ok"):
                control.send(sock, msg)
                reply, _ = control.recv(sock)
        except OSError as e:
            raise ConnectError(f"cannot reach ssdemu at {socket_path}: {e}") from None
        if not reply or not reply.get("ok"):
            raise ConnectError((reply or {}).get("error", "the daemon closed the connection"))
        return reply
    finally:
        sock.close()


def reinsert(socket_path: str, owner_key: str | bytes | None = None,
             owner_key_file: str | None = None) -> bool:
    """End an injected surprise removal (an admin's request); whether the device was
    removed."""
    return control_request(socket_path, {"op": "fault", "action": "reinsert"},
                           owner_key=owner_key, owner_key_file=owner_key_file)["was_removed"]


def _hello(owner_key, owner_key_file) -> dict:
    hello = {"op": "hello", "version": PROTOCOL_VERSION}
    try:
        key = owner_key_module.resolve(owner_key, owner_key_file)
    except owner_key_module.OwnerKeyError as e:
        raise ConnectError(str(e)) from None
    if key is not None:
        hello["owner_key"] = key
    return hello


def connect(socket_path: str, entries: int = DEFAULT_ENTRIES, timeout: float = 5.0, *,
            owner_key: str | bytes | None = None, owner_key_file: str | None = None) -> Device:
    """Connect to a daemon.  The owner this client acts as is a secret key
    (hostlib.owner_key): `owner_key` (hex or bytes), or the key file `owner_key_file` (mode
    0600), or the file $SSDEMU_OWNER_KEY_FILE names.  What a client creates (namespaces,
    fault rules) belongs to its uid and its key together, across reconnects and restarts;
    with no key, to the uid alone.  Knowing an experiment's name gives another process
    nothing: it needs the key."""
    hello = _hello(owner_key, owner_key_file)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(timeout)
    try:
        sock.connect(socket_path)
    except OSError as e:
        sock.close()
        raise ConnectError(f"cannot reach ssdemu at {socket_path}: {e.strerror}") from None
    try:
        try:
            control.send(sock, hello)
        except BrokenPipeError:
            pass  # the daemon refused us at once: its reason is waiting to be read
        reply, _ = control.recv(sock)
    except OSError as e:
        sock.close()
        raise ConnectError(f"handshake with {socket_path} failed: {e}") from None
    if not reply or not reply.get("ok"):
        sock.close()
        raise ConnectError((reply or {}).get("error", "the daemon closed the connection"))
    sock.settimeout(None)
    return Device(sock, reply["device"], entries)
