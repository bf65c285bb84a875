"""`ssdemu ctl` and `ssdemu bench queue` as a user runs them, against a real daemon."""

import json
import os
import re
import subprocess
import sys

import pytest

from ssdemu.tools.daemon_process import DaemonProcess


def ssdemu(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "ssdemu", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(str(tmp_path / "sde.sock"))
    yield d
    code, err = d.terminate()
    assert code == 0, err


def test_ctl_admin_round(daemon):
    sock = ["--socket", daemon.socket_path]
    p = ssdemu("ctl", *sock, "--json", "identify")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["media_bytes"] == 64 << 20
    assert ssdemu("ctl", *sock, "ns-create", "16M").stdout.strip() == "created namespace 1"
    p = ssdemu("ctl", *sock, "--json", "ns-list")
    (ns,) = json.loads(p.stdout)
    assert ns["nsid"] == 1 and ns["bytes"] == 16 << 20
    p = ssdemu("ctl", *sock, "ns-list")
    assert "16M" in p.stdout
    p = ssdemu("ctl", *sock, "--json", "log")
    assert json.loads(p.stdout)["classes"]["admin"]["commands"] >= 3
    assert ssdemu("ctl", *sock, "ns-delete", "1").returncode == 0


def test_ctl_as_an_owner_and_as_an_admin(daemon, tmp_path):
    """owner-key writes a key once; ctl acts as that owner with --owner-key-file or the
    environment variable; the uid alone (here an admin) sees the owner's namespace only
    with --all-owners, and deletes it only with --any-owner."""
    sock = ["--socket", daemon.socket_path]
    key = str(tmp_path / "exp.key")
    p = ssdemu("owner-key", key)
    assert p.returncode == 0 and "mode 0600" in p.stdout, p.stderr
    p = ssdemu("owner-key", key)
    assert p.returncode == 1 and "never overwritten" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = ssdemu("ctl", *sock, "--owner-key-file", key, "ns-create", "0")
    assert p.stdout.strip() == "created namespace 1", p.stderr
    env = dict(os.environ, SSDEMU_OWNER_KEY_FILE=key)
    p = subprocess.run([sys.executable, "-m", "ssdemu", "ctl", *sock, "--json", "ns-list"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert [n["nsid"] for n in json.loads(p.stdout)] == [1], p.stderr
    assert json.loads(ssdemu("ctl", *sock, "--json", "ns-list").stdout) == []
    p = ssdemu("ctl", *sock, "ns-list", "--all-owners")
    assert p.returncode == 0 and f"uid {os.getuid()}" in p.stdout
    p = ssdemu("ctl", *sock, "ns-delete", "1")
    assert p.returncode == 1 and "INVALID_NAMESPACE" in p.stderr
    assert ssdemu("ctl", *sock, "ns-delete", "1", "--any-owner").returncode == 0
    p = ssdemu("ctl", *sock, "--owner-key-file", str(tmp_path / "none.key"), "identify")
    assert p.returncode == 1 and "cannot read owner key" in p.stderr


@pytest.mark.parametrize("args,msg", [
    (["ns-delete", "9"], "INVALID_NAMESPACE"),
    (["ns-create", "1000"], "INVALID_FIELD"),
    (["ns-create", "1T"], "CAPACITY_EXCEEDED"),
    (["log", "7"], "INVALID_FIELD"),
])
def test_ctl_errors_are_one_line(daemon, args, msg):
    p = ssdemu("ctl", "--socket", daemon.socket_path, *args)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and msg in p.stderr


def test_ctl_without_daemon(tmp_path):
    p = ssdemu("ctl", "--socket", str(tmp_path / "none.sock"), "identify")
    assert p.returncode == 1 and "cannot reach ssdemu" in p.stderr


def test_bench_queue_json(tmp_path):
    """Through a fio stand-in (tests/fio_standin.py): the bench ran fio on the daemon's own
    media, at the namespace's offset and over its size, 4 KiB random reads at QD32, and
    reports fio's figure as fio gave it."""
    import fio_standin

    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = fio_standin.install(bindir)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FIO_STANDIN_LOG=str(log))
    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "queue", "--seconds", "1",
                        "--media", "mem:64M", "--ns-size", "16M", "--json"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    for key in ("nop_rtt_us_p50", "nop_rtt_us_p99", "nop_batch32_rtt_us_p50",
                "nop_batch32_rtt_us_p99", "randread_4k_qd32_iops"):
        assert r[key] > 0, key
    assert r["bytes_copied_per_read_registered"] == 0
    assert r["bytes_copied_per_read_bounce"] == 4096
    # the data plane slept between the NOPs' phases at least; its spin counters are counts
    assert r["data_plane_sleeps"] > 0
    assert r["data_plane_sleeps_shared_cpu"] >= 0 and r["data_plane_spin_backoffs"] >= 0
    every = fio_standin.calls(log)
    calls = [c for c in every if c["ioengine"] == "io_uring"]  # fio on the media
    assert calls, "fio was not run"
    # fio through its ssdemu engine on the bench's namespace (the socket, the nsid), and fio's
    # null engine (its own cost per I/O), the same job
    through = [c for c in every if c["ioengine"].startswith("external:")]
    null = [c for c in every if c["ioengine"] == "null"]
    assert len(through) == len(null) == len(calls) == r["slices"]
    for c in through:
        assert c["ioengine"].endswith("build/fio/ssdemu-fio.so") and c["nsid"] != "0"
        assert c["filename"].endswith(".sock")
        assert (c["rw"], c["bs"], c["iodepth"]) == ("randread", "4096", "32")
    assert r["fio_engine_randread_4k_qd32_iops"] == fio_standin.IOPS
    assert r["ratio_engine"] == pytest.approx(fio_standin.IOPS / r["randread_4k_qd32_iops"])
    assert r["fio_null_randread_4k_qd32_iops"] == fio_standin.IOPS
    offsets = {c["offset"] for c in calls}
    assert len(offsets) == 1 and int(offsets.pop()) > 0  # the namespace's, past the store's
    for c in calls:  # the daemon's memfd, as other processes reach it
        assert re.fullmatch(r"/proc/\d+/fd/\d+", c["filename"]), c["filename"]
        assert (c["rw"], c["bs"], c["iodepth"], c["size"]) == ("randread", "4096", "32",
                                                               str(16 << 20))
        assert c["direct"] == "1" and c["ioengine"] == "io_uring"
    assert r["fio_randread_4k_qd32_iops"] == fio_standin.IOPS
    assert r["ratio_fio"] == pytest.approx(r["randread_4k_qd32_iops"] / fio_standin.IOPS)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["star2000d", "pcie4-tlc"])
def test_bench_device_json(profile):
    p = ssdemu("bench", "device", "--profile", profile, "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    f = r["figures"]
    cited = [k for k, v in f.items() if "source" in v]
    # sequential read and write, random read fresh and steady, random write fresh and
    # steady, QD1 read and write latency; the profiles cite seven and mark one (fresh random
    # writes, which no public datasheet quotes) assumed
    assert len(f) == 8 and len(cited) >= 7 and r["cited_within_5pct"] == len(cited)
    for k in cited:
        assert abs(f[k]["error_pct"]) <= 5, (k, f[k])
    for k, v in f.items():  # the assumed ones within their stated ranges
        assert "declared" in v and abs(v["error_pct"]) <= 5, (k, v)
    # ageing: steady-state random writes well below fresh ones, GC writing more than the host
    steady, fresh = f["rand_write_4k_iops_steady"], f["rand_write_4k_iops_fresh"]
    assert steady["modelled"] < fresh["modelled"] / 2
    assert r["write_amplification"] > 1.5 and r["steady_state"]["steady"]
    assert r["steady_state"]["erases"] > 0 and r["steady_state"]["gc_ns"] > 0
    assert 0 < r["scale"]["scale"] < 1 and r["scale"]["overprovisioning"] > 0


def test_bench_device_unknown_profile():
    p = ssdemu("bench", "device", "--profile", "nope")
    assert p.returncode == 1 and "no profile 'nope'" in p.stderr


def test_a_socket_dir_fits_a_unix_socket_under_a_long_tmpdir(tmp_path, monkeypatch):
    """A TMPDIR too long for sun_path (a pytest-xdist worker's tmp_path, or a user's) gives a
    directory under /tmp instead of a daemon that dies with 'AF_UNIX path too long'."""
    import tempfile

    from ssdemu.tools.daemon_process import MAX_SOCKET_PATH, socket_dir

    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    d = socket_dir("ssdemu-test-")
    try:
        assert len(os.path.join(d, "s.sock").encode()) <= MAX_SOCKET_PATH
        assert d.startswith("/tmp/") and not os.listdir(deep)  # none left behind
    finally:
        os.rmdir(d)
    short = tmp_path / "s"
    short.mkdir()
    monkeypatch.setenv("TMPDIR", str(short))
    monkeypatch.setattr(tempfile, "tempdir", None)
    d = socket_dir("ssdemu-test-")
    assert d.startswith(str(short))  # TMPDIR when it fits


def test_a_private_daemon_that_does_not_start_leaves_no_directory(tmp_path, monkeypatch):
    """A benchmark's daemon that exits at start (here: media it cannot parse) raises with its
    log's tail, and its private directory (socket, log) goes with it (it was left in TMPDIR)."""
    import tempfile

    import pytest

    from ssdemu.tools.daemon_process import private_daemon

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    with pytest.raises(RuntimeError, match="daemon exited"):
        with private_daemon("ssdemu-nostart-", "bogus:1"):
            pass
    assert not [n for n in os.listdir(tmp_path) if n.startswith("ssdemu-nostart-")]


def test_a_socket_path_that_fits_sun_path_is_served_whatever_its_temporary_name(tmp_path):
    """The daemon binds under a temporary name first (path.PID.tmp), which can pass sun_path's
    107 bytes when the path itself does not; it then binds through the directory's
    descriptor and the path works (it failed with 'AF_UNIX path too long')."""
    import hostlib
    from ssdemu.tools.daemon_process import DaemonProcess
    from ssdemu_wire.control import MAX_SOCKET_PATH

    d = tmp_path / "d"
    d.mkdir()
    name = "s" * (MAX_SOCKET_PATH - 1 - len(str(d)) - 1 - 2) + ".s"  # 106 bytes in all
    path = str(d / name)
    assert len(path) == MAX_SOCKET_PATH - 1 and len(f"{path}.4194304.tmp") > MAX_SOCKET_PATH
    daemon = DaemonProcess(path, media="mem:16M")
    try:
        with hostlib.connect(path) as dev:
            dev.nop()
        assert sorted(os.listdir(d)) == [name]  # no temporary name left
    finally:
        code, err = daemon.terminate()
    assert code == 0, err
