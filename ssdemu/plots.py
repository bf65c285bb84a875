"""`ssdemu replay --plot DIR`: three PNGs from a replay's series (matplotlib, Agg backend: no
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
    """Busy time booked per window of trace time on the host link, the NAND channels and the
    compute units (work is booked when its command arrives)."""
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


def write_plots(report: dict, series: dict, directory: str) -> list[str]:
    """All three PNGs into `directory` (created); returns their paths."""
    os.makedirs(directory, exist_ok=True)
    what = (f"{report['requests']:,} requests, {report['model']}, {report['profile']}, "
            f"{report['quant'] or 'fp16'}, {report['mode']} mode")
    out = []
    for name, fn in PLOTS.items():
        path = os.path.join(directory, name)
        fn(series, what, path)
        out.append(path)
    return out
