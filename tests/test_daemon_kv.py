"""KV commands through a real daemon, the store's persistence across daemon restarts
(clean and kill -9), and media the daemon must refuse."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostlib
from ssdemu.tools.daemon_process import DaemonProcess


@pytest.fixture
def drive(tmp_path, disk_dir):
    """A daemon on a file on ext4 (so a restart finds the same bytes)."""
    path = os.path.join(disk_dir, "drive.img")
    d = DaemonProcess(str(tmp_path / "sde.sock"), media=f"file:{path}:64M")
    d.media_path = path
    yield d
    d.kill()


@settings(deadline=None, max_examples=25,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.binary(min_size=1, max_size=16), st.binary(min_size=1, max_size=70000),
                       min_size=1, max_size=8))
def test_kv_round_trip(drive, items):
    with hostlib.connect(drive.socket_path) as dev:
        for k in dev.kv_list(max_keys=10_000):
            dev.kv_delete(k)
        for k, v in items.items():
            assert dev.kv_put(k, v) is False
        for k, v in items.items():
            assert dev.kv_get(k) == v
            assert dev.kv_exists(k)
        assert sorted(dev.kv_list()) == sorted(items)
        buf = dev.alloc(1 << 20)  # zero-copy on the client side too
        k, v = next(iter(items.items()))
        assert dev.kv_get(k, out=buf) == len(v) and bytes(buf[:len(v)]) == v


def test_kv_statuses(drive):
    with hostlib.connect(drive.socket_path) as dev:
        with pytest.raises(hostlib.KeyNotFoundError):
            dev.kv_get(b"missing")
        with pytest.raises(hostlib.KeyNotFoundError):
            dev.kv_delete(b"missing")
        with pytest.raises(hostlib.KeyNotFoundError):
            dev.kv_put(b"k", b"v", only_if_exists=True)
        assert dev.kv_put(b"k", b"v", only_if_not_exists=True) is False
        with pytest.raises(hostlib.KeyExistsError):
            dev.kv_put(b"k", b"w", only_if_not_exists=True)
        assert dev.kv_put(b"k", b"w", only_if_exists=True) is True
        with pytest.raises(hostlib.InvalidKeySizeError):
            dev.kv_put(b"x" * 17, b"v")
        with pytest.raises(hostlib.InvalidKeySizeError):
            dev.kv_get(b"")
        big = dev.alloc(dev.info["max_value_bytes"] + 512)
        with pytest.raises(hostlib.InvalidValueSizeError):
            dev.kv_put(b"big", big)
        dev.free(big)
        small = dev.alloc(4096)
        dev.kv_put(b"v8k", b"z" * 8192)
        with pytest.raises(hostlib.InvalidValueSizeError) as e:
            dev.kv_get(b"v8k", out=small)
        assert e.value.value_length == 8192  # how large a buffer it takes
        assert not dev.kv_exists(b"nope")


def test_prefix_sharing_adds_only_new_bytes(drive):
    with hostlib.connect(drive.socket_path) as dev:
        block = os.urandom(65536)
        base = dev.log()
        dev.kv_put(b"tenantA/blk0", block)
        one = dev.log()
        dev.kv_put(b"tenantA/blk0", block)  # the same key: touched, reported as existing
        dev.kv_put(b"tenantB/blk0", block)  # another salt, same bytes: stored once
        two = dev.log()
        assert one["physical_bytes"] - base["physical_bytes"] == 65536
        assert two["physical_bytes"] == one["physical_bytes"]
        assert two["logical_bytes"] - base["logical_bytes"] == 2 * 65536


def test_data_survives_restart_and_kill_9(drive, tmp_path):
    with hostlib.connect(drive.socket_path) as dev:
        ns = dev.ns_create(4 << 20)
        buf = dev.alloc(1 << 20)
        buf[:] = np.arange(1 << 20, dtype=np.uint32).astype(np.uint8)
        dev.write(ns, 0, buf)
        dev.kv_put(b"durable", b"yes" * 100)
        dev.flush()  # the write cache is on (star2000d): flush makes it durable
    drive.proc.send_signal(signal.SIGKILL)
    drive.proc.wait()
    again = DaemonProcess(str(tmp_path / "again.sock"), media=f"file:{drive.media_path}")
    try:
        with hostlib.connect(again.socket_path) as dev:
            assert dev.kv_get(b"durable") == b"yes" * 100
            assert [n["nsid"] for n in dev.namespaces()] == [ns]
            out = dev.alloc(1 << 20)
            dev.read(ns, 0, out)
            assert np.array_equal(out, np.arange(1 << 20, dtype=np.uint32).astype(np.uint8))
        code, err = again.terminate()
        assert code == 0, err
    finally:
        again.kill()


def test_serve_refuses_foreign_media(tmp_path, disk_dir):
    path = os.path.join(disk_dir, "foreign.img")
    with open(path, "wb") as f:
        f.write(os.urandom(8 << 20))
    args = [sys.executable, "-m", "ssdemu", "serve", "--media", f"file:{path}", "--socket",
            str(tmp_path / "x.sock")]
    p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines()[-1].startswith("ssdemu: error: ")
    assert "not an ssdemu device; give --format" in p.stderr
    d = DaemonProcess(str(tmp_path / "y.sock"), media=f"file:{path}", extra=["--format"])
    code, err = d.terminate()
    assert code == 0 and "formatting" in err


def test_format_command(disk_dir):
    path = os.path.join(disk_dir, "new.img")
    p = subprocess.run([sys.executable, "-m", "ssdemu", "format", "--media", f"file:{path}:16M"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "formatted" in p.stdout
    with open(path, "rb") as f:
        assert f.read(8) == b"SSDEMU\x00\x01"


KV_WRITER = """
import sys, hostlib
dev = hostlib.connect(sys.argv[1])
for i in range(100000):
    key = f"k{i}".encode()
    dev.kv_put(key, (key * 200)[: 50 + (i * 31) % 2000])
    if i % 20 == 19:
        dev.flush()                      # durable from here (the write cache is on)
        print(i, flush=True)
"""


def test_daemon_killed_during_writes_loses_nothing_flushed(drive, tmp_path):
    p = subprocess.Popen([sys.executable, "-c", KV_WRITER, drive.socket_path],
                         stdout=subprocess.PIPE, text=True)
    acked = -1
    for line in p.stdout:
        acked = int(line)
        if acked >= 200:
            break
    drive.proc.send_signal(signal.SIGKILL)  # the daemon dies with writes in flight
    drive.proc.wait()
    p.wait(timeout=60)
    again = DaemonProcess(str(tmp_path / "again.sock"), media=f"file:{drive.media_path}")
    try:
        with hostlib.connect(again.socket_path) as dev:
            for i in range(acked + 1):
                key = f"k{i}".encode()
                assert dev.kv_get(key) == (key * 200)[: 50 + (i * 31) % 2000]
            for key in dev.kv_list(max_keys=100_000):
                i = int(key[1:])
                assert dev.kv_get(key) == (key * 200)[: 50 + (i * 31) % 2000]
        assert again.terminate()[0] == 0
    finally:
        again.kill()


def _flip(media_path: str, value_start: bytes, at: int, mask: int) -> None:
    """Flip bits (mask) of the byte `at` past where the media holds a value starting with
    value_start: a corruption behind the store's back."""
    with open(media_path, "r+b") as f:
        data = f.read()
        where = data.find(value_start)
        assert where > 0
        f.seek(where + at)
        f.write(bytes([data[where + at] ^ mask]))


@pytest.mark.parametrize("size", [8192, 1 << 20])
def test_a_corrupted_block_on_the_media_reads_as_an_error(drive, size):
    value = os.urandom(size)
    with hostlib.connect(drive.socket_path) as dev:
        dev.kv_put(b"precious", value)
        dev.flush()
        _flip(drive.media_path, value[:64], 100, 0xFF)
        with pytest.raises(hostlib.MediaError):
            dev.kv_get(b"precious")
        dev.kv_put(b"other", b"fine")  # the device carries on
        assert dev.kv_get(b"other") == b"fine"


def test_a_corrupted_block_fails_a_retrieval_command_and_another_reads_on(drive):
    """A retrieval worker reads a block with the data plane's lock held only to pin its
    extent (store.get through sde_dev_store_get): a block whose bytes changed on the media
    still fails its checksum there (MEDIA_ERROR, not another block's bytes or INTERNAL), and
    a good block of the same shape is scored meanwhile."""
    import numpy as np

    rng = np.random.default_rng(4)
    blocks = [rng.standard_normal((64, 2, 2, 2, 32)).astype(np.float16) for _ in range(2)]
    q = rng.standard_normal((4, 32)).astype(np.float32)
    kw = dict(layer=1, layers=2, kv_heads=2, k=1)
    with hostlib.connect(drive.socket_path) as dev:
        for key, b in zip((b"bad", b"good"), blocks, strict=True):
            dev.kv_put(key, b.view(np.uint16).tobytes())
        dev.flush()
        raw = blocks[0].view(np.uint8).tobytes()
        _flip(drive.media_path, raw[:256], 1000, 0xFF)
        with pytest.raises(hostlib.MediaError):
            dev.topk_pages([b"bad"], q, **kw)
        ids, _ = dev.topk_pages([b"good"], q, **kw)
        assert ids.shape == (2, 1) and (ids >= 0).all()


def test_a_corrupted_quantized_block_does_not_dequantize(drive):
    """A dequantized retrieve checks the stored block's hash before its kernel runs, and
    the kernel does not run on a block that fails it (the client's buffer is untouched)."""
    import numpy as np

    block = np.random.default_rng(1).standard_normal((32, 2, 2, 2, 64)).astype(
        np.float16).view(np.uint16)
    with hostlib.connect(drive.socket_path) as dev:
        dev.kv_put_quantized(b"q", block, "fp16", "int8_g64")
        stored = dev.kv_get(b"q")  # the compressed block as the media holds it
        out = np.empty_like(block)
        dev.kv_get_dequantized(b"q", out)  # whole, it dequantizes
        dev.flush()
        _flip(drive.media_path, stored[:256], len(stored) // 2, 0x01)  # an int8 value's
        out[...] = 0x1234
        with pytest.raises(hostlib.MediaError):
            dev.kv_get_dequantized(b"q", out)
        assert (out == 0x1234).all()  # the kernel never ran on it
        dev.kv_put_quantized(b"q2", block, "fp16", "int8_g64")  # the device carries on
        dev.kv_get_dequantized(b"q2", out)


def test_a_chain_sharing_a_prefix_stores_only_its_new_blocks(drive):
    from hostlib.prefix_hash import chain_keys, root_key

    root = root_key("llama-3-8b")
    shared = list(range(48))
    chain_a = chain_keys(shared + list(range(100, 132)), 16, root)  # 5 blocks
    chain_b = chain_keys(shared + list(range(200, 232)), 16, root)  # 3 shared + 2 new
    blocks = {k: os.urandom(4096) for k in set(chain_a) | set(chain_b)}
    with hostlib.connect(drive.socket_path) as dev:
        for k in chain_a:
            assert dev.kv_put(k, blocks[k]) is False
        before = dev.log()["physical_bytes"]
        existed = [dev.kv_put(k, blocks[k]) for k in chain_b]
        assert existed == [True, True, True, False, False]  # the prefix is reported existing
        assert dev.log()["physical_bytes"] - before == 2 * 4096  # only the new blocks' bytes
        assert dev.prefix_match(chain_b) == 5
