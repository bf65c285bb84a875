"""The timing model in the daemon: completions held until their modelled time (real clock),
completion times on a virtual clock, host lag."""

from __future__ import annotations

import os
import time

import pytest
import yaml
from conftest import RING_KINDS, ring_media

import hostlib
from ssdemu.sim.profile import PROFILE_DIR, load
from ssdemu.sim.timing import DeviceModel
from ssdemu.tools.daemon_process import DaemonProcess
from ssdemu_wire.layout import OPCODES


def _daemon(tmp_path, *extra, media="mem:128M"):
    return DaemonProcess(str(tmp_path / "sde.sock"), media=media, extra=list(extra))


def _ns_start(dev, nsid):
    return next(n["start"] for n in dev.namespaces() if n["nsid"] == nsid)


def _slow_read_profile(tmp_path):
    """star2000d with a 5 ms NAND read: memory-backed media finishes long before the model even
    on a loaded machine, so every warm read must be held (at 30 us a busy CI host lagged)."""
    data = yaml.safe_load((PROFILE_DIR / "star2000d.yaml").read_text())
    data["nand"]["t_read_ns"] = 5_000_000
    path = tmp_path / "slow-read.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_real_time_completion_is_held_for_the_modelled_latency(tmp_path):
    profile = _slow_read_profile(tmp_path)
    d = _daemon(tmp_path, "--profile", str(profile))
    try:
        with hostlib.connect(d.socket_path) as dev:
            ns = dev.ns_create(16 << 20)
            buf = dev.alloc(4096)
            t0 = time.perf_counter_ns()
            dev.read(ns, 0, buf)
            wall = time.perf_counter_ns() - t0
            device_ns = dev.qp.last_device_ns  # before any other command replaces it
            modelled = DeviceModel(load(str(profile))).read(0.0, _ns_start(dev, ns), 4096)
            assert device_ns == int(modelled)  # the idle device's latency
            assert wall >= modelled  # and the completion waited for it
            assert modelled > 5e6
            for _ in range(9):  # warm reads finish on the media before the model: held
                t0 = time.perf_counter_ns()
                dev.read(ns, 0, buf)
                # the data plane's sleep ends early (the host's wake-up latency) and it polls
                # the rest: never a completion before its time
                assert time.perf_counter_ns() - t0 >= dev.qp.last_device_ns
            page = dev.log()
            assert page["held"] >= 9 and page["held"] + page["host_lag"] == 10
            assert page["model"]["nand_bytes_read"] == 10 * 4096
            assert 0 < page["wake_late_ns"] <= 200_000  # its timed sleeps measured, capped
    finally:
        assert d.terminate()[0] == 0


def test_virtual_clock_stamps_completions(tmp_path):
    d = _daemon(tmp_path, "--clock", "virtual")
    try:
        with hostlib.connect(d.socket_path) as dev:
            ns = dev.ns_create(16 << 20)
            start = _ns_start(dev, ns)
            buf = dev.alloc(65536)
            h, off = dev._locate(buf)
            model = DeviceModel(load("star2000d"))
            t = 0
            for i, (gap, n) in enumerate([(0, 4096), (10, 65536), (5_000_000, 4096),
                                          (1, 16384), (0, 512)]):
                t += gap
                f = dev.submit(OPCODES["READ"], "read", nsid=ns, lba=i * 128, buf=h,
                               buf_offset=off, length=n, submit_time_ns=t)
                f.result()
                expect = model.read(float(t), start + i * 128 * 512, n)
                assert f.device_ns == int(expect)  # the completion time on the clock
                assert f.device_ns > t  # never before the submission
            # an earlier stamp than the clock has reached is taken as "now": no going back
            f = dev.submit(OPCODES["NOP"], "nop", submit_time_ns=1)
            f.result()
            assert f.device_ns >= t
    finally:
        assert d.terminate()[0] == 0


def test_timing_off_reports_measured_times(tmp_path):
    d = _daemon(tmp_path, "--timing", "off")
    try:
        with hostlib.connect(d.socket_path) as dev:
            ns = dev.ns_create(16 << 20)
            dev.read(ns, 0, dev.alloc(4096))
            assert dev.log()["held"] == 0
            assert dev.identify()["timing"] == "off"
    finally:
        assert d.terminate()[0] == 0


def test_host_lag_is_counted_when_the_media_is_slower(tmp_path, disk_dir):
    """ext4 under a virtual disk takes hundreds of microseconds for a 4 KiB read; the
    star2000d model says about 36: each such read is host lag."""
    d = _daemon(tmp_path, media=f"file:{os.path.join(disk_dir, 'd.img')}:64M")
    try:
        with hostlib.connect(d.socket_path) as dev:
            ns = dev.ns_create(32 << 20)
            buf = dev.alloc(1 << 20)
            dev.write(ns, 0, buf)
            dev.flush()
            small = dev.alloc(4096)
            for i in range(30):
                dev.read(ns, (i * 7919 % 2000) * 8, small)
            page = dev.log()
            assert page["host_lag"] > 0
            assert page["held"] + page["host_lag"] >= 30
    finally:
        assert d.terminate()[0] == 0


@pytest.mark.parametrize("clock", ["banana"])
def test_bad_clock_is_refused(tmp_path, clock):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "ssdemu", "serve", "--media", "mem:16M",
                        "--socket", str(tmp_path / "s"), "--clock", clock],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "invalid choice" in p.stderr


def test_kv_and_compute_commands_include_nand_time(tmp_path):
    import numpy as np

    from ssdemu.sim.cost import quantize_cost
    from ssdemu.sim.timing import budget_of

    profile = load("star2000d")
    d = _daemon(tmp_path)
    try:
        with hostlib.connect(d.socket_path) as dev:
            dev.nop()
            nop_ns = dev.qp.last_device_ns
            written = dev.log()["model"]["nand_bytes_written"]
            dev.kv_put(b"value", b"v" * 65536)
            write_ns = dev.qp.last_device_ns
            # a put is not timed as a NOP: its 64 KiB crossed the link...
            link_ns = 65536 / profile.host_link.bandwidth_bytes_per_s * 1e9
            assert write_ns >= nop_ns + 0.9 * link_ns
            # ...and was programmed (the write cache acknowledges first; the NAND still works)
            assert dev.log()["model"]["nand_bytes_written"] - written >= 65536
            dev.kv_get(b"value")
            read_ns = dev.qp.last_device_ns
            assert read_ns >= profile.nand.t_read_ns  # the value was sensed on the NAND
            assert write_ns >= profile.controller.command_overhead_ns
            dev.kv_put(b"same", b"v" * 65536)  # identical bytes: no NAND program
            assert dev.qp.last_device_ns < write_ns
            x = np.random.default_rng(0).standard_normal((32, 2, 2, 2, 64)).astype(
                np.float16).view(np.uint16)
            written = dev.log()["model"]["nand_bytes_written"]
            size = dev.kv_put_quantized(b"q", x, "fp16", "int8_g64")
            assert dev.log()["model"]["nand_bytes_written"] - written >= size  # programmed
            budget = budget_of(profile)
            compute_ns = budget.device_ns(quantize_cost(x.size, 2, "int8_g64", size))
            # the raw block crossed the link, then the firmware ran
            receive_ns = x.nbytes / profile.host_link.bandwidth_bytes_per_s * 1e9
            assert dev.qp.last_device_ns >= 0.9 * receive_ns + compute_ns
    finally:
        assert d.terminate()[0] == 0


def test_a_requantize_is_sensed_requantized_and_programmed_in_the_drive(tmp_path):
    """KV_REQUANTIZE's device time: the stored block sensed, the firmware's requantize
    kernel, the new block programmed; nothing of the block crosses the link."""
    import numpy as np

    from ssdemu.sim.cost import requantize_cost
    from ssdemu.sim.timing import budget_of

    profile = load("star2000d")
    d = _daemon(tmp_path)
    try:
        with hostlib.connect(d.socket_path) as dev:
            x = np.random.default_rng(1).standard_normal((256, 2, 2, 4, 64)).astype(
                np.float16).view(np.uint16)
            old = dev.kv_put_quantized(b"q", x, "fp16", "int8_g64", summary_page=16)
            before = dev.log()["model"]
            new = dev.kv_requantize(b"q", "int4_g64")
            took = dev.qp.last_device_ns
            after = dev.log()["model"]
            assert after["nand_bytes_read"] - before["nand_bytes_read"] >= old
            assert after["nand_bytes_written"] - before["nand_bytes_written"] >= new
            assert after["link_bytes"] == before["link_bytes"]  # the block stayed inside
            summaries = 2 * 2 * 4 * (256 // 16) * 64 * 2  # (layers, min/max, heads, pages, D)
            kernel_ns = budget_of(profile).device_ns(
                requantize_cost(x.size, 2, "int8_g64", old, "int4_g64", new, summaries))
            assert took >= profile.nand.t_read_ns + kernel_ns
            assert dev.log()["compute"]["requantize"]["calls"] == 1
    finally:
        assert d.terminate()[0] == 0


def test_fixed_latency_model_in_the_daemon(tmp_path):
    from ssdemu.sim.timing import FixedLatencyModel

    d = _daemon(tmp_path, "--timing", "fixed")
    try:
        with hostlib.connect(d.socket_path) as dev:
            ns = dev.ns_create(16 << 20)
            fixed = FixedLatencyModel(load("star2000d"))
            for n in (4096, 1 << 20):  # any size, the same time
                dev.read(ns, 0, dev.alloc(n))
                assert dev.qp.last_device_ns == int(fixed.read_ns)
    finally:
        assert d.terminate()[0] == 0


def _mixed_commands(dev, wait_each: bool) -> list:
    """Quantized stores beside dequantized and plain retrieves and deletes of keys stored
    before, four to a submission time; each command's device time (and its result)."""
    import numpy as np

    rng = np.random.default_rng(3)
    shape = (64, 2, 2, 2, 64)
    blocks = [rng.standard_normal(shape).astype(np.float16).view(np.uint16)
              for _ in range(48)]
    n = 16
    for i in range(n):  # what the retrieves and deletes find, one command at a time
        dev.kv_put_quantized(b"old%02d" % i, blocks[i], "fp16", "int8_g64")
        dev.kv_put(b"raw%02d" % i, blocks[n + i].reshape(-1).view(np.uint8))
        dev.kv_put(b"del%02d" % i, b"d" * 8192)
        dev.kv_put_quantized(b"rq%02d" % i, blocks[i], "fp16", "int8_g64")
    outs = dev.alloc(n * blocks[0].nbytes).view(np.uint16).reshape((n, *shape))
    raws = dev.alloc(n * blocks[0].nbytes).reshape(n, -1)
    futures = []
    for i in range(n):
        dev.submit_time_ns = 10_000_000 + 200_000 * (i // 4)
        fs = [dev.kv_put_quantized_async(b"new%02d" % i, blocks[2 * n + i], "fp16", "int8_g64"),
              dev.kv_get_dequantized_async(b"old%02d" % i, outs[i]),
              dev.kv_get_async(b"raw%02d" % i, raws[i]),
              dev.kv_delete_async(b"del%02d" % i),
              dev.kv_requantize_async(b"rq%02d" % i, "int4_g64")]
        for f in fs if wait_each else ():
            f.result()
        futures += fs
    times = [(f.result(), f.device_ns) for f in futures]
    for i in range(n):  # and every value is right
        assert np.array_equal(raws[i].view(np.uint16).reshape(shape), blocks[n + i])
    return times


def _waiting_and_not(tmp_path, run, then=None, media: str = "mem:256M") -> dict:
    """run(dev, wait_each) on a fresh virtual-clock daemon each way, then(dev) after it;
    {wait_each: what run returned}."""
    got = {}
    for wait_each in (True, False):
        d = DaemonProcess(str(tmp_path / f"v{wait_each}.sock"), media=media,
                          extra=["--clock", "virtual", "--format"])  # fresh each way
        try:
            with hostlib.connect(d.socket_path) as dev:
                got[wait_each] = run(dev, wait_each)
                if then is not None:
                    then(dev)
                if not wait_each:
                    assert dev.log()["deferred"] > 0  # commands did wait for their turn
        finally:
            assert d.terminate()[0] == 0
    return got


def test_virtual_clock_times_do_not_depend_on_how_the_client_waits(tmp_path):
    """The model books commands in fetch order: a client that keeps many in flight (its
    retrieves fetched while the quantized stores before them are still in the firmware)
    gets the times of one that waits for each, command for command."""
    got = _waiting_and_not(tmp_path, _mixed_commands)
    assert got[False] == got[True]


def test_a_client_that_dies_with_commands_waiting_their_turn(tmp_path):
    """Virtual clock: commands deferred behind compute commands (dequantized retrieves
    with their kernels still out among them, and COUNTERS) belong to a client that exits
    without waiting; the daemon drops them and serves the next client, whose own commands
    are booked in their turn."""
    import subprocess
    import sys

    child = r'''
import os, sys, numpy as np, hostlib
dev = hostlib.connect(sys.argv[1])
block = np.random.default_rng(0).standard_normal((64, 2, 2, 2, 64)).astype(
    np.float16).view(np.uint16)
dev.kv_put_quantized(b"old", block, "fp16", "int8_g64")
out = dev.alloc(block.nbytes)
outs = [dev.alloc(block.nbytes).view(np.uint16).reshape(block.shape) for _ in range(40)]
for i in range(40):
    dev.kv_put_quantized_async(b"new%d" % i, block, "fp16", "int8_g64")
    dev.kv_get_async(b"old", out)
    dev.kv_get_dequantized_async(b"old", outs[i])
    dev.kv_delete_async(b"new%d" % i)
    if i % 8 == 0:
        dev.counters_async()
os._exit(0)
'''
    d = DaemonProcess(str(tmp_path / "v.sock"), media="mem:128M", extra=["--clock", "virtual"])
    try:
        for _ in range(3):
            subprocess.run([sys.executable, "-c", child, d.socket_path], check=True,
                           timeout=60)
        with hostlib.connect(d.socket_path) as dev:
            assert dev.log()["deferred"] > 0  # some did wait in the FIFO
            dev.kv_put(b"alive", b"yes")
            assert dev.kv_get(b"alive") == b"yes"
            import numpy as np

            out = dev.alloc(64 * 2 * 2 * 2 * 64 * 2).view(np.uint16).reshape(64, 2, 2, 2, 64)
            before = dev.counters()["kernel_calls"]
            f = dev.kv_get_dequantized_async(b"old", out)
            assert dev.counters()["kernel_calls"] == before + 1  # booked in its turn
            f.result()
    finally:
        assert d.terminate()[0] == 0


def _books_around(dev, wait_each: bool) -> list:
    """_mixed_commands's stores and retrieves in two rounds, the drive's books (COUNTERS)
    asked after each round without waiting for it; the books and the last command's time."""
    import numpy as np

    rng = np.random.default_rng(5)
    shape = (64, 2, 2, 2, 64)
    blocks = [rng.standard_normal(shape).astype(np.float16).view(np.uint16) for _ in range(24)]
    for i in range(8):
        dev.kv_put_quantized(b"old%02d" % i, blocks[i], "fp16", "int8_g64")
    outs = dev.alloc(8 * blocks[0].nbytes).view(np.uint16).reshape((8, *shape))
    books, futures = [], []
    for r in range(2):
        for i in range(4 * r, 4 * r + 4):
            dev.submit_time_ns = 10_000_000 + 300_000 * i
            fs = [dev.kv_put_quantized_async(b"new%02d" % i, blocks[8 + i], "fp16", "int8_g64"),
                  dev.kv_get_dequantized_async(b"old%02d" % i, outs[i]),
                  dev.kv_delete_async(b"old%02d" % (7 - i)) if r else
                  dev.kv_put_async(b"raw%02d" % i, bytes([i]) * 8192)]  # none alike
            for f in fs if wait_each else ():
                f.result()
            futures += fs
        books.append(dev.counters_async())
    books = [b.result() for b in books]
    for f in futures:
        f.result()
    return books + [[f.device_ns for f in futures]]


@pytest.mark.parametrize("kind", list(RING_KINDS))
def test_counters_read_the_books_at_their_turn(tmp_path, kind):
    """COUNTERS waits its turn behind the compute commands fetched before it: asked at once
    behind quantized stores and dequantized retrieves still in the firmware, it reads the
    books a client that waited for each of them would read, and nothing booked after it;
    reading them books nothing.  On memory media, a file on ext4 and a block device (the
    last two through io_uring, whose completions come back on io_uring's time)."""
    def then(dev):
        assert dev.identify()["media_io"] == RING_KINDS[kind]
        last = dev.counters()
        assert dev.counters() == last  # a read of the books books nothing
        model = dev.log()["model"]
        keys = ("link_busy_ns", "channel_busy_ns", "nand_bytes_written", "busy_until_ns")
        assert {k: model[k] for k in keys} == {k: last[k] for k in keys}

    with ring_media(kind, 256 << 20) as (spec, _):
        got = _waiting_and_not(tmp_path, _books_around, then, media=spec)
    first, second, _ = got[False]
    assert got[False] == got[True]
    assert second["kernel_calls"] == first["kernel_calls"] + 8  # 4 stores, 4 retrieves
    assert second["compute_busy_ns"] > first["compute_busy_ns"] > 0
    assert second["nand_bytes_written"] > first["nand_bytes_written"] > 0


def test_counters_are_an_admins_and_checked(tmp_path):
    """The whole drive's books are an admin's (as the log page's), and the command is
    checked like any: its buffer, its length, namespace 0, no flags."""
    import secrets

    from ssdemu_wire.layout import COUNTERS_DTYPE, STATUS

    admin_file = tmp_path / "admin.key"
    admin = hostlib.owner_key.new(str(admin_file))
    d = DaemonProcess(str(tmp_path / "s.sock"), extra=["--admin-key", str(admin_file)])
    op = OPCODES["COUNTERS"]

    def status(dev, **fields):
        f = dev.submit(op, "raw counters", **fields)
        while not f.done():
            f.qp.wait(None)
        return f.status

    try:
        with hostlib.connect(d.socket_path, owner_key=secrets.token_hex(32)) as owner, \
                hostlib.connect(d.socket_path, owner_key=admin) as root:
            with pytest.raises(hostlib.DeviceError, match="ACCESS_DENIED"):
                owner.counters()
            buf = root.alloc(4096)
            h, off = root._locate(buf)
            n = COUNTERS_DTYPE.itemsize
            assert status(root, buf=h, buf_offset=off, length=n) == STATUS["SUCCESS"]
            for fields, want in (({"length": n - 8}, "INVALID_FIELD"),
                                 ({"flags": 1}, "INVALID_FIELD"),
                                 ({"nsid": 1}, "INVALID_NAMESPACE"),
                                 ({"buf": h + 1}, "INVALID_BUFFER"),
                                 ({"buf_offset": off + 4096 - 8}, "INVALID_BUFFER")):
                args = {"buf": h, "buf_offset": off, "length": n, **fields}
                assert status(root, **args) == STATUS[want], fields
            oh, ooff = owner._locate(owner.alloc(4096))  # another client's buffer
            assert status(root, buf=oh, buf_offset=ooff, length=n) == STATUS["INVALID_BUFFER"]
            assert root.counters()["kernel_calls"] == 0
            root.kv_put(b"still", b"serving")
            assert owner.kv_get(b"still") == b"serving"
    finally:
        assert d.terminate()[0] == 0
