"""`ssdemu bench replay`: the CLI call timed against the page-by-page baseline."""

from __future__ import annotations

import json
import subprocess
import sys

from traces.synthetic import generate, write


def test_bench_replay_json(tmp_path):
    trace = tmp_path / "t.jsonl"
    write(generate(200, seed=4, share=0.7), str(trace))
    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "replay", "--trace",
                        str(trace), "--model", "tiny", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["requests"] == 200 and 0 < r["block_hit_ratio"] < 1
    assert r["cli_wall_s"] > r["replay_wall_s"] > 0
    assert r["requests_per_s"] == r["requests"] / r["cli_wall_s"]
    assert r["within_bar"] == (r["cli_wall_s"] <= r["bar_s"])
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
