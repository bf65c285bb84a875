"""A stand-in for the MLPerf Storage KV-cache benchmark's kv-cache.py (tests/test_mount.py):
the arguments `bench mlperf-kv` passes, entries written as its file backend writes them (one
.npy a key, fsynced) and read back, one left short as a run's end leaves an entry whose
writer was cut off, and its JSON summary's fields.  Not the benchmark: its plumbing only."""

import argparse
import json
import os

import numpy as np

p = argparse.ArgumentParser()
for name in ("--model", "--num-users", "--duration", "--gpu-mem-gb", "--cpu-mem-gb",
             "--storage-capacity-gb", "--seed", "--cache-dir", "--output"):
    p.add_argument(name, required=True)
a = p.parse_args()
os.makedirs(a.cache_dir, exist_ok=True)
rng = np.random.default_rng(int(a.seed))
for i in range(3):
    data = rng.standard_normal((4, 2, 256, 8, 16)).astype(np.float16)
    with open(os.path.join(a.cache_dir, f"user{i}.npy"), "wb") as f:
        np.save(f, data, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    assert np.array_equal(np.load(os.path.join(a.cache_dir, f"user{i}.npy")), data)
with open(os.path.join(a.cache_dir, "user2.npy"), "r+b") as f:
    f.truncate(os.path.getsize(f.name) // 2)  # its writer cut off by the run's end
with open(a.output, "w") as f:
    json.dump({"summary": {
        "total_requests": 3, "avg_throughput_tokens_per_sec": 10.0,
        "storage_throughput_tokens_per_sec": 5.0,
        "storage_io_latency_ms": {"p50": 1.0, "p95": 2.0, "p99": 3.0},
        "cache_stats": {"cache_hit_rate": 0.5},
        "args": [a.model, a.num_users, a.duration, a.storage_capacity_gb]}}, f)
