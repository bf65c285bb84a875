"""The on-media store (format v2, c/store): round trips, KV semantics, byte-level
sharing, crash recovery, corruption, a journal that never runs out, and refusing media that
is not ours.  Every test runs on 512-byte media (a file) and on 4 KiB media (a loop device
with 4 KiB sectors)."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ssdemu.device.media import open_media
from ssdemu.device.store import (
    FORMAT_VERSION,
    MAGIC,
    STORE_IF_EXISTS,
    STORE_IF_NOT_EXISTS,
    CorruptValue,
    KeyExists,
    KeyNotFound,
    NotSsdemuMedia,
    Store,
    StoreError,
    StoreFull,
    probe,
)


class Drive:
    """Media for one test: a file (512-byte blocks) or a loop device with 4 KiB sectors."""

    def __init__(self, kind: str, dirname: str):
        self.kind, self.dir = kind, dirname
        self.path = os.path.join(dirname, "drive.img")
        self.dev = None

    def make(self, size: str = "32M") -> str:
        """A fresh media spec of this size."""
        self.release()
        if os.path.exists(self.path):
            os.unlink(self.path)
        if self.kind == "file":
            return f"file:{self.path}:{size}"
        nbytes = int(size[:-1]) << {"K": 10, "M": 20, "G": 30}[size[-1]]
        with open(self.path, "wb") as f:
            f.truncate(nbytes)
        self.dev = subprocess.run(["losetup", "-f", "--show", "--direct-io=on",
                                   "--sector-size", "4096", self.path], check=True,
                                  capture_output=True, text=True).stdout.strip()
        return f"block:{self.dev}"

    @property
    def spec(self) -> str:
        """The spec to reopen the same media."""
        return f"file:{self.path}" if self.kind == "file" else f"block:{self.dev}"

    @property
    def node(self) -> str:
        """The path to poke bytes into."""
        return self.path if self.kind == "file" else self.dev

    def poke(self, offset: int, data: bytes) -> None:
        with open(self.node, "r+b") as f:
            f.seek(offset)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def release(self) -> None:
        if self.dev:
            subprocess.run(["losetup", "-d", self.dev], capture_output=True)
            self.dev = None


def _loop_4k_available() -> bool:
    return os.geteuid() == 0 and subprocess.run(["which", "losetup"],
                                                capture_output=True).returncode == 0


@pytest.fixture(params=["file", "loop4k"])
def drive(request, disk_dir):
    if request.param == "loop4k" and not _loop_4k_available():
        pytest.skip("4 KiB media needs root and losetup (a loop device with 4 KiB sectors)")
    d = Drive(request.param, disk_dir)
    yield d
    d.release()


def fresh(drive, size="32M", durable=False, **kw):
    m = open_media(drive.make(size))
    return m, Store.format(m, durable_on_completion=durable, **kw)


keys = st.binary(min_size=1, max_size=16)
values = st.binary(min_size=1, max_size=20000)


@settings(deadline=None, max_examples=20,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(keys, values, min_size=1, max_size=30))
def test_round_trip_and_reopen(drive, items):
    m, s = fresh(drive)
    for k, v in items.items():
        s.put(k, v)
    for k, v in items.items():
        assert s.get(k) == v
    s.flush()
    s.close()
    m.close()
    with open_media(drive.spec) as m2:
        s2 = Store.open(m2)
        assert s2.block == max(4096, m2.lba_size)
        assert sorted(s2.list(limit=10**6)) == sorted(items)
        for k, v in items.items():
            assert s2.get(k) == v
        s2.close()


def test_kv_semantics(drive):
    m, s = fresh(drive, max_value=1 << 20)
    with pytest.raises(KeyNotFound):
        s.put(b"a", b"1", STORE_IF_EXISTS)
    assert s.put(b"a", b"1", STORE_IF_NOT_EXISTS) is False
    with pytest.raises(KeyExists):
        s.put(b"a", b"2", STORE_IF_NOT_EXISTS)
    assert s.put(b"a", b"2", STORE_IF_EXISTS) is True
    assert s.get(b"a") == b"2"
    assert s.exists(b"a") and not s.exists(b"a\0")  # keys differ by length too
    with pytest.raises(ValueError, match="1 to 16"):
        s.put(b"", b"x")
    with pytest.raises(ValueError, match="1 to 16"):
        s.get(b"x" * 17)
    with pytest.raises(ValueError, match="values are"):
        s.put(b"b", b"")
    with pytest.raises(ValueError, match="values are"):
        s.put(b"b", b"x" * (s.max_value + 1))
    s.delete(b"a")
    with pytest.raises(KeyNotFound):
        s.get(b"a")
    with pytest.raises(KeyNotFound):
        s.delete(b"a")
    s.put(b"c", b"3")
    s.put(b"b", b"3")
    assert s.list() == [b"b", b"c"] and s.list(b"c") == [b"c"]


def test_identical_bytes_are_stored_once(drive):
    m, s = fresh(drive)
    block = os.urandom(100_000)
    s.put(b"salt-a/k1", block)
    physical = s.physical_bytes
    s.put(b"salt-b/k1", block)  # another salt, same content
    assert s.physical_bytes == physical and s.logical_bytes == 2 * len(block)
    assert s.put(b"salt-a/k1", block) is True  # same key, same bytes: touched only
    s.put(b"salt-b/k1", b"changed")  # copy on write: the sharer keeps its bytes
    assert s.get(b"salt-a/k1") == block and s.get(b"salt-b/k1") == b"changed"
    s.delete(b"salt-b/k1")
    s.delete(b"salt-a/k1")
    assert s.physical_bytes == 0 and s.logical_bytes == 0
    assert s.info()["free_bytes"] == s.d_len  # every byte back
    info = s.info()
    assert info["dedup_hits"] == 1 and info["hash_collisions"] == 0


WRITER = textwrap.dedent("""
    import os, sys
    from ssdemu.device.media import open_media
    from ssdemu.device.store import Store
    spec, durable = sys.argv[1], sys.argv[2] == "1"
    m = open_media(spec)
    s = Store.open(m, durable_on_completion=durable)
    for i in range(100000):
        key = f"k{i}".encode()
        s.put(key, (key * 300)[: 100 + (i * 37) % 3000])
        if durable:
            print(i, flush=True)       # acknowledged: durable on completion
        elif i % 50 == 49:
            s.flush()
            print(i, flush=True)       # acknowledged: durable after the flush
""")


@pytest.mark.parametrize("durable", [True, False])
def test_kill_9_loses_nothing_acknowledged(drive, durable):
    m, s = fresh(drive, journal_blocks=64)  # checkpoints come often: kills land in them too
    s.close()
    m.close()
    p = subprocess.Popen([sys.executable, "-c", WRITER, drive.spec, "1" if durable else "0"],
                         stdout=subprocess.PIPE, text=True)
    acked = -1
    for line in p.stdout:
        acked = int(line)
        if acked >= 150:
            break
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert acked >= 150
    with open_media(drive.spec) as m2:
        s2 = Store.open(m2)
        for i in range(acked + 1):  # every acknowledged write reads back
            key = f"k{i}".encode()
            assert s2.get(key) == (key * 300)[: 100 + (i * 37) % 3000]
        for key in s2.list(limit=10**6):  # and nothing reads back wrong
            i = int(key[1:])
            assert s2.get(key) == (key * 300)[: 100 + (i * 37) % 3000]
        s2.close()


def test_corrupt_value_reads_as_an_error(drive):
    m, s = fresh(drive)
    s.put(b"k", b"v" * 5000)
    s.flush()
    off, _, _ = s.lookup(b"k")
    drive.poke(off + 100, b"\xff")
    with pytest.raises(CorruptValue, match="checksum"):
        s.get(b"k")


def test_torn_journal_block_is_ignored(drive):
    m, s = fresh(drive)
    s.put(b"a", b"1")
    s.put(b"b", b"2")  # each synchronous change is a group of its own: one block
    s.flush()
    info = s.info()
    last = info["journal_off"] + (info["journal_used_blocks"] - 1) * info["block"]
    s.close()
    m.close()
    drive.poke(last + 70, b"\x00\x01")
    with open_media(drive.spec) as m2:
        s2 = Store.open(m2)
        assert s2.list() == [b"a"] and s2.get(b"a") == b"1"
        s2.put(b"c", b"3")  # the journal continues where the valid blocks end
        assert s2.info()["journal_used_blocks"] == info["journal_used_blocks"]
        s2.close()
    with open_media(drive.spec) as m3:
        s3 = Store.open(m3)
        assert s3.list() == [b"a", b"c"]
        s3.close()


def test_a_group_written_past_a_hole_is_not_replayed_once_the_journal_goes_on(drive):
    """Several group writes are in flight at once, so a crash can leave a later group on the
    media and an earlier one not.  Open stops at the hole; the journal then goes on from
    there, and the stale group after it (whose sequence number fits the position) must not
    be replayed: each block names the hash of the one before it, and the chain breaks."""
    m, s = fresh(drive)
    s.put(b"a", b"1")
    s.put(b"lost", b"2")  # each synchronous change is a group of its own: one block
    s.put(b"stale", b"3")
    s.flush()
    info = s.info()
    blk = info["block"]
    hole = info["journal_off"] + (info["journal_used_blocks"] - 2) * blk
    s.close()
    m.close()
    drive.poke(hole, bytes(blk))  # "lost"'s group never reached the media; "stale"'s did
    with open_media(drive.spec) as m2:
        s2 = Store.open(m2)
        assert s2.list() == [b"a"]
        s2.put(b"c", b"4")  # written where "lost" was: "stale" follows it by position
        s2.close()
    with open_media(drive.spec) as m3:
        s3 = Store.open(m3)
        assert s3.list() == [b"a", b"c"], "a group from before the hole was replayed"
        s3.close()


def test_refuses_media_that_is_not_ours(drive):
    with open_media(drive.make("4M")):
        pass  # the media exists now
    drive.poke(0, os.urandom(1 << 20))
    with open_media(drive.spec) as m:
        assert probe(m) == "foreign"
        with pytest.raises(NotSsdemuMedia, match="not an ssdemu device"):
            Store.open(m)
    with open_media(drive.make("4M")) as m:
        assert probe(m) == "blank"
        with pytest.raises(NotSsdemuMedia, match="blank"):
            Store.open(m)


@pytest.mark.parametrize("version,match", [(FORMAT_VERSION + 1, "format v3; this ssdemu"),
                                           (1, "v1.*'ssdemu format'")])
def test_refuses_other_format_versions_in_one_line(drive, version, match):
    m, s = fresh(drive)
    s.close()
    m.close()
    drive.poke(8, struct.pack("<I", version))
    with open_media(drive.spec) as m2:
        assert probe(m2) == ("newer" if version > FORMAT_VERSION else "old")
        with pytest.raises(StoreError, match=match) as e:
            Store.open(m2)
        assert "\n" not in str(e.value)
    assert MAGIC.startswith(b"SSDEMU")


@pytest.mark.slow
def test_churn_never_runs_out_and_restart_reads_the_live_set(drive):
    """A steady put/delete workload of 100x the journal's record capacity, 50 live keys (a
    journal of two blocks: as many wraps and checkpoints as a larger one, in fewer puts)."""
    m, s = fresh(drive, journal_blocks=2)
    info = s.info()
    per_block = (info["block"] - 64) // 64
    capacity = info["journal_blocks"] * per_block
    live = 50
    for i in range(100 * capacity):
        key = f"k{i % live}".encode()
        if i % 3 == 2 and s.exists(key):
            s.delete(key)
        else:
            s.put(key, f"{i}".encode() * 20)  # never refused
    info = s.info()
    assert info["checkpoints"] > 10
    expect = {k: s.get(k) for k in s.list(limit=10**6)}
    assert 0 < len(expect) <= live
    s.close()
    m.close()
    with open_media(drive.spec) as m2:
        s2 = Store.open(m2)
        got = s2.info()
        # the live set from the checkpoint, at most one journal's records after it
        assert got["loaded_entries"] <= live
        assert got["replayed_records"] <= capacity
        assert {k: s2.get(k) for k in s2.list(limit=10**6)} == expect
        s2.close()


def test_a_full_device_takes_deletes(drive):
    m, s = fresh(drive, size="8M")
    value = os.urandom(256 << 10)
    n = 0
    with pytest.raises(StoreFull):
        while True:
            s.put(b"v%d" % n, value[:-1] + bytes([n % 256]))
            n += 1
    assert n > 10
    s.delete(b"v0")  # how a full device gets space back
    s.put(b"again", value[:-2] + b"zz")
    assert s.get(b"again")[-2:] == b"zz"


def test_the_index_capacity_is_the_profiles_not_a_fixed_table(drive):
    m, s = fresh(drive, index_keys=100)
    assert s.index_keys == 100
    for i in range(100):
        s.put(i.to_bytes(16, "little"), b"x%d" % i)
    with pytest.raises(StoreFull):
        s.put((100).to_bytes(16, "little"), b"one too many")
    s.put((5).to_bytes(16, "little"), b"replacing is fine")  # no new key
    s.delete((7).to_bytes(16, "little"))
    s.put((100).to_bytes(16, "little"), b"now it fits")
    assert s.info()["keys"] == 100


def test_namespaces_persist_and_share_the_data_region(drive):
    m, s = fresh(drive)
    n1, off1 = s.ns_create(4 << 20)
    s.put(b"kv", b"value")
    n2, off2 = s.ns_create(1 << 20)
    assert n1 == 1 and n2 == 2 and off1 != off2
    s.ns_delete(n1)
    with pytest.raises(ValueError, match="multiple"):
        s.ns_create(1000)
    with pytest.raises(StoreFull):
        s.ns_create(1 << 30)
    s.flush()
    s.close()
    m.close()
    with open_media(drive.spec) as m2:
        s2 = Store.open(m2)
        assert s2.namespaces == {2: (off2, 1 << 20)}
        assert s2.get(b"kv") == b"value"
        # the deleted namespace's extent is free again, the live one is not
        n3, off3 = s2.ns_create(4 << 20)
        assert not off2 <= off3 < off2 + (1 << 20)
        s2.close()


def test_a_namespace_sized_in_media_blocks_takes_whole_units(drive):
    """Namespaces are sized in the media's blocks; the store gives them whole units (4 KiB),
    and gives those back when they go, across a reopen."""
    m, s = fresh(drive)
    lba = m.lba_size
    assert s.block == max(4096, lba)
    free = s.info()["free_bytes"]
    n, off = s.ns_create(3 * lba)
    taken = free - s.info()["free_bytes"]
    assert taken == -(-3 * lba // s.block) * s.block and off % s.block == 0
    s.put(b"after", b"x" * 5000)  # the next extent starts past the whole unit
    s.flush()
    s.close()
    with open_media(drive.spec) as m2:
        s2 = Store.open(m2)
        assert s2.namespaces[n] == (off, 3 * lba)
        assert s2.get(b"after") == b"x" * 5000
        s2.ns_delete(n)
        s2.delete(b"after")
        assert s2.info()["free_bytes"] == free
        s2.close()
    m.close()


def test_a_store_moves_to_a_4k_sector_device_of_the_same_bytes(tmp_path):
    """The unit is the superblock's: a store formatted on a file (512-byte blocks) opens
    through a loop device with 4 KiB sectors over that file, and back."""
    if not _loop_4k_available():
        pytest.skip("needs root and losetup")
    d = Drive("file", str(tmp_path))
    m, s = fresh(d)
    assert m.lba_size == 512 and s.block == 4096
    s.put(b"k", b"moved")
    s.close()
    m.close()
    loop = subprocess.run(["losetup", "-f", "--show", "--direct-io=on", "--sector-size",
                           "4096", d.path], check=True, capture_output=True,
                          text=True).stdout.strip()
    try:
        with open_media(f"block:{loop}") as m2:
            assert m2.lba_size == 4096
            s2 = Store.open(m2)
            assert s2.get(b"k") == b"moved"
            s2.put(b"k2", b"written on 4 KiB sectors")
            s2.close()
    finally:
        subprocess.run(["losetup", "-d", loop], capture_output=True)
    with open_media(d.spec) as m3:
        s3 = Store.open(m3)
        assert s3.get(b"k2") == b"written on 4 KiB sectors"
        s3.close()


def test_an_early_record_whose_value_never_landed_is_skipped_at_open(drive):
    """With the write cache on, the data plane journals a put while its value's write is in
    flight; a crash between them leaves a record naming bytes never written.  Open checks
    the values of the records the last block calls unsure: the key keeps its old value (or
    stays absent), a value that did land is kept, and a checkpoint ends that journal, so the
    record is never replayed unchecked by a later open."""
    from ssdemu.device._device import lib

    m, s = fresh(drive)
    old = b"old value " * 500
    s.put(b"old", old)
    s.flush()
    rng = np.random.default_rng(7)
    lost_over, lost_new, landed = (rng.integers(0, 256, n, np.uint8).tobytes()
                                   for n in (50_000, 9_000, 30_000))
    free = s.info()["free_bytes"]
    for key, value, written in ((b"old", lost_over, 0), (b"fresh", lost_new, 0),
                                (b"done", landed, 1)):
        assert lib.sde_store_test_early_put(s._st, key, len(key), value, len(value),
                                            written) == 0
    s.close()  # the crash: nothing more reaches the media
    m.close()
    for reopen in ("after the crash", "again"):
        with open_media(drive.spec) as m2:
            s2 = Store.open(m2)
            info = s2.info()
            assert info["unwritten_records_skipped"] == (2 if reopen == "after the crash"
                                                         else 0), reopen
            assert s2.get(b"old") == old, reopen
            with pytest.raises(KeyNotFound):
                s2.get(b"fresh")
            assert s2.get(b"done") == landed, reopen
            # the skipped values' extents are free again: only "done" took space
            assert info["free_bytes"] == free - -(-len(landed) // s2.block) * s2.block, reopen
            s2.close()


def test_a_put_of_bytes_already_stored_waits_for_the_record_that_stored_them(drive):
    """Issue 33, item 1: an early put's value lands and the index takes it before its
    record's group is written; a second put of the same bytes under the same key has
    nothing to write.  It must not be acknowledged before that record is committed, or a
    FLUSH right after its acknowledgement would not cover the record (a power cut then lost
    the key).  The store tells the data plane which group it waits for: the open one."""
    from ssdemu.device._device import lib

    m, s = fresh(drive)
    value = np.random.default_rng(3).integers(0, 256, 20_000, np.uint8).tobytes()
    group = lib.sde_store_test_reput_group(s._st, b"K", 1, value, len(value), 0)
    assert group > 0  # not at once (0 before the fix)
    assert s.get(b"K") == value
    # with the early put's record written first, the same bytes again wait for nothing
    assert lib.sde_store_test_reput_group(s._st, b"L", 1, value[::-1], len(value), 1) == 0
    assert s.get(b"L") == value[::-1]
    s.close()
    m.close()


def _fragment(s, hole: int, n: int) -> list[bytes]:
    """Fill the data region with n values of `hole` bytes and delete every other one: the
    free space is then holes of that size (and what lies past them)."""
    keep = []
    for i in range(n):
        s.put(b"frag-%04d" % i, bytes([i % 251]) * hole)
    for i in range(0, n, 2):
        s.delete(b"frag-%04d" % i)
    for i in range(1, n, 2):
        keep.append(b"frag-%04d" % i)
    return keep


def test_a_value_no_free_run_holds_is_stored_in_pieces(drive):
    """On a fragmented store a large value still fits while the space is there: in pieces,
    read back exact, across the journal replay and a checkpoint, and its space comes back
    when it goes; a value larger than the free space is refused."""
    m, s = fresh(drive, "32M")
    info = s.info()
    hole = 256 << 10
    n = int(info["free_bytes"] // hole)  # full: no free run is longer than hole + a tail < hole
    keep = _fragment(s, hole, n)
    free = s.info()["free_bytes"]
    big = np.random.default_rng(1).integers(0, 256, 3 * hole + 1000, dtype=np.uint8).tobytes()
    s.put(b"big", big)
    info = s.info()
    assert info["pieced_values"] == 1 and info["index_entries"] > info["keys"]
    assert s.get(b"big") == big
    for reopen in ("journal", "checkpoint"):
        s.close()
        s = Store.open(m)
        assert s.get(b"big") == big, reopen
        assert s.info()["pieced_values"] == 1
        assert all(s.get(k) == bytes([int(k[5:]) % 251]) * hole for k in keep[:5])
        s.checkpoint()
    s.delete(b"big")
    assert s.info()["free_bytes"] == free
    with pytest.raises(StoreFull):
        s.put(b"too-big", b"x" * (free + hole))
    s.close()
    m.close()


def test_one_block_values_fill_every_block_and_reuse_the_lowest_freed(drive):
    """A one-block value's block is the lowest free one (first fit, a bitmap word at a
    time): small values fill the store to its last block, the blocks freed in the middle
    and at the end are taken again lowest first, and the store is full again after as many
    puts."""
    m, s = fresh(drive, "4M")  # 733 blocks of 4 KiB, 1,024 keys

    def value(tag: bytes, i: int) -> bytes:  # a block each: distinct, and too large to lie
        return (tag + b"%06d" % i) * 300  # in its journal record

    offsets = []
    with pytest.raises(StoreFull):
        while True:
            n = len(offsets)
            offsets.append(s.put_ex(b"s%d" % n, value(b"s", n))["offset"])
    n = len(offsets)
    assert n > 130 and s.info()["free_bytes"] == 0  # the blocks ran out, not the keys
    assert len(set(offsets)) == n
    gone = [7, 64, 65, 130, n - 1]  # across bitmap words, and the last block taken
    for i in gone[::-1]:
        s.delete(b"s%d" % i)
    got = [s.put_ex(b"t%d" % j, value(b"t", j))["offset"] for j in range(len(gone))]
    assert got == sorted(offsets[i] for i in gone)
    with pytest.raises(StoreFull):
        s.put(b"one-more", value(b"o", 0))
    # a two-block value takes the lowest run of two freed blocks, not a lone lower one
    unit = offsets[21] - offsets[20]
    assert unit == s.info()["block"]
    for i in (3, 40, 41):
        s.delete(b"s%d" % i)
    assert s.put_ex(b"two", value(b"w", 0) * 2)["offset"] == offsets[40]
    assert s.put_ex(b"one", value(b"n", 0))["offset"] == offsets[3]
    gone += [3, 40, 41]
    assert all(s.get(b"s%d" % i) == value(b"s", i) for i in range(n) if i not in gone)
    s.close()
    m.close()


def test_every_keyed_entry_point_checks_key_size_then_namespace_then_the_key(drive):
    """The six keyed openings (put, get, exists, lookup, delete, pin) share one check, in one
    order: the key's size, its namespace, then the key.  Before, lookup and pin skipped the
    namespace and answered KEY_NOT_EXIST for a namespace that does not exist."""
    from ssdemu.device._device import ffi, lib

    m, s = fresh(drive)
    u64, u32 = ffi.new("uint64_t *"), ffi.new("uint32_t *")
    buf = ffi.new("uint8_t[16]")
    res = ffi.new("sde_kv_put_result *")
    st = s._st

    def calls(nsid, key):
        return {
            "get": lib.sde_store_get(st, nsid, key, len(key), buf, 16, u64),
            "exists": lib.sde_store_exists(st, nsid, key, len(key)),
            "lookup": lib.sde_store_lookup(st, nsid, key, len(key), u64, u64, u64),
            "delete": lib.sde_store_delete(st, nsid, key, len(key)),
            "pin": lib.sde_store_pin(st, nsid, key, len(key), 1, u32),
            "put": lib.sde_store_put(st, nsid, key, len(key), b"v", 1, 0, res),  # last
        }

    assert set(calls(7, b"k").values()) == {lib.SDE_SC_INVALID_NAMESPACE}
    assert set(calls(7, b"x" * 300).values()) == {lib.SDE_SC_KV_INVALID_KEY_SIZE}
    got = calls(0, b"missing")
    del got["put"]  # a put creates it
    assert set(got.values()) == {lib.SDE_SC_KV_KEY_NOT_EXIST}
    s.close()
    m.close()


def test_lookup_many_answers_each_key_as_lookup_does(drive):
    """Keys of several lengths, missing ones between stored ones, more than one hold of the
    data plane's lock (LOOKUP_HOLD): each answer is the key's own, in order."""
    from ssdemu.device.store import LOOKUP_HOLD

    m, s = fresh(drive)
    stored = [f"k{i}".encode() * (1 + i % 3) for i in range(0, LOOKUP_HOLD + 40, 2)]
    for i, key in enumerate(stored):
        s.put(key, bytes([i % 251]) * (10 + i))
    asked = [f"k{i}".encode() * (1 + i % 3) for i in range(LOOKUP_HOLD + 40)]
    got = s.lookup_many(asked)
    assert len(got) == len(asked)
    for key, place in zip(asked, got, strict=True):
        if key in stored:
            assert place is not None and place[1] == 10 + stored.index(key)
            assert place == s.lookup(key)
        else:
            assert place is None
    assert s.lookup_many([]) == []
