"""Namespaces, kept in the store on the media with their owners (a uid and an owner key's
token): which a client may use, the list, a create within the uid's quotas (zeroed before
anyone can read it), a delete once every command started before it is done."""

from __future__ import annotations

import logging
import os
import time

from ssdemu.device import _device
from ssdemu.device.quotas import QuotaExceeded, refusal
from ssdemu.device.sessions import Client
from ssdemu.device.store import KeyNotFound

ffi, lib = _device.ffi, _device.lib
log = logging.getLogger("ssdemu.serve")
DRAIN_S = 30.0  # a namespace delete waits this long at most for the commands before it


class Namespaces:
    def __init__(self, daemon):
        self.d = daemon

    def visible(self, client: Client | None) -> dict:
        """The namespaces a client may use: shared ones and its owner's own (the data plane
        applies the same rule, c/dev/dev_core.c, dev_ns_visible)."""
        return {nsid: ns for nsid, ns in self.d.store.namespace_table().items()
                if ns.flags & lib.SDE_NS_SHARED
                or (client is not None and (ns.uid, ns.token) == (client.uid, client.token))}

    def visible_ids(self, client: Client | None) -> set[int]:
        return set(self.visible(client))

    def list(self, client: Client | None, all_owners: bool = False) -> list[dict]:
        """The namespaces a client may use; all_owners (an admin's): every namespace, each
        with its owner's uid and whether the admin itself may use it."""
        mine = self.visible(client)
        table = self.d.store.namespace_table() if all_owners else mine
        out = []
        for nsid, ns in sorted(table.items()):
            row = {"nsid": nsid, "bytes": ns.bytes, "start": ns.offset,
                   "shared": bool(ns.flags & lib.SDE_NS_SHARED)}
            if all_owners:
                row.update(uid=ns.uid, mine=nsid in mine)
            out.append(row)
        return out

    def create(self, nbytes: int, client: Client | None, shared: bool = False) -> int:
        """Raises QuotaExceeded past the creator's uid's namespace quotas."""
        # a request the drive cannot hold at all is its refusal (StoreFull), not the quota's
        if client is not None and nbytes <= self.d.store.info()["free_bytes"]:
            used = self.d.registration.usage(client.uid)
            why = (refusal(self.d.quotas, client.uid, used, "namespaces")
                   or refusal(self.d.quotas, client.uid, used, "namespace_bytes", nbytes))
            if why:
                log.warning("client %d: %s", client.cid, why)
                raise QuotaExceeded(why)
        # a shared namespace records its creator too: only it (or an admin) may delete it
        owner = None if client is None else (client.uid, client.token)
        nsid, offset = self.d.store.ns_create(nbytes, owner, shared=shared or owner is None)
        # zeroed before anyone can read it: the space may have held another client's
        # namespace or values (a punched hole or BLKZEROOUT, not a write of every block)
        r = lib.sde_dev_zero(self.d.dev, offset, nbytes) if nbytes else 0
        if r < 0:
            self.d.store.ns_delete(nsid)
            raise OSError(-r, f"cannot zero the new namespace: {os.strerror(-r)}")
        lib.sde_dev_set_ns(self.d.dev, nsid, self.d.store.namespace_table()[nsid])
        log.info("namespace %d created: %d bytes at %d, %s", nsid, nbytes, offset,
                 ("shared, by " if shared or owner is None else "owner ")
                 + (f"uid {owner[0]}" if owner else "the daemon"))
        return nsid

    def delete(self, nsid: int, client: Client, any_owner: bool = False) -> None:
        """Raises KeyNotFound for a namespace the client may not use, PermissionError for a
        shared one it did not create; any_owner (an admin's request, checked by the
        caller): any namespace."""
        ns = self.d.store.namespace_table().get(nsid)
        admin = any_owner
        if ns is None or not (admin or nsid in self.visible(client)):
            raise KeyNotFound(nsid)  # another owner's is as if it did not exist
        if not admin and (ns.uid, ns.token) != (client.uid, client.token):
            raise PermissionError(f"namespace {nsid} is shared: only its creator or an "
                                  "admin deletes it")
        # the data plane stops taking its commands first; a put already under way fails
        # at its commit (the store checks the namespace's generation).  Then its space is
        # given back only once every command started before is done: a block read or
        # write, or a retrieve, still in flight would otherwise land on space the next
        # namespace or value was given (another owner's)
        lib.sde_dev_set_ns(self.d.dev, nsid, ffi.NULL)
        mark = lib.sde_dev_ctx_mark(self.d.dev)
        deadline = time.monotonic() + DRAIN_S
        while lib.sde_dev_inflight_before(self.d.dev, mark) > 0:
            if time.monotonic() > deadline:
                lib.sde_dev_set_ns(self.d.dev, nsid, ns)  # still in use: it stays
                raise TimeoutError(f"namespace {nsid}: commands still in flight after "
                                   f"{DRAIN_S:.0f} s")
            time.sleep(0.0005)
        self.d.store.ns_delete(nsid)
        # rules naming it would otherwise hit the next namespace given its id
        for rule in self.d.faults.rules(None):
            if rule["nsid"] == nsid:
                self.d.faults.clear(rule["id"])
        log.info("namespace %d deleted", nsid)
