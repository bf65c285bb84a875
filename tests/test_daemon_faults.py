"""Fault injection for the software above the drive: read and write errors on an LBA range or a
key, latency spikes, seeded probabilities, surprise removal (real daemon processes)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import hostlib
from ssdemu.tools.daemon_process import DaemonProcess
from ssdemu_wire.layout import OPCODES


def _status(call) -> str:
    try:
        call()
    except hostlib.DeviceError as e:
        return e.status_name
    return "ok"


def _ctl(sock, *args):
    return subprocess.run([sys.executable, "-m", "ssdemu", "ctl", "--socket", sock, *args],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(str(tmp_path / "s.sock"), extra=["--timing", "off"])
    yield d
    code, err = d.terminate()
    assert code == 0, err


def test_read_errors_hit_the_range_and_count_given(daemon):
    with hostlib.connect(daemon.socket_path) as dev:
        ns = dev.ns_create(1 << 20)
        buf = dev.alloc(8192)
        buf[:] = 3
        for lba in range(0, 64, 16):
            dev.write(ns, lba, buf)
        rid = dev.inject_fault("read-error", nsid=ns, lba=(20, 4), count=3)
        assert _status(lambda: dev.read(ns, 0, buf)) == "ok"  # [0, 16) misses [20, 24)
        assert _status(lambda: dev.write(ns, 16, buf)) == "ok"  # a write: not a read fault
        got = [_status(lambda: dev.read(ns, 16, buf)) for _ in range(5)]  # [16, 32) hits
        assert got == ["MEDIA_ERROR"] * 3 + ["ok"] * 2  # then the rule is spent
        assert dev.faults() == [] and (buf == 3).all()
        rid = dev.inject_fault("read-error", nsid=ns)  # until cleared
        assert [_status(lambda: dev.read(ns, 48, buf)) for _ in range(3)] == \
            ["MEDIA_ERROR"] * 3
        assert dev.faults()[0]["hits"] == 3 and dev.clear_faults(rid) == 1
        assert _status(lambda: dev.read(ns, 48, buf)) == "ok"
        assert dev.log()["faults_injected"] == 6


def test_a_write_error_on_a_key_loses_nothing_acknowledged(daemon):
    with hostlib.connect(daemon.socket_path) as dev:
        dev.kv_put(b"victim", b"old value")
        dev.inject_fault("write-error", key=b"victim", count=2)
        for _ in range(2):
            assert _status(lambda: dev.kv_put(b"victim", b"new value")) == "MEDIA_ERROR"
            assert dev.kv_get(b"victim") == b"old value"  # the store never changed
        dev.kv_put(b"other", b"fine")
        dev.kv_put(b"victim", b"new value")
        assert dev.kv_get(b"victim") == b"new value" and dev.kv_get(b"other") == b"fine"
        dev.inject_fault("read-error", key=b"victim")
        assert _status(lambda: dev.kv_get(b"victim")) == "MEDIA_ERROR"
        assert dev.kv_get(b"other") == b"fine"
        dev.clear_faults()
        assert dev.kv_get(b"victim") == b"new value"


def test_probabilistic_faults_replay_from_their_seed(daemon):
    with hostlib.connect(daemon.socket_path) as dev:
        ns = dev.ns_create(1 << 20)
        buf = dev.alloc(4096)

        def pattern(seed):
            dev.inject_fault("read-error", nsid=ns, probability=0.3, seed=seed)
            out = [_status(lambda i=i: dev.read(ns, i % 256, buf)) == "MEDIA_ERROR"
                   for i in range(400)]
            dev.clear_faults()
            return out

        a, b, c = pattern(7), pattern(7), pattern(8)
        assert a == b and a != c
        assert 0.2 < sum(a) / len(a) < 0.4


def test_latency_spikes_add_exactly_their_time_on_the_virtual_clock(tmp_path):
    d = DaemonProcess(str(tmp_path / "s.sock"), extra=["--clock", "virtual"])
    try:
        with hostlib.connect(d.socket_path) as dev:
            ns = dev.ns_create(1 << 20)
            buf = dev.alloc(4096)
            h, off = dev._locate(buf)

            def read_at(t, lba):
                f = dev.submit(OPCODES["READ"], "read", nsid=ns, lba=lba, buf=h,
                               buf_offset=off, length=4096, submit_time_ns=t)
                f.result()
                return f.device_ns - t

            base = read_at(10_000_000, 0)
            dev.inject_fault("latency", nsid=ns, latency_us=1500, directions="read", count=2)
            assert read_at(20_000_000, 0) == base + 1_500_000
            assert read_at(30_000_000, 0) == base + 1_500_000
            assert read_at(40_000_000, 0) == base  # spent after two
    finally:
        assert d.terminate()[0] == 0


def test_surprise_removal_cuts_every_client_off_until_reinserted(daemon):
    sock = daemon.socket_path
    with hostlib.connect(sock) as dev:
        value = np.arange(10000, dtype=np.uint16)
        dev.kv_put(b"durable", value)
        dev.flush()
        with hostlib.connect(sock) as bystander:
            p = _ctl(sock, "fault", "remove")
            assert p.returncode == 0, p.stderr
            with pytest.raises(hostlib.DeviceGoneError):
                bystander.kv_get(b"durable")
            with pytest.raises(hostlib.DeviceGoneError):
                dev.nop()
    with pytest.raises(hostlib.ConnectError, match="removed"):
        hostlib.connect(sock)
    p = _ctl(sock, "--json", "fault", "reinsert")
    assert p.returncode == 0 and json.loads(p.stdout) == {"was_removed": True}
    with hostlib.connect(sock) as dev:
        assert dev.kv_get(b"durable") == value.tobytes()
    assert daemon.proc.poll() is None


def test_a_timed_removal_ends_by_itself(daemon):
    import time

    with hostlib.connect(daemon.socket_path) as dev:
        dev.surprise_removal(seconds=0.5)
    deadline = time.monotonic() + 20
    while True:
        try:
            hostlib.connect(daemon.socket_path).close()
            break
        except hostlib.ConnectError as e:
            assert "returns in" in str(e)
            assert time.monotonic() < deadline
            time.sleep(0.1)


@pytest.mark.parametrize("args,msg", [
    (["read-error", "--probability", "0"], "must be a positive finite number"),
    (["read-error", "--probability", "nan"], "must be a positive finite number"),
    (["read-error", "--lba", "5"], "FIRST:COUNT"),
    (["read-error", "--lba", "5:10"], "needs the namespace"),
    (["read-error", "--key", "zz"], "key must be hex"),
    (["read-error", "--probability", "2"], "probability must be in"),
    (["latency", "--us", "inf"], "positive finite"),
    (["latency", "--us", "1e12"], "latency_us in"),
    (["clear", "x"], "not a whole number"),
])
def test_bad_fault_requests_get_one_line(daemon, args, msg):
    p = _ctl(daemon.socket_path, "fault", *args)
    assert p.returncode in (1, 2), p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0], p.stderr
    assert daemon.proc.poll() is None
    p = _ctl(daemon.socket_path, "--json", "fault", "list")
    assert json.loads(p.stdout) == {"rules": []}
