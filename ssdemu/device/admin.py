"""The admin commands, which the data plane hands to the daemon's Python side: identify,
namespaces, log pages.  Every other command (block I/O, KV, pins, compute) runs in the data
plane (c/dev); one opcode table there says which.  One handler per admin opcode in
HANDLERS; a test checks that every opcode the C table routes here has one and no other
does.  Each returns an Outcome."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ssdemu.device.quotas import QuotaExceeded
from ssdemu.device.store import KeyNotFound, StoreFull
from ssdemu_wire.layout import NS_ALL_OWNERS, NS_QUOTA, NS_SHARED, OPCODES, STATUS


@dataclass
class Outcome:
    status: int
    result: int = 0
    bytes: int = 0  # moved for the client


def _ok(result: int = 0, nbytes: int = 0) -> Outcome:
    return Outcome(STATUS["SUCCESS"], result, nbytes)


def _err(name: str, result: int = 0) -> Outcome:
    return Outcome(STATUS[name], result)


class Admin:
    def __init__(self, daemon):
        self.d = daemon

    def run(self, client, sqe) -> Outcome:
        handler = HANDLERS.get(sqe.opcode)
        if handler is None:  # unknown, or one the retrieval worker runs
            return _err("INVALID_OPCODE")
        return handler(self, client, sqe)

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

    def identify(self, client, sqe):
        return self._reply_json(client, sqe, self.d.logs.identify())

    @staticmethod
    def _all_owners(client, sqe) -> bool | str:
        """NS_LIST's and NS_DELETE's param1: 0, or NS_ALL_OWNERS (an admin's request, for
        every owner's namespaces); else the status name to refuse with."""
        p = int(sqe.param1)
        if p not in (0, NS_ALL_OWNERS):
            return "INVALID_FIELD"
        if p and not client.admin:
            return "ACCESS_DENIED"
        return bool(p)

    def ns_list(self, client, sqe):
        if client is None:
            return _err("ABORTED")
        every = self._all_owners(client, sqe)
        if isinstance(every, str):
            return _err(every)
        return self._reply_json(client, sqe, self.d.namespaces.list(client, every))

    def get_log(self, client, sqe):
        if client is None:
            return _err("ABORTED")
        page = self.d.logs.page(int(sqe.param0), client)
        if page is None:
            return _err("INVALID_FIELD")
        return self._reply_json(client, sqe, page)

    def ns_create(self, client, sqe):
        """param0: bytes (0: keys only); param1: 0, or NS_SHARED for every client's use."""
        if int(sqe.param1) not in (0, NS_SHARED) or sqe.nsid or sqe.flags:
            return _err("INVALID_FIELD")
        if client is None:  # it left meanwhile: it would own a namespace no one can reach
            return _err("ABORTED")
        try:
            nsid = self.d.namespaces.create(int(sqe.param0), client,
                                           shared=int(sqe.param1) == NS_SHARED)
        except ValueError:
            return _err("INVALID_FIELD")
        except StoreFull:
            return _err("CAPACITY_EXCEEDED")
        except QuotaExceeded:  # the drive has room; this uid has had its share
            return _err("CAPACITY_EXCEEDED", NS_QUOTA)
        except OSError:
            return _err("MEDIA_ERROR")
        return _ok(nsid)

    def ns_delete(self, client, sqe):
        if client is None:  # it left meanwhile: its rights went with it
            return _err("ABORTED")
        every = self._all_owners(client, sqe)
        if isinstance(every, str):
            return _err(every)
        try:
            self.d.namespaces.delete(int(sqe.nsid), client, every)
        except KeyNotFound:
            return _err("INVALID_NAMESPACE")
        except PermissionError:
            return _err("ACCESS_DENIED")
        except TimeoutError:  # its commands did not drain: it was not deleted
            return _err("ABORTED")
        return _ok()


HANDLERS = {
    OPCODES["IDENTIFY"]: Admin.identify,
    OPCODES["NS_CREATE"]: Admin.ns_create,
    OPCODES["NS_DELETE"]: Admin.ns_delete,
    OPCODES["NS_LIST"]: Admin.ns_list,
    OPCODES["GET_LOG"]: Admin.get_log,
    # run on the daemon's retrieval worker (ssdemu/device/retrieval.py), not here
    OPCODES["TOPK_PAGES"]: None,
    OPCODES["ATTEND"]: None,
}
