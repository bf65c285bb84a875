"""TOPK_PAGES and ATTEND: query-aware retrieval over a sequence's KV blocks as the drive stores
them (c/wire/sde_queue.h says the wire form).

The data plane queues these two opcodes for the daemon's worker threads (its opcode table
routes them to dev_retrieval_start; a worker waits on the queue's eventfd and pops them
itself), which run them (as many as the firmware's threads, taken fairly between uids and
their clients: fair_queue.py), so that the control plane's own loop (hello, buffers, admin)
never waits for one, nor one client's long command another's: read the
blocks through the store (real reads of the media), summarize, score, select and attend
with the firmware's kernels (firmware/retrieval.py, compiled, nogil), write the result into
the client's registered buffer, and complete the command at its modelled time.

Summaries: per block, layer and page size, the per-channel min and max of each KV head's
keys.  A block stored with its layout (KV_STORE_QUANTIZED with a summary page, any scheme,
`plain` included) carries them after its body: the firmware made them as it stored the
block (firmware/summaries.py), so they are part of the stored value, under the store's
journal and crash rules and counted in its bytes, and a layer's run of them is read from
NAND (its own bytes, not the block's).  Any other block (a plain KV_STORE, or summaries of
another page size) is read and summarized when first scored.  Either way they are then kept
in the controller's DRAM (an LRU of the profile's retrieval.summary_dram_bytes), keyed by the
value's place on the media, so a rewritten or deleted value's summaries are never used.
That DRAM is modelled (which summaries it holds, and so which reads a command books); the
arrays themselves live in this host's bounded cache of decoded data (DECODED_BYTES).

Bounds (c/wire/sde_queue.h SDE_RETRIEVAL_MAX_*): a command's keys, the summary elements it
scores, the key and value elements it reads and its result are bounded; past them it ends
with RETRIEVAL_LIMIT (the pages are counted as the blocks are scored, so the work stops at
the bound).  A command's memory is its summaries as float32 and the pages it reads.

Timing (ssdemu.sim.cost and the timing model, as the drive would run it, the drive otherwise
idle): the request over the link; each block's summaries from DRAM, or their stored run from
NAND, or the block from NAND and the summarize kernel;
score and top-k per KV head on the TOPS budget; the re-rank's and attention's pages read from
NAND; the result back over the link.  The firmware lays a stored block out by head (format
version 2, firmware/blockfmt.py: plain and integer schemes), so the re-rank reads only its
candidates' keys of the request's layer and head, ATTEND its pages' keys and values, as
ssdemu/sim/retrieval.py models a drive built for this; a block stored token by token (a
plain KV_STORE, fp8, KIVI, `serve --kv-layout token`, version 1) costs a page's whole token
rows: every layer and head.
"""

from __future__ import annotations

import collections
import hashlib
import importlib
import logging
import math
import os
import struct
import threading
import time
from dataclasses import dataclass

import numpy as np

from firmware.layout import (
    DTYPE_BF16,
    DTYPE_CODES,
    DTYPE_FP16,
    DTYPE_FP32,
    ELEMENT_BYTES,
    storage_dtype,
)
from ssdemu.device._device import ffi as _device_ffi
from ssdemu.device._device import lib as _device_lib
from ssdemu.device.fair_queue import FairQueue
from ssdemu.device.latency import bucket_values_ns, new_histogram, percentiles_us
from ssdemu.device.store import CorruptValue, KeyBatch, KeyNotFound
from ssdemu.sim.cost import (
    attend_cost,
    rerank_cost,
    score_cost,
    selective_score_cost,
    summarize_cost,
    summary_bytes,
    topk_cost,
)
from ssdemu.sim.timing import DeviceModel, budget_of, join_runs, model_params
from ssdemu_wire.layout import (
    OPCODES,
    REQUEST_DTYPE,
    RETRIEVAL_INT8,
    RETRIEVAL_MAGIC,
    RETRIEVAL_MAX_SCORED,
    SQE_DTYPE,
    STATUS,
    retrieval_over_limit,
)

log = logging.getLogger("ssdemu.retrieval")
SQE_FIELDS = SQE_DTYPE.names  # a command's fields, copied from the data plane's queue


class _Firmware:
    """A firmware module imported on first use: the retrieval worker's first command loads
    the compiled kernels, so that a daemon that serves none never imports Numba."""

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attr):  # only for names not yet looked up: kept once found
        if self._module is None:
            self._module = importlib.import_module(self._name)
        value = getattr(self._module, attr)
        setattr(self, attr, value)
        return value


R = _Firmware("firmware.retrieval")
_blockfmt = _Firmware("firmware.blockfmt")
_convert = _Firmware("firmware.convert")
_quant = _Firmware("firmware.quant")
BLOCK_MAGIC = b"SDKV"  # firmware/blockfmt.py's MAGIC (tests/test_constants.py)

# bounds on a request's shape (the work, memory and result bounds are the wire format's:
# ssdemu_wire.layout RETRIEVAL_MAX_*, checked by retrieval_over_limit and while scoring)
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_RERANK = 64
KEY_BYTES = 16
# decoded blocks one command keeps so as not to read and decode a block twice (the host's
# memory, not the drive's: the modelled time charges each page read once either way).  With
# FILL_BYTES below, a request's memory: at 16 MiB bench fairness's "memory" hog grew the
# daemon by 64.3 MiB in its first command, at 8 MiB by 59.2
MEMO_BYTES = 8 << 20
# blocks' layers decoded once and kept across commands, in this host's memory, not the
# drive's: a decode step asks for the same blocks layer after layer, and reading and decoding
# each whole block for each layer's command was most of the worker's wall time (2K tokens of
# SmolLM2: 25 ms a call against 3 ms modelled).  Keyed by the value's identity (place, length,
# content hash), so a rewritten or deleted value is never served; the modelled time books
# every read a command makes either way, and the stored value's checksum was verified when
# it was read.
# a sequence's layers are kept whole (Retrieval._seq_kv) when they fit in it.  The default;
# serve --retrieval-host-bytes sets it (Retrieval.decoded_bytes)
DECODED_BYTES = 128 << 20  # SmolLM2 (30 layers x 3 KV heads x 64): 94 MiB at 4K tokens
# what one command may add to that cache, its entries' own bytes counted: past it, what the
# command decodes serves it and is dropped, so that one request cannot take the whole cache's
# worth of this host's memory (issue 57: <= 64 MiB a request; bench fairness's "memory" hog,
# a sequence of 16,384 blocks of 8 KiB that the cache keeps whole, grew the daemon by 189 MiB
# in one command).  A sequence's layers larger than this are kept over several commands, as
# a decode step's next layers ask for them (_seq_kv)
FILL_BYTES = 16 << 20
# the host's own bytes of a decoded-cache entry (its key, its value's tuple, the LRU's slot,
# most often two small arrays' headers): 738 and 774 B measured (tracemalloc, Python 3.11)
# for a block's layer and for its summaries; 256 had counted 16,384 blocks' 3 entries of
# bench fairness's keys hog as 36 MiB that took 64
ENTRY_BYTES = 768

# a streamed sequence's summaries are scored a part of its blocks at a time, this share of
# the decoded cache's bytes of float32 bounds a part (_seq_bounds: 4 MiB at the default;
# bench fairness's worst cases held 32 MiB whole)
STREAM_SHARE = 32
# a sequence's float32 bounds are kept whole when they take at most this share of it (16 MiB
# at the default: 2K pages of Llama-3-8B's 8 KV heads x 128 channels, 32K tokens at 16 a page)
WHOLE_SHARE = 8


# the workers' nice value: the data plane's thread (and the clients on this host) go first
# when the cores are short; with two cores and a worker busy on a long command, a NOP's p99
# rose 3-7x at nice 0
WORKER_NICE = 10


# a command's loops over its blocks let the GIL go every YIELD_EVERY blocks, so that another
# worker's command gets it between (bench fairness, beside a TOPK over 16,384 blocks: another
# client's one-block TOPK p99 14-17 ms without, 7.3-8.1 with; its NOP p99 rose from 0.03-0.04
# to 0.06-0.09 ms).  time.sleep(0): a release that lasts long enough for the waiting thread to
# take the GIL; a bare release (a cffi call, os.sched_yield) took it straight back, and that
# thread's p99 went to 45 ms
YIELD_EVERY = 256


def _yield_gil() -> None:
    time.sleep(0)


class Refused(Exception):
    """A request the drive refuses: its status name (ssdemu_wire STATUS)."""

    def __init__(self, status: str, why: str):
        super().__init__(why)
        self.status = status


@dataclass(frozen=True)
class Request:
    op: str  # "TOPK_PAGES" or "ATTEND"
    dtype: int
    int8: bool
    layer: int
    layers: int
    kv_heads: int
    q_heads: int
    head_dim: int
    page: int
    keys: tuple[bytes, ...]
    k: int
    sinks: int
    recent: int
    rerank: int
    queries: np.ndarray  # (q_heads, head_dim) float32
    page_ids: np.ndarray | None  # ATTEND: (kv_heads, k) int32

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    def out_bytes(self) -> int:
        if self.op == "TOPK_PAGES":
            return self.kv_heads * self.k * 8
        return self.q_heads * (self.head_dim + 1) * 4


def _struct_of(dt: np.dtype) -> struct.Struct:
    """The struct format of a little-endian record dtype of integer fields (arrays of them
    too): the request header read in one call, not a numpy scalar's field at a time (a
    command's header took 30 us that way)."""
    fmt = "<"
    for name in dt.names:
        f = dt.fields[name][0]
        base, count = (f.subdtype[0], int(np.prod(f.subdtype[1]))) if f.subdtype else (f, 1)
        char = {1: "b", 2: "h", 4: "i", 8: "q"}[base.itemsize]  # struct's code, by size
        fmt += f"{count}{char.upper() if base.kind == 'u' else char}"
    return struct.Struct(fmt)


_REQUEST = _struct_of(REQUEST_DTYPE)
assert _REQUEST.size == REQUEST_DTYPE.itemsize
_SQE = _struct_of(SQE_DTYPE)
assert _SQE.size == SQE_DTYPE.itemsize


_last_keys: tuple = (0, b"", ())  # the keys parse() made last, with the bytes they came from


def parse(op: str, data: memoryview | bytes) -> Request:
    """The request at the start of a command's buffer, checked; raises Refused."""
    global _last_keys
    if len(data) < _REQUEST.size:
        raise Refused("INVALID_FIELD", "shorter than a request header")
    (magic, dtype, flags, layer, layers, kv, qh, d, page, klen, n, k, sinks, recent,
     rerank, *reserved) = _REQUEST.unpack_from(data)
    if magic != RETRIEVAL_MAGIC:
        raise Refused("INVALID_FIELD", "not a retrieval request (magic)")
    rerank = max(1, rerank)
    if dtype not in ELEMENT_BYTES or flags & ~RETRIEVAL_INT8 or any(reserved):
        raise Refused("INVALID_FIELD", "dtype, flags or reserved fields")
    if not (0 < kv <= MAX_HEADS and 0 < qh <= MAX_HEADS and qh % kv == 0
            and 0 < d <= MAX_HEAD_DIM and page > 0 and 0 <= layer < layers
            and 0 < n and 0 < klen <= KEY_BYTES and rerank <= MAX_RERANK):
        raise Refused("INVALID_FIELD", "shape, layer, keys or re-rank out of range")
    if (op == "TOPK_PAGES" and k <= 0) or (op == "ATTEND" and k < 0):
        raise Refused("INVALID_FIELD", "k out of range")
    why = retrieval_over_limit(op, kv_heads=kv, head_dim=d, page_tokens=page, nkeys=n, k=k,
                               sink_pages=sinks, recent_pages=recent, rerank=rerank)
    if why:
        raise Refused("RETRIEVAL_LIMIT", why)
    at = _REQUEST.size
    need = at + n * KEY_BYTES + qh * d * 4 + (kv * k * 4 if op == "ATTEND" else 0)
    if len(data) < need:
        raise Refused("INVALID_BUFFER", f"the request needs {need} bytes, has {len(data)}")
    slots = data[at:at + n * KEY_BYTES]  # compared in place: copied only when new (a copy
    # a command was a malloc large enough to make glibc consolidate its fast bins)
    last = _last_keys  # (klen, slots, keys): a decode step names one sequence layer by layer
    if last[0] == klen and last[1] == slots:
        keys = last[2]
    else:
        slots = bytes(slots)
        keys = tuple(slots[i:i + klen] for i in range(0, n * KEY_BYTES, KEY_BYTES))
        _last_keys = (klen, slots, keys)  # one tuple: swapped atomically between workers
    at += n * KEY_BYTES
    # copies: the client may change its buffer while the command runs
    q = np.frombuffer(data, "<f4", qh * d, at).reshape(qh, d).copy()
    at += qh * d * 4
    # finite iff the float64 sum is: float32 values cannot overflow it, inf and nan carry
    # (one reduction: isfinite then all was two ufunc calls and a temporary)
    if not math.isfinite(q.sum(dtype=np.float64)):
        raise Refused("INVALID_FIELD", "queries must be finite")
    ids = None
    if op == "ATTEND":
        ids = np.frombuffer(data, "<i4", kv * k, at).reshape(kv, k).copy()
    return Request(op, dtype, bool(flags & RETRIEVAL_INT8), layer, layers, kv, qh, d, page,
                   keys, k, sinks, recent, rerank, q, ids)


@dataclass(slots=True)
class Block:
    """One stored block of the sequence: where it lies, its tokens, its first page."""
    key: bytes
    offset: int
    length: int
    tokens: int
    first_page: int
    token_bytes: int  # bytes per token in the stored value's layout (plain: contiguous)
    code: int = DTYPE_FP16  # its element type, once read
    vhash: int = 0  # the stored value's content hash (the store's)
    kv: tuple | None = None  # its layer's K and V once read, kept for the command (MEMO_BYTES)
    ident: tuple = ()  # the value as the request reads it (_ident)


def block_elements(value: bytes, req: Request) -> tuple[np.ndarray, int]:
    """A stored value (a plain block in the request's layout, or a compressed block of the
    drive's, which names its own) -> the block (tokens, 2, layers, kv_heads, head_dim) in its
    element type, and that type's code."""
    raw = np.frombuffer(value, np.uint8)
    if bytes(raw[:4]) == BLOCK_MAGIC:
        try:
            block, dname = _quant.dequantize(raw)
        except (_blockfmt.CorruptBlockError, ValueError) as e:
            raise Refused("INVALID_FIELD", f"a stored compressed block: {e}") from None
        code = DTYPE_CODES[dname]
    else:
        code = req.dtype
        per = 2 * req.layers * req.kv_heads * req.head_dim * ELEMENT_BYTES[code]
        if len(raw) % per:
            raise Refused("KV_INVALID_VALUE_SIZE", "a block is not whole tokens of the layout")
        block = raw.view(storage_dtype(code)).reshape(-1, 2, req.layers, req.kv_heads,
                                                        req.head_dim)
    if block.shape[2:] != (req.layers, req.kv_heads, req.head_dim):
        raise Refused("INVALID_FIELD", f"a block of shape {block.shape[1:]} is not the "
                      "request's layers, heads, head_dim")
    return block, code


def layer_elements(block: np.ndarray, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """One layer's K and V of a block, (kv_heads, tokens, D) each, in its element type."""
    return tuple(np.ascontiguousarray(block[:, kv, layer].transpose(1, 0, 2)) for kv in (0, 1))


def _carrier(x: np.ndarray) -> np.ndarray:
    """Elements as the kernels take them: fp16 as its uint16 bits (Numba has no float16)."""
    return x.view(np.uint16) if x.dtype == np.float16 else x


def to_f32(x: np.ndarray, code: int) -> np.ndarray:
    if code == DTYPE_FP32:
        return x.astype(np.float32)
    f = np.empty(x.size, np.float32)
    convert = _convert.fp16_to_f32 if code == DTYPE_FP16 else _convert.bf16_to_f32
    convert(x.reshape(-1), f)
    return f.reshape(x.shape)


class _Gather:
    """The pages a command gathers block by block, (H, T, D) keys (and values), in the
    blocks' element type (a command's largest buffer: float32 took twice the memory and a
    conversion the kernels make anyway as they read); float32 from the first block of
    another type on (a sequence's blocks are of one type but for a mixed one)."""

    def __init__(self, shape: tuple, values: bool):
        self.shape, self.values = shape, values
        self.keys = self.vals = self.code = None

    def _start(self, code: int) -> None:
        self.code = code
        self.keys = np.zeros(self.shape, storage_dtype(code))
        self.vals = np.zeros_like(self.keys) if self.values else None

    def put(self, h: int, dst: np.ndarray, k: np.ndarray, v: np.ndarray, src: np.ndarray,
            code: int) -> None:
        if self.code is None:
            self._start(code)
        elif code != self.code and self.code != DTYPE_FP32:  # mixed: float32 from here
            self.keys = to_f32(self.keys, self.code)
            self.vals = to_f32(self.vals, self.code) if self.values else None
            self.code = DTYPE_FP32
        self.keys[h, dst] = self._as_mine(k[h, src], code)
        if self.values:
            self.vals[h, dst] = self._as_mine(v[h, src], code)

    def _as_mine(self, x: np.ndarray, code: int) -> np.ndarray:
        x = _carrier(x)
        return x if code == self.code else to_f32(x, code)

    def arrays(self) -> tuple:
        """(keys, values or None, their element type's code); nothing gathered: float32."""
        if self.code is None:
            self._start(DTYPE_FP32)
        return self.keys, self.vals, self.code


def pack_bounds(x: np.ndarray, code: int) -> np.ndarray:
    """Summaries as the drive keeps them: in the block's element type (exact: a min or a max
    of values is one of them)."""
    if code == DTYPE_FP16:
        return x.astype(np.float16)
    if code == DTYPE_BF16:
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    return x


def unpack_bounds(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.float16:
        return x.astype(np.float32)
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x


def _bound_bytes(req: Request, pages: int) -> int:
    """The bytes of pages' float32 bounds as the score reads them (lo and hi, every KV head
    and channel)."""
    return 2 * 4 * req.kv_heads * req.head_dim * pages


def _ident(req: Request, nsid: int, b: Block) -> tuple:
    """A stored value as a request reads it: its place, length and content hash, and the
    layout a plain block is read in (made once per command: Retrieval._blocks)."""
    return b.ident


def _summary_key(req: Request, nsid: int, b: Block) -> tuple:
    """What a block's summaries depend on: the value (its place and its content hash: a block
    deleted and stored again, the same size, lands on the same place), how the request reads
    it (a plain block is read in the request's layout), the layer and the page."""
    return (b.ident, req.layer, req.page)


class ByteLRU:
    """An LRU bounded in bytes: each entry counts its nbytes and `entry_bytes` more (the
    host's own entries: its key and slot, so that entries of nothing stay bounded too)."""

    def __init__(self, capacity: int, entry_bytes: int = 0):
        self.capacity, self.entry_bytes = capacity, entry_bytes
        self.bytes = 0
        self._d: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()  # the retrieval workers share it
        # every change of the entries or their order counts here, so that get_prefix can
        # tell that nothing moved since its last call over the same keys (below)
        self._changes = 0
        self._last_prefix: tuple = (None, -1, [])  # (keys, _changes after, entries)

    def __len__(self) -> int:
        return len(self._d)

    def get(self, key):
        with self._lock:
            v = self._d.get(key)
            if v is not None:
                self._d.move_to_end(key)
                self._changes += 1
            return v

    def get_prefix(self, keys, hold: int = YIELD_EVERY) -> list:
        """get() of keys in order up to the first miss, `hold` keys to a hold of the lock
        (another worker's command waits for no more than that: a hold for all of a 16,384-
        block sequence doubled another client's one-block TOPK p99): the entries of the
        leading hits (each touched, as get() would).  The same keys (the same list) again
        with nothing changed since: their entries as they were, and nothing to touch (they are
        the newest already, in this order): a decode step's ATTEND names the summaries its
        TOPK just touched, 64 of them at a 4K-token context."""
        with self._lock:
            last_keys, changes, entries = self._last_prefix
            if keys is last_keys and changes == self._changes:
                return list(entries)
        out, start = [], None
        for at in range(0, len(keys), hold):
            with self._lock:
                if start is None:
                    start = self._changes
                for key in keys[at:at + hold]:
                    v = self._d.get(key)
                    if v is None:
                        return out
                    self._d.move_to_end(key)
                    self._changes += 1
                    out.append(v)
                if at + hold >= len(keys) and self._changes - start == len(out):
                    # only this call's touches since it began (none by another worker
                    # between its holds): its keys are the newest, in order
                    self._last_prefix = (keys, self._changes, list(out))
            if at + hold < len(keys):
                _yield_gil()
        return out

    def put(self, key, value, nbytes: int) -> None:
        with self._lock:
            self._put(key, value, nbytes)

    def _put(self, key, value, nbytes: int) -> None:
        nbytes += self.entry_bytes
        old = self._d.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        if nbytes > self.capacity:
            return
        while self.bytes + nbytes > self.capacity and self._d:
            _, (_, gone) = self._d.popitem(last=False)
            self.bytes -= gone
        self._d[key] = (value, nbytes)
        self.bytes += nbytes
        self._changes += 1


class Retrieval:
    """The daemon's retrieval worker (see the module doc)."""

    def __init__(self, daemon):
        self.d = daemon
        self.profile = daemon.profile
        # the summaries in the controller's DRAM, modelled: entries of their bytes holding
        # only the block's token counts (a hit costs no NAND read); the arrays are this
        # host's, in self.decoded (a profile's 16 GiB of DRAM is not this host's memory)
        self.cache = ByteLRU(self.profile.retrieval.summary_dram_bytes)
        # blocks' layers decoded, in this host's memory (see DECODED_BYTES)
        self.decoded_bytes = daemon.retrieval_host_bytes or DECODED_BYTES
        self.decoded = ByteLRU(self.decoded_bytes, entry_bytes=ENTRY_BYTES)
        self.stream_bytes = self.decoded_bytes // STREAM_SHARE  # a streamed score's part
        self._model_params = model_params(self.profile)  # each command's model copies them
        self._lock = threading.Lock()
        self._stats = {"commands": 0, "errors": 0, "device_ns": 0.0, "host_ns": 0,
                       "summary_hits": 0, "summary_misses": 0, "summary_reads": 0,
                       "block_reads": 0, "decoded_hits": 0, "decoded_misses": 0,
                       "nand_bytes_read": 0, "kernels": {}}
        self._local = threading.local()  # a command's own state, on its worker's thread
        # the summary keys' lists of the latest sequence, one per layer and page size, shared
        # by the workers (_summary_keys): (sid, {(layer, page): keys}), swapped whole
        self._shared_keys: tuple = (None, {})
        # real clock: how late past its modelled time each command's host work ended
        self._lag, self._lag_max = new_histogram(), 0
        # as many workers as the firmware has threads (the drive's compute units, at most
        # one per core of this host), fair between uids (fair_queue.py)
        self.workers = max(1, min(self.profile.compute.units, os.cpu_count() or 1))
        self._q = FairQueue(self.workers)
        # the data plane queues TOPK_PAGES and ATTEND for the workers themselves: a worker
        # waits on this fd (GIL released), pops one command and joins it to the fair queue
        self._fd = _device_lib.sde_dev_retrieval_fd(daemon.dev)
        self._threads = [threading.Thread(target=self._loop, name=f"ssdemu-retrieval-{i}",
                                          daemon=True) for i in range(self.workers)]
        for t in self._threads:
            t.start()

    def _next(self):
        """Wait for the data plane's next retrieval command (the fd counts them), join it to
        the fair queue, fairly between uids (its uid: the client's, -1 once it left), and
        take the command to serve now (fair_queue.put_take: this one, unless another is
        due first), or None."""
        os.read(self._fd, 8)  # one count: one command queued, or close() waking this worker
        a = getattr(self._local, "popped", None)
        if a is None:  # this worker's own, reused: one allocation per worker, not per command
            a = self._local.popped = _device_ffi.new("sde_admin_cmd *")
        if not _device_lib.sde_dev_retrieval_pop(self.d.dev, a):
            return None
        try:
            # the command's fields in one unpack of its bytes (a getattr per field of the
            # cffi struct was ~5 us a command)
            sqe = dict(zip(SQE_FIELDS, _SQE.unpack(_device_ffi.buffer(
                _device_ffi.addressof(a, "sqe"))), strict=True))
            client = self.d.clients.get(a.client)
            return self._q.put_take(client.uid if client is not None else -1, a.client,
                                    (a.qp, a.client, a.t0_ns, sqe))
        except RuntimeError:  # closed: the daemon stops, as with the commands still queued
            return None
        except Exception:  # a bug on our side: the command ends INTERNAL and the worker
            # goes on (an exception here ended the worker's thread, and the command never
            # completed: its client waited for ever, and with every worker gone, all did)
            log.exception("retrieval command %d could not be queued", a.sqe.opcode)
            self.d.complete_host(a.qp, {"cid": a.sqe.cid, "opcode": a.sqe.opcode}, a.t0_ns,
                                 STATUS["INTERNAL"], 0, 0, 0.0)
            return None

    def close(self) -> None:
        self._q.close()
        os.write(self._fd, len(self._threads).to_bytes(8, "little"))  # each worker wakes
        for t in self._threads:
            t.join(timeout=30)

    def _loop(self) -> None:
        try:  # below the data plane: a long retrieval must not take its core (bench fairness)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)
        except OSError:
            pass
        while not self._q.closed:
            # first what the fair queue holds (a command another worker queued that was
            # over its uid's cap then), then the data plane's next
            got = self._q.get_nowait()
            if got is None:
                got = self._next()
                if got is None:
                    continue
            try:
                self._serve(got[1])
            finally:
                self._q.done(got[0])

    def _serve(self, cmd) -> None:
        qp, client_id, t0, sqe = cmd
        status, result, nbytes, device_ns = STATUS["INTERNAL"], 0, 0, 0.0
        h0 = time.perf_counter_ns()
        try:
            result, nbytes, device_ns = self.run(self.d.clients.get(client_id), sqe)
            status = STATUS["SUCCESS"]
        except Refused as e:
            status = STATUS[e.status]
            log.debug("retrieval command refused: %s", e)
        except Exception:  # a bug on our side: the client gets an error, we go on
            log.exception("retrieval command %d failed", sqe["opcode"])
        with self._lock:
            s = self._stats
            s["commands"] += 1
            s["errors"] += status != STATUS["SUCCESS"]
            s["device_ns"] += device_ns
            s["host_ns"] += time.perf_counter_ns() - h0
        if self.d.clock == "real" and self.d.timing != "off" and status == STATUS["SUCCESS"]:
            # how far past its modelled completion the host finished the command (the data
            # plane's t0 and this are CLOCK_MONOTONIC): 0 when it kept up
            lag = max(0, time.monotonic_ns() - t0 - int(device_ns))
            with self._lock:
                self._lag[_device_lib.sde_hist_bucket(lag)] += 1
                self._lag_max = max(self._lag_max, lag)
        self.d.complete_host(qp, sqe, t0, status, result, nbytes, device_ns)

    def stats(self) -> dict:
        """For the log page: commands, their modelled and host time, the summaries' DRAM
        hits, and per kernel the calls and modelled time."""
        with self._lock:
            out = {k: v for k, v in self._stats.items() if k != "kernels"}
            out["kernels"] = {k: dict(v) for k, v in self._stats["kernels"].items()}
        out["summary_dram_bytes"] = self.cache.bytes
        out["workers"] = self.workers
        # waiting for a worker: on the data plane's ring, or in the fair queue over a cap
        out["waiting"] = self._q.waiting() + _device_lib.sde_dev_retrieval_queued(self.d.dev)
        out["decoded_host_bytes"] = self.decoded.bytes
        with self._lock:
            lag, worst = self._lag.copy(), self._lag_max
        pcts = percentiles_us(lag) if lag.any() else [None] * 3
        at_us = bucket_values_ns() / 1e3
        out["host_lag"] = {"commands": int(lag.sum()), "late": int(lag[1:].sum()),
                           **dict(zip(("p50_us", "p99_us", "p999_us"), pcts, strict=True)),
                           "max_us": worst / 1e3,
                           # [lag us, commands] per non-empty bucket: a caller diffs two
                           # readings for the commands between them
                           "histogram": [[float(at_us[i]), int(lag[i])]
                                         for i in np.flatnonzero(lag)]}
        return out

    def _account(self, timing) -> None:
        with self._lock:
            self._stats["nand_bytes_read"] += timing.nand_bytes
            for name, k in timing.budget.kernels.items():
                agg = self._stats["kernels"].setdefault(name, {"calls": 0, "device_ns": 0.0})
                agg["calls"] += k.calls
                agg["device_ns"] += k.device_ns

    # -- one command --
    def _region(self, client, handle: int, off: int, length: int):
        buf = client.buffers.get(handle) if client else None
        if buf is None or off > buf.nbytes or length > buf.nbytes - off or length <= 0:
            raise Refused("INVALID_BUFFER", "not a range of the client's own buffers")
        return memoryview(buf.mm)[off:off + length]

    def run(self, client, sqe) -> tuple[int, int, float]:
        """(result, bytes moved, modelled device ns); raises Refused."""
        op = "TOPK_PAGES" if sqe["opcode"] == OPCODES["TOPK_PAGES"] else "ATTEND"
        if client is None:
            raise Refused("ABORTED", "the client left")
        if sqe["flags"]:
            raise Refused("INVALID_FIELD", "flags")
        nsid = int(sqe["nsid"])
        if nsid and nsid not in self.d.namespaces.visible_ids(client):
            raise Refused("INVALID_NAMESPACE", "not a namespace of the client's")
        inp = self._region(client, int(sqe["buf"]), int(sqe["buf_offset"]), int(sqe["length"]))
        req = parse(op, inp)
        p0 = int(sqe["param0"])
        out = self._region(client, p0 >> 40, p0 & ((1 << 40) - 1), int(sqe["param1"]))
        if len(out) < req.out_bytes():
            raise Refused("INVALID_BUFFER", f"the output needs {req.out_bytes()} bytes")
        timing = _Timing(self.profile, len(inp), self._model_params)
        blocks = self._blocks(req, nsid)
        self._local.memo_left = MEMO_BYTES  # this command's, on this worker
        self._local.memoed = []  # the blocks it keeps a layer on (_read)
        self._local.fill_left = FILL_BYTES
        # a sequence bigger than the host's decoded cache keeps none of its blocks' layers
        # there: an LRU cycled by more than it holds never hits, it only holds the memory
        # (its stored bytes: the decoded size of a plain block; _seq_kv finds the rest)
        verdict = self.decoded.get((self._local.sid, "kv", None))
        known = self._local.known  # what is known of these blocks as they stand (_blocks)
        stored = known.get("stored")
        if stored is None:
            stored = known["stored"] = sum(b.length for b in blocks)
        self._local.keep_decoded = (stored <= self.decoded_bytes
                                    and (verdict is None or verdict[0] != "big"))
        if not self._local.keep_decoded:
            self._local.memo_left = 0  # it streams: a block read again costs less than holding
        try:
            if op == "TOPK_PAGES":
                payload, result = self._topk(req, nsid, blocks, timing)
            else:
                payload, result = self._attend(req, nsid, blocks, timing)
        finally:  # the blocks outlive the command (_blocks): not the layers it read (only
            # those it kept one on: a pass over a decode step's 64 blocks, out of the caches
            # by then, was ~10 us of every command's)
            for b in self._local.memoed:
                b.kv = None
        out[:len(payload)] = payload
        done = timing.finish(len(payload))
        self._account(timing)
        return result, len(inp) + len(payload), done

    def _blocks(self, req: Request, nsid: int) -> list[Block]:
        # the keys laid out for the lookup once for the sequence a decode step names layer
        # after layer (its lookup is made again: a block may have been replaced meanwhile)
        batch = getattr(self._local, "batch", None)
        if batch is None or batch.keys != req.keys:
            batch = self._local.batch = KeyBatch(req.keys)
        places, found = self.d.store.lookup_batch(batch, nsid)
        if not found.all():
            raise Refused("KV_KEY_NOT_EXIST", f"block {int(np.argmin(found))} of the sequence "
                          "is not stored")
        shape = (req.layers, req.kv_heads, req.head_dim, req.dtype)
        # the sequence as this request reads it: its blocks' keys, places and contents, the
        # layout; as a digest, so that a key of the host's caches hashes and compares in
        # constant time (a tuple of 16,384 blocks hashed under the caches' lock held another
        # client's commands for milliseconds)
        at = places.tobytes()
        memo = getattr(self._local, "seq", None)
        if memo is not None and memo[0] == (nsid, shape, at) and memo[1] == req.keys:
            # the sequence of this worker's last command, its blocks where they were (a decode
            # step names it layer after layer): its blocks again (what a command sets on them
            # is the stored value's, the same; run() cleared their command memo)
            self._local.sid, self._local.known = memo[2], memo[4]
            return memo[3]
        digest = hashlib.blake2b(at, digest_size=16)
        digest.update(np.fromiter(map(len, req.keys), np.uint32, len(req.keys)).tobytes())
        digest.update(b"".join(req.keys))
        self._local.sid = (nsid, *shape, len(req.keys), digest.digest())
        out = []
        for key, off, n, h in zip(req.keys, *places.tolist(), strict=True):
            out.append(Block(key, off, n, 0, 0, 0, DTYPE_FP16, h, None,
                             (nsid, key, off, n, h, *shape)))
            if len(out) % YIELD_EVERY == 0:
                _yield_gil()
        # what commands learn of these blocks as they stand (their pages for a page size,
        # their summaries' keys for a layer): the next command over them reuses it
        self._local.known = {}
        self._local.seq = ((nsid, shape, at), req.keys, self._local.sid, out, self._local.known)
        return out

    def _keep(self, key, value, nbytes: int) -> bool:
        """Put an entry in the host's decoded cache when this command's FILL_BYTES still
        holds it (and its ENTRY_BYTES); False: not kept, the caller's to use and drop."""
        cost = nbytes + ENTRY_BYTES
        if cost > self._local.fill_left:
            return False
        self._local.fill_left -= cost
        self.decoded.put(key, value, nbytes)
        return True

    def _value(self, b: Block, nsid: int) -> bytes:
        """A block's stored value, read through the store (its checksum checked)."""
        try:
            return self.d.store.get(b.key, nsid)
        except CorruptValue:
            raise Refused("MEDIA_ERROR", "a block fails its checksum") from None
        except (KeyError, KeyNotFound):  # the store's own, not a KeyError
            raise Refused("KV_KEY_NOT_EXIST", "a block was deleted meanwhile") from None

    def _read(self, req: Request, nsid: int, b: Block,
              value: bytes | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The block's layer, K and V (kv_heads, tokens, D) in its element type (b.code):
        read once per command as the drive would (ATTEND reads an uncached block for its
        token count before it knows which pages it needs), as long as the command's blocks
        fit in MEMO_BYTES; past that, read again.  Decoded from the emulator's DECODED_BYTES
        when it holds the value's layer.  Callers convert to float32 only what they use."""
        if b.kv is not None:
            return b.kv
        with self._lock:
            self._stats["block_reads"] += 1
        ident = _ident(req, nsid, b)
        hit = self.decoded.get((ident, req.layer))
        with self._lock:
            self._stats["decoded_hits" if hit is not None else "decoded_misses"] += 1
        if hit is None:
            block, code = block_elements(value if value is not None
                                         else self._value(b, nsid), req)
            keep = (self._local.keep_decoded and block.nbytes + req.layers * ENTRY_BYTES
                    <= self._local.fill_left)  # all its layers, or none (_decoded_layers)
            for layer in range(req.layers) if keep else (req.layer,):
                lk, lv = layer_elements(block, layer)  # the next layers' commands want them
                if keep:
                    self._keep((ident, layer), (lk, lv, code), lk.nbytes + lv.nbytes)
                if layer == req.layer:
                    hit = ((lk, lv, code), 0)
        (k, v, b.code), _ = hit
        b.tokens = k.shape[1]
        b.token_bytes = max(1, b.length // max(1, b.tokens))
        if k.nbytes + v.nbytes <= self._local.memo_left:
            self._local.memo_left -= k.nbytes + v.nbytes
            b.kv = (k, v)
            self._local.memoed.append(b)
        return k, v

    def _stored(self, req: Request, nsid: int, b: Block, timing) -> tuple:
        """(the summaries a block was stored with, as the cache keeps them, its layer's run
        of them read from NAND, or None when it has none that serve; the value when it was
        read: the caller summarizes from it when there are none).  The value is read and
        its every layer's run kept in the host's DECODED_BYTES once; the modelled read of
        this layer's run is booked each time the controller's DRAM misses it."""
        key = (_ident(req, nsid, b), "summaries", req.page, req.layer)
        got, value = self.decoded.get(key), None
        if got is None:
            value = self._value(b, nsid)
            self._keep_header(req, nsid, b, value)
            for layer, entry in enumerate(self._stored_runs(req, value)):
                nbytes = 0 if entry is None else entry[0].nbytes + entry[1].nbytes
                self._keep(key[:3] + (layer,), entry, nbytes)
                if layer == req.layer:
                    got = (entry, nbytes)
            if got is None:
                return None, value
        entry, _ = got
        if entry is None:
            return None, value
        lo, hi, tokens, token_bytes, code, off, nbytes = entry
        if timing is not None:
            timing.stored_summaries(b, off, nbytes)
            with self._lock:
                self._stats["summary_reads"] += 1
        b.code = code
        return (lo, hi, tokens, token_bytes), value

    def _keep_header(self, req: Request, nsid: int, b: Block, value: bytes):
        """A stored value's block header (None: a plain value, token rows as sent), kept
        with its decoded data: where its pages lie (firmware/blockfmt.page_extents)."""
        header = None
        if value[:4] == BLOCK_MAGIC:
            try:
                header, _ = _blockfmt.open_block(value)
            except _blockfmt.CorruptBlockError as e:
                raise Refused("INVALID_FIELD", f"a stored compressed block: {e}") from None
        self._keep((_ident(req, nsid, b), "header"), header, 64)
        return header

    def _header(self, req: Request, nsid: int, b: Block):
        got = self.decoded.get((_ident(req, nsid, b), "header"))
        if got is not None:
            return got[0]
        return self._keep_header(req, nsid, b, self._value(b, nsid))

    def _book_pages(self, req: Request, nsid: int, blocks: list[Block], heads: list,
                    union: np.ndarray, timing, values: bool) -> None:
        """The NAND reads of the pages a command uses.  Blocks laid out by head: each head's
        own pages of the request's layer, keys (and values, for ATTEND), the runs they
        occupy (firmware/blockfmt.page_runs), runs adjacent on the media read as one.  A
        token-major block (a plain value, a version-1 block, fp8, KIVI): each page any head
        chose, as its whole token rows.  The blocks of one header are booked together (a
        numpy pass over all their pages: block by block it was most of a command's host
        time).  A sequence whose blocks all share one header is booked from its runs'
        table instead (_pages, _book_runs): the same reads."""
        hs = np.concatenate([np.full(len(p), h) for h, p in enumerate(heads)])
        ps = np.concatenate(heads)
        first = np.array([b.first_page for b in blocks])
        touched = np.unique(np.searchsorted(first, union, side="right") - 1)
        by_header: dict = {}
        for i in touched:
            by_header.setdefault(self._header(req, nsid, blocks[i]), []).append(i)
        blk = np.searchsorted(first, ps, side="right") - 1
        for header, members in by_header.items():
            if header is None or not header.by_head:
                for i in members:
                    self._book_token_rows(req, blocks[i], union, timing)
                continue
            mine = np.isin(blk, members)
            bi, t0 = blk[mine], (ps[mine] - first[blk[mine]]) * req.page
            t1 = np.minimum(header.shape.tokens, t0 + req.page)
            at = np.array([b.offset for b in blocks])[bi]
            offs, lens = [], []
            for kv in (0, 1) if values else (0,):
                o, n = _blockfmt.page_runs(header, req.layer, kv, hs[mine], t0, t1)
                offs.append(o + np.tile(at, len(o) // max(1, len(at))))  # one per stream
                lens.append(n)
            timing.media_runs(np.concatenate(offs), np.concatenate(lens))

    def _book_runs(self, table, hs: np.ndarray, ps: np.ndarray, timing, values: bool) -> None:
        """The reads of pages ps of heads hs (a page listed twice is read once) from the
        sequence's runs' table (_uniform_runs)."""
        offs, lens = table
        kv = slice(0, 2 if values else 1)
        timing.media_runs(offs[kv][:, :, hs, ps].ravel(), lens[kv][:, :, hs, ps].ravel())

    def _uniform_runs(self, req: Request, nsid: int, blocks: list[Block]):
        """When every block of the sequence is laid out by head under one header (the same
        shape and scheme: a decoding engine's sequence), the runs of the request's layer as
        a table kept with the sequence's decoded data: (offsets on the media, bytes), each
        (kv, runs per page, kv_heads, pages of the sequence) uint64.  None otherwise (booked
        header by header)."""
        if not self._local.keep_decoded:  # streamed: only its touched blocks' headers
            return None
        key = (self._local.sid, "runs", req.layer, req.page)
        got = self.decoded.get(key)
        if got is not None:
            return got[0]
        headers = {self._header(req, nsid, b) for b in blocks}
        header = headers.pop() if len(headers) == 1 else None
        table = None
        if header is not None and header.by_head:
            tokens = header.shape.tokens
            nb = R.pages_of(tokens, req.page)
            if all(b.tokens == tokens and b.first_page == i * nb for i, b in enumerate(blocks)):
                hs = np.repeat(np.arange(req.kv_heads), nb)
                t0 = np.tile(np.arange(nb) * req.page, req.kv_heads)
                t1 = np.minimum(tokens, t0 + req.page)
                at = np.array([b.offset for b in blocks], np.uint64)
                offs, lens = [], []
                for kv in (0, 1):
                    o, n = _blockfmt.page_runs(header, req.layer, kv, hs, t0, t1)
                    o = o.reshape(-1, req.kv_heads, 1, nb).astype(np.uint64)
                    offs.append((o + at[:, None]).reshape(len(o), req.kv_heads, -1))
                    lens.append(np.broadcast_to(n.reshape(-1, req.kv_heads, 1, nb).astype(
                        np.uint64), (len(o), req.kv_heads, len(blocks), nb)).reshape(
                            len(o), req.kv_heads, -1))
                table = (np.stack(offs), np.stack(lens))
        self._keep(key, table, 0 if table is None else table[0].nbytes * 2)
        return table

    @staticmethod
    def _book_token_rows(req: Request, b: Block, union: np.ndarray, timing) -> None:
        nb = R.pages_of(b.tokens, req.page)
        mine = union[(union >= b.first_page) & (union < b.first_page + nb)]
        # a page's token rows at the stored value's bytes per token (as _read sets them)
        b.token_bytes = max(1, b.length // max(1, b.tokens))
        for p in mine:
            t0 = (int(p) - b.first_page) * req.page
            timing.page_read(b, t0, min(b.tokens, t0 + req.page) - t0)

    @staticmethod
    def _stored_runs(req: Request, value: bytes) -> list:
        """Per layer of a stored value, its summaries' entry for _stored (None when it has
        none of the request's page and shape)."""
        if value[:4] != BLOCK_MAGIC:
            return [None] * req.layers
        try:
            header, _ = _blockfmt.open_block(value)
        except _blockfmt.CorruptBlockError as e:
            raise Refused("INVALID_FIELD", f"a stored compressed block: {e}") from None
        s = header.shape
        if header.summary_page != req.page or (s.layers, s.kv_heads, s.head_dim) != (
                req.layers, req.kv_heads, req.head_dim):
            return [None] * req.layers
        body = _blockfmt.HEADER_BYTES + header.body_bytes  # the token rows, no summaries
        out = []
        for layer in range(s.layers):
            run = _blockfmt.summaries_run(header, value, layer)  # verified above
            lo, hi = run[0].copy(), run[1].copy()
            if header.dtype == DTYPE_FP16:
                lo, hi = lo.view(np.float16), hi.view(np.float16)
            out.append((lo, hi, s.tokens, max(1, body // s.tokens), header.dtype,
                        *_blockfmt.summaries_at(header, layer)))
        return out

    def _block_summaries(self, req: Request, nsid: int, b: Block, timing) -> tuple:
        """A block's summaries of the request's layer and page, packed in its element type
        (lo, hi: (kv_heads, pages, head_dim)).  The controller's DRAM (self.cache) is
        modelled: it holds what the drive would keep (its profile's bytes) as entries of
        their size, not the arrays; the arrays are kept in this host's bounded DECODED_BYTES.
        A DRAM hit costs no NAND read whether or not this host still holds the arrays (when
        it does not, they are read again, unbooked)."""
        ck = _summary_key(req, nsid, b)
        meta = self.cache.get(ck)
        with self._lock:
            self._stats["summary_hits" if meta is not None else "summary_misses"] += 1
        host = self.decoded.get((ck, "bounds"))
        if meta is not None and host is not None:
            (b.tokens, b.token_bytes), _ = meta
            (plo, phi, b.code), _ = host
            return plo, phi
        book = timing if meta is None else None
        stored, value = self._stored(req, nsid, b, book)
        if stored is not None:
            plo, phi, tokens, token_bytes = stored
        else:
            lk, _ = self._read(req, nsid, b, value)
            keys = to_f32(lk, b.code)
            tokens, token_bytes = keys.shape[1], b.token_bytes
            lo = np.empty((req.kv_heads, R.pages_of(tokens, req.page), req.head_dim),
                          np.float32)
            hi = np.empty_like(lo)
            R.page_bounds(keys, req.page, lo, hi)
            plo, phi = pack_bounds(lo, b.code), pack_bounds(hi, b.code)
            if book is not None:
                book.summarize(b, tokens, req)
        b.tokens, b.token_bytes = tokens, token_bytes
        nbytes = plo.nbytes + phi.nbytes
        if meta is None:
            self.cache.put(ck, (tokens, token_bytes), nbytes)
        self._keep((ck, "bounds"), (plo, phi, b.code), nbytes)
        return plo, phi

    def _summary_keys(self, req: Request, nsid: int, blocks: list[Block]) -> list:
        """The blocks' summary keys for the request's layer and page (kept for the
        sequence's next command: a decode step names the same blocks layer after layer),
        one list object per layer and page of the latest sequence across the workers."""
        known = self._local.known
        got = known.get(("keys", req.layer, req.page))
        if got is not None:
            return got
        sid, lists = self._shared_keys
        if sid != self._local.sid:
            sid, lists = self._shared_keys = (self._local.sid, {})
        out = lists.get((req.layer, req.page))
        if out is None:
            out = []
            for at in range(0, len(blocks), YIELD_EVERY):
                out.extend(_summary_key(req, nsid, b) for b in blocks[at:at + YIELD_EVERY])
                if at + YIELD_EVERY < len(blocks):
                    _yield_gil()
            # one list for every worker: a layer's TOPK and ATTEND run on either, and
            # get_prefix's shortcut knows its last keys by the list (the same keys in another
            # worker's list touched all 64 summaries of a 4K-token sequence again: 54 us)
            out = lists.setdefault((req.layer, req.page), out)
        known[("keys", req.layer, req.page)] = out
        return out

    def _summaries(self, req: Request, nsid: int, blocks: list[Block], timing,
                   arrays: bool = True) -> tuple:
        """The sequence's summaries, packed, a (lo, hi) per block (each block's first_page
        set), and its pages.  The pages are counted block by block, and the command refused
        (RETRIEVAL_LIMIT) as soon as they pass what one command may score: its work stops
        there.  Scoring converts them to float32 a block at a time (_bounds).  arrays False
        (the caller holds the sequence's): the leading blocks the controller's DRAM holds are
        touched there in one pass, their entries None."""
        packed, first = [], 0
        hits = [] if arrays else self.cache.get_prefix(self._summary_keys(req, nsid, blocks))
        if hits:
            with self._lock:
                self._stats["summary_hits"] += len(hits)
        pages = self._local.known.get(("pages", req.page))
        if len(hits) == len(blocks) and pages is not None:
            # every block hit, and an earlier command over these blocks set their tokens and
            # first pages for this page size and checked them (the same values: the blocks
            # are where they were, their content the same)
            return [(None, None)] * len(blocks), pages
        for i, b in enumerate(blocks):
            if i < len(hits):
                (b.tokens, b.token_bytes), _ = hits[i]
                plo = phi = None
                pages = -(-b.tokens // req.page)
                if i % YIELD_EVERY == YIELD_EVERY - 1:
                    _yield_gil()
            else:
                plo, phi = self._block_summaries(req, nsid, b, timing)
                pages = plo.shape[1]
            if b.tokens % req.page and i != len(blocks) - 1:
                raise Refused("INVALID_FIELD", "every block but the last must hold whole pages")
            b.first_page = first
            first += pages
            if req.kv_heads * first * req.head_dim > RETRIEVAL_MAX_SCORED:
                raise Refused("RETRIEVAL_LIMIT", f"the sequence passes {first} pages at block "
                              f"{i}: x {req.kv_heads} KV heads x {req.head_dim} channels, more "
                              f"than the {RETRIEVAL_MAX_SCORED} summary elements a command "
                              "scores")
            packed.append((plo, phi))
        self._local.known[("pages", req.page)] = first
        return packed, first

    @staticmethod
    def _bounds(req: Request, plo: np.ndarray, phi: np.ndarray) -> tuple:
        """A block's summaries as the score reads them: float32, through int8 when asked
        (both per page: a block at a time gives the sequence's bits)."""
        lo, hi = unpack_bounds(plo), unpack_bounds(phi)
        if req.int8:
            cmin = np.empty(lo.shape, np.int8)
            cmax = np.empty(lo.shape, np.int8)
            sc = np.empty(lo.shape[:2], np.float32)
            R.bounds_to_int8(lo, hi, cmin, cmax, sc)
            lo, hi = np.empty_like(lo), np.empty_like(hi)
            R.int8_to_bounds(cmin, cmax, sc, lo, hi)
        return lo, hi

    def _pages(self, req: Request, nsid: int, blocks: list[Block], rows: np.ndarray,
               timing, values: bool):
        """Each KV head's own pages of rows (H, n) global page ids (-1: none), for the
        kernels: (keys (H, T, D), values or None, ids (H, n), bf16, back).  When the
        sequence's layer is in the host's decoded data (_seq_kv), keys and values are it, as
        stored (uint16 carrying fp16 or bf16 bits, or float32), and ids are rows: the kernels
        read the pages in place (back None).  Otherwise each head's pages are gathered in
        the blocks' element type (_Gather): head h's, in ascending order, take its slots 0,
        1, ...; the sequence's last page, when it is partial, takes slot n, the last (T ends
        with its tokens: the kernels cut a page at T), so that a local id orders as its page
        does; ids are the local ids and back (H, n + 2) maps a local id to its page.  A
        command's memory is then what it reads: n pages of each head, not every head of the
        pages any head chose.  The NAND reads are booked as the block's layout places the
        pages (_book_pages)."""
        H, n = rows.shape
        table = self._uniform_runs(req, nsid, blocks)
        if table is not None:
            hs, ps = np.nonzero(rows >= 0)
            self._book_runs(table, hs, rows[hs, ps], timing, values)
        heads = None
        if table is None:
            heads = [np.unique(rows[h][rows[h] >= 0]) for h in range(H)]
            self._book_pages(req, nsid, blocks, heads, np.unique(rows[rows >= 0]), timing,
                             values)
        seq = self._seq_kv(req, nsid, blocks)
        if seq is not None:  # the sequence's layer in one array: read in place
            k, v, code = seq
            return (_carrier(k), _carrier(v) if values else None, rows.astype(np.int32),
                    code == DTYPE_BF16, None)
        if heads is None:
            heads = [np.unique(rows[h][rows[h] >= 0]) for h in range(H)]
        union = np.unique(rows[rows >= 0])
        P = sum(R.pages_of(b.tokens, req.page) for b in blocks)
        last = blocks[-1]
        last_len = last.tokens - (R.pages_of(last.tokens, req.page) - 1) * req.page
        partial = last_len < req.page and bool((rows == P - 1).any())
        T = n * req.page + (last_len if partial else 0)
        gather = _Gather((H, T, req.head_dim), values)
        slots = []
        local = np.full((H, n), -1, np.int32)
        back = np.full((H, n + 2), -1, np.int64)
        for h, u in enumerate(heads):
            sl = np.arange(len(u))
            if partial and len(u) and u[-1] == P - 1:
                sl[-1] = n
            ok = rows[h] >= 0
            local[h, ok] = sl[np.searchsorted(u, rows[h][ok])]
            back[h, sl] = u
            slots.append(sl)
        for b in blocks:
            nb = R.pages_of(b.tokens, req.page)
            if not ((union >= b.first_page) & (union < b.first_page + nb)).any():
                continue
            k, v = self._read(req, nsid, b)
            for h in range(H):  # the head's pages in this block, gathered in one go
                inb = (heads[h] >= b.first_page) & (heads[h] < b.first_page + nb)
                ps = heads[h][inb]
                if not len(ps):
                    continue
                t0 = (ps - b.first_page) * req.page
                lens = np.minimum(b.tokens, t0 + req.page) - t0
                at = slots[h][inb] * req.page
                starts = np.cumsum(lens) - lens  # each page's place in the gathered run
                step = np.arange(int(lens.sum())) - np.repeat(starts, lens)
                src, dst = np.repeat(t0, lens) + step, np.repeat(at, lens) + step
                gather.put(h, dst, k, v, src, b.code)
        keys, vals, code = gather.arrays()
        return keys, vals, local, code == DTYPE_BF16, back

    def _seq_kv(self, req: Request, nsid: int, blocks: list[Block]):
        """(K, V, code): the request's layer over the whole sequence, (kv_heads, tokens, D)
        each in the blocks' element type, kept in the host's DECODED_BYTES under the
        sequence's identity (its blocks' places and content hashes).  Built for every layer
        at once, each block read once, when the sequence's layers fit in it (a decode step
        asks for the same sequence layer after layer;
        gathering pages block by block in Python was most of a command's host time).  None
        otherwise, or for blocks of mixed element types: the block-by-block path.  A command
        builds the request's layer and the next ones (wrapping) as far as its FILL_BYTES
        holds them, and none when not even one: the layers a decode step asks for next come
        in a few commands, each reading the blocks once."""
        sid = self._local.sid
        got = self.decoded.get((sid, "kv", req.layer))
        if got is not None:
            return got[0]
        if self.decoded.get((sid, "kv", None)) is not None:
            return None  # known not to fit, or of mixed element types (run() knows which)
        T = sum(b.tokens for b in blocks)
        arrays, code0, at = None, None, 0
        for b in blocks:
            layers = self._decoded_layers(req, nsid, b)  # this command read it already
            if layers is None:
                block, code = block_elements(self._value(b, nsid), req)
                with self._lock:
                    self._stats["block_reads"] += 1
                    self._stats["decoded_misses"] += 1
                layers = [(block[:, 0, i].transpose(1, 0, 2),  # views: copied once below
                           block[:, 1, i].transpose(1, 0, 2), code)
                          for i in range(req.layers)]
            code, tokens = layers[0][2], layers[0][0].shape[1]
            if arrays is None:
                code0 = code
                per = 2 * req.kv_heads * T * req.head_dim * ELEMENT_BYTES[code]
                if per * req.layers > self.decoded_bytes:
                    self.decoded.put((sid, "kv", None), "big", 0)
                    self._local.keep_decoded, self._local.memo_left = False, 0
                    return None
                built = self._seq_layers(req, sid, per)
                if not built:
                    return None
                arrays = {i: np.empty((2, req.kv_heads, T, req.head_dim), layers[0][0].dtype)
                          for i in built}
            if code != code0 or tokens != b.tokens or at + b.tokens > T:
                self.decoded.put((sid, "kv", None), "mixed", 0)  # not one array: per block
                return None
            for layer, kv in arrays.items():
                kv[0, :, at:at + b.tokens] = layers[layer][0]
                kv[1, :, at:at + b.tokens] = layers[layer][1]
            at += b.tokens
        for layer, kv in arrays.items():
            self._keep((sid, "kv", layer), (kv[0], kv[1], code0), kv.nbytes)
        return arrays[req.layer][0], arrays[req.layer][1], code0

    def _seq_layers(self, req: Request, sid, per: int) -> list[int]:
        """The layers _seq_kv builds: the request's, then the next ones (wrapping) not yet
        kept, while this command's FILL_BYTES holds them (per bytes each); [] when it does
        not hold the request's."""
        out, left = [], self._local.fill_left
        for i in range(req.layers):
            layer = (req.layer + i) % req.layers
            if i and self.decoded.get((sid, "kv", layer)) is not None:
                continue
            if per + ENTRY_BYTES > left:
                break
            left -= per + ENTRY_BYTES
            out.append(layer)
        return out

    def _decoded_layers(self, req: Request, nsid: int, b: Block) -> list | None:
        """The block's every layer as (K, V, code) from the host's DECODED_BYTES, when all
        of them are there (an ATTEND read its uncached blocks for their token counts)."""
        ident, out = _ident(req, nsid, b), []
        for layer in range(req.layers):
            hit = self.decoded.get((ident, layer))
            if hit is None:
                return None
            out.append(hit[0])
        return out

    def _seq_bounds(self, req: Request, nsid: int, blocks, timing) -> tuple:
        """The sequence's summaries as the score reads them, and P: (parts, P), parts() an
        iterator of (lo, hi, at), float32 channel-major (H, D, p) bounds of pages [at, at +
        p).  Each block's summaries go through the drive's DRAM as before (_summaries: the
        modelled LRU touched, its misses booked).  A sequence the host's decoded data holds
        is one part over all its pages, kept in DECODED_BYTES under the sequence's identity,
        so that a decode step's next command scores it in one kernel call per pass, not one
        per block (the per-block calls and conversions were most of a short command's host
        time), as long as those float32 bounds take at most a WHOLE_SHARE of the decoded
        bytes.  A streamed sequence (past DECODED_BYTES), or one whose bounds are larger, is
        scored a part of its blocks at a time, at most self.stream_bytes of bounds each: the
        whole sequence's bounds were 32 MiB of a worst-case command's memory, and kept.  The
        kernels work page by page (channel_range_sums in page order), so the bits are the
        same either way."""
        key = (self._local.sid, "bounds", req.layer, req.page, req.int8)
        got = self.decoded.get(key)
        packed, P = self._summaries(req, nsid, blocks, timing, arrays=got is None)
        if got is not None:
            whole = [(*got[0], 0)]
            return (lambda: whole), P
        if (not self._local.keep_decoded
                or _bound_bytes(req, P) > self.decoded_bytes // WHOLE_SHARE):
            return (lambda: self._bound_parts(req, packed)), P
        whole = list(self._bound_parts(req, packed, whole=True))
        lo, hi, _ = whole[0]
        self._keep(key, (lo, hi), lo.nbytes + hi.nbytes)
        return (lambda: whole), P

    def _bound_parts(self, req: Request, packed: list, whole: bool = False):
        """The blocks' packed summaries as (lo, hi, at) parts, channel-major (H, D, p) and
        C-contiguous as the scoring kernels take them (np.concatenate of transposed views
        keeps their memory order: a strided array, which Numba compiles without vector
        lanes); consecutive blocks to a part until it holds self.stream_bytes (whole: one
        part; a block past it is a part alone)."""
        H, D = req.kv_heads, req.head_dim
        i, at = 0, 0
        while i < len(packed):
            j, p = i, 0
            while j < len(packed) and (whole or p == 0
                                       or _bound_bytes(req, p + packed[j][0].shape[1])
                                       <= self.stream_bytes):
                p += packed[j][0].shape[1]
                j += 1
            lo = np.empty((H, D, p), np.float32)
            hi = np.empty_like(lo)
            q = 0
            for plo, phi in packed[i:j]:
                a, b = self._bounds(req, plo, phi)
                lo[:, :, q:q + a.shape[1]] = a.transpose(0, 2, 1)
                hi[:, :, q:q + a.shape[1]] = b.transpose(0, 2, 1)
                q += a.shape[1]
            yield lo, hi, at
            at += p
            i = j

    def _spread(self, req: Request, parts, P: int) -> np.ndarray:
        """The channels' mean page range of the sequence's summaries (parts: _seq_bounds's),
        kept with them: a function of the summaries alone, the same for every query (kept
        for a streamed sequence too: a second pass over its parts costs more than its
        bytes)."""
        key = (self._local.sid, "spread", req.layer, req.page, req.int8)
        got = self.decoded.get(key)
        if got is not None:
            return got[0]
        acc = np.zeros((req.kv_heads, req.head_dim), np.float64)
        for lo, hi, _ in parts():
            R.channel_range_sums(lo, hi, acc)
        spread = np.empty((req.kv_heads, req.head_dim), np.float32)
        R.spread_of_sums(acc, P, spread)
        self._keep(key, spread, spread.nbytes)
        return spread

    @staticmethod
    def _scores(req: Request, parts, P: int, spread=None, r: int = 0) -> tuple:
        """Quest's bound (H, P) float32 over the parts, and with spread the channel-selective
        score too (selective_scores: both from one pass): (bound, selective or None).  A part
        short of the sequence is scored into its own arrays and copied in (a view of the
        sequence's would be a strided array, another compilation)."""
        H = req.kv_heads
        bound = np.empty((H, P), np.float32)
        sel = np.empty((H, P), np.float32) if spread is not None else None
        for lo, hi, at in parts():
            p = lo.shape[2]
            b = bound if p == P else np.empty((H, p), np.float32)
            if spread is None:
                R.quest_scores(req.queries, lo, hi, b)
            else:
                s = sel if p == P else np.empty((H, p), np.float32)
                R.selective_scores(req.queries, lo, hi, spread, r, s, b)
                if s is not sel:
                    sel[:, at:at + p] = s
            if b is not bound:
                bound[:, at:at + p] = b
        return bound, sel

    def _topk(self, req: Request, nsid: int, blocks, timing) -> tuple[bytes, int]:
        parts, P = self._seq_bounds(req, nsid, blocks, timing)
        H, D = req.kv_heads, req.head_dim
        c = req.k * req.rerank
        ids = np.empty((H, c), np.int32)
        sco = np.empty((H, c), np.float32)
        n = max(0, P - req.sinks - req.recent)
        if req.rerank == 1:
            scores, _ = self._scores(req, parts, P)
            timing.score(req, P)
            R.topk_pages(scores, c, req.sinks, req.recent, ids, sco)
            timing.topk(req, n, c)
        else:
            # the re-rank's candidates: half by Quest's bound, half by the channel-selective
            # score, both from one pass over the summaries (firmware/retrieval.py: the bound
            # alone misses keys that outlier channels hide); the spread is the mean range the
            # summaries keep (host: summed from the bounds a block at a time here; modelled:
            # kept as they are made)
            spread = self._spread(req, parts, P)
            r = R.select_channels(D)
            scores, sel = self._scores(req, parts, P, spread, r)
            timing.score(req, P)
            timing.selective(req, P, r)
            R.rerank_candidates(scores, sel, c, req.sinks, req.recent, ids)
            timing.topk(req, n, c)
            timing.topk(req, n, c)
            if not (ids >= 0).any():  # the sink and recent pages cover every page
                empty = np.full((H, req.k), -1, np.int32)
                return (empty.astype("<i4").tobytes()
                        + np.full((H, req.k), -np.inf, "<f4").tobytes(), P)
            keys, _, local, bf16, back = self._pages(req, nsid, blocks, ids, timing, False)
            kids = np.empty((H, req.k), np.int32)
            ksc = np.empty((H, req.k), np.float32)
            R.rerank_pages(req.queries, keys, req.page, local, req.k, kids, ksc, bf16)
            if back is not None:  # local ids back to the pages
                kids = np.where(kids >= 0, np.take_along_axis(back, np.maximum(kids, 0), 1),
                                -1).astype(np.int32)
            ids, sco = kids, ksc
            timing.rerank(req, int((local >= 0).sum()))
        return ids.astype("<i4").tobytes() + sco.astype("<f4").tobytes(), P

    def _attend(self, req: Request, nsid: int, blocks, timing) -> tuple[bytes, int]:
        # the tokens of each block: from its summaries' entry, or a read
        hits = self.cache.get_prefix(self._summary_keys(req, nsid, blocks))
        P = self._local.known.get(("pages", req.page))
        if len(hits) < len(blocks) or P is None:  # else a TOPK over them set them all
            for b, ((tokens, token_bytes), _) in zip(blocks, hits, strict=False):
                b.tokens, b.token_bytes = tokens, token_bytes
            for b in blocks[len(hits):]:
                hit = self.cache.get(_summary_key(req, nsid, b))
                if hit is None:
                    self._read(req, nsid, b)
                else:
                    (b.tokens, b.token_bytes), _ = hit
            first = 0
            for b in blocks:
                b.first_page = first
                first += R.pages_of(b.tokens, req.page)
            P = first
        forced = np.array(list(range(min(req.sinks, P)))
                          + list(range(max(0, P - req.recent), P)), np.int64)
        ids = req.page_ids
        if ids.size and ids.max() >= P:
            raise Refused("INVALID_FIELD", f"a page id past the sequence's {P} pages")
        # each head's pages in the order given, then the forced ones (attention adds them
        # up in this order)
        H = req.kv_heads
        if not ids.size or ids.min() >= 0:  # every head names its k pages (a TOPK's answer)
            rows = np.concatenate([ids.astype(np.int64), np.broadcast_to(forced, (H, len(forced)))],
                                  axis=1)
        else:
            rows = np.full((H, ids.shape[1] + len(forced)), -1, np.int64)
            for h in range(H):
                mine = ids[h][ids[h] >= 0]
                rows[h, :len(mine)] = mine
                rows[h, len(mine):len(mine) + len(forced)] = forced
        keys, values, local, bf16, _ = self._pages(req, nsid, blocks, rows, timing, True)
        outv = np.empty((req.q_heads, req.head_dim), np.float32)
        lse = np.empty(req.q_heads, np.float32)
        R.attend_pages(req.queries, keys, values, req.page, local, outv, lse, bf16)
        timing.attend(req, int((local >= 0).sum(axis=1).max()) if local.size else 0)
        return outv.astype("<f4").tobytes() + lse.astype("<f4").tobytes(), \
            int((local >= 0).sum(axis=1).max()) if local.size else 0


class _Timing:
    """The modelled device time of one retrieval command, the drive otherwise idle."""

    def __init__(self, profile, request_bytes: int, params=None):
        self.p = profile
        self.model = DeviceModel(profile, params=params)
        self.budget = budget_of(profile)
        self.budget.share_dram(self.model)
        self.ready = self.model.receive(0.0, request_bytes)
        self.t = self.ready
        self.sensed = self.ready  # NAND reads go out from here
        self.nand_bytes = 0  # what the command read from NAND (the log page sums them)

    def _sense(self, offset: int, nbytes: int) -> float:
        self.nand_bytes += max(1, nbytes)
        return self.model.sense(self.ready, offset, max(1, nbytes))

    def stored_summaries(self, b: Block, offset: int, nbytes: int) -> None:
        """A layer's summaries read from NAND, where the block's store put them."""
        self.t = max(self.t, self._sense(b.offset + offset, nbytes))

    def summarize(self, b: Block, tokens: int, req: Request) -> None:
        done = self._sense(b.offset, b.length)
        sb = summary_bytes(R.pages_of(tokens, req.page), req.kv_heads, req.head_dim)
        c = summarize_cost(tokens, req.kv_heads, req.head_dim, 2, sb)
        self.t = max(self.t, self.budget.charge("summarize", c, done)[1])

    def score(self, req: Request, pages: int) -> None:
        """Summaries in the DRAM (made or cached) are read as the score's bytes."""
        sb = summary_bytes(pages, 1, req.head_dim, 2, req.int8)
        c = score_cost(pages, 1, req.group, req.head_dim, sb)
        self.t = self.budget.charge_each("score", c, self.t, req.kv_heads)  # one per head

    def selective(self, req: Request, pages: int, channels: int) -> None:
        c = selective_score_cost(pages, 1, req.group, req.head_dim, channels)
        self.t = self.budget.charge_each("score", c, self.t, req.kv_heads)

    def topk(self, req: Request, candidates: int, k: int) -> None:
        self.t = self.budget.charge_each("topk", topk_cost(max(1, candidates), k), self.t,
                                         req.kv_heads)

    def page_read(self, b: Block, t0: int, tokens: int) -> None:
        # token rows t0..t0+tokens of the block: every layer and head of them
        self.sensed = max(self.sensed, self._sense(b.offset + t0 * b.token_bytes,
                                                   tokens * b.token_bytes))

    def media_runs(self, offs: np.ndarray, lens: np.ndarray) -> None:
        """Runs of the media (stored blocks' bytes, any order) read from NAND as the drive
        reads them (join_runs: sorted, runs that share a NAND page one read; a page of one
        head's keys and its scales are a few hundred bytes, and sensed apart each took a
        whole t_read of the same die), in one call to the model."""
        offs, lens = offs.astype(np.uint64), lens.astype(np.uint64)  # joined in place
        n = join_runs(offs, lens, self.p.nand.page_bytes)
        lens = np.maximum(lens[:n], 1)
        self.nand_bytes += int(lens.sum())
        self.sensed = max(self.sensed, self.model.sense_runs(self.ready, offs[:n], lens))

    def rerank(self, req: Request, pages: int) -> None:
        start = max(self.t, self.sensed)
        kb = pages * req.page * req.head_dim * 2
        c = rerank_cost(max(1, pages * req.page // req.kv_heads),
                        max(1, pages // req.kv_heads), 1, req.group, req.head_dim,
                        max(1, kb // req.kv_heads))
        end = self.budget.charge_each("rerank", c, start, req.kv_heads)
        for _ in range(req.kv_heads):  # each head's top-k after the last re-rank's end
            end = max(end, self.budget.charge("topk", topk_cost(max(1, pages // req.kv_heads),
                                                                 req.k), end)[1])
        self.t = end

    def attend(self, req: Request, pages: int) -> None:
        start = max(self.t, self.sensed)
        tokens = max(1, pages * req.page)
        c = attend_cost(tokens, 1, req.group, req.head_dim, tokens * req.head_dim * 4)
        self.t = self.budget.charge_each("attend", c, start, req.kv_heads)

    def finish(self, out_bytes: int) -> float:
        return self.model.transfer(max(self.t, self.sensed), out_bytes)

