# ruff: noqa: UP006, UP035  (LMCache's interface has a method named list: typing.List keeps annotations clear)
"""An LMCache storage plug-in: LMCache keeps its KV chunks on an ssdemu drive, enabled by
LMCache's own configuration, with no code from the user:

    chunk_size: 256
    local_cpu: true
    max_local_cpu_size: 5
    remote_storage_plugins: ["ssdemu"]
    extra_config:
      remote_storage_plugin.ssdemu.module_path: hostlib.lmcache
      remote_storage_plugin.ssdemu.class_name: SsdemuConnectorAdapter
      remote_storage_plugin.ssdemu.socket: /run/ssdemu.sock
      remote_storage_plugin.ssdemu.quant: none     # or int8_g64, int4_g64, kivi4_g32_r128, ...
      remote_storage_plugin.ssdemu.queue_pairs: 4
      remote_storage_plugin.ssdemu.owner_key_file: ~/.config/ssdemu/lmcache.key  # default
      remote_storage_plugin.ssdemu.evict: lru      # default; none: a put fails when full

How it maps LMCache onto the drive:
- Each chunk is one value (up to the drive's max_value_bytes: 64 MiB on the shipped
  profiles; a 256-token chunk of Llama-3-8B is 32 MiB), under a 16-byte key: the BLAKE2b-128
  of LMCache's key string.  The full key string and the chunk's RemoteMetadata (shapes,
  dtypes, format, length) go in a second, small record in a names namespace, so that `list`
  returns LMCache's keys and partial chunks come back with their shapes.
- Both namespaces are keys-only namespaces of the owner whose key is in `owner_key_file`
  (default $XDG_CONFIG_HOME/ssdemu/lmcache.key, written with mode 0600 on first use; see
  hostlib.owner_key), found again after a restart (the two lowest keys-only namespaces it
  owns) or made on first use.
- Batched lookups are one PREFIX_MATCH command (the drive's index), not one exists each.
- The coroutines run on LMCache's event loop through hostlib.aio, spread over `queue_pairs`
  connections; LMCache's synchronous calls use a connection of their own under a lock.
- A full drive (CAPACITY_EXCEEDED: its data region or its index) evicts, as LMCache's own
  local-disk backend does, a chunk at a time (its name record first) until the put fits:
  first the chunks this engine has not put or retrieved (stored before it started, or by
  another engine: older than all it touched; found by walking the names namespace once),
  then its own, least recently put or retrieved first.  `evict: none` leaves the drive full
  and the put failing, which LMCache counts and logs.
- Bytes: LMCache's memory objects are not memory the daemon can map, so a chunk is copied
  once into a registered staging buffer (and out of one on a retrieve); from there the
  drive moves it with no copy.  With `quant` set, the drive's quantizer takes the chunk in
  LMCache's own layout ([2, layers, tokens, heads * head_dim]: the request's layout field,
  "2lt") and gives it back dequantized in that layout: no permuted copy on the host.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import struct
import threading
from collections import OrderedDict
from typing import List

import numpy as np
import torch
from lmcache.logging import init_logger
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector import (
    ConnectorAdapter,
    ConnectorContext,
    extract_plugin_type,
)
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

import hostlib
import hostlib.aio
from hostlib import owner_key
from hostlib.client import copy_bytes

logger = init_logger(__name__)

PLUGIN_TYPE = "ssdemu"
NAME_HEADER = struct.Struct("<I")  # metadata length, then metadata, then the key string
QUANT_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def default_key_file() -> str:
    """$XDG_CONFIG_HOME/ssdemu/lmcache.key (~/.config/ssdemu/lmcache.key)."""
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return os.path.join(config, "ssdemu", "lmcache.key")


def drive_key(key_string: str) -> bytes:
    return hashlib.blake2b(key_string.encode(), digest_size=16).digest()


def _setting(config, plugin_name: str, name: str, default=None):
    extra = (config.extra_config if config is not None else None) or {}
    return extra.get(f"remote_storage_plugin.{plugin_name}.{name}", default)


class SsdemuConnector(RemoteConnector):
    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend, config,
                 plugin_name: str = PLUGIN_TYPE):
        super().__init__(local_cpu_backend.config, local_cpu_backend.metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.socket = _setting(config, plugin_name, "socket")
        if not self.socket:
            raise ValueError(f"remote_storage_plugin.{plugin_name}.socket is not set: the "
                             "ssdemu daemon's socket path")
        self.quant = str(_setting(config, plugin_name, "quant", "none"))
        self.queue_pairs = max(1, int(_setting(config, plugin_name, "queue_pairs", 4)))
        self.evict = str(_setting(config, plugin_name, "evict", "lru"))
        if self.evict not in ("lru", "none"):
            raise ValueError(f"remote_storage_plugin.{plugin_name}.evict: {self.evict!r}, "
                             "expected lru or none")
        if _setting(config, plugin_name, "owner") is not None:
            raise ValueError(f"remote_storage_plugin.{plugin_name}.owner: an owner is a key "
                             "now, not a name: set owner_key_file (a file `ssdemu owner-key` "
                             "wrote)")
        self.owner_key_file = os.path.expanduser(str(_setting(
            config, plugin_name, "owner_key_file", default_key_file())))
        if not os.path.exists(self.owner_key_file):
            try:
                owner_key.new(self.owner_key_file)
            except owner_key.OwnerKeyError:
                pass  # another engine made it meanwhile: load it below
        self.owner_key = owner_key.load(self.owner_key_file)
        # this engine's chunks (LMCache's key strings), least recently put or retrieved first
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._touched: set[bytes] = set()  # the name records' keys of those and _in_put's
        self._in_put: dict[str, int] = {}  # chunks being put: how many puts of each
        self._recent_lock = threading.Lock()  # remove_sync comes from other threads
        self._walk: bytes | None = b""  # where the walk for untouched chunks goes on
        self.evictions = 0
        # synchronous calls (exists_sync, remove_sync, batched_contains) come from other
        # threads: one connection, one at a time
        self._sync = hostlib.connect(self.socket, owner_key=self.owner_key)
        self._sync_lock = threading.Lock()
        self.data_ns, self.names_ns = self._namespaces(self._sync)
        self.max_value = self._sync.identify()["max_value_bytes"]
        self._aio: list[hostlib.aio.AsyncDevice] = []
        self._aio_lock: asyncio.Lock | None = None
        self._turn = itertools.count()
        if self.quant != "none":
            if self.meta_fmt != MemoryFormat.KV_2LTD or len(self.meta_shapes) != 1:
                raise ValueError("quant needs LMCache's KV_2LTD format with one layer group")
            self.quant_dtype = QUANT_DTYPES.get(self.meta_dtypes[0])
            if self.quant_dtype is None:
                raise ValueError(f"quant cannot take {self.meta_dtypes[0]}")
            # (layers, 2, chunk, kv_heads, head_dim): LMCache's kv_shape
            self.head_dim = int(local_cpu_backend.metadata.kv_shape[4])
        logger.info("ssdemu connector on %s: namespaces %d (data) and %d (names), quant %s, "
                    "%d queue pairs", self.socket, self.data_ns, self.names_ns, self.quant,
                    self.queue_pairs)

    # -- set-up --
    @staticmethod
    def _namespaces(dev) -> tuple[int, int]:
        mine = sorted(n["nsid"] for n in dev.namespaces() if n["bytes"] == 0
                      and not n["shared"])
        while len(mine) < 2:
            mine.append(dev.ns_create(0))
        return mine[0], mine[1]

    async def _dev(self) -> hostlib.aio.AsyncDevice:
        """A connection on LMCache's loop, round robin (made on first use, on this loop)."""
        if len(self._aio) < self.queue_pairs:
            if self._aio_lock is None:
                self._aio_lock = asyncio.Lock()
            async with self._aio_lock:
                while len(self._aio) < self.queue_pairs:
                    self._aio.append(await hostlib.aio.connect(self.socket,
                                                               owner_key=self.owner_key))
        return self._aio[next(self._turn) % len(self._aio)]

    @staticmethod
    def _take(dev: hostlib.aio.AsyncDevice, nbytes: int) -> np.ndarray:
        """A registered staging buffer of that connection (its Device keeps them: the daemon
        refuses to unregister one while the connection has commands in flight, and
        registering is a control request), one per command in flight at most."""
        return dev.dev.staging_take(nbytes)

    @staticmethod
    def _give(dev: hostlib.aio.AsyncDevice, buf: np.ndarray) -> None:
        dev.dev.staging_give(buf)

    def _give_when_done(self, dev: hostlib.aio.AsyncDevice, buf: np.ndarray,
                        task: asyncio.Future | None) -> None:
        """The staging buffer back to the pool once the commands using it are done: at
        once, or (its caller cancelled while the drive still reads or fills it) when the
        shielded task finishes, so that no other chunk is staged in it meanwhile."""
        if task is None or task.done():
            self._give(dev, buf)
            return

        def done(t: asyncio.Future) -> None:
            if not t.cancelled():
                t.exception()  # retrieved: the caller that wanted it is gone
            self._give(dev, buf)

        task.add_done_callback(done)

    async def _read_name(self, dev: hostlib.aio.AsyncDevice, k: str) -> bytes | None:
        """A chunk's name record (small: read into a share of its own, never the whole
        bounce buffer), or None."""
        try:
            return await dev.kv_get(drive_key("name:" + k), nsid=self.names_ns)
        except hostlib.KeyNotFoundError:
            return None

    # -- records --
    def _name_record(self, key: CacheEngineKey, meta: bytes) -> bytes:
        return NAME_HEADER.pack(len(meta)) + meta + key.to_string().encode()

    # -- eviction: chunks this engine has not touched first, then its own, least recent first --
    def _mark(self, k: str) -> None:
        """k's name record is a touched one's while k is in _recent or being put (the caller
        holds _recent_lock): the walk for untouched chunks skips it."""
        name = drive_key("name:" + k)
        if k in self._recent or k in self._in_put:
            self._touched.add(name)
        else:
            self._touched.discard(name)

    def _touch(self, k: str) -> None:
        with self._recent_lock:
            self._recent[k] = None
            self._recent.move_to_end(k)
            self._mark(k)

    def _putting(self, k: str, delta: int) -> None:
        """A put of k begins (+1) or ends (-1): while one runs, k is never evicted."""
        with self._recent_lock:
            n = self._in_put.get(k, 0) + delta
            if n:
                self._in_put[k] = n
            else:
                self._in_put.pop(k, None)
            self._mark(k)

    def _forget(self, k: str) -> None:
        with self._recent_lock:
            self._recent.pop(k, None)
            self._mark(k)

    async def _stored(self, dev: hostlib.aio.AsyncDevice, k: str, put) -> None:
        """await put(), evicting a chunk at a time while the drive is full (and something is
        left to evict)."""
        while True:
            try:
                return await put()
            except hostlib.CapacityError:
                if self.evict == "none" or not await self._evict_one(dev, k):
                    raise

    async def _untouched(self, dev: hostlib.aio.AsyncDevice, keep: str) -> str | None:
        """The next chunk in the names namespace this engine has not put or retrieved (older
        than all it has: stored before it started, or by another engine), or None once the
        namespace has been walked to its end (the walk resumes where it stopped)."""
        skip = drive_key("name:" + keep)
        while self._walk is not None:
            with self._sync_lock:
                page = [n for n in self._sync.kv_list(self._walk, 64, nsid=self.names_ns)
                        if n != self._walk]
            if not page:
                self._walk = None
                break
            for name in page:
                self._walk = name
                with self._recent_lock:
                    if name in self._touched or name == skip:
                        continue
                try:
                    return self._parse_name(await dev.kv_get(name, nsid=self.names_ns))[1]
                except hostlib.KeyNotFoundError:
                    continue  # evicted or removed meanwhile
        return None

    async def _evict_one(self, dev: hostlib.aio.AsyncDevice, keep: str) -> bool:
        """Evict one chunk, never `keep`.  Whether one went."""
        victim = await self._untouched(dev, keep)
        if victim is None:
            with self._recent_lock:
                victim = next((k for k in self._recent if k != keep and k not in self._in_put),
                              None)
        if victim is None:
            return False
        self._forget(victim)
        deleted = 0
        for key, nsid in ((drive_key("name:" + victim), self.names_ns),  # never listed
                          (drive_key(victim), self.data_ns)):             # without its value
            try:
                await dev.kv_delete(key, nsid=nsid)
                deleted += 1
            except hostlib.KeyNotFoundError:
                pass  # gone already (another put's eviction of it, a remove): room all the same
        if deleted:
            self.evictions += 1
            logger.debug("drive full: %s evicted (%d in all)", victim, self.evictions)
        return True

    @staticmethod
    def _parse_name(record: bytes) -> tuple[bytes, str]:
        (n,) = NAME_HEADER.unpack_from(record)
        return record[4:4 + n], record[4 + n:].decode()

    # -- LMCache's RemoteConnector --
    async def exists(self, key: CacheEngineKey) -> bool:
        dev = await self._dev()
        return await dev.kv_exists(drive_key(key.to_string()), nsid=self.data_ns)

    def exists_sync(self, key: CacheEngineKey) -> bool:
        with self._sync_lock:
            return self._sync.kv_exists(drive_key(key.to_string()), nsid=self.data_ns)

    async def put(self, key: CacheEngineKey, memory_obj) -> None:
        dev = await self._dev()
        k = key.to_string()
        src = memory_obj.byte_array
        meta = RemoteMetadata(len(src), memory_obj.get_shapes(), memory_obj.get_dtypes(),
                              memory_obj.get_memory_format()).serialize()
        stage = self._take(dev, max(len(src), 1))
        task = None
        try:
            if self.quant == "none":
                copy_bytes(stage[:len(src)], np.frombuffer(src, np.uint8))
            else:
                block = self._to_block(memory_obj, stage)

            async def store() -> None:
                if self.quant == "none":
                    await self._stored(dev, k, lambda: dev.kv_put(
                        drive_key(k), stage[:len(src)], nsid=self.data_ns))
                else:
                    await self._stored(dev, k, lambda: dev.kv_put_quantized(
                        drive_key(k), block, self.quant_dtype, self.quant,
                        nsid=self.data_ns, layout="2lt"))
                # the name record last: a key is listed only once its value is stored
                await self._stored(dev, k, lambda: dev.kv_put(
                    drive_key("name:" + k), self._name_record(key, meta), nsid=self.names_ns))
                self._touch(k)

            # shielded: a put whose caller is cancelled still stores both records (never a
            # value without its name), and holds its staging buffer until then
            self._putting(k, +1)
            task = asyncio.ensure_future(store())
            task.add_done_callback(lambda _: self._putting(k, -1))
            await asyncio.shield(task)
        finally:
            self._give_when_done(dev, stage, task)

    async def get(self, key: CacheEngineKey):
        """The chunk, or None.  Cancelled (LMCache's blocking timeout cancels): the memory
        object is released at once, the staging buffer once the drive's command is done."""
        dev = await self._dev()
        k = key.to_string()
        record = await self._read_name(dev, k)
        if record is None:
            return None
        meta = RemoteMetadata.deserialize(self._parse_name(record)[0])
        memory_obj = self.local_cpu_backend.allocate(meta.shapes, meta.dtypes, meta.fmt)
        if memory_obj is None:
            logger.debug("no memory for a retrieve")
            return None
        stage = self._take(dev, max(meta.length, 1))
        task = None
        try:
            if self.quant == "none":
                task = asyncio.ensure_future(dev.kv_get(drive_key(k), stage,
                                                        nsid=self.data_ns))
                n = await asyncio.shield(task)
                if n != meta.length:
                    raise ValueError(f"{k}: {n} bytes stored, {meta.length} expected")
                copy_bytes(np.frombuffer(memory_obj.byte_array, np.uint8, meta.length),
                           stage[:n])
            else:
                block = self._block_view(meta, stage)
                task = asyncio.ensure_future(dev.kv_get_dequantized(drive_key(k), block,
                                                                    nsid=self.data_ns))
                await asyncio.shield(task)
                self._from_block(block, memory_obj)
            self._touch(k)
            return memory_obj
        except hostlib.KeyNotFoundError:
            memory_obj.ref_count_down()
            return None
        except BaseException:  # CancelledError too: the object is no one's then
            memory_obj.ref_count_down()
            raise
        finally:
            self._give_when_done(dev, stage, task)

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: List[CacheEngineKey]) -> List:
        """Every chunk at once (the drive's queues take them concurrently): what LMCache's
        batched_get_blocking calls, as one future it can time out and cancel whole."""
        results = await asyncio.gather(*(self.get(k) for k in keys), return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:  # the caller gets none of them: give back the ones it got
            for r in results:
                if r is not None and not isinstance(r, BaseException):
                    r.ref_count_down()
            raise failed
        return results

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey],
                                     pin: bool = False) -> int:
        """The leading run of keys the drive holds: one PREFIX_MATCH command."""
        if not keys:
            return 0
        dev = await self._dev()
        return await dev.prefix_match([drive_key(k.to_string()) for k in keys],
                                      nsid=self.data_ns)

    def batched_contains(self, keys: List[CacheEngineKey]) -> int:
        if not keys:
            return 0
        with self._sync_lock:
            return self._sync.prefix_match([drive_key(k.to_string()) for k in keys],
                                           nsid=self.data_ns)

    def support_batched_contains(self) -> bool:
        return True

    def remove_sync(self, key: CacheEngineKey) -> bool:
        k = key.to_string()
        self._forget(k)
        with self._sync_lock:
            try:
                self._sync.kv_delete(drive_key("name:" + k), nsid=self.names_ns)
                self._sync.kv_delete(drive_key(k), nsid=self.data_ns)
                return True
            except hostlib.DeviceError:
                return False

    async def list(self) -> List[str]:
        dev = await self._dev()
        out = []
        start = b""
        while True:
            with self._sync_lock:
                keys = self._sync.kv_list(start, 4096, nsid=self.names_ns)
            page = [k for k in keys if k != start]
            if not page:
                return out
            for k in page:
                out.append(self._parse_name(await dev.kv_get(k, nsid=self.names_ns))[1])
            start = page[-1]

    async def close(self) -> None:
        for dev in self._aio:
            await dev.close()
        self._aio = []
        with self._sync_lock:
            self._sync.close()

    # -- the drive's quantizer works on (tokens, 2, layers, heads, head_dim) blocks --
    def _block_view(self, meta: RemoteMetadata, stage: np.ndarray) -> np.ndarray:
        """The staging buffer as the block the drive quantizes: LMCache's own (2, layers,
        tokens, heads, head_dim), the request's layout 2lt."""
        two, layers, tokens, hidden = meta.shapes[0]
        carrier = np.float32 if self.quant_dtype == "fp32" else np.uint16
        n = tokens * 2 * layers * hidden * np.dtype(carrier).itemsize
        return stage[:n].view(carrier).reshape(two, layers, tokens, hidden // self.head_dim,
                                               self.head_dim)

    def _lmcache_view(self, memory_obj) -> np.ndarray:
        """LMCache's chunk, (2, layers, tokens, heads, head_dim), as the carrier's bits."""
        t = memory_obj.tensor
        bits = t.view(torch.int16) if t.element_size() == 2 else t
        two, layers, tokens, hidden = t.shape
        return bits.numpy().reshape(two, layers, tokens, hidden // self.head_dim,
                                    self.head_dim)

    def _to_block(self, memory_obj, stage: np.ndarray) -> np.ndarray:
        t = memory_obj.tensor
        block = self._block_view(RemoteMetadata(0, [t.shape], [t.dtype], MemoryFormat.KV_2LTD),
                                 stage)
        copy_bytes(block, self._lmcache_view(memory_obj).view(block.dtype))  # the one copy
        return block

    def _from_block(self, block: np.ndarray, memory_obj) -> None:
        dst = self._lmcache_view(memory_obj)
        copy_bytes(dst, block.view(dst.dtype))


class SsdemuConnectorAdapter(ConnectorAdapter):
    """What LMCache's remote_storage_plugins loads (module_path hostlib.lmcache)."""

    def __init__(self) -> None:
        super().__init__("ssdemu://")

    def can_parse(self, url: str) -> bool:
        if url.startswith(self.schema):
            return True
        return url.startswith("plugin://") and \
            extract_plugin_type(url[len("plugin://"):]) == PLUGIN_TYPE

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        return SsdemuConnector(context.loop, context.local_cpu_backend, context.config,
                               plugin_name=context.plugin_name or PLUGIN_TYPE)

