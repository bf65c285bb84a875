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
    step = _Step(profile, shape, context_tokens, budget_tokens, batch, rerank,
                 int8_summaries, summaries, layers)
    if mode == "ship-all":
        step.ship_all()
    elif mode == "host-select":
        step.host_select()
    else:
        step.drive_select()
    return step.cost(mode)


class _Step:
    """decode_step's books: the timing model and the TOPS budget it books on, the bytes over
    the link, sensed and moved over NAND channels, the MAC time, the step's end (ns)."""

    def __init__(self, profile, shape, context_tokens, budget_tokens, batch, rerank,
                 int8_summaries, summaries, layers):
        self.profile, self.shape, self.context_tokens = profile, shape, context_tokens
        self.batch, self.rerank = batch, rerank
        self.page = page = profile.retrieval.page_tokens
        self.pages = pages = -(-context_tokens // page)
        self.k = min(pages, max(1, budget_tokens // page))
        self.L = min(shape.layers, layers or shape.layers)
        self.H, self.G, self.D = shape.kv_heads, shape.group, shape.head_dim
        self.sb_head = sb_head = summary_bytes(pages, 1, self.D, shape.element_bytes,
                                               int8_summaries)
        where = summaries
        if where == "auto":
            total = sb_head * self.H * shape.layers
            where = "dram" if total <= profile.retrieval.summary_dram_bytes else "nand"
        if where not in ("dram", "nand"):
            raise ValueError(f"summaries live in dram, nand or auto, got {summaries!r}")
        self.where = where
        self.model = DeviceModel(profile)
        self.budget = budget_of(profile)
        self.budget.share_dram(self.model)
        self.lay = _Layout(profile, shape, pages, page, sb_head)
        self.pb = shape.page_bytes(page)
        self.link = self.nand = self.channel = 0
        self.mac_ns = 0.0
        self.t = 0.0
        self.summaries_in = where

    def charge(self, kernel, cost, at):
        self.mac_ns += self.budget.mac_ns(cost)
        return self.budget.charge(kernel, cost, at)[1]

    def ship_all(self) -> None:
        D, eb = self.D, self.shape.element_bytes
        per_layer = self.context_tokens * self.H * 2 * D * eb
        for layer in range(self.L):
            self.t = max(self.t, self.model.read(0.0, self.lay.kv(layer), per_layer))
        self.link = self.nand = self.channel = per_layer * self.L
        self.summaries_in = "-"

    def host_select(self) -> None:
        model, lay, H, k, pb, sb_head = (self.model, self.lay, self.H, self.k, self.pb,
                                         self.sb_head)
        ready = []
        for layer in range(self.L):  # summaries are prefetched: they need no query
            r = 0.0
            for h in range(H):
                if self.where == "nand":
                    r = max(r, model.read(0.0, lay.summaries(layer, h), sb_head))
                    self.nand += lay.sum_run
                    self.channel += sb_head
                else:
                    r = max(r, model.transfer(0.0, sb_head))
            ready.append(r)
            self.link += sb_head * H
        for layer in range(self.L):
            start = max(self.t, ready[layer])
            done = start
            for b in range(self.batch):
                for h in range(H):
                    for p in _spread(self.pages, k, b * H + h):
                        done = max(done, model.read(start, lay.page(layer, h, p), pb))
            self.link += self.batch * H * k * pb
            self.nand += self.batch * H * k * lay.slot
            self.channel += self.batch * H * k * pb
            self.t = done

    def drive_select(self) -> None:
        shape, D, eb = self.shape, self.D, self.shape.element_bytes
        q_bytes = self.batch * shape.q_heads * D * eb
        out_bytes = self.batch * shape.q_heads * (D * eb + 4)
        # the drive's work for a layer, in time order: the timing model takes each NAND sense
        # at a submission no earlier than the last one
        self.events: list = []
        self.serial = 0
        for layer in range(self.L):
            self.t = self.model.receive(self.t, q_bytes)
            self.link += q_bytes
            self.attended = self.t
            for h in range(self.H):
                if self.where == "nand":
                    self.nand += self.lay.sum_run
                    self.channel += self.sb_head
                    self.at(self.model.sense(self.t, self.lay.summaries(layer, h),
                                             self.sb_head), self.summaries_ready, layer, h)
                else:
                    self.at(self.t, self.summaries_ready, layer, h)
            while self.events:
                time, _, fn, args = heapq.heappop(self.events)
                fn(time, *args)
            self.t = self.model.transfer(self.attended, out_bytes)
            self.link += out_bytes

    def at(self, time, fn, *args) -> None:
        self.serial += 1
        heapq.heappush(self.events, (time, self.serial, fn, args))

    def summaries_ready(self, time, layer, h) -> None:
        G, D, pages, k, rerank = self.G, self.D, self.pages, self.k, self.rerank
        scored = self.charge("score", score_cost(pages, 1, G * self.batch, D, self.sb_head),
                             time)
        if rerank > 1:  # half the candidates by the channel-selective score
            scored = self.charge("score", selective_score_cost(
                pages, 1, G * self.batch, D, max(1, D // SELECT_DIVISOR)), scored)
        for b in range(self.batch):  # each sequence its own selection
            done = self.charge("topk", topk_cost(pages, k * rerank), scored)
            if rerank > 1:
                done = self.charge("topk", topk_cost(pages, k * rerank), done)
            self.at(done, self.rerank_stage if rerank > 1 else self.selected, layer, h, b)

    def rerank_stage(self, time, layer, h, b) -> None:
        pb, lay = self.pb, self.lay
        done = time
        cand = _spread(self.pages, self.k * self.rerank, b * self.H + h)
        for p in cand:  # the candidates' keys: the K half of each page's run
            done = max(done, self.model.sense(time, lay.page(layer, h, p), pb // 2))
        self.nand += len(cand) * lay.slot
        self.channel += len(cand) * pb // 2
        done = self.charge("rerank", rerank_cost(len(cand) * self.page, len(cand), 1, self.G,
                                                 self.D, len(cand) * pb // 2), done)
        self.at(self.charge("topk", topk_cost(len(cand), self.k), done), self.selected,
                layer, h, b)

    def selected(self, time, layer, h, b) -> None:
        k, pb, lay = self.k, self.pb, self.lay
        ready = time
        for p in _spread(self.pages, k, b * self.H + h + 1):
            ready = max(ready, self.model.sense(time, lay.page(layer, h, p), pb))
        self.nand += k * lay.slot
        self.channel += k * pb
        self.attended = max(self.attended, self.charge(
            "attend", attend_cost(k * self.page, 1, self.G, self.D, k * pb), ready))

    def cost(self, mode: str) -> StepCost:
        profile, budget, t = self.profile, self.budget, self.t
        scale = self.shape.layers / self.L
        units = budget.profile.compute_units
        busy = sum(budget.busy_ns)
        span = max(t, 1.0)
        dram = sum(k.bytes for k in budget.kernels.values())
        # what each resource was busy for, as a fraction of the step: the largest binds
        shares = {"link": self.link / profile.host_link.bandwidth_bytes_per_s * 1e9 / span,
                  "nand": self.channel / (profile.nand.channels
                                          * profile.nand.channel_bytes_per_s) * 1e9 / span,
                  "dram": dram / profile.compute.memory_bytes_per_s * 1e9 / span,
                  "mac": self.mac_ns / (units * span)}
        attended = self.context_tokens if mode == "ship-all" else self.k * self.page
        return StepCost(mode, self.context_tokens, attended, t * scale,
                        int(self.link * scale), int(self.nand * scale), self.summaries_in,
                        busy / (units * span), self.mac_ns / (units * span), shares)


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
