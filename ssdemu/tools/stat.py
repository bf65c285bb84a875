"""`ssdemu stat --socket PATH [INTERVAL] [--count N]`: a live per-interval table of a running
drive, in the manner of iostat and `nvme top`: a header, then one row per interval from the
difference of two log pages, flushed as it is printed (also into a pipe).  `interval_row`
is the pure part."""

from __future__ import annotations

import sys
import time

import hostlib

# compute utilization per kernel class: the drive's compute units busy with it (the TOPS
# budget's modelled device time over the interval and the units)
KERNELS = {"q%": "quantize", "dq%": "dequantize", "ph%": "prefix_hash", "pm%": "prefix_match"}
COLUMNS = [("r/s", 8), ("w/s", 8), ("rMB/s", 8), ("wMB/s", 8), ("kv/s", 8), ("kvMB/s", 8),
           ("cmp/s", 7), ("p50us", 8), ("p99us", 8), ("qd", 6), ("cmp%", 6),
           *((name, 5) for name in KERNELS), ("err", 5)]
DATA_CLASSES = ("read", "write", "flush", "zero", "kv", "compute")


def _quantile(hist: dict[int, int], q: float) -> float:
    """The q-quantile of log2 buckets (bucket b: [2^b, 2^(b+1)) ns), at the bucket's
    geometric middle: the table's resolution is a factor of two, said in its header."""
    total = sum(hist.values())
    if not total:
        return 0.0
    seen = 0
    for b in sorted(hist):
        seen += hist[b]
        if seen >= q * total:
            return 2.0 ** (b + 0.5)
    return 2.0 ** (max(hist) + 0.5)


def interval_row(prev: dict, cur: dict, seconds: float, compute_units: int) -> dict:
    """The figures of one interval between two log pages taken `seconds` apart."""
    def d(cls, key):
        return cur["classes"][cls][key] - prev["classes"][cls][key]

    hist: dict[int, int] = {}
    lat_total = 0
    for cls in DATA_CLASSES:
        a = prev["classes"][cls]["latency_histogram_log2_ns"]
        for b, n in cur["classes"][cls]["latency_histogram_log2_ns"].items():
            delta = n - a.get(b, 0)
            if delta:
                hist[int(b)] = hist.get(int(b), 0) + delta
        lat_total += d(cls, "latency_ns_total")
    def busy_of(name):
        return (cur["compute"].get(name, {}).get("device_ns", 0)
                - prev["compute"].get(name, {}).get("device_ns", 0))

    capacity = seconds * 1e9 * max(1, compute_units)
    busy = sum(busy_of(name) for name in cur["compute"])
    per_kernel = {col: 100.0 * busy_of(name) / capacity for col, name in KERNELS.items()}
    return {**per_kernel,
        "r/s": d("read", "commands") / seconds, "w/s": d("write", "commands") / seconds,
        "rMB/s": d("read", "bytes") / seconds / 1e6, "wMB/s": d("write", "bytes") / seconds / 1e6,
        "kv/s": d("kv", "commands") / seconds, "kvMB/s": d("kv", "bytes") / seconds / 1e6,
        "cmp/s": d("compute", "commands") / seconds,
        "p50us": _quantile(hist, 0.50) / 1e3, "p99us": _quantile(hist, 0.99) / 1e3,
        # Little's law: the mean number of commands in flight
        "qd": lat_total / (seconds * 1e9),
        "cmp%": 100.0 * busy / capacity,
        "err": sum(d(cls, "errors") for cls in cur["classes"]),
    }


def header() -> str:
    return "time     " + "".join(f"{name:>{w}}" for name, w in COLUMNS)


def format_row(row: dict, when: float) -> str:
    cells = []
    for name, w in COLUMNS:
        v = row[name]
        cells.append(f"{v:>{w}.0f}" if name in ("err",) or v >= 100 else f"{v:>{w}.1f}")
    return time.strftime("%H:%M:%S ", time.localtime(when)) + "".join(cells)


def run(socket_path: str, interval: float, count: int | None, out=sys.stdout) -> int:
    with hostlib.connect(socket_path, entries=8) as dev:
        units = dev.identify().get("compute_units", 1)
        print(f"ssdemu stat {socket_path}: every {interval:g} s; latency quantiles to a "
              "factor of two (log2 buckets); qd = mean commands in flight", file=out)
        print(header(), file=out, flush=True)
        prev, t_prev = dev.log(), time.monotonic()
        n = 0
        while count is None or n < count:
            time.sleep(max(0.0, t_prev + interval - time.monotonic()))
            cur, t = dev.log(), time.monotonic()
            print(format_row(interval_row(prev, cur, t - t_prev, units), time.time()),
                  file=out, flush=True)
            prev, t_prev = cur, t
            n += 1
    return 0
