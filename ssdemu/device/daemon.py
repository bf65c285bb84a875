"""`ssdemu serve`: the device process.

The daemon composes its jobs: sessions.py (the control socket's clients), registration.py
(their queue pairs and buffers), power.py (fault rules, surprise removal, power cuts),
namespaces.py, logpage.py (identify and the log page); admin.py runs the admin commands the
data plane hands over, retrieval.py the retrieval worker.  This module is the lifecycle: the
device core, its store and firmware brought up, the socket, the select loop, shutdown.

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
import logging
import os
import selectors
import signal
import socket
import stat
import sys
import threading
import time

from ssdemu.device import _device
from ssdemu.device.admin import Admin, Outcome
from ssdemu.device.logpage import CLASS_NAMES, LOG_PAGE_COUNTERS, LogPages  # noqa: F401
from ssdemu.device.media import Media
from ssdemu.device.namespaces import Namespaces
from ssdemu.device.power import FaultsAndPower
from ssdemu.device.quotas import Quotas
from ssdemu.device.registration import Registration
from ssdemu.device.retrieval import Retrieval
from ssdemu.device.sessions import Client, Sessions
from ssdemu.device.store import DEFAULT_MAX_VALUE, Store, StoreError, probe
from ssdemu.errors import SsdemuError
from ssdemu.sim.profile import Profile
from ssdemu.sim.timing import budget_of, model_param_fields
from ssdemu_wire import control, owner_key
from ssdemu_wire.layout import STATUS

_HOST_CQE = threading.local()  # complete_host's completion, per thread

ffi, lib = _device.ffi, _device.lib

log = logging.getLogger("ssdemu.serve")

# serve --media-io: "auto" runs the reads and writes of shared-memory media (mem:, a file on
# tmpfs) in the data plane's thread and the rest through io_uring; "io_uring" all through it
MEDIA_IO = ("auto", "io_uring")
REALTIME_PRIORITY = 1  # serve --realtime: the lowest SCHED_RR priority, above every normal task
# serve --kv-layout: how the firmware lays a stored block out (firmware/blockfmt.py): by
# head (the default), or in the token order of format version 1, for comparing the two
KV_LAYOUTS = ("head", "token")
# read by sde_fw_load_python, which the C side calls with no daemon at hand (one per process)
_kv_layout = {"by_head": True}



@ffi.def_extern()
def sde_fw_load_python(addresses) -> int:
    """The firmware's entry points' addresses, for the C side's first compute command
    (c/fw/sde_fw.c, sde_fw_ensure: called once, from a C thread; cffi takes the GIL)."""
    try:
        from firmware import entry

        for i, a in enumerate(entry.addresses(by_head=_kv_layout["by_head"])):
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
                 realtime: bool = False, media_io: str = "auto", kv_layout: str = "head",
                 retrieval_host_bytes: int | None = None):
        if media_io not in MEDIA_IO:
            raise ValueError(f"media_io is one of {', '.join(MEDIA_IO)}, not {media_io!r}")
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout is one of {', '.join(KV_LAYOUTS)}, not {kv_layout!r}")
        _kv_layout["by_head"] = kv_layout == "head"  # before the firmware's first load
        self.profile = profile
        self.poll = poll  # the data plane never sleeps (serve --poll)
        self.realtime = realtime  # the data plane runs SCHED_RR (serve --realtime)
        # the owner key (hex) whose holder is an admin besides the daemon's uid and root
        self.admin_token = owner_key.token(admin_key) if admin_key else None
        self.metrics_address = metrics
        self.metrics_server = None
        self.quotas = quotas or Quotas()  # per uid; resolved once the store's size is known
        self.group = group  # the socket's group (mode 0660): its members may connect
        self.media = media
        self.socket_path = socket_path
        self.allowed_uids = allowed_uids if allowed_uids is not None else {os.getuid(), 0}
        self.timing, self.clock = timing, clock
        self.power_cut = power_cut
        # the host memory the retrieval workers keep decoded blocks in (None: their default)
        self.retrieval_host_bytes = retrieval_host_bytes
        self._start_core(media_io)
        self.store = open_store(media, format_media, not profile.write_cache.enabled,
                                profile, journal_blocks)
        self._attach_store()
        self._start_firmware()
        self.admin = Admin(self)
        self.retrieval = Retrieval(self)
        self.clients: dict[int, Client] = {}
        # the daemon's jobs besides its lifecycle, each a part it composes
        self.sessions = Sessions(self)  # the control socket's clients
        self.registration = Registration(self)  # their queue pairs and buffers
        self.faults = FaultsAndPower(self)  # fault rules, removal, power cuts
        self.namespaces = Namespaces(self)
        self.logs = LogPages(self)  # identify, the log page
        self._stop_flag = ffi.new("int *", 0)
        self._stopping = False
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

    def _start_core(self, media_io: str) -> None:
        """The C device core on the media, and its timing model."""
        profile, media, timing, clock = self.profile, self.media, self.timing, self.clock
        out = ffi.new("sde_dev **")
        r = lib.sde_dev_new(media.fd, media.size, media.lba_size, profile.queue.io_depth,
                            lib.SDE_ENG_NO_INLINE if media_io == "io_uring" else 0, out)
        if r < 0:
            raise OSError(-r, f"cannot start the device core: {os.strerror(-r)}")
        self.dev = out[0]
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

    def _attach_store(self) -> None:
        """The store's namespaces and the uid quotas into the data plane, then the store."""
        profile = self.profile
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
        if self.power_cut:
            check_power_cut(profile, self.media)
            r = lib.sde_dev_set_power_cut(self.dev, profile.write_cache.bytes)
            if r < 0:
                raise OSError(-r, "cannot start power-cut emulation")

    def _start_firmware(self) -> None:
        """The firmware: as many threads as the drive has compute units, at most one per
        core of this host (more would only take turns)."""
        profile = self.profile
        # the firmware: as many threads as the drive has compute units, at most one per core
        # of this host (more would only take turns)
        c = profile.compute
        threads = max(1, min(c.units, os.cpu_count() or 1, lib.SDE_FW_MAX_THREADS))
        lib.sde_fw_set_loader(lib.sde_fw_load_python)
        r = lib.sde_dev_set_firmware(self.dev, 0, 0, 0, 0, threads,  # loaded on first use
                                     budget_of(profile).copy_into(ffi))
        if r < 0:
            raise OSError(-r, f"cannot start the firmware: {os.strerror(-r)}")

    # -- lifecycle --
    def start(self) -> None:
        if self.metrics_address:  # before the socket: once it exists, everything serves
            from ssdemu.device.metrics import serve_metrics

            # scraped from the server's own thread: the log page takes the core's locks
            self.metrics_server = serve_metrics(self.metrics_address,
                                                lambda: self.logs.page(LOG_PAGE_COUNTERS))
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
                        self.sessions.accept()
                    elif kind == "admin":
                        self._admin()
                    else:
                        self.sessions.message(client)
                except Exception:  # a bug on our side: log it, drop that client, go on
                    log.exception("serving %s failed", kind)
                    if client is not None and client.cid in self.clients:
                        self.sessions.drop_client(client)
            self.faults.after_replies()
            self.sessions.reap_drained()
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
            self.sessions.drop_client(client)
        deadline = time.monotonic() + 5
        while self.sessions.draining and time.monotonic() < deadline:
            self.sessions.reap_drained(force=True)
        if self.listener:
            self.sel.unregister(self.listener)
            self.listener.close()
            self.remove_socket()
        if stuck:  # freeing under a running data plane would crash: leave it to exit()
            log.error("the data plane did not stop; exiting without freeing the device")
        else:
            self.store.flush()  # the data plane drained its media I/O before it returned
            self.store.close()
            lib.sde_dev_free(self.dev)
        self.dev = ffi.NULL
        log.info("stopped")

    def remove_socket(self) -> None:
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

    def _admin(self) -> None:
        cmds = ffi.new("sde_admin_cmd[64]")
        while True:
            n = lib.sde_dev_admin_pop(self.dev, cmds, 64)
            if n <= 0:
                return
            for i in range(n):
                a = cmds[i]  # not TOPK_PAGES nor ATTEND: the retrieval workers take those
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
        cqe = getattr(_HOST_CQE, "cqe", None)
        if cqe is None:  # each worker thread's own, reused: sde_dev_complete copies it
            cqe = _HOST_CQE.cqe = ffi.new("sde_cqe *")
        cqe.cid, cqe.status, cqe.result, cqe.device_time_ns = sqe["cid"], status, result, dtime
        lib.sde_dev_complete(self.dev, qp, cqe, t0_ns, sqe["opcode"], nbytes, 0)

    # -- the drive's clock and prefix index --
    def device_now_ns(self) -> int:
        """The drive's clock: since the daemon started (real), or the latest submission stamp
        (virtual)."""
        if self.clock == "virtual":  # block I/O stamps the model, compute the data plane
            ms = ffi.new("sde_model_stats *")
            lib.sde_dev_model_stats(self.dev, ms)
            return int(max(lib.sde_dev_clock_ns(self.dev), ms.horizon_ns))
        return int(lib.sde_dev_clock_ns(self.dev))


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


# The Python threads' turn-taking (sys.setswitchinterval): a retrieval worker running one
# client's long command in Python holds the GIL up to this long before another's short
# command may go on (bench fairness: at CPython's 5 ms, a one-block TOPK beside a 16,384-block
# one waited 85 ms at p99, each of its dozen GIL hand-overs a switch interval)
SWITCH_INTERVAL_S = 0.00005


def tune_process() -> None:
    """The daemon process's own settings: the GIL's switch interval (see above)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def serve(profile: Profile, media: Media, socket_path: str,
          allowed_uids: set[int] | None = None, format_media: bool = False,
          timing: str = "detailed", clock: str = "real", journal_blocks: int = 0,
          group: int | None = None, quotas: Quotas | None = None,
          power_cut: bool = False, metrics: str | None = None,
          admin_key: str | None = None, poll: bool = False, realtime: bool = False,
          media_io: str = "auto", kv_layout: str = "head",
          retrieval_host_bytes: int | None = None) -> int:
    check_socket_path(socket_path)  # before the media is touched
    tune_process()
    if realtime:
        check_realtime()
    if power_cut:
        check_power_cut(profile, media)
    daemon = Daemon(profile, media, socket_path, allowed_uids, format_media, timing, clock,
                    journal_blocks, group, quotas, power_cut, metrics, admin_key, poll,
                    realtime, media_io, kv_layout, retrieval_host_bytes)
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
