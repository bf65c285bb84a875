"""hostlib's copies of plain arrays (issue 35, item 3): the copy routine against numpy, and KV
values that are not in registered buffers through the queue pair's bounce or the pooled
staging buffers, blocking and many in flight, through a real daemon."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hostlib
from hostlib.client import copy_bytes
from ssdemu.tools.daemon_process import DaemonProcess


def _at(nbytes: int, offset: int) -> np.ndarray:
    m = mmap.mmap(-1, nbytes + 8192)
    return np.frombuffer(m, np.uint8)[offset:offset + nbytes]


@settings(deadline=None, max_examples=60)
@given(st.integers(0, 300_000), st.integers(0, 4095), st.integers(0, 4095),
       st.integers(0, 2**32 - 1))
def test_copy_bytes_is_numpys_copy_wherever_the_arrays_lie(n, dst_off, src_off, seed):
    src = _at(n, src_off)
    src[:] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    dst = _at(n, dst_off)
    guard = np.frombuffer(dst.base, np.uint8)  # the bytes around dst stay as they were
    guard[:] = 0xA5
    copy_bytes(dst, src)
    assert np.array_equal(dst, src)
    assert (guard[:dst_off] == 0xA5).all() and (guard[dst_off + n:] == 0xA5).all()


def test_copy_bytes_takes_any_shapes_numpy_takes():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    b = np.empty((4, 6), np.float32)
    copy_bytes(b.reshape(2, 3, 4), a)
    assert np.array_equal(b.reshape(-1), a.reshape(-1))
    strided = np.zeros((8, 8), np.uint8)[:, ::2]
    copy_bytes(strided, np.ones((8, 4), np.uint8))  # not contiguous: numpy's own copy
    assert (strided == 1).all()


@pytest.fixture
def dev(tmp_path):
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:256M")
    with hostlib.connect(d.socket_path) as dev:
        yield dev
    assert d.terminate()[0] == 0


@pytest.mark.parametrize("size", [1, 4095, 65536 + 16, 3 << 20, (4 << 20) + 1, 6 << 20])
def test_plain_values_round_trip_blocking(dev, size):
    """Below, at and above the bounce buffer (4 MiB): put and get of numpy arrays and bytes
    as the registered path would store them."""
    if size > dev.max_value:
        pytest.skip("larger than the drive's largest value")
    v = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    dev.kv_put(b"k", v)
    out = np.empty(size, np.uint8)
    assert dev.kv_get(b"k", out) == size and np.array_equal(out, v)
    assert dev.kv_get(b"k") == v.tobytes()
    dev.kv_put(b"b", v.tobytes())
    reg = dev.alloc(size)
    assert dev.kv_get(b"b", reg) == size and np.array_equal(reg, v)


@pytest.mark.parametrize("nbytes", [8192, 6 << 20])
@pytest.mark.parametrize("layout", ["transposed", "fortran", "every_other_row", "strided_1d"])
def test_gets_fill_arrays_that_are_not_contiguous(dev, layout, nbytes):
    """A get into an array that is not one contiguous run (a transposed view, Fortran order,
    a slice of rows or of a row), through the bounce and through a staging buffer: filled
    with the value in the array's own index order, and a put from such an array stores the
    same bytes (a 2-D one once came back with its length and none of its bytes: the copy
    landed in a temporary)."""
    if nbytes > dev.max_value:
        pytest.skip("larger than the drive's largest value")
    v = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    rows = nbytes // 64
    out = {"transposed": lambda: np.zeros((64, rows), np.uint8).T,
           "fortran": lambda: np.zeros((rows, 64), np.uint8, order="F"),
           "every_other_row": lambda: np.zeros((2 * rows, 64), np.uint8)[::2],
           "strided_1d": lambda: np.zeros(2 * nbytes, np.uint8)[::2]}[layout]()
    if layout == "strided_1d":
        assert not out.flags.c_contiguous
    dev.kv_put(b"c", v)
    assert dev.kv_get(b"c", out) == nbytes
    assert np.array_equal(out.reshape(-1), v)
    dev.kv_put(b"d", out)  # from the same layout: the bytes in index order
    back = np.empty(nbytes, np.uint8)
    assert dev.kv_get(b"d", back) == nbytes and np.array_equal(back, v)


def test_a_get_into_a_read_only_array_is_refused_and_writes_nothing(dev):
    """A read-only `out` (over immutable bytes, or a registered buffer's view marked read-only)
    is refused before any command goes out; the bytes under it stay as they were (they were
    overwritten, immutable bytes object and all)."""
    dev.kv_put(b"ro", np.full(8192, 7, np.uint8))
    src = bytes(8192)
    with pytest.raises(ValueError, match="read-only"):
        dev.kv_get(b"ro", np.frombuffer(src, np.uint8))
    assert src == bytes(8192)
    reg = dev.alloc(8192)
    reg[:] = 1
    view = reg[:]
    view.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        dev.kv_get(b"ro", view)
    with pytest.raises(ValueError, match="read-only"):
        dev.read(0, 0, view)
    assert (reg == 1).all()
    assert dev.kv_get(b"ro", reg) == 8192 and (reg == 7).all()  # the connection serves on


def test_a_get_whose_array_the_caller_dropped_completes_harmlessly(dev):
    """Gets in flight into arrays nobody else holds any more (a fire-and-forget prefetch):
    the copy out of the bounce at completion still has its array, and writes nowhere else
    (arrays of 1 MiB, whose pages go back to the kernel when freed: a copy by address into
    a freed one ends the process)."""
    import gc

    dev.kv_put(b"gone", np.full(1 << 20, 3, np.uint8))
    futures = [dev.kv_get_async(b"gone", np.empty(1 << 20, np.uint8)) for _ in range(4)]
    gc.collect()
    others = [np.full(1 << 20, 9, np.uint8) for _ in range(8)]
    assert [f.result() for f in futures] == [1 << 20] * 4
    assert all((o == 9).all() for o in others)


def test_many_plain_values_in_flight_outgrow_the_bounce(dev):
    """24 puts and then 24 gets of 1 MiB arrays in flight on one queue pair: the bounce holds
    four, the rest go through pooled staging buffers instead of waiting (each back in the
    pool at its completion, and reused: a second round registers nothing new)."""
    size = 1 << 20
    vals = [np.full(size, i, np.uint8) for i in range(24)]
    outs = [np.zeros(size, np.uint8) for _ in range(24)]

    def round_():
        for f in [dev.kv_put_async(b"m%d" % i, v) for i, v in enumerate(vals)]:
            f.result()
        for f in [dev.kv_get_async(b"m%d" % i, o) for i, o in enumerate(outs)]:
            assert f.result() == size
        for i, o in enumerate(outs):
            assert (o == i).all()
            o[:] = 0

    round_()
    registered = len(dev._buffers)
    assert len(dev._staging) >= 20  # given back
    round_()
    assert len(dev._buffers) == registered  # reused, none registered anew


def test_staging_buffers_go_back_to_the_pool_and_nothing_else_does(dev):
    """staging_take's buffer goes back by its view (its pool entry, no search by address),
    comes out again for the next take of its size class, and an array that is not a staging
    buffer given back is left alone."""
    a = dev.staging_take(100_000)
    n = len(dev._staging)
    dev.staging_give(a)
    assert len(dev._staging) == n + 1
    b = dev.staging_take(100_000)
    assert len(dev._staging) == n and dev._locate(b)[0] == dev._locate(a)[0]
    dev.staging_give(np.zeros(100_000, np.uint8))  # not registered: nothing to give back
    mine = dev.alloc(4096)
    dev.staging_give(mine)  # registered, not staging: stays its owner's, not pooled
    assert len(dev._staging) == n
    dev.staging_give(b)
    assert len(dev._staging) == n + 1
    dev.free(mine)


def test_a_failed_command_gives_its_staging_buffer_back(dev):
    """A get of a missing key through a staging buffer: the error, and the buffer back in the
    pool (the device is done with it once the completion came)."""
    big = np.zeros(5 << 20, np.uint8)  # larger than the bounce: staging
    if big.nbytes > dev.max_value:
        big = np.zeros(dev.max_value, np.uint8)
    before = len(dev._staging)
    with pytest.raises(hostlib.KeyNotFoundError):
        dev.kv_get(b"missing", big)
    assert len(dev._staging) == before + (1 if big.nbytes > dev.qp.bounce.nbytes else 0)


@pytest.mark.slow
def test_bench_kv_reports_plain_against_registered(tmp_path):
    """`bench kv --json`: the plain-array rows beside the registered ones, every ratio a
    finite positive number (its figures are the bench's, not a test's)."""
    import json
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "kv",
                        "--seconds", "0.2", "--json"], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert set(r["plain_vs_registered"]) == {"64k", "256k", "2m"}
    for row in r["plain_vs_registered"].values():
        assert set(row) == {"put_blocking", "get_blocking", "put_inflight8", "get_inflight8"}
        for x in row.values():
            assert x["plain_bytes_per_s"] > 0 and x["registered_bytes_per_s"] > 0
            assert x["ratio_registered"] == pytest.approx(
                x["plain_bytes_per_s"] / x["registered_bytes_per_s"])
    assert r["bytes_copied_per_kv_put"] == 0 and r["bytes_copied_per_kv_get"] == 0
    # every put in those rows stored its value (a repeated value would only be hashed)
    assert r["plain_vs_registered_dedup_hits"] == 0
    # the drive's rows against their baselines, each side the median of its slices
    for row, unit, base in (("kv_put_4k", "ops_per_s", "block_write"),
                            ("kv_get_4k", "ops_per_s", "block_read"),
                            ("kv_put_2m", "bytes_per_s", "block_write"),
                            ("kv_get_2m", "bytes_per_s", "block_read")):
        x = r[row]
        assert x[unit] > 0 and x[base] > 0
        assert x["ratio_block"] == pytest.approx(x[unit] / x[base])
    for row in ("kv_put_quantized", "kv_get_dequantized"):
        x = r[row]
        assert x["ratio_kernel"] == pytest.approx(x["bytes_per_s"] / x["kernel_bytes_per_s"])
        assert x["kernel_in_cache_bytes_per_s"] > 0
    assert r["kv_put_quantized"]["dedup_hits"] == 0


def test_bench_kv_pairs_each_figure_with_its_baseline_in_abba_slices():
    """bench kv's pairs: the drive and its baseline in turn, ABBA, a quarter of the time each
    slice, and each side's median (a slow slice on one side moves neither figure)."""
    from ssdemu.bench import kv

    calls = []

    def side(name, rates):
        it = iter(rates)

        def run(seconds):
            calls.append((name, seconds))
            r = next(it)
            return {"ops_per_s": r, "bytes_per_s": 10 * r, "commands": 1}
        return run

    drive, base = kv._paired(side("d", [5, 1, 7, 6]), side("b", [3, 3, 100, 4]), 2.0)
    assert [c[0] for c in calls] == ["d", "b", "b", "d", "d", "b", "b", "d"]
    assert all(c[1] == 2.0 / kv.PAIR_SLICES for c in calls)
    assert drive == {"ops_per_s": 5.5, "bytes_per_s": 55.0, "commands": 4}
    assert base["ops_per_s"] == 3.5


def test_past_the_buffer_quota_values_wait_for_the_bounce(tmp_path):
    """A uid allowed 3 buffers (its bounce and two staging buffers): 16 x 1 MiB puts and gets
    in flight still all complete, the ones with no staging buffer to be had waiting for the
    bounce's shares instead of failing."""
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:256M",
                      extra=["--max-buffers-per-uid", "3"])
    try:
        with hostlib.connect(d.socket_path) as dev:
            vals = [np.full(1 << 20, i, np.uint8) for i in range(16)]
            for f in [dev.kv_put_async(b"q%d" % i, v) for i, v in enumerate(vals)]:
                f.result()
            outs = [np.zeros(1 << 20, np.uint8) for _ in range(16)]
            for f in [dev.kv_get_async(b"q%d" % i, o) for i, o in enumerate(outs)]:
                assert f.result() == 1 << 20
            assert all((o == i).all() for i, o in enumerate(outs))
            assert len(dev._buffers) <= 3
    finally:
        assert d.terminate()[0] == 0
