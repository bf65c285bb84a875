"""Hostile neighbours against owners and admins (issue 33, item 4): what a process of the same
uid, or of another allowed uid, can do to an owner it does not hold the key of.  Real daemon
processes, real other processes; the control-plane and quota probes are in
test_daemon_access.py."""

from __future__ import annotations

import json
import os
import pathlib
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import hostlib
from ssdemu.tools.daemon_process import DaemonProcess
from ssdemu_wire.layout import OPCODES

ROOT = os.getuid() == 0
ROOT_DIR = pathlib.Path(__file__).resolve().parent.parent

_CLAIM = r"""
import json, sys, hostlib
from ssdemu_wire import control
from ssdemu_wire.layout import PROTOCOL_VERSION
import socket
path, nsid = sys.argv[1], int(sys.argv[2])
out = {}
# the old way: the owner's name, which anyone could give
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(path)
control.send(s, {"op": "hello", "version": PROTOCOL_VERSION, "owner": "alice"})
out["by_name"] = control.recv(s)[0]
s.close()
# a key of its own, and none: neither sees alice's namespace
for who, key in (("own_key", "ab" * 32), ("no_key", None)):
    with hostlib.connect(path, owner_key=key) as dev:
        try:
            dev.kv_get(b"secret", nsid=nsid)
            out[who] = "read it"
        except hostlib.DeviceError as e:
            out[who] = e.status_name
        out[who + "_sees"] = [n["nsid"] for n in dev.namespaces()]
print(json.dumps(out))
"""


def test_a_same_uid_process_cannot_claim_an_owner_by_its_name(tmp_path):
    """alice's namespace, read by another process of the same uid that knows her name (the
    probe of issue 33: before, `owner="alice"` read alice's key)."""
    alice = secrets.token_hex(32)
    d = DaemonProcess(str(tmp_path / "s.sock"))
    try:
        with hostlib.connect(d.socket_path, owner_key=alice) as a:
            nsid = a.ns_create(0)
            a.kv_put(b"secret", b"alice's", nsid=nsid)
        p = subprocess.run([sys.executable, "-c", _CLAIM, d.socket_path, str(nsid)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        assert not out["by_name"]["ok"] and "not a name" in out["by_name"]["error"]
        assert out["own_key"] == out["no_key"] == "INVALID_NAMESPACE"
        assert out["own_key_sees"] == out["no_key_sees"] == []
        with hostlib.connect(d.socket_path, owner_key=alice) as a:
            assert a.kv_get(b"secret", nsid=nsid) == b"alice's"
    finally:
        assert d.terminate()[0] == 0


def _ok(f) -> bool:
    try:
        f.result()
        return True
    except hostlib.DeviceError:
        return False


def _refused(call, match: str) -> None:
    with pytest.raises((hostlib.ConnectError, hostlib.DeviceError), match=match):
        call()


def test_an_owner_injects_faults_only_into_its_own_namespaces(tmp_path):
    """A daemon with --admin-key: no client is an admin by its uid.  An owner adds fault
    rules only on namespaces it owns, sees and clears only its own rules, cannot remove the
    drive, cut its power or reinsert it, cannot list or delete another's namespaces, nor
    delete a shared namespace it did not create.  The admin can do all of it; a rule goes
    with the namespace it names."""
    admin_file = tmp_path / "admin.key"
    admin = hostlib.owner_key.new(str(admin_file))
    alice, bob = secrets.token_hex(32), secrets.token_hex(32)
    d = DaemonProcess(str(tmp_path / "s.sock"), extra=["--admin-key", str(admin_file)])
    try:
        with hostlib.connect(d.socket_path, owner_key=alice) as a, \
                hostlib.connect(d.socket_path, owner_key=bob) as b, \
                hostlib.connect(d.socket_path, owner_key=admin) as root, \
                hostlib.connect(d.socket_path) as anon:
            ns_a = a.ns_create(1 << 20)
            shared = a.ns_create(0, shared=True)
            ns_b = b.ns_create(1 << 20)
            buf = b.alloc(4096)
            own = "only into a namespace of its own"
            for dev in (b, anon):  # an owner, and the uid alone: neither is an admin
                _refused(lambda dev=dev: dev.inject_fault("read-error"), own)
                _refused(lambda dev=dev: dev.inject_fault("read-error", nsid=ns_a), own)
                _refused(lambda dev=dev: dev.inject_fault("read-error", nsid=shared), own)
                _refused(lambda dev=dev: dev.inject_fault("read-error", key=b"k"), own)
                _refused(lambda dev=dev: dev.inject_fault("read-error", nsid=0, key=b"k"),
                         own)
                _refused(lambda dev=dev: dev.surprise_removal(), "admin")
                _refused(lambda dev=dev: dev.power_cut(), "admin")
                _refused(lambda dev=dev: dev.namespaces(all_owners=True), "ACCESS_DENIED")
                _refused(lambda dev=dev: dev.ns_delete(ns_a, any_owner=True),
                         "ACCESS_DENIED")
                _refused(lambda dev=dev: dev.ns_delete(shared), "ACCESS_DENIED")
            _refused(lambda: hostlib.reinsert(d.socket_path), "admin")
            _refused(lambda: hostlib.reinsert(d.socket_path, owner_key=bob), "admin")
            # bob's own namespace: his rule hits his reads (until the namespace goes)
            rb = b.inject_fault("read-error", nsid=ns_b)
            _refused(lambda: b.read(ns_b, 0, buf), "MEDIA_ERROR")
            ra = root.inject_fault("latency", nsid=ns_a, latency_us=1)
            rall = root.inject_fault("latency", latency_us=1, probability=1e-9)
            assert [r["id"] for r in b.faults()] == [rb]
            assert a.faults() == [] and anon.faults() == []
            assert {r["id"] for r in root.faults()} == {rb, ra, rall}
            # another's rule is as if it did not exist: clearing it or "all" leaves it
            assert a.clear_faults(rb) == 0 and a.clear_faults() == 0
            assert b.clear_faults(ra) == 0
            assert {r["id"] for r in root.faults()} == {rb, ra, rall}
            # the admin's view and powers
            every = {n["nsid"]: n for n in root.namespaces(all_owners=True)}
            assert set(every) == {ns_a, shared, ns_b}
            assert not every[ns_a]["mine"] and every[shared]["mine"]
            assert [n["nsid"] for n in root.namespaces()] == [shared]  # as an owner
            _refused(lambda: root.ns_delete(ns_b), "INVALID_NAMESPACE")  # must ask
            root.ns_delete(ns_b, any_owner=True)
            assert {r["id"] for r in root.faults()} == {ra, rall}  # bob's rule went with it
            # a namespace made again in its place carries no rule of the old one
            again = b.ns_create(1 << 20)
            assert again == ns_b
            b.read(again, 0, buf)
            assert (buf == 0).all()
            # a shared namespace: its creator deletes it
            a.ns_delete(shared)
            assert root.clear_faults() == 2
        assert hostlib.reinsert(d.socket_path, owner_key_file=str(admin_file)) is False
    finally:
        assert d.terminate()[0] == 0


_OTHER_UID = r"""
import json, os, sys
import hostlib  # before the uid changes: this Python's files may be root's alone
os.setgid(65534); os.setuid(65534)
path, root_ns = sys.argv[1], int(sys.argv[2])
out = {}
def attempt(name, call):
    try:
        call()
        out[name] = "ok"
    except (hostlib.ConnectError, hostlib.DeviceError) as e:
        out[name] = str(e)
with hostlib.connect(path) as dev:
    mine = dev.ns_create(1 << 20)
    attempt("device_wide", lambda: dev.inject_fault("read-error"))
    attempt("roots_ns", lambda: dev.inject_fault("read-error", nsid=root_ns))
    attempt("own_ns", lambda: dev.inject_fault("read-error", nsid=mine, count=1))
    attempt("remove", lambda: dev.surprise_removal())
    attempt("all_owners", lambda: dev.namespaces(all_owners=True))
    out["rules"] = [r["nsid"] for r in dev.faults()]
    out["mine"] = mine
    dev.ns_delete(mine)
attempt("reinsert", lambda: hostlib.reinsert(path))
print(json.dumps(out))
"""


@pytest.mark.skipif(not ROOT, reason="needs root to act as another uid")
def test_another_uid_is_no_admin():
    """Without --admin-key the daemon's uid and root are admins, and an allowed other uid is
    an owner like any: faults only into its own namespace, no removal."""
    where = tempfile.mkdtemp(prefix="ssdemu-hostile-")
    os.chmod(where, 0o755)
    d = DaemonProcess(os.path.join(where, "s.sock"), extra=["--allow-uid", "65534"])
    try:
        with hostlib.connect(d.socket_path) as dev:
            root_ns = dev.ns_create(1 << 20)
            mine = dev.inject_fault("latency", nsid=root_ns, latency_us=1)
        p = subprocess.run([sys.executable, "-c", _OTHER_UID, d.socket_path, str(root_ns)],
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=os.getcwd()))
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        assert "own" in out["device_wide"] and "own" in out["roots_ns"]
        assert out["own_ns"] == "ok" and out["rules"] == [out["mine"]]
        assert "admin" in out["remove"] and "admin" in out["reinsert"]
        assert "ACCESS_DENIED" in out["all_owners"]
        with hostlib.connect(d.socket_path) as dev:
            # root, an admin, sees every rule: the other uid's went with its namespace
            assert [r["id"] for r in dev.faults()] == [mine]
    finally:
        code, err = d.terminate()
        shutil.rmtree(where, ignore_errors=True)
    assert code == 0, err


_DOORBELL_THIEF = r"""
import os, sys, hostlib
dev = hostlib.connect(sys.argv[1])
fd, stop = dev.qp.doorbell_fd, sys.argv[2]
print("reading", flush=True)
taken = i = 0
while True:  # take every kick the moment it lands
    try:
        os.read(fd, 8)
        taken += 1
    except BlockingIOError:
        pass
    i += 1
    if i % 4096 == 0 and os.path.exists(stop):
        break
print(taken, flush=True)
"""


def test_a_client_reading_its_doorbell_delays_no_one_else(tmp_path):
    """Another client spins reading the doorbell eventfd it was given; the victim's NOPs,
    each a random while after the last (the data plane goes to sleep after 1 us idle here,
    so each kick is one it sleeps on), all complete, and the thief takes none of the
    victim's kicks (issue 33, item 11: every client was given the one
    doorbell the data plane slept on; a client that read it took the others' kicks, and 8
    of 500 NOPs hung for 5 s or more, one for 65 s.  On this machine's kernel the stolen
    kicks did not hang the victim (io_uring's poll saw each write), but the thief took all
    but one of 3,000)."""
    profile = tmp_path / "fast-sleep.yaml"
    text = (ROOT_DIR / "ssdemu" / "sim" / "profiles" / "star2000d.yaml").read_text()
    assert "  spin_us: 50\n" in text
    profile.write_text(text.replace("  spin_us: 50\n", "  spin_us: 1\n"))
    d = DaemonProcess(str(tmp_path / "s.sock"), extra=["--profile", str(profile)])
    stop = tmp_path / "stop"
    thief = None
    try:
        thief = subprocess.Popen([sys.executable, "-c", _DOORBELL_THIEF, d.socket_path,
                                  str(stop)], stdout=subprocess.PIPE, text=True)
        assert thief.stdout.readline().strip() == "reading"
        rng, n = random.Random(7), 3000
        with hostlib.connect(d.socket_path) as dev:
            for _ in range(n):
                until = time.perf_counter() + rng.uniform(0, 100e-6)
                while time.perf_counter() < until:
                    pass
                dev.submit(OPCODES["NOP"], "nop").result(timeout=120)
            sleeps = dev.log()["sleeps"]
        stop.touch()
        taken = int(thief.communicate(timeout=30)[0].strip())
        assert sleeps > n // 2  # the data plane did sleep between them, kicked awake
        assert taken == 0, f"the other client took {taken} of the victim's kicks"
    finally:
        if thief is not None and thief.poll() is None:
            thief.kill()
            thief.communicate()
        assert d.terminate()[0] == 0


@pytest.mark.parametrize("round_", range(3))
def test_a_deleted_namespace_drains_before_its_space_is_reused(tmp_path, round_):
    """Issue 33, item 6: the delete of a namespace with 128 MiB of writes in flight
    completes only once they are done; another owner's namespace made at once on the freed
    space then reads back only its own bytes (zeroed, then written), never the deleted
    namespace's late writes."""
    d = DaemonProcess(str(tmp_path / "s.sock"), media=f"file:{tmp_path / 'd.img'}:512M",
                      extra=["--timing", "off"])
    try:
        with hostlib.connect(d.socket_path, owner_key=secrets.token_hex(32)) as a, \
                hostlib.connect(d.socket_path, owner_key=secrets.token_hex(32)) as b:
            ns = a.ns_create(128 << 20)
            start = next(n["start"] for n in a.namespaces() if n["nsid"] == ns)
            chunk = a.alloc(1 << 20)  # the profile's largest transfer
            chunk[:] = 0xAA
            other = a.queue_pair(8)
            writes = [a.write_async(ns, i * (1 << 20) // 512, chunk) for i in range(128)]
            a.submit(OPCODES["NS_DELETE"], "delete", qp=other, nsid=ns).result()
            # every write was done before the delete was: each either landed or was
            # refused as the namespace went (never still in flight)
            assert all(w.done() for w in writes)
            landed = sum(_ok(w) for w in writes)
            ns_b = b.ns_create(128 << 20)
            assert next(n["start"] for n in b.namespaces() if n["nsid"] == ns_b) == start
            out = b.alloc(1 << 20)
            for i in range(128):
                b.read(ns_b, i * (1 << 20) // 512, out)
                assert not out.any(), f"MiB {i}: the deleted namespace's bytes ({landed} " \
                    "writes had landed)"
    finally:
        assert d.terminate()[0] == 0


def test_the_log_page_shows_an_owner_its_own_commands(tmp_path):
    """Issue 33, item 4: the log page showed every owner the whole drive's counters (and
    with them what the others do).  With --admin-key no client is an admin by its uid: two
    owners each see their own commands only (and none of the drive-wide figures); the
    admin sees the whole drive; an owner's counters are kept across its reconnects."""
    admin_file = tmp_path / "admin.key"
    admin = hostlib.owner_key.new(str(admin_file))
    alice, bob = secrets.token_hex(32), secrets.token_hex(32)
    d = DaemonProcess(str(tmp_path / "s.sock"), extra=["--admin-key", str(admin_file),
                                                        "--timing", "off"])
    try:
        with hostlib.connect(d.socket_path, owner_key=alice) as a:
            ns = a.ns_create(1 << 20)
            buf = a.alloc(4096)
            for i in range(7):
                a.write(ns, i * 8, buf)
        with hostlib.connect(d.socket_path, owner_key=bob) as b:
            for i in range(3):
                b.kv_put(b"b%d" % i, b"bob's")
            b.kv_get(b"b0", b.alloc(4096))
            page = b.log()
            assert page["scope"] == "owner"
            assert (page["classes"]["kv"]["commands"], page["classes"]["write"]["commands"]) \
                == (4, 0)
            assert not {"store", "compute", "model", "retrieval"} & set(page)
        with hostlib.connect(d.socket_path, owner_key=alice) as a:  # back again
            page = a.log()
            assert (page["classes"]["write"]["commands"], page["classes"]["kv"]["commands"]) \
                == (7, 0)
            assert page["classes"]["write"]["bytes"] == 7 * 4096
        with hostlib.connect(d.socket_path, owner_key=admin) as root:
            page = root.log()
            assert page["scope"] == "device" and page["store"]["keys"] == 3
            assert (page["classes"]["write"]["commands"], page["classes"]["kv"]["commands"]) \
                == (7, 4)
    finally:
        assert d.terminate()[0] == 0


def test_a_pin_in_the_commons_cannot_hold_a_key_against_its_owner(tmp_path):
    """Issue 33: any client could pin a key in key space 0 or a shared namespace, and the
    owner's delete then failed (INVALID_FIELD) until that client left.  Now an unforced
    delete says the key is pinned; a forced one is the namespace owner's (its shared or
    private namespace) or an admin's (anywhere, key space 0 included), takes every
    client's pins on the key with it, and is refused to anyone else."""
    admin_file = tmp_path / "admin.key"
    admin = hostlib.owner_key.new(str(admin_file))
    alice, mallory = secrets.token_hex(32), secrets.token_hex(32)
    d = DaemonProcess(str(tmp_path / "s.sock"), extra=["--admin-key", str(admin_file)])
    try:
        with hostlib.connect(d.socket_path, owner_key=alice) as a, \
                hostlib.connect(d.socket_path, owner_key=mallory) as m, \
                hostlib.connect(d.socket_path, owner_key=admin) as root:
            shared = a.ns_create(0, shared=True)
            private = a.ns_create(0)
            k = b"K" * 16
            for nsid in (0, shared):
                a.kv_put(k, b"v", nsid=nsid)
                assert m.pin(k, nsid=nsid) == 1 and m.pin(k, nsid=nsid) == 2
                with pytest.raises(hostlib.KeyPinnedError, match="KV_KEY_PINNED"):
                    a.kv_delete(k, nsid=nsid)
            # key space 0 has no owner: a forced delete there is an admin's
            with pytest.raises(hostlib.AccessDeniedError):
                a.kv_delete(k, force=True)
            with pytest.raises(hostlib.AccessDeniedError):
                m.kv_delete(k, nsid=shared, force=True)  # not its namespace
            a.kv_delete(k, nsid=shared, force=True)  # its creator's
            root.kv_delete(k, force=True)  # an admin's
            for nsid in (0, shared):
                assert not a.kv_exists(k, nsid=nsid)
                with pytest.raises(hostlib.KeyNotFoundError):
                    m.unpin(k, nsid=nsid)  # its pins went with the key
            assert root.log()["pins"] == 0
            # a private namespace: only its owner may pin there, from any connection, and
            # the owner may force past its own pins
            a.kv_put(k, b"v", nsid=private)
            with hostlib.connect(d.socket_path, owner_key=alice) as a2:
                assert a2.pin(k, nsid=private) == 1
                with pytest.raises(hostlib.KeyPinnedError):
                    a.kv_delete(k, nsid=private)
                a.kv_delete(k, nsid=private, force=True)
            with pytest.raises(hostlib.NamespaceError):
                m.pin(k, nsid=private)
            # a bad option is refused, not taken for force
            a.kv_put(k, b"v")
            f = a.submit(OPCODES["KV_DELETE"], "kv delete", param0=2,
                         **a._key_fields(k))
            with pytest.raises(hostlib.InvalidCommandError, match="INVALID_FIELD"):
                f.result()
            assert a.kv_exists(k)
    finally:
        code, err = d.terminate()
    assert code == 0, err


def test_pins_have_a_quota_per_uid_and_cost_no_one_else(tmp_path):
    """Pinned keys are counted per uid over all its connections (serve --max-pins-per-uid);
    pinning a key again takes no more of it; an unpin or a client's exit gives it back.  A
    client holding 20,000 pins (the old table was a list every pin scanned) leaves another's
    pins exact, and its exit releases every one."""
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:128M",
                      extra=["--max-pins-per-uid", "20050"])
    try:
        with hostlib.connect(d.socket_path) as a, hostlib.connect(d.socket_path) as b:
            keys = [i.to_bytes(16, "little") for i in range(20100)]
            for i in range(0, len(keys), 256):
                for f in [a.kv_put_async(k, b"v") for k in keys[i:i + 256]]:
                    f.result()
            for i in range(0, 20000, 256):
                for f in [a.pin_async(k) for k in keys[i:min(i + 256, 20000)]]:
                    assert f.result() == 1
            assert a.pin(keys[0]) == 2  # the same key again: no more of the quota
            for k in keys[20000:20050]:
                assert b.pin(k) == 1  # the same uid's other connection: the quota is shared
            with pytest.raises(hostlib.CapacityError):
                b.pin(keys[20050])
            with pytest.raises(hostlib.CapacityError):
                a.pin(keys[20051])
            assert b.unpin(keys[20000]) == 0
            assert a.pin(keys[20051]) == 1  # its room came back
            # another client's pins on a key are its own, counted exactly
            assert b.unpin(keys[20001]) == 0
            assert b.pin(keys[5]) == 2 and b.unpin(keys[5]) == 1
            assert a.log()["pins"] == 20000 + 1 + 1 + 48
        with hostlib.connect(d.socket_path) as c:
            assert c.log()["pins"] == 0  # both clients left: every pin went
            c.kv_delete(keys[7])  # and nothing holds a key
    finally:
        code, err = d.terminate()
    assert code == 0, err
    assert "left 20002 pins: released" in err and "left 48 pins: released" in err, err
