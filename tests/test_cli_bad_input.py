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
    # model mode reads scheme names without the firmware (firmware/sizes.py): its words
    (["--quant", "int7_g64"], 1, "unknown quantization scheme 'int7_g64': expected int8_gN"),
    (["--quant", "kivi4_g48_r8"], 1, "unknown quantization scheme 'kivi4_g48_r8'"),
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


def test_bad_media_io_is_refused_before_the_media_is_opened(tmp_path):
    img = tmp_path / "m.img"
    p = _run("serve", "--media", f"file:{img}:16M", "--socket", str(tmp_path / "s"),
             "--media-io", "mmap")
    assert p.returncode == 2 and "invalid choice: 'mmap'" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not img.exists() and not (tmp_path / "s").exists()
    from ssdemu.device.daemon import Daemon  # the API says so too, before touching anything

    with pytest.raises(ValueError, match="media_io is one of auto, io_uring, not 'mmap'"):
        Daemon(None, None, str(tmp_path / "s"), media_io="mmap")


def test_bad_kv_layout_is_refused_before_the_media_is_opened(tmp_path):
    img = tmp_path / "m.img"
    p = _run("serve", "--media", f"file:{img}:16M", "--socket", str(tmp_path / "s"),
             "--kv-layout", "channel")
    assert p.returncode == 2 and "invalid choice: 'channel'" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not img.exists() and not (tmp_path / "s").exists()
    from ssdemu.device.daemon import Daemon

    with pytest.raises(ValueError, match="kv_layout is one of head, token, not 'channel'"):
        Daemon(None, None, str(tmp_path / "s"), kv_layout="channel")


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


def test_bad_serve_owner_and_quota_values(tmp_path):
    """serve's --admin-key must be a key file only its user can read; the byte quotas (and
    the retrieval workers' host bytes) are sizes above 0.  One line each, before any media
    is made."""
    loose = tmp_path / "loose.key"
    loose.write_text("ab" * 32 + "\n")
    loose.chmod(0o644)
    img = tmp_path / "d.img"
    for args, code, says in (
            (["--admin-key", str(tmp_path / "none.key")], 1, "cannot read owner key"),
            (["--admin-key", str(loose)], 1, "open to others (mode 0644): chmod 600"),
            (["--max-namespace-bytes-per-uid", "0"], 2, "a size above 0"),
            (["--max-buffer-bytes-per-uid", "-1M"], 2, "--max-buffer-bytes-per-uid"),
            (["--max-queue-pairs-per-uid", "0"], 2, "--max-queue-pairs-per-uid"),
            (["--max-pins-per-uid", "-3"], 2, "--max-pins-per-uid"),
            (["--retrieval-host-bytes", "0"], 2, "a size above 0"),
            (["--retrieval-host-bytes", "lots"], 2, "--retrieval-host-bytes")):
        p = _run("serve", "--media", f"file:{img}:32M", "--socket", str(tmp_path / "s"),
                 *args)
        assert p.returncode == code and says in p.stderr, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1
        assert not img.exists()
