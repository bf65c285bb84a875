"""`ssdemu bench fairness`: the worst legal retrieval of one client beside another's short
ones, through a real daemon (the figures are the bench's to report; this checks that each
part ran and what it reports is consistent)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ssdemu.bench.fairness import _worst
from ssdemu.device.retrieval import DECODED_BYTES
from ssdemu_wire import layout as W


def test_every_hog_is_at_a_bound_and_within_all_of_them():
    """Each worst case is legal (hostlib would send it) and sits at the bound it names."""
    for kind in ("keys", "scored", "rerank", "result", "memory"):
        w = _worst(kind)
        a = w["args"]
        pages = w["blocks"] * -(-w["tokens"] // a["page_tokens"])
        assert W.retrieval_over_limit("TOPK_PAGES", kv_heads=w["heads"], head_dim=w["dim"],
                                      nkeys=w["blocks"], sink_pages=1, recent_pages=1,
                                      rerank=a.get("rerank", 1), k=a["k"],
                                      page_tokens=a["page_tokens"]) is None
        assert w["heads"] * pages * w["dim"] <= W.RETRIEVAL_MAX_SCORED
        at = {"keys": w["blocks"] == W.RETRIEVAL_MAX_KEYS,
              "scored": w["heads"] * pages * w["dim"] == W.RETRIEVAL_MAX_SCORED,
              "rerank": w["heads"] * a["k"] * a.get("rerank", 1) * a["page_tokens"]
              * w["dim"] == W.RETRIEVAL_MAX_READ,
              "result": w["heads"] * a["k"] * 8 == W.RETRIEVAL_MAX_RESULT,
              "memory": w["blocks"] == W.RETRIEVAL_MAX_KEYS
              and w["blocks"] * w["tokens"] * 2 * w["heads"] * w["dim"] * 2 == DECODED_BYTES}
        assert at[kind], kind


@pytest.mark.slow
def test_bench_fairness_json():
    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "fairness", "--hogs",
                        "scored", "--seconds", "0.3", "--media", "mem:256M", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["neighbours"] == 0  # none asked for (test_bench_neighbours: with some)
    h = r["hogs"]["scored"]
    assert h["hog_command"]["n"] >= 1 and h["topk"]["n"] >= 1 and h["nop"]["n"] >= 1
    assert r["alone"]["topk"]["n"] >= 1 and r["beside_a_spinning_process"]["nop"]["n"] >= 1
    assert h["topk_p99_vs_alone"] == pytest.approx(
        h["topk"]["p99_ms"] / r["alone"]["topk"]["p99_ms"])
    assert r["bounds"]["scored"] == W.RETRIEVAL_MAX_SCORED


def test_bench_fairness_bad_hog_is_one_line():
    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "fairness", "--hogs", "x"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert p.stderr.strip().count("\n") == 0 and "--hogs" in p.stderr
