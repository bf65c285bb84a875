"""The timing model's FTL (c/model/sde_ftl.c under c/model): mapping, GC, write
amplification, trims, and GC competing with host I/O.  Small logical spaces and a small
profile so that a drive fills in milliseconds."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hostlib
from ssdemu.sim.profile import load
from ssdemu.sim.timing import DeviceModel, ftl_scale
from ssdemu.tools.daemon_process import DaemonProcess

MIB = 1 << 20
KIB4 = 4096


def _small(name="pcie4-tlc", cache=4 * MIB):
    p = load(name)
    return dataclasses.replace(p, write_cache=dataclasses.replace(p.write_cache, bytes=cache))


def _fill(m, logical, passes=1):
    m.closed_loop("write", 32, passes * logical // (128 << 10), 128 << 10, logical)


def test_sequential_overwrites_never_relocate():
    """A drive rewritten front to back frees whole lines: GC finds them empty (WA 1)."""
    p, logical = _small(), 256 * MIB
    m = DeviceModel(p, ftl_bytes=logical)
    _fill(m, logical, passes=4)
    s = m.stats()
    assert s["erases"] > 0 and s["gc_bytes_programmed"] == 0
    assert s["write_amplification"] == 1.0
    assert s["ftl_valid_bytes"] == logical


def test_random_overwrites_age_the_drive():
    """Random 4 KiB overwrites of a full drive: GC relocates (WA > 1), erases lines, keeps
    the free-line threshold, and the sustained rate falls well below the fresh one."""
    p, logical = _small(), 256 * MIB
    m = DeviceModel(p, ftl_bytes=logical)
    start = m.stats()["horizon_ns"]
    n = logical // KIB4 // 4
    last, _ = m.closed_loop("write", 256, n, KIB4, logical, seed=5, start=start)
    fresh = n / (last - start)
    _fill(m, logical)
    for r in range(3):
        start = m.stats()["horizon_ns"]
        last, _ = m.closed_loop("write", 256, logical // KIB4, KIB4, logical, seed=9 + r)
    steady = logical // KIB4 / (last - start)
    s = m.stats()
    assert s["write_amplification"] > 1.5 and s["gc_ns"] > 0 and s["erases"] > 0
    assert s["ftl_free_lines"] >= p.ftl.gc_free_lines
    assert s["ftl_valid_bytes"] == logical  # every unit still mapped once
    assert steady < fresh / 2


def test_trims_lower_write_amplification():
    """The same random overwrites with half the drive trimmed first: GC finds fewer valid
    units to move."""
    p, logical = _small(), 256 * MIB
    was = []
    for trim in (False, True):
        m = DeviceModel(p, ftl_bytes=logical)
        _fill(m, logical)
        if trim:
            m.trim(logical // 2, logical // 2)
            assert m.stats()["trimmed_bytes"] == logical // 2
            assert m.stats()["ftl_valid_bytes"] == logical // 2
        before = m.stats()
        m.closed_loop("write", 256, logical // KIB4, KIB4, logical // 2, seed=3)
        s = m.stats()
        was.append((s["gc_bytes_programmed"] - before["gc_bytes_programmed"])
                   / (s["host_bytes_programmed"] - before["host_bytes_programmed"]))
    assert was[1] < was[0] / 2


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 255), st.sampled_from([KIB4, 3 * KIB4 + 100, MIB])),
                max_size=12),
       st.integers(0, 2))
def test_trim_many_is_each_trim_in_order(ranges, nbytes_at):
    """trim_many (a replay's evicted blocks in one call) leaves the FTL as trim() of each
    range in turn: the same valid and trimmed bytes, and the same GC and write times after."""
    p, logical = _small(), 64 * MIB
    nbytes = (KIB4, 3 * KIB4 + 100, MIB)[nbytes_at]
    offsets = [i * 61 * KIB4 + (100 if r == MIB else 0) for i, r in ranges]
    outs = []
    for many in (False, True):
        m = DeviceModel(p, ftl_bytes=logical)
        _fill(m, logical)
        if many:
            m.trim_many(offsets, nbytes)
        else:
            for off in offsets:
                m.trim(off, nbytes)
        last, marks = m.closed_loop("write", 64, 4096, KIB4, logical, seed=2, marks=4)
        s = m.stats()
        outs.append((s["ftl_valid_bytes"], s["trimmed_bytes"], s["gc_bytes_programmed"],
                     last, marks))
    assert outs[0] == outs[1]
    whole = any((off + nbytes) // KIB4 > -(-off // KIB4) for off in offsets)
    assert (outs[1][1] > 0) == whole  # the trims took effect


def test_gc_competes_with_reads():
    """A read on a drive whose GC is busy relocating and erasing waits for the dies; the same
    read on the same drive once idle does not."""
    p, logical = _small(), 256 * MIB
    m = DeviceModel(p, ftl_bytes=logical)
    _fill(m, logical)
    m.closed_loop("write", 256, logical // KIB4, KIB4, logical, seed=4)
    gc_before = m.stats()["gc_ns"]
    t = m.stats()["horizon_ns"]
    m.closed_loop("write", 256, 20_000, KIB4, logical, seed=8, start=t)
    assert m.stats()["gc_ns"] > gc_before
    t = m.stats()["horizon_ns"]
    busy = [m.read(t, i * 977 * KIB4 % logical, KIB4) - t for i in range(64)]
    idle_at = m.stats()["busy_until_ns"]
    idle = m.read(idle_at, 0, KIB4) - idle_at
    assert max(busy) > 2 * idle


def test_flush_programs_the_partial_row():
    p = _small()
    m = DeviceModel(p, ftl_bytes=64 * MIB)
    m.write(0.0, 0, KIB4)  # a quarter of a row: it waits in the cache for the rest
    assert m.stats()["host_bytes_programmed"] == 0
    m.flush(1000.0)
    s = m.stats()
    row = p.nand.page_bytes * p.nand.planes_per_die
    assert s["host_bytes_programmed"] == row and s["padding_bytes"] == row - KIB4


def test_the_scale_is_declared_and_grows_the_unit_past_64_gib():
    p = load("star2000d")
    small, big = ftl_scale(p, 4 << 30), ftl_scale(p, 1 << 40)
    assert small.unit_bytes == 4096 and big.unit_bytes > 4096
    assert big.logical_bytes == 1 << 40
    for s in (small, big):
        assert s.lines >= 64 and 0 < s.scale < 1 and 0 < s.block_scale <= 1
        assert s.overprovisioning == pytest.approx(p.overprovisioning, rel=0.1)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["write", "trim", "read"]), st.integers(0, 511),
                          st.integers(1, 64)), min_size=1, max_size=200))
def test_mapping_matches_a_reference(ops):
    """Writes, trims and reads over 2 MiB in 4 KiB units: the FTL's valid bytes are the units
    written and not trimmed since, whatever GC moved in between (a set, as reference)."""
    p = _small(cache=1 * MIB)
    logical = 2 * MIB
    m = DeviceModel(p, ftl_bytes=logical)
    mapped: set[int] = set()
    t = 0.0
    for op, unit, n in ops:
        n = min(n, logical // KIB4 - unit)
        units = set(range(unit, unit + n))
        t += 1000.0
        if op == "write":
            assert m.write(t, unit * KIB4, n * KIB4) > t
            mapped |= units
        elif op == "trim":
            m.trim(unit * KIB4, n * KIB4)
            mapped -= units
        else:
            assert m.read(t, unit * KIB4, n * KIB4) > t
        assert m.stats()["ftl_valid_bytes"] == len(mapped) * KIB4
    s = m.stats()
    assert s["ftl_free_lines"] >= 1
    assert s["write_amplification"] >= 1.0


def test_daemon_trims_deallocated_and_deleted_ranges(tmp_path):
    """The daemon's drive has an FTL over its media: a deallocate and a KV delete are trims
    (the log page counts them)."""
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:256M", extra=["--clock", "virtual"])
    try:
        with hostlib.connect(d.socket_path) as dev:
            model = dev.log()["model"]
            assert model["ftl_logical_bytes"] == 256 * MIB and model["ftl_lines"] > 0
            ns = dev.ns_create(16 * MIB)
            buf = dev.alloc(MIB)
            dev.write(ns, 0, buf)
            dev.flush(ns)
            before = dev.log()["model"]
            assert before["ftl_valid_bytes"] >= MIB
            dev.deallocate(ns, 0, MIB)
            after = dev.log()["model"]
            assert after["trimmed_bytes"] - before["trimmed_bytes"] == MIB
            kv = dev.alloc(256 * 1024)
            dev.kv_put(b"k1", kv)
            dev.flush()
            before = dev.log()["model"]
            dev.kv_delete(b"k1")
            after = dev.log()["model"]
            assert after["trimmed_bytes"] - before["trimmed_bytes"] >= 256 * 1024 - KIB4
    finally:
        assert d.terminate()[0] == 0
