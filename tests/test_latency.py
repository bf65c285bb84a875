import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ssdemu.device import _device
from ssdemu.device.latency import BUCKETS, bucket_values_ns, new_histogram, percentiles_us

lib = _device.lib


@given(st.integers(min_value=0, max_value=(1 << 62)))
def test_bucket_value_within_one_percent(ns):
    b = lib.sde_hist_bucket(ns)
    assert 0 <= b < BUCKETS
    v = lib.sde_hist_value(b)
    assert abs(v - ns) <= max(1, ns / 100)


def test_buckets_monotonic():
    vals = bucket_values_ns()
    used = vals[: lib.sde_hist_bucket(1 << 62) + 1]
    assert (np.diff(used) > 0).all()


def test_percentiles_of_known_distribution():
    hist = new_histogram()
    samples = np.arange(1, 100_001) * 1000  # 1 us .. 100 ms, uniform
    for s in samples[::97]:
        hist[lib.sde_hist_bucket(int(s))] += 1
    p50, p99, p999 = percentiles_us(hist)
    ref = np.percentile(samples[::97] / 1000.0, [50, 99, 99.9])
    for got, want in zip((p50, p99, p999), ref, strict=True):
        assert abs(got - want) / want < 0.01


def test_empty_histogram_is_nan():
    assert all(np.isnan(v) for v in percentiles_us(new_histogram()))
