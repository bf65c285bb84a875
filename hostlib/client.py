"""The client library: connect to a running `ssdemu serve`, get queue pairs and buffers,
issue commands.

Buffers that hostlib allocates (`Device.alloc`) are memfds shared with the daemon and
registered there as fixed buffers: a read lands in them with no copy.  Any other numpy array
goes through a bounce buffer (as GDS compat mode): hostlib copies into or out of it and the
daemon copies between it and the media, both counted.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import socket
import time

import numpy as np

from hostlib.errors import ConnectError, DeviceGoneError, raise_for_status
from ssdemu import _engine, control
from ssdemu.queue_layout import OPCODES, PROTOCOL_VERSION

ffi, lib = _engine.ffi, _engine.lib

F_ADD_SEALS = 1033
F_SEAL_SHRINK = 0x0002
F_SEAL_GROW = 0x0004
BOUNCE_BYTES = 4 << 20  # holds the largest KV value (2 MiB) and admin replies
DEFAULT_ENTRIES = 256
SPIN_NS = 50_000
GONE = -1  # a future's status when the daemon shut down before completing it


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class Future:
    """One command in flight (as kvikio's IOFuture): `done()` polls, `result()` waits."""

    __slots__ = ("qp", "cid", "what", "status", "value", "finished", "_after", "device_ns")

    def __init__(self, qp: QueuePair, cid: int, what: str, after=None):
        self.qp, self.cid, self.what, self._after = qp, cid, what, after
        self.finished = False
        self.status = None
        self.value = None
        self.device_ns = 0

    def _complete(self, status: int, result: int, device_ns: int = 0) -> None:
        self.status, self.value, self.finished = status, result, True
        self.device_ns = device_ns  # the CQE's: modelled compute time, or measured service

    def done(self) -> bool:
        if not self.finished:
            self.qp.poll()
        return self.finished

    def result(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.finished:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"{self.what}: no completion within {timeout} s")
            self.qp.wait(left)
        if self.status == GONE:
            raise DeviceGoneError(f"{self.what}: the device shut down before completing it")
        raise_for_status(self.status, self.what)
        self.qp.last_device_ns = self.device_ns
        if self._after is not None:
            self._after(self.value)
            self._after = None
        return self.value


class QueuePair:
    """A submission and a completion ring shared with the daemon."""

    def __init__(self, qid: int, nbytes: int, entries: int, fds: list[int],
                 hangup_fd: int = -1):
        mem_fd, self.doorbell_fd, self.completion_fd = fds
        self.hangup_fd = hangup_fd  # the control socket: the daemon's death shows there
        self.qid, self.entries = qid, entries
        self.mm = mmap.mmap(mem_fd, nbytes, mmap.MAP_SHARED)
        os.close(mem_fd)
        self.mem = ffi.cast("void *", ffi.from_buffer(self.mm))
        if lib.sde_qp_check(self.mem, nbytes) < 0:
            raise ConnectError("the daemon handed over a malformed queue pair")
        self._free_cids = list(range(entries - 1, -1, -1))
        self.pending: dict[int, Future] = {}
        self._cqes = ffi.new("sde_cqe[]", entries)
        self._kicked = ffi.new("int *")
        self.kicks = 0
        self.last_device_ns = 0  # of the last command whose result() returned

    def submit(self, sqes, futures: list[Future]) -> int:
        """Publish commands (a cffi sde_sqe array, cids already set); returns how many the
        ring took."""
        n = lib.sde_sq_submit(self.mem, sqes, len(futures), self.doorbell_fd, self._kicked)
        if n < 0:
            raise DeviceGoneError(f"doorbell failed: {os.strerror(-n)}")
        self.kicks += self._kicked[0]
        for f in futures[:n]:
            self.pending[f.cid] = f
        return n

    def new_cid(self) -> int:
        if not self._free_cids:
            self.poll()
        while not self._free_cids:  # a full queue is back-pressure: wait for completions
            self.wait(None)
        return self._free_cids.pop()

    def poll(self) -> int:
        n = lib.sde_cq_reap(self.mem, self._cqes, self.entries)
        for i in range(n):
            c = self._cqes[i]
            f = self.pending.pop(c.cid, None)
            if f is not None:
                f._complete(c.status, c.result, c.device_time_ns)
                self._free_cids.append(f.cid)
        return n

    def wait(self, timeout: float | None) -> int:
        if self.poll():
            return 1
        r = lib.sde_cq_wait(self.mem, self.completion_fd, self.hangup_fd, SPIN_NS,
                            0 if timeout is None else max(1, int(timeout * 1e9)))
        if r == -107:  # ENOTCONN: the daemon marked the queue dead
            self._fail_all()
            raise DeviceGoneError("the device shut down or dropped this queue")
        if r < 0:
            raise DeviceGoneError(f"waiting for completions failed: {os.strerror(-r)}")
        return self.poll()

    def _fail_all(self) -> None:
        for f in self.pending.values():
            f._complete(GONE, 0)
        self.pending.clear()

    def close(self) -> None:
        self.mem = None
        try:
            self.mm.close()
        except BufferError:
            pass
        for fd in (self.doorbell_fd, self.completion_fd):
            os.close(fd)


class Device:
    """A connection to the emulated drive.  Commands go through one queue pair by default;
    `queue_pair()` makes more (one per thread)."""

    def __init__(self, sock: socket.socket, info: dict, entries: int):
        self.sock = sock
        self.info = info
        self.block = info["logical_block_bytes"]
        self._buffers: list[tuple[int, int, int]] = []  # (base address, bytes, handle)
        self._arrays: dict[int, np.ndarray] = {}
        self.qp = self.queue_pair(entries)
        # On a drive with a virtual clock (serve --clock virtual) every command carries this
        # submission time (ns); an experiment advances it, e.g. to a trace's timestamps.
        self.submit_time_ns = 0
        self._bounce = self._alloc(BOUNCE_BYTES, bounce=True)
        self._bounce_handle = self._buffers[-1][2]

    # -- control plane --
    def _request(self, msg: dict, fds: list[int] = ()) -> tuple[dict, list[int]]:
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

    def queue_pair(self, entries: int = DEFAULT_ENTRIES) -> QueuePair:
        reply, fds = self._request({"op": "create_qp", "entries": entries})
        return QueuePair(reply["qid"], reply["bytes"], reply["entries"], fds,
                         self.sock.fileno())

    def _alloc(self, nbytes: int, bounce: bool = False) -> np.ndarray:
        size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        fd = os.memfd_create("ssdemu-buf", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED)
            reply, _ = self._request({"op": "register_buffer", "bytes": size,
                                      "bounce": bounce}, [fd])
        finally:
            os.close(fd)
        arr = np.frombuffer(mm, dtype=np.uint8, count=nbytes)
        self._buffers.append((_addr(arr), size, reply["handle"]))
        self._arrays[reply["handle"]] = arr
        return arr

    def alloc(self, nbytes: int) -> np.ndarray:
        """A zero-copy buffer: a uint8 array in memory the daemon reads and writes directly."""
        if nbytes <= 0:
            raise ValueError(f"buffer size must be positive, got {nbytes}")
        return self._alloc(nbytes)

    def free(self, arr: np.ndarray) -> None:
        handle, _ = self._locate(arr)
        if handle is None:
            raise ValueError("not a buffer from Device.alloc")
        self._request({"op": "unregister_buffer", "handle": handle})
        self._buffers = [b for b in self._buffers if b[2] != handle]
        self._arrays.pop(handle, None)

    def _locate(self, arr: np.ndarray) -> tuple[int | None, int]:
        if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
            return None, 0
        a = _addr(arr)
        for base, size, handle in self._buffers:
            if base <= a and a + arr.nbytes <= base + size and handle != self._bounce_handle:
                return handle, a - base
        return None, 0

    # -- commands --
    def submit(self, opcode: int, what: str, after=None, qp: QueuePair | None = None,
               **fields) -> Future:
        """One command (fields as in sde_sqe); returns its Future."""
        qp = qp or self.qp
        cid = qp.new_cid()
        fields["opcode"] = opcode
        fields["cid"] = cid
        fields.setdefault("submit_time_ns", self.submit_time_ns)
        sqe = ffi.new("sde_sqe[1]", [fields])
        f = Future(qp, cid, what, after)
        while qp.submit(sqe, [f]) == 0:  # SQ full: back-pressure
            qp.wait(None)
        return f

    def submit_batch(self, commands: list[dict], qp: QueuePair | None = None) -> list[Future]:
        """Many commands in one ring update (as cuFileBatchIOSubmit): each a dict of sde_sqe
        fields with an `opcode`.  Returns their Futures, in order."""
        qp = qp or self.qp
        if len(commands) > qp.entries:
            raise ValueError(f"a batch holds at most {qp.entries} commands (the queue size)")
        fields, futures = [], []
        for c in commands:
            d = dict(c, cid=qp.new_cid())
            d.setdefault("opcode", OPCODES["NOP"])
            d.setdefault("submit_time_ns", self.submit_time_ns)
            fields.append(d)
            futures.append(Future(qp, d["cid"], f"batch command {d['opcode']}"))
        sqes = ffi.new("sde_sqe[]", fields)
        done = 0
        while done < len(futures):
            done += qp.submit(sqes + done, futures[done:])
            if done < len(futures):
                qp.wait(None)
        return futures

    def reap(self, futures: list[Future], min_done: int = 1,
             timeout: float | None = None) -> list[Future]:
        """Wait until at least min_done of these futures are done (as cuFileBatchIOGetStatus);
        returns the done ones."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.qp.poll()
            done = [f for f in futures if f.finished]
            if len(done) >= min(min_done, len(futures)):
                return done
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return done
            self.qp.wait(left)

    def nop(self) -> None:
        self.submit(OPCODES["NOP"], "nop").result()

    def read_async(self, nsid: int, lba: int, out: np.ndarray) -> Future:
        handle, off = self._locate(out)
        if handle is not None:
            return self.submit(OPCODES["READ"], f"read ns {nsid} lba {lba}", nsid=nsid,
                               lba=lba, buf=handle, buf_offset=off, length=out.nbytes)
        self._check_bounce(out)
        view = out.reshape(-1).view(np.uint8)

        def copy_out(_):
            view[:] = self._bounce[:view.nbytes]

        return self.submit(OPCODES["READ"], f"read ns {nsid} lba {lba}", after=copy_out,
                           nsid=nsid, lba=lba, buf=self._bounce_handle, length=out.nbytes)

    def write_async(self, nsid: int, lba: int, data: np.ndarray) -> Future:
        handle, off = self._locate(data)
        if handle is None:
            self._check_bounce(data)
            self._bounce[:data.nbytes] = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            handle, off = self._bounce_handle, 0
        return self.submit(OPCODES["WRITE"], f"write ns {nsid} lba {lba}", nsid=nsid,
                           lba=lba, buf=handle, buf_offset=off, length=data.nbytes)

    def _check_bounce(self, arr: np.ndarray) -> None:
        if arr.nbytes > BOUNCE_BYTES:
            raise ValueError(f"unregistered arrays go through a {BOUNCE_BYTES}-byte bounce "
                             f"buffer: use Device.alloc for {arr.nbytes} bytes")
        if self.qp.pending:
            # one bounce buffer: commands using it run one at a time
            for f in list(self.qp.pending.values()):
                f.result()

    def read(self, nsid: int, lba: int, out: np.ndarray) -> int:
        return self.read_async(nsid, lba, out).result()

    def write(self, nsid: int, lba: int, data: np.ndarray) -> int:
        return self.write_async(nsid, lba, data).result()

    def flush(self, nsid: int = 0) -> None:
        self.submit(OPCODES["FLUSH"], f"flush ns {nsid}", nsid=nsid).result()

    def write_zeroes(self, nsid: int, lba: int, nbytes: int) -> None:
        self.submit(OPCODES["WRITE_ZEROES"], "write zeroes", nsid=nsid, lba=lba,
                    length=nbytes).result()

    def deallocate(self, nsid: int, lba: int, nbytes: int) -> None:
        self.submit(OPCODES["DEALLOCATE"], "deallocate", nsid=nsid, lba=lba,
                    length=nbytes).result()

    # -- KV (the NVMe KV command set) --
    @staticmethod
    def _key_fields(key: bytes) -> dict:
        if not isinstance(key, (bytes, bytearray)):
            raise TypeError("keys are bytes")
        padded = bytes(key).ljust(16, b"\0")[:16]
        return {"lba": int.from_bytes(padded[:8], "little"),
                "key_hi": int.from_bytes(padded[8:], "little"), "param1": len(key)}

    def _staged(self, data) -> tuple[int, int, int]:
        """(handle, offset, length) of data: in place if in a registered buffer, else copied
        into the bounce buffer."""
        arr = data if isinstance(data, np.ndarray) else np.frombuffer(bytes(data), np.uint8)
        handle, off = self._locate(arr)
        if handle is not None:
            return handle, off, arr.nbytes
        self._check_bounce(arr)
        self._bounce[:arr.nbytes] = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        return self._bounce_handle, 0, arr.nbytes

    def kv_put(self, key: bytes, value, only_if_exists: bool = False,
               only_if_not_exists: bool = False) -> bool:
        """Store a value (bytes or a uint8 array, 1 B to 2 MiB); True if the key existed."""
        mode = 1 if only_if_exists else 2 if only_if_not_exists else 0
        handle, off, n = self._staged(value)
        return bool(self.submit(OPCODES["KV_STORE"], f"kv store {bytes(key)!r}",
                                buf=handle, buf_offset=off, length=n, param0=mode,
                                **self._key_fields(key)).result())

    def kv_get(self, key: bytes, out: np.ndarray | None = None) -> bytes | int:
        """The value (bytes), or, with `out` (a registered buffer), its length."""
        if out is not None:
            handle, off = self._locate(out)
            if handle is None:
                raise ValueError("out must be a buffer from Device.alloc")
            return self.submit(OPCODES["KV_RETRIEVE"], f"kv retrieve {bytes(key)!r}",
                               buf=handle, buf_offset=off, length=out.nbytes,
                               **self._key_fields(key)).result()
        self._check_bounce(self._bounce[:0])
        n = self.submit(OPCODES["KV_RETRIEVE"], f"kv retrieve {bytes(key)!r}",
                        buf=self._bounce_handle, length=BOUNCE_BYTES,
                        **self._key_fields(key)).result()
        return bytes(self._bounce[:n])

    def kv_delete(self, key: bytes) -> None:
        self.submit(OPCODES["KV_DELETE"], f"kv delete {bytes(key)!r}",
                    **self._key_fields(key)).result()

    def kv_exists(self, key: bytes) -> bool:
        from hostlib.errors import KeyNotFoundError

        try:
            self.submit(OPCODES["KV_EXIST"], "kv exist", **self._key_fields(key)).result()
            return True
        except KeyNotFoundError:
            return False

    def kv_list(self, start: bytes = b"", max_keys: int = 1024) -> list[bytes]:
        fields = self._key_fields(start) if start else {}
        self._check_bounce(self._bounce[:0])
        n = self.submit(OPCODES["KV_LIST"], "kv list", buf=self._bounce_handle,
                        length=min(BOUNCE_BYTES, 17 * max_keys), **fields).result()
        raw = bytes(self._bounce[:17 * n])
        return [raw[i * 17 + 1:i * 17 + 1 + raw[i * 17]] for i in range(n)]

    # -- compute: the drive's firmware --
    def kv_put_quantized(self, key: bytes, block: np.ndarray, dtype: str, scheme: str) -> int:
        """Store a KV block (tokens, 2, layers, kv_heads, head_dim; fp16/bf16 as uint16 bits)
        quantized in the drive; returns the compressed size.  kv_get returns the compressed
        block, kv_get_dequantized the block."""
        from firmware.layout import dtype_code
        from ssdemu.queue_layout import pack_quant_request

        t, two, layers, heads, dim = block.shape
        header = np.frombuffer(pack_quant_request(dtype_code(dtype), scheme, t, layers, heads,
                                                  dim), np.uint8)
        payload = np.concatenate([header, np.ascontiguousarray(block).reshape(-1).view(
            np.uint8)])
        handle, off, n = self._staged(payload)
        return self.submit(OPCODES["KV_STORE_QUANTIZED"], f"kv store quantized {key!r}",
                           buf=handle, buf_offset=off, length=n,
                           **self._key_fields(key)).result()

    def kv_get_dequantized(self, key: bytes, out: np.ndarray) -> np.ndarray:
        """Dequantized in the drive, into `out` (the block's shape and carrier dtype)."""
        handle, off = self._locate(out)
        view = out.reshape(-1).view(np.uint8)
        if handle is None:
            self._check_bounce(view)
            handle, off = self._bounce_handle, 0
        n = self.submit(OPCODES["KV_RETRIEVE_DEQUANTIZED"], f"kv retrieve dequantized {key!r}",
                        buf=handle, buf_offset=off, length=out.nbytes,
                        **self._key_fields(key)).result()
        if handle == self._bounce_handle:
            view[:n] = self._bounce[:n]
        return out

    def prefix_match(self, keys) -> int:
        """How many leading keys of a chain (16-byte keys) the drive holds."""
        from firmware.prefix_index import keys_array

        arr = keys_array(keys).view(np.uint8).reshape(-1)
        handle, off, n = self._staged(arr)
        return self.submit(OPCODES["PREFIX_MATCH"], "prefix match", buf=handle,
                           buf_offset=off, length=n).result()

    def prefix_match_tokens(self, tokens, block_tokens: int, root: bytes) -> int:
        """Like prefix_match, the drive hashing the token ids itself (hostlib.prefix_hash)."""
        payload = np.concatenate([np.frombuffer(root, np.uint8),
                                  np.asarray(tokens, dtype="<u4").view(np.uint8)])
        handle, off, n = self._staged(payload)
        return self.submit(OPCODES["PREFIX_MATCH_TOKENS"], "prefix match (tokens)",
                           buf=handle, buf_offset=off, length=n,
                           param0=block_tokens).result()

    def pin(self, key: bytes) -> int:
        return self.submit(OPCODES["PIN"], "pin", **self._key_fields(key)).result()

    def unpin(self, key: bytes) -> int:
        return self.submit(OPCODES["UNPIN"], "unpin", **self._key_fields(key)).result()

    # -- admin --
    def _admin_json(self, opcode: int, what: str, **fields):
        n = self.submit(opcode, what, buf=self._bounce_handle, length=BOUNCE_BYTES,
                        **fields).result()
        return json.loads(bytes(self._bounce[:n]))

    def identify(self) -> dict:
        return self._admin_json(OPCODES["IDENTIFY"], "identify")

    def namespaces(self) -> list[dict]:
        return self._admin_json(OPCODES["NS_LIST"], "namespace list")

    def ns_create(self, nbytes: int) -> int:
        return self.submit(OPCODES["NS_CREATE"], "namespace create", param0=nbytes).result()

    def ns_delete(self, nsid: int) -> None:
        self.submit(OPCODES["NS_DELETE"], f"namespace delete {nsid}", nsid=nsid).result()

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


def connect(socket_path: str, entries: int = DEFAULT_ENTRIES, timeout: float = 5.0) -> Device:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(timeout)
    try:
        sock.connect(socket_path)
    except OSError as e:
        sock.close()
        raise ConnectError(f"cannot reach ssdemu at {socket_path}: {e.strerror}") from None
    try:
        try:
            control.send(sock, {"op": "hello", "version": PROTOCOL_VERSION})
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
