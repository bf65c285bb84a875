"""`ssdemu bench replay`: model-mode replay of a whole trace, timed as a user runs it (the
whole `ssdemu replay` CLI call, a fresh process, warm Numba cache), against the baseline in
the same run: the same replay with the timing model booking every page (bulk path off).

With `bounded`, the same call again with a drive tier of that many blocks (every miss
evicts, the FTL's GC runs) right after each unbounded one, and the bounded replay's time
as a ratio to the unbounded one's (issue 57 asks 1.5x at most on the conversation trace
with 2,000 blocks); `repeat` such pairs, the medians reported, as the VM's speed drifts."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from ssdemu.errors import SsdemuError
from ssdemu.replay.model_mode import replay_model
from ssdemu.replay.serving import model_config, parse_capacities
from ssdemu.sim.profile import load
from traces.mooncake import SAMPLE, TraceReader

BAR_SECONDS = 10.0  # issue 6: the whole synthetic trace, llama-3-8b, one CLI call


def _cli(trace: str, model: str, profile: str, quant: str,
         bounded: int | None = None) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "ssdemu", "replay", trace, "--model", model, "--profile",
           profile, "--quant", quant, "--json", "--no-progress",
           # the model's own rate, as the page-by-page baseline below replays it
           "--prefill-rate", "model"]
    if bounded is not None:
        cmd += ["--capacity", f"drive=blocks:{bounded}"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:  # the replay's own one-line error
        lines = p.stderr.strip().splitlines()
        raise SsdemuError(lines[-1].removeprefix("ssdemu: error: ") if lines
                          else f"ssdemu replay exited with {p.returncode}")
    return wall, json.loads(p.stdout)


def _median_run(runs: list[tuple[float, dict]]) -> tuple[float, dict]:
    """The run whose replay took the median time (the lower middle of an even count)."""
    ordered = sorted(runs, key=lambda r: r[1]["wall_seconds"])
    return ordered[(len(ordered) - 1) // 2]


def bench_replay(trace: str = SAMPLE, model: str = "llama-3-8b", profile: str = "star2000d",
                 quant: str = "int8_g64", baseline: bool = True, bounded: int | None = None,
                 repeat: int = 1) -> dict:
    if bounded is not None and bounded < 1:
        raise ValueError(f"the bounded drive needs at least 1 block, got {bounded}")
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    _cli(trace, model, profile, quant)  # warm: Numba's cache, the page cache
    unbounded_runs, bounded_runs = [], []
    for _ in range(repeat):  # pairs, one after the other: a ratio of the same minutes
        unbounded_runs.append(_cli(trace, model, profile, quant))
        if bounded is not None:
            bounded_runs.append(_cli(trace, model, profile, quant, bounded))
    wall, report = _median_run(unbounded_runs)
    out = {"trace": trace, "model": model, "profile": profile, "quant": quant,
           "requests": report["requests"], "blocks": report["blocks"],
           "block_hit_ratio": report["block_hit_ratio"],
           "cli_wall_s": wall, "replay_wall_s": report["wall_seconds"],
           "blocks_per_s": report["blocks"] / report["wall_seconds"],
           "replay_wall_s_runs": [r["wall_seconds"] for _, r in unbounded_runs],
           "requests_per_s": report["requests"] / wall, "bar_s": BAR_SECONDS,
           "within_bar": wall <= BAR_SECONDS}
    if bounded is not None:
        out["bounded"] = _bounded(bounded, unbounded_runs, bounded_runs)
    if baseline:
        m = model_config(model)
        q = None if quant == "none" else quant
        caps = parse_capacities("hbm=0,dram=0,drive=unbounded",
                                {"hbm": 1, "dram": 1, "drive": 1})
        reqs = list(TraceReader(trace))
        page = replay_model(reqs, load(profile), m, q, caps, bulk_pages=0)
        out["baseline_page_by_page_replay_s"] = page["wall_seconds"]
        out["speedup_vs_page_by_page"] = page["wall_seconds"] / report["wall_seconds"]
        out["ttft_p50_ratio_bulk_vs_page"] = (report["ttft_s"]["with_drive"]["p50"]
                                              / page["ttft_s"]["with_drive"]["p50"])
    return out


def _bounded(blocks: int, unbounded_runs, bounded_runs) -> dict:
    wall, report = _median_run(bounded_runs)
    ratios = [b["wall_seconds"] / u["wall_seconds"]
              for (_, u), (_, b) in zip(unbounded_runs, bounded_runs, strict=True)]
    ftl = (report.get("drive_ftl") or [{}])[0]
    return {"capacity_blocks": blocks, "block_hit_ratio": report["block_hit_ratio"],
            "evictions": report["evictions"]["drive"], "erases": ftl.get("erases", 0),
            "write_amplification": ftl.get("write_amplification"),
            "cli_wall_s": wall, "replay_wall_s": report["wall_seconds"],
            "blocks_per_s": report["blocks"] / report["wall_seconds"],
            "replay_wall_s_runs": [r["wall_seconds"] for _, r in bounded_runs],
            "vs_unbounded_runs": ratios, "vs_unbounded": statistics.median(ratios)}


def format_table(r: dict) -> str:
    lines = [f"model-mode replay of {r['requests']:,} requests ({r['blocks']:,} blocks, "
             f"{r['model']}, {r['profile']}, {r['quant']}): hit ratio "
             f"{r['block_hit_ratio']:.3f}",
             f"  whole CLI call   {r['cli_wall_s']:6.2f} s  ({r['requests_per_s']:,.0f} "
             f"requests/s; bar {r['bar_s']:.0f} s: {'met' if r['within_bar'] else 'MISSED'})",
             f"  replay itself    {r['replay_wall_s']:6.2f} s  "
             f"({r['blocks_per_s']:,.0f} blocks/s)"]
    if "bounded" in r:
        b = r["bounded"]
        lines.append(f"  drive of {b['capacity_blocks']:,} blocks {b['replay_wall_s']:6.2f} s  "
                     f"({b['blocks_per_s']:,.0f} blocks/s; {b['vs_unbounded']:.2f}x the "
                     f"unbounded replay; {b['evictions']:,} evictions, {b['erases']:,} "
                     f"erases)")
    if "baseline_page_by_page_replay_s" in r:
        lines.append(f"  page by page     {r['baseline_page_by_page_replay_s']:6.2f} s  "
                     f"(bulk path {r['speedup_vs_page_by_page']:.2f}x faster; TTFT p50 "
                     f"ratio {r['ttft_p50_ratio_bulk_vs_page']:.4f})")
    return "\n".join(lines)
