"""`ssdemu replay --plot DIR`: the PNGs of a replay's series (and of its placement policies'
decodes) (matplotlib, Agg backend: no
display needed).  Each function takes the report's `series` and a path."""

from __future__ import annotations

import os

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure():
    plt = _pyplot()
    return plt, *plt.subplots(figsize=(8, 4.5))


def _save(plt, fig, ax, title: str, legend_at: str, path: str) -> None:
    ax.set_title(title)
    ax.legend(loc=legend_at)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def hit_ratio_over_time(series: dict, title: str, path: str) -> None:
    """Cumulative block hit ratio and the hit ratio of each window of trace time."""
    plt, fig, ax = _figure()
    tl = np.asarray(series["hit_ratio"], dtype=float).reshape(-1, 3)
    if len(tl):
        t = tl[:, 0] - tl[0, 0]
        cum = np.cumsum(tl[:, 1]) / np.maximum(np.cumsum(tl[:, 2]), 1)
        edges = np.linspace(t[0], t[-1] + 1e-9, 41)
        which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, 39)
        hit = np.bincount(which, tl[:, 1], 40)
        blocks = np.bincount(which, tl[:, 2], 40)
        mid = (edges[:-1] + edges[1:]) / 2
        ok = blocks > 0
        ax.bar(mid[ok], hit[ok] / blocks[ok], width=(edges[1] - edges[0]) * 0.9,
               color="#9ecae1", label="per window")
        ax.plot(t, cum, color="#08519c", lw=2, label="cumulative")
    ax.set_xlabel("trace time (s)")
    ax.set_ylabel("block hit ratio")
    ax.set_ylim(0, 1)
    _save(plt, fig, ax, title, "lower right", path)


def ttft_cdf(series: dict, title: str, path: str) -> None:
    """The modelled TTFT's CDF with and without the drive."""
    plt, fig, ax = _figure()
    for key, label, color in (("ttft_with_drive", "with the drive", "#08519c"),
                              ("ttft_without_drive", "without (recompute)", "#cb181d")):
        v = np.sort(np.asarray(series[key], dtype=float))
        if len(v):
            ax.step(np.maximum(v * 1e3, 1e-3), np.arange(1, len(v) + 1) / len(v), where="post",
                    label=f"{label}: p50 {np.percentile(v, 50) * 1e3:.1f} ms, "
                          f"p99 {np.percentile(v, 99) * 1e3:.1f} ms", color=color)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (ms, modelled)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    _save(plt, fig, ax, title, "upper left", path)


def drive_utilization(series: dict, title: str, path: str) -> None:
    """Utilization per window of trace time of the host link, the NAND channels and the
    compute units: busy time served in the window (at most its capacity; work booked beyond
    it is served in the windows after: UtilizationSeries)."""
    plt, fig, ax = _figure()
    pts = series["utilization"]
    if pts:
        t0 = pts[0][0]
        t = [p[0] - t0 for p in pts]
        for key, label in (("link", "host link"), ("nand_channels", "NAND channels"),
                           ("compute", "compute (TOPS budget)")):
            ax.plot(t, [100 * p[1][key] for p in pts], label=label, lw=1.5)
    ax.set_xlabel("trace time (s)")
    ax.set_ylabel("utilization (%)")
    ax.set_ylim(bottom=0)
    _save(plt, fig, ax, title, "upper right", path)


PLOTS = {"hit_ratio.png": hit_ratio_over_time, "ttft_cdf.png": ttft_cdf,
         "drive_utilization.png": drive_utilization}


def crossover(points: list, what: str, path: str) -> None:
    """TTFT p50 (solid) and p99 (dashed) with the drive and recomputing against the GPU's
    prefill rate (the replay's own rate and around it, in model mode)."""
    plt, fig, ax = _figure()
    x = [p["prefill_tokens_per_s"] for p in points]
    for key, label, color in (("ttft_with_drive_s", "with the drive", "#08519c"),
                              ("ttft_without_drive_s", "recompute (no drive)", "#cb181d")):
        ax.plot(x, [p[key]["p50"] for p in points], marker="o", color=color,
                label=f"{label}, p50")
        ax.plot(x, [p[key]["p99"] for p in points], marker="^", ls="--", color=color,
                label=f"{label}, p99")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("GPU prefill rate (tokens/s)")
    ax.set_ylabel("TTFT (s)")
    ax.grid(alpha=0.3)
    _save(plt, fig, ax, f"TTFT against prefill rate (model mode): {what}", "upper right",
          path)


def decode_policies(decodes: list, title: str, path: str) -> None:
    """Placement policies at trace scale: each one's TPOT CDF over requests, labelled with
    its bytes per token and the drift model's Future Missed Mass."""
    plt, fig, ax = _figure()
    for d in decodes:
        v = np.sort(np.asarray(d.get("tpot_per_request_s", []), dtype=float))
        if not len(v):
            continue
        moved = (d["link_bytes_per_token_mean"] + d["nand_bytes_per_token_mean"]) / 1e6
        ax.step(v * 1e3, np.arange(1, len(v) + 1) / len(v), where="post",
                label=f"{d['mode']}: p50 {np.percentile(v, 50) * 1e3:.2f} ms, "
                      f"{moved:.1f} MB/token, FMM {d['future_missed_mass']:.3f}")
    ax.set_xlabel("time per output token (ms, modelled: GPU step + the drive's)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    _save(plt, fig, ax, title, "lower right", path)


def write_plots(report: dict, series: dict, directory: str) -> list[str]:
    """All the PNGs into `directory` (created), the crossover when the report has its
    points; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    what = (f"{report['requests']:,} requests, {report['model']}, {report['profile']}, "
            f"{report['quant'] or 'fp16'}, {report['mode']} mode")
    out = []
    for name, fn in PLOTS.items():
        path = os.path.join(directory, name)
        fn(series, what, path)
        out.append(path)
    if report.get("crossover"):
        path = os.path.join(directory, "crossover.png")
        crossover(report["crossover"], what.replace(f", {report['mode']} mode", ""), path)
        out.append(path)
    tiers = [d for d in report.get("decodes", [report.get("decode") or {}])
             if "tpot_per_request_s" in d]
    if tiers:
        path = os.path.join(directory, "decode_policies.png")
        decode_policies(tiers, f"{what}; HBM {tiers[0]['budget_pct']:g}% of the context",
                        path)
        out.append(path)
    return out


def _drive_gb(cell, report) -> float | None:
    """A cell's drive capacity in GB (None: unbounded)."""
    from ssdemu.replay.serving import model_config

    blocks = report["capacity_blocks"]["drive"]
    if blocks is None:
        return None
    quant = None if cell.quant == "none" else cell.quant
    return blocks * model_config(cell.model).stored_block_bytes(quant) / 1e9


LINE_FIELDS = ("trace", "model", "quant", "prefill_rate", "capacity", "mode", "instances",
               "pool", "route")


def _label(cell, fields) -> str:
    parts = []
    for f in fields:
        v = getattr(cell, f)
        if f == "trace":
            parts.append(os.path.basename(v))
        elif f == "quant":
            parts.append("fp16" if v == "none" else v)
        elif f == "capacity":
            parts.append(v.replace("hbm=0,dram=0,", ""))
        else:
            parts.append(f"{f.replace('_', ' ')} {v}")
    return ", ".join(parts) or "all cells"


def _groups(ok, x_field: str):
    """Panels (one per profile) of lines (one per combination of the other fields that
    vary) of points along x_field; lines with fewer than two points are left out."""
    varying = [f for f in LINE_FIELDS if f != x_field
               and len({getattr(c, f) for c, _ in ok}) > 1]
    panels: dict = {}
    for c, rep in ok:
        line = tuple(getattr(c, f) for f in varying)
        panels.setdefault(c.profile, {}).setdefault(line, []).append((c, rep))
    panels = {p: {k: v for k, v in lines.items() if len(v) > 1}
              for p, lines in panels.items()}
    return {p: lines for p, lines in panels.items() if lines}, varying


def _grid(plt, rows: int, cols: int):
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols + 2.8, 3.6 * rows),
                             squeeze=False)
    return fig, axes


def _finish(plt, fig, axes, title: str, path: str) -> None:
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1 - 2.8 / fig.get_size_inches()[0], 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_sweep_plots(cells, results, directory: str) -> list[str]:
    """sweep_capacity.png: per profile, block hit ratio and TTFT p50 (solid) / p99 (dashed)
    with the drive against drive capacity, a line per combination of the other parameters
    that vary; sweep_prefill.png: per profile, TTFT p50 against the GPU's prefill rate, with
    the drive (a line per combination) and recomputing (black): where they meet, recompute
    has caught up.  A figure is written when some line has two points; returns the paths."""
    ok = [(c, r["report"]) for c, r in zip(cells, results, strict=True) if "report" in r]
    written = []
    panels, varying = _groups(ok, "capacity")
    if panels:
        plt = _pyplot()
        fig, axes = _grid(plt, 2, len(panels))
        finite = [g for lines in panels.values() for pts in lines.values()
                  for c, r in pts if (g := _drive_gb(c, r))]
        unbounded_x = 1.5 * max(finite) if finite else 1.0
        for col, (profile, lines) in enumerate(panels.items()):
            a1, a2 = axes[0][col], axes[1][col]
            for pts in lines.values():
                pts = sorted(pts, key=lambda p: _drive_gb(*p) or unbounded_x)
                x = [_drive_gb(c, r) or unbounded_x for c, r in pts]
                label = _label(pts[0][0], varying)
                color = a1.plot(x, [r["block_hit_ratio"] for _, r in pts], marker="o",
                                label=label)[0].get_color()
                a2.plot(x, [r["ttft_s"]["with_drive"]["p50"] for _, r in pts], marker="o",
                        color=color)
                a2.plot(x, [r["ttft_s"]["with_drive"]["p99"] for _, r in pts], marker="^",
                        ls="--", color=color)
            a1.set_title(profile)
            a1.set_ylabel("block hit ratio")
            a1.set_ylim(0, 1)
            a2.set_ylabel("TTFT with the drive (s): p50 —, p99 - -")
            a2.set_yscale("log")
            for ax in (a1, a2):
                ax.set_xlabel("drive capacity (GB; rightmost: unbounded)")
                ax.grid(alpha=0.3)
        path = os.path.join(directory, "sweep_capacity.png")
        _finish(plt, fig, axes, "hit ratio and TTFT against drive capacity", path)
        written.append(path)
    panels, varying = _groups(ok, "prefill_rate")
    if panels:
        plt = _pyplot()
        fig, axes = _grid(plt, 1, len(panels))
        for col, (profile, lines) in enumerate(panels.items()):
            ax = axes[0][col]
            recompute = {}
            for pts in lines.values():
                pts = sorted(pts, key=lambda p: p[1]["prefill_tokens_per_s"])
                x = [r["prefill_tokens_per_s"] for _, r in pts]
                ax.plot(x, [r["ttft_s"]["with_drive"]["p50"] for _, r in pts], marker="o",
                        label=_label(pts[0][0], varying))
                for xi, (_, r) in zip(x, pts, strict=True):
                    recompute[xi] = r["ttft_s"]["without_drive"]["p50"]
            xs = sorted(recompute)
            ax.plot(xs, [recompute[x] for x in xs], color="black", ls="--", marker="s",
                    label="recompute (no drive)")
            ax.set_title(profile)
            ax.set_xlabel("GPU prefill rate (tokens/s)")
            ax.set_ylabel("TTFT p50 (s)")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
        path = os.path.join(directory, "sweep_prefill.png")
        _finish(plt, fig, axes, "TTFT against the GPU's prefill rate: where recompute "
                "catches up", path)
        written.append(path)
    return written
