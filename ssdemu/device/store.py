"""The drive's persistent store: a thin Python face on the C store (c/store), which
holds the one index of stored keys, the value extents and the on-media format v2
(superblock, two checkpoint slots, a journal reclaimed at every checkpoint; the layout is in
c/store and docs/architecture.md).

Used alone (`ssdemu format`, tests) every call does its I/O synchronously.  Inside the
daemon the data plane runs KV commands against the same C store; the daemon's Python side
(admin and compute commands) calls it between `sde_dev_store_enter` and `_leave`
(`Store.attach`), so the two never change it at once.
"""

from __future__ import annotations

import contextlib
import errno
import os

import numpy as np

from ssdemu.device import _device
from ssdemu.device.buffers import address_of
from ssdemu.device.media import Media
from ssdemu.errors import SsdemuError

ffi, lib = _device.ffi, _device.lib

MAGIC = b"SSDEMU\x00\x01"
FORMAT_VERSION = lib.SDE_STORE_VERSION
MAX_KEY = lib.SDE_KEY_MAX
DEFAULT_MAX_VALUE = 64 << 20
LIST_ENTRY = lib.SDE_LIST_ENTRY
LOOKUP_HOLD = 256  # keys looked up per hold of the data plane's lock (lookup_many)

STORE_ANY, STORE_IF_EXISTS, STORE_IF_NOT_EXISTS = (
    lib.SDE_KV_STORE_ANY, lib.SDE_KV_STORE_IF_EXISTS, lib.SDE_KV_STORE_IF_NOT_EXISTS)


class KeyBatch:
    """Keys laid out for sde_store_lookup_many: their bytes end to end, their lengths, each
    one's start (C pointers into arrays this object keeps alive)."""

    def __init__(self, keys):
        keys = [bytes(k) for k in keys]
        self.keys = tuple(keys)
        self.n = len(keys)
        klens = np.fromiter(map(len, keys), np.uint32, self.n)
        self._blob = np.frombuffer(b"".join(keys) or b"\0", np.uint8)
        self._klens = klens
        self.starts = np.concatenate(([0], np.cumsum(klens, dtype=np.int64))).tolist()
        self.kp = ffi.from_buffer("uint8_t[]", self._blob)
        self.lp = ffi.from_buffer("uint32_t[]", klens)


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


_SC = {
    lib.SDE_SC_KV_KEY_EXISTS: KeyExists,
    lib.SDE_SC_KV_KEY_NOT_EXIST: KeyNotFound,
    lib.SDE_SC_MEDIA_ERROR: CorruptValue,
    lib.SDE_SC_CAPACITY_EXCEEDED: StoreFull,
    lib.SDE_SC_INVALID_NAMESPACE: KeyNotFound,
}


def _check(status: int, what) -> None:
    if status == lib.SDE_SC_SUCCESS:
        return
    exc = _SC.get(status)
    if exc is not None:
        raise exc(what)
    if status == lib.SDE_SC_KV_INVALID_KEY_SIZE:
        raise ValueError(f"keys are 1 to {MAX_KEY} bytes")
    if status == lib.SDE_SC_KV_INVALID_VALUE_SIZE:
        raise ValueError("value size out of range")
    raise StoreError(f"{what}: status {status}")


def check_key(key: bytes) -> None:
    if not isinstance(key, (bytes, bytearray)):
        raise TypeError(f"keys are bytes, got {type(key).__name__}")
    if not 1 <= len(key) <= MAX_KEY:
        raise ValueError(f"keys are 1 to {MAX_KEY} bytes, got {len(key)}")


def store_params(durable: bool, index_keys: int = 0, max_value: int = DEFAULT_MAX_VALUE,
                 journal_blocks: int = 0):
    return ffi.new("sde_store_params *", {"index_keys": index_keys, "max_value": max_value,
                                          "journal_blocks": journal_blocks,
                                          "durable": int(durable)})


class Store:
    def __init__(self, media: Media, ptr):
        self.media = media
        self._st = ptr
        self._dev = None  # the device core, once the data plane serves this store
        info = self.info()
        self.block = info["block"]
        self.d_off, self.d_len = info["data_off"], info["data_bytes"]
        self.j_off = info["journal_off"]
        self.j_len = info["journal_blocks"] * info["block"]
        self.max_value = info["max_value"]
        self.index_keys = info["index_keys"]

    # -- lifecycle --
    @classmethod
    def format(cls, media: Media, durable_on_completion: bool = False, index_keys: int = 0,
               max_value: int = DEFAULT_MAX_VALUE, journal_blocks: int = 0) -> Store:
        out = ffi.new("sde_store **")
        r = lib.sde_store_format(media.fd, media.size, media.lba_size,
                                 store_params(durable_on_completion, index_keys, max_value,
                                              journal_blocks), out)
        if r < 0:
            raise StoreError(ffi.string(lib.sde_store_last_error()).decode())
        return cls(media, out[0])

    @classmethod
    def open(cls, media: Media, durable_on_completion: bool = False) -> Store:
        out = ffi.new("sde_store **")
        r = lib.sde_store_open(media.fd, media.size, media.lba_size,
                               store_params(durable_on_completion), out)
        if r < 0:
            msg = ffi.string(lib.sde_store_last_error()).decode()
            if r == -61:  # ENODATA: blank
                raise NotSsdemuMedia(msg)
            if "not an ssdemu device" in msg:
                raise NotSsdemuMedia(msg)
            raise StoreError(msg)
        return cls(media, out[0])

    def attach(self, dev) -> None:
        """The data plane serves this store from now on: KV commands run there, and the
        calls below take the device core's lock."""
        lib.sde_dev_attach_store(dev, self._st)
        self._dev = dev

    @contextlib.contextmanager
    def _locked(self):
        if self._dev is None:
            yield
            return
        lib.sde_dev_store_enter(self._dev)
        try:
            yield
        finally:
            lib.sde_dev_store_leave(self._dev)

    def close(self) -> None:
        if self._st is not None:
            if self._dev is not None:
                lib.sde_dev_attach_store(self._dev, ffi.NULL)
                self._dev = None
            lib.sde_store_free(self._st)
            self._st = None

    def info(self) -> dict:
        i = ffi.new("sde_store_info *")
        with self._locked():  # the data plane changes the store meanwhile
            lib.sde_store_get_info(self._st, i)
        return {name: getattr(i, name) for name, _ in ffi.typeof("sde_store_info").fields}

    # -- the KV commands --
    def put(self, key: bytes, value, mode: int = STORE_ANY, nsid: int = 0) -> bool:
        """Store; returns True if the key existed (its value replaced, or, for identical
        content, only touched)."""
        return self.put_ex(key, value, mode, nsid)["existed"]

    def put_ex(self, key: bytes, value, mode: int = STORE_ANY, nsid: int = 0) -> dict:
        """Store; returns what it did: existed, wrote (value bytes written, not shared),
        offset and length of the value's extent."""
        check_key(key)
        data = value if isinstance(value, np.ndarray) else np.frombuffer(bytes(value), np.uint8)
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if not 0 < data.nbytes <= self.max_value:
            raise ValueError(f"values are 1 byte to {self.max_value} bytes, got {data.nbytes}")
        res = ffi.new("sde_kv_put_result *")
        with self._locked():
            st = lib.sde_store_put(self._st, nsid, bytes(key), len(key),
                                   ffi.cast("void *", address_of(data)), data.nbytes, mode, res)
        _check(st, key)
        return {"existed": bool(res.existed), "wrote": bool(res.wrote), "offset": res.offset,
                "length": res.length}

    def get(self, key: bytes, nsid: int = 0) -> bytes:
        check_key(key)
        place = self.lookup(key, nsid)
        if place is None:
            raise KeyNotFound(key)
        out = np.empty(max(place[1], 1), np.uint8)
        n = ffi.new("uint64_t *")
        if self._dev is not None:  # the data plane serves on while the value is read
            st = lib.sde_dev_store_get(self._dev, nsid, bytes(key), len(key),
                                       ffi.cast("void *", address_of(out)), out.nbytes, n)
        else:
            st = lib.sde_store_get(self._st, nsid, bytes(key), len(key),
                                   ffi.cast("void *", address_of(out)), out.nbytes, n)
        if st == lib.SDE_SC_MEDIA_ERROR:
            raise CorruptValue(f"the value of key {bytes(key).hex()} fails its checksum")
        _check(st, key)
        return bytes(out[:n[0]])

    def lookup(self, key: bytes, nsid: int = 0) -> tuple[int, int, int] | None:
        """(offset, length, content hash) of the key's value on the media, or None."""
        return self.lookup_many((key,), nsid)[0]

    def lookup_many(self, keys, nsid: int = 0) -> list[tuple[int, int, int] | None]:
        """lookup of each key (lookup_places's answers as tuples)."""
        places, found = self.lookup_places(keys, nsid)
        return [p if good else None
                for p, good in zip(zip(*places.tolist(), strict=True), found.tolist(),
                                   strict=True)]

    def lookup_places(self, keys, nsid: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(offset, length, content hash) rows (3, n) uint64 and found (n,) bool of each key,
        LOOKUP_HOLD keys to a hold of the data plane's lock (a retrieval command names every
        block of a sequence; a hold for all of 16,384 keys kept the data plane and the other
        retrieval workers waiting ~10 ms).  Inside the daemon each hold is one C call that
        wakes no one when it ends (sde_dev_store_lookup_many: a lookup commits nothing)."""
        return self.lookup_batch(KeyBatch(keys), nsid)

    def lookup_batch(self, batch: KeyBatch, nsid: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """lookup_places of keys laid out once (KeyBatch): a decode step looks the same
        sequence up layer after layer."""
        n = batch.n
        places = np.empty((3, max(n, 1)), np.uint64)  # offset, length, hash
        status = np.empty(max(n, 1), np.int32)
        op, np_, hp = (ffi.from_buffer("uint64_t[]", places[r]) for r in range(3))
        sp = ffi.from_buffer("int32_t[]", status)
        kp, lp, starts = batch.kp, batch.lp, batch.starts
        for at in range(0, n, LOOKUP_HOLD):
            m = min(LOOKUP_HOLD, n - at)
            args = (nsid, kp + starts[at], lp + at, m, op + at, np_ + at, hp + at, sp + at)
            if self._dev is not None:
                lib.sde_dev_store_lookup_many(self._dev, *args)
            else:
                lib.sde_store_lookup_many(self._st, *args)
        return places[:, :n], status[:n] == lib.SDE_SC_SUCCESS

    def delete(self, key: bytes, nsid: int = 0) -> None:
        check_key(key)
        with self._locked():
            st = lib.sde_store_delete(self._st, nsid, bytes(key), len(key))
        _check(st, key)

    def exists(self, key: bytes, nsid: int = 0) -> bool:
        check_key(key)
        with self._locked():
            return lib.sde_store_exists(self._st, nsid, bytes(key), len(key)) == 0

    def list(self, start: bytes = b"", limit: int = 1000, nsid: int = 0) -> list[bytes]:
        """Keys in byte order from `start` (as NVMe KV List)."""
        limit = max(0, min(limit, self.info()["keys"]))
        out = np.zeros(max(1, limit) * LIST_ENTRY, np.uint8)
        with self._locked():
            n = lib.sde_store_list(self._st, nsid, bytes(start), len(start),
                                   ffi.cast("uint8_t *", address_of(out)), limit)
        if n < 0:
            raise StoreError(f"key list failed: {os.strerror(-n)}"
                             + (" (the store failed: a journal write did not reach the "
                                "media)" if n == -errno.EIO else ""))
        raw = out.tobytes()
        return [raw[i * LIST_ENTRY + 1:i * LIST_ENTRY + 1 + raw[i * LIST_ENTRY]]
                for i in range(n)]

    def prefix_match(self, keys: np.ndarray, nsid: int = 0) -> int:
        """The leading run of 16-byte keys (an (n, 16) uint8 array) that the store holds."""
        k = np.ascontiguousarray(keys, dtype=np.uint8).reshape(-1)
        with self._locked():
            return lib.sde_store_prefix_match(self._st, nsid, ffi.cast("uint8_t *", address_of(k)),
                                              k.nbytes // 16)

    def pin(self, key: bytes, delta: int, nsid: int = 0) -> int:
        count = ffi.new("uint32_t *")
        with self._locked():
            st = lib.sde_store_pin(self._st, nsid, bytes(key), len(key), delta, count)
        _check(st, key)
        return count[0]

    def flush(self) -> None:
        with self._locked():
            r = lib.sde_store_flush(self._st)
        if r < 0:
            raise OSError(-r, f"flush failed: {os.strerror(-r)}")

    def checkpoint(self) -> None:
        with self._locked():
            r = lib.sde_store_checkpoint(self._st)
        if r < 0:
            raise OSError(-r, f"checkpoint failed: {os.strerror(-r)}")

    # -- namespaces: extents of the data region and key spaces, with their owners, recorded
    # in the journal and checkpoints --
    MAX_NAMESPACES = lib.SDE_STORE_MAX_NS

    def ns_create(self, nbytes: int, owner: tuple[int, int] | None = None,
                  shared: bool = False) -> tuple[int, int]:
        """A new namespace of nbytes (a multiple of the media's block; 0: keys only): (nsid,
        offset).  It takes whole store units.  owner: (uid, token) it belongs to, or that
        created it when shared; None: shared, created by no client."""
        lba = self.media.lba_size
        if nbytes < 0 or nbytes % lba:
            raise ValueError(f"namespace size must be a multiple of {lba}")
        uid, token = owner if owner is not None else (0, 0)
        flags = lib.SDE_NS_SHARED if shared or owner is None else 0
        nsid, off = ffi.new("uint32_t *"), ffi.new("uint64_t *")
        with self._locked():
            st = lib.sde_store_ns_create(self._st, nbytes, uid, flags, token, nsid, off)
        if st == lib.SDE_SC_CAPACITY_EXCEEDED:
            raise StoreFull("no room (or no namespace id) for the namespace")
        _check(st, "namespace create")
        return nsid[0], off[0]

    def ns_delete(self, nsid: int) -> None:
        with self._locked():
            st = lib.sde_store_ns_delete(self._st, nsid)
        if st == lib.SDE_SC_INVALID_NAMESPACE:
            raise KeyNotFound(nsid)
        _check(st, "namespace delete")

    @property
    def namespaces(self) -> dict[int, tuple[int, int]]:
        """nsid -> (offset, bytes)."""
        return {nsid: (ns.offset, ns.bytes) for nsid, ns in self.namespace_table().items()}

    def namespace_table(self) -> dict[int, object]:
        """nsid -> its sde_ns_info (offset, bytes, uid, token, flags)."""
        out = {}
        for nsid in range(1, self.MAX_NAMESPACES + 1):
            info = ffi.new("sde_ns_info *")
            if lib.sde_store_ns_get(self._st, nsid, info) == 0:
                out[nsid] = info
        return out

    @property
    def logical_bytes(self) -> int:
        return self.info()["logical_bytes"]

    @property
    def physical_bytes(self) -> int:
        return self.info()["physical_bytes"]


def probe(media: Media) -> str:
    """'ssdemu', 'blank', 'foreign', 'old' (an earlier store format) or 'newer': what the
    media's first block holds."""
    r = lib.sde_store_probe(media.fd, ffi.NULL)
    if r < 0:
        raise OSError(-r, f"cannot read {media.spec}: {os.strerror(-r)}")
    return {lib.SDE_PROBE_BLANK: "blank", lib.SDE_PROBE_CURRENT: "ssdemu",
            lib.SDE_PROBE_OLD_VERSION: "old", lib.SDE_PROBE_NEWER_VERSION: "newer",
            lib.SDE_PROBE_FOREIGN: "foreign"}[r]


def remove_file_if_created(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
