"""Fault injection, surprise removal and power cuts: the rules an owner adds (ssdemu/device/
faults.py holds their format) and who may see and clear them; the drive pulled and put back;
power lost (the volatile cache's unflushed writes undone, seeded) and the daemon powered on
again in the same process (exec)."""

from __future__ import annotations

import errno
import logging
import math
import os
import sys
import time
from typing import NoReturn

from ssdemu.device import _device, faults
from ssdemu.device.sessions import Client

ffi, lib = _device.ffi, _device.lib
log = logging.getLogger("ssdemu.serve")


class FaultsAndPower:
    """The daemon's fault rules and their owners, and the removal or cut asked for (done by
    after_replies once the request's reply is sent)."""

    def __init__(self, daemon):
        self.d = daemon
        self.fault_owner: dict[int, tuple[int, int]] = {}  # rule id -> who added it
        self.removed_until: float | None = None  # a surprise removal: until then (inf: reinsert)
        self._remove_now = False
        self._cut_seed: int | None = None  # a power cut asked for: done after its reply

    def after_replies(self) -> None:
        """What the select loop does after a round of replies: a power cut or a removal asked
        for, or the end of a timed removal."""
        if self._cut_seed is not None:
            self.power_cut(self._cut_seed)
        if self._remove_now:
            self.surprise_removal()
        elif self.removed_until is not None and time.monotonic() >= self.removed_until:
            self.removed_until = None
            log.warning("the device is back after its injected removal")

    def request(self, client: Client, msg: dict) -> dict:
        """An admin may do anything here; any other owner may add rules on namespaces of its
        own, and see and clear only the rules it added (docs/threat-model.md)."""
        action = msg.get("action")
        if action in ("remove", "reinsert", "power-cut") and not client.admin:
            return {"ok": False, "error": f"fault {action} is an admin's (the holder of the "
                    "daemon's --admin-key; without one, the daemon's uid and root)"}
        try:
            if action == "add":
                rule, seed = faults.rule_from_request(msg)
                if not client.admin and not self.owns(client, rule):
                    return {"ok": False, "error": "an owner may inject faults only into a "
                            "namespace of its own (nsid of one it created, not shared); "
                            "device-wide rules are an admin's"}
                fid = lib.sde_dev_fault_add(self.d.dev, rule, seed)
                if fid < 0:
                    return {"ok": False, "error": "the device holds at most "
                            f"{lib.SDE_FAULT_MAX} fault rules" if fid == -errno.ENOSPC
                            else "the fault rule is not valid"}
                self.fault_owner[fid] = (client.uid, client.token)
                log.warning("fault %d injected by uid %d: %s", fid, client.uid,
                            faults.describe(msg))
                return {"ok": True, "id": fid}
            if action == "clear":
                rid = msg.get("id", 0)
                if isinstance(rid, bool) or not isinstance(rid, int) or rid < 0:
                    return {"ok": False, "error": "id is a rule's id, or 0 for all"}
                mine = [r["id"] for r in self.rules(client)]
                if rid and rid not in mine:
                    return {"ok": True, "cleared": 0}  # another's is as if it did not exist
                n = sum(self.clear(r) for r in ([rid] if rid else mine))
                return {"ok": True, "cleared": n}
            if action == "list":
                return {"ok": True, "rules": self.rules(client)}
            if action == "remove":
                seconds = faults.finite_number(msg.get("seconds", 0), "seconds")
                self.removed_until = (time.monotonic() + seconds) if seconds > 0 else math.inf
                self._remove_now = True  # after this reply is sent
                return {"ok": True}
            if action == "power-cut":
                if not self.d.power_cut:
                    return {"ok": False, "error": "power cuts need the daemon started with "
                            "--power-cut"}
                seed = msg.get("seed", 0)
                if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
                    return {"ok": False, "error": "seed must be an integer in 0..2^64-1"}
                self._cut_seed = seed  # after this reply is sent
                return {"ok": True}
            if action == "reinsert":
                was = self.removed_until is not None
                self.removed_until = None
                if was:
                    log.warning("the device is back (reinserted)")
                return {"ok": True, "was_removed": was}
        except faults.FaultError as e:
            return {"ok": False, "error": str(e)}
        return {"ok": False, "error": f"unknown fault action {action!r} (add, clear, list, "
                "remove, reinsert, power-cut)"}

    def owns(self, client: Client, rule) -> bool:
        """Whether the rule touches only a namespace the client's owner created privately."""
        if rule.all_ns or rule.nsid == 0:
            return False
        ns = self.d.store.namespace_table().get(int(rule.nsid))
        return (ns is not None and not ns.flags & lib.SDE_NS_SHARED
                and (ns.uid, ns.token) == (client.uid, client.token))

    def rules(self, client: Client | None) -> list[dict]:
        """The rules in force that the client may see (None: every one)."""
        table = ffi.new("sde_faults *")
        lib.sde_dev_faults(self.d.dev, table)
        rules = [faults.rule_to_dict(table.rules[i]) for i in range(table.n)]
        live = {r["id"] for r in rules}
        self.fault_owner = {k: v for k, v in self.fault_owner.items() if k in live}
        if client is None or client.admin:
            return rules
        me = (client.uid, client.token)
        return [r for r in rules if self.fault_owner.get(r["id"]) == me]

    def clear(self, rid: int) -> int:
        self.fault_owner.pop(rid, None)
        return lib.sde_dev_fault_clear(self.d.dev, rid)

    def removal_left(self) -> str:
        if self.removed_until == math.inf:
            return "it returns at 'ssdemu ctl fault reinsert'"
        return f"it returns in {max(0.0, self.removed_until - time.monotonic()):.1f} s"

    def power_cut(self, seed: int) -> None:
        """As if power were lost: the queues die, the data plane stops where it is, the
        writes the volatile cache had not made durable are undone as a real cut could lose
        them (c/dev/sde_undo.h, seeded), and the daemon starts again on the same media and socket
        as the drive would at power-on (same process: exec)."""
        log.warning("power cut injected (seed %d): %d clients cut off", seed, len(self.d.clients))
        lib.sde_dev_shutdown_qps(self.d.dev)
        self.d._stop_flag[0] = 1
        os.eventfd_write(lib.sde_dev_doorbell_fd(self.d.dev), 1)
        if self.d.data_plane:
            self.d.data_plane.join(timeout=10)
        res = ffi.new("sde_cut_result *")
        r = lib.sde_dev_power_cut(self.d.dev, seed, res)
        if r < 0:
            log.error("the power cut could not undo the lost writes: %s", os.strerror(-r))
        log.warning("power cut: block writes kept %d lost %d, store writes kept %d lost %d, "
                    "%d bytes put back; powering on again", res.block_writes_kept,
                    res.block_writes_lost, res.store_writes_kept, res.store_writes_lost,
                    res.bytes_restored)
        for handler in logging.getLogger().handlers:
            handler.flush()
        argv = [a for a in sys.argv[1:] if a != "--format"]  # power-on keeps the contents
        python = sys.executable
        if not os.access(python, os.X_OK):  # say so while the log and the socket are ours
            self.power_on_failed(f"cannot execute {python}")
        os.closerange(3, 65536)  # the old process's rings, memfds and sockets go with it
        try:
            os.execv(python, [python, "-m", "ssdemu", *argv])
        except OSError as e:
            self.power_on_failed(f"cannot execute {python}: {e.strerror}")

    def power_on_failed(self, why: str) -> NoReturn:
        """The re-exec that powers the drive on again cannot happen: one line saying why, our
        socket removed (a client must not wait on a drive that is gone), exit 1.  The media
        holds what the cut left; a daemon started on it again recovers it."""
        self.d.remove_socket()
        msg = (f"ssdemu: error: power-on after the injected power cut failed: {why}; the "
               f"media holds what the cut left: start the daemon on it again")
        log.error("%s", msg)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.write(2, (msg + "\n").encode())
        os._exit(1)  # the data plane is stopped and its fds may be gone: nothing to free

    def surprise_removal(self) -> None:
        """As if the drive were pulled: every queue dies at once (clients waiting are woken
        and see the device gone), every connection is closed; what was acknowledged stays."""
        self._remove_now = False
        log.warning("surprise removal injected: %d clients cut off; %s", len(self.d.clients),
                    self.removal_left())
        lib.sde_dev_shutdown_qps(self.d.dev)
        self.d.retrieval.close()  # its last commands complete before the queues go
        for client in list(self.d.clients.values()):
            self.d.sessions.drop_client(client)
