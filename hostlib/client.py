"""The client library: connect to a running `ssdemu serve`, get queue pairs and buffers,
issue commands.

Buffers that hostlib allocates (`Device.alloc`) are memfds shared with the daemon and
registered there as fixed buffers: a read, a write or a KV value moves between them and the
media with no copy.  Any other numpy array or bytes object goes through its queue pair's
bounce buffer (as GDS compat mode): hostlib copies into or out of it, counted by the daemon.

Threads: one thread per queue pair (`Device.queue_pair()`; every call takes `qp=`).  Each
queue pair has its own bounce buffer and command ids; control requests (alloc, free, new
queue pairs) are serialised by the Device.  Every queue command has an `_async` form
returning a Future, its one definition, from which the blocking call and hostlib.aio's
awaited one are made (hostlib/commands.py); `with dev.batch(qp):` publishes the commands
issued inside it in one ring update (as cuFileBatchIOSubmit).

This module is the connection: the queue pairs, futures, submission and reaping; the
command families are mixins of Device, each a module: staging.py (registered, staging and
bounce memory), blockio.py, kv.py (KV and the firmware's KV commands), retrieval.py,
admin.py.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import threading
import time

import numpy as np

from hostlib.admin import AdminCommands
from hostlib.blockio import BlockCommands
from hostlib.commands import command, derive_blocking
from hostlib.errors import (
    ConnectError,
    DeviceGoneError,
    raise_for_status,
)
from hostlib.kv import MAX_KEY, KVCommands, _key_bytes, _key_fields  # noqa: F401 (re-exported)
from hostlib.retrieval import RetrievalCommands
from hostlib.staging import _addr, _as_bytes_array, _copy_at, copy_bytes  # noqa: F401
from ssdemu_wire import _ring, control
from ssdemu_wire import owner_key as owner_key_module
from ssdemu_wire.layout import (
    OPCODES,
    PROTOCOL_VERSION,
    RING_HDR_DTYPE,
)

ffi, lib = _ring.ffi, _ring.lib

BOUNCE_BYTES = 4 << 20  # per queue pair: values that are not in a registered buffer
# the completion ring's indexes, as words of the ring header (QueuePair.poll looks at them)
_CQ_TAIL = RING_HDR_DTYPE.fields["cq_tail"][1] // 4
_CQ_HEAD = RING_HDR_DTYPE.fields["cq_head"][1] // 4
DEFAULT_ENTRIES = 256
SPIN_NS = 50_000
GONE = -1  # a future's status when the daemon shut down before completing it


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




@derive_blocking
class Device(BlockCommands, KVCommands, RetrievalCommands, AdminCommands):
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

    @command()
    def nop_async(self, qp: QueuePair | None = None) -> Future:
        return self.submit(OPCODES["NOP"], "nop", qp=qp)

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
