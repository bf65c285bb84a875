"""`ssdemu bench keepup`: a decode step's retrieval commands on the real clock, and each one's
host lag as the daemon reports it (the figures are the bench's; this checks what it reports
is consistent with itself and with the daemon's log page)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_bench_keepup_json():
    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "keepup", "--context", "256",
                        "--tokens", "2", "--media", "mem:256M", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["neighbours"] == 0
    assert r["commands"] == 2 * 2 * r["layers"]  # a TOPK and an ATTEND per layer per token
    assert r["budget_pages"] == 2  # 12% of 16 pages
    assert 0 < r["modelled_ms_per_command"] and 0 < r["host_ms_per_command"]
    assert r["host_vs_modelled"] == pytest.approx(r["host_ms_per_command"]
                                                  / r["modelled_ms_per_command"])
    assert r["modelled_ms_per_token"] == pytest.approx(
        r["modelled_ms_per_command"] * r["commands"] / 2)
    lag = r["host_lag_us"]
    assert 0 <= lag["late_commands"] <= r["commands"]
    assert lag["p50"] <= lag["p99"] <= lag["p999"]
    # the median command is late exactly when more than half of them were
    assert (lag["p50"] > 0) == (lag["late_commands"] > r["commands"] / 2)


def test_bench_keepup_bad_context_is_one_line():
    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "keepup", "--context", "100"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert p.stderr.strip().count("\n") == 0 and "--context" in p.stderr
