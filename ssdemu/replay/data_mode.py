"""Data mode of `ssdemu replay`: real KV bytes through a running daemon, with hostlib.

The drive (a daemon started with `--clock virtual`) quantizes each new block in its firmware,
stores it on its media, matches each request's keys against its prefix index, reads and
dequantizes the hits, and deletes what the drive tier's LRU evicts.  Every command carries the
request's arrival time on the virtual clock, so the completion times it returns are the
drive's modelled times for the same command sequence model mode runs (ssdemu/replay/model_mode.py).

The client keeps the drive busy as a serving engine would and shares the host's cores with
the daemon, so it does little itself: every block is a view of one registered sequence
(ssdemu.replay.serving.SyntheticKV), which the drive quantizes where it lies (unquantized, a block
is copied into a block-aligned registered buffer first, for the media's DMA), and blocks are
read back into registered buffers; stores and deletes go out asynchronously (up to STORES
quantized stores in flight), and the reads of a request are issued together.  A request
waits only for the earlier stores and deletes of its own blocks (before its match and its
reads), as a serving engine must: the stores of one request run on into the next, so that
the media is written while the client reads and checks.  The drive books commands in the
order it fetched them whatever the host's timing (c/dev, the virtual clock's FIFO),
so the modelled times are those of a client that waits for each command.

The drive tier holds what the drive's media holds: with `--capacity drive=unbounded` (the
default) its capacity is the drive's room when the replay starts (free bytes in whole stored
blocks, and free index keys) less the most blocks one request stores, since a request's
stores reach the drive before the deletes of the blocks they evict; a larger capacity given
is refused before anything is replayed, where it would otherwise fail a store with
CAPACITY_EXCEEDED part way.  Each request's stores wait for the deletes sent before them, so
the room those deletes free is the drive's again when the stores need it.

Every block read back is checked, two ways.  All of them: a sample of elements (the first
SAMPLE_RUN of every SAMPLE_EVERY bytes) must lie within the scheme's error bound of the
block stored (the host's own quantization error on block 0, with margin); another block's
bytes, zeros or garbage fail it.  One block in EXACT_EVERY (by hash id), and any that
fails the sample: the drive's bytes must equal the host's own dequantization of its own
quantization of the block, bit for bit (a CRC-32).  A failure is counted in `data_errors`.
"""

from __future__ import annotations

import heapq
import time
import zlib
from collections import deque

import numpy as np

from firmware.quant import dequantize, quantize
from hostlib.errors import AccessDeniedError, KeyNotFoundError
from ssdemu.errors import SsdemuError
from ssdemu.replay.model_mode import (
    BUSY_COUNTERS,
    DEFAULT_GPU_DEQUANT_BYTES_PER_S,
    DEFAULT_HOST_LINK_BYTES_PER_S,
    check_dequant,
    with_and_without,
)
from ssdemu.replay.pool import FabricSpec
from ssdemu.replay.real_kv import REAL_MODELS, RealKV
from ssdemu.replay.serving import ModelConfig, SyntheticKV, drive_key
from ssdemu.sim.profile import Profile


class DataModeError(SsdemuError):
    pass


def _f32(x: np.ndarray) -> np.ndarray:
    """fp16 bits (uint16) as float32."""
    return x.view(np.float16).astype(np.float32)


# registered buffers for blocks read back (or, unquantized, stored): enough for a request's
# reads to go out together and stay out while the next requests' commands are sent (the
# replay accounts a request once its reads are back: model_mode.LOOKAHEAD), in at most
# SLOT_BYTES, and never fewer than MIN_SLOTS
SLOTS = 64
MIN_SLOTS = 16
SLOT_BYTES = 32 << 20
# quantized stores in flight (their blocks are views of the sequence: no buffer each); more
# than SLOTS keeps the media written while the client reads and checks (the demo's rate,
# interleaved runs: 16 -> 154-163, 32 -> 158-169, 64 -> 167-182 requests/s)
STORES = 64
MATCHES = 64  # prefix matches in flight, compared with the host's answers when back
# of every block read back, the first SAMPLE_RUN elements of every SAMPLE_EVERY bytes are
# checked (every 4 KiB store unit of a plain block is looked at; 8 elements per 64-byte line:
# the lines were just written by the drive's thread, and one every 194 bytes, as before,
# cost ~80 us a block in cache misses)...
SAMPLE_EVERY = 4096
SAMPLE_RUN = 8
EXACT_EVERY = 16  # ...and one block in 16 is checked bit for bit
ERROR_BLOCKS = 4  # blocks whose host quantization sets the error bound


class _Read:
    """A block read back into a slot: waited for and checked once, by whoever needs it
    first (the request's accounting, or the next command that wants the slot)."""

    __slots__ = ("drive", "b", "i", "future", "device_ns")

    def __init__(self, drive: DataDrive, b: int, i: int, future):
        self.drive, self.b, self.i, self.future = drive, b, i, future
        self.device_ns = None

    def result(self) -> int:
        if self.device_ns is None:
            try:
                self.future.result()
            except KeyNotFoundError:  # the drive lacks a block its prefix match is to hold
                self.device_ns = 0
                self.drive.verified += 1
                self.drive.data_errors += 1
                return 0
            self.device_ns = self.future.device_ns
            self.drive._check(self.b, self.drive.slots[self.i])
        return self.device_ns


class _Load:
    """A request's reads: result() is when the last of them completed on the drive's
    clock (from t_ns, the request's arrival)."""

    __slots__ = ("t_ns", "reads")

    def __init__(self, t_ns: int, reads: list):
        self.t_ns, self.reads = t_ns, reads

    def result(self) -> int:
        return max([self.t_ns] + [r.result() for r in self.reads])


class _Books:
    """The drive's busy books at a COUNTERS command's turn, less the replay's start."""

    __slots__ = ("future", "base")

    def __init__(self, future, base: dict):
        self.future, self.base = future, base

    def result(self) -> dict:
        c = self.future.result()
        return {k: c[k] - self.base[k] for k in BUSY_COUNTERS}


class DataDrive:
    """The drive of data mode: a hostlib Device on a virtual-clock daemon."""

    def __init__(self, dev, profile: Profile, model: ModelConfig, quant: str | None,
                 dequant: str = "drive", ids: int = 1 << 16):
        """ids: how many hash ids to tell apart (the trace's distinct ones): each gets its
        own block, numbered in the order they first appear, so the sequence the blocks are
        windows of is as long as the trace needs, whatever its ids' values."""
        info = dev.identify()
        if info.get("clock") != "virtual":
            raise DataModeError("data mode needs a daemon started with --clock virtual "
                                "(the trace's timestamps drive the drive's clock)")
        if info.get("timing") != "detailed":
            raise DataModeError("data mode needs a daemon with --timing detailed (the "
                                f"daemon has {info.get('timing')!r})")
        if info.get("profile") not in (None, profile.name):
            raise DataModeError(f"the daemon runs profile {info['profile']!r}, the replay "
                                f"asks for {profile.name!r}")
        stored, limit = model.stored_block_bytes(quant), info["max_value_bytes"]
        if stored > limit:
            raise DataModeError(
                f"a {model.name} block is {stored:,} bytes stored, over the drive's "
                f"{limit:,}-byte value limit (the profile's kv.max_value_bytes)")
        try:
            dev.counters()
        except AccessDeniedError:
            raise DataModeError("data mode reads the drive's books (COUNTERS), which are an "
                                "admin's: connect as the daemon's admin (its uid, or the key "
                                "its --admin-key names)") from None
        if any(k.endswith(b"mooncake") for k in dev.kv_list(max_keys=1024)):
            raise DataModeError("the drive already holds trace blocks from an earlier replay: "
                                "start from a fresh drive (ssdemu format, or serve --format)")
        self.dev, self.profile, self.model, self.quant = dev, profile, model, quant
        # dequant host: blocks come back as stored and this host dequantizes them
        self.host_dequant = bool(quant) and dequant == "host"
        self.delivered_bytes = stored if self.host_dequant else model.block_bytes
        self._stored = stored
        # a real model's KV of real text where the box has the model, else Gaussian values
        self.kv = RealKV(model, ids=ids) if model.name in REAL_MODELS else \
            SyntheticKV(model, ids=ids)
        self._number: dict[int, int] = {}  # hash id -> its block's place in the sequence
        # the blocks stored are read by the drive from the sequence where it lies
        self._sequence = dev.alloc(self.kv.values.nbytes)
        self.kv.place(self._sequence.view(np.uint16))
        bb = model.block_bytes
        self.nslots = max(MIN_SLOTS, min(SLOTS, SLOT_BYTES // bb))
        self._mem = dev.alloc(self.nslots * bb)
        self.slots = [self._mem[i * bb:(i + 1) * bb].view(np.uint16).reshape(self.kv.shape)
                      for i in range(self.nslots)]
        # the command using each slot: a store's Future, or a _Read (checked when it is
        # waited for)
        self._busy: list = [None] * self.nslots
        self._next = 0
        self._in_flight: deque = deque()  # quantized stores, oldest first (at most STORES)
        self._pending: dict = {}  # block id -> its last store or delete, maybe in flight
        self._deletes: list = []  # deletes sent since the last store
        self.track_stores = False  # admission control on: stores_in_flight is asked
        self._stores: list = []  # stores whose completion time is not read yet
        self._store_done: list = []  # completion times of stores (drive clock, ns), a heap
        n = int(np.prod(self.kv.shape))
        self._sample = (np.arange(0, n, SAMPLE_EVERY // 2)[:, None]
                        + np.arange(SAMPLE_RUN)).reshape(-1)
        self._sample = self._sample[self._sample < n]
        self._tolerance, self.quant_error = self._error_bound()
        self.expected: dict[int, int] = {}  # block id -> CRC-32 of the bytes it must read
        self.data_errors = 0
        self.verified = 0
        self.verified_exact = 0
        self.match_mismatches = 0
        self._matches: deque = deque()  # (prefix match in flight, the host's answer)
        self._base = self._counters_now()

    def room_blocks(self) -> int:
        """How many more of this replay's blocks the drive has room for: its free bytes in
        whole stored blocks (each rounded up to the store's unit) and its free index keys."""
        st = self.dev.log()["store"]
        per = -(-self._stored // st["block"]) * st["block"]
        return max(0, min(st["free_bytes"] // per, st["index_keys"] - st["keys"]))

    def _error_bound(self) -> tuple[float, dict | None]:
        """How far a dequantized element may lie from the stored one: four times the host's
        own largest error over ERROR_BLOCKS blocks spread over the sequence (synthetic
        blocks differ in their groups, not their spread; a real model's differ more: its
        first tokens are attention sinks); 0 without quantization.  Their relative L2 error
        is the report's quantization error."""
        if not self.quant:
            return 0.0, None
        worst, num, den = 0.0, 0.0, 0.0
        for b in np.linspace(0, self.kv.ids - 1, ERROR_BLOCKS).astype(np.int64):
            base = self.kv.window(int(b))
            back, _ = dequantize(quantize(base, "fp16", self.quant))
            diff = _f32(back) - _f32(base)
            worst = max(worst, float(np.abs(diff).max()))
            num += float(np.square(diff, dtype=np.float64).sum())
            den += float(np.square(_f32(base), dtype=np.float64).sum())
        return float(4 * worst + 1e-3), {"relative_l2": float(np.sqrt(num / max(den, 1e-30))),
                                         "max_abs": worst, "blocks": ERROR_BLOCKS}

    def _at(self, b: int) -> int:
        """Block b's place in the sequence: the next free one when b is new."""
        n = self._number.get(b)
        if n is None:
            n = self._number[b] = len(self._number)
        return n

    def _stamp(self, t_ns: int) -> None:
        self.dev.submit_time_ns = int(t_ns)

    def _slot(self) -> int:
        """A free registered block buffer (waiting for the command that used it last)."""
        i = self._next
        self._next = (i + 1) % self.nslots
        if self._busy[i] is not None:
            self._busy[i].result()
            self._busy[i] = None
        return i

    def _settle(self, ids) -> None:
        """Wait for the stores and deletes in flight of these blocks: the drive's state of
        them is then the one the replay's tiers describe."""
        for b in ids:
            f = self._pending.pop(b, None)
            if f is not None:
                f.result()

    def _track(self, b: int, f) -> None:
        self._pending[b] = f
        if len(self._pending) > 64 * self.nslots:  # forget the finished ones now and then
            for k in [k for k, f in self._pending.items() if f.done()]:
                self._pending.pop(k).result()

    def _drain(self) -> None:
        """Wait for every command in flight."""
        while self._matches:
            self._compare_match()
        self._settle(list(self._pending))
        for i, f in enumerate(self._busy):
            if f is not None:
                f.result()
                self._busy[i] = None
        while self._in_flight:
            self._in_flight.popleft().result()

    def match(self, t_ns: int, ids, expected: int) -> int:
        """The drive's own prefix match goes out, once the stores and deletes of these
        blocks sent before have completed, and the replay goes on with the host's LRU mirror
        of the drive (expected); the drive's answer is compared with it when it is back,
        and a difference (there must be none) counted.  Waiting for the answer here would
        wait for every compute command sent before it (the virtual clock books in fetch
        order): the media sat idle while the next stores waited for this host."""
        self._settle(ids)
        self._stamp(t_ns)
        self._matches.append((self.dev.prefix_match_async([drive_key(b) for b in ids]),
                              expected))
        while self._matches and (len(self._matches) > MATCHES or self._matches[0][0].done()):
            self._compare_match()
        return expected

    def _compare_match(self) -> None:
        f, expected = self._matches.popleft()
        self.match_mismatches += f.result() != expected

    def load(self, t_ns: int, ids) -> _Load:
        """The blocks read back, at once (in batches of the free slots); the result is their
        last completion on the drive's clock, known when the reads are back (each block is
        checked then, or when its slot is wanted again)."""
        self._settle(ids)
        self._stamp(t_ns)
        ids = list(ids)
        reads = []
        for at in range(0, len(ids), self.nslots):
            with self.dev.batch():
                for b in ids[at:at + self.nslots]:
                    i = self._slot()
                    r = self._busy[i] = _Read(self, b, i, self._get_async(b, i))
                    reads.append(r)
        return _Load(t_ns, reads)

    def _get_async(self, b: int, i: int):
        key = drive_key(b)
        if self.host_dequant:  # the compressed block as stored, into the slot's first bytes
            flat = self.slots[i].reshape(-1).view(np.uint8)
            return self.dev.kv_get_async(key, flat[:self._stored])
        if self.quant:
            return self.dev.kv_get_dequantized_async(key, self.slots[i])
        return self.dev.kv_get_async(key, self.slots[i].reshape(-1).view(np.uint8))

    def _check(self, b: int, out: np.ndarray) -> None:
        if self.host_dequant:  # what the GPU would do, here on the CPU
            compressed = out.reshape(-1).view(np.uint8)[:self._stored].copy()
            out = dequantize(compressed)[0].reshape(self.kv.shape)
        self.verified += 1
        got = out.reshape(-1)[self._sample]
        want = self.kv.sample(self._at(b), self._sample)
        ok = (np.abs(_f32(got) - _f32(want)).max() <= self._tolerance if self.quant
              else np.array_equal(got, want))
        if ok and b % EXACT_EVERY:
            return
        self.verified_exact += 1
        if not ok or zlib.crc32(out) != self._expected(b):
            self.data_errors += 1

    def _expected(self, b: int) -> int:
        crc = self.expected.get(b)
        if crc is None:
            block = self.kv.window(self._at(b))
            if self.quant:
                block, _ = dequantize(quantize(block, "fp16", self.quant))
            crc = self.expected[b] = zlib.crc32(np.ascontiguousarray(block))
        return crc

    def store(self, t_ns: int, ids) -> None:
        # the room the evictions before these stores free is the drive's once their deletes
        # complete (a freed extent is reused only after its record is committed)
        while self._deletes:
            self._deletes.pop().result()
        self._stamp(t_ns)
        for b in ids:
            key = drive_key(b)
            self._settle((b,))
            if self.quant:  # the firmware reads the block where it lies in the sequence
                if len(self._in_flight) == STORES:
                    self._in_flight.popleft().result()
                f = self.dev.kv_put_quantized_async(key, self.kv.window(self._at(b)), "fp16",
                                                     self.quant)
                self._in_flight.append(f)
            else:  # a value goes to the media by DMA: from a block-aligned slot
                i = self._slot()
                self.slots[i][...] = self.kv.window(self._at(b))
                f = self.dev.kv_put_async(key, self.slots[i].reshape(-1).view(np.uint8))
                self._busy[i] = f
            self._track(b, f)
            if self.track_stores:
                self._stores.append(f)
            self.expected.pop(b, None)

    def stores_in_flight(self, t_ns: int) -> int:
        """Stores not complete on the drive's clock at t_ns: each store's completion time is
        known once it has completed here, so this waits for the stores in flight (only with
        admission control on)."""
        for f in self._stores:
            f.result()
            heapq.heappush(self._store_done, f.device_ns)
        self._stores = []
        while self._store_done and self._store_done[0] <= t_ns:
            heapq.heappop(self._store_done)
        return len(self._store_done)

    def evict(self, ids) -> None:
        self._settle(ids)  # a block stored in this request may be among them
        with self.dev.batch():
            for b in ids:
                f = self.dev.kv_delete_async(drive_key(b))
                self._track(b, f)
                self._deletes.append(f)
                self.expected.pop(b, None)

    def _counters_now(self) -> dict:
        """The drive's books (COUNTERS: summed by the drive, as books() reads them) and,
        from the log page, this host's lag and the store's bytes."""
        c = self.dev.counters()
        page = self.dev.log()
        return {**{k: c[k] for k in BUSY_COUNTERS},
                "host_link_bytes": c["link_bytes"],
                "nand_bytes": c["nand_bytes_read"] + c["nand_bytes_written"],
                "host_lag": page["host_lag"] + sum(k["host_lag_calls"]
                                                   for k in page["compute"].values()),
                # what host_lag counts among: the drive's commands and its kernels' calls
                "host_lag_of": sum(c["commands"] for c in page["classes"].values())
                + sum(k["calls"] for k in page["compute"].values()),
                "logical_bytes": page["logical_bytes"], "physical_bytes": page["physical_bytes"],
                "busy_until_ns": c["busy_until_ns"]}

    def books(self) -> _Books:
        """The busy books once every command sent so far has booked them, less the
        replay's start: pending (result()).  The drive reads them at the command's turn in
        fetch order (COUNTERS), so a utilization sample waits for no command to complete
        (waiting for all of them, as counters() does, emptied the media's queue each time)."""
        return _Books(self.dev.counters_async(), self._base)

    def counters(self) -> dict:
        """The daemon's counters since this replay began (it may have served others)."""
        self._drain()
        now = self._counters_now()
        out = {k: now[k] - self._base[k] for k in now}
        out["logical_bytes"], out["physical_bytes"] = now["logical_bytes"], now["physical_bytes"]
        out["busy_until_ns"] = now["busy_until_ns"]  # a time on the clock, not a count
        return out


def replay_data(devs, requests, profile: Profile, model: ModelConfig, quant: str | None,
                capacities: dict, host_link_bytes_per_s: float = DEFAULT_HOST_LINK_BYTES_PER_S,
                progress=None, pool: str = "private", route: str = "round-robin",
                fabric: FabricSpec | None = None, dequant: str = "drive",
                gpu_dequant_bytes_per_s: float = DEFAULT_GPU_DEQUANT_BYTES_PER_S,
                store_when: str = "arrival", store_queue: int | None = None) -> dict:
    """Data mode on connected hostlib Devices: one, or one per serving instance (each a
    daemon of its own)."""
    devs = list(devs) if isinstance(devs, (list, tuple)) else [devs]
    requests = list(requests)
    if capacities["drive"] == 0:
        raise DataModeError("data mode needs a drive tier (its capacity is 0)")
    check_dequant(dequant, gpu_dequant_bytes_per_s)
    t0 = time.perf_counter()
    ids = max(1, len({b for r in requests for b in r.hash_ids}))
    drives = [DataDrive(dev, profile, model, quant, dequant, ids) for dev in devs]
    room = min(d.room_blocks() for d in drives)
    capacities = drive_capacity(capacities, room,
                                max((len(set(r.hash_ids)) for r in requests), default=0))
    first_ns = requests[0].timestamp_ms * 1e6 if requests else 0.0
    for dev in devs:
        # the trace's times stamp the drive's commands: a drive whose virtual clock is past
        # the first request (it served a replay before) would queue every command behind it
        now = dev.log()["model"]["horizon_ns"]
        if now > first_ns:
            raise DataModeError(
                f"the daemon's virtual clock is at {now / 1e9:.3f} s, past the trace's first "
                f"request at {first_ns / 1e9:.3f} s: data mode needs a drive that has not "
                "replayed before (start a fresh daemon, or use --media)")
    setup = {"instances": len(devs), "pool": pool, "route": route, "fabric": fabric,
             "dequant": dequant, "gpu_dequant_bytes_per_s": gpu_dequant_bytes_per_s,
             "store_when": store_when, "store_queue": store_queue}
    out = with_and_without("data", requests, profile, model, quant, capacities, drives, setup,
                           host_link_bytes_per_s, progress, t0)
    cs = [d.counters() for d in drives]
    out["data"] = {"blocks_verified": sum(d.verified for d in drives),
                   "blocks_verified_exact": sum(d.verified_exact for d in drives),
                   "data_errors": sum(d.data_errors for d in drives),
                   "match_mismatches": sum(d.match_mismatches for d in drives),
                   "drive_room_blocks": room,
                   "kv": drives[0].kv.describe(),
                   "quantization_error": drives[0].quant_error,
                   "logical_bytes": sum(c["logical_bytes"] for c in cs),
                   "physical_bytes": sum(c["physical_bytes"] for c in cs)}
    return out


def drive_capacity(capacities: dict, room: int, most: int) -> dict:
    """The capacities with the drive tier's in blocks (see the module's doc): room, the
    blocks the drive has room for at the start; most, the most blocks one request names."""
    fits = room - most
    asked = capacities["drive"]
    if asked is None:
        if fits < 1:
            raise DataModeError(
                f"the drive has room for {room:,} blocks of this model, and one request "
                f"stores up to {most:,} before its evictions: give it bigger media")
        return {**capacities, "drive": fits}
    if asked > fits:
        raise DataModeError(
            f"the drive tier's capacity is {asked:,} blocks, but the drive has room for "
            f"{room:,} of this model's blocks and one request stores up to {most:,} before "
            f"its evictions: give --capacity drive=blocks:{max(fits, 0)} or less, "
            "or bigger media")
    return capacities
