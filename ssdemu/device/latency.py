"""Latency histograms filled by the C engine: bucket values and percentiles (pure numpy)."""

from functools import lru_cache

import numpy as np

from ssdemu.device import _device

BUCKETS = _device.lib.SDE_HIST_BUCKETS


@lru_cache(maxsize=1)
def bucket_values_ns() -> np.ndarray:
    """The representative latency of every bucket, from the C definition itself."""
    return np.array([_device.lib.sde_hist_value(b) for b in range(BUCKETS)], dtype=np.float64)


def new_histogram() -> np.ndarray:
    return np.zeros(BUCKETS, dtype=np.uint64)


def percentiles_us(hist: np.ndarray, pcts=(50.0, 99.0, 99.9)) -> list[float]:
    """Percentiles in microseconds: the smallest bucket whose cumulative count reaches p%."""
    total = int(hist.sum())
    if total == 0:
        return [float("nan")] * len(pcts)
    cum = np.cumsum(hist, dtype=np.uint64)
    values = bucket_values_ns()
    out = []
    for p in pcts:
        rank = max(1, int(np.ceil(total * p / 100.0)))
        idx = int(np.searchsorted(cum, rank, side="left"))
        out.append(values[idx] / 1000.0)
    return out
