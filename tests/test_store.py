"""The on-media store: round trips, KV semantics, byte-level sharing, crash recovery,
corruption, and refusing media that is not ours."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ssdemu.media import open_media
from ssdemu.store import (
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


@pytest.fixture
def media_path(disk_dir):
    return os.path.join(disk_dir, "drive.img")


def fresh(path, size="32M", durable=False):
    m = open_media(f"file:{path}:{size}")
    return m, Store.format(m, durable_on_completion=durable)


keys = st.binary(min_size=1, max_size=16)
values = st.binary(min_size=1, max_size=20000)


@settings(deadline=None, max_examples=20,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(keys, values, min_size=1, max_size=30))
def test_round_trip_and_reopen(media_path, items):
    if os.path.exists(media_path):
        os.unlink(media_path)
    m, s = fresh(media_path)
    for k, v in items.items():
        s.put(k, v)
    for k, v in items.items():
        assert s.get(k) == v
    s.flush()
    s.close()
    m.close()
    with open_media(f"file:{media_path}") as m2:
        s2 = Store.open(m2)
        assert sorted(s2.list(limit=10**6)) == sorted(items)
        for k, v in items.items():
            assert s2.get(k) == v
        s2.close()


def test_kv_semantics(media_path):
    m, s = fresh(media_path)
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
        s.put(b"b", b"x" * ((2 << 20) + 1))
    s.delete(b"a")
    with pytest.raises(KeyNotFound):
        s.get(b"a")
    with pytest.raises(KeyNotFound):
        s.delete(b"a")
    s.put(b"c", b"3")
    s.put(b"b", b"3")
    assert s.list() == [b"b", b"c"] and s.list(b"c") == [b"c"]


def test_identical_bytes_are_stored_once(media_path):
    m, s = fresh(media_path)
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
    assert s.free == [(s.d_off, s.d_len)]  # every byte back in one extent


WRITER = textwrap.dedent("""
    import os, sys
    from ssdemu.media import open_media
    from ssdemu.store import Store
    path, durable = sys.argv[1], sys.argv[2] == "1"
    m = open_media(f"file:{path}")
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
def test_kill_9_loses_nothing_acknowledged(media_path, durable):
    m, s = fresh(media_path)
    s.close()
    m.close()
    p = subprocess.Popen([sys.executable, "-c", WRITER, media_path, "1" if durable else "0"],
                         stdout=subprocess.PIPE, text=True)
    acked = -1
    for line in p.stdout:
        acked = int(line)
        if acked >= 150:
            break
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert acked >= 150
    with open_media(f"file:{media_path}") as m2:
        s2 = Store.open(m2)
        for i in range(acked + 1):  # every acknowledged write reads back
            key = f"k{i}".encode()
            assert s2.get(key) == (key * 300)[: 100 + (i * 37) % 3000]
        for key in s2.list(limit=10**6):  # and nothing reads back wrong
            i = int(key[1:])
            assert s2.get(key) == (key * 300)[: 100 + (i * 37) % 3000]
        s2.close()


def test_corrupt_value_reads_as_an_error(media_path):
    m, s = fresh(media_path)
    s.put(b"k", b"v" * 5000)
    s.flush()
    off = s.index[b"k"].extent.offset
    with open(media_path, "r+b") as f:
        f.seek(off + 100)
        f.write(b"\xff")
    with pytest.raises(CorruptValue, match="checksum"):
        s.get(b"k")


def test_torn_journal_record_is_ignored(media_path):
    m, s = fresh(media_path)
    s.put(b"a", b"1")
    s.put(b"b", b"2")
    s.flush()
    last = s.j_off + (s.seq - 1) * 512
    s.close()
    m.close()
    with open(media_path, "r+b") as f:
        f.seek(last + 20)
        f.write(b"\x00\x01")
    with open_media(f"file:{media_path}") as m2:
        s2 = Store.open(m2)
        assert s2.list() == [b"a"] and s2.get(b"a") == b"1"
        s2.put(b"c", b"3")  # the journal continues where the valid records end
        assert s2.seq == 2
        s2.close()


def test_refuses_media_that_is_not_ours(media_path):
    with open(media_path, "wb") as f:
        f.write(os.urandom(1 << 20))
    with open_media(f"file:{media_path}") as m:
        assert probe(m) == "foreign"
        with pytest.raises(NotSsdemuMedia, match="not an ssdemu device"):
            Store.open(m)
    blank = media_path + ".blank"
    with open_media(f"file:{blank}:4M") as m:
        assert probe(m) == "blank"
        with pytest.raises(NotSsdemuMedia, match="blank"):
            Store.open(m)


def test_refuses_a_newer_format(media_path):
    m, s = fresh(media_path)
    s.close()
    m.close()
    with open(media_path, "r+b") as f:
        sb = bytearray(f.read(4096))
        sb[8:12] = struct.pack("<I", FORMAT_VERSION + 1)
        sb[-4:] = struct.pack("<I", zlib.crc32(sb[:-4]))
        f.seek(0)
        f.write(sb)
    with open_media(f"file:{media_path}") as m2:
        assert probe(m2) == "ssdemu"
        with pytest.raises(StoreError, match="format version 2"):
            Store.open(m2)
    assert MAGIC.startswith(b"SSDEMU")


def test_full_journal_refuses_changes(media_path):
    m, s = fresh(media_path, size="1M")
    with pytest.raises(StoreFull):
        for i in range(10_000):
            s.put(f"k{i}".encode(), b"x")
    n = len(s.list(limit=10**6))
    assert n > 0 and s.get(b"k0") == b"x"


def test_namespaces_persist_and_share_the_data_region(media_path):
    m, s = fresh(media_path)
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
    with open_media(f"file:{media_path}") as m2:
        s2 = Store.open(m2)
        assert s2.namespaces == {2: (off2, 1 << 20)}
        assert s2.get(b"kv") == b"value"
        # the deleted namespace's extent is free again, the live one is not
        n3, off3 = s2.ns_create(4 << 20)
        assert not off2 <= off3 < off2 + (1 << 20)
        s2.close()
