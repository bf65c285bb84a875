"""The drive's persistent store on the media: a superblock, a journal of metadata records,
and value extents; a key-value index rebuilt from the journal when the media is opened.

On-media layout (format version 1, little-endian):

- superblock, at 0, 4 KiB: magic `SSDEMU\0\1`, format version, logical block size, the
  regions' offsets and sizes, a CRC-32;
- journal, from 4 KiB: 512-byte records, one per change, in sequence: magic, sequence
  number, operation, key length and key (1..16 bytes), the value's extent (offset, length),
  the value's CRC-32 and content hash, a CRC-32 of the record;
- data, after the journal: value extents, in whole logical blocks.

A store writes the value first (to a free extent), then its journal record; a crash between
the two leaves an extent nothing points to, which the next open frees.  Opening replays the
journal up to the first record whose magic, sequence or CRC does not hold (a torn append).
With the volatile write cache on, `flush()` makes everything written so far durable; with it
off, every change is durable (fdatasync) before it returns.  A value whose CRC does not match
on read is an error, never data.  Identical values under different keys (another salt or
adapter) share one extent: the content hash finds it, a reference count keeps it, and the
last delete frees it; logical bytes (what clients stored) and physical bytes (extents) are
both reported.  The journal is not compacted yet: a full journal refuses further changes.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from ssdemu.buffers import address_of, alloc_aligned
from ssdemu.engine import OP_READ, OP_WRITE, Engine, make_ios
from ssdemu.errors import SsdemuError
from ssdemu.media import Media

MAGIC = b"SSDEMU\x00\x01"
FORMAT_VERSION = 1
SUPERBLOCK_BYTES = 4096
RECORD_BYTES = 512
MAX_KEY = 16
MAX_VALUE = 2 << 20
_SB = struct.Struct("<8sIIQQQQQ")  # magic, version, block, media, journal off/len, data off/len
_REC = struct.Struct("<4sQBB16sQQI16sI")  # magic seq op klen key ext_off length crc hash nsid
_REC_MAGIC = b"SJR1"
OP_PUT, OP_DELETE, OP_NS_CREATE, OP_NS_DELETE = 1, 2, 3, 4

STORE_ANY, STORE_IF_EXISTS, STORE_IF_NOT_EXISTS = 0, 1, 2


class StoreError(SsdemuError):
    """The media cannot be served as an ssdemu store."""


class NotSsdemuMedia(StoreError):
    pass


class KeyExists(SsdemuError):
    pass


class KeyNotFound(SsdemuError):
    pass


class CorruptValue(SsdemuError):
    pass


class StoreFull(SsdemuError):
    pass


@dataclass
class Extent:
    offset: int
    nbytes: int  # allocated (whole blocks)
    refs: int


@dataclass
class Entry:
    length: int
    crc: int
    digest: bytes
    extent: Extent


def check_key(key: bytes) -> None:
    if not 1 <= len(key) <= MAX_KEY:
        raise ValueError(f"keys are 1 to {MAX_KEY} bytes, got {len(key)}")


def media_is_blank(first_block: bytes) -> bool:
    return not any(first_block)


class Store:
    def __init__(self, media: Media, durable_on_completion: bool):
        self.media = media
        self.block = max(media.lba_size, 512)
        self.durable_on_completion = durable_on_completion
        self.engine = Engine(media, queue_depth=8)
        self.index: dict[bytes, Entry] = {}
        self.by_digest: dict[bytes, Extent] = {}
        self.free: list[tuple[int, int]] = []  # (offset, bytes), sorted
        self.seq = 0
        self.last_put_wrote = False  # did the last put write value bytes (not shared ones)
        self.namespaces: dict[int, tuple[int, int]] = {}  # nsid -> (offset, bytes)
        self._staging = alloc_aligned(MAX_VALUE + self.block)

    # -- layout --
    @staticmethod
    def layout(media_bytes: int, block: int) -> tuple[int, int, int, int]:
        journal = max(64 * RECORD_BYTES, (media_bytes // 64) // 4096 * 4096)
        data_off = SUPERBLOCK_BYTES + journal
        data = (media_bytes - data_off) // block * block
        if data < block:
            raise StoreError(f"media of {media_bytes} bytes is too small for a store")
        return SUPERBLOCK_BYTES, journal, data_off, data

    @classmethod
    def format(cls, media: Media, durable_on_completion: bool = False) -> Store:
        s = cls(media, durable_on_completion)
        j_off, j_len, d_off, d_len = cls.layout(media.size, s.block)
        sb = bytearray(SUPERBLOCK_BYTES)
        sb[:_SB.size] = _SB.pack(MAGIC, FORMAT_VERSION, s.block, media.size, j_off, j_len,
                                 d_off, d_len)
        sb[-4:] = struct.pack("<I", zlib.crc32(sb[:-4]))
        s._write(0, bytes(sb))
        s._write(j_off, bytes(RECORD_BYTES))  # an empty journal ends at its first record
        s.engine.fsync()
        s._set_regions(j_off, j_len, d_off, d_len)
        s.free = [(d_off, d_len)]
        return s

    @classmethod
    def open(cls, media: Media, durable_on_completion: bool = False) -> Store:
        s = cls(media, durable_on_completion)
        sb = s._read(0, SUPERBLOCK_BYTES)
        if sb[:8] != MAGIC:
            if media_is_blank(sb):
                raise NotSsdemuMedia("the media is blank: format it (ssdemu format)")
            raise NotSsdemuMedia("the media holds something that is not an ssdemu device")
        magic, version, block, media_bytes, j_off, j_len, d_off, d_len = _SB.unpack(
            sb[:_SB.size])
        if version > FORMAT_VERSION:
            raise StoreError(f"the media has format version {version}; this ssdemu reads up "
                             f"to {FORMAT_VERSION}")
        if struct.unpack("<I", sb[-4:])[0] != zlib.crc32(sb[:-4]):
            raise StoreError("the superblock's checksum does not match")
        if block != s.block or media_bytes > media.size:
            raise StoreError("the superblock does not fit this media")
        s._set_regions(j_off, j_len, d_off, d_len)
        s._replay()
        return s

    def _set_regions(self, j_off, j_len, d_off, d_len):
        self.j_off, self.j_len, self.d_off, self.d_len = j_off, j_len, d_off, d_len

    # -- I/O --
    def _io(self, op: int, offset: int, buf: np.ndarray) -> None:
        ios = make_ios(1)
        ios["op"], ios["addr"], ios["len"] = op, address_of(buf), buf.nbytes
        ios["offset"] = offset
        self.engine.run(ios)
        if ios["res"][0] != buf.nbytes:
            raise OSError(-int(ios["res"][0]) if ios["res"][0] < 0 else 5,
                          f"media {'read' if op == OP_READ else 'write'} at {offset} failed")

    def _write(self, offset: int, data: bytes) -> None:
        n = -(-len(data) // self.block) * self.block
        buf = self._staging[:n]
        buf[:len(data)] = np.frombuffer(data, np.uint8)
        buf[len(data):] = 0
        self._io(OP_WRITE, offset, buf)

    def _read(self, offset: int, nbytes: int) -> bytes:
        n = -(-nbytes // self.block) * self.block
        buf = self._staging[:n]
        self._io(OP_READ, offset, buf)
        return bytes(buf[:nbytes])

    # -- journal --
    def _append(self, op: int, key: bytes, entry: Entry | None, offset: int = 0,
                length: int = 0) -> None:
        if (self.seq + 1) * RECORD_BYTES > self.j_len - RECORD_BYTES:
            raise StoreFull("the journal is full")
        self.seq += 1
        ext = entry.extent if entry else None
        body = _REC.pack(_REC_MAGIC, self.seq, op, len(key), key.ljust(16, b"\0"),
                         ext.offset if ext else offset, entry.length if entry else length,
                         entry.crc if entry else 0, entry.digest if entry else bytes(16), 0)
        rec = body + struct.pack("<I", zlib.crc32(body))
        # the record after it is zeroed in the same write: a replay stops there
        self._write(self.j_off + (self.seq - 1) * RECORD_BYTES,
                    rec.ljust(RECORD_BYTES, b"\0") + bytes(RECORD_BYTES))
        if self.durable_on_completion:
            self.engine.fsync()

    def _replay(self) -> None:
        live: dict[bytes, tuple[int, int, int, bytes]] = {}
        seq = 0
        while (seq + 1) * RECORD_BYTES <= self.j_len:
            raw = self._read(self.j_off + seq * RECORD_BYTES, RECORD_BYTES)
            body, crc = raw[:_REC.size], struct.unpack("<I", raw[_REC.size:_REC.size + 4])[0]
            if body[:4] != _REC_MAGIC or zlib.crc32(body) != crc:
                break
            _, rseq, op, klen, key, off, length, vcrc, digest, _ = _REC.unpack(body)
            if rseq != seq + 1 or not 1 <= klen <= MAX_KEY:
                break
            key = key[:klen]
            if op == OP_PUT:
                live[key] = (off, length, vcrc, digest)
            elif op == OP_DELETE:
                live.pop(key, None)
            elif op == OP_NS_CREATE:
                self.namespaces[int.from_bytes(key, "little")] = (off, length)
            elif op == OP_NS_DELETE:
                self.namespaces.pop(int.from_bytes(key, "little"), None)
            else:
                break
            seq = rseq
        self.seq = seq
        used = {}
        for key, (off, length, vcrc, digest) in live.items():
            ext = used.get(off)
            if ext is None:
                ext = used[off] = Extent(off, -(-length // self.block) * self.block, 0)
                self.by_digest[digest] = ext
            ext.refs += 1
            self.index[key] = Entry(length, vcrc, digest, ext)
        # everything the live extents do not cover is free (orphans of a crash included)
        cursor, free = self.d_off, []
        taken = [(e.offset, e.nbytes) for e in used.values()] + list(self.namespaces.values())
        for off, nbytes in sorted(taken):
            if off > cursor:
                free.append((cursor, off - cursor))
            cursor = max(cursor, off + nbytes)
        if cursor < self.d_off + self.d_len:
            free.append((cursor, self.d_off + self.d_len - cursor))
        self.free = free

    # -- allocation --
    def _alloc(self, nbytes: int) -> int:
        for i, (off, size) in enumerate(self.free):
            if size >= nbytes:
                if size == nbytes:
                    del self.free[i]
                else:
                    self.free[i] = (off + nbytes, size - nbytes)
                return off
        raise StoreFull(f"no free extent of {nbytes} bytes")

    def _release(self, ext: Extent) -> None:
        ext.refs -= 1
        if ext.refs:
            return
        for d, e in list(self.by_digest.items()):
            if e is ext:
                del self.by_digest[d]
        self._free_extent(ext.offset, ext.nbytes)

    def _free_extent(self, offset: int, nbytes: int) -> None:
        self.free.append((offset, nbytes))
        self.free.sort()
        merged = []
        for off, size in self.free:
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((off, size))
        self.free = merged

    # -- the KV commands --
    def put(self, key: bytes, value: bytes, mode: int = STORE_ANY) -> bool:
        """Store; returns True if the key existed (its value replaced, or, for identical
        content, only touched)."""
        check_key(key)
        if not 0 < len(value) <= MAX_VALUE:
            raise ValueError(f"values are 1 byte to {MAX_VALUE} bytes, got {len(value)}")
        old = self.index.get(key)
        if mode == STORE_IF_EXISTS and old is None:
            raise KeyNotFound(key)
        if mode == STORE_IF_NOT_EXISTS and old is not None:
            raise KeyExists(key)
        digest = hashlib.blake2b(value, digest_size=16).digest()
        self.last_put_wrote = False
        if old is not None and old.digest == digest:
            return True  # the same bytes: nothing to write
        ext = self.by_digest.get(digest)
        if ext is None:  # new content: a new extent (never overwrite shared bytes in place)
            self.last_put_wrote = True
            nbytes = -(-len(value) // self.block) * self.block
            ext = Extent(self._alloc(nbytes), nbytes, 0)
            self._write(ext.offset, value)
            self.by_digest[digest] = ext
        entry = Entry(len(value), zlib.crc32(value), digest, ext)
        ext.refs += 1
        try:
            self._append(OP_PUT, key, entry)
        except Exception:
            self._release(ext)
            raise
        self.index[key] = entry
        if old is not None:
            self._release(old.extent)
        return old is not None

    def get(self, key: bytes) -> bytes:
        check_key(key)
        e = self.index.get(key)
        if e is None:
            raise KeyNotFound(key)
        data = self._read(e.extent.offset, e.length)
        if zlib.crc32(data) != e.crc:
            raise CorruptValue(f"the value of key {key.hex()} fails its checksum")
        return data

    def delete(self, key: bytes) -> None:
        check_key(key)
        e = self.index.get(key)
        if e is None:
            raise KeyNotFound(key)
        self._append(OP_DELETE, key, None)
        del self.index[key]
        self._release(e.extent)

    def exists(self, key: bytes) -> bool:
        check_key(key)
        return key in self.index

    def list(self, start: bytes = b"", limit: int = 1000) -> list[bytes]:
        """Keys in byte order from `start` (as NVMe KV List)."""
        return sorted(k for k in self.index if k >= start)[:limit]

    def flush(self) -> None:
        self.engine.fsync()

    # -- block namespaces: extents of the data region, recorded in the journal --
    MAX_NAMESPACES = 64

    def ns_create(self, nbytes: int) -> tuple[int, int]:
        """A new namespace of nbytes (a positive multiple of the block): (nsid, offset)."""
        if nbytes <= 0 or nbytes % self.block:
            raise ValueError(f"namespace size must be a positive multiple of {self.block}")
        nsid = next((i for i in range(1, self.MAX_NAMESPACES + 1)
                     if i not in self.namespaces), None)
        if nsid is None:
            raise StoreFull("no namespace id left")
        offset = self._alloc(nbytes)
        try:
            self._append(OP_NS_CREATE, nsid.to_bytes(4, "little"), None, offset, nbytes)
        except Exception:
            self._free_extent(offset, nbytes)
            raise
        self.namespaces[nsid] = (offset, nbytes)
        return nsid, offset

    def ns_delete(self, nsid: int) -> None:
        if nsid not in self.namespaces:
            raise KeyNotFound(nsid)
        self._append(OP_NS_DELETE, nsid.to_bytes(4, "little"), None)
        offset, nbytes = self.namespaces.pop(nsid)
        self._free_extent(offset, nbytes)

    @property
    def logical_bytes(self) -> int:
        return sum(e.length for e in self.index.values())

    @property
    def physical_bytes(self) -> int:
        return sum(ext.nbytes for ext in {id(e.extent): e.extent
                                          for e in self.index.values()}.values())

    def close(self) -> None:
        self.engine.close()


def probe(media: Media) -> str:
    """'ssdemu', 'blank' or 'foreign': what the media's first block holds."""
    eng = Engine(media, queue_depth=1)
    try:
        buf = alloc_aligned(SUPERBLOCK_BYTES)
        eng.pread(buf, 0)
    finally:
        eng.close()
    if bytes(buf[:8]) == MAGIC:
        return "ssdemu"
    return "blank" if media_is_blank(bytes(buf)) else "foreign"


def remove_file_if_created(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
