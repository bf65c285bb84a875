"""`ssdemu serve`: the device process.

Threads: the data plane runs in C (`sde_dev_run`, the GIL released) and serves every queue
pair; this Python thread runs the control plane on a Unix SOCK_SEQPACKET socket (clients,
queue pairs, buffers), the admin commands the data plane hands over, and shutdown.  The
firmware's threads (C pthreads calling the Numba entry points of firmware/entry.py) run the
compute commands' kernels for the data plane.  The firmware's compiled code is loaded when the
first command needs it (`sde_fw_load_python`), not at start: a daemon that serves no compute
command never imports Numba (it starts in ~0.2 s rather than ~0.7 s: every restart, every
power-on after a cut, every test that starts one).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import math
import mmap
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import NoReturn

from ssdemu.device import _device, faults
from ssdemu.device.admin import Admin, Outcome
from ssdemu.device.media import Media
from ssdemu.device.quotas import QuotaExceeded, Quotas, Usage, refusal
from ssdemu.device.retrieval import Retrieval
from ssdemu.device.store import DEFAULT_MAX_VALUE, KeyNotFound, Store, StoreError, probe
from ssdemu.errors import SsdemuError
from ssdemu.sim.cost import kernel_stats
from ssdemu.sim.profile import Profile
from ssdemu.sim.timing import budget_of, model_param_fields
from ssdemu_wire import control, owner_key
from ssdemu_wire.layout import OPCODES, PROTOCOL_VERSION, SQE_DTYPE, STATUS

ffi, lib = _device.ffi, _device.lib
RETRIEVAL_OPS = (OPCODES["TOPK_PAGES"], OPCODES["ATTEND"])
SQE_FIELDS = SQE_DTYPE.names

log = logging.getLogger("ssdemu.serve")

LOG_PAGE_COUNTERS = 1
# serve --media-io: "auto" runs the reads and writes of shared-memory media (mem:, a file on
# tmpfs) in the data plane's thread and the rest through io_uring; "io_uring" all through it
MEDIA_IO = ("auto", "io_uring")
REALTIME_PRIORITY = 1  # serve --realtime: the lowest SCHED_RR priority, above every normal task
DRAIN_S = 30.0  # a namespace delete waits this long at most for the commands before it
# the command classes of the data plane's counters, by their SDE_CLASS_* number
# (c/dev/sde_dev.h, the one definition)
CLASS_NAMES = [name for _, name in sorted(
    (getattr(lib, n), n[len("SDE_CLASS_"):].lower()) for n in dir(lib)
    if n.startswith("SDE_CLASS_"))]


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


@ffi.def_extern()
def sde_fw_load_python(addresses) -> int:
    """The firmware's entry points' addresses, for the C side's first compute command
    (c/fw/sde_fw.c, sde_fw_ensure: called once, from a C thread; cffi takes the GIL)."""
    try:
        from firmware import entry

        for i, a in enumerate(entry.addresses()):
            addresses[i] = a
        log.info("firmware loaded")
        return 0
    except Exception:  # the command fails (INTERNAL) and says so in the log; we go on
        log.exception("the firmware's compiled code could not be loaded")
        return -errno.EIO


class Daemon:
    def __init__(self, profile: Profile, media: Media, socket_path: str,
                 allowed_uids: set[int] | None = None, format_media: bool = False,
                 timing: str = "detailed", clock: str = "real", journal_blocks: int = 0,
                 group: int | None = None, quotas: Quotas | None = None,
                 power_cut: bool = False, metrics: str | None = None,
                 admin_key: str | None = None, poll: bool = False,
                 realtime: bool = False, media_io: str = "auto"):
        if media_io not in MEDIA_IO:
            raise ValueError(f"media_io is one of {', '.join(MEDIA_IO)}, not {media_io!r}")
        self.profile = profile
        self.poll = poll  # the data plane never sleeps (serve --poll)
        self.realtime = realtime  # the data plane runs SCHED_RR (serve --realtime)
        # the owner key (hex) whose holder is an admin besides the daemon's uid and root
        self.admin_token = owner_key.token(admin_key) if admin_key else None
        self.fault_owner: dict[int, tuple[int, int]] = {}  # rule id -> who added it
        self.metrics_address = metrics
        self.metrics_server = None
        self.quotas = quotas or Quotas()  # per uid; resolved once the store's size is known
        self.group = group  # the socket's group (mode 0660): its members may connect
        self.media = media
        self.socket_path = socket_path
        self.allowed_uids = allowed_uids if allowed_uids is not None else {os.getuid(), 0}
        out = ffi.new("sde_dev **")
        r = lib.sde_dev_new(media.fd, media.size, media.lba_size, profile.queue.io_depth,
                            lib.SDE_ENG_NO_INLINE if media_io == "io_uring" else 0, out)
        if r < 0:
            raise OSError(-r, f"cannot start the device core: {os.strerror(-r)}")
        self.dev = out[0]
        self.timing, self.clock = timing, clock
        if timing != "off":
            # the drive's FTL maps the whole media (at a declared scale past 64 GiB).  The
            # controller's DRAM, which kernels share with the NAND and PCIe DMA, only on the
            # real clock: the data plane books a kernel's bytes (and a dequantized result's
            # transfer, a quantized store's program) when a firmware thread hands it back, so
            # where they fall among other commands' DMA follows this host's thread timing, and
            # a virtual-time run would not repeat itself.  Model-mode replay and bench device
            # model it.
            params = ffi.new("sde_model_params *", model_param_fields(
                profile, fixed=timing == "fixed", ftl_bytes=media.size, dram=clock != "virtual"))
            r = lib.sde_dev_set_model(self.dev, params, int(clock == "virtual"))
            if r < 0:
                raise OSError(-r, f"cannot build the timing model: {os.strerror(-r)}")
        self.store = open_store(media, format_media, not profile.write_cache.enabled,
                                profile, journal_blocks)
        for nsid, ns in self.store.namespace_table().items():
            lib.sde_dev_set_ns(self.dev, nsid, ns)
        self.quotas = self.quotas.resolve(
            queue_pairs=min(profile.queue.max_queue_pairs, lib.SDE_MAX_QPS),
            buffers=lib.SDE_MAX_BUFS, io_depth=profile.queue.io_depth,
            namespaces=lib.SDE_STORE_MAX_NS, data_bytes=self.store.info()["data_bytes"])
        # commands in flight: counted per uid by the data plane, which leaves the rest of a
        # uid's commands in its SQs past the quota
        lib.sde_dev_set_uid_quota(self.dev, self.quotas.inflight)
        lib.sde_dev_set_pin_quota(self.dev, self.quotas.pins)  # pinned keys, counted there too
        # from here on KV commands run in the data plane against the store (c/store)
        self.store.attach(self.dev)
        self.power_cut = power_cut
        if power_cut:
            check_power_cut(profile, media)
            r = lib.sde_dev_set_power_cut(self.dev, profile.write_cache.bytes)
            if r < 0:
                raise OSError(-r, "cannot start power-cut emulation")
        # the firmware: as many threads as the drive has compute units, at most one per core
        # of this host (more would only take turns)
        c = profile.compute
        threads = max(1, min(c.units, os.cpu_count() or 1, lib.SDE_FW_MAX_THREADS))
        lib.sde_fw_set_loader(lib.sde_fw_load_python)
        r = lib.sde_dev_set_firmware(self.dev, 0, 0, 0, threads,  # loaded on first use
                                     budget_of(profile).copy_into(ffi))
        if r < 0:
            raise OSError(-r, f"cannot start the firmware: {os.strerror(-r)}")
        self.admin = Admin(self)
        self.retrieval = Retrieval(self)
        self.clients: dict[int, Client] = {}
        self.draining: list[Departure] = []
        self._next_client = 1
        self._stop_flag = ffi.new("int *", 0)
        self._stopping = False
        self.removed_until: float | None = None  # a surprise removal: until then (inf: reinsert)
        self._remove_now = False
        self._cut_seed: int | None = None  # a power cut asked for: done after its reply
        self.sel = selectors.DefaultSelector()
        # what a signal writes to (signal.set_wakeup_fd in serve()): select() is restarted
        # after a handler with the time it had left (PEP 475), so SIGTERM alone waited out
        # the loop's 0.2 s timeout before the daemon began to stop
        self.signal_r, self.signal_w = socket.socketpair()
        for end in (self.signal_r, self.signal_w):
            end.setblocking(False)
        self.sel.register(self.signal_r, selectors.EVENT_READ, ("signal", None))
        self.listener: socket.socket | None = None
        self._socket_id: tuple[int, int] | None = None  # (st_dev, st_ino) of our socket
        self.data_plane: threading.Thread | None = None

    # -- lifecycle --
    def start(self) -> None:
        if self.metrics_address:  # before the socket: once it exists, everything serves
            from ssdemu.device.metrics import serve_metrics

            # scraped from the server's own thread: the log page takes the core's locks
            self.metrics_server = serve_metrics(self.metrics_address,
                                                lambda: self.log_page(LOG_PAGE_COUNTERS))
            log.info("metrics at http://%s/metrics", self.metrics_address)
        if check_socket_path(self.socket_path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                probe.connect(self.socket_path)
                raise OSError(errno.EADDRINUSE, f"a daemon already serves {self.socket_path}")
            except (ConnectionRefusedError, FileNotFoundError):
                os.unlink(self.socket_path)  # a stale socket from a daemon that died
            finally:
                probe.close()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # the socket is created 0600 (0660 with a group): other users cannot reach it at all;
        # SO_PEERCRED then checks those who can
        # bound and listening under a temporary name, then renamed into place: a client that
        # sees the socket can connect at once (between bind and listen it would be refused,
        # which a loaded machine showed)
        binding = f"{self.socket_path}.{os.getpid()}.tmp"
        dir_fd = None
        if len(binding.encode()) > control.MAX_SOCKET_PATH and \
                len(self.socket_path.encode()) <= control.MAX_SOCKET_PATH:
            # a path that fits sun_path whose temporary name would not: bound through the
            # directory's descriptor instead (clients connect by the path itself)
            dir_fd = os.open(os.path.dirname(os.path.abspath(self.socket_path)),
                             os.O_PATH | os.O_DIRECTORY)
            binding = f"/proc/self/fd/{dir_fd}/.{os.getpid()}.tmp"
        # 0600; 0660 in the group, whose members may connect; 0666 when --allow-uid names
        # users beyond this one and root, who could not reach a 0600 socket (SO_PEERCRED
        # still refuses everyone not allowed, at no cost)
        others = self.allowed_uids - {os.getuid(), 0}
        old = os.umask(0o117 if self.group is not None else 0o111 if others else 0o177)
        try:
            self.listener.bind(binding)
        finally:
            os.umask(old)
        try:
            if self.group is not None:
                os.chown(binding, -1, self.group)
            self.listener.listen(64)
            # linked into place, never renamed over: whatever appeared at the path since the
            # check above (another daemon's socket, a user's file) is not replaced
            try:
                os.link(binding, self.socket_path)
            except FileExistsError:
                raise OSError(errno.EEXIST, f"{self.socket_path} appeared while this daemon "
                              "started: not replaced") from None
            bound = os.lstat(binding)
            self._socket_id = (bound.st_dev, bound.st_ino)  # shutdown removes only this one
        finally:
            os.unlink(binding)
            if dir_fd is not None:
                os.close(dir_fd)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, ("accept", None))
        self.sel.register(lib.sde_dev_admin_fd(self.dev), selectors.EVENT_READ, ("admin", None))
        spin_ns = lib.SDE_DEV_POLL if self.poll else self.profile.queue.spin_us * 1000

        def data_plane():
            if self.realtime:
                # SCHED_RR for this thread alone: a completion or a doorbell wakes it ahead
                # of CPU-bound neighbours, as an interrupt would (firmware threads stay);
                # serve() checked that this process may
                set_realtime(threading.get_native_id())
            lib.sde_dev_run(self.dev, self._stop_flag, spin_ns)

        self.data_plane = threading.Thread(target=data_plane, name="ssdemu-data-plane",
                                           daemon=True)
        self.data_plane.start()
        log.info("serving %s on %s: %s, %d bytes, %d-byte blocks", self.profile.name,
                 self.socket_path, self.media.spec, self.media.size, self.media.lba_size)

    def request_stop(self, *_):
        self._stopping = True

    def serve_forever(self) -> None:
        while not self._stopping:
            for key, _ in self.sel.select(timeout=0.2):
                kind, client = key.data
                try:
                    if kind == "signal":
                        self.signal_r.recv(64)  # the handler itself has run
                    elif kind == "accept":
                        self._accept()
                    elif kind == "admin":
                        self._admin()
                    else:
                        self._client_message(client)
                except Exception:  # a bug on our side: log it, drop that client, go on
                    log.exception("serving %s failed", kind)
                    if client is not None and client.cid in self.clients:
                        self._drop_client(client)
            if self._cut_seed is not None:
                self._power_cut(self._cut_seed)
            if self._remove_now:
                self._surprise_removal()
            elif self.removed_until is not None and time.monotonic() >= self.removed_until:
                self.removed_until = None
                log.warning("the device is back after its injected removal")
            self._reap_drained()
        self.shutdown()

    def shutdown(self) -> None:
        log.info("shutting down: %d clients", len(self.clients))
        if self.metrics_server is not None:
            server = self.metrics_server[0] if isinstance(self.metrics_server, tuple) \
                else self.metrics_server
            server.shutdown()
            server.server_close()
        lib.sde_dev_shutdown_qps(self.dev)  # clients waiting are woken and told
        self._stop_flag[0] = 1
        os.eventfd_write(lib.sde_dev_doorbell_fd(self.dev), 1)
        stuck = False
        if self.data_plane:
            self.data_plane.join(timeout=10)
            stuck = self.data_plane.is_alive()
        self.retrieval.close()  # its last commands complete before the queues go
        for client in list(self.clients.values()):
            self._drop_client(client)
        deadline = time.monotonic() + 5
        while self.draining and time.monotonic() < deadline:
            self._reap_drained(force=True)
        if self.listener:
            self.sel.unregister(self.listener)
            self.listener.close()
            self._remove_socket()
        if stuck:  # freeing under a running data plane would crash: leave it to exit()
            log.error("the data plane did not stop; exiting without freeing the device")
        else:
            self.store.flush()  # the data plane drained its media I/O before it returned
            self.store.close()
            lib.sde_dev_free(self.dev)
        self.dev = ffi.NULL
        log.info("stopped")

    # -- clients --
    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except BlockingIOError:
            return
        try:
            pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET,
                                                                socket.SO_PEERCRED, 12))
        except OSError:
            sock.close()
            return
        # with a group, the socket's mode already let in only its members (and the owner)
        if uid not in self.allowed_uids and self.group is None:
            self._refuse(sock, pid, uid)
            return
        # admins: the holders of --admin-key when the daemon has one; else its own uid and
        # root (whoever can read the key file can be one: docs/threat-model.md)
        client = Client(self._next_client, sock, uid, pid,
                        admin=self.admin_token is None and uid in (os.getuid(), 0))
        self._next_client += 1
        self.clients[client.cid] = client
        # non-blocking: the control loop serves every client, and waits for none of them
        sock.setblocking(False)
        self.sel.register(sock, selectors.EVENT_READ, ("client", client))
        log.info("client %d connected: pid %d uid %d", client.cid, pid, uid)

    def _refuse(self, sock: socket.socket, pid: int, uid: int) -> None:
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

    def _client_message(self, client: Client) -> None:
        try:
            msg, fds = control.recv(client.sock)
        except BlockingIOError:
            return  # nothing after all
        except (OSError, control.ControlError) as e:
            log.warning("client %d: %s; dropping it", client.cid, e)
            self._drop_client(client)
            return
        if msg is None or msg.get("op") == "bye":
            log.info("client %d disconnected", client.cid)
            self._drop_client(client)
            return
        try:
            reply, out_fds = self._handle(client, msg, fds)
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
            self._drop_client(client)
        except OSError:
            self._drop_client(client)

    def _handle(self, client: Client, msg: dict, fds: list[int]):
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
                client.admin = client.admin or client.token == self.admin_token
            return {"ok": True, "version": PROTOCOL_VERSION, "device": self.identify()}, []
        if op == "create_qp":
            if self.removed_until is not None:
                return {"ok": False, "error": "the device was removed (an injected surprise "
                        "removal): " + self._removal_left()}, []
            return self._create_qp(client, msg)
        if op == "destroy_qp":
            qp = client.qps.pop(int(msg.get("qid", -1)), None)
            if qp is None:
                return {"ok": False, "error": "no such queue pair"}, []
            lib.sde_dev_remove_qp(self.dev, qp.index)
            self.draining.append(Departure([qp], []))
            return {"ok": True}, []
        if op == "fault":
            return self._fault(client, msg), []
        if op == "register_buffer":
            return self._register_buffer(client, msg, fds)
        if op == "unregister_buffer":
            return self._unregister_buffer(client, int(msg.get("handle", -1)))
        return {"ok": False, "error": f"unknown request {op!r}"}, []

    # -- fault injection (ssdemu/device/faults.py holds the rule format) --
    def _fault(self, client: Client, msg: dict) -> dict:
        """An admin may do anything here; any other owner may add rules on namespaces of its
        own, and see and clear only the rules it added (docs/threat-model.md)."""
        action = msg.get("action")
        if action in ("remove", "reinsert", "power-cut") and not client.admin:
            return {"ok": False, "error": f"fault {action} is an admin's (the holder of the "
                    "daemon's --admin-key; without one, the daemon's uid and root)"}
        try:
            if action == "add":
                rule, seed = faults.rule_from_request(msg)
                if not client.admin and not self._owns(client, rule):
                    return {"ok": False, "error": "an owner may inject faults only into a "
                            "namespace of its own (nsid of one it created, not shared); "
                            "device-wide rules are an admin's"}
                fid = lib.sde_dev_fault_add(self.dev, rule, seed)
                if fid < 0:
                    return {"ok": False, "error": "the device holds at most "
                            f"{lib.SDE_FAULT_MAX} fault rules" if fid == -errno.ENOSPC
                            else "the fault rule is not valid"}
                self.fault_owner[fid] = (client.uid, client.token)
                log.warning("fault %d injected by uid %d: %s", fid, client.uid,
                            faults.describe(msg))
                return {"ok": True, "id": fid}
            if action == "clear":
                rid = msg.get("id", 0)
                if isinstance(rid, bool) or not isinstance(rid, int) or rid < 0:
                    return {"ok": False, "error": "id is a rule's id, or 0 for all"}
                mine = [r["id"] for r in self._fault_rules(client)]
                if rid and rid not in mine:
                    return {"ok": True, "cleared": 0}  # another's is as if it did not exist
                n = sum(self._clear_fault(r) for r in ([rid] if rid else mine))
                return {"ok": True, "cleared": n}
            if action == "list":
                return {"ok": True, "rules": self._fault_rules(client)}
            if action == "remove":
                seconds = faults.finite_number(msg.get("seconds", 0), "seconds")
                self.removed_until = (time.monotonic() + seconds) if seconds > 0 else math.inf
                self._remove_now = True  # after this reply is sent
                return {"ok": True}
            if action == "power-cut":
                if not self.power_cut:
                    return {"ok": False, "error": "power cuts need the daemon started with "
                            "--power-cut"}
                seed = msg.get("seed", 0)
                if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
                    return {"ok": False, "error": "seed must be an integer in 0..2^64-1"}
                self._cut_seed = seed  # after this reply is sent
                return {"ok": True}
            if action == "reinsert":
                was = self.removed_until is not None
                self.removed_until = None
                if was:
                    log.warning("the device is back (reinserted)")
                return {"ok": True, "was_removed": was}
        except faults.FaultError as e:
            return {"ok": False, "error": str(e)}
        return {"ok": False, "error": f"unknown fault action {action!r} (add, clear, list, "
                "remove, reinsert, power-cut)"}

    def _owns(self, client: Client, rule) -> bool:
        """Whether the rule touches only a namespace the client's owner created privately."""
        if rule.all_ns or rule.nsid == 0:
            return False
        ns = self.store.namespace_table().get(int(rule.nsid))
        return (ns is not None and not ns.flags & lib.SDE_NS_SHARED
                and (ns.uid, ns.token) == (client.uid, client.token))

    def _fault_rules(self, client: Client | None) -> list[dict]:
        """The rules in force that the client may see (None: every one)."""
        table = ffi.new("sde_faults *")
        lib.sde_dev_faults(self.dev, table)
        rules = [faults.rule_to_dict(table.rules[i]) for i in range(table.n)]
        live = {r["id"] for r in rules}
        self.fault_owner = {k: v for k, v in self.fault_owner.items() if k in live}
        if client is None or client.admin:
            return rules
        me = (client.uid, client.token)
        return [r for r in rules if self.fault_owner.get(r["id"]) == me]

    def _clear_fault(self, rid: int) -> int:
        self.fault_owner.pop(rid, None)
        return lib.sde_dev_fault_clear(self.dev, rid)

    def _remove_socket(self) -> None:
        """Unlink the socket path if it is still the socket this daemon bound."""
        try:
            st = os.lstat(self.socket_path)
            if (st.st_dev, st.st_ino) == self._socket_id:
                os.unlink(self.socket_path)
            else:  # not the socket this daemon bound: someone else's now
                log.warning("%s is no longer this daemon's socket: left in place",
                            self.socket_path)
        except FileNotFoundError:
            pass

    def _removal_left(self) -> str:
        if self.removed_until == math.inf:
            return "it returns at 'ssdemu ctl fault reinsert'"
        return f"it returns in {max(0.0, self.removed_until - time.monotonic()):.1f} s"

    def _power_cut(self, seed: int) -> None:
        """As if power were lost: the queues die, the data plane stops where it is, the
        writes the volatile cache had not made durable are undone as a real cut could lose
        them (c/dev/sde_undo.h, seeded), and the daemon starts again on the same media and socket
        as the drive would at power-on (same process: exec)."""
        log.warning("power cut injected (seed %d): %d clients cut off", seed, len(self.clients))
        lib.sde_dev_shutdown_qps(self.dev)
        self._stop_flag[0] = 1
        os.eventfd_write(lib.sde_dev_doorbell_fd(self.dev), 1)
        if self.data_plane:
            self.data_plane.join(timeout=10)
        res = ffi.new("sde_cut_result *")
        r = lib.sde_dev_power_cut(self.dev, seed, res)
        if r < 0:
            log.error("the power cut could not undo the lost writes: %s", os.strerror(-r))
        log.warning("power cut: block writes kept %d lost %d, store writes kept %d lost %d, "
                    "%d bytes put back; powering on again", res.block_writes_kept,
                    res.block_writes_lost, res.store_writes_kept, res.store_writes_lost,
                    res.bytes_restored)
        for handler in logging.getLogger().handlers:
            handler.flush()
        argv = [a for a in sys.argv[1:] if a != "--format"]  # power-on keeps the contents
        python = sys.executable
        if not os.access(python, os.X_OK):  # say so while the log and the socket are ours
            self._power_on_failed(f"cannot execute {python}")
        os.closerange(3, 65536)  # the old process's rings, memfds and sockets go with it
        try:
            os.execv(python, [python, "-m", "ssdemu", *argv])
        except OSError as e:
            self._power_on_failed(f"cannot execute {python}: {e.strerror}")

    def _power_on_failed(self, why: str) -> NoReturn:
        """The re-exec that powers the drive on again cannot happen: one line saying why, our
        socket removed (a client must not wait on a drive that is gone), exit 1.  The media
        holds what the cut left; a daemon started on it again recovers it."""
        self._remove_socket()
        msg = (f"ssdemu: error: power-on after the injected power cut failed: {why}; the "
               f"media holds what the cut left: start the daemon on it again")
        log.error("%s", msg)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.write(2, (msg + "\n").encode())
        os._exit(1)  # the data plane is stopped and its fds may be gone: nothing to free

    def _surprise_removal(self) -> None:
        """As if the drive were pulled: every queue dies at once (clients waiting are woken
        and see the device gone), every connection is closed; what was acknowledged stays."""
        self._remove_now = False
        log.warning("surprise removal injected: %d clients cut off; %s", len(self.clients),
                    self._removal_left())
        lib.sde_dev_shutdown_qps(self.dev)
        self.retrieval.close()  # its last commands complete before the queues go
        for client in list(self.clients.values()):
            self._drop_client(client)

    def _create_qp(self, client: Client, msg: dict):
        entries = msg.get("entries")
        q = self.profile.queue
        if (not isinstance(entries, int) or entries < 2 or entries > q.max_entries
                or entries & (entries - 1)):
            return {"ok": False, "error": f"queue entries must be a power of two in "
                    f"2..{q.max_entries}"}, []
        why = refusal(self.quotas, client.uid, self._usage(client.uid), "queue_pairs")
        if why:
            return {"ok": False, "error": why}, []
        nbytes = lib.sde_qp_bytes(entries, entries)
        fd = os.memfd_create("ssdemu-qp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, nbytes)
        # sealed before the client gets it: a client that could shrink it would fault the
        # data plane (SIGBUS) and stop every other client
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED)
        addr = ffi.cast("void *", ffi.from_buffer(mm))
        cfd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        dfd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        lib.sde_qp_init(addr, entries, entries, 0)
        index = lib.sde_dev_add_qp(self.dev, addr, nbytes, client.cid, cfd, dfd, client.uid,
                                   client.token)
        if index < 0:
            mm.close()
            os.close(fd)
            os.close(cfd)
            os.close(dfd)
            return {"ok": False, "error": "the device has no free queue pair"}, []
        lib.sde_dev_set_qp_admin(self.dev, index, client.admin)  # may force a delete
        client.qps[index] = QueuePair(index, fd, mm, cfd, dfd)
        return ({"ok": True, "qid": index, "bytes": nbytes, "entries": entries},
                [fd, dfd, cfd])

    def _register_buffer(self, client: Client, msg: dict, fds: list[int]):
        nbytes = msg.get("bytes")
        if len(fds) != 1 or not isinstance(nbytes, int) or nbytes <= 0:
            return {"ok": False, "error": "register_buffer takes one memfd and its size"}, []
        used = self._usage(client.uid)
        why = (refusal(self.quotas, client.uid, used, "buffers")
               or refusal(self.quotas, client.uid, used, "buffer_bytes", nbytes))
        if why:
            return {"ok": False, "error": why}, []
        fd = os.dup(fds[0])
        try:
            st = os.fstat(fd)
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError as e:
            os.close(fd)
            return {"ok": False, "error": f"buffer descriptor unusable: {e.strerror}"}, []
        # a buffer the client could shrink would fault the daemon: require the seal
        if not seals & fcntl.F_SEAL_SHRINK or st.st_size < nbytes or nbytes % mmap.PAGESIZE:
            os.close(fd)
            return {"ok": False, "error": "buffers must be memfds sealed against shrinking, "
                    "whole pages, at least as large as declared"}, []
        try:
            mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED)
        except OSError as e:
            # a memfd sealed against writes cannot be mapped shared and writable: refused,
            # and nothing of it kept (its descriptor would keep its memory alive)
            os.close(fd)
            return {"ok": False, "error": "buffers must be memfds the device can map shared "
                    f"and writable (not sealed against writes): {e.strerror}"}, []
        addr = ffi.cast("void *", ffi.from_buffer(mm))
        bounce = bool(msg.get("bounce"))
        handle = lib.sde_dev_add_buffer(self.dev, client.cid, addr, nbytes,
                                        lib.SDE_BUF_BOUNCE if bounce else 0)
        if handle < 0:
            mm.close()
            os.close(fd)
            return {"ok": False, "error": "the device has no free buffer slot"}, []
        client.buffers[handle] = Buffer(handle, fd, mm, nbytes, bounce)
        return {"ok": True, "handle": handle}, []

    def _usage(self, uid: int) -> Usage:
        """What uid holds now, over all its connections (and namespaces on the media)."""
        u = Usage()
        for c in self.clients.values():
            if c.uid == uid:
                u.queue_pairs += len(c.qps)
                u.buffers += len(c.buffers)
                u.buffer_bytes += sum(b.nbytes for b in c.buffers.values())
        for ns in self.store.namespace_table().values():
            if ns.uid == uid:  # a shared namespace counts against its creator
                u.namespaces += 1
                u.namespace_bytes += ns.bytes
        return u

    def _unregister_buffer(self, client: Client, handle: int):
        buf = client.buffers.get(handle)
        if buf is None:
            return {"ok": False, "error": "no such buffer"}, []
        if lib.sde_dev_client_inflight(self.dev, client.cid):
            return {"ok": False, "error": "commands are in flight: reap them first"}, []
        lib.sde_dev_remove_buffer(self.dev, handle)
        del client.buffers[handle]
        self._release_buffer(buf)
        return {"ok": True}, []

    def _release_buffer(self, buf: Buffer) -> None:
        _close_mapping(buf.mm)
        os.close(buf.fd)

    def _drop_client(self, client: Client) -> None:
        if self.clients.pop(client.cid, None) is None:
            return
        try:
            self.sel.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()
        for qp in client.qps.values():
            lib.sde_dev_remove_qp(self.dev, qp.index)
        released = lib.sde_dev_release_pins(self.dev, client.cid)
        if released:
            log.info("client %d left %d pins: released", client.cid, released)
        self.draining.append(Departure(list(client.qps.values()),
                                       list(client.buffers.items())))

    def _reap_drained(self, force: bool = False) -> None:
        """Free what departed clients held once none of their commands is in flight (their
        media I/O may still be writing into those buffers)."""
        still = []
        for dep in self.draining:
            if any(lib.sde_dev_qp_inflight(self.dev, qp.index) > 0 for qp in dep.qps):
                still.append(dep)
                continue
            for qp in dep.qps:
                _close_mapping(qp.mm)
                os.close(qp.fd)
                os.close(qp.cfd)
                os.close(qp.dfd)
            for handle, buf in dep.buffers:
                lib.sde_dev_remove_buffer(self.dev, handle)
                self._release_buffer(buf)
        self.draining = still
        if force and still:
            time.sleep(0.01)

    # -- admin commands --
    def identify(self) -> dict:
        return {
            "model": "ssdemu", "profile": self.profile.name,
            "description": self.profile.description,
            "capacity_bytes": self.store.d_len, "media_bytes": self.media.size,
            "logical_block_bytes": self.media.lba_size,
            # the KV store's allocation unit: values of whole units move with no copy
            "store_unit_bytes": self.store.block,
            "max_io_bytes": lib.SDE_MAX_IO_BYTES, "max_namespaces": lib.SDE_MAX_NS,
            "max_queue_entries": self.profile.queue.max_entries,
            "max_key_bytes": lib.SDE_KEY_MAX, "max_value_bytes": self.store.max_value,
            "index_keys": self.store.index_keys,
            "media": str(self.media.spec), "media_path": self.media.fio_path,
            "timing": self.timing, "clock": self.clock, "poll": self.poll,
            # how the data plane reaches its media: "inline" (shared memory: the copy in its
            # own thread) or "io_uring" (serve --media-io)
            "media_io": "inline" if lib.sde_dev_media_inline(self.dev) else "io_uring",
            "realtime": self.realtime,
            "power_cut_emulation": self.power_cut,
            "compute_units": self.profile.compute.units, "tops": self.profile.compute.tops,
            # the retrieval page the profile gives: kv_put_quantized(summary_page=True)
            "page_tokens": self.profile.retrieval.page_tokens,
            "protocol_version": PROTOCOL_VERSION,
            "commands": sorted(OPCODES),
        }

    def log_page(self, page: int, client: Client | None = None) -> dict | None:
        """The counters page: the whole drive's for an admin (and the metrics endpoint);
        for any other client, its owner's own commands only (what others do on a shared
        drive is theirs: docs/threat-model.md)."""
        if page != LOG_PAGE_COUNTERS:
            return None
        if client is not None and not client.admin:
            own = ffi.new("sde_class_stats[9]")
            lib.sde_dev_owner_stats(self.dev, client.uid, client.token, own)
            return {"page": page, "scope": "owner", "classes": _class_counters(own),
                    "timing": self.timing, "clock": self.clock,
                    "quotas": self.quotas.as_dict()}
        st = ffi.new("sde_dev_stats *")
        lib.sde_dev_get_stats(self.dev, st)
        classes = _class_counters(st.cls)
        budget = ffi.new("sde_budget *")
        lib.sde_dev_budget(self.dev, budget)
        compute = {name: {"calls": k.calls, "ops": k.ops, "bytes": k.bytes,
                          "device_ns": k.device_ns, "host_ns": k.host_ns,
                          "host_lag_calls": k.host_lag_calls}
                   for name, k in kernel_stats(budget).items()}
        ms = ffi.new("sde_model_stats *")
        lib.sde_dev_model_stats(self.dev, ms)
        model = {name: getattr(ms, name) for name, _ in ffi.typeof("sde_model_stats").fields}
        return {"page": page, "scope": "device", "classes": classes,
                "broken_queues": st.broken_queues,
                "retrieval": self.retrieval.stats(),
                "timing": self.timing, "clock": self.clock, "held": st.held,
                "host_lag": st.host_lag, "model": model,
                "compute": compute,
                "compute_utilization": lib.sde_budget_utilization(budget,
                                                                   self.device_now_ns()),
                "compute_busy_until_ns": max(budget.busy_until_ns[0:max(1, budget.units)]),
                "sleeps": st.sleeps, "wakeups": st.wakeups,
                # idle spins given up because the data plane was descheduled mid-spin
                "spin_backoffs": st.spin_backoffs,
                # sleeps at once, not after a spin: a client waited on the data plane's CPU
                "spin_shared_cpu": st.spin_shared_cpu,
                # completion eventfd writes: a client asleep woken (one per batch posted)
                "client_kicks": st.client_kicks,
                # the data plane's scheduler slice asked for (0: the kernel's default)
                "data_plane_slice_ns": st.slice_ns,
                "faults_injected": st.faults_injected, "pins": st.pins,
                # KV changes held back behind an in-flight put of the same key
                "key_waits": st.key_waits,
                # virtual time: commands started at their turn, behind compute commands
                "deferred": st.deferred,
                "power_cut": {"enabled": self.power_cut, "cache_destages": st.cache_destages,
                              "undo_failures": st.undo_failures},
                # per uid; waits: passes that left a uid's commands unfetched
                "quotas": {**self.quotas.as_dict(), "waits": st.quota_waits,
                           "uid_inflight_peak": st.uid_inflight_peak},
                "logical_bytes": self.store.logical_bytes,
                "physical_bytes": self.store.physical_bytes,
                "store": self.store.info()}

    def _admin(self) -> None:
        cmds = ffi.new("sde_admin_cmd[64]")
        while True:
            n = lib.sde_dev_admin_pop(self.dev, cmds, 64)
            if n <= 0:
                return
            for i in range(n):
                a = cmds[i]
                if a.sqe.opcode in RETRIEVAL_OPS:  # long: on the retrieval worker
                    sqe = {name: getattr(a.sqe, name) for name in SQE_FIELDS}
                    self.retrieval.submit((a.qp, a.client, a.t0_ns, sqe))
                    continue
                try:
                    out = self.admin.run(self.clients.get(a.client), a.sqe)
                except Exception:  # a bug on our side: the client gets an error, we go on
                    log.exception("command %d failed", a.sqe.opcode)
                    out = Outcome(STATUS["INTERNAL"])
                cqe = ffi.new("sde_cqe *", {"cid": a.sqe.cid, "status": out.status,
                                            "result": out.result})
                lib.sde_dev_complete(self.dev, a.qp, cqe, a.t0_ns, a.sqe.opcode, out.bytes, 0)

    def complete_host(self, qp: int, sqe: dict, t0_ns: int, status: int, result: int,
                      nbytes: int, device_ns: float) -> None:
        """Complete a command the retrieval worker ran, at its modelled time: the data plane
        holds it until then (real clock), or stamps it (virtual clock)."""
        if self.timing == "off" or status != STATUS["SUCCESS"]:
            dtime = 0
        elif self.clock == "virtual":
            dtime = int(sqe["submit_time_ns"] + device_ns)
        else:
            dtime = max(1, int(device_ns))
        cqe = ffi.new("sde_cqe *", {"cid": sqe["cid"], "status": status, "result": result,
                                    "device_time_ns": dtime})
        lib.sde_dev_complete(self.dev, qp, cqe, t0_ns, sqe["opcode"], nbytes, 0)

    def visible_namespaces(self, client: Client | None) -> set[int]:
        return set(self._visible(client))

    # -- the drive's clock and prefix index --
    def device_now_ns(self) -> int:
        """The drive's clock: since the daemon started (real), or the latest submission stamp
        (virtual)."""
        if self.clock == "virtual":  # block I/O stamps the model, compute the data plane
            ms = ffi.new("sde_model_stats *")
            lib.sde_dev_model_stats(self.dev, ms)
            return int(max(lib.sde_dev_clock_ns(self.dev), ms.horizon_ns))
        return int(lib.sde_dev_clock_ns(self.dev))

    # -- namespaces, kept in the store on the media with their owners --
    def _visible(self, client: Client | None) -> dict:
        """The namespaces a client may use: shared ones and its owner's own (the data plane
        applies the same rule, c/dev/dev_core.c, dev_ns_visible)."""
        return {nsid: ns for nsid, ns in self.store.namespace_table().items()
                if ns.flags & lib.SDE_NS_SHARED
                or (client is not None and (ns.uid, ns.token) == (client.uid, client.token))}

    def namespace_list(self, client: Client | None, all_owners: bool = False) -> list[dict]:
        """The namespaces a client may use; all_owners (an admin's): every namespace, each
        with its owner's uid and whether the admin itself may use it."""
        mine = self._visible(client)
        table = self.store.namespace_table() if all_owners else mine
        out = []
        for nsid, ns in sorted(table.items()):
            row = {"nsid": nsid, "bytes": ns.bytes, "start": ns.offset,
                   "shared": bool(ns.flags & lib.SDE_NS_SHARED)}
            if all_owners:
                row.update(uid=ns.uid, mine=nsid in mine)
            out.append(row)
        return out

    def create_namespace(self, nbytes: int, client: Client | None, shared: bool = False) -> int:
        """Raises QuotaExceeded past the creator's uid's namespace quotas."""
        # a request the drive cannot hold at all is its refusal (StoreFull), not the quota's
        if client is not None and nbytes <= self.store.info()["free_bytes"]:
            used = self._usage(client.uid)
            why = (refusal(self.quotas, client.uid, used, "namespaces")
                   or refusal(self.quotas, client.uid, used, "namespace_bytes", nbytes))
            if why:
                log.warning("client %d: %s", client.cid, why)
                raise QuotaExceeded(why)
        # a shared namespace records its creator too: only it (or an admin) may delete it
        owner = None if client is None else (client.uid, client.token)
        nsid, offset = self.store.ns_create(nbytes, owner, shared=shared or owner is None)
        # zeroed before anyone can read it: the space may have held another client's
        # namespace or values (a punched hole or BLKZEROOUT, not a write of every block)
        r = lib.sde_dev_zero(self.dev, offset, nbytes) if nbytes else 0
        if r < 0:
            self.store.ns_delete(nsid)
            raise OSError(-r, f"cannot zero the new namespace: {os.strerror(-r)}")
        lib.sde_dev_set_ns(self.dev, nsid, self.store.namespace_table()[nsid])
        log.info("namespace %d created: %d bytes at %d, %s", nsid, nbytes, offset,
                 ("shared, by " if shared or owner is None else "owner ")
                 + (f"uid {owner[0]}" if owner else "the daemon"))
        return nsid

    def delete_namespace(self, nsid: int, client: Client, any_owner: bool = False) -> None:
        """Raises KeyNotFound for a namespace the client may not use, PermissionError for a
        shared one it did not create; any_owner (an admin's request, checked by the
        caller): any namespace."""
        ns = self.store.namespace_table().get(nsid)
        admin = any_owner
        if ns is None or not (admin or nsid in self._visible(client)):
            raise KeyNotFound(nsid)  # another owner's is as if it did not exist
        if not admin and (ns.uid, ns.token) != (client.uid, client.token):
            raise PermissionError(f"namespace {nsid} is shared: only its creator or an "
                                  "admin deletes it")
        # the data plane stops taking its commands first; a put already under way fails
        # at its commit (the store checks the namespace's generation).  Then its space is
        # given back only once every command started before is done: a block read or
        # write, or a retrieve, still in flight would otherwise land on space the next
        # namespace or value was given (another owner's)
        lib.sde_dev_set_ns(self.dev, nsid, ffi.NULL)
        mark = lib.sde_dev_ctx_mark(self.dev)
        deadline = time.monotonic() + DRAIN_S
        while lib.sde_dev_inflight_before(self.dev, mark) > 0:
            if time.monotonic() > deadline:
                lib.sde_dev_set_ns(self.dev, nsid, ns)  # still in use: it stays
                raise TimeoutError(f"namespace {nsid}: commands still in flight after "
                                   f"{DRAIN_S:.0f} s")
            time.sleep(0.0005)
        self.store.ns_delete(nsid)
        # rules naming it would otherwise hit the next namespace given its id
        for rule in self._fault_rules(None):
            if rule["nsid"] == nsid:
                self._clear_fault(rule["id"])
        log.info("namespace %d deleted", nsid)


def _class_counters(cls) -> dict:
    """The per-class counters of the log page, from sde_class_stats[9] (CLASS_NAMES' order)."""
    out = {}
    for i, name in enumerate(CLASS_NAMES):
        c = cls[i]
        out[name] = {
            "commands": c.commands, "errors": c.errors, "bytes": c.bytes,
            "bytes_copied": c.bytes_copied,
            "mean_latency_ns": c.lat_ns_total / c.commands if c.commands else 0.0,
            "latency_ns_total": c.lat_ns_total,
            # bucket b holds latencies in [2^b, 2^(b+1)) ns
            "latency_histogram_log2_ns": {str(b): c.lat_hist[b] for b in range(64)
                                          if c.lat_hist[b]},
        }
    return out


def check_power_cut(profile: Profile, media: Media) -> None:
    """Power cuts need something to lose (a volatile write cache) and media that outlives
    the daemon (not mem:)."""
    if not profile.write_cache.enabled:
        raise StoreError(f"--power-cut needs a volatile write cache: profile {profile.name} "
                         "has write_cache.enabled false (every write is durable already)")
    if media.spec.kind == "mem":
        raise StoreError("--power-cut needs file or block-device media: mem: media does not "
                         "outlive the daemon")


def check_socket_path(path: str) -> bool:
    """Whether a socket exists at path (maybe stale); anything else there is refused, never
    removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise StoreError(f"{path} exists and is not a socket: refusing to replace it")
    return True


def open_store(media: Media, format_media: bool, durable_on_completion: bool,
               profile: Profile | None = None, journal_blocks: int = 0) -> Store:
    """Serve media that holds an ssdemu device; format blank media (or any, with
    --format); refuse everything else with one clear line."""
    state = probe(media)
    if format_media or state == "blank":
        log.info("formatting %s", media.spec)
        kv = profile.kv if profile else None
        return Store.format(media, durable_on_completion,
                            index_keys=kv.index_keys if kv else 0,
                            max_value=kv.max_value_bytes if kv else DEFAULT_MAX_VALUE,
                            journal_blocks=journal_blocks)
    if state == "foreign":
        raise StoreError(f"{media.spec} holds something that is not an ssdemu device; "
                         "give --format to overwrite it")
    return Store.open(media, durable_on_completion)


def _close_mapping(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass  # cffi still holds a view: the mapping goes when that view does


def set_realtime(tid: int) -> None:
    os.sched_setscheduler(tid, os.SCHED_RR, os.sched_param(REALTIME_PRIORITY))


def check_realtime() -> None:
    """serve --realtime, before anything is opened: may this process run a thread SCHED_RR?
    (tried on this thread, then undone)"""
    tid = threading.get_native_id()
    try:
        set_realtime(tid)
    except OSError as e:
        raise SsdemuError(f"--realtime: threads of this process cannot run SCHED_RR "
                          f"({e.strerror}: it needs CAP_SYS_NICE or an RLIMIT_RTPRIO of 1 "
                          "or more)") from None
    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


def serve(profile: Profile, media: Media, socket_path: str,
          allowed_uids: set[int] | None = None, format_media: bool = False,
          timing: str = "detailed", clock: str = "real", journal_blocks: int = 0,
          group: int | None = None, quotas: Quotas | None = None,
          power_cut: bool = False, metrics: str | None = None,
          admin_key: str | None = None, poll: bool = False, realtime: bool = False,
          media_io: str = "auto") -> int:
    check_socket_path(socket_path)  # before the media is touched
    if realtime:
        check_realtime()
    if power_cut:
        check_power_cut(profile, media)
    daemon = Daemon(profile, media, socket_path, allowed_uids, format_media, timing, clock,
                    journal_blocks, group, quotas, power_cut, metrics, admin_key, poll,
                    realtime, media_io)
    # handlers before the socket exists: a client (or a test) that sees the socket may stop
    # us at once, and that must be a clean stop
    signal.signal(signal.SIGTERM, daemon.request_stop)
    signal.signal(signal.SIGINT, daemon.request_stop)
    signal.set_wakeup_fd(daemon.signal_w.fileno(), warn_on_full_buffer=False)
    try:
        daemon.start()
        daemon.serve_forever()
    finally:
        signal.set_wakeup_fd(-1)
        daemon.signal_r.close()
        daemon.signal_w.close()
    return 0
