"""Bad values at the command line: one line each, the right exit code, nothing touched."""

from __future__ import annotations

import subprocess
import sys

import pytest

TRACE = "traces/mooncake_synthetic_trace.jsonl"


def _run(*args):
    return subprocess.run([sys.executable, "-m", "ssdemu", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args,code,says", [
    (["--prefill-rate", "nan"], 2, "positive finite"),
    (["--prefill-rate", "inf"], 2, "positive finite"),
    (["--capacity", ""], 1, "no capacity given"),
    (["--capacity", "hbm=1G,hbm=2G"], 1, "given twice"),
    (["--capacity", "drive=99999999999999999999T"], 1, "past 1 EiB"),
    (["--dequant", "gpu"], 2, "invalid choice"),
    (["--gpu-dequant-rate", "0"], 2, "positive finite"),
    (["--instances", "-2"], 2, "--instances"),
    (["--fabric", "1,2,3"], 1, "bad fabric"),
])
def test_bad_replay_values(args, code, says):
    p = _run("replay", TRACE, "--requests", "5", "--no-progress", *args)
    assert p.returncode == code and says in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,says", [
    (["--logical", "1x"], "bad size"),
    (["--logical", "1M"], "under 64M"),
    (["--profile", "nope"], "no profile 'nope'"),
])
def test_bad_bench_device_values(args, says):
    p = _run("bench", "device", *args)
    assert p.returncode in (1, 2) and says in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_media_larger_than_the_host_can_hold(tmp_path):
    p = _run("serve", "--media", "mem:99999T", "--socket", str(tmp_path / "s"))
    assert p.returncode == 1 and "more than this host's memory" in p.stderr
    img = tmp_path / "huge.img"
    p = _run("serve", "--media", f"file:{img}:99999T", "--socket", str(tmp_path / "s"))
    assert p.returncode == 1 and "more than its filesystem holds" in p.stderr
    assert not img.exists()  # refused before it was made


def test_media_enlarged_after_format_is_refused(tmp_path):
    img = tmp_path / "d.img"
    assert _run("format", "--media", f"file:{img}:32M").returncode == 0
    with open(img, "r+b") as f:
        f.truncate(64 << 20)
    p = _run("serve", "--media", f"file:{img}", "--socket", str(tmp_path / "s"))
    assert p.returncode == 1 and "formatted for other media" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
