"""Decode after prefill (`ssdemu replay --decode MODE`): each request's output tokens decoded
against its context's KV, which lives in the drive, and the time per output token (TPOT).

Each step of a request with context n costs the GPU's step (1 / the model's decode rate) plus
the storage side's step for context n (ssdemu/sim/retrieval.py: `dense` ships every layer's KV
over the link, `host-select` reads the page summaries and the chosen pages, `drive-select`
selects and attends in the drive), in series: a selecting step's layers wait on each other,
and no overlap is assumed where none is certain.  The storage step is modelled once per
context on a geometric grid (5% apart) and interpolated between, per request over its
contexts input_length .. input_length + output_length - 1; the drive runs one step at a time
(no contention between requests' decodes: the figure is a request's own).  The same in model
and data mode: the decode is modelled from sizes.
"""

from __future__ import annotations

import numpy as np

from ssdemu.replay.serving import ModelConfig
from ssdemu.sim.profile import Profile
from ssdemu.sim.retrieval import AttentionShape, decode_step

DECODE_MODES = {"dense": "ship-all", "host-select": "host-select",
                "drive-select": "drive-select"}
BUDGET_TOKENS = 2048  # Quest's budget at long contexts
GRID_RATIO = 1.05
LAYERS_MODELLED = 4  # of the model's layers, scaled up: the layers are alike


def attention_shape(model: ModelConfig) -> AttentionShape:
    return AttentionShape(model.layers, model.kv_heads, model.query_heads // model.kv_heads,
                          model.head_dim, model.element_bytes)


def _grid(lo: int, hi: int) -> np.ndarray:
    pts = [max(1, lo)]
    while pts[-1] < hi:
        pts.append(max(pts[-1] + 1, int(pts[-1] * GRID_RATIO)))
    return np.array(pts, np.int64)


def decode_report(requests, profile: Profile, model: ModelConfig, mode: str,
                  budget_tokens: int = BUDGET_TOKENS) -> dict:
    if mode not in DECODE_MODES:
        raise ValueError(f"--decode must be one of {', '.join(DECODE_MODES)}, got {mode!r}")
    shape = attention_shape(model)
    reqs = [r for r in requests if r.output_length > 0]
    if not reqs:
        return {"mode": mode, "requests": 0}
    lo = min(r.input_length for r in reqs)
    hi = max(r.input_length + r.output_length for r in reqs)
    grid = _grid(lo, hi)
    steps = [decode_step(profile, shape, int(n), DECODE_MODES[mode], budget_tokens,
                         layers=min(LAYERS_MODELLED, shape.layers)) for n in grid]
    storage_s = np.array([s.latency_ns for s in steps]) / 1e9
    link = np.array([s.link_bytes for s in steps], np.float64)
    gpu_s = 1.0 / model.decode_tokens_per_s
    tpot, store_mean, link_mean, tokens = [], [], [], 0
    for r in reqs:
        ctx = np.arange(r.input_length, r.input_length + r.output_length)
        st = np.interp(ctx, grid, storage_s)
        store_mean.append(float(st.mean()))
        tpot.append(gpu_s + float(st.mean()))
        link_mean.append(float(np.interp(ctx, grid, link).mean()))
        tokens += r.output_length
    tp = np.array(tpot)
    binds = {}
    for s in steps:
        binds[s.binds] = binds.get(s.binds, 0) + 1
    return {
        "mode": mode, "storage_mode": DECODE_MODES[mode], "requests": len(reqs),
        "output_tokens": tokens, "budget_tokens": budget_tokens,
        "gpu_s_per_token": gpu_s,
        "tpot_s": {"p50": float(np.percentile(tp, 50)), "p99": float(np.percentile(tp, 99)),
                   "mean": float(tp.mean())},
        "storage_s_per_token": {"p50": float(np.percentile(store_mean, 50)),
                                "p99": float(np.percentile(store_mean, 99))},
        "link_bytes_per_token_mean": float(np.mean(link_mean)),
        "context_tokens": {"min": int(lo), "max": int(hi)},
        "binds": binds,  # over the grid's contexts: which resource bound the storage step
    }
