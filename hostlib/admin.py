"""Admin commands (identify, namespaces, the log page, the model's books) through the queue,
and fault injection through the control socket; a mixin of hostlib.Device (each queue
command defined once, as X_async: hostlib/commands.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np

from hostlib.commands import command
from hostlib.errors import CapacityError
from ssdemu_wire.layout import NS_ALL_OWNERS, NS_QUOTA, NS_SHARED, OPCODES


def _quota(e: Exception, _a: dict):
    """NS_CREATE's CAPACITY_EXCEEDED with NS_QUOTA: the uid's quota, said so."""
    if isinstance(e, CapacityError) and e.result == NS_QUOTA:
        raise CapacityError(e.status, "namespace create: this uid's namespace quota "
                            "(serve --max-namespaces-per-uid, --max-namespace-bytes-per-"
                            "uid; the daemon's log has the figures)", e.result) from None
    return None

if TYPE_CHECKING:
    from hostlib.client import Future, QueuePair


class AdminCommands:
    def _admin_json_async(self, opcode: int, what: str, qp: QueuePair | None = None,
                          **fields) -> Future:
        """An admin command whose answer is JSON, into the queue pair's whole bounce."""
        qp = qp or self.qp
        boff, share = qp.bounce_take(qp.bounce.nbytes)
        return self.submit(opcode, what, qp=qp, bounce=True,
                           after=lambda n: json.loads(bytes(share[:n])), buf=qp.bounce_handle,
                           buf_offset=boff, length=share.nbytes, **fields)

    @command()
    def identify_async(self, qp: QueuePair | None = None) -> Future:
        return self._admin_json_async(OPCODES["IDENTIFY"], "identify", qp)

    @command()
    def namespaces_async(self, all_owners: bool = False,
                         qp: QueuePair | None = None) -> Future:
        """The namespaces this client may use (nsid, bytes, start, shared).  all_owners (an
        admin's request): every namespace on the drive, each with its owner's `uid` and
        whether this client may use it (`mine`)."""
        return self._admin_json_async(OPCODES["NS_LIST"], "namespace list", qp,
                                      param1=NS_ALL_OWNERS if all_owners else 0)

    @command(on_error=_quota)
    def ns_create_async(self, nbytes: int = 0, shared: bool = False,
                        qp: QueuePair | None = None) -> Future:
        """A new namespace: nbytes of blocks (0: for keys only; KV calls name it with
        `nsid=`).  It belongs to this client's owner (its uid, and the owner key given to
        `connect`): other owners cannot see it, unless it is created shared (then every
        client may use it, and only its creator or an admin may delete it).  The result:
        its nsid."""
        return self.submit(OPCODES["NS_CREATE"], "namespace create", qp=qp, param0=nbytes,
                           param1=NS_SHARED if shared else 0)

    @command()
    def ns_delete_async(self, nsid: int, any_owner: bool = False,
                        qp: QueuePair | None = None) -> Future:
        """Delete a namespace of this client's owner, or a shared one it created (another's
        shared one: AccessDeniedError).  any_owner (an admin's request): any namespace,
        whoever owns it."""
        return self.submit(OPCODES["NS_DELETE"], f"namespace delete {nsid}", qp=qp, nsid=nsid,
                           param1=NS_ALL_OWNERS if any_owner else 0)

    @command()
    def log_async(self, page: int = 1, qp: QueuePair | None = None) -> Future:
        return self._admin_json_async(OPCODES["GET_LOG"], f"log page {page}", qp,
                                      param0=page)

    @command()
    def counters_async(self, qp: QueuePair | None = None) -> Future:
        """The drive model's books at the command's turn (COUNTERS): a dict of its busy
        times (ns, summed), the latest time booked, bytes over the link and on NAND.  On the
        virtual clock it waits behind the compute commands fetched before it, so it holds
        what every command sent before it on this queue pair booked, and nothing sent
        after: sample the books without waiting for the commands to complete.  Admin only."""
        from ssdemu_wire.layout import COUNTERS_DTYPE

        qp = qp or self.qp
        out = np.zeros(1, COUNTERS_DTYPE)
        fields, bounced, copy, release = self._staged_out(out.view(np.uint8), qp, kv=True)

        def books(n):
            if copy is not None:
                copy(n)
            return {name: out[0][name].item() for name in COUNTERS_DTYPE.names
                    if name != "reserved"}

        return self.submit(OPCODES["COUNTERS"], "counters", qp=qp, bounce=bounced,
                           after=books, release=release, **fields)

    # -- fault injection: for testing the software above the drive (control requests) --

    def inject_fault(self, kind: str, *, nsid: int | None = None,
                     lba: tuple[int, int] | None = None, key: bytes | None = None,
                     count: int = 0, probability: float = 1.0,
                     latency_us: float | None = None, directions: str = "both",
                     seed: int = 0) -> int:
        """Make matching commands fail or complete late, from now on; returns the rule's id.
        kind: "read-error" / "write-error" (MEDIA_ERROR: block reads or writes, KV
        retrieves or stores) or "latency" (latency_us more; directions "read", "write" or
        "both").  nsid None: every namespace; lba (first, count): block commands touching
        that range of nsid; key: KV commands on that key (of nsid, 0 when None).  count:
        the rule ends after hitting that many commands (0: at clear_faults); probability:
        each matching command is hit with it, drawn from `seed` (the same seed, the same
        faults).  An admin (the holder of the daemon's --admin-key; without one, the
        daemon's uid and root) may name any namespace or none; any other owner only a
        namespace of its own."""
        msg = {"op": "fault", "action": "add", "kind": kind, "nsid": nsid, "count": count,
               "probability": probability, "seed": seed}
        if lba is not None:
            msg["lba"] = [int(lba[0]), int(lba[1])]
        if key is not None:
            msg["key"] = bytes(key).hex()
        if kind == "latency":
            msg["latency_us"] = latency_us
            msg["directions"] = directions
        return self._request(msg)[0]["id"]

    def clear_faults(self, rule_id: int = 0) -> int:
        """Remove one fault rule, or every one (0) this client may see; how many went."""
        return self._request({"op": "fault", "action": "clear", "id": rule_id})[0]["cleared"]

    def faults(self) -> list[dict]:
        """The fault rules in force, with how many commands each has hit: an admin sees
        every rule, another owner its own."""
        return self._request({"op": "fault", "action": "list"})[0]["rules"]

    def surprise_removal(self, seconds: float = 0) -> None:
        """Pull the drive: every client (this one too) sees the device gone at once; new
        queue pairs are refused until `seconds` pass (0: until hostlib.reinsert).  Admin
        only."""
        self._request({"op": "fault", "action": "remove", "seconds": seconds})

    def power_cut(self, seed: int = 0) -> None:
        """Cut the drive's power (a daemon started with --power-cut): every client sees it
        gone; writes no completed flush covered may be lost (seeded); it powers on again.
        Admin only."""
        self._request({"op": "fault", "action": "power-cut", "seed": seed})
