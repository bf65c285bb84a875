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

from ssdemu.llm.policies.qevict import QEvict, QEvict2Bit, band_split
from ssdemu.llm.tiers import SCHEME
from ssdemu.replay.serving import ModelConfig
from ssdemu.sim.profile import Profile
from ssdemu.sim.timing import DeviceModel

DECODE_MODES = {"dense": "ship-all", "host-select": "host-select",
                "drive-select": "drive-select"}
# the KV placement policies of ssdemu/llm/policies, at trace scale (tier_step below): the
# drop-only ones read nothing from the drive; qevict, qevict-2bit and predictive read their
# quantized band every step, the qevicts also promote at the drift model's rate
# (ssdemu/replay/drift.py)
TIER_POLICIES = ("streaming", "h2o", "random", "contiguity", "qevict", "qevict-2bit",
                 "predictive")
# each reading policy's band, most precise first: the policies' own levels at the tier
# manager's schemes (predictive's int8 above int4 is qevict's)
BAND_SCHEMES = {p.name: tuple(SCHEME[t] for t in p.levels) for p in (QEvict, QEvict2Bit)}
BAND_SCHEMES["predictive"] = BAND_SCHEMES["qevict"]
WINDOW_TOKENS = 64  # the tier manager's window: a drive block
TIER_BUDGET_PCT = 25.0
BUDGET_TOKENS = 2048  # Quest's budget at long contexts
GRID_RATIO = 1.05
LAYERS_MODELLED = 4  # of the model's layers, scaled up: the layers are alike


def attention_shape(model: ModelConfig):
    # ssdemu.sim.retrieval imports the firmware's retrieval kernels (Numba): only the
    # selecting modes need it, not the placement policies' decodes
    from ssdemu.sim.retrieval import AttentionShape

    return AttentionShape(model.layers, model.kv_heads, model.query_heads // model.kv_heads,
                          model.head_dim, model.element_bytes)


def _grid(lo: int, hi: int) -> np.ndarray:
    pts = [max(1, lo)]
    while pts[-1] < hi:
        pts.append(max(pts[-1] + 1, int(pts[-1] * GRID_RATIO)))
    return np.array(pts, np.int64)


def window_bytes(model: ModelConfig, scheme: str) -> int:
    """A window of the model's KV stored at `scheme` with 16-token page summaries (the tier
    manager's blocks; firmware/sizes.py: arithmetic, no Numba)."""
    from firmware import sizes

    dtype = 2 if model.element_bytes == 4 else 0
    return sizes.compressed_nbytes(WINDOW_TOKENS, model.layers, model.kv_heads,
                                   model.head_dim, scheme, dtype, 16)


def tier_step(profile: Profile, model: ModelConfig, context_tokens: int, policy: str,
              budget_pct: float, promotions: float) -> tuple[float, float, float]:
    """One decode step's storage side under a placement policy at context n: (latency ns,
    link bytes, NAND bytes).  HBM holds budget_pct of the context (two windows at least);
    the quantized band of qevict, qevict-2bit and predictive (as many windows as HBM, in
    BAND_SCHEMES' equal shares: int8 above int4, and KIVI-2 below for qevict-2bit) is read
    back at the step's start, every block at once, on the timing model; a promotion
    (`promotions` per step, an expected rate) adds a dequantized retrieve of a window on the
    step's path and a demotion in the drive (NAND only); a new window is stored every
    WINDOW_TOKENS steps, behind the step (its bytes only)."""
    if policy not in TIER_POLICIES:
        raise ValueError(f"not a placement policy: {policy!r}")
    if policy not in BAND_SCHEMES:
        return 0.0, 0.0, 0.0  # HBM alone: nothing from the drive
    hbm = max(2, round(context_tokens * budget_pct / 100 / WINDOW_TOKENS))
    windows = context_tokens // WINDOW_TOKENS
    plain = window_bytes(model, "plain")
    levels = [window_bytes(model, s) for s in BAND_SCHEMES[policy]]
    int8, lowest = levels[0], levels[-1]
    store = plain / WINDOW_TOKENS
    band = max(0, min(hbm, windows - hbm))
    sizes = band_split(band, levels)
    dev = DeviceModel(profile)
    done, link, nand = 0.0, store, store
    for i, n in enumerate(sizes):
        done = max(done, dev.read(0.0, i * (plain + 4096), n))
        link += n
        nand += n
    if policy != "predictive" and promotions > 0:
        raw = WINDOW_TOKENS * model.layers * model.kv_heads * model.head_dim * 2 \
            * model.element_bytes
        promote = DeviceModel(profile).read(0.0, 0, raw)  # the raw block over the link
        done += promotions * promote
        link += promotions * raw
        # its read (at the band's lowest), and a demotion's read and write (to int8)
        nand += promotions * (lowest + 2 * int8)
    return done, link, nand


def tier_report(requests, profile: Profile, model: ModelConfig, policy: str,
                budget_pct: float = TIER_BUDGET_PCT, drift=None) -> dict:
    """decode_report for a placement policy (tier_step), with the drift model's FMM per
    request (ssdemu/replay/drift.py: measured on the real model, carried by the budget
    fraction)."""
    from ssdemu.replay.drift import DriftModel

    drift = drift or DriftModel.load()
    frac = budget_pct / 100
    reqs = [r for r in requests if r.output_length > 0]
    if not reqs:
        return {"mode": policy, "requests": 0}
    lo = min(r.input_length for r in reqs)
    hi = max(r.input_length + r.output_length for r in reqs)
    grid = _grid(max(lo, 2 * WINDOW_TOKENS), hi)
    rate = drift.promotions(policy, frac) if policy.startswith("qevict") else 0.0
    steps = np.array([tier_step(profile, model, int(n), policy, budget_pct, rate)
                      for n in grid])
    gpu_s = 1.0 / model.decode_tokens_per_s
    tpot, link, nand, tokens = [], [], [], 0
    for r in reqs:
        ctx = np.arange(r.input_length, r.input_length + r.output_length)
        tpot.append(gpu_s + float(np.interp(ctx, grid, steps[:, 0]).mean()) / 1e9)
        link.append(float(np.interp(ctx, grid, steps[:, 1]).mean()))
        nand.append(float(np.interp(ctx, grid, steps[:, 2]).mean()))
        tokens += r.output_length
    tp = np.array(tpot)
    return {"mode": policy, "requests": len(reqs), "output_tokens": tokens,
            "budget_pct": budget_pct, "gpu_s_per_token": gpu_s,
            "tpot_s": {"p50": float(np.percentile(tp, 50)), "p99": float(np.percentile(tp, 99)),
                       "mean": float(tp.mean())},
            "link_bytes_per_token_mean": float(np.mean(link)),
            "nand_bytes_per_token_mean": float(np.mean(nand)),
            "promotions_per_step": rate,
            "future_missed_mass": drift.fmm(policy, frac), "drift_model": drift.source,
            "tpot_per_request_s": [round(float(x), 6) for x in tp],
            "context_tokens": {"min": int(lo), "max": int(hi)}}


def decode_report(requests, profile: Profile, model: ModelConfig, mode: str,
                  budget_tokens: int = BUDGET_TOKENS, budget_pct: float = TIER_BUDGET_PCT,
                  drift=None) -> dict:
    if mode in TIER_POLICIES:
        return tier_report(requests, profile, model, mode, budget_pct, drift)
    if mode not in DECODE_MODES:
        raise ValueError(f"--decode must be one of {', '.join((*DECODE_MODES, *TIER_POLICIES))}"
                         f", got {mode!r}")
    from ssdemu.sim.retrieval import decode_step

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
