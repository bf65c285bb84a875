"""Real I/O failures through the daemon (issue 33, item 9): the drive's file on a tmpfs that
fills up, so that writes fail in the kernel (ENOSPC) after the daemon has issued them --
a block write, a KV value's write, and a journal write -- with what the client sees then
and what a restart brings back.  Fault injection (test_daemon_faults.py) fails commands
before they reach the media; these do reach it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

import hostlib
from ssdemu.tools.daemon_process import DaemonProcess

FS_BYTES = 40 << 20
MEDIA = "32M"


@pytest.fixture
def small_fs():
    """A 40 MiB tmpfs of its own (O_DIRECT works on tmpfs), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where = tempfile.mkdtemp(prefix="ssdemu-enospc-", dir="/var/tmp")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", where],
                       capture_output=True, text=True)
    if p.returncode != 0:
        shutil.rmtree(where, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs: {p.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", where], check=False)
        shutil.rmtree(where, ignore_errors=True)


def _fill(where: str) -> str:
    """Take every byte the filesystem has left; returns the filler's path."""
    path = os.path.join(where, "filler")
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\xff" * (64 << 10))
                f.flush()
        except OSError:
            pass
    return path


def _status(call) -> str:
    try:
        call()
    except hostlib.DeviceError as e:
        return e.status_name
    return "ok"


@pytest.mark.parametrize("which", ["value", "journal"])
def test_writes_that_fail_at_the_media_lose_nothing_acknowledged(small_fs, tmp_path, which):
    """which: the failing put needs new space for its value (the value's write fails), or
    has the same bytes as a stored value (the store shares that extent: only its journal
    record is written, and that write fails)."""
    img = os.path.join(small_fs, "drive.img")
    sock = str(tmp_path / "s.sock")
    rng = np.random.default_rng(9)
    v1 = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    v2 = v1 if which == "journal" else rng.integers(0, 256, 1 << 20, np.uint8).tobytes()
    d = DaemonProcess(sock, media=f"file:{img}:{MEDIA}", extra=["--timing", "off"])
    try:
        with hostlib.connect(sock) as dev:
            ns = dev.ns_create(4 << 20)
            blk = dev.alloc(64 << 10)
            blk[:] = 0x5A
            dev.write(ns, 0, blk)  # the namespace's first 64 KiB: on the media
            dev.kv_put(b"k1", v1)
            chain = [bytes([i]) * 16 for i in range(1, 4)]
            for k in chain:
                dev.kv_put(k, b"block")
            dev.flush()
            dedup = dev.log()["store"]["dedup_hits"]
            filler = _fill(small_fs)
            # a block write into the namespace's unwritten space: the kernel refuses it,
            # and what was written stays readable
            assert _status(lambda: dev.write(ns, 4096, blk)) == "MEDIA_ERROR"
            out = dev.alloc(64 << 10)
            dev.read(ns, 0, out)
            assert (out == 0x5A).all()
            assert dev.log()["store"]["failed"] == 0
            # the put whose write fails
            assert _status(lambda: dev.kv_put(b"k2", v2)) == "MEDIA_ERROR"
            log = dev.log()["store"]
            assert log["dedup_hits"] == dedup + (which == "journal")
            # the store cannot trust its index any more (it may hold the failed put:
            # before, k2 read back here and was gone after a restart), so it refuses reads
            # as well as changes until it is opened again
            assert log["failed"] == 1
            for call in (lambda: dev.kv_get(b"k1"), lambda: dev.kv_get(b"k2"),
                         lambda: dev.kv_exists_async(b"k1").result(),
                         lambda: dev.kv_list(), lambda: dev.prefix_match(chain),
                         lambda: dev.kv_put(b"k4", b"x"), lambda: dev.kv_delete(b"k1")):
                assert _status(call) == "MEDIA_ERROR"
            dev.read(ns, 0, out)  # block I/O to written space still works
            assert (out == 0x5A).all()
        os.unlink(filler)  # room again, as after a fix; then the drive is power-cycled
        assert d.terminate()[0] == 0
        d = DaemonProcess(sock, media=f"file:{img}", extra=["--timing", "off"])
        with hostlib.connect(sock) as dev:
            assert dev.kv_get(b"k1") == v1  # acknowledged: kept
            assert not dev.kv_exists(b"k2")  # refused: absent
            assert dev.prefix_match(chain) == 3
            out = dev.alloc(64 << 10)
            dev.read(ns, 0, out)
            assert (out == 0x5A).all()
            dev.kv_put(b"k2", v2)  # and it works again
            assert dev.kv_get(b"k2") == v2
            assert dev.log()["store"]["failed"] == 0
    finally:
        assert d.terminate()[0] == 0
