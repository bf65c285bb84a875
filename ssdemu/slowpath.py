"""Commands the data plane hands to Python: admin (identify, namespaces, log pages) and KV
(the store on the media).  One handler per opcode in HANDLERS; a test checks that every
opcode the C table routes here has one.  Each returns an Outcome; data moves between the
client's buffer (the daemon's mapping of it) and the store, and those copies are counted."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ssdemu import _engine
from ssdemu.queue_layout import OPCODES, STATUS
from ssdemu.store import (
    MAX_KEY,
    MAX_VALUE,
    STORE_ANY,
    STORE_IF_EXISTS,
    STORE_IF_NOT_EXISTS,
    CorruptValue,
    KeyExists,
    KeyNotFound,
    StoreFull,
)

lib = _engine.lib
LIST_ENTRY = 1 + MAX_KEY  # KV_LIST: a length byte and 16 key bytes per key


@dataclass
class Outcome:
    status: int
    result: int = 0
    bytes: int = 0  # moved for the client
    copied: int = 0  # copied by the daemon


def _ok(result: int = 0, nbytes: int = 0, copied: int = 0) -> Outcome:
    return Outcome(STATUS["SUCCESS"], result, nbytes, copied)


def _err(name: str, result: int = 0) -> Outcome:
    return Outcome(STATUS[name], result)


class SlowPath:
    def __init__(self, daemon):
        self.d = daemon

    def run(self, client, sqe) -> Outcome:
        handler = HANDLERS.get(sqe.opcode)
        if handler is None:
            return _err("INVALID_OPCODE")
        return handler(self, client, sqe)

    # -- helpers --
    def _region(self, client, sqe):
        """The client's buffer range named by the command, or None."""
        buf = client.buffers.get(int(sqe.buf)) if client else None
        off, length = int(sqe.buf_offset), int(sqe.length)
        if buf is None or off > buf.nbytes or length > buf.nbytes - off:
            return None
        return buf.mm, off, length

    def _reply_json(self, client, sqe, data) -> Outcome:
        region = self._region(client, sqe)
        if region is None:
            return _err("INVALID_BUFFER")
        mm, off, length = region
        payload = json.dumps(data).encode()
        if len(payload) > length:
            return _err("INVALID_BUFFER", len(payload))
        mm[off:off + len(payload)] = payload
        return _ok(len(payload))

    @staticmethod
    def _key(sqe):
        n = int(sqe.param1) & 0xFF
        if not 1 <= n <= MAX_KEY:
            return None
        return (int(sqe.lba).to_bytes(8, "little") + int(sqe.key_hi).to_bytes(8, "little"))[:n]

    # -- admin --
    def identify(self, client, sqe):
        return self._reply_json(client, sqe, self.d.identify())

    def ns_list(self, client, sqe):
        return self._reply_json(client, sqe, self.d.namespace_list())

    def get_log(self, client, sqe):
        page = self.d.log_page(int(sqe.param0))
        if page is None:
            return _err("INVALID_FIELD")
        return self._reply_json(client, sqe, page)

    def ns_create(self, client, sqe):
        try:
            nsid = self.d.create_namespace(int(sqe.param0))
        except ValueError:
            return _err("INVALID_FIELD")
        except StoreFull:
            return _err("CAPACITY_EXCEEDED")
        return _ok(nsid)

    def ns_delete(self, client, sqe):
        try:
            self.d.delete_namespace(int(sqe.nsid))
        except KeyNotFound:
            return _err("INVALID_NAMESPACE")
        return _ok()

    # -- KV --
    def _kv_checks(self, sqe):
        if sqe.nsid != 0 or sqe.flags:
            return None, _err("INVALID_NAMESPACE" if sqe.nsid else "INVALID_FIELD")
        key = self._key(sqe)
        if key is None:
            return None, _err("KV_INVALID_KEY_SIZE")
        return key, None

    def kv_store(self, client, sqe):
        key, bad = self._kv_checks(sqe)
        if bad:
            return bad
        if not 0 < sqe.length <= MAX_VALUE:
            return _err("KV_INVALID_VALUE_SIZE")
        mode = int(sqe.param0)
        if mode not in (STORE_ANY, STORE_IF_EXISTS, STORE_IF_NOT_EXISTS):
            return _err("INVALID_FIELD")
        region = self._region(client, sqe)
        if region is None:
            return _err("INVALID_BUFFER")
        mm, off, length = region
        value = mm[off:off + length]
        try:
            existed = self.d.store.put(key, value, mode)
        except KeyExists:
            return _err("KV_KEY_EXISTS")
        except KeyNotFound:
            return _err("KV_KEY_NOT_EXIST")
        except StoreFull:
            return _err("CAPACITY_EXCEEDED")
        return _ok(int(existed), length, length)

    def kv_retrieve(self, client, sqe):
        key, bad = self._kv_checks(sqe)
        if bad:
            return bad
        region = self._region(client, sqe)
        if region is None:
            return _err("INVALID_BUFFER")
        try:
            value = self.d.store.get(key)
        except KeyNotFound:
            return _err("KV_KEY_NOT_EXIST")
        except CorruptValue:
            return _err("MEDIA_ERROR")
        mm, off, length = region
        if len(value) > length:
            return _err("KV_INVALID_VALUE_SIZE", len(value))
        mm[off:off + len(value)] = value
        return _ok(len(value), len(value), len(value))

    def kv_delete(self, client, sqe):
        key, bad = self._kv_checks(sqe)
        if bad:
            return bad
        try:
            self.d.store.delete(key)
        except KeyNotFound:
            return _err("KV_KEY_NOT_EXIST")
        return _ok()

    def kv_exist(self, client, sqe):
        key, bad = self._kv_checks(sqe)
        if bad:
            return bad
        return _ok() if self.d.store.exists(key) else _err("KV_KEY_NOT_EXIST")

    def kv_list(self, client, sqe):
        if sqe.nsid != 0:
            return _err("INVALID_NAMESPACE")
        n = int(sqe.param1) & 0xFF
        start = self._key(sqe) if n else b""
        if n and start is None:
            return _err("KV_INVALID_KEY_SIZE")
        region = self._region(client, sqe)
        if region is None:
            return _err("INVALID_BUFFER")
        mm, off, length = region
        keys = self.d.store.list(start, length // LIST_ENTRY)
        out = bytearray()
        for k in keys:
            out += bytes([len(k)]) + k.ljust(MAX_KEY, b"\0")
        mm[off:off + len(out)] = bytes(out)
        return _ok(len(keys), len(out), len(out))


HANDLERS = {
    OPCODES["IDENTIFY"]: SlowPath.identify,
    OPCODES["NS_CREATE"]: SlowPath.ns_create,
    OPCODES["NS_DELETE"]: SlowPath.ns_delete,
    OPCODES["NS_LIST"]: SlowPath.ns_list,
    OPCODES["GET_LOG"]: SlowPath.get_log,
    OPCODES["KV_STORE"]: SlowPath.kv_store,
    OPCODES["KV_RETRIEVE"]: SlowPath.kv_retrieve,
    OPCODES["KV_DELETE"]: SlowPath.kv_delete,
    OPCODES["KV_EXIST"]: SlowPath.kv_exist,
    OPCODES["KV_LIST"]: SlowPath.kv_list,
}
