"""`ssdemu replay`: a KV-cache trace through the serving model and the drive, in virtual time.

One accounting loop (`replay`) drives one of two drives: `ModelDrive` (model mode: sizes
only, the timing model and the TOPS budget in this process) or `replay_data.DataDrive` (data
mode: real KV bytes through a running daemon with hostlib, so the drive really quantizes,
matches, stores and reads).  Both see the same commands at the same virtual times, so their
hit ratios are identical and their modelled times agree (tests/test_replay_data.py).

Hit accounting (exact): a request hits the longest run of its leading blocks present in a
tier; then all its blocks are inserted or touched in every tier, in order, most recent last;
each tier evicts by LRU over block counts.  Several tiers are inclusive: every block goes to
every tier with room, a hit block is served by the fastest tier whose leading run covers it
(HBM, then DRAM, then the drive), and nothing is promoted or demoted beyond that.  The drive's
run comes from the drive's own prefix match.  With only the drive (hbm=0, dram=0,
drive=unbounded) the Mooncake synthetic trace gives 0.640.

Per request at its arrival t, the drive sees, in order: a prefix match of the request's keys;
a retrieve of each block it serves (NAND read, then in-drive dequantization as the block
arrives); a quantized store of each block it does not hold (quantization and the NAND write,
in the background: nothing waits for them); a delete of each block its LRU evicts.

TTFT model: one GPU serves prefills first come, first served.  A request's prefill computes
the tokens of the blocks it missed at the model's prefill rate, starting when the GPU is free;
the blocks it hit load from its arrival on (DRAM over the host link, the drive's blocks when
its retrieves complete, queued behind the drive's other work), layer by layer, so loads
overlap the queueing and the prefill: the first token comes at max(start + prefill, arrival +
loads), and the GPU is busy until then.  Without the drive the same trace runs with the
drive's capacity at 0.

Options that change this, each off by default (docs/replay.md): several
serving instances with private or pooled drives (_Pool, ssdemu/replay/pool.py); blocks dequantized
on the GPU (dequant host); blocks entering the tiers when computed rather than at arrival;
a bounded queue of background stores.
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
import time
from collections import deque
from itertools import repeat

import numpy as np

from ssdemu.replay.pool import POOLS, ROUTES, Fabric, FabricSpec, HashRing
from ssdemu.replay.serving import BLOCK_TOKENS, TIERS, LRUTier, ModelConfig
from ssdemu.sim import _model
from ssdemu.sim.cost import (
    KERNEL_IDS,
    dequantize_cost,
    prefix_match_cost,
    quantize_cost,
)
from ssdemu.sim.profile import Profile
from ssdemu.sim.timing import DeviceModel, budget_of

DEFAULT_HOST_LINK_BYTES_PER_S = 50e9  # DRAM -> GPU over PCIe 5.0 x16
UTILIZATION_SAMPLES = 100  # points of the utilization-over-time series
# Requests whose drive loads may still be out while later requests' commands are sent: a
# request is accounted (its first token, when its KV exists) once its loads' completion
# times are known.  A data drive's reads then overlap the next requests' stores, as a
# serving engine's would (waiting for each request's reads left the media idle between
# requests).  Stores when computed, and pooled drives, need each load's time at once.
LOOKAHEAD = 64
# utilization samples whose books may still be out (a data drive's COUNTERS commands)
BOOKS_AHEAD = 8


def _now(t):
    """A value known (a number, a dict), or pending (its result())."""
    return t if isinstance(t, (int, float, dict)) else t.result()


ffi, lib = _model.ffi, _model.lib
PREFIX_MATCH = KERNEL_IDS["prefix_match"]


def _pcts(values) -> dict:
    a = np.asarray(values) if len(values) else np.zeros(1)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "mean": float(a.mean())}


class ModelDrive:
    """Model mode's drive: the timing model and the TOPS budget, on sizes alone.  Blocks get
    media slots in order of first store (4 KiB-aligned).  An unbounded drive has no FTL (no
    capacity pressure: an evicted block keeps its slot); a drive of `capacity_blocks` blocks
    is that much user capacity of the model's FTL: an evicted block's slot is trimmed and
    taken by the next new block, and GC runs as the drive fills."""

    def __init__(self, profile: Profile, model: ModelConfig, quant: str | None,
                 bulk_pages: int | None = None, dequant: str = "drive",
                 capacity_blocks: int | None = None, dram: bool = True, threads: int = 1):
        self.profile = profile
        self.dequant = dequant
        self.stored = model.stored_block_bytes(quant)
        # 4 KiB-aligned slots in order of first store: where a drive's FTL appends them
        # (data mode's daemon), so that both modes lay blocks out alike
        self.slot = -(-self.stored // 4096) * 4096
        self.bounded = capacity_blocks is not None
        self.device = DeviceModel(profile, bulk_pages=bulk_pages,
                                  ftl_bytes=capacity_blocks * self.slot if self.bounded else 0,
                                  dram=dram, threads=threads)
        self._free_slots: list[int] = []  # offsets evicted blocks gave back (bounded)
        self._slots = 0  # slots handed out
        self.budget = budget_of(profile)
        if dram:
            self.budget.share_dram(self.device)  # kernels, NAND and PCIe DMA share the DRAM
        self.scheme = quant or None
        self.raw = model.block_bytes
        self.elements = model.block_bytes // model.element_bytes
        self.offsets: dict[int, int] = {}
        self.track_stores = False  # admission control on: stores_in_flight is asked
        self._in_flight: list[float] = []  # completion times of the stores booked
        # every block has the same shape: its kernel costs are computed once (parsing the
        # scheme per block was a fifth of the replay)
        # what a load hands the host per block: dequantized, or as stored (dequant host)
        self.delivered_bytes = (self.stored if self.scheme and dequant == "host"
                                else self.raw)
        # the C recipes take the costs as structs (an unquantized drive charges nothing)
        self._dequant_c = self._quant_c = {"ops": 0, "bytes": 0}
        # a prefix match's cost per count of keys probed, as the C recipes take it, and the
        # charge's start (unused): built once, not per request
        self._match_c: dict[int, dict] = {}
        self._start = ffi.new("double *")
        if self.scheme:
            self.dequant_cost = dequantize_cost(self.elements, 2, self.scheme, self.stored)
            self.quant_cost = quantize_cost(self.elements, 2, self.scheme, self.stored)
            self._dequant_c, self._quant_c = self.dequant_cost.c(), self.quant_cost.c()

    def match(self, t_ns: int, ids, expected: int) -> int:
        probed = max(1, min(expected + 1, len(ids)))
        cost = self._match_c.get(probed)
        if cost is None:
            cost = self._match_c[probed] = prefix_match_cost(probed).c()
        lib.sde_budget_charge(self.budget.struct, PREFIX_MATCH, cost, t_ns, 0.0, self._start)
        return expected  # the host's LRU mirror is the drive's content

    def load(self, t_ns: int, ids) -> int:
        """Each block sensed, dequantized as it arrives, the result over the link (a plain
        read without quantization, or with dequant host: the compressed block is read as it
        is and the GPU dequantizes it).  The recipe is the daemon's (c/model/sde_recipe.c), a
        request's blocks in one call."""
        if not ids:
            return t_ns
        offs = ffi.new("uint64_t[]", list(map(self.offsets.__getitem__, ids)))
        in_drive = bool(self.scheme) and self.dequant == "drive"
        done = lib.sde_recipe_load_blocks(self.device.handle, self.budget.struct, t_ns, offs,
                                          len(ids), self.stored, self.raw, int(in_drive),
                                          self._dequant_c)
        return int(max(done, t_ns))

    def store(self, t_ns: int, ids) -> None:
        """Each block over the link as it is, quantized, the result programmed (in the
        background: nothing waits); the daemon's recipe (c/model/sde_recipe.c).  ids:
        distinct (_Pool.store's)."""
        if not ids:
            return
        offsets, free, slot = self.offsets, self._free_slots, self.slot
        offs = list(map(offsets.get, ids))
        if not free and offs.count(None) == len(offs):  # all new, slots in order (unbounded)
            offs = list(range(self._slots * slot, (self._slots + len(ids)) * slot, slot))
            self._slots += len(ids)
            offsets.update(zip(ids, offs, strict=True))
        else:
            for i, b in enumerate(ids):
                if offs[i] is None:
                    if free:
                        off = free.pop()
                    else:
                        off = self._slots * slot
                        self._slots += 1
                    offs[i] = offsets[b] = off
        done = ffi.new("double[]", len(offs))
        lib.sde_recipe_store_blocks(self.device.handle, self.budget.struct, t_ns,
                                    ffi.new("uint64_t[]", offs), len(offs), self.stored,
                                    self.raw, int(bool(self.scheme)), self._quant_c, done)
        if self.track_stores:
            for d in done:
                heapq.heappush(self._in_flight, d)

    def stores_in_flight(self, t_ns: int) -> int:
        """Stores booked and not yet complete at t_ns (programmed, or acknowledged)."""
        while self._in_flight and self._in_flight[0] <= t_ns:
            heapq.heappop(self._in_flight)
        return len(self._in_flight)

    def evict(self, ids) -> None:
        """An unbounded drive keeps evicted blocks' slots (nothing presses); a bounded one
        trims them (its FTL no longer relocates them) and gives them to new blocks."""
        if not self.bounded:
            return
        offs = [off for b in ids if (off := self.offsets.pop(b, None)) is not None]
        # one call for the request's evicted blocks, not one per block (~1% of a replay's
        # instructions under eviction: cachegrind, conversation trace, blocks:2000)
        self.device.trim_many(offs, self.stored)
        self._free_slots.extend(offs)

    def counters(self) -> dict:
        st = self.device.stats()
        return {"link_busy_ns": st["link_busy_ns"], "link_in_busy_ns": st["link_in_busy_ns"],
                "channel_busy_ns": st["channel_busy_ns"],
                "compute_busy_ns": float(sum(self.budget.busy_ns)),
                "host_link_bytes": st["link_bytes"],
                "nand_bytes": st["nand_bytes_read"] + st["nand_bytes_written"],
                "busy_until_ns": max(st["busy_until_ns"], *self.budget.busy_until_ns),
                # virtual time in this process: the host never lags
                "host_lag": 0, "host_lag_of": 0}

    def books(self) -> dict:
        """The busy books now (for a utilization sample)."""
        return self.counters()

    def ftl_report(self) -> dict | None:
        """The FTL of a bounded drive: its scale, write amplification, GC time, erases."""
        if not self.bounded:
            return None
        st = self.device.stats()
        return {"write_amplification": st["write_amplification"], "gc_ns": st["gc_ns"],
                "erases": st["erases"], "free_lines": st["ftl_free_lines"],
                "trimmed_bytes": st["trimmed_bytes"], "scale": self.device.ftl.as_dict()}


_BUSY = {"link_to_host": "link_busy_ns", "link_to_device": "link_in_busy_ns",
         "nand_channels": "channel_busy_ns", "compute": "compute_busy_ns"}
BUSY_COUNTERS = tuple(_BUSY.values())  # the counters a utilization sample reads


def _capacities(profile: Profile) -> dict:
    """Resources of each kind (busy time over span counts against that many)."""
    return {"link_to_host": 1, "link_to_device": 1, "nand_channels": profile.nand.channels,
            "compute": profile.compute.units}


def _with_link(u: dict) -> dict:
    # the link is full duplex: its utilization is the busier direction's
    return {"link": max(u["link_to_host"], u["link_to_device"]), **u}


def _utilization(profile: Profile, counters: dict, prev: dict, span_ns: float,
                 drives: int = 1) -> dict:
    """Busy time over available time; for several drives, their mean."""
    span_ns = max(span_ns, 1.0) * drives
    cap = _capacities(profile)
    return _with_link({k: (counters[c] - prev.get(c, 0.0)) / (cap[k] * span_ns)
                       for k, c in _BUSY.items()})


class UtilizationSeries:
    """Utilization per window of trace time, never above 1.  Work is booked on the model when
    its command arrives, so a window can book more busy time than its resources have (a
    burst of stores whose programs run for seconds after): each window serves at most its
    capacity of what is booked and waiting, and the rest waits for the next windows (work
    conserving, as the resources serve it); after the last arrival, windows go on until
    what was booked is served.  Pure: fed the drives' counters."""

    def __init__(self, profile: Profile, drives: int = 1):
        self.cap = {k: v * drives for k, v in _capacities(profile).items()}
        self.prev: dict = {}
        self.waiting = dict.fromkeys(_BUSY, 0.0)
        self.points: list = []

    def sample(self, t_s: float, counters: dict, window_ns: float) -> None:
        booked = {k: counters[c] - self.prev.get(c, 0.0) for k, c in _BUSY.items()}
        self.prev = dict(counters)
        self._serve(t_s, booked, window_ns)

    def _serve(self, t_s: float, booked: dict, window_ns: float) -> None:
        window_ns = max(window_ns, 1.0)
        u = {}
        for k, b in booked.items():
            avail = self.cap[k] * window_ns
            want = self.waiting[k] + b
            served = min(want, avail)
            self.waiting[k] = want - served
            u[k] = served / avail
        self.points.append((t_s, _with_link(u)))

    def drain(self, t_s: float, window_ns: float, most: int) -> None:
        """Windows after t_s until what was booked is served (at most `most` of them)."""
        window_ns = max(window_ns, 1.0)
        for i in range(most):
            if not any(v > 1e-9 * window_ns for v in self.waiting.values()):
                break
            self._serve(t_s + (i + 1) * window_ns / 1e9, dict.fromkeys(_BUSY, 0.0),
                        window_ns)


def _summed(parts) -> dict:
    """Drives' counters summed (times on the clock: the latest)."""
    if len(parts) == 1:
        return parts[0]
    out: dict = {}
    for c in parts:
        for k, v in c.items():
            out[k] = max(out.get(k, v), v) if k == "busy_until_ns" else out.get(k, 0) + v
    return out


def _counters(drives) -> dict:
    """The drives' counters summed, every command complete."""
    return _summed([d.counters() for d in drives])



class _Pool:
    """Where the replay's blocks live: one drive per instance (private: instance k's requests
    see drive k alone) or one store over all of them (pooled: a block lives on the drive its
    key hashes to, any instance hits it, and a block on another instance's drive crosses the
    fabric).  Each drive's tier is the host's LRU mirror of that drive."""

    def __init__(self, drives, capacity, pooled: bool, fabric: FabricSpec | None,
                 store_queue: int | None = None):
        self.drives = drives
        # admission control: at most this many stores in flight per drive; a store past
        # it is dropped (not stored, not in the drive's tier) and counted
        self.store_queue = store_queue
        for d in drives:
            d.track_stores = store_queue is not None
        self.dropped = 0
        self._dropped_now: set = set()
        self.tiers = [LRUTier(capacity) for _ in drives]
        self.pooled = pooled and len(drives) > 1
        self.ring = HashRing(len(drives))
        self.fabric = Fabric(len(drives), fabric or FabricSpec())

    def split(self, ids) -> dict[int, tuple[list, list]]:
        """Block ids by home drive, each with their positions in ids, in order."""
        out: dict[int, tuple[list, list]] = {}
        home = self.ring.home
        for i, b in enumerate(ids):
            part = out.get(h := home(b))
            if part is None:
                part = out[h] = ([], [])
            part[0].append(b)
            part[1].append(i)
        return out

    def holds(self, ids) -> list[int]:
        """How much of the request each instance would serve from its own drive: the leading
        run there (private), or the blocks of the pool's leading run homed there (pooled)."""
        if not self.pooled:
            return [t.leading_run(ids) for t in self.tiers]
        held = [0] * len(self.drives)
        for b in ids[:self.leading_run(ids)]:
            held[self.ring.home(b)] += 1
        return held

    def leading_run(self, ids) -> int:
        run = 0
        for b in ids:
            if b not in self.tiers[self.ring.home(b)]:
                break
            run += 1
        return run

    def match(self, k: int, t_ns: int, ids) -> int:
        if not self.pooled:
            return self.drives[k].match(t_ns, ids, self.tiers[k].leading_run(ids))
        # every drive holding some of the keys matches its share; the pool's run ends at the
        # first key one of them lacks
        run = len(ids)
        for j, (sub, pos) in self.split(ids).items():
            got = self.drives[j].match(t_ns, sub, self.tiers[j].leading_run(sub))
            if got < len(sub):
                run = min(run, pos[got])
        return run

    def load(self, k: int, t_ns: int, ids):
        """When the request's blocks have arrived: a time, or pending (a private drive's
        reads still out: its result())."""
        if not self.pooled:
            return self.drives[k].load(t_ns, ids)
        done = t_ns
        for j, (sub, _) in self.split(ids).items():
            d = _now(self.drives[j].load(t_ns, sub))
            done = max(done, self.fabric.move(j, k, d, len(sub) * self.drives[j].delivered_bytes))
        return int(done)

    def _admit(self, j: int, t_ns: int, sub: list) -> list:
        if self.store_queue is None:
            return sub
        room = max(0, self.store_queue - self.drives[j].stores_in_flight(t_ns))
        self._dropped_now.update(sub[room:])
        self.dropped += len(sub[room:])
        return sub[:room]

    def store(self, k: int, t_ns: int, ids, raw: int) -> None:
        self._dropped_now = set()
        if not self.pooled:
            held = self.tiers[k].blocks  # the dict itself: `in` on the tier is a call
            new = [b for b in dict.fromkeys(ids) if b not in held]
            new = self._admit(k, t_ns, new) if new else new
            if new:
                self.drives[k].store(t_ns, new)
            return
        new = [b for b in dict.fromkeys(ids) if b not in self.tiers[self.ring.home(b)]]
        for j, (sub, _) in self.split(new).items():
            sub = self._admit(j, t_ns, sub)
            if not sub:
                continue
            # the bytes cross the fabric (its NICs booked, its bytes counted); the drive
            # books the store at the request's arrival all the same, since a drive takes its
            # commands in time order: a background write at most one transfer early
            self.fabric.move(k, j, t_ns, len(sub) * raw)
            self.drives[j].store(t_ns, sub)

    def refresh(self, k: int, ids) -> None:
        """Touch the blocks the drives hold, insert none (store-when computed, at arrival)."""
        if not self.pooled:
            self.tiers[k].refresh(ids)
            return
        for j, (sub, _) in self.split(ids).items():
            self.tiers[j].refresh(sub)

    def touch(self, k: int, ids) -> int:
        """Insert or touch the request's blocks (but those the last store() dropped);
        evicted blocks are deleted from their drives.  Returns how many were evicted."""
        if self._dropped_now:
            ids = [b for b in ids if b not in self._dropped_now]
        if not self.pooled:
            parts = {k: (ids, None)}
        else:
            parts = self.split(ids)
        n = 0
        for j, (sub, _) in parts.items():
            evicted = self.tiers[j].touch_all(sub)
            if evicted:
                self.drives[j].evict(evicted)
                n += len(evicted)
        return n


def replay(requests, profile: Profile, model: ModelConfig, capacities: dict, drives,
           host_link_bytes_per_s: float = DEFAULT_HOST_LINK_BYTES_PER_S,
           progress=None, instances: int = 1, pool: str = "private",
           route: str = "round-robin", fabric: FabricSpec | None = None,
           gpu_dequant_bytes_per_s: float | None = None, store_when: str = "arrival",
           store_queue: int | None = None) -> dict:
    """The accounting loop over a list of requests.  drives: one per instance (ModelDrive or
    DataDrive), or None (no drive).  instances: serving instances, each with its own GPU and
    its own HBM and DRAM tiers; request i goes to instance i mod K (route round-robin) or to
    the one holding most of its prefix (route prefix; ties in round-robin order).  pool:
    private or pooled drives (_Pool).  gpu_dequant_bytes_per_s: the drive's blocks arrive
    compressed and the GPU dequantizes them at this rate (of fp16 output), busy meanwhile
    (dequant host); None: they arrive dequantized.  store_when: a request's blocks enter
    the tiers and the drive at its arrival (today's exact hit accounting; hits on KV its
    computing request has not finished yet are counted) or when computed, from its first
    token on (hit blocks are touched at arrival).  store_queue: admission control, at most
    this many stores in flight per drive (_Pool).  progress: called with the number of
    requests done, now and then."""
    if store_when not in STORE_WHEN:
        raise ValueError(f"store_when must be one of {', '.join(STORE_WHEN)}, got "
                         f"{store_when!r}")
    if store_queue is not None and store_queue < 1:
        raise ValueError(f"the store queue holds at least one store, got {store_queue}")
    if pool not in POOLS or route not in ROUTES:
        raise ValueError(f"pool must be one of {POOLS} and route one of {ROUTES}")
    if drives is not None and len(drives) != instances:
        raise ValueError(f"{len(drives)} drives for {instances} instances")
    store = (_Pool(drives, capacities["drive"], pool == "pooled", fabric, store_queue)
             if drives is not None else None)
    loop = _ReplayLoop(requests, profile, model, capacities, drives, store, instances, route,
                       host_link_bytes_per_s, gpu_dequant_bytes_per_s, store_when)
    for i, req in enumerate(requests):
        loop.request(i, req)
        if progress is not None and (i & 63) == 63:
            progress(i + 1)
    out = loop.finish()
    if progress is not None:
        progress(len(requests))
    return out


class _ReplayLoop:
    """replay()'s state: the instances' tiers and GPUs, the pool of drives, the blocks' KV
    times, the figures gathered; one request at a time, in arrival order."""

    def __init__(self, requests, profile, model, capacities, drives, store, K, route,
                 host_link_bytes_per_s, gpu_dequant_bytes_per_s, store_when):
        self.profile, self.drives, self.store, self.K, self.route = (profile, drives, store,
                                                                     K, route)
        self.model, self.raw = model, model.block_bytes
        self.host_link_bytes_per_s = host_link_bytes_per_s
        self.gpu_dequant_bytes_per_s = gpu_dequant_bytes_per_s
        self.store_when = store_when
        self.tiers = [{t: LRUTier(capacities[t]) for t in ("hbm", "dram")} for _ in range(K)]
        self.computed_at: dict[int, float] = {}  # block -> when its KV exists (s)
        self.uncomputed_hits = 0
        self.pending: list = []  # store-when computed: (time s, order, instance, blocks)
        self.submitted_ns = 0
        self.samples: deque = deque()  # utilization samples taken, not yet fed to util
        # requests issued, not yet accounted (store when computed: none; see LOOKAHEAD)
        self.unaccounted: deque = deque()
        self.lookahead = LOOKAHEAD if store_when == "arrival" else 0
        self.gpu_free = [0.0] * K
        self.hits = {t: 0 for t in TIERS}
        self.blocks_total = self.hit_blocks = self.tokens_saved = 0
        self.ttft, self.load_ns, self.timeline = [], [], []
        self.util = UtilizationSeries(profile, K)
        self.per = [{"requests": 0, "blocks": 0, "hit_blocks": 0, "ttft": []}
                    for _ in range(K)]
        self.span_ns = ((requests[-1].timestamp_ms - requests[0].timestamp_ms) * 1e6
                        if requests else 0)
        self.window = max(self.span_ns / UTILIZATION_SAMPLES, 1.0)
        self.t0_ns = requests[0].timestamp_ms * 1e6 if requests else 0
        self.next_sample = self.t0_ns + self.window
        self.t_ns = self.t0_ns
        self.evictions = {t: 0 for t in TIERS}

    def enter(self, k: int, at_ns: int, ids) -> None:
        """The request's blocks into instance k's tiers and the drives, at at_ns."""
        store = self.store
        if store is not None:
            store.store(k, at_ns, ids, self.raw)
        for name in ("hbm", "dram"):
            self.evictions[name] += len(self.tiers[k][name].touch_all(ids))
        if store is not None:
            self.evictions["drive"] += store.touch(k, ids)
            store.fabric.forget_before(at_ns)

    def enter_pending(self, until_ns: int | None) -> None:
        pending = self.pending
        while pending and (until_ns is None or pending[0][0] * 1e9 <= until_ns):
            when_s, _, k, ids = heapq.heappop(pending)
            # in time order, never after the request that comes next (rounding)
            at_ns = max(self.submitted_ns, int(when_s * 1e9))
            if until_ns is not None:
                at_ns = min(at_ns, until_ns)
            self.submitted_ns = at_ns
            self.enter(k, at_ns, ids)

    def account(self, k, t, t_ns, ids, h, prefill_s, load_s, drive_done, dequant_s,
                last_dequant_s) -> None:
        """A request's first token and its KV's time, in arrival order, once its loads'
        completion is known."""
        if drive_done is not None:
            done = _now(drive_done)
            self.load_ns.append(done - t_ns)
            load_s = max(load_s, (done - t_ns) / 1e9)
        # the loads began at arrival (the drive was asked then), the prefill when the GPU
        # is free; the first token needs both.  Blocks that arrive compressed are dequantized
        # on the GPU as they arrive (its time added to the prefill's), the last one after it
        # has arrived
        gpu_free = self.gpu_free
        start = max(t, gpu_free[k])
        gpu_free[k] = max(start + prefill_s + dequant_s, t + load_s + last_dequant_s)
        self.ttft.append(gpu_free[k] - t)
        q = self.per[k]
        q["requests"] += 1
        q["blocks"] += len(ids)
        q["hit_blocks"] += h
        q["ttft"].append(gpu_free[k] - t)
        # the missed blocks' KV exists from the first token on (if another request is
        # computing one already, from whichever finishes first)
        computed_at = self.computed_at
        get = computed_at.get
        if h:  # hits whose KV is computed after t (t < its time), counted without a loop here
            self.uncomputed_hits += sum(map(t.__lt__, map(get, ids[:h], repeat(0.0))))
        done, missed = gpu_free[k], ids[h:]
        # each missed block's KV exists at `done`, but where another request computes it
        # from after t to no later than done (min(c, done) is c): kept, as it was
        kept = [(b, c) for b, c in zip(missed, map(get, missed), strict=True)
                if c is not None and t < c <= done]
        computed_at.update(zip(missed, repeat(done)))
        if kept:
            computed_at.update(kept)

    def take_sample(self) -> None:
        t_s, parts, window_ns = self.samples.popleft()
        self.util.sample(t_s, _summed([_now(p) for p in parts]), window_ns)

    def serve(self, k: int, t_ns: int, ids):
        """The request's blocks from instance k's tiers, fastest first: (blocks hit, DRAM
        load s, GPU dequantization s, its last block's, the drive's load or None)."""
        inst, store, raw = self.tiers[k], self.store, self.raw
        runs = {name: inst[name].leading_run(ids) for name in ("hbm", "dram")}
        runs["drive"] = store.match(k, t_ns, ids) if store is not None else 0
        served = 0
        load_s = dequant_s = last_dequant_s = 0.0
        drive_done = None
        for name in TIERS:  # fastest first
            n = runs[name] - served
            if n <= 0:
                continue
            if name == "dram":
                load_s = max(load_s, n * raw / self.host_link_bytes_per_s)
            elif name == "drive":
                drive_done = store.load(k, t_ns, ids[served:runs[name]])
                if self.gpu_dequant_bytes_per_s:
                    last_dequant_s = raw / self.gpu_dequant_bytes_per_s
                    dequant_s = n * last_dequant_s
            self.hits[name] += n
            served = runs[name]
        return served, load_s, dequant_s, last_dequant_s, drive_done

    def request(self, i: int, req) -> None:
        t = req.timestamp_ms / 1000.0
        t_ns = self.t_ns = req.timestamp_ms * 1_000_000
        if self.pending:
            self.enter_pending(t_ns)
        self.submitted_ns = t_ns
        store = self.store
        if store is not None and t_ns >= self.next_sample:
            self.samples.append((t, [d.books() for d in self.drives],
                                 t_ns - (self.next_sample - self.window)))
            if len(self.samples) > BOOKS_AHEAD:
                self.take_sample()
            self.next_sample = t_ns + self.window
        ids = req.hash_ids
        k = i % self.K
        if self.route == "prefix" and self.K > 1:
            k = _route_prefix(self.tiers, store, ids, i, self.K)
        h, load_s, dequant_s, last_dequant_s, drive_done = self.serve(k, t_ns, ids)
        self.blocks_total += len(ids)
        self.hit_blocks += h
        saved = min(h * BLOCK_TOKENS, req.input_length)
        self.tokens_saved += saved
        prefill_s = (req.input_length - saved) / self.model.prefill_tokens_per_s
        self.unaccounted.append((k, t, t_ns, ids, h, prefill_s, load_s, drive_done,
                                 dequant_s, last_dequant_s))
        if self.store_when == "arrival":
            if len(self.unaccounted) > self.lookahead:
                self.account(*self.unaccounted.popleft())
            self.enter(k, t_ns, ids)
        else:
            self.account(*self.unaccounted.popleft())
            for name in ("hbm", "dram"):
                self.tiers[k][name].refresh(ids)
            if store is not None:
                store.refresh(k, ids)
            heapq.heappush(self.pending, (self.gpu_free[k], i, k, ids))
        self.timeline.append((t, h, len(ids)))  # arrival (s), blocks hit, blocks

    def finish(self) -> dict:
        while self.unaccounted:
            self.account(*self.unaccounted.popleft())
        self.enter_pending(None)  # the last requests' KV, computed after the last arrival
        store, total = self.store, self.blocks_total
        out = {
            "blocks": total, "hit_blocks": self.hit_blocks,
            "hits_on_uncomputed_kv": self.uncomputed_hits,
            "stores_dropped": store.dropped if store is not None else 0,
            "block_hit_ratio": self.hit_blocks / total if total else 0.0,
            "tier_hit_ratio": {t: self.hits[t] / total if total else 0.0 for t in TIERS},
            "prefill_tokens_saved": self.tokens_saved,
            "ttft": self.ttft, "timeline": self.timeline, "drive_load_ns": self.load_ns,
            "evictions": self.evictions, "per_instance": self.per,
            "fabric_bytes": store.fabric.bytes if store is not None else 0,
        }
        if store is not None:
            out["drive"] = self._drive_report()
        return out

    def _drive_report(self) -> dict:
        while self.samples:
            self.take_sample()
        c = _counters(self.drives)
        t_ns, window = self.t_ns, self.window
        self.util.sample(t_ns / 1e9, c, t_ns - (self.next_sample - window))
        self.util.drain(t_ns / 1e9, window, UTILIZATION_SAMPLES)
        # over the span in which the work ran: stores booked near the end of the trace run
        # past its last arrival (divided by the trace's span alone, utilization read > 1)
        work_ns = max(self.span_ns, c["busy_until_ns"] - self.t0_ns)
        return {"host_link_bytes": c["host_link_bytes"], "nand_bytes": c["nand_bytes"],
                "host_lag": c["host_lag"], "host_lag_of": c["host_lag_of"],
                "utilization": _utilization(self.profile, c, {}, work_ns, self.K),
                "utilization_span_s": work_ns / 1e9,
                "utilization_over_time": self.util.points,
                # a bounded model-mode drive's FTL, per drive (None: unbounded)
                "ftl": [d.ftl_report() for d in self.drives if hasattr(d, "ftl_report")]}


def _route_prefix(tiers, store, ids, i: int, K: int) -> int:
    """The instance holding the most of the request's prefix (its HBM and DRAM leading runs,
    and what it would serve from its own drive), as Mooncake's scheduler routes; ties go in
    round-robin order from i mod K."""
    on_drive = store.holds(ids) if store is not None else [0] * K
    best, best_held = i % K, -1
    for step in range(K):
        k = (i + step) % K
        held = max(tiers[k]["hbm"].leading_run(ids), tiers[k]["dram"].leading_run(ids),
                   on_drive[k])
        if held > best_held:
            best, best_held = k, held
    return best


def offered_gpu_load(requests, model: ModelConfig) -> float:
    """The prefill work the trace offers a GPU with no cache at all, over the trace's span:
    above 1 the no-drive baseline's queue grows without bound."""
    if len(requests) < 2:
        return 0.0
    span_s = (requests[-1].timestamp_ms - requests[0].timestamp_ms) / 1000.0
    work_s = sum(r.input_length for r in requests) / model.prefill_tokens_per_s
    return work_s / span_s if span_s > 0 else float("inf")


def _per_instance(with_drive: dict, without: dict) -> list[dict]:
    out = []
    for a, b in zip(with_drive["per_instance"], without["per_instance"], strict=True):
        out.append({"requests": a["requests"], "blocks": a["blocks"],
                    "hit_blocks": a["hit_blocks"],
                    "block_hit_ratio": a["hit_blocks"] / a["blocks"] if a["blocks"] else 0.0,
                    "ttft_s": {"with_drive": _pcts(a["ttft"]),
                               "without_drive": _pcts(b["ttft"])}})
    return out


def report(mode: str, requests, profile: Profile, model: ModelConfig, quant: str | None,
           capacities: dict, with_drive: dict, without: dict, wall: float,
           pool: dict | None = None) -> dict:
    """The JSON report of a replay (both modes).  pool: the setup (instances, pool, route,
    fabric, dequant, gpu_dequant_bytes_per_s)."""
    drive = with_drive.get("drive", {
        "host_link_bytes": 0, "nand_bytes": 0, "host_lag": 0, "host_lag_of": 0,
        "utilization_over_time": [],
        "utilization": {"link": 0.0, "link_to_host": 0.0, "link_to_device": 0.0,
                        "nand_channels": 0.0, "compute": 0.0},
        "utilization_span_s": 0.0})
    offered = offered_gpu_load(requests, model) / len(with_drive["per_instance"])
    warnings = []
    if offered > 1:
        warnings.append(f"the no-drive baseline's GPU is offered {offered:.2f} of its prefill "
                        "capacity: its queue grows without bound, so TTFT without the drive is "
                        "that of an overloaded GPU (a higher --prefill-rate compares against "
                        "a GPU that keeps up)")
    return {
        "mode": mode, "profile": profile.name, "model": model.name, "quant": quant,
        "requests": len(requests), "blocks": with_drive["blocks"],
        "prefill_tokens_per_s": model.prefill_tokens_per_s,
        "capacity_blocks": {t: capacities[t] for t in TIERS},
        "block_hit_ratio": with_drive["block_hit_ratio"],
        "tier_hit_ratio": with_drive["tier_hit_ratio"],
        "evictions": with_drive["evictions"],
        "prefill_tokens_saved": with_drive["prefill_tokens_saved"],
        "host_link_bytes": drive["host_link_bytes"], "nand_bytes": drive["nand_bytes"],
        "compression_ratio": model.block_bytes / model.stored_block_bytes(quant),
        "ttft_s": {"with_drive": _pcts(with_drive["ttft"]),
                   "without_drive": _pcts(without["ttft"])},
        "drive_load_ms": {k: v / 1e6 for k, v in _pcts(with_drive["drive_load_ns"]).items()},
        "drive_utilization": drive["utilization"],
        "drive_utilization_span_s": drive["utilization_span_s"],
        "baseline_gpu_offered_load": offered,
        "instances": len(with_drive["per_instance"]),
        "pool": (pool or {}).get("pool", "private"),
        "route": (pool or {}).get("route", "round-robin"),
        "dequant": (pool or {}).get("dequant", "drive"),
        "store_when": (pool or {}).get("store_when", "arrival"),
        "hits_on_uncomputed_kv": with_drive["hits_on_uncomputed_kv"],
        "uncomputed_hit_fraction": (with_drive["hits_on_uncomputed_kv"]
                                    / with_drive["hit_blocks"] if with_drive["hit_blocks"]
                                    else 0.0),
        "store_queue": (pool or {}).get("store_queue"),
        "stores_dropped": with_drive["stores_dropped"],
        "gpu_dequant_bytes_per_s": (pool or {}).get("gpu_dequant_bytes_per_s"),
        "fabric_bytes": with_drive["fabric_bytes"],
        "fabric": dataclasses.asdict((pool or {}).get("fabric") or FabricSpec()),
        "drive_ftl": [f for f in drive.get("ftl") or [] if f] or None,
        "per_instance": _per_instance(with_drive, without),
        "warnings": warnings,
        "host_lag": drive["host_lag"], "host_lag_of": drive["host_lag_of"],
        "wall_seconds": wall, "requests_per_s": len(requests) / wall if wall else 0.0,
        "blocks_per_s": with_drive["blocks"] / wall if wall else 0.0,
        # the series behind --plot
        "series": {"hit_ratio": with_drive["timeline"],
                   "ttft_with_drive": with_drive["ttft"],
                   "ttft_without_drive": without["ttft"],
                   "utilization": drive["utilization_over_time"]},
    }


DEQUANTS = ("drive", "host")
STORE_WHEN = ("arrival", "computed")
# dequant host: the GPU's dequantization rate, in bytes of fp16 output per second.  A
# dequantization kernel moves ~2.5 bytes of HBM per output byte (the compressed input, the
# fp16 output); an H100's HBM3 (3.35 TB/s, NVIDIA's datasheet) bounds it near 1.3 TB/s; half
# of that, for kernels that do not reach the bound
DEFAULT_GPU_DEQUANT_BYTES_PER_S = 650e9


def replay_model(requests, profile: Profile, model: ModelConfig, quant: str | None,
                 capacities: dict, host_link_bytes_per_s: float = DEFAULT_HOST_LINK_BYTES_PER_S,
                 bulk_pages: int | None = None, progress=None, instances: int = 1,
                 pool: str = "private", route: str = "round-robin",
                 fabric: FabricSpec | None = None, dequant: str = "drive",
                 gpu_dequant_bytes_per_s: float = DEFAULT_GPU_DEQUANT_BYTES_PER_S,
                 store_when: str = "arrival", store_queue: int | None = None,
                 dram: bool = True, threads: int = 1) -> dict:
    """Model mode.  bulk_pages: the timing model's bulk threshold (DeviceModel; 0: page by
    page).  dram: model the controller's DRAM (False: as the virtual-clock daemon, for
    comparisons with data mode).  instances, pool, route, fabric: as replay().  dequant:
    where the drive's blocks are dequantized, in the drive or on the GPU (host) at
    gpu_dequant_bytes_per_s.  threads: 2 lets the drive's timing model book half of a
    request's dies on a helper thread (identical figures; DeviceModel)."""
    check_dequant(dequant, gpu_dequant_bytes_per_s)
    requests = list(requests)
    t0 = time.perf_counter()
    # several drives would each start a helper, all spinning on the same two cores
    threads = threads if instances == 1 else 1
    drives = ([ModelDrive(profile, model, quant, bulk_pages, dequant, capacities["drive"], dram,
                          threads) for _ in range(instances)]
              if capacities["drive"] != 0 else None)
    setup = {"instances": instances, "pool": pool, "route": route, "fabric": fabric,
             "dequant": dequant, "gpu_dequant_bytes_per_s": gpu_dequant_bytes_per_s,
             "store_when": store_when, "store_queue": store_queue}
    return with_and_without("model", requests, profile, model, quant, capacities, drives,
                            setup, host_link_bytes_per_s, progress, t0)


def with_and_without(mode: str, requests, profile: Profile, model: ModelConfig,
                     quant: str | None, capacities: dict, drives, setup: dict,
                     host_link_bytes_per_s: float, progress, t0: float) -> dict:
    """Both modes' replay: the trace with the drives, then without any, and the report.
    setup: instances, pool, route, fabric, dequant, gpu_dequant_bytes_per_s, store_when,
    store_queue."""
    setup = dict(setup)
    dequant = setup.pop("dequant")
    gpu_rate = setup.pop("gpu_dequant_bytes_per_s")
    gpu = gpu_rate if quant and dequant == "host" else None
    store_queue = setup.pop("store_queue")
    # the accounting loop makes millions of short-lived objects and no cycles: the cyclic
    # collector's passes over them were 4% of a replay
    collecting = gc.isenabled()
    gc.disable()
    try:
        with_drive = replay(requests, profile, model, capacities, drives,
                            host_link_bytes_per_s, progress, gpu_dequant_bytes_per_s=gpu,
                            store_queue=store_queue, **setup)
        without = replay(requests, profile, model, capacities, None, host_link_bytes_per_s,
                         **setup)
    finally:
        if collecting:
            gc.enable()
    return report(mode, requests, profile, model, quant, capacities, with_drive, without,
                  time.perf_counter() - t0,
                  setup | {"dequant": dequant, "gpu_dequant_bytes_per_s": gpu,
                           "store_queue": store_queue})


def check_dequant(dequant: str, gpu_dequant_bytes_per_s: float) -> None:
    if dequant not in DEQUANTS:
        raise ValueError(f"dequant must be one of {', '.join(DEQUANTS)}, got {dequant!r}")
    if not gpu_dequant_bytes_per_s > 0:
        raise ValueError(f"the GPU's dequantization rate must be positive, got "
                         f"{gpu_dequant_bytes_per_s}")
