"""KV commands in the data plane (c/dev against c/store), through a real
daemon:
keys checked and never truncated, zero copy from registered buffers, several commands in
flight from several threads, 64 MiB values, a journal that never runs out, kill -9 during
churn and during a large put, and v1 media refused."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import RING_KINDS, check_media_io, ring_media

import hostlib
from ssdemu.device import _device
from ssdemu.tools.daemon_process import DaemonProcess
from ssdemu_wire.layout import OPCODES, STATUS

ffi, lib = _device.ffi, _device.lib


@pytest.fixture(params=list(RING_KINDS))
def daemon(tmp_path, request):
    """On memory media (copied inline), a file on ext4 and a block device (io_uring)."""
    with ring_media(request.param, 512 << 20) as (spec, media_io):
        d = DaemonProcess(str(tmp_path / "s.sock"), media=spec, extra=["--timing", "off"])
        try:
            check_media_io(d.socket_path, media_io)
            yield d
        finally:
            d.kill()


def _raw(dev, **fields) -> tuple[int, int]:
    """One SQE as given (no hostlib checks): (status, result)."""
    f = dev.submit(fields.pop("opcode"), "raw", **fields)
    while not f.finished:
        dev.qp.wait(None)
    return f.status, f.value


def test_keys_are_checked_never_truncated(daemon):
    with hostlib.connect(daemon.socket_path) as dev:
        dev.kv_put(b"k" * 16, b"sixteen")
        for n in (0, 17, 255):
            with pytest.raises(hostlib.InvalidKeySizeError):
                dev.kv_put(b"k" * n, b"v")
        with pytest.raises(TypeError, match="encode"):
            dev.kv_put("text", b"v")
        buf = dev.alloc(4096)
        buf[:3] = np.frombuffer(b"abc", np.uint8)
        handle, _ = dev._locate(buf)
        lo = int.from_bytes(b"k" * 8, "little")
        for op in ("KV_STORE", "KV_RETRIEVE", "KV_DELETE", "KV_EXIST", "PIN"):
            for n in (17, 100, 255, 1 << 40):  # a raw length past 16: refused, not masked
                status, _ = _raw(dev, opcode=OPCODES[op], buf=handle, length=3, lba=lo,
                                 key_hi=lo, param1=n)
                assert status == STATUS["KV_INVALID_KEY_SIZE"], (op, n)
        assert dev.kv_get(b"k" * 16) == b"sixteen"  # nothing overwrote the 16-byte key
        assert dev.kv_list() == [b"k" * 16]


def test_registered_buffers_are_not_copied(daemon):
    with hostlib.connect(daemon.socket_path) as dev:
        buf = dev.alloc(3 << 20)
        rng = np.random.default_rng(2)
        buf[:] = rng.integers(0, 256, buf.size, dtype=np.uint8)
        before = dev.log()["classes"]["kv"]["bytes_copied"]
        unit = dev.identify()["store_unit_bytes"]  # 4 KiB (the media's block: 512)
        assert unit == 4096
        sizes = [4096, 8192, 1 << 20, 2 << 20, unit * 7]
        for i, n in enumerate(sizes):
            dev.kv_put(b"z%d" % i, buf[:n])
        out = dev.alloc(2 << 20)
        for i, n in enumerate(sizes):
            assert dev.kv_get(b"z%d" % i, out) == n
            assert np.array_equal(out[:n], buf[:n])
        assert dev.log()["classes"]["kv"]["bytes_copied"] == before  # block multiples: 0
        dev.kv_put(b"odd", buf[:5000])  # a partial last unit is bounced: 5000 - 4096
        after = dev.log()["classes"]["kv"]["bytes_copied"]
        assert after - before == 5000 % unit
        out[:] = 0xFF
        assert dev.kv_get(b"odd", out) == 5000 and np.array_equal(out[:5000], buf[:5000])
        assert not out[5000:2 * unit].any()  # the rest of the last unit: zeros, nobody's bytes
        dev.kv_put(b"bytes", os.urandom(4096))  # not registered: the bounce path, counted
        assert dev.log()["classes"]["kv"]["bytes_copied"] - after == 4096


def test_async_batches_and_a_buffer_too_small(daemon):
    with hostlib.connect(daemon.socket_path) as dev:
        values = {b"a%d" % i: os.urandom(100 + i) for i in range(64)}
        with dev.batch():
            puts = [dev.kv_put_async(k, v) for k, v in values.items()]
        assert [f.result() for f in puts] == [False] * 64
        gets = {k: dev.kv_get_async(k) for k in values}
        assert {k: f.result() for k, f in gets.items()} == values
        out = np.zeros(50, np.uint8)  # an unregistered array, too small
        with pytest.raises(hostlib.InvalidValueSizeError) as e:
            dev.kv_get(b"a10", out)
        assert e.value.value_length == 110
        assert [f.result() for f in [dev.kv_delete_async(k) for k in values]] == [0] * 64
        assert dev.kv_list() == []


def test_a_batch_of_small_puts_hashes_each_value_as_its_own(daemon):
    """A batch's small puts have their values hashed as the batch is fetched, beside the
    index lookups it prefetches, and each put takes its hash by its place in the batch: so
    each value reads back (a get checks the hash: a wrong one reads as MEDIA_ERROR) and a
    put of bytes stored before is found by it (deduplicated), in batches of values of
    several sizes (past 16 KiB: hashed by the put itself) at several buffer offsets."""
    sizes = (1, 100, 4096, 5000, 16384, 16385, 40000)
    n = 48
    with hostlib.connect(daemon.socket_path, entries=128) as dev:
        rng = np.random.default_rng(11)
        buf = dev.alloc(2 * n * (64 << 10))
        buf[:] = rng.integers(0, 256, buf.size, dtype=np.uint8)

        def slot(i: int, size: int):  # slots of 64 KiB, values at odd offsets in them
            at = i * (64 << 10) + (i * 97) % 1000
            return buf[at:at + size]

        first = [slot(i, sizes[i % len(sizes)]) for i in range(n)]
        with dev.batch():
            puts = [dev.kv_put_async(b"a%d" % i, v) for i, v in enumerate(first)]
        assert [f.result() for f in puts] == [False] * n
        expect = {b"a%d" % i: bytes(v) for i, v in enumerate(first)}
        before = dev.log()["store"]["dedup_hits"]
        values = []
        for i in range(n):
            if i % 2 == 0:  # the bytes of the first batch's put i, at another offset
                v = slot(n + i, len(first[i]))
                v[:] = first[i]
            else:  # bytes stored nowhere (at least 100 of them: no 1-byte coincidence)
                v = slot(n + i, sizes[1 + i % (len(sizes) - 1)])
                v[:] = rng.integers(0, 256, v.size, dtype=np.uint8)
            values.append(v)
        with dev.batch():
            puts = [dev.kv_put_async(b"b%d" % i, v) for i, v in enumerate(values)]
        assert [f.result() for f in puts] == [False] * n
        assert dev.log()["store"]["dedup_hits"] - before == n // 2
        expect.update({b"b%d" % i: bytes(v) for i, v in enumerate(values)})
        # and batches with one put among other commands (no lookups to overlap: no hash
        # made ahead, the put makes its own), each put's value new
        nsid = dev.ns_create(1 << 20)
        block = dev.alloc(4096)
        for i in range(8):
            v = slot(i, 100 + i)
            v[:] = rng.integers(0, 256, v.size, dtype=np.uint8)
            with dev.batch():
                f = [dev.read_async(nsid, 0, block), dev.kv_put_async(b"c%d" % i, v),
                     dev.read_async(nsid, 8, block)]
            assert [x.result() for x in f][1] is False
            expect[b"c%d" % i] = bytes(v)
        assert {k: dev.kv_get(k) for k in expect} == expect


def test_changes_of_one_key_in_flight_together_land_in_order(daemon):
    """With the write cache on a put's record goes out with its value; the changes of a key
    sent together (puts of several sizes, deletes, conditional puts) are held back behind
    it, so they reach the index in the order sent (as the journal holds them: the kill -9
    tests replay it) and every completion is the one that order gives."""
    with hostlib.connect(daemon.socket_path) as dev:
        rng = np.random.default_rng(5)
        buf = dev.alloc(8 << 20)
        buf[:] = rng.integers(0, 256, buf.size, dtype=np.uint8)
        sizes = [3 << 20, 4096, 1 << 20, 700, 2 << 20]
        offs = [0, 3 << 20, (3 << 20) + 4096, 5 << 20, 6 << 20]
        before = dev.log()["key_waits"]
        for rnd in range(20):
            key = b"hot-%d" % rnd
            with dev.batch():
                f = [dev.kv_put_async(key, buf[offs[0]:offs[0] + sizes[0]])]
                f.append(dev.kv_put_async(key, buf[offs[1]:offs[1] + sizes[1]]))
                f.append(dev.kv_delete_async(key))
                f.append(dev.kv_put_async(key, buf[offs[2]:offs[2] + sizes[2]],
                                          only_if_not_exists=True))
                f.append(dev.kv_put_async(key, buf[offs[3]:offs[3] + sizes[3]],
                                          only_if_exists=True))
                f.append(dev.kv_put_async(key, buf[offs[4]:offs[4] + sizes[4]]))
            existed = [x.result() for x in f]
            # put (new), put (existed), delete, put if absent (it is), put if present,
            # put (existed)
            assert existed == [False, True, 0, False, True, True], (rnd, existed)
            out = dev.alloc(4 << 20)
            assert dev.kv_get(key, out) == sizes[4]
            assert np.array_equal(out[:sizes[4]], buf[offs[4]:offs[4] + sizes[4]])
            dev.free(out)
        assert dev.log()["key_waits"] > before  # the held-back path ran


def test_threads_each_with_a_queue_pair(daemon):
    with hostlib.connect(daemon.socket_path) as dev:
        errors, counts = [], [0] * 4

        def work(t: int):
            qp = dev.queue_pair()
            rng = random.Random(t)
            mine: dict[bytes, bytes] = {}
            deadline = time.monotonic() + 2.0
            try:
                while time.monotonic() < deadline:
                    key = b"t%d/%d" % (t, rng.randrange(200))
                    if rng.random() < 0.6 or key not in mine:
                        v = rng.randbytes(rng.choice([100, 4096, 20000]))
                        dev.kv_put(key, v, qp=qp)
                        mine[key] = v
                    else:
                        got = dev.kv_get(key, qp=qp)
                        if got != mine[key]:
                            errors.append((t, key))
                    counts[t] += 1
                for key, v in mine.items():
                    if dev.kv_get(key, qp=qp) != v:
                        errors.append((t, key))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append((t, repr(e)))

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors[:5]
        assert min(counts) > 100


def test_a_64_mib_value_round_trips(daemon):
    with hostlib.connect(daemon.socket_path) as dev:
        n = dev.info["max_value_bytes"]
        assert n >= 64 << 20
        buf = dev.alloc(n)
        buf[:] = np.random.default_rng(9).integers(0, 256, n, dtype=np.uint8)
        dev.kv_put(b"big", buf)
        out = dev.alloc(n)
        assert dev.kv_get(b"big", out) == n and np.array_equal(out, buf)
        assert dev.kv_get(b"big")[:1000] == bytes(buf[:1000])  # past the bounce: a temp buffer


CHURN = """
import sys, hostlib
dev = hostlib.connect(sys.argv[1])
i = 0
while True:
    key = b"c%d" % (i % 40)
    if i % 4 == 3:
        try:
            dev.kv_delete(key)
        except hostlib.KeyNotFoundError:
            pass
        dev.flush()
        print("del", key.decode(), i, flush=True)
    else:
        v = (b"%d:" % i) * (50 + i % 300)
        dev.kv_put(key, v)
        dev.flush()
        print("put", key.decode(), i, flush=True)
    i += 1
"""


def _kill_9(d: DaemonProcess, client: subprocess.Popen | None) -> None:
    """The daemon killed -9 mid-work, then its client (which would see it gone)."""
    d.proc.send_signal(signal.SIGKILL)
    d.proc.communicate()  # reaped, its pipes closed
    if client is not None:
        client.kill()
        client.wait()


def _expected_value(i: int) -> bytes:
    return (b"%d:" % i) * (50 + i % 300)


@pytest.mark.slow
def test_kill_9_during_churn_loses_nothing_acknowledged(tmp_path, disk_dir):
    """A tiny journal: checkpoints every few dozen changes, so kills land in them too."""
    path = os.path.join(disk_dir, "churn.img")
    for run in range(3):
        d = DaemonProcess(str(tmp_path / f"c{run}.sock"), media=f"file:{path}:64M",
                          extra=["--journal-blocks", "16"] if run == 0 else [])
        p = None
        try:
            p = subprocess.Popen([sys.executable, "-c", CHURN, d.socket_path],
                                 stdout=subprocess.PIPE, text=True)
            state: dict[str, tuple[str, int]] = {}  # key -> its last acknowledged change
            limit = 600 + 400 * run
            for n, line in enumerate(p.stdout):
                parts = line.split()
                state[parts[1]] = (parts[0], int(parts[2]))
                if n >= limit:
                    break
        finally:
            _kill_9(d, p)
        again = DaemonProcess(str(tmp_path / f"a{run}.sock"), media=f"file:{path}")
        try:
            with hostlib.connect(again.socket_path) as dev:
                stored = set(dev.kv_list(max_keys=1000))
                log = dev.log()["store"]
                for key, (op, i) in state.items():
                    k = key.encode()
                    got = dev.kv_get(k) if k in stored else None
                    # the acknowledged state, or a later change (made after the last line
                    # read, unacknowledged here): a put after a delete, anything after a put
                    if op == "del":
                        assert got is None or int(got.split(b":")[0]) > i, \
                            f"{key}: deleted at {i}, back with an older value"
                    elif got != _expected_value(i):
                        assert got is None or int(got.split(b":")[0]) > i, key
                for k in stored:  # nothing reads back wrong
                    got = dev.kv_get(k)
                    assert got == _expected_value(int(got.split(b":")[0]))
                assert log["checkpoint_gen"] > 2  # the churn went through checkpoints
        finally:
            again.terminate()
            again.kill()


BIG = """
import sys, numpy as np, hostlib
dev = hostlib.connect(sys.argv[1])
n = 64 << 20
buf = dev.alloc(n)
buf[:] = 1
dev.kv_put(b"big", buf)
dev.flush()
print("old", flush=True)
buf[:] = 2
while True:
    dev.kv_put(b"big", buf)
"""


def test_a_64_mib_value_survives_kill_9_as_old_or_new(tmp_path, disk_dir):
    path = os.path.join(disk_dir, "big.img")
    d = DaemonProcess(str(tmp_path / "b.sock"), media=f"file:{path}:256M",
                      extra=["--timing", "off"])
    p = None
    try:
        p = subprocess.Popen([sys.executable, "-c", BIG, d.socket_path],
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "old"
        time.sleep(0.05 + random.random() * 0.3)  # the kill lands among puts of the new value
    finally:
        _kill_9(d, p)
    again = DaemonProcess(str(tmp_path / "b2.sock"), media=f"file:{path}")
    try:
        with hostlib.connect(again.socket_path) as dev:
            out = dev.alloc(64 << 20)
            assert dev.kv_get(b"big", out) == 64 << 20
            first = out[0]
            assert first in (1, 2) and (out == first).all()  # old or new, never a mix
    finally:
        again.terminate()
        again.kill()


def test_serve_refuses_v1_media_in_one_line(tmp_path, disk_dir):
    path = os.path.join(disk_dir, "v1.img")
    with open(path, "wb") as f:
        f.truncate(64 << 20)
        f.write(b"SSDEMU\x00\x01" + (1).to_bytes(4, "little"))
    p = subprocess.run([sys.executable, "-m", "ssdemu", "serve", "--media", f"file:{path}",
                        "--socket", str(tmp_path / "v1.sock")], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0
    lines = [ln for ln in p.stderr.strip().splitlines() if ln]
    assert len(lines) == 1 and "v1" in lines[0] and "ssdemu format" in lines[0], p.stderr


FRAGMENTED = """
import sys, numpy as np, hostlib
dev = hostlib.connect(sys.argv[1])
hole = 1 << 20
free = dev.log()["store"]["free_bytes"]
n = free // hole - 4
for i in range(n):  # fill with 1 MiB values, free every other: 1 MiB holes
    dev.kv_put(b"f%05d" % i, np.full(hole, i % 251, np.uint8))
for i in range(0, n, 2):
    dev.kv_delete(b"f%05d" % i)
big = dev.alloc(8 << 20)
big[:] = 1
dev.kv_put(b"big", big)
dev.flush()
print("old", dev.log()["store"]["pieced_values"], flush=True)
v = 2
while True:  # new values, 2 and 3 in turn: every put writes pieces again
    big[:] = v
    dev.kv_put(b"big", big)
    v = 5 - v
"""


def test_a_value_in_pieces_through_the_data_plane_survives_kill_9_as_old_or_new(tmp_path,
                                                                               disk_dir):
    """A fragmented drive (1 MiB holes) takes 8 MiB values in pieces through the data plane:
    from a registered buffer and back into one, through the bounce into bytes, quantized and
    dequantized; a kill -9 among puts of a new value leaves the old or the new, whole."""
    path = os.path.join(disk_dir, "frag.img")
    d = DaemonProcess(str(tmp_path / "f.sock"), media=f"file:{path}:96M",
                      extra=["--timing", "off"])
    p = None
    try:
        p = subprocess.Popen([sys.executable, "-c", FRAGMENTED, d.socket_path],
                             stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline().split()
        assert line == ["old", "1"], line  # stored in pieces
        time.sleep(0.05 + random.random() * 0.2)
    finally:
        _kill_9(d, p)
    again = DaemonProcess(str(tmp_path / "f2.sock"), media=f"file:{path}",
                          extra=["--timing", "off"])
    try:
        with hostlib.connect(again.socket_path) as dev:
            out = dev.alloc(8 << 20)
            assert dev.kv_get(b"big", out) == 8 << 20
            first = out[0]
            assert first in (1, 2, 3) and (out == first).all()  # one whole value, no mix
            assert dev.log()["store"]["pieced_values"] >= 1
            # odd sizes, the bounce path, and the quantizer, all into pieces
            v = np.random.default_rng(3).integers(0, 256, (5 << 20) + 123, dtype=np.uint8)
            dev.kv_put(b"odd", v.tobytes())
            assert dev.kv_get(b"odd") == v.tobytes()
            small = dev.alloc(6 << 20)
            assert dev.kv_get(b"odd", small) == v.nbytes
            assert np.array_equal(small[:v.nbytes], v)
            blk = np.random.default_rng(4).standard_normal((512, 2, 4, 8, 64)).astype(
                np.float16).view(np.uint16)
            dev.kv_put_quantized(b"q", blk, "fp16", "int8_g64")
            back = np.empty_like(blk)
            dev.kv_get_dequantized(b"q", back)
            err = np.abs(back.view(np.float16).astype(np.float32) -
                         blk.view(np.float16).astype(np.float32))
            assert err.max() < 0.05
            assert dev.log()["store"]["pieced_values"] >= 2
    finally:
        again.terminate()
        again.kill()
