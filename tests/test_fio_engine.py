"""fio's ssdemu engine (c/fio/ssdemu_fio.c): unmodified fio job files on the drive's queues.

Every test runs the real fio binary with `--ioengine=external:build/fio/ssdemu-fio.so` against
a real daemon: reads and writes through a job's own queue pair from fio's registered buffers,
fio's verify, several jobs at once, trims and fsyncs as the drive's DEALLOCATE and FLUSH, its
bad options, and QD1 latencies against the profile's modelled QD1 read."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import hostlib
from ssdemu.bench.device import bench_device
from ssdemu.tools import fio_engine
from ssdemu.tools.daemon_process import DaemonProcess

MIB = 1 << 20


def fio(cwd, socket_path: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """fio through the engine, in cwd (where fio leaves its verify state files)."""
    cmd = ["fio", "--name=t", f"--ioengine=external:{fio_engine.path()}",
           f"--filename={socket_path}", "--output-format=json", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-500:]
    return proc


def jobs(proc) -> list[dict]:
    text = proc.stdout
    return json.loads(text[text.index("{"):])["jobs"]


@pytest.fixture
def drive(tmp_path):
    """A drive without timing (the transport alone) and a 16 MiB namespace of this uid."""
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:128M", extra=["--timing", "off"])
    with hostlib.connect(d.socket_path) as dev:
        nsid = dev.ns_create(16 * MIB)
    yield d, nsid
    assert d.terminate()[0] == 0


def test_random_writes_over_a_whole_namespace_verify_with_crc32c(drive, tmp_path):
    d, nsid = drive
    proc = fio(tmp_path, d.socket_path, f"--nsid={nsid}", "--rw=randwrite", "--bs=4k",
               "--iodepth=16", "--verify=crc32c", "--do_verify=1")
    (job,) = jobs(proc)
    assert job["error"] == 0
    assert job["write"]["io_bytes"] == 16 * MIB  # the whole namespace, every block once
    assert job["read"]["io_bytes"] == 16 * MIB  # and all of it read back and verified
    # what fio wrote is on the drive: a block read through hostlib carries fio's verify
    # header (its magic, 0xacca, in the first two bytes)
    with hostlib.connect(d.socket_path) as dev:
        buf = dev.alloc(4096)
        dev.read(nsid, 8 * 100, buf)
        assert int.from_bytes(bytes(buf[:2]), "little") == 0xACCA
        # a block changed behind fio's back: its verify finds it, and fails the job
        buf[64:128] ^= 0xFF
        dev.write(nsid, 8 * 100, buf)
    proc = fio(tmp_path, d.socket_path, f"--nsid={nsid}", "--rw=randwrite", "--bs=4k",
               "--verify=crc32c", "--verify_only", check=False)
    assert proc.returncode != 0
    assert "verify" in (proc.stderr + proc.stdout).lower()


@pytest.mark.parametrize("qd", [1, 8, 128])
def test_several_jobs_each_on_its_own_queue_pair(drive, tmp_path, qd):
    """Three jobs, each its own 4 MiB region, written and verified at queue depth qd."""
    d, nsid = drive
    proc = fio(tmp_path, d.socket_path, f"--nsid={nsid}", "--rw=randwrite", "--bs=8k",
               f"--iodepth={qd}", "--numjobs=3", "--size=4m", "--offset_increment=4m",
               "--verify=crc32c", "--do_verify=1")
    out = jobs(proc)
    assert len(out) == 3 and all(j["error"] == 0 for j in out)
    assert all(j["read"]["io_bytes"] == 4 * MIB for j in out)
    # each job a client of its own: the daemon saw queue pairs come and go, and nothing of
    # them is left
    with hostlib.connect(d.socket_path) as dev:
        assert dev.log()["classes"]["write"]["errors"] == 0


def test_trims_and_fsyncs_are_the_drives_deallocate_and_flush(drive, tmp_path):
    d, nsid = drive
    with hostlib.connect(d.socket_path) as dev:
        before = dev.log()["classes"]
    fio(tmp_path, d.socket_path, f"--nsid={nsid}", "--rw=write", "--bs=64k", "--size=4m",
        "--fsync=4")
    fio(tmp_path, d.socket_path, f"--nsid={nsid}", "--rw=trim", "--bs=64k", "--size=4m")
    with hostlib.connect(d.socket_path) as dev:
        after = dev.log()["classes"]
        buf = dev.alloc(64 * 1024)
        dev.read(nsid, 0, buf)
        assert not buf.any()  # deallocated: reads as zeroes
    # an fsync after every 4 of the 64 writes but the last (the job ends there)
    assert after["flush"]["commands"] - before["flush"]["commands"] >= 15
    assert after["zero"]["commands"] - before["zero"]["commands"] == 64  # the trims


def _one_line(proc) -> str:
    lines = [x for x in proc.stderr.splitlines() if x.startswith("fio: ssdemu:")]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    return lines[0]


def test_bad_options_get_one_line_and_fail_the_job(drive, tmp_path):
    d, nsid = drive
    run = {"check": False}
    line = _one_line(fio(tmp_path, str(tmp_path / "nothing.sock"), "--rw=read", **run))
    assert "cannot reach ssdemu" in line
    line = _one_line(fio(tmp_path, d.socket_path, "--nsid=9", "--rw=read", "--size=1m", **run))
    assert "namespace 9 is not one of this client's" in line
    line = _one_line(fio(tmp_path, d.socket_path, f"--nsid={nsid}", "--rw=read", "--bs=1000",
                         "--size=1m", **run))
    assert "not a multiple of the drive's 512-byte sector" in line
    key = tmp_path / "open.key"
    key.write_text("ab" * 32 + "\n")
    key.chmod(0o644)
    line = _one_line(fio(tmp_path, d.socket_path, f"--owner_key_file={key}", "--rw=read",
                         **run))
    assert "open to others" in line


def test_a_namespace_of_another_owner_key_is_not_this_jobs(drive, tmp_path):
    d, _ = drive
    key = tmp_path / "exp.key"
    subprocess.run([sys.executable, "-m", "ssdemu", "owner-key", str(key)], check=True,
                   capture_output=True)
    with hostlib.connect(d.socket_path, owner_key_file=str(key)) as dev:
        mine = dev.ns_create(4 * MIB)
    line = _one_line(fio(tmp_path, d.socket_path, f"--nsid={mine}", "--rw=read",
                         check=False))
    assert f"namespace {mine} is not one of this client's" in line
    (job,) = jobs(fio(tmp_path, d.socket_path, f"--nsid={mine}", f"--owner_key_file={key}",
                      "--rw=read", "--bs=64k"))
    assert job["error"] == 0 and job["read"]["io_bytes"] == 4 * MIB


@pytest.mark.serial
@pytest.mark.parametrize("profile", ["star2000d", "pcie4-tlc"])
def test_qd1_reads_take_the_profiles_modelled_qd1_read(tmp_path, profile):
    """4 KiB QD1 random reads on a drive with timing: never faster than the model's QD1 read,
    and its median within the host's round trip (tens of microseconds) of it."""
    modelled_us = bench_device(profile)["figures"]["qd1_read_4k_latency_ns"]["modelled"] / 1e3
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:128M", extra=["--profile", profile])
    try:
        with hostlib.connect(d.socket_path) as dev:
            nsid = dev.ns_create(16 * MIB)
            chunk = dev.alloc(MIB)
            chunk[:] = np.random.default_rng(0).integers(0, 256, MIB, dtype=np.uint8)
            for off in range(0, 16 * MIB, MIB):  # written: reads of holes are not NAND reads
                dev.write(nsid, off // 512, chunk)
        (job,) = jobs(fio(tmp_path, d.socket_path, f"--nsid={nsid}", "--rw=randread",
                          "--bs=4k", "--iodepth=1", "--runtime=2", "--time_based"))
    finally:
        assert d.terminate()[0] == 0
    pct = {k: v / 1e3 for k, v in job["read"]["clat_ns"]["percentile"].items()}
    assert pct["1.000000"] >= 0.97 * modelled_us, (pct["1.000000"], modelled_us)
    assert pct["50.000000"] <= modelled_us + 60, (pct["50.000000"], modelled_us)
