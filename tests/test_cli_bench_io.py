"""`ssdemu bench io` as a user runs it: a real subprocess, real fio."""

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.external  # fio: `make test-fast` skips it

SSDEMU = [sys.executable, "-m", "ssdemu"]


def run(*args, env=None):
    return subprocess.run([*SSDEMU, *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("kind", ["file", "mem"])
def test_bench_io_json_has_both_sides(shm_dir, kind):
    if shutil.which("fio") is None:
        pytest.skip("fio not installed")
    media = f"file:{shm_dir}/m.img:16M" if kind == "file" else "mem:16M"
    p = run("bench", "io", "--media", media, "--rw", "randread",
            "--bs", "4k", "--qd", "8", "--seconds", "1", "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    for side in ("ours", "fio"):
        for key in ("iops", "bandwidth_bytes_per_s", "lat_us_p50", "lat_us_p99", "lat_us_p999"):
            assert report[side][key] > 0
    assert report["ratio"]["iops"] == pytest.approx(report["ours"]["iops"] / report["fio"]["iops"])
    assert report["prefilled"] is True  # a new sparse file is filled before reads


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
