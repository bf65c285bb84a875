"""`ssdemu mount` (c/mount/sde_mount.c, FUSE) and `ssdemu fs up/down` (ext4 on a namespace
through a loop device): unmodified programs on the drive, a real kernel mount, a real loop
device, a real daemon.  Every test leaves no mount, loop device or process behind (checked)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import hostlib
from ssdemu.tools import mount
from ssdemu.tools.daemon_process import DaemonProcess

MIB = 1 << 20


def _ours(root) -> list[tuple[str, str, str]]:
    """The mounts under root (a test's own folder: other test files run beside this one,
    and may have theirs)."""
    root = os.path.realpath(root)
    return [m for m in mount.mounts() if m[1].startswith(root + "/")]


def _our_loops(root) -> list[str]:
    """Loop devices on a file under root."""
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if os.path.realpath(root) + "/" in line]


@pytest.fixture
def drive(tmp_path):
    """A drive with timing (star2000d) and two namespaces of this uid; afterwards, nothing
    of ours mounted and no loop device on a drive's file."""
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:256M")
    with hostlib.connect(d.socket_path) as dev:
        nsids = [dev.ns_create(64 * MIB), dev.ns_create(8 * MIB)]
    yield d, nsids
    assert d.terminate()[0] == 0
    assert _ours(tmp_path) == [] and _our_loops(tmp_path) == []


def ssdemu(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ssdemu", *args], capture_output=True,
                          text=True, timeout=120, **kw)


def test_each_namespace_is_a_file_of_its_size_read_and_written_as_the_drive(drive, tmp_path):
    d, (a, b) = drive
    key = tmp_path / "k.key"
    ssdemu("owner-key", str(key))
    with hostlib.connect(d.socket_path, owner_key_file=str(key)) as dev:
        dev.ns_create(4 * MIB)  # another owner's: not in this client's mount
    (tmp_path / "m").mkdir()
    with mount.Mount(d.socket_path, str(tmp_path / "m")) as m:
        files = m.files()
        assert sorted(files) == [a, b]
        assert os.path.getsize(files[a]) == 64 * MIB and os.path.getsize(files[b]) == 8 * MIB
        rng = np.random.default_rng(3)
        data = rng.integers(0, 256, 3 * MIB + 777, dtype=np.uint8).tobytes()
        fd = os.open(files[a], os.O_RDWR)
        try:
            # unaligned both ends: the sectors around it read, patched, written
            assert os.pwrite(fd, data, 12_345) == len(data)
            assert os.pread(fd, len(data), 12_345) == data
            os.fsync(fd)
            with pytest.raises(OSError) as e:  # a file here never grows
                os.pwrite(fd, b"x" * 10, 64 * MIB - 5)
            assert e.value.errno == 28
            assert os.pread(fd, 100, 64 * MIB - 10) == bytes(10)  # to the end, and no further
        finally:
            os.close(fd)
        # O_DIRECT, 1 MiB aligned
        fd = os.open(files[b], os.O_RDWR | os.O_DIRECT)
        buf = np.frombuffer(__import__("mmap").mmap(-1, MIB), np.uint8)
        buf[:] = rng.integers(0, 256, MIB, dtype=np.uint8)
        try:
            assert os.pwritev(fd, [buf], 2 * MIB) == MIB
        finally:
            os.close(fd)
        with hostlib.connect(d.socket_path) as dev:  # the drive holds what the files say
            got = dev.alloc(MIB)
            dev.read(b, 2 * MIB // 512, got)
            assert bytes(got) == buf.tobytes()
            dev.read(a, 12_288 // 512, got)
            assert bytes(got[57:]) == data[:MIB - 57]
            assert dev.log()["classes"]["flush"]["commands"] >= 1  # the fsync


@pytest.mark.parametrize("engine", ["psync", "io_uring"])
def test_fio_with_verify_on_the_mounts_file(drive, tmp_path, engine):
    d, (a, _) = drive
    (tmp_path / "m").mkdir()
    with mount.Mount(d.socket_path, str(tmp_path / "m")) as m:
        proc = subprocess.run(
            ["fio", "--name=m", f"--filename={m.files()[a]}", f"--ioengine={engine}",
             "--direct=1", "--rw=randwrite", "--bs=4k", "--iodepth=8", "--size=16m",
             "--verify=crc32c", "--do_verify=1", "--output-format=json"],
            capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr[-400:]
        (job,) = json.loads(proc.stdout[proc.stdout.index("{"):])["jobs"]
        assert job["error"] == 0 and job["read"]["io_bytes"] == 16 * MIB


def test_sigterm_unmounts_and_bad_starts_are_one_line(drive, tmp_path):
    d, _ = drive
    point = tmp_path / "m"
    point.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "ssdemu", "mount", "--socket", d.socket_path,
                             str(point)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not mount.mounted(str(point), mount.FSTYPE):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        # a second mount on it: busy
        p = ssdemu("mount", "--socket", d.socket_path, str(point))
        assert p.returncode == 1 and p.stderr.strip().endswith("something is mounted there "
                                                               "already")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        proc.stderr.close()
    assert not mount.mounted(str(point))
    p = ssdemu("mount", "--socket", str(tmp_path / "none.sock"), str(point))
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1
    assert "cannot reach ssdemu" in p.stderr
    p = ssdemu("mount", "--socket", d.socket_path, str(tmp_path / "nowhere"))
    assert p.returncode == 1 and "is not a directory" in p.stderr


def test_ext4_on_the_drive_up_down_and_up_again(drive, tmp_path):
    """mkfs and mount through `fs up`; files written and fsynced; `fs down`; the filesystem
    checked clean (e2fsck -fn on the drive's file, through the mount alone); `fs up` again
    without mkfs: the files as written."""
    d, (a, _) = drive
    point = tmp_path / "fs"
    point.mkdir()
    p = ssdemu("fs", "up", "--socket", d.socket_path, "--nsid", str(a), "--mkfs", str(point))
    assert p.returncode == 0, p.stderr
    try:
        assert mount.mounted(str(point), "ext4").startswith("/dev/loop")
        rng = np.random.default_rng(5)
        want = {f"f{i}": rng.integers(0, 256, int(rng.integers(1, 2 * MIB)),
                                      dtype=np.uint8).tobytes() for i in range(6)}
        for name, data in want.items():
            with open(point / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
    finally:
        p = ssdemu("fs", "down", str(point))
        assert p.returncode == 0, p.stderr
    assert not mount.mounted(str(point))
    (tmp_path / "m").mkdir()
    with mount.Mount(d.socket_path, str(tmp_path / "m")) as m:
        check = subprocess.run(["e2fsck", "-fn", m.files()[a]], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout[-400:]
    p = ssdemu("fs", "up", "--socket", d.socket_path, "--nsid", str(a), str(point))
    assert p.returncode == 0, p.stderr
    try:
        for name, data in want.items():
            assert (point / name).read_bytes() == data, name
    finally:
        assert ssdemu("fs", "down", str(point)).returncode == 0


def test_fs_up_refuses_what_it_cannot_do_and_undoes_what_it_did(drive, tmp_path):
    d, (a, _) = drive
    point = tmp_path / "fs"
    point.mkdir()
    p = ssdemu("fs", "up", "--socket", d.socket_path, "--nsid", "9", str(point))
    assert p.returncode == 1 and "namespace 9 is not one of this client's" in p.stderr
    # no filesystem on it yet: mount fails, and the loop device and drive mount are undone
    p = ssdemu("fs", "up", "--socket", d.socket_path, "--nsid", str(a), str(point))
    assert p.returncode == 1 and "mount" in p.stderr
    assert not mount.mounted(str(point)) and _ours(tmp_path) == []
    assert _our_loops(tmp_path) == []
    p = ssdemu("fs", "down", str(point))
    assert p.returncode == 1 and "no ext4 on a loop device" in p.stderr


def test_a_host_without_fuse_gets_one_line(drive, tmp_path):
    """/dev/fuse gone (an empty /dev in a mount namespace of its own): said so, exit 1."""
    d, _ = drive
    (tmp_path / "m").mkdir()
    p = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs none /dev && exec "$@"',
                        "sh", *mount.argv(d.socket_path, str(tmp_path / "m"))],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [
        "ssdemu-mount: FUSE is missing (/dev/fuse: No such file or directory): modprobe fuse, "
        "or apt-get install fuse3"]


@pytest.mark.slow
def test_bench_stack_prints_each_layer_and_what_it_adds(tmp_path):
    p = ssdemu("bench", "stack", "--media", "mem:256M", "--seconds", "0.3", "--size", "32M",
               "--json", env=os.environ | {"TMPDIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr[-500:]
    r = json.loads(p.stdout)
    rows = {row["layer"]: row for row in r["layers"]}
    assert list(rows) == ["media", "queue", "engine", "mount", "ext4"]
    for i, row in enumerate(r["layers"]):
        assert row["qd1_lat_us_p99"] >= row["qd1_lat_us_p50"] > 0
        assert row["qd32_iops"] > 0
        if i:
            below = r["layers"][i - 1]
            assert row["qd1_adds_us_p50"] == pytest.approx(row["qd1_lat_us_p50"]
                                                           - below["qd1_lat_us_p50"])
            assert row["qd32_iops_ratio"] == pytest.approx(row["qd32_iops"] / below["qd32_iops"])
    assert _ours(tmp_path) == [] and _our_loops(tmp_path) == []


@pytest.mark.slow
def test_fsynced_files_on_ext4_survive_the_drives_power_cuts(tmp_path):
    """`ssdemu fs crash`: power cuts under ext4 while writers fsync files; every fsynced file
    whole after each, e2fsck clean after each journal replay."""
    d = DaemonProcess(str(tmp_path / "s.sock"), media=f"file:{tmp_path / 'd.img'}:256M",
                      extra=["--power-cut", "--profile", "star2000d"],
                      log_path=str(tmp_path / "d.log"))
    try:
        with hostlib.connect(d.socket_path) as dev:
            nsid = dev.ns_create(96 * MIB)
        p = ssdemu("fs", "crash", "--socket", d.socket_path, "--nsid", str(nsid), "--cycles",
                   "3", "--seconds", "0.5", "--seed", "58", "--dir", str(tmp_path / "w"),
                   "--json")
        assert p.returncode == 0, p.stderr[-500:] + p.stdout[-500:]
        r = json.loads(p.stdout)
        assert r["cycles"] == 3 and r["durable_files"] > 0
        assert r["lost"] == [] and r["corrupt"] == [] and r["fsck_unclean"] == []
    finally:
        assert d.terminate()[0] == 0
    log = (tmp_path / "d.log").read_text()
    assert log.count("power cut injected") == 3  # the drive really lost power each time
    assert _ours(tmp_path) == [] and _our_loops(tmp_path) == []


def test_fs_crash_on_a_drive_without_power_cuts_says_so(drive, tmp_path):
    d, (a, _) = drive
    p = ssdemu("fs", "crash", "--socket", d.socket_path, "--nsid", str(a), "--cycles", "1",
               "--seconds", "0.1", "--dir", str(tmp_path / "w"))
    assert p.returncode == 1 and "power" in p.stderr.splitlines()[-1], p.stderr


def test_bench_mlperf_kv_runs_the_benchmark_on_ext4_on_the_drive_and_on_disk(tmp_path):
    """The plumbing of `bench mlperf-kv`, through a stand-in of the benchmark's kv-cache.py
    (tests/data/mlperf_standin): its cache folder on ext4 on the drive, then on the disk, the
    same arguments; its files counted whole, short or corrupt, the same after a remount; the
    drive's bytes; nothing left mounted."""
    from ssdemu.bench.mlperf_file import bench_mlperf_kv

    standin = os.path.join(os.path.dirname(__file__), "data", "mlperf_standin")
    r = bench_mlperf_kv(standin, users=2, duration=1, capacity_gb=0.1, where=str(tmp_path))
    for side in ("on_drive", "own_disk"):
        assert r[side]["files"] == {"whole": 2, "short": 1, "corrupt": 0}, side
        assert r[side]["requests"] == 3 and r[side]["storage_io_latency_ms"]["p95"] == 2.0
    d = r["on_drive"]
    assert d["files_same_after_remount"] is True
    assert d["drive_write_bytes"] >= 3 * 4 * 2 * 256 * 8 * 16 * 2  # the entries, at least
    assert _ours(tmp_path) == [] and _our_loops(tmp_path) == []
    assert os.listdir(tmp_path) == []  # its work folder removed
    p = ssdemu("bench", "mlperf-kv", "--benchmark", str(tmp_path))
    assert p.returncode == 1 and "kv-cache.py not found" in p.stderr
