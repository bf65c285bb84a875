"""The device process with real client processes: block I/O, validation of every SQE field,
clients that die, other uids, shutdown."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostlib
from ssdemu.tools.daemon_process import DaemonProcess
from ssdemu_wire import control
from ssdemu_wire.layout import CQE_DTYPE, OPCODES, SQE_DTYPE, STATUS, ffi

NS_BYTES = 16 << 20


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(str(tmp_path / "sde.sock"))
    yield d
    code, err = d.terminate()
    assert code == 0, err


@pytest.fixture
def dev(daemon):
    with hostlib.connect(daemon.socket_path) as d:
        d.nsid = d.ns_create(NS_BYTES)
        yield d


def test_layout_matches_c():
    assert SQE_DTYPE.itemsize == ffi.sizeof("sde_sqe") == 64
    assert CQE_DTYPE.itemsize == ffi.sizeof("sde_cqe") == 32
    for dtype, ctype in ((SQE_DTYPE, "sde_sqe"), (CQE_DTYPE, "sde_cqe")):
        for name, field in ffi.typeof(ctype).fields:
            assert dtype.fields[name][1] == field.offset == ffi.offsetof(ctype, name)
    # the NVMe-like offsets the docs table states
    assert [SQE_DTYPE.fields[n][1] for n in ("opcode", "cid", "nsid", "buf", "length",
                                              "buf_offset", "lba", "param0",
                                              "submit_time_ns")] == [0, 2, 4, 8, 12, 16, 24,
                                                                     40, 56]


@settings(deadline=None, max_examples=15,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blocks=st.integers(1, 2048), lba=st.integers(0, 1000), seed=st.integers(0, 2**31),
       registered=st.booleans())
def test_block_io_round_trip(dev, blocks, lba, seed, registered):
    n = min(blocks * 512, 1 << 20)
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    if registered:
        src, dst = dev.alloc(n), dev.alloc(n)
        src[:] = data
    else:
        src, dst = data, np.zeros(n, np.uint8)  # plain arrays: the bounce path
    assert dev.write(dev.nsid, lba, src) == n
    assert dev.read(dev.nsid, lba, dst) == n
    assert np.array_equal(dst, data)
    if registered:
        dev.free(src)
        dev.free(dst)


def test_zero_copy_is_measured(dev):
    buf = dev.alloc(1 << 20)
    dev.write(dev.nsid, 0, buf)
    before = dev.log()["classes"]["read"]["bytes_copied"]
    for _ in range(4):
        dev.read(dev.nsid, 0, buf)
    assert dev.log()["classes"]["read"]["bytes_copied"] == before
    plain = np.zeros(65536, np.uint8)
    dev.read(dev.nsid, 0, plain)
    assert dev.log()["classes"]["read"]["bytes_copied"] == before + 65536


def _raw(dev, **fields):
    opcode = fields.pop("opcode", OPCODES["READ"])
    f = dev.submit(opcode, "raw", **fields)
    with pytest.raises(hostlib.DeviceError) as e:
        f.result(timeout=10)
    return e.value.status_name


def test_every_field_is_validated(dev, daemon, tmp_path):
    buf = dev.alloc(8192)
    (h, off) = dev._locate(buf)
    good = dict(nsid=dev.nsid, buf=h, buf_offset=off, length=4096, lba=0)
    assert dev.submit(OPCODES["READ"], "ok", **good).result() == 4096
    cases = {
        "INVALID_OPCODE": dict(opcode=99),
        "INVALID_FIELD": dict(flags=1),
        "INVALID_NAMESPACE": dict(nsid=42),
        "INVALID_BUFFER": dict(buf=999),
        "LBA_OUT_OF_RANGE": dict(lba=NS_BYTES // 512),
    }
    for status, bad in cases.items():
        assert _raw(dev, **(good | bad)) == status, bad
    assert _raw(dev, **(good | dict(length=0))) == "INVALID_FIELD"
    assert _raw(dev, **(good | dict(length=1000))) == "INVALID_FIELD"
    assert _raw(dev, **(good | dict(length=2 << 20))) == "INVALID_FIELD"
    assert _raw(dev, **(good | dict(buf_offset=8192))) == "INVALID_BUFFER"
    assert _raw(dev, **(good | dict(buf_offset=100))) == "INVALID_BUFFER"
    assert _raw(dev, **(good | dict(lba=NS_BYTES // 512 - 1, length=8192))) == \
        "LBA_OUT_OF_RANGE"
    assert _raw(dev, opcode=OPCODES["FLUSH"], nsid=77) == "INVALID_NAMESPACE"
    assert _raw(dev, opcode=OPCODES["NS_DELETE"], nsid=77) == "INVALID_NAMESPACE"
    assert _raw(dev, opcode=OPCODES["GET_LOG"], param0=99, buf=h, length=4096) == \
        "INVALID_FIELD"
    # another client's buffer handle is refused like a missing one
    with hostlib.connect(daemon.socket_path) as other:
        theirs = other.alloc(4096)
        th, _ = other._locate(theirs)
        assert _raw(dev, **(good | dict(buf=th))) == "INVALID_BUFFER"
        assert other.read(dev.nsid, 0, theirs) == 4096  # and they carry on
    assert dev.submit(OPCODES["READ"], "ok", **good).result() == 4096


CLIENT = textwrap.dedent("""
    import os, sys, numpy as np, hostlib
    dev = hostlib.connect(sys.argv[1])
    ns = int(sys.argv[2])
    bufs = [dev.alloc(1 << 20) for _ in range(8)]
    futures = [dev.read_async(ns, 0, b) for b in bufs]  # in flight, never reaped
    print("submitted", flush=True)
    os.kill(os.getpid(), 9)
""")


def test_killed_client_leaves_daemon_healthy_and_frees_its_memory(dev, daemon):
    dev.write(dev.nsid, 0, dev.alloc(1 << 20))
    fds, maps = daemon.open_fds(), daemon.mappings("ssdemu-buf")
    for _ in range(3):
        p = subprocess.run([sys.executable, "-c", CLIENT, daemon.socket_path, str(dev.nsid)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == -signal.SIGKILL and "submitted" in p.stdout, p.stderr
    deadline = time.monotonic() + 10
    while (daemon.open_fds() > fds or daemon.mappings("ssdemu-buf") > maps) and \
            time.monotonic() < deadline:
        dev.nop()  # the daemon reaps departed clients between requests
        time.sleep(0.05)
    assert daemon.open_fds() == fds
    assert daemon.mappings("ssdemu-buf") == maps
    out = dev.alloc(4096)
    assert dev.read(dev.nsid, 0, out) == 4096


OTHER_UID = textwrap.dedent("""
    import os, sys, hostlib
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
    try:
        hostlib.connect(sys.argv[1])
    except hostlib.ConnectError as e:
        print(e)
""")


def test_other_uid_is_refused():
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another uid")
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="ssdemu-uid-")  # reachable by uid 65534, unlike pytest's
    os.chmod(d, 0o755)
    daemon = DaemonProcess(os.path.join(d, "sde.sock"))
    try:
        # the socket is 0600: another user cannot even reach it
        p = subprocess.run([sys.executable, "-c", OTHER_UID, daemon.socket_path],
                           capture_output=True, text=True, timeout=60, cwd="/")
        assert "cannot reach ssdemu" in p.stdout and "Permission denied" in p.stdout, \
            p.stdout + p.stderr
        # and if the mode let it, SO_PEERCRED still refuses it, with the reason
        os.chmod(daemon.socket_path, 0o666)
        p = subprocess.run([sys.executable, "-c", OTHER_UID, daemon.socket_path],
                           capture_output=True, text=True, timeout=60, cwd="/")
        assert "uid 65534 is not allowed" in p.stdout, p.stdout + p.stderr
        assert "refused pid" in daemon.terminate()[1]
    finally:
        daemon.kill()
        shutil.rmtree(d, ignore_errors=True)


def test_protocol_version_mismatch_is_refused(daemon):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(daemon.socket_path)
    control.send(s, {"op": "hello", "version": 999})
    reply, _ = control.recv(s)
    s.close()
    assert not reply["ok"] and "protocol version 999 is not supported" in reply["error"]


def test_garbage_on_the_socket_drops_only_that_client(daemon, dev):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(daemon.socket_path)
    s.send(b"\xff\x00 not json")
    s.close()
    dev.nop()
    assert dev.identify()["profile"] == "star2000d"


def test_sigterm_with_commands_in_flight_ends_cleanly(tmp_path):
    d = DaemonProcess(str(tmp_path / "s.sock"))
    dev = hostlib.connect(d.socket_path)
    ns = dev.ns_create(NS_BYTES)
    bufs = [dev.alloc(1 << 20) for _ in range(16)]
    futures = [dev.read_async(ns, 0, b) for b in bufs]
    code, err = d.terminate()
    assert code == 0, err
    assert "stopped" in err
    outcomes = set()
    for f in futures:
        try:
            outcomes.add(f.result(timeout=10))
        except hostlib.DeviceGoneError:
            outcomes.add("gone")
    assert outcomes <= {1 << 20, "gone"}
    with pytest.raises((hostlib.DeviceGoneError, hostlib.ConnectError)):
        dev.nop()
    assert not os.path.exists(d.socket_path)


def test_bad_media_and_profile_exit_with_one_line(tmp_path):
    for args, msg in ((["--media", "mem:lots"], "bad media spec"),
                      (["--media", "mem:1M", "--profile", "nope"], "no profile 'nope'")):
        p = subprocess.run([sys.executable, "-m", "ssdemu", "serve", "--socket",
                            str(tmp_path / "x.sock"), *args], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 1
        assert p.stderr.strip().splitlines()[-1].startswith("ssdemu: error: ")
        assert msg in p.stderr


def test_admin_commands(dev):
    ident = dev.identify()
    assert ident["media_bytes"] == 64 << 20 and ident["logical_block_bytes"] == 512
    assert 60 << 20 < ident["capacity_bytes"] < 64 << 20  # less the superblock and journal
    assert "READ" in ident["commands"]
    second = dev.ns_create(8 << 20)
    assert {n["nsid"] for n in dev.namespaces()} == {dev.nsid, second}
    with pytest.raises(hostlib.CapacityError):
        dev.ns_create(1 << 30)
    with pytest.raises(hostlib.InvalidCommandError):
        dev.ns_create(1000)
    dev.ns_delete(second)
    with pytest.raises(hostlib.NamespaceError):
        dev.read(second, 0, np.zeros(512, np.uint8))
    page = dev.log()
    assert page["classes"]["admin"]["commands"] >= 4


def test_write_zeroes_deallocate_flush(dev):
    buf = dev.alloc(65536)
    buf[:] = 7
    dev.write(dev.nsid, 0, buf)
    dev.write_zeroes(dev.nsid, 0, 4096)
    dev.deallocate(dev.nsid, 8, 4096)
    dev.flush(dev.nsid)
    dev.read(dev.nsid, 0, buf)
    assert (buf[:8192] == 0).all() and (buf[8192:] == 7).all()


def test_many_clients_at_once(daemon):
    code = textwrap.dedent("""
        import sys, numpy as np, hostlib
        dev = hostlib.connect(sys.argv[1])
        ns = dev.ns_create(1 << 20)
        qp2 = dev.queue_pair(64)
        b = dev.alloc(1 << 20)
        for i in range(20):
            b[:] = i
            dev.write(ns, 0, b)
            b[:] = 255
            dev.read(ns, 0, b)
            assert (b == i).all()
        print("ok")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, daemon.socket_path],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "ok", err


def test_broken_ring_protocol_stops_only_that_queue(dev, daemon):
    with hostlib.connect(daemon.socket_path) as bad:
        hdr = np.frombuffer(bad.qp.mm, dtype=np.uint32)
        tail_index = ffi.offsetof("sde_ring_hdr", "sq_tail") // 4
        hdr[tail_index] += 10 * bad.qp.entries  # a tail no ring can have
        os.eventfd_write(bad.qp.doorbell_fd, 1)
        with pytest.raises(hostlib.DeviceGoneError):
            bad.nop()
    dev.nop()
    assert dev.log()["broken_queues"] == 1


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("kind,media_io,want", [
    ("mem", "auto", "inline"), ("mem", "io_uring", "io_uring"),
    ("file-tmpfs", "auto", "inline"), ("file-ext4", "auto", "io_uring"),
    ("block", "auto", "io_uring")])
def test_shared_memory_media_is_reached_inline_and_the_rest_through_io_uring(
        tmp_path, request, kind, media_io, want):
    """mem: and tmpfs files: the data plane reads and writes them in its own thread (tmpfs
    gives io_uring no non-blocking path: its worker threads did it); files on disk and block
    devices (whose node lies on devtmpfs, tmpfs's type) through io_uring.  Either way the
    same bytes come back, of block and KV commands, at the media's end too."""
    from conftest import media_of_kind

    with media_of_kind(kind, request) as spec:
        d = DaemonProcess(str(tmp_path / "m.sock"), media=spec,
                          extra=["--media-io", media_io, "--format"])
        try:
            with hostlib.connect(d.socket_path) as c:
                assert c.identify()["media_io"] == want
                nsid = c.ns_create(1 << 20)
                rng = np.random.default_rng(5)
                data = c.alloc(1 << 20)
                data[:] = rng.integers(0, 256, data.size, dtype=np.uint8)
                futures = [c.write_async(nsid, lba, data[lba * 512:(lba + 8) * 512])
                           for lba in range(0, 2048, 8)]
                for f in futures:
                    f.result()
                back = c.alloc(1 << 20)
                assert c.read(nsid, 0, back) == 1 << 20
                assert np.array_equal(back, data)
                with pytest.raises(hostlib.DeviceError):  # past the namespace's end
                    c.read(nsid, 2047, back[:8192])
                values = {b"k%d" % n: rng.integers(0, 256, n, dtype=np.uint8)
                          for n in (1, 4096, 70001, 1 << 20)}
                for k, v in values.items():
                    c.kv_put(k, v)
                for k, v in values.items():
                    out = np.empty(v.size, np.uint8)
                    assert c.kv_get(k, out) == v.size and np.array_equal(out, v)
        finally:
            code, err = d.terminate()
        assert code == 0, err


def test_idle_daemon_sleeps(dev, daemon):
    dev.nop()
    time.sleep(0.2)  # past the spin window
    before = _cpu_seconds(daemon.pid)
    time.sleep(1.0)
    # a polling loop would burn a whole core (1 s); asleep it uses next to nothing
    assert _cpu_seconds(daemon.pid) - before < 0.1


def test_a_polling_daemon_never_sleeps_and_needs_no_doorbell(tmp_path):
    """serve --poll: the data plane keeps a core busy (up to a second of CPU a second) and
    never asks for a wake-up, so commands spaced past the spin window ring no doorbell;
    without it the same commands do."""
    kicks = {}
    for poll in (False, True):
        d = DaemonProcess(str(tmp_path / f"p{int(poll)}.sock"), media="mem:16M",
                          extra=["--poll"] if poll else [])
        try:
            with hostlib.connect(d.socket_path) as dev:
                assert dev.identify()["poll"] is poll
                dev.nop()
                start = dev.qp.kicks
                for _ in range(20):
                    time.sleep(0.005)  # 100x the profile's 50 us spin window
                    dev.nop()
                kicks[poll] = dev.qp.kicks - start
                before = _cpu_seconds(d.pid)
                time.sleep(0.5)
                busy = _cpu_seconds(d.pid) - before
                # polling: up to a core (a loaded CI host with two test workers gives it
                # less); asleep: next to nothing
                assert busy > 0.15 if poll else busy < 0.05
        finally:
            code, err = d.terminate()
        assert code == 0, err
    assert kicks[True] == 0 and kicks[False] >= 15


def _sched_field(pid: int, tid: int, name: str) -> int:
    for line in open(f"/proc/{pid}/task/{tid}/sched"):
        if line.split(":")[0].strip() == name:
            return int(float(line.split(":")[1]))
    raise KeyError(name)


# serial: its neighbours would make the other worker's tests run on a busy host, and
# test_bench_neighbours checks that none spins on the host while its own tests run
@pytest.mark.serial
def test_the_data_plane_asks_for_the_shortest_slice_while_the_host_is_busy(daemon, dev):
    """Beside more CPU-bound processes than cores, the data plane thread, and no other of the
    daemon's own, runs with a 100 us slice (sched_setattr's runtime; its weight and nice
    unchanged), so that a wake-up picks it soon (c/common/sde_sched.h); the log says so.
    (io_uring's workers, which it starts, take its slice with them: they too are woken per
    I/O.)"""
    from ssdemu.bench.neighbours import Neighbours

    with Neighbours((os.cpu_count() or 1) + 1):
        deadline = time.monotonic() + 10
        while dev.log()["data_plane_slice_ns"] != 100_000:  # looked at while idle, per ms
            assert time.monotonic() < deadline, "the data plane never asked for the slice"
            time.sleep(0.01)
        tids = [int(t) for t in os.listdir(f"/proc/{daemon.pid}/task")
                if not open(f"/proc/{daemon.pid}/task/{t}/comm").read().startswith("iou-")]
        try:
            slices = [_sched_field(daemon.pid, t, "se.slice") for t in tids]
        except (OSError, KeyError):
            pytest.skip("this kernel shows no se.slice in /proc/PID/task/TID/sched")
    assert slices.count(100_000) == 1, slices
    short = tids[slices.index(100_000)]
    assert os.getpriority(os.PRIO_PROCESS, short) == os.getpriority(os.PRIO_PROCESS, daemon.pid)


def test_realtime_puts_the_data_plane_alone_on_sched_rr(tmp_path):
    """serve --realtime: the data plane thread, and no other, runs SCHED_RR; a process that
    may not (no CAP_SYS_NICE, RLIMIT_RTPRIO 0) gets one line and no socket."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run SCHED_RR threads and to drop the capability")
    d = DaemonProcess(str(tmp_path / "rt.sock"), media="mem:16M", extra=["--realtime"])
    try:
        with hostlib.connect(d.socket_path) as dev:
            assert dev.identify()["realtime"] is True
            dev.nop()
        tids = [int(t) for t in os.listdir(f"/proc/{d.pid}/task")]
        policies = [os.sched_getscheduler(t) for t in tids]
        assert policies.count(os.SCHED_RR) == 1, policies
        with hostlib.connect(d.socket_path) as dev:  # SCHED_RR kept: no fair slice asked
            assert dev.log()["data_plane_slice_ns"] == 0
    finally:
        code, err = d.terminate()
    assert code == 0, err
    sock = tmp_path / "no.sock"
    p = subprocess.run(["setpriv", "--bounding-set=-sys_nice", "prlimit", "--rtprio=0",
                        sys.executable, "-m", "ssdemu", "serve", "--media", "mem:16M",
                        "--socket", str(sock), "--realtime"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and not sock.exists()
    assert p.stderr.strip().splitlines() == [
        "ssdemu: error: --realtime: threads of this process cannot run SCHED_RR (Operation "
        "not permitted: it needs CAP_SYS_NICE or an RLIMIT_RTPRIO of 1 or more)"]


STEADY_CLIENT = textwrap.dedent("""
    import sys, numpy as np, hostlib
    dev = hostlib.connect(sys.argv[1])
    ns = dev.ns_create(1 << 20)
    b = dev.alloc(65536)
    print("ready", flush=True)
    for i in range(300):
        b[:] = i % 251
        dev.write(ns, 0, b)
        b[:] = 0
        dev.read(ns, 0, b)
        assert (b == i % 251).all()
    print("ok", flush=True)
""")


def test_other_client_process_unaffected_by_bad_commands(dev, daemon):
    p = subprocess.Popen([sys.executable, "-c", STEADY_CLIENT, daemon.socket_path],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    buf = dev.alloc(4096)
    h, off = dev._locate(buf)
    for _ in range(50):
        for bad in (dict(opcode=200), dict(nsid=999), dict(buf=h, length=3),
                    dict(buf=1023, length=4096), dict(buf=h, length=4096, lba=2**60)):
            fields = dict(nsid=dev.nsid) | bad
            op = fields.pop("opcode", OPCODES["READ"])
            with pytest.raises(hostlib.DeviceError):
                dev.submit(op, "bad", **fields).result(timeout=10)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and out.strip() == "ok", err


@settings(deadline=None, max_examples=60,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries({
    "opcode": st.integers(0, 255).filter(lambda o: not 16 <= o <= 20),
    "flags": st.sampled_from([0, 0, 1, 128]),
    "nsid": st.sampled_from([0, 1, 2, 64, 65, 2**32 - 1]),
    "buf": st.integers(0, 1100),
    "length": st.sampled_from([0, 1, 512, 4096, 1 << 20, (1 << 20) + 512, 2**32 - 512]),
    "buf_offset": st.sampled_from([0, 512, 4096, 2**63]),
    "lba": st.sampled_from([0, 1, 2**31, 2**63, 2**64 - 1]),
    "param0": st.integers(0, 2**64 - 1),
}), min_size=1, max_size=32))
def test_fuzzed_commands_always_complete_with_a_status(dev, cmds):
    """Whatever the fields, every command completes with a known status, nothing hangs, and
    the commands that are certainly wrong are refused (a validation that answered SUCCESS to
    everything would fail here)."""
    futures = dev.submit_batch(cmds)
    done = dev.reap(futures, len(futures), timeout=30)
    assert len(done) == len(futures)
    assert {f.status for f in futures} <= set(STATUS.values())
    handles = {h for _, _, h in dev._buffers}
    key_ops = {OPCODES[n] for n in ("KV_STORE", "KV_RETRIEVE", "KV_DELETE", "KV_EXIST",
                                    "KV_STORE_QUANTIZED", "KV_RETRIEVE_DEQUANTIZED", "PIN",
                                    "UNPIN")}
    io_ops = {OPCODES["READ"], OPCODES["WRITE"]}
    for cmd, f in zip(cmds, futures, strict=True):
        op = cmd["opcode"]
        if op not in OPCODES.values():
            assert f.status == STATUS["INVALID_OPCODE"], cmd
        elif op in key_ops:  # no key length given (param1 is 0): never a success
            assert f.status in (STATUS["INVALID_FIELD"], STATUS["INVALID_NAMESPACE"],
                                STATUS["KV_INVALID_KEY_SIZE"]), (cmd, f.status)
        elif op in io_ops and (cmd["flags"] or cmd["buf"] not in handles
                               or not cmd["length"] or cmd["length"] % 512):
            assert f.status != STATUS["SUCCESS"], cmd
    dev.nop()
