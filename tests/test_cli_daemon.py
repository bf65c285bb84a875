"""`ssdemu ctl` and `ssdemu bench queue` as a user runs them, against a real daemon."""

import json
import shutil
import subprocess
import sys

import pytest

from ssdemu.daemon_process import DaemonProcess


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


def test_bench_queue_json():
    p = ssdemu("bench", "queue", "--seconds", "1", "--media", "mem:64M", "--ns-size", "16M",
               "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    for key in ("nop_rtt_us_p50", "nop_rtt_us_p99", "nop_batch32_rtt_us_p50",
                "nop_batch32_rtt_us_p99", "randread_4k_qd32_iops"):
        assert r[key] > 0, key
    assert r["bytes_copied_per_read_registered"] == 0
    assert r["bytes_copied_per_read_bounce"] == 4096
    if shutil.which("fio"):
        assert r["ratio_fio"] == r["randread_4k_qd32_iops"] / r["fio_randread_4k_qd32_iops"]


@pytest.mark.parametrize("profile", ["star2000d", "pcie4-tlc"])
def test_bench_device_json(profile):
    p = ssdemu("bench", "device", "--profile", profile, "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert abs(r["seq_read_1m_qd32"]["error_pct"]) <= 2
    assert abs(r["rand_read_4k_qd256"]["error_pct"]) <= 2
    assert r["rand_read_4k_qd256"]["analytical_iops"] > 0


def test_bench_device_unknown_profile():
    p = ssdemu("bench", "device", "--profile", "nope")
    assert p.returncode == 1 and "no profile 'nope'" in p.stderr
