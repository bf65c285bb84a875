"""One decode step's KV traffic for a long context, three ways, on the timing model.

- `ship-all`: every layer's K and V cross the link (the host attends densely);
- `host-select`: the page summaries cross the link, the host selects (Quest) and reads the
  chosen pages;
- `drive-select`: the host sends each layer's queries; the drive scores the summaries, picks
  the top-k pages per KV head, reads them from NAND, attends, and returns only the outputs and
  their log-sum-exps (InstInfer's split, with Quest's selection: [InstInfer], [Quest]).

The layers run one after another: a layer's queries exist only once the previous layer's
attention is done, so both selecting modes pay a round trip per layer; ship-all can stream
every layer's KV from the step's start.  The host's own compute (the model's matmuls, its
attention) is not modelled: these are the storage side's times, what the drive changes.

NAND layout (what a drive built for this would do): KV head by head, so that one page of one
KV head of one layer, K and V, is one run of 2 x page x head_dim x element bytes (8 KiB for
16 fp16 tokens of 128 channels) inside one 16 KiB NAND page: a chosen page costs one sense of
a NAND page, its read amplification nand_page / page bytes.  Summaries live in the
controller's DRAM up to the profile's `retrieval.summary_dram_bytes`, else on NAND, one run per
layer and head.  Kernels are charged on the TOPS budget (ssdemu/sim/cost.py), their DRAM
bytes beside the NAND's and the link's.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from firmware.retrieval import SELECT_DIVISOR
from ssdemu.sim.cost import (
    attend_cost,
    rerank_cost,
    score_cost,
    selective_score_cost,
    summary_bytes,
    topk_cost,
)
from ssdemu.sim.profile import Profile
from ssdemu.sim.timing import DeviceModel, budget_of

MODES = ("ship-all", "host-select", "drive-select")


@dataclass(frozen=True)
class AttentionShape:
    layers: int
    kv_heads: int
    group: int  # query heads per KV head (GQA)
    head_dim: int
    element_bytes: int = 2

    @property
    def q_heads(self) -> int:
        return self.kv_heads * self.group

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.element_bytes

    def page_bytes(self, page: int) -> int:
        """K and V of one page of one KV head of one layer."""
        return 2 * page * self.head_dim * self.element_bytes


@dataclass
class StepCost:
    mode: str
    context_tokens: int
    budget_tokens: int
    latency_ns: float
    link_bytes: int
    nand_bytes: int               # sensed from NAND (read amplification included)
    summaries_in: str             # "dram", "nand" or "-"
    compute_utilization: float    # busy unit-time / (units x step time)
    mac_utilization: float        # MAC-array time / (units x step time)
    shares: dict = field(default_factory=dict)  # busy fraction: link, nand, dram, mac

    @property
    def binds(self) -> str:
        return max(self.shares, key=self.shares.get) if self.shares else "-"

    def as_dict(self) -> dict:
        return {"mode": self.mode, "context_tokens": self.context_tokens,
                "budget_tokens": self.budget_tokens,
                "latency_ms": round(self.latency_ns / 1e6, 4),
                "link_bytes": self.link_bytes, "nand_bytes": self.nand_bytes,
                "summaries_in": self.summaries_in,
                "compute_utilization": round(self.compute_utilization, 4),
                "mac_utilization": round(self.mac_utilization, 4),
                "shares": {k: round(v, 4) for k, v in self.shares.items()},
                "binds": self.binds}


class _Layout:
    """Byte offsets on the emulated NAND: KV per (layer, head) a run of pages, NAND-page
    aligned; then the summaries per (layer, head)."""

    def __init__(self, profile: Profile, shape: AttentionShape, pages: int, page: int,
                 sum_bytes_head: int):
        self.nand_page = profile.nand.page_bytes
        self.slot = max(self.nand_page, shape.page_bytes(page))  # a page never straddles two
        self.kv_run = pages * self.slot
        self.heads = shape.kv_heads
        self.kv_end = shape.layers * shape.kv_heads * self.kv_run
        self.sum_run = -(-sum_bytes_head // self.nand_page) * self.nand_page

    def page(self, layer: int, head: int, p: int) -> int:
        return (layer * self.heads + head) * self.kv_run + p * self.slot

    def kv(self, layer: int) -> int:
        return layer * self.heads * self.kv_run

    def summaries(self, layer: int, head: int) -> int:
        return self.kv_end + (layer * self.heads + head) * self.sum_run


def _spread(pages: int, k: int, salt: int) -> list[int]:
    """k distinct page ids spread over [0, pages): where a selection lands on NAND.  Which
    pages a query picks is data; for timing only their spread over dies matters."""
    step = pages / k
    return [min(pages - 1, int(i * step + (salt * 7919 + i * 104729) % max(1, int(step))))
            for i in range(k)]


def decode_step(profile: Profile, shape: AttentionShape, context_tokens: int, mode: str,
                budget_tokens: int = 2048, batch: int = 1, rerank: int = 1,
                int8_summaries: bool = False, summaries: str = "auto",
                layers: int | None = None) -> StepCost:
    """One decode step of `batch` sequences sharing one context of context_tokens (batch > 1:
    many requests decoding over the same document), attending to budget_tokens per sequence
    and KV head (ship-all: all).  rerank: candidates per page kept for the drive's second
    stage (1: Quest alone).  summaries: "dram", "nand" or "auto" (DRAM if they fit the
    profile's share).  layers: model only the first n layers and scale (for speed)."""
    if mode not in MODES:
        raise ValueError(f"decode mode must be one of {', '.join(MODES)}, got {mode!r}")
    if context_tokens <= 0 or budget_tokens <= 0 or batch <= 0 or rerank < 1:
        raise ValueError("context, budget, batch and rerank must be positive")
    page = profile.retrieval.page_tokens
    pages = -(-context_tokens // page)
    k = min(pages, max(1, budget_tokens // page))
    L = min(shape.layers, layers or shape.layers)
    H, G, D, eb = shape.kv_heads, shape.group, shape.head_dim, shape.element_bytes
    sb_head = summary_bytes(pages, 1, D, eb, int8_summaries)
    where = summaries
    if where == "auto":
        total = sb_head * H * shape.layers
        where = "dram" if total <= profile.retrieval.summary_dram_bytes else "nand"
    if where not in ("dram", "nand"):
        raise ValueError(f"summaries live in dram, nand or auto, got {summaries!r}")
    model = DeviceModel(profile)
    budget = budget_of(profile)
    budget.share_dram(model)
    lay = _Layout(profile, shape, pages, page, sb_head)
    pb = shape.page_bytes(page)
    link = nand = channel = 0  # bytes over the link, sensed, moved over NAND channels
    mac_ns = 0.0
    t = 0.0

    def charge(kernel, cost, at):
        nonlocal mac_ns
        mac_ns += budget.mac_ns(cost)
        return budget.charge(kernel, cost, at)[1]

    if mode == "ship-all":
        per_layer = context_tokens * H * 2 * D * eb
        for layer in range(L):
            t = max(t, model.read(0.0, lay.kv(layer), per_layer))
        link = nand = channel = per_layer * L
        summaries_in = "-"
    elif mode == "host-select":
        ready = []
        for layer in range(L):  # summaries are prefetched: they need no query
            r = 0.0
            for h in range(H):
                if where == "nand":
                    r = max(r, model.read(0.0, lay.summaries(layer, h), sb_head))
                    nand += lay.sum_run
                    channel += sb_head
                else:
                    r = max(r, model.transfer(0.0, sb_head))
            ready.append(r)
            link += sb_head * H
        for layer in range(L):
            start = max(t, ready[layer])
            done = start
            for b in range(batch):
                for h in range(H):
                    for p in _spread(pages, k, b * H + h):
                        done = max(done, model.read(start, lay.page(layer, h, p), pb))
            link += batch * H * k * pb
            nand += batch * H * k * lay.slot
            channel += batch * H * k * pb
            t = done
        summaries_in = where
    else:
        q_bytes = batch * shape.q_heads * D * eb
        out_bytes = batch * shape.q_heads * (D * eb + 4)
        # the drive's work for a layer, in time order: the timing model takes each NAND sense
        # at a submission no earlier than the last one
        events: list = []
        serial = 0
        for layer in range(L):
            t = model.receive(t, q_bytes)
            link += q_bytes
            attended = t

            def at(time, fn, *args):
                nonlocal serial
                serial += 1
                heapq.heappush(events, (time, serial, fn, args))

            def summaries_ready(time, layer, h):
                scored = charge("score", score_cost(pages, 1, G * batch, D, sb_head), time)
                if rerank > 1:  # half the candidates by the channel-selective score
                    scored = charge("score", selective_score_cost(
                        pages, 1, G * batch, D, max(1, D // SELECT_DIVISOR)), scored)
                for b in range(batch):  # each sequence its own selection
                    done = charge("topk", topk_cost(pages, k * rerank), scored)
                    if rerank > 1:
                        done = charge("topk", topk_cost(pages, k * rerank), done)
                    at(done, rerank_stage if rerank > 1 else selected, layer, h, b)

            def rerank_stage(time, layer, h, b):
                nonlocal nand, channel
                done = time
                cand = _spread(pages, k * rerank, b * H + h)
                for p in cand:  # the candidates' keys: the K half of each page's run
                    done = max(done, model.sense(time, lay.page(layer, h, p), pb // 2))
                nand += len(cand) * lay.slot
                channel += len(cand) * pb // 2
                done = charge("rerank", rerank_cost(len(cand) * page, len(cand), 1, G, D,
                                                   len(cand) * pb // 2), done)
                at(charge("topk", topk_cost(len(cand), k), done), selected, layer, h, b)

            def selected(time, layer, h, b):
                nonlocal nand, channel, attended
                ready = time
                for p in _spread(pages, k, b * H + h + 1):
                    ready = max(ready, model.sense(time, lay.page(layer, h, p), pb))
                nand += k * lay.slot
                channel += k * pb
                attended = max(attended, charge("attend", attend_cost(k * page, 1, G, D,
                                                                      k * pb), ready))

            for h in range(H):
                if where == "nand":
                    nand += lay.sum_run
                    channel += sb_head
                    at(model.sense(t, lay.summaries(layer, h), sb_head), summaries_ready,
                       layer, h)
                else:
                    at(t, summaries_ready, layer, h)
            while events:
                time, _, fn, args = heapq.heappop(events)
                fn(time, *args)
            t = model.transfer(attended, out_bytes)
            link += out_bytes
        summaries_in = where
    scale = shape.layers / L
    units = budget.profile.compute_units
    busy = sum(budget.busy_ns)
    span = max(t, 1.0)
    dram = sum(k.bytes for k in budget.kernels.values())
    # what each resource was busy for, as a fraction of the step: the largest binds
    shares = {"link": link / profile.host_link.bandwidth_bytes_per_s * 1e9 / span,
              "nand": channel / (profile.nand.channels * profile.nand.channel_bytes_per_s)
              * 1e9 / span,
              "dram": dram / profile.compute.memory_bytes_per_s * 1e9 / span,
              "mac": mac_ns / (units * span)}
    return StepCost(mode, context_tokens, context_tokens if mode == "ship-all" else k * page,
                    t * scale, int(link * scale), int(nand * scale),
                    summaries_in, busy / (units * span), mac_ns / (units * span), shares)


def read_amplification(profile: Profile, shape: AttentionShape) -> float:
    page = profile.retrieval.page_tokens
    pb = shape.page_bytes(page)
    return max(profile.nand.page_bytes, pb) / pb if pb else math.inf


def selection_step(profile: Profile, shape: AttentionShape, context_tokens: int,
                   budget_tokens: int = 2048, batch: int = 64) -> dict:
    """TOPK_PAGES alone for one layer: `batch` sequences decoding over one shared context
    (summaries in DRAM) scored in one pass, each its own top-k per KV head.  Where the drive's
    TOPS budget binds: G x batch query heads per summary byte."""
    page = profile.retrieval.page_tokens
    pages = -(-context_tokens // page)
    k = min(pages, max(1, budget_tokens // page))
    H, G, D, eb = shape.kv_heads, shape.group, shape.head_dim, shape.element_bytes
    sb = summary_bytes(pages, 1, D, eb)
    budget = budget_of(profile)
    mac = 0.0
    end = 0.0
    scored = []
    for _ in range(H):  # one pass over each KV head's summaries, on the unit free first
        cost = score_cost(pages, 1, G * batch, D, sb)
        mac += budget.mac_ns(cost)
        scored.append(budget.charge("score", cost, 0.0)[1])
    for done in sorted(scored):  # then every sequence's own top-k, in parallel
        for _ in range(batch):
            end = max(end, budget.charge("topk", topk_cost(pages, k), done)[1])
    units = profile.compute.units
    return {"context_tokens": context_tokens, "batch": batch, "kv_heads": H,
            "query_heads_per_kv_head": G * batch, "latency_ms": round(end / 1e6, 4),
            "compute_utilization": round(sum(budget.busy_ns) / (units * end), 4),
            "mac_utilization": round(mac / (units * end), 4)}
