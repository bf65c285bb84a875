"""Who can reach the daemon, and what a client can do to it: the socket's mode and path,
refused users that cost nothing, queue-pair memory no client can fault, profiles that refuse
what is not a number (real daemon processes throughout)."""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import hostlib
from ssdemu.tools.daemon_process import DaemonProcess
from ssdemu_wire import control
from ssdemu_wire.layout import PROTOCOL_VERSION

ROOT = os.getuid() == 0


def _serves(path: str) -> None:
    with hostlib.connect(path) as dev:
        dev.kv_put(b"alive", b"yes")
        assert dev.kv_get(b"alive") == b"yes"


def test_socket_is_private_by_default_and_group_shared_on_request(tmp_path):
    d = DaemonProcess(str(tmp_path / "s.sock"))
    try:
        assert stat.S_IMODE(os.stat(d.socket_path).st_mode) == 0o600
    finally:
        assert d.terminate()[0] == 0
    group = grp.getgrgid(os.getgid()).gr_name
    d = DaemonProcess(str(tmp_path / "g.sock"), extra=["--group", group])
    try:
        st = os.stat(d.socket_path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid()
        _serves(d.socket_path)
    finally:
        assert d.terminate()[0] == 0
    p = subprocess.run([sys.executable, "-m", "ssdemu", "serve", "--media", "mem:16M",
                        "--socket", str(tmp_path / "x.sock"), "--group", "no-such-group-x"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no such group" in p.stderr


def test_socket_path_on_a_regular_file_is_refused_and_the_file_kept(tmp_path):
    f = tmp_path / "precious.txt"
    f.write_text("keep me")
    p = subprocess.run([sys.executable, "-m", "ssdemu", "serve", "--media", "mem:16M",
                        "--socket", str(f)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert len(p.stderr.strip().splitlines()) == 1 and "not a socket" in p.stderr
    assert f.read_text() == "keep me"


_HOSTILE = r"""
import os, socket, sys, json
os.setgid(65534); os.setuid(65534)  # nobody: a uid the daemon does not allow
path, mode = sys.argv[1], sys.argv[2]
for i in range(100):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    if mode == "hello" and i % 2:
        try:
            s.send(json.dumps({"op": "hello"}).encode())
        except OSError:
            pass  # refused and closed already
    s.close()  # at once: never reads the refusal
print("done")
"""


@pytest.mark.skipif(not ROOT, reason="needs root to act as another uid")
@pytest.mark.parametrize("mode", ["close", "hello"])
def test_refused_users_cannot_stop_or_stall_the_daemon(tmp_path, mode):
    """100 connections from a uid that is not allowed, each closed at once (the refusal's
    send then meets a closed peer): the daemon keeps serving, promptly."""
    import shutil
    import tempfile

    where = tempfile.mkdtemp(prefix="ssdemu-access-")  # pytest's own dirs are 0700
    os.chmod(where, 0o755)
    d = DaemonProcess(os.path.join(where, "s.sock"))
    try:
        os.chmod(d.socket_path, 0o666)  # as the old daemon made it: anyone could reach it
        p = subprocess.run([sys.executable, "-c", _HOSTILE, d.socket_path, mode],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and "done" in p.stdout, p.stderr
        assert d.proc.poll() is None
        _serves(d.socket_path)
    finally:
        code, err = d.terminate()
        shutil.rmtree(where, ignore_errors=True)
    assert code == 0, err
    assert "Traceback" not in err and err.count("refused pid") == 100


def test_queue_pair_memory_cannot_be_shrunk_by_its_client(tmp_path):
    """The queue-pair memfd a client gets is sealed: ftruncate fails, and the daemon (and
    its other clients) go on."""
    d = DaemonProcess(str(tmp_path / "s.sock"))
    try:
        with hostlib.connect(d.socket_path) as other:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(d.socket_path)
            control.send(s, {"op": "hello", "version": PROTOCOL_VERSION})
            reply, _ = control.recv(s)
            assert reply["ok"]
            control.send(s, {"op": "create_qp", "entries": 64})
            reply, fds = control.recv(s)
            assert reply["ok"]
            mem, doorbell = fds[0], fds[1]
            for size in (0, 4096):
                with pytest.raises(PermissionError):
                    os.ftruncate(mem, size)
            with pytest.raises(PermissionError):
                os.ftruncate(mem, reply["bytes"] * 2)  # nor grown
            os.eventfd_write(doorbell, 1)  # and a doorbell now faults nothing
            other.kv_put(b"k", np.arange(4096, dtype=np.uint8))
            assert other.kv_get(b"k") == bytes(np.arange(4096, dtype=np.uint8))
            for fd in fds:
                os.close(fd)
            s.close()
        assert d.proc.poll() is None
    finally:
        assert d.terminate()[0] == 0


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_profiles_refuse_nan_and_infinity(tmp_path, value):
    from ssdemu.sim.profile import ProfileError, load

    text = (load.__globals__["PROFILE_DIR"] / "star2000d.yaml").read_text()
    for field in ("latency_ns", "tops"):
        bad = tmp_path / f"bad-{field}.yaml"
        lines = [(ln.split(":")[0] + f": {value}" if ln.strip().startswith(field + ":")
                  else ln) for ln in text.splitlines()]
        bad.write_text("\n".join(lines))
        with pytest.raises(ProfileError, match="finite") as e:
            load(str(bad))
        assert "\n" not in str(e.value)


def test_a_profile_that_is_not_yaml_gives_one_line_with_its_place(tmp_path):
    from ssdemu.sim.profile import ProfileError, load

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nlink: [1, 2\n")
    with pytest.raises(ProfileError) as e:
        load(str(bad))
    msg = str(e.value)
    assert "\n" not in msg and f"{bad}:" in msg and "not valid YAML" in msg


_OTHER_UID = r"""
import os, sys
import hostlib  # before the uid changes: this Python's files may be root's alone
os.setgid(65534); os.setuid(65534)
with hostlib.connect(sys.argv[1]) as dev:
    dev.queue_pair(8)
    buf = dev.alloc(4096)
    buf[:] = 7
    ns = dev.ns_create(1 << 20)
    dev.write(ns, 0, buf)
    dev.kv_put(b"mine", buf)
    print("served", flush=True)
"""


def test_a_uids_quotas_hold_over_all_its_connections():
    """Four connections of one uid together hit its quotas of queue pairs, buffers, buffer
    bytes, namespaces and namespace bytes, each refused in one line that names the option
    (before, each quota was per connection: four connections took every queue pair and
    buffer slot).  Namespaces stay counted after their creator left.  Another uid is then
    served (as root: a real other uid)."""
    where = tempfile.mkdtemp(prefix="ssdemu-quota-")  # not under pytest's 0700 tree
    os.chmod(where, 0o755)  # the other uid reaches the socket
    sock = os.path.join(where, "s.sock")
    d = DaemonProcess(sock, extra=[
        "--max-queue-pairs-per-uid", "4", "--max-buffers-per-uid", "7",
        "--max-buffer-bytes-per-uid", "18M", "--max-namespaces-per-uid", "3",
        "--max-namespace-bytes-per-uid", "8M"] + (["--allow-uid", "65534"] if ROOT else []))
    try:
        conns = [hostlib.connect(sock) for _ in range(4)]  # a queue pair and 4 MiB bounce each
        try:
            with pytest.raises(hostlib.ConnectError, match=r"uid \d+ holds 4 of its quota of 4 "
                               r"queue pairs .*--max-queue-pairs-per-uid"):
                hostlib.connect(sock)
            with pytest.raises(hostlib.ConnectError, match="bytes of registered buffers .*"
                               "--max-buffer-bytes-per-uid"):
                conns[0].alloc(4 << 20)  # 16 MiB of bounce buffers held, 18 allowed
            held = [conns[i].alloc(4096) for i in range(3)]
            with pytest.raises(hostlib.ConnectError, match="holds 7 of its quota of 7 "
                               "registered buffers"):
                conns[3].alloc(4096)
            conns[1].free(held[1])
            conns[3].alloc(4096)  # room again
            a = conns[0].ns_create(4 << 20)
            conns[1].ns_create(0)
            with pytest.raises(hostlib.CapacityError, match="namespace quota"):
                conns[2].ns_create(8 << 20)  # 12 MiB of namespaces: over 8
            conns[2].ns_create(4 << 20, shared=True)  # a shared one counts against its creator
            with pytest.raises(hostlib.CapacityError, match="namespace quota"):
                conns[3].ns_create(0)  # a fourth
        finally:
            for c in conns:
                c.close()
        with hostlib.connect(sock) as dev:  # they left; their namespaces still count
            with pytest.raises(hostlib.CapacityError, match="namespace quota"):
                dev.ns_create(0)
            dev.ns_delete(a)
            dev.ns_create(0)
            assert dev.log()["quotas"]["namespaces"] == 3
        if ROOT:
            with contextlib.ExitStack() as stack:  # root at every quota it can reach
                for _ in range(4):
                    stack.enter_context(hostlib.connect(sock))
                p = subprocess.run([sys.executable, "-c", _OTHER_UID, sock],
                                   capture_output=True, text=True, timeout=60,
                                   env=dict(os.environ, PYTHONPATH=os.getcwd()))
                assert p.returncode == 0 and p.stdout.strip() == "served", p.stderr
    finally:
        code, err = d.terminate()
        shutil.rmtree(where, ignore_errors=True)
    assert code == 0, err


def test_queue_pair_and_inflight_quotas(tmp_path):
    """Past its in-flight quota a uid's commands wait in its queues, whichever connection
    they came by: every one completes, and no more than the quota were ever in flight at
    once (the daemon's own peak counter), while without the quota the same load goes
    deeper."""
    def peak(extra):
        d = DaemonProcess(str(tmp_path / "s.sock"), extra=extra)
        try:
            devs = [hostlib.connect(d.socket_path) for _ in range(3)]
            try:
                ns = devs[0].ns_create(4 << 20, shared=True)
                bufs = [dev.alloc(64 * 4096) for dev in devs]
                futures = []
                for dev, buf in zip(devs, bufs, strict=True):
                    with dev.batch():
                        futures += [dev.read_async(ns, i, buf[i * 4096:(i + 1) * 4096])
                                    for i in range(64)]
                for f in futures:
                    assert f.result() == 4096
                return devs[0].log()["quotas"]
            finally:
                for dev in devs:
                    dev.close()
        finally:
            assert d.terminate()[0] == 0

    limited = peak(["--max-inflight-per-uid", "4"])
    assert limited["inflight"] == 4 and limited["uid_inflight_peak"] == 4
    assert limited["waits"] > 0
    free = peak([])
    assert free["uid_inflight_peak"] > 4
    # the old spelling of the option still works
    d = DaemonProcess(str(tmp_path / "s.sock"), extra=["--max-queue-pairs-per-client", "2"])
    try:
        with hostlib.connect(d.socket_path) as dev:
            dev.queue_pair(8)
            with pytest.raises(hostlib.ConnectError, match="quota of 2 queue pairs"):
                dev.queue_pair(8)
    finally:
        assert d.terminate()[0] == 0


_PINNER = r"""
import sys, hostlib
dev = hostlib.connect(sys.argv[1])
for i in range(50):
    dev.pin(bytes([i]) * 16)
print("pinned", flush=True)
sys.stdin.read()  # until killed
"""


def test_pins_belong_to_their_client_and_go_with_it(tmp_path):
    """50 pins by a client that is then killed -9 are released (the keys can be deleted); a
    client cannot unpin another's pin."""
    d = DaemonProcess(str(tmp_path / "s.sock"))
    try:
        with hostlib.connect(d.socket_path) as dev:
            keys = [bytes([i]) * 16 for i in range(50)]
            for k in keys:
                dev.kv_put(k, b"block")
            p = subprocess.Popen([sys.executable, "-c", _PINNER, d.socket_path],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                assert p.stdout.readline().strip() == "pinned"
                with pytest.raises(hostlib.KeyPinnedError):
                    dev.kv_delete(keys[0])  # pinned (by the other client)
                with pytest.raises(hostlib.InvalidCommandError):
                    dev.unpin(keys[0])  # not this client's pin
                assert dev.pin(keys[1]) == 2 and dev.unpin(keys[1]) == 1  # its own: fine
            finally:
                p.kill()
                p.wait()
            import time

            deadline = time.monotonic() + 20  # the daemon sees the hang-up, then releases
            while True:
                try:
                    dev.kv_delete(keys[0])
                    break
                except hostlib.KeyPinnedError:
                    assert time.monotonic() < deadline, "the dead client's pins stayed"
                    time.sleep(0.01)
            for k in keys[1:]:
                dev.kv_delete(k)
            assert not any(dev.kv_exists(k) for k in keys)
    finally:
        code, err = d.terminate()
    assert code == 0 and "left 50 pins: released" in err, err


@pytest.mark.parametrize("media", ["mem:64M", "file"])
def test_a_new_namespace_never_shows_old_bytes(tmp_path, media):
    """A namespace written full, deleted, and made again over the same space reads zeros."""
    spec = f"file:{tmp_path / 'd.img'}:64M" if media == "file" else media
    d = DaemonProcess(str(tmp_path / "s.sock"), media=spec)
    try:
        with hostlib.connect(d.socket_path) as dev:
            ns = dev.ns_create(4 << 20)
            secret = dev.alloc(1 << 20)
            secret[:] = 0xA5
            for lba in range(0, 8192, 2048):
                dev.write(ns, lba, secret)
            start = next(n["start"] for n in dev.namespaces() if n["nsid"] == ns)
            dev.ns_delete(ns)
        with hostlib.connect(d.socket_path) as other:
            ns2 = other.ns_create(4 << 20)
            assert next(n["start"] for n in other.namespaces() if n["nsid"] == ns2) == start
            out = other.alloc(1 << 20)
            for lba in range(0, 8192, 2048):
                out[:] = 1
                other.read(ns2, lba, out)
                assert not out.any(), lba
    finally:
        assert d.terminate()[0] == 0


def test_refused_buffer_registrations_keep_no_descriptor(tmp_path):
    """A memfd the daemon cannot map shared and writable (sealed against writes), or one
    that is too small, is refused in one line and nothing of it stays in the daemon: after
    100 refusals of each kind its open descriptors are what they were, and so are its
    mappings of the refused memory (a kept descriptor would keep the memory alive)."""
    d = DaemonProcess(str(tmp_path / "s.sock"))
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(d.socket_path)
        control.send(s, {"op": "hello", "version": PROTOCOL_VERSION})
        assert control.recv(s)[0]["ok"]
        before = d.open_fds()
        errors = set()
        for kind in ("write-sealed", "too small"):
            for _ in range(100):
                fd = os.memfd_create("refused", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
                os.ftruncate(fd, 1 << 20)
                seals = fcntl.F_SEAL_SHRINK | (fcntl.F_SEAL_WRITE if kind == "write-sealed" else 0)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
                declared = (1 << 20) * (2 if kind == "too small" else 1)
                control.send(s, {"op": "register_buffer", "bytes": declared}, [fd])
                reply, _ = control.recv(s)
                os.close(fd)
                assert not reply["ok"]
                errors.add(reply["error"])
        assert d.open_fds() == before
        assert d.mappings("memfd:refused") == 0
        assert not any("internal error" in e for e in errors), errors
        s.close()
        _serves(d.socket_path)  # and it serves
    finally:
        assert d.terminate()[0] == 0


def test_no_refused_request_keeps_a_descriptor(tmp_path):
    """Issue 33, item 2: every kind of request the control plane refuses, 100 times each,
    some with a descriptor attached: the daemon's open descriptors are what they were
    before (a client that leaves releases what it held too)."""
    d = DaemonProcess(str(tmp_path / "s.sock"), extra=["--max-queue-pairs-per-uid", "2",
                                                       "--max-buffers-per-uid", "1"])
    try:
        keep = hostlib.connect(d.socket_path)  # a queue pair and its bounce: the buffer quota
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(d.socket_path)
        control.send(s, {"op": "hello", "version": PROTOCOL_VERSION})
        assert control.recv(s)[0]["ok"]
        control.send(s, {"op": "create_qp", "entries": 8})
        reply, qp_fds = control.recv(s)
        assert reply["ok"]  # the uid's second queue pair: its quota is reached
        for fd in qp_fds:
            os.close(fd)
        before = d.open_fds()

        def memfd() -> int:
            fd = os.memfd_create("refused", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, 1 << 16)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            return fd

        kinds = {
            "queue pair over the uid's quota": ({"op": "create_qp", "entries": 8}, False),
            "queue pair of a bad size": ({"op": "create_qp", "entries": 3}, False),
            "buffer over the uid's quota": ({"op": "register_buffer", "bytes": 1 << 16},
                                            True),
            "unregister of no buffer": ({"op": "unregister_buffer", "handle": 999}, True),
            "unknown request with a descriptor": ({"op": "frobnicate"}, True),
            "an unknown fault action": ({"op": "fault", "action": "nope"}, True),
            "destroy of no queue pair": ({"op": "destroy_qp", "qid": 999}, True),
        }
        for what, (msg, with_fd) in kinds.items():
            for _ in range(100):
                fds = [memfd()] if with_fd else []
                control.send(s, msg, fds)
                reply, got = control.recv(s)
                for fd in fds + got:
                    os.close(fd)
                assert not reply["ok"], what
            assert d.open_fds() == before, what
        # a second hello with a key, and one naming an owner: refused, nothing kept
        for hello in ({"op": "hello", "version": PROTOCOL_VERSION, "owner": "x"},
                      {"op": "hello", "version": PROTOCOL_VERSION, "owner_key": "zz"}):
            for _ in range(100):
                control.send(s, hello)
                assert not control.recv(s)[0]["ok"]
        assert d.open_fds() == before
        s.close()
        keep.close()
        _serves(d.socket_path)  # and it serves, with the left clients' share back
    finally:
        assert d.terminate()[0] == 0


def test_shutdown_removes_only_the_socket_it_bound(tmp_path):
    """Issue 33, item 7: what stands at the socket path when the daemon stops is removed only
    if it is still the socket this daemon bound (same device and inode): a file someone put
    there since is left as it is."""
    path = tmp_path / "s.sock"
    d = DaemonProcess(str(path))
    _serves(str(path))
    os.unlink(path)
    path.write_text("not the daemon's")
    rc, log = d.terminate()
    assert rc == 0
    assert path.read_text() == "not the daemon's"
    assert "no longer this daemon's socket" in log
    d2 = DaemonProcess(str(tmp_path / "t.sock"))  # and its own socket it does remove
    assert d2.terminate()[0] == 0
    assert not (tmp_path / "t.sock").exists()


def test_a_client_that_never_reads_its_replies_stalls_no_one(tmp_path):
    """Issue 33, item 3: one client sends requests and never reads the replies.  The control
    loop never waits for it (it waited up to 5 s per reply, and another client's connect
    took 4.7 s): the others connect and identify while it is connected, and the greedy
    client is dropped once its socket is full of unread replies (the old code waited on it
    instead: no drop)."""
    d = DaemonProcess(str(tmp_path / "s.sock"))
    try:
        greedy = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        greedy.connect(d.socket_path)
        control.send(greedy, {"op": "hello", "version": PROTOCOL_VERSION})
        assert control.recv(greedy)[0]["ok"]
        greedy.settimeout(0.5)
        sent = 0
        try:
            for _ in range(2000):  # each gets an error reply it never reads
                control.send(greedy, {"op": "destroy_qp", "qid": 12345})
                sent += 1
        except OSError:
            pass  # dropped: its socket closed under it
        assert sent > 100
        for _ in range(5):  # others, while the greedy client has not read a reply
            with hostlib.connect(d.socket_path) as dev:
                assert dev.identify()["model"] == "ssdemu"
        assert "does not read its replies; dropping it" in d.terminate()[1]
        greedy.close()
    finally:
        if d.proc.poll() is None:
            d.terminate()
