"""The daemon's control-socket sessions: a client connects (SO_PEERCRED checked), says hello
(its protocol version, its owner key), asks for queue pairs, buffers and faults, and leaves;
what it held is freed once the data plane has none of its commands in flight.  The records
of a client and what it holds are here too."""

from __future__ import annotations

import logging
import mmap
import os
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field

from ssdemu.device import _device
from ssdemu_wire import control, owner_key
from ssdemu_wire.layout import PROTOCOL_VERSION

ffi, lib = _device.ffi, _device.lib
log = logging.getLogger("ssdemu.serve")


@dataclass
class QueuePair:
    index: int
    fd: int
    mm: mmap.mmap
    cfd: int
    dfd: int  # its doorbell: this queue pair's alone (a client reading it takes only its kicks)


@dataclass
class Buffer:
    handle: int
    fd: int
    mm: mmap.mmap
    nbytes: int
    bounce: bool


@dataclass
class Departure:
    """What a departed client (or a destroyed queue pair) held, freed once the data plane has
    no command of it in flight."""

    qps: list[QueuePair]
    buffers: list[tuple[int, Buffer]]


@dataclass
class Client:
    cid: int
    sock: socket.socket
    uid: int
    pid: int
    token: int = 0  # the digest of the owner key given at hello (0: none): owner_key.token
    # may inject faults anywhere, cut power, remove the drive, see every rule and namespace:
    # a client that presented the --admin-key, or without one the daemon's own uid and root
    admin: bool = False
    qps: dict[int, QueuePair] = field(default_factory=dict)
    buffers: dict[int, Buffer] = field(default_factory=dict)


def close_mapping(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass  # cffi still holds a view: the mapping goes when that view does


class Sessions:
    """The daemon's clients on its control socket (the daemon's select loop calls in)."""

    def __init__(self, daemon):
        self.d = daemon
        self.draining: list[Departure] = []
        self._next_client = 1

    def accept(self) -> None:
        try:
            sock, _ = self.d.listener.accept()
        except BlockingIOError:
            return
        try:
            pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET,
                                                                socket.SO_PEERCRED, 12))
        except OSError:
            sock.close()
            return
        # with a group, the socket's mode already let in only its members (and the owner)
        if uid not in self.d.allowed_uids and self.d.group is None:
            self.refuse(sock, pid, uid)
            return
        # admins: the holders of --admin-key when the daemon has one; else its own uid and
        # root (whoever can read the key file can be one: docs/threat-model.md)
        client = Client(self._next_client, sock, uid, pid,
                        admin=self.d.admin_token is None and uid in (os.getuid(), 0))
        self._next_client += 1
        self.d.clients[client.cid] = client
        # non-blocking: the control loop serves every client, and waits for none of them
        sock.setblocking(False)
        self.d.sel.register(sock, selectors.EVENT_READ, ("client", client))
        log.info("client %d connected: pid %d uid %d", client.cid, pid, uid)

    def refuse(self, sock: socket.socket, pid: int, uid: int) -> None:
        """Tell a client it may not use the device, at no cost to anyone else: nothing here
        blocks, and nothing the peer does (close at once, never read) is an error of ours."""
        log.warning("refused pid %d: uid %d is not allowed", pid, uid)
        sock.setblocking(False)
        try:
            # read the hello if it is there: closing with unread data resets the connection
            # and the client would not see why
            try:
                sock.recv(65536)
            except OSError:
                pass
            try:
                control.send(sock, {"ok": False,
                                    "error": f"uid {uid} is not allowed to use this device"})
            except (OSError, control.ControlError):
                pass  # gone already, or not reading: its loss
        finally:
            sock.close()

    def message(self, client: Client) -> None:
        try:
            msg, fds = control.recv(client.sock)
        except BlockingIOError:
            return  # nothing after all
        except (OSError, control.ControlError) as e:
            log.warning("client %d: %s; dropping it", client.cid, e)
            self.drop_client(client)
            return
        if msg is None or msg.get("op") == "bye":
            log.info("client %d disconnected", client.cid)
            self.drop_client(client)
            return
        try:
            reply, out_fds = self.handle(client, msg, fds)
        except Exception as e:  # a bug on our side: tell the client, keep serving
            log.exception("client %d: request %r failed", client.cid, msg.get("op"))
            reply, out_fds = {"ok": False, "error": f"internal error: {e}"}, []
        finally:
            for fd in fds:
                os.close(fd)
        try:
            control.send(client.sock, reply, out_fds)
        except BlockingIOError:
            # its socket's buffer is full of replies it has not read (hundreds of them): a
            # client that sends requests and never reads their replies is dropped rather
            # than waited for, so that it cannot stall the control plane for the others
            log.warning("client %d does not read its replies; dropping it", client.cid)
            self.drop_client(client)
        except OSError:
            self.drop_client(client)

    def handle(self, client: Client, msg: dict, fds: list[int]):
        op = msg.get("op")
        if op == "hello":
            if msg.get("version") != PROTOCOL_VERSION:
                return {"ok": False, "error": f"protocol version {msg.get('version')!r} is "
                        f"not supported: this daemon speaks {PROTOCOL_VERSION}"}, []
            if "owner" in msg:
                return {"ok": False, "error": "an owner is a key, not a name: connect with "
                        "owner_key_file= (ssdemu owner-key FILE makes one)"}, []
            key = msg.get("owner_key")
            if key is not None:
                try:
                    key = owner_key.check(key) if isinstance(key, str) else None
                except owner_key.OwnerKeyError as e:
                    return {"ok": False, "error": str(e)}, []
                if key is None:
                    return {"ok": False, "error": "an owner key is hex text"}, []
                if client.qps or client.buffers or client.token:
                    return {"ok": False, "error": "the owner key is given once, before any "
                            "queue pair or buffer is made"}, []
                client.token = owner_key.token(key)
                client.admin = client.admin or client.token == self.d.admin_token
            return {"ok": True, "version": PROTOCOL_VERSION, "device": self.d.logs.identify()}, []
        if op == "create_qp":
            if self.d.faults.removed_until is not None:
                return {"ok": False, "error": "the device was removed (an injected surprise "
                        "removal): " + self.d.faults.removal_left()}, []
            return self.d.registration.create_qp(client, msg)
        if op == "destroy_qp":
            qp = client.qps.pop(int(msg.get("qid", -1)), None)
            if qp is None:
                return {"ok": False, "error": "no such queue pair"}, []
            lib.sde_dev_remove_qp(self.d.dev, qp.index)
            self.draining.append(Departure([qp], []))
            return {"ok": True}, []
        if op == "fault":
            return self.d.faults.request(client, msg), []
        if op == "register_buffer":
            return self.d.registration.register_buffer(client, msg, fds)
        if op == "unregister_buffer":
            return self.d.registration.unregister_buffer(client, int(msg.get("handle", -1)))
        return {"ok": False, "error": f"unknown request {op!r}"}, []

    def drop_client(self, client: Client) -> None:
        if self.d.clients.pop(client.cid, None) is None:
            return
        try:
            self.d.sel.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()
        for qp in client.qps.values():
            lib.sde_dev_remove_qp(self.d.dev, qp.index)
        released = lib.sde_dev_release_pins(self.d.dev, client.cid)
        if released:
            log.info("client %d left %d pins: released", client.cid, released)
        self.draining.append(Departure(list(client.qps.values()),
                                       list(client.buffers.items())))

    def reap_drained(self, force: bool = False) -> None:
        """Free what departed clients held once none of their commands is in flight (their
        media I/O may still be writing into those buffers)."""
        still = []
        for dep in self.draining:
            if any(lib.sde_dev_qp_inflight(self.d.dev, qp.index) > 0 for qp in dep.qps):
                still.append(dep)
                continue
            for qp in dep.qps:
                close_mapping(qp.mm)
                os.close(qp.fd)
                os.close(qp.cfd)
                os.close(qp.dfd)
            for handle, buf in dep.buffers:
                lib.sde_dev_remove_buffer(self.d.dev, handle)
                self.d.registration.release_buffer(buf)
        self.draining = still
        if force and still:
            time.sleep(0.01)
