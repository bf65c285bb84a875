"""The drive's times checked against something other than the model that computes them.

An idle star2000d on the virtual clock runs a quantized store, a TOPK_PAGES and an ATTEND;
their device times and the books COUNTERS reads must equal what is worked out here by hand:
the profile's figures copied below (not loaded: a changed profile must fail here), the
kernels' costs restated from docs/cost-model.md, and the stages of each command (the
controller, the link, the NAND dies and channels, the controller's DRAM, the compute units)
booked on a small model of idle resources written for this file.  A wrong booking in c/model
or c/model/sde_budget.c, or a cost row or profile figure changed by 10%, fails it (shown
when it was written, each alone: the int kinds' 8 vector ops per element made 9, the
score's 2 bytes per query element made 3, TOPS 8 made 8.8, the link's 14 GB/s made 15.4,
the DRAM's 64 GB/s made 70.4, t_read 30 us made 33).  The two shapes make each resource
bind somewhere: a wide GQA group the MAC array, one query head per KV head the DRAM."""

from __future__ import annotations

import math

import numpy as np
import pytest

import hostlib
from firmware import blockfmt
from ssdemu.device.media import open_media
from ssdemu.device.store import Store
from ssdemu.tools.daemon_process import DaemonProcess

# ssdemu/sim/profiles/star2000d.yaml, copied by hand
LINK_BYTES_PER_NS = 14.0  # host_link.bandwidth_bytes_per_s 14e9
LINK_LATENCY = 1000.0
CHANNELS, DIES, PLANES, PAGE = 16, 32, 4, 16384
ROW = PAGE * PLANES  # a die senses its planes' pages at once: rows stripe over the channels
T_READ = 30000.0
CHANNEL_BYTES_PER_NS = 1.1
CORES, COMMAND_OVERHEAD, READ_LATENCY = 4, 952.4, 21500.0
TOPS, UNITS, CORE_OPS_PER_NS, LANES = 8, 4, 8.2, 8
DRAM_BYTES_PER_NS = 64.0  # compute.memory_bytes_per_s 64e9

MAC_OPS_PER_NS = TOPS * 1e3 / UNITS  # per unit: a MAC counts two of them
SUBMIT = 1_000_000  # the client's virtual submission time (ns)


# -- the kernels' costs (docs/cost-model.md), restated --------------------------------------

def groups(elements: int, group: int) -> int:
    return -(-elements // group)


def quantize_int_with_summaries(elements: int, group: int, stored: int, summaries: int) -> dict:
    """An int scheme's quantize (8 vector ops per element, 6 per group), then the page
    summaries from the stored keys: the keys dequantized (4 per element, 1 per group),
    summarized (3 per 16-bit key element, 1 per min-max pair), the block's checksum again (1
    per 8 bytes)."""
    keys = elements // 2
    body = stored - summaries
    vector = (8 * elements + 6 * groups(elements, group)
              + 4 * keys + groups(keys, group)
              + 3 * keys + summaries // 2
              + stored // 8)
    nbytes = (2 * elements + body) + (2 * keys + body // 2) + (2 * keys + summaries) + stored
    return {"vector": vector, "bytes": nbytes}


def score(pages: int, group: int, dim: int) -> dict:
    qh = group  # one KV head per call
    summaries = pages * 2 * dim * 2  # fp16 min and max per page and channel
    return {"mac": 2 * pages * qh * dim, "vector": pages * qh + 2 * qh * dim,
            "bytes": summaries + qh * dim * 2 + pages * 4}


def topk(candidates: int, k: int) -> dict:
    k = min(k, candidates)
    levels = math.ceil(math.log2(k)) if k > 1 else 1
    inserts = min(candidates, k * (1 + math.log(candidates / k)))
    return {"scalar": 3 * candidates + math.ceil(8 * inserts * levels),
            "bytes": 8 * candidates + 8 * k}


def attend(tokens: int, group: int, dim: int) -> dict:
    return {"mac": 2 * tokens * group * dim, "vector": 12 * tokens * group + 2 * group * dim,
            "bytes": tokens * dim * 4 + group * (dim * 4 + 4)}


def compute_ns(c: dict) -> float:
    return (c.get("scalar", 0) / CORE_OPS_PER_NS + c.get("vector", 0) / (CORE_OPS_PER_NS * LANES)
            + 2 * c.get("mac", 0) / MAC_OPS_PER_NS)


# -- idle resources, booked in turn ----------------------------------------------------------

class Resource:
    """Busy intervals; a stage takes the first gap at or after it is ready that holds it."""

    def __init__(self):
        self.busy: list[tuple[float, float]] = []

    @property
    def free(self) -> float:
        return max((e for _, e in self.busy), default=0.0)

    def hold(self, ready: float, duration: float) -> float:
        start = ready
        for s, e in sorted(self.busy):
            if start + duration <= s:
                break
            start = max(start, e)
        self.busy.append((start, start + duration))
        return start + duration


class Drive:
    """What one command books on an idle star2000d."""

    def __init__(self, dram: bool):
        self.cores = [Resource() for _ in range(CORES)]
        self.link_in, self.link_out, self.dram = Resource(), Resource(), Resource()
        self.dies, self.channels = {}, {}
        self.units = [0.0] * UNITS  # the compute units' busy-until
        self.has_dram = dram  # the retrieval worker's model shares it with its kernels
        self.busy = {"link_in": 0.0, "compute": 0.0}

    def controller(self, t: float) -> float:
        core = min(self.cores, key=lambda r: r.free)
        return core.hold(t, COMMAND_OVERHEAD)

    def through_dram(self, t: float, nbytes: int) -> float:
        return self.dram.hold(t, nbytes / DRAM_BYTES_PER_NS) if self.has_dram else t

    def receive(self, t: float, nbytes: int) -> float:
        t = self.controller(t)
        self.busy["link_in"] += nbytes / LINK_BYTES_PER_NS
        arrived = self.link_in.hold(t, nbytes / LINK_BYTES_PER_NS)
        return max(arrived, self.through_dram(t, nbytes))

    def sense(self, t: float, offset: int, nbytes: int) -> float:
        t = self.controller(t) + READ_LATENCY
        done = t
        for r in range(offset // ROW, (offset + nbytes - 1) // ROW + 1):
            part = min(offset + nbytes, (r + 1) * ROW) - max(offset, r * ROW)
            ch = r % CHANNELS
            die = (ch, (r // CHANNELS) % DIES)
            sensed = self.dies.setdefault(die, Resource()).hold(t, T_READ)
            moved = self.channels.setdefault(ch, Resource()).hold(sensed,
                                                                  part / CHANNEL_BYTES_PER_NS)
            done = max(done, moved)
        return max(done, self.through_dram(t, nbytes))

    def transfer(self, t: float, nbytes: int) -> float:
        over = self.link_out.hold(t, nbytes / LINK_BYTES_PER_NS)
        return max(over, self.through_dram(t, nbytes)) + LINK_LATENCY

    def kernel(self, t: float, cost: dict) -> float:
        u = min(range(UNITS), key=lambda i: self.units[i])
        start = max(t, self.units[u])
        compute = start + compute_ns(cost)
        if self.has_dram:
            done = max(compute, self.dram.hold(start, cost["bytes"] / DRAM_BYTES_PER_NS))
        else:
            done = max(compute, start + cost["bytes"] / DRAM_BYTES_PER_NS)
        self.busy["compute"] += done - start
        self.units[u] = done
        return done


# -- the commands ------------------------------------------------------------------------------

TOKENS, LAYERS, DIM, PAGE_TOKENS = 64, 2, 64, 16
PAGES = TOKENS // PAGE_TOKENS
# (KV heads, query heads): a wide group, where the MAC array's time binds the score and
# attention, and one query head per KV head, where the controller's DRAM does
SHAPES = {"wide": (1, 64), "narrow": (4, 4)}


@pytest.fixture
def drive(tmp_path):
    d = DaemonProcess(str(tmp_path / "s.sock"), media=f"file:{tmp_path}/m.img:256M",
                      extra=["--clock", "virtual", "--profile", "star2000d"])
    yield d
    if d.proc.poll() is None:
        d.terminate()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_quantized_store_topk_and_attend_take_the_times_worked_out_by_hand(drive, tmp_path,
                                                                             shape):
    KV_HEADS, Q_HEADS = SHAPES[shape]
    GROUP = Q_HEADS // KV_HEADS
    x = np.random.default_rng(3).standard_normal((TOKENS, 2, LAYERS, KV_HEADS, DIM))
    block = x.astype(np.float16).view(np.uint16)
    q = np.random.default_rng(4).standard_normal((Q_HEADS, DIM)).astype(np.float32)
    kw = dict(layer=1, layers=LAYERS, page_tokens=PAGE_TOKENS)
    with hostlib.connect(drive.socket_path) as dev:
        dev.submit_time_ns = SUBMIT
        f = dev.kv_put_quantized_async(b"blk", block, "fp16", "int8_g64", summary_page=16)
        stored = f.result()
        put_ns = f.device_ns - SUBMIT
        books = dev.counters()
        t = dev.topk_pages_async([b"blk"], q, kv_heads=KV_HEADS, k=1, **kw)
        ids, _scores, _pages = t.result()
        topk_ns = t.device_ns - SUBMIT
        chosen = ids[:, :1].astype(np.int32)  # each KV head's best
        a = dev.attend_async([b"blk"], q, chosen, **kw)
        a.result()
        attend_ns = a.device_ns - SUBMIT
        value = dev.kv_get(b"blk")
    assert drive.terminate()[0] == 0
    with open_media(f"file:{tmp_path}/m.img") as m:
        s = Store.open(m)
        offset, length, _ = s.lookup(b"blk")
        s.close()
    assert length == stored == len(value)
    header, _ = blockfmt.open_block(value)

    # the quantized store: the command fetched, the raw block over the link, the kernel on a
    # unit's SIMD lanes (no DRAM on the virtual clock), acknowledged by the empty write cache
    elements = block.size
    d = Drive(dram=False)
    received = d.receive(0.0, block.nbytes)
    summaries = PAGES * LAYERS * KV_HEADS * 2 * DIM * 2
    done = d.kernel(received, quantize_int_with_summaries(elements, 64, stored, summaries))
    assert put_ns == math.floor(SUBMIT + done) - SUBMIT  # whole ns in the completion
    assert books["link_in_busy_ns"] == pytest.approx(d.busy["link_in"], abs=1e-6)
    assert books["compute_busy_ns"] == pytest.approx(d.busy["compute"], abs=1e-6)
    assert (books["link_bytes"], books["kernel_calls"]) == (block.nbytes, 1)
    assert books["nand_bytes_written"] == stored

    # TOPK_PAGES (rerank 1): the request over the link, the layer's stored summaries sensed
    # from NAND, Quest's score and a top-k per KV head, the ids and scores back over the link
    request = 64 + 16 + Q_HEADS * DIM * 4
    d = Drive(dram=True)
    ready = d.receive(0.0, request)
    s_off, s_len = blockfmt.summaries_at(header, 1)
    t = max(ready, d.sense(ready, offset + s_off, s_len))
    t = max(d.kernel(t, score(PAGES, GROUP, DIM)) for _ in range(KV_HEADS))
    t = max(d.kernel(t, topk(PAGES - 2, 1)) for _ in range(KV_HEADS))
    done = d.transfer(t, KV_HEADS * 1 * 8)
    assert topk_ns == math.floor(SUBMIT + done) - SUBMIT

    # ATTEND: the block is laid out by head (format version 2: int8_g64's groups divide
    # head_dim), so each KV head's own pages (the sink, its chosen one, the recent one) of
    # layer 1 are read: K then V, each a run of codes (a byte per element) and a run of
    # scales and of zero points (a float32 per 64 elements), after the header; a head's
    # adjacent pages are one run; runs that begin in the NAND page (16 KiB) where the ones
    # before them end are one read with them (a page is sensed once); in media order
    assert header.by_head
    d = Drive(dram=True)
    ready = d.receive(0.0, request + 4 * KV_HEADS)
    elements = TOKENS * 2 * LAYERS * KV_HEADS * DIM
    groups = elements // 64
    codes_at = 64 + 4 * groups * 2
    runs = []
    for h in range(KV_HEADS):
        for p in sorted({0, PAGES - 1, int(chosen[h, 0])}):
            for kv in (0, 1):
                e0 = (((1 * KV_HEADS + h) * 2 + kv) * TOKENS + p * PAGE_TOKENS) * DIM
                n = PAGE_TOKENS * DIM
                runs += [(64 + 4 * (e0 // 64), 4 * n // 64),
                         (64 + 4 * (groups + e0 // 64), 4 * n // 64), (codes_at + e0, n)]
    joined = []
    for off, n in sorted((offset + o, n) for o, n in runs):
        end = joined[-1][0] + joined[-1][1] if joined else 0
        if joined and (off <= end or off // PAGE == (end - 1) // PAGE):
            joined[-1] = (joined[-1][0], max(end, off + n) - joined[-1][0])
        else:
            joined.append((off, n))
    # fewer bytes than the three pages' token rows (every layer and head)
    assert sum(n for _, n in runs) < 3 * PAGE_TOKENS * length // TOKENS
    sensed = ready
    for off, n in joined:
        sensed = max(sensed, d.sense(ready, off, n))
    # each head attends the most pages any head has: its own, the sink and the recent one
    attended = max(len({0, PAGES - 1, int(c)}) for c in chosen[:, 0]) * PAGE_TOKENS
    t = max(d.kernel(sensed, attend(attended, GROUP, DIM)) for _ in range(KV_HEADS))
    done = d.transfer(t, Q_HEADS * (DIM + 1) * 4)
    assert attend_ns == math.floor(SUBMIT + done) - SUBMIT
