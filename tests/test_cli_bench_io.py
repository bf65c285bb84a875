"""`ssdemu bench io` as a user runs it: a real subprocess, real fio."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from envcheck import missing

pytestmark = pytest.mark.external  # fio: `make test-fast` skips it

SSDEMU = [sys.executable, "-m", "ssdemu"]


def run(*args, env=None):
    return subprocess.run([*SSDEMU, *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("kind", ["file", "mem"])
def test_bench_io_json_has_both_sides(shm_dir, kind):
    if shutil.which("fio") is None:
        missing("fio not installed")
    media = f"file:{shm_dir}/m.img:16M" if kind == "file" else "mem:16M"
    p = run("bench", "io", "--media", media, "--rw", "randread",
            "--bs", "4k", "--qd", "8", "--seconds", "1", "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    for side in ("ours", "fio"):
        for key in ("iops", "bandwidth_bytes_per_s", "lat_us_p50", "lat_us_p99", "lat_us_p999"):
            assert report[side][key] > 0
    assert report["prefilled"] is True  # a new sparse file is filled before reads


@pytest.mark.parametrize("rw,bs,qd", [("randread", 4096, 8), ("write", 65536, 4)])
def test_bench_io_runs_fio_on_its_media_and_reports_fios_figures(shm_dir, tmp_path, rw, bs,
                                                                  qd):
    """Through a fio stand-in that records its arguments and prints known figures: fio ran
    on the bench's own file, over its whole size from offset 0, with the same direction,
    block size and depth, O_DIRECT through io_uring; the report carries fio's figures as fio
    gave them and the ratio against them."""
    import fio_standin

    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = fio_standin.install(bindir)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FIO_STANDIN_LOG=str(log))
    path = f"{shm_dir}/m.img"
    p = run("bench", "io", "--media", f"file:{path}:16M", "--rw", rw, "--bs", str(bs),
            "--qd", str(qd), "--seconds", "0.5", "--repeat", "2", "--json", env=env)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    calls = fio_standin.calls(log)
    assert len(calls) == 2  # once per repeat, beside ours
    for c in calls:
        assert c["filename"] == path and c["rw"] == rw and c["bs"] == str(bs)
        assert c["iodepth"] == str(qd) and c["direct"] == "1" and c["ioengine"] == "io_uring"
        assert c["offset"] == "0" and c["size"] == str(16 << 20)
    fio = report["fio"]
    assert fio["iops"] == fio_standin.IOPS
    assert fio["bandwidth_bytes_per_s"] == fio_standin.BW_BYTES
    assert fio["lat_us_p50"] == fio_standin.P50_NS / 1000
    assert fio["lat_us_p99"] == fio_standin.P99_NS / 1000
    assert report["ratio"]["iops"] == pytest.approx(report["ours"]["iops"] / fio_standin.IOPS)


def test_bench_io_table_without_fio(shm_dir, tmp_path):
    # a PATH with the interpreter's dir but no fio: the bench says so and still reports ours
    bindir = tmp_path / "bin"
    bindir.mkdir()
    env = dict(os.environ, PATH=str(bindir))
    p = run("bench", "io", "--media", "mem:8M", "--rw", "write", "--bs", "64k", "--qd", "4",
            "--seconds", "1", env=env)
    assert p.returncode == 0, p.stderr
    assert "fio not found" in p.stdout
    assert "IOPS" in p.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--media", "mem:8M", "--bs", "1000"], "not a multiple"),
        (["--media", "mem:8M", "--bs", "4x"], "bad size"),
        (["--media", "mem:8M", "--qd", "0"], "must be positive"),
        (["--media", "nowhere:8M"], "bad media spec"),
        (["--media", "file:/nonexistent-dir/m.img"], "does not exist"),
        (["--media", "mem:8M", "--rw", "trim"], "invalid choice"),
        (["--media", "mem:8M", "--qd", "8", "--submit-batch", "9"], "--submit-batch must be"),
        (["--media", "mem:8M", "--submit-batch", "-1"], "--submit-batch must be"),
    ],
)
def test_bench_io_bad_input_one_line(args, message):
    p = run("bench", "io", *args, "--seconds", "1")
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], p.stderr
