"""Queue pairs and buffers a client registers with the daemon: shared memory it maps (memfds
sealed against shrinking: a client that could shrink one would fault the data plane), checked
against the uid's quotas, handed to the data plane; and given back."""

from __future__ import annotations

import fcntl
import mmap
import os

from ssdemu.device import _device
from ssdemu.device.quotas import Usage, refusal
from ssdemu.device.sessions import Buffer, Client, QueuePair, close_mapping

ffi, lib = _device.ffi, _device.lib


class Registration:
    """create_qp, register_buffer, unregister_buffer; what a uid holds (its usage)."""

    def __init__(self, daemon):
        self.d = daemon

    def create_qp(self, client: Client, msg: dict):
        entries = msg.get("entries")
        q = self.d.profile.queue
        if (not isinstance(entries, int) or entries < 2 or entries > q.max_entries
                or entries & (entries - 1)):
            return {"ok": False, "error": f"queue entries must be a power of two in "
                    f"2..{q.max_entries}"}, []
        why = refusal(self.d.quotas, client.uid, self.usage(client.uid), "queue_pairs")
        if why:
            return {"ok": False, "error": why}, []
        nbytes = lib.sde_qp_bytes(entries, entries)
        fd = os.memfd_create("ssdemu-qp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, nbytes)
        # sealed before the client gets it: a client that could shrink it would fault the
        # data plane (SIGBUS) and stop every other client
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED)
        addr = ffi.cast("void *", ffi.from_buffer(mm))
        cfd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        dfd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        lib.sde_qp_init(addr, entries, entries, 0)
        index = lib.sde_dev_add_qp(self.d.dev, addr, nbytes, client.cid, cfd, dfd, client.uid,
                                   client.token)
        if index < 0:
            mm.close()
            os.close(fd)
            os.close(cfd)
            os.close(dfd)
            return {"ok": False, "error": "the device has no free queue pair"}, []
        lib.sde_dev_set_qp_admin(self.d.dev, index, client.admin)  # may force a delete
        client.qps[index] = QueuePair(index, fd, mm, cfd, dfd)
        return ({"ok": True, "qid": index, "bytes": nbytes, "entries": entries},
                [fd, dfd, cfd])

    def register_buffer(self, client: Client, msg: dict, fds: list[int]):
        nbytes = msg.get("bytes")
        if len(fds) != 1 or not isinstance(nbytes, int) or nbytes <= 0:
            return {"ok": False, "error": "register_buffer takes one memfd and its size"}, []
        used = self.usage(client.uid)
        why = (refusal(self.d.quotas, client.uid, used, "buffers")
               or refusal(self.d.quotas, client.uid, used, "buffer_bytes", nbytes))
        if why:
            return {"ok": False, "error": why}, []
        fd = os.dup(fds[0])
        try:
            st = os.fstat(fd)
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError as e:
            os.close(fd)
            return {"ok": False, "error": f"buffer descriptor unusable: {e.strerror}"}, []
        # a buffer the client could shrink would fault the daemon: require the seal
        if not seals & fcntl.F_SEAL_SHRINK or st.st_size < nbytes or nbytes % mmap.PAGESIZE:
            os.close(fd)
            return {"ok": False, "error": "buffers must be memfds sealed against shrinking, "
                    "whole pages, at least as large as declared"}, []
        try:
            mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED)
        except OSError as e:
            # a memfd sealed against writes cannot be mapped shared and writable: refused,
            # and nothing of it kept (its descriptor would keep its memory alive)
            os.close(fd)
            return {"ok": False, "error": "buffers must be memfds the device can map shared "
                    f"and writable (not sealed against writes): {e.strerror}"}, []
        addr = ffi.cast("void *", ffi.from_buffer(mm))
        bounce = bool(msg.get("bounce"))
        handle = lib.sde_dev_add_buffer(self.d.dev, client.cid, addr, nbytes,
                                        lib.SDE_BUF_BOUNCE if bounce else 0)
        if handle < 0:
            mm.close()
            os.close(fd)
            return {"ok": False, "error": "the device has no free buffer slot"}, []
        client.buffers[handle] = Buffer(handle, fd, mm, nbytes, bounce)
        return {"ok": True, "handle": handle}, []

    def usage(self, uid: int) -> Usage:
        """What uid holds now, over all its connections (and namespaces on the media)."""
        u = Usage()
        for c in self.d.clients.values():
            if c.uid == uid:
                u.queue_pairs += len(c.qps)
                u.buffers += len(c.buffers)
                u.buffer_bytes += sum(b.nbytes for b in c.buffers.values())
        for ns in self.d.store.namespace_table().values():
            if ns.uid == uid:  # a shared namespace counts against its creator
                u.namespaces += 1
                u.namespace_bytes += ns.bytes
        return u

    def unregister_buffer(self, client: Client, handle: int):
        buf = client.buffers.get(handle)
        if buf is None:
            return {"ok": False, "error": "no such buffer"}, []
        if lib.sde_dev_client_inflight(self.d.dev, client.cid):
            return {"ok": False, "error": "commands are in flight: reap them first"}, []
        lib.sde_dev_remove_buffer(self.d.dev, handle)
        del client.buffers[handle]
        self.release_buffer(buf)
        return {"ok": True}, []

    def release_buffer(self, buf: Buffer) -> None:
        close_mapping(buf.mm)
        os.close(buf.fd)
