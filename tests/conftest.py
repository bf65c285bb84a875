"""Shared fixtures: real media of every kind, small, under temp dirs, cleaned up."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile

import daemon_fork
import pytest
from envcheck import missing

daemon_fork.install()  # DaemonProcess forks its daemons from a preloaded server

MEDIA_BYTES = 64 << 20
SHM = "/dev/shm"


@pytest.fixture
def shm_dir():
    """A temp dir on tmpfs (O_DIRECT works there since Linux 6.6)."""
    d = tempfile.mkdtemp(prefix="ssdemu-test-", dir=SHM if os.path.isdir(SHM) else None)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def disk_dir():
    """A temp dir on the root filesystem (ext4 here), not tmpfs."""
    d = tempfile.mkdtemp(prefix="ssdemu-test-", dir="/var/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _losetup_available() -> str | None:
    if os.geteuid() != 0:
        return "loop devices need root"
    if shutil.which("losetup") is None:
        return "losetup not installed"
    return None


@contextlib.contextmanager
def _loop(nbytes: int, sector_bytes: int = 512):
    """A loop device with direct I/O over a fresh file in /var/tmp, detached afterwards."""
    why = _losetup_available()
    if why:
        missing(why)
    d = tempfile.mkdtemp(prefix="ssdemu-loop-", dir="/var/tmp")
    backing = os.path.join(d, "backing.img")
    with open(backing, "wb") as f:
        f.truncate(nbytes)
    proc = subprocess.run(["losetup", "-f", "--show", "--direct-io=on", "--sector-size",
                           str(sector_bytes), backing], capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
        pytest.skip(f"losetup failed: {proc.stderr.strip()}")
    dev = proc.stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def loop_device():
    """A real block device: a loop device with direct I/O over a file, detached afterwards."""
    with _loop(MEDIA_BYTES) as dev:
        yield dev


@pytest.fixture
def loop4k_device():
    """A 256 MiB loop device with 4 KiB logical sectors, as many NVMe drives are formatted."""
    with _loop(256 << 20, 4096) as dev:
        yield dev


MEDIA_KINDS = ["file-tmpfs", "file-ext4", "mem", "block"]
SHARED_MEMORY_KINDS = ("file-tmpfs", "mem")  # the engine's I/O runs inline there by default


@contextlib.contextmanager
def media_of_kind(kind: str, request):
    """A media spec of one of MEDIA_KINDS, MEDIA_BYTES big, removed afterwards."""
    if kind == "mem":
        yield f"mem:{MEDIA_BYTES}"
        return
    if kind == "block":
        yield f"block:{request.getfixturevalue('loop_device')}"
        return
    base = SHM if kind == "file-tmpfs" else "/var/tmp"
    d = tempfile.mkdtemp(prefix="ssdemu-test-", dir=base)
    try:
        yield f"file:{d}/media.img:{MEDIA_BYTES}"
    finally:
        shutil.rmtree(d, ignore_errors=True)


# The data plane's media paths: shared memory copied inline by the data plane, and a file on
# ext4 and a block device through io_uring.  Tests of the KV data plane, retrieval, COUNTERS
# and pins run on each (ring_media), so that none passes on memory media alone.
RING_KINDS = {"mem": "inline", "file": "io_uring", "block": "io_uring"}


@contextlib.contextmanager
def ring_media(kind: str, nbytes: int):
    """(media spec, the media_io identify must report) of a RING_KINDS kind, nbytes big,
    fresh (a loop device of its own), removed afterwards."""
    if kind == "mem":
        yield f"mem:{nbytes}", RING_KINDS[kind]
    elif kind == "block":
        with _loop(nbytes) as dev:
            yield f"block:{dev}", RING_KINDS[kind]
    else:
        d = tempfile.mkdtemp(prefix="ssdemu-test-", dir="/var/tmp")
        try:
            yield f"file:{d}/media.img:{nbytes}", RING_KINDS[kind]
        finally:
            shutil.rmtree(d, ignore_errors=True)


def check_media_io(socket_path: str, expected: str) -> None:
    """The daemon reaches its media the way the test means it to (identify's media_io)."""
    import hostlib

    with hostlib.connect(socket_path) as dev:
        got = dev.identify()["media_io"]
    assert got == expected, (got, expected)


@pytest.fixture(params=MEDIA_KINDS)
def media_spec(request):
    """One media spec of each kind, MEDIA_BYTES big."""
    with media_of_kind(request.param, request) as spec:
        yield spec


def daemon_with_sitecustomize(tmp_path, monkeypatch, sitecustomize: str,
                              media: str = "mem:64M"):
    """A daemon in a new interpreter (python given: not a fork of the suite's server) that
    imports `sitecustomize` at start: a fault a test plants in the daemon's own code.
    Returns (the DaemonProcess, its log's path); the caller terminates it."""
    import sys

    from ssdemu.tools.daemon_process import DaemonProcess

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(sitecustomize)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    log = tmp_path / "daemon.log"
    return DaemonProcess(str(tmp_path / "d.sock"), media=media, log_path=str(log),
                         python=sys.executable), log
