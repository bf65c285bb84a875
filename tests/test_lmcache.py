"""hostlib.lmcache with the real LMCache (0.5.6, CPU torch), through LMCache's own engine API
and its remote_storage_plugins configuration: sequences sharing a prefix are stored by one
engine and found, prefix-matched and retrieved by another whose CPU cache is cold (so every
byte comes from the drive): bit-exact, or within the quantization bound with quant set."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest
from envcheck import missing

import hostlib
from ssdemu.tools.daemon_process import DaemonProcess

pytestmark = pytest.mark.external  # LMCache: `make test-fast` skips it

ROOT = pathlib.Path(__file__).resolve().parent.parent
LMVENV = ROOT / ".venv-lmcache"
PY = LMVENV / "bin" / "python"


def _lmcache_or_skip() -> None:
    reason = LMVENV / "UNAVAILABLE"
    if reason.exists():
        missing(reason.read_text().strip())
    if not PY.exists():
        missing("no LMCache venv: `make test` builds .venv-lmcache")


@pytest.mark.parametrize("quant", ["none", "int8_g64"])
def test_lmcache_engine_stores_finds_and_retrieves_through_the_drive(tmp_path, quant):
    _lmcache_or_skip()
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:256M", extra=["--timing", "off"])
    try:
        # LMCache's metrics files go to PROMETHEUS_MULTIPROC_DIR, else /tmp/lmcache_prometheus,
        # which would outlive the test
        metrics = tmp_path / "prometheus"
        p = subprocess.run([str(PY), str(ROOT / "tests" / "lmcache" / "scenario.py"),
                            d.socket_path, quant], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path,
                           env=os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(metrics),
                                             "XDG_CONFIG_HOME": str(tmp_path)})
        assert p.returncode == 0, p.stderr[-3000:]
        assert metrics.is_dir()  # LMCache took the test's own metrics directory
        r = json.loads(p.stdout.strip().splitlines()[-1])
        # 4 chunks of 16 tokens for a; b shares its first 3 chunks and adds 2
        assert (r["lookup_a"], r["lookup_b"]) == (64, 80)
        assert r["lookup_other"] == 32 and r["lookup_none"] == 0  # prefix hits only
        assert (r["retrieved_a"], r["retrieved_b"]) == (64, 80)
        assert r["listed"] == 6  # LMCache's own keys, the shared chunks once
        if quant == "none":
            assert r["exact_a"] and r["exact_b"] and r["max_err"] == 0
        else:
            assert not r["exact_a"] and r["max_err_over_bound"] <= 1.0
        key = tmp_path / "ssdemu" / "lmcache.key"  # the plug-in's default, written 0600
        assert key.stat().st_mode & 0o777 == 0o600
        with hostlib.connect(d.socket_path, owner_key_file=str(key)) as dev:
            log = dev.log()
            assert log["classes"]["compute"]["commands"] > 0  # prefix matches in the drive
            spaces = [n for n in dev.namespaces() if not n["shared"]]
            assert len(spaces) == 2  # the plug-in's data and names, the owner's own
        with hostlib.connect(d.socket_path) as other:  # another owner sees none of it
            assert [n for n in other.namespaces() if not n["shared"]] == []
    finally:
        assert d.terminate()[0] == 0


def test_lmcache_concurrent_and_cancelled_retrieves(tmp_path):
    """Issue 35, item 2: LMCache's normal retrieve path (all of a sequence's chunks at once on
    its event loop) from two reader engines and four threads at once, gets cancelled on
    LMCache's loop as its blocking timeout cancels them, and one cancelled while the drive
    holds its command: no short or wrong retrieve, no memory object left held (the old
    plug-in kept every cancelled get's), and the cancelled command's staging buffer out of
    the pool until the command completes (the old plug-in gave it back at once)."""
    _lmcache_or_skip()
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:512M", extra=["--timing", "off"])
    try:
        p = subprocess.run([str(PY), str(ROOT / "tests" / "lmcache" / "retrieves.py"),
                            d.socket_path, "8", "8", "2", "100"], capture_output=True,
                           text=True, timeout=300, cwd=tmp_path,
                           env=os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "p"),
                                             "XDG_CONFIG_HOME": str(tmp_path)})
        assert p.returncode == 0, p.stderr[-3000:]
        r = json.loads(p.stdout.strip().splitlines()[-1])
        assert r["n_short"] == 0 and r["n_wrong"] == 0, r
        assert r["cancelled"] > 0  # some cancels landed while their get was in flight
        assert r["still_held_after_clear"] == 0, r
        h = r["held_cancel"]
        assert h["result"] == "cancelled"
        # the buffer came back to the pool only once the held command completed
        assert h["pool_during"] == h["pool_after"] - 1
        assert "garbage collected" not in p.stderr
    finally:
        assert d.terminate()[0] == 0


def test_lmcache_on_a_full_drive_evicts_least_recent_chunks(tmp_path):
    """48 chunks of 1 MiB into a drive that holds fewer: every put lands (the plug-in evicts
    one least recently used chunk each time the drive says CAPACITY_EXCEEDED; LMCache counted
    19 failed puts without it, `evict: none`), the oldest sequences go and the newest come
    back bit-exact; then an engine that touched nothing stores two sequences and evicts the
    chunks it never touched, not its own.  An `evict` the plug-in does not know is refused."""
    _lmcache_or_skip()
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:32M", extra=["--timing", "off"])
    try:
        p = subprocess.run([str(PY), str(ROOT / "tests" / "lmcache" / "full_drive.py"),
                            d.socket_path, "lru", "12"], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path,
                           env=os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "p"),
                                             "XDG_CONFIG_HOME": str(tmp_path)})
        assert p.returncode == 0, p.stderr[-3000:]
        r = json.loads(p.stdout.strip().splitlines()[-1])
        with hostlib.connect(d.socket_path) as dev:
            free = dev.log()["store"]["free_bytes"]
    finally:
        assert d.terminate()[0] == 0
    assert r["put_failed"] == 0 and r["evictions"] > 0, r
    kept = 48 - r["evictions"]
    assert free < 1 << 20  # a chunk at a time: no more evicted than the puts needed
    # least recent first: the first sequences went, the last ones stayed (a sequence is
    # found only from its first chunk on)
    assert r["lookups"][0] == 0 and r["lookups"][-(kept // 4):] == [256] * (kept // 4), r
    assert r["retrieved_last"] == 256 and r["exact_last"]
    assert r["bad_evict"] == ("remote_storage_plugin.ssdemu.evict: 'fifo', expected lru or "
                              "none")
    assert r["late_put_failed"] == 0 and r["late_evictions"] == 8 and \
        r["late_lookups"] == [256, 256], r


def test_lmcaches_own_local_disk_backend_on_ext4_on_the_drive():
    """LMCache's LocalDiskBackend, unmodified, its folder on ext4 on the drive (`bench lmcache
    --on-drive`): bit-exact, and its bytes went through the drive: the chunks written, and
    read back from it after the page cache was dropped."""
    _lmcache_or_skip()
    from ssdemu.bench.lmcache import bench_lmcache
    from ssdemu.tools import mount

    r = bench_lmcache(chunks=2, on_drive=True)
    o = r["local_disk_on_drive"]
    assert o["bit_exact"] is True and r["local_disk"]["bit_exact"] is True
    chunk = r["chunk_bytes"]
    assert o["drive_write_bytes"] >= 2 * chunk
    assert o["drive_read_bytes"] >= 2 * 2 * chunk  # the two cold retrieves, from the drive
    assert o["retrieve_cold_MBps"] > 0 and o["store_MBps"] > 0
    assert not [m for m in mount.mounts() if "ssdemu-bench-lmcache-" in m[1]]
