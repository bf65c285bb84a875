"""hostlib for asyncio: the same calls as the synchronous API, as coroutines.

    dev = await hostlib.aio.connect("/run/ssdemu.sock")
    await dev.kv_put(b"key", b"value")
    value = await dev.kv_get(b"key")

Every queue command of hostlib.Device is here, awaited (made from its one definition,
hostlib/commands.py), with the same arguments and result.  Commands go into the queue pair
as the synchronous API puts them there; completions arrive
through the queue pair's completion eventfd, watched by the event loop (`loop.add_reader`):
the daemon is asked to signal it for every completion while commands are outstanding, no
thread per command, no polling.  One AsyncDevice belongs to one event loop and its thread.
A command that needs room the queue pair does not have (every entry in flight; for block
I/O, its bounce buffer full) waits for completions in place, briefly holding the loop: give
a device that many tasks share a deep queue (`entries`).  KV values not in `alloc` buffers
never wait for room: they go through pooled staging buffers when the bounce is taken.

Cancelling a task awaiting a command does not stop the command: a buffer it reads or
fills stays the device's until it completes (`Device.staging_give` only then, as
hostlib.lmcache does with a shielded task)."""

from __future__ import annotations

import asyncio
import os
import socket

import numpy as np

from hostlib.client import Device, Future
from hostlib.client import connect as _connect
from hostlib.commands import derive_awaited
from hostlib.errors import DeviceGoneError
from ssdemu_wire import _ring
from ssdemu_wire.layout import RING_HDR_DTYPE

lib = _ring.lib


class AsyncDevice:
    def __init__(self, dev: Device, loop: asyncio.AbstractEventLoop):
        self.dev = dev
        self.loop = loop
        self.qp = dev.qp
        self._waiting: set[tuple[Future, asyncio.Future]] = set()
        self._armed = False
        self._closed = False
        loop.add_reader(self.qp.completion_fd, self._on_completions)
        # the daemon gone: the control socket hangs up
        loop.add_reader(dev.sock.fileno(), self._on_control)

    # -- completions --
    def _arm(self, on: bool) -> None:
        if on != self._armed:
            self._armed = on
            if lib.sde_cq_arm(self.qp.mem, int(on)) > 0 and on:
                self.loop.call_soon(self._on_completions)

    def _on_completions(self) -> None:
        try:
            os.eventfd_read(self.qp.completion_fd)
        except BlockingIOError:
            pass
        try:
            self.qp.poll()  # completes futures: each one's release settles its awaiter
        except DeviceGoneError as e:
            self._fail_all(e)
            return
        if self._dead():
            self._fail_all(DeviceGoneError("the device shut down or dropped this queue"))

    def _dead(self) -> bool:
        hdr = np.frombuffer(self.qp.mm, RING_HDR_DTYPE, 1)[0]
        return bool(hdr["sq_flags"] & lib.SDE_SQF_DEAD)

    def _on_control(self) -> None:
        # a reply to a control request is read by that request; here only a hang-up counts
        try:
            data = self.dev.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.loop.remove_reader(self.dev.sock.fileno())
            self._fail_all(DeviceGoneError("the daemon closed the connection"))

    def _settle(self, f: Future, af: asyncio.Future) -> None:
        """f completed (whoever reaped it: this loop's reader, or a wait for room inside
        a submission): its awaiter gets the result or the command's own error."""
        self._waiting.discard((f, af))
        if not af.done():
            try:
                af.set_result(f.result())
            except Exception as e:
                af.set_exception(e)
        if not self._waiting:
            self._arm(False)

    def _fail_all(self, err: Exception) -> None:
        for f, af in list(self._waiting):
            if not af.done():
                af.set_exception(DeviceGoneError(f"{f.what}: {err}"))
        self._waiting.clear()

    def _await(self, f: Future) -> asyncio.Future:
        af = self.loop.create_future()
        self._waiting.add((f, af))
        if f.finished:  # completed while it was being submitted (the queue was full)
            self._settle(f, af)
            return af
        prev = f.release

        def done():
            if prev is not None:
                prev()
            try:
                here = asyncio.get_running_loop() is self.loop
            except RuntimeError:  # a thread of the connection's blocking calls reaped it
                here = False
            if here:
                self._settle(f, af)
            else:  # an asyncio future is the loop's own: settled there, and the loop woken
                self.loop.call_soon_threadsafe(self._settle, f, af)

        f.release = done  # called by Future._complete, whoever polls the queue
        self._arm(True)
        return af

    # -- the calls: every queue command of hostlib.Device, awaited, and its control-plane
    # requests run in place; made from their one definition (hostlib/commands.py, at the
    # end of this module) --

    # -- buffers (short control-plane requests, run in place) --
    def alloc(self, nbytes: int) -> np.ndarray:
        return self.dev.alloc(nbytes)

    def free(self, arr: np.ndarray) -> None:
        self.dev.free(arr)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fail_all(DeviceGoneError("the device was closed"))
        self.loop.remove_reader(self.qp.completion_fd)
        self.loop.remove_reader(self.dev.sock.fileno())
        self.dev.close()

    async def __aenter__(self) -> AsyncDevice:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


derive_awaited(AsyncDevice, Device)


async def connect(socket_path: str, entries: int = 1024, timeout: float = 5.0, *,
                  owner_key: str | bytes | None = None,
                  owner_key_file: str | None = None) -> AsyncDevice:
    """Connect on the running event loop (the handshake itself is a few short requests);
    the owner key as in hostlib.connect."""
    dev = _connect(socket_path, entries, timeout, owner_key=owner_key,
                   owner_key_file=owner_key_file)
    return AsyncDevice(dev, asyncio.get_running_loop())
