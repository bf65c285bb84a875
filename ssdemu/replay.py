"""`ssdemu replay` in model mode: a KV-cache trace through the serving model and the drive's
timing model, in virtual time, on sizes alone.

Hit accounting (exact): a request hits the longest run of its leading blocks present in a
tier; then all its blocks are inserted or touched in every tier, in order, most recent last;
each tier evicts by LRU over block counts.  Several tiers are inclusive: every block goes to
every tier with room, a hit block is served by the fastest tier whose leading run covers it
(HBM, then DRAM, then the drive), and nothing is promoted or demoted beyond that.  With only
the drive (hbm=0, dram=0, drive=unbounded) the Mooncake synthetic trace gives 0.640.

TTFT model: one GPU serves prefills first come, first served.  A request's prefill computes
the tokens of the blocks it missed at the model's prefill rate; the blocks it hit load
meanwhile (DRAM over the host link, the drive through the timing model plus in-drive
dequantization), layer by layer, so loads overlap the prefill: TTFT = queueing + max(prefill,
loads).  Without the drive the same trace runs with the drive's capacity at 0.  New blocks
are quantized in the drive (TOPS budget) and written (timing model) at the request's arrival.
"""

from __future__ import annotations

import time

import numpy as np

from firmware.cost import ComputeProfile, TopsBudget, dequantize_cost, quantize_cost
from ssdemu.profile import Profile
from ssdemu.serving import BLOCK_TOKENS, TIERS, LRUTier, ModelConfig
from ssdemu.timing import DeviceModel

DEFAULT_HOST_LINK_BYTES_PER_S = 50e9  # DRAM -> GPU over PCIe 5.0 x16


def _pcts(values: list[float]) -> dict:
    a = np.asarray(values) if values else np.zeros(1)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "mean": float(a.mean())}


def _run(requests, profile: Profile, model: ModelConfig, quant: str | None,
         capacities: dict, with_drive: bool, host_link_bytes_per_s: float,
         bulk_pages: int | None = None) -> dict:
    caps = dict(capacities)
    if not with_drive:
        caps["drive"] = 0
    tiers = {t: LRUTier(caps[t]) for t in TIERS}
    device = (DeviceModel(profile, bulk_pages=bulk_pages)
              if with_drive and caps["drive"] != 0 else None)
    budget = TopsBudget(ComputeProfile(profile.compute.tops, profile.compute.units,
                                       profile.compute.memory_bytes_per_s))
    stored = model.stored_block_bytes(quant)
    raw = model.block_bytes
    elements = raw // model.element_bytes
    scheme = quant or None
    offsets: dict[int, int] = {}  # block id -> media offset on the drive
    next_offset = 0
    page = profile.nand.page_bytes
    slot = -(-stored // page) * page
    gpu_free = 0.0
    hits = {t: 0 for t in TIERS}
    blocks_total = hit_blocks = tokens_saved = 0
    ttft = []
    timeline = []
    t_last = 0.0
    for req in requests:
        t = req.timestamp_ms / 1000.0
        t_last = t
        ids = req.hash_ids
        runs = {name: tier.leading_run(ids) for name, tier in tiers.items()}
        served = 0
        load_s = 0.0
        for name in TIERS:  # fastest first
            n = runs[name] - served
            if n <= 0:
                continue
            if name == "dram":
                load_s = max(load_s, n * raw / host_link_bytes_per_s)
            elif name == "drive":
                t_ns = t * 1e9
                done = t_ns
                for b in ids[served:runs[name]]:
                    done = max(done, device.read(t_ns, offsets[b], stored))
                if scheme:
                    _, c_done = budget.charge(
                        "dequantize", dequantize_cost(elements * n, 2, scheme, stored * n),
                        done)
                    done = max(done, c_done)
                load_s = max(load_s, (done - t_ns) / 1e9)
            hits[name] += n
            served = runs[name]
        h = served
        blocks_total += len(ids)
        hit_blocks += h
        saved = min(h * BLOCK_TOKENS, req.input_length)
        tokens_saved += saved
        prefill_s = (req.input_length - saved) / model.prefill_tokens_per_s
        start = max(t, gpu_free)
        busy = max(prefill_s, load_s)
        gpu_free = start + busy
        ttft.append(start - t + busy)
        if device is not None:  # new blocks: quantized in the drive, then written
            t_ns = t * 1e9
            for b in ids:
                if b in tiers["drive"] or b in offsets and tiers["drive"].capacity is None:
                    continue
                if scheme:
                    budget.charge("quantize", quantize_cost(elements, 2, scheme, stored), t_ns)
                off = offsets.get(b)
                if off is None:
                    off = offsets[b] = next_offset
                    next_offset += slot
                device.write(t_ns, off, stored)
        for tier in tiers.values():
            tier.touch_all(ids)
        timeline.append((t, hit_blocks / blocks_total if blocks_total else 0.0))
    duration_ns = max(t_last * 1e9, 1.0)
    out = {
        "blocks": blocks_total, "hit_blocks": hit_blocks,
        "block_hit_ratio": hit_blocks / blocks_total if blocks_total else 0.0,
        "tier_hit_ratio": {t: hits[t] / blocks_total if blocks_total else 0.0
                           for t in TIERS},
        "prefill_tokens_saved": tokens_saved,
        "ttft_s": _pcts(ttft), "timeline": timeline,
        "evictions": {t: tiers[t].evictions for t in TIERS},
    }
    if device is not None:
        st = device.stats()
        out["drive"] = {
            "host_link_bytes": st["link_bytes"],
            "nand_bytes": st["nand_bytes_read"] + st["nand_bytes_written"],
            "utilization": {
                "link": st["link_busy_ns"] / duration_ns,
                "nand_channels": st["channel_busy_ns"] / (profile.nand.channels * duration_ns),
                "compute": budget.utilization(duration_ns),
            },
        }
    return out


def replay_model(requests, profile: Profile, model: ModelConfig, quant: str | None,
                 capacities: dict, host_link_bytes_per_s: float = DEFAULT_HOST_LINK_BYTES_PER_S,
                 bulk_pages: int | None = None) -> dict:
    """bulk_pages: the timing model's bulk threshold (see DeviceModel; 0: page by page)."""
    requests = list(requests)
    t0 = time.perf_counter()
    with_drive = _run(requests, profile, model, quant, capacities, True,
                      host_link_bytes_per_s, bulk_pages)
    without = _run(requests, profile, model, quant, capacities, False, host_link_bytes_per_s)
    wall = time.perf_counter() - t0
    drive = with_drive.get("drive", {"host_link_bytes": 0, "nand_bytes": 0,
                                     "utilization": {"link": 0.0, "nand_channels": 0.0,
                                                     "compute": 0.0}})
    return {
        "mode": "model", "profile": profile.name, "model": model.name, "quant": quant,
        "requests": len(requests), "blocks": with_drive["blocks"],
        "capacity_blocks": {t: capacities[t] for t in TIERS},
        "block_hit_ratio": with_drive["block_hit_ratio"],
        "tier_hit_ratio": with_drive["tier_hit_ratio"],
        "prefill_tokens_saved": with_drive["prefill_tokens_saved"],
        "host_link_bytes": drive["host_link_bytes"], "nand_bytes": drive["nand_bytes"],
        "compression_ratio": model.block_bytes / model.stored_block_bytes(quant),
        "ttft_s": {"with_drive": with_drive["ttft_s"], "without_drive": without["ttft_s"]},
        "drive_utilization": drive["utilization"],
        "host_lag": 0,  # virtual time: the host never lags the model
        "wall_seconds": wall, "requests_per_s": len(requests) / wall if wall else 0.0,
    }
