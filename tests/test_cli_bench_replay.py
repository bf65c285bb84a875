"""`ssdemu bench replay`: the CLI call timed against the page-by-page baseline."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from ssdemu.bench.replay import bench_replay
from traces.synthetic import generate, write


def test_bench_replay_json(tmp_path):
    trace = tmp_path / "t.jsonl"
    write(generate(200, seed=4, share=0.7), str(trace))
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "replay", "--trace",
                        str(trace), "--model", "tiny", "--json"],
                       capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    # the replay it timed is the one a user runs: the same figures as `ssdemu replay`
    q = subprocess.run([sys.executable, "-m", "ssdemu", "replay", str(trace), "--model",
                        "tiny", "--json", "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    assert q.returncode == 0, q.stderr
    own = json.loads(q.stdout)
    assert r["requests"] == own["requests"] == 200
    assert r["block_hit_ratio"] == own["block_hit_ratio"] and 0 < r["block_hit_ratio"] < 1
    # the timed call fits inside this whole bench run, and the replay inside the call
    assert wall > r["cli_wall_s"] > r["replay_wall_s"] > 0
    assert r["baseline_page_by_page_replay_s"] > 0
    assert abs(r["ttft_p50_ratio_bulk_vs_page"] - 1) <= 0.02


def test_bench_replay_bad_trace_is_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "replay", "--trace", str(bad),
                        "--model", "tiny", "--no-baseline"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and p.stderr.startswith("ssdemu: error: ")
    assert "bad.jsonl:1" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_bench_replay_bounded_pairs_and_their_ratio(tmp_path):
    """--bounded: each unbounded run followed by one with a small drive tier (every miss
    evicts); the medians and the per-pair ratios are what the runs' own JSON says."""
    trace = tmp_path / "t.jsonl"
    write(generate(300, seed=5, share=0.7), str(trace))
    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "replay", "--trace",
                        str(trace), "--model", "tiny", "--no-baseline", "--bounded", "20",
                        "--repeat", "3", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    b = r["bounded"]
    assert len(r["replay_wall_s_runs"]) == len(b["replay_wall_s_runs"]) == 3
    assert r["replay_wall_s"] == sorted(r["replay_wall_s_runs"])[1]
    assert b["replay_wall_s"] == sorted(b["replay_wall_s_runs"])[1]
    assert b["vs_unbounded_runs"] == [y / x for x, y in zip(r["replay_wall_s_runs"],
                                                            b["replay_wall_s_runs"],
                                                            strict=True)]
    assert b["vs_unbounded"] == sorted(b["vs_unbounded_runs"])[1]
    assert r["blocks_per_s"] == r["blocks"] / r["replay_wall_s"]
    # a drive of 20 blocks holds less than the unbounded one: fewer hits, evictions, GC
    assert b["capacity_blocks"] == 20 and b["evictions"] > 0 and b["erases"] > 0
    assert b["block_hit_ratio"] < r["block_hit_ratio"]


@pytest.mark.parametrize("args, says", [
    (["--bounded", "0"], "argument --bounded: must be positive: '0'"),
    (["--repeat", "x"], "argument --repeat: not a whole number: 'x'")])
def test_bench_replay_bad_counts_are_one_line(args, says):
    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "replay", *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip() == f"ssdemu: error: {says}"


@pytest.mark.parametrize("kwargs, says", [
    ({"bounded": 0}, "the bounded drive needs at least 1 block, got 0"),
    ({"repeat": 0}, "repeat must be at least 1, got 0")])
def test_bench_replay_refuses_bad_counts_before_running(kwargs, says):
    with pytest.raises(ValueError, match=says):
        bench_replay(trace="/nonexistent.jsonl", **kwargs)
