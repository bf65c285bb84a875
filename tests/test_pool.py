"""Several serving instances: private drives against one pooled store, routing, the fabric,
the hash ring; in model mode, in data mode on real daemons, and at the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hostlib
from ssdemu.replay.data_mode import replay_data
from ssdemu.replay.model_mode import replay_model
from ssdemu.replay.pool import Fabric, FabricSpec, HashRing, parse_fabric
from ssdemu.replay.serving import model_config, parse_capacities
from ssdemu.sim.profile import load
from ssdemu.tools.daemon_process import DaemonProcess
from traces.mooncake import SAMPLE, Request, TraceReader
from traces.synthetic import generate, write

TINY = model_config("tiny")
PROFILE = load("star2000d")
SAMPLE_HEAD = list(TraceReader(SAMPLE))[:1200]


def _caps(text, quant="int8_g64"):
    return parse_capacities(text, {"hbm": TINY.block_bytes, "dram": TINY.block_bytes,
                                   "drive": TINY.stored_block_bytes(quant)})


def run(requests, capacity="drive=unbounded", **kw):
    return replay_model(requests, PROFILE, TINY, "int8_g64", _caps(capacity), **kw)


def _without_wall(r):
    return {k: v for k, v in r.items() if k not in ("wall_seconds", "requests_per_s",
                                                     "blocks_per_s")}


def test_one_instance_is_the_single_drive_replay_exactly():
    single = run(SAMPLE_HEAD)
    for pool in ("private", "pooled"):
        for route in ("round-robin", "prefix"):
            r = run(SAMPLE_HEAD, instances=1, pool=pool, route=route)
            assert r["fabric_bytes"] == 0
            assert _without_wall(r) | {"pool": "private", "route": "round-robin"} == \
                _without_wall(single)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_unbounded_pool_hits_what_one_drive_hits(k):
    """A pool of unbounded drives holds every block ever stored, wherever it hashed to: its
    hit ratio is the single drive's, exactly; remote hits cross the fabric."""
    single = run(SAMPLE_HEAD)
    pooled = run(SAMPLE_HEAD, instances=k, pool="pooled")
    assert pooled["block_hit_ratio"] == single["block_hit_ratio"]
    assert pooled["fabric_bytes"] > 0
    assert sum(q["requests"] for q in pooled["per_instance"]) == len(SAMPLE_HEAD)
    # request i went to instance i mod k
    assert [q["requests"] for q in pooled["per_instance"]] == \
        [len(range(i, len(SAMPLE_HEAD), k)) for i in range(k)]


@pytest.mark.parametrize("k,capacity", [(2, "drive=unbounded"), (4, "drive=unbounded"),
                                        (3, "drive=blocks:150")])
def test_private_drives_are_each_instances_own_replay(k, capacity):
    """Private: instance i's drive sees its round-robin share alone; its hits are exactly
    those of a single-drive replay of that share, and the total is their sum over all
    blocks."""
    private = run(SAMPLE_HEAD, capacity, instances=k, pool="private")
    assert private["fabric_bytes"] == 0
    hits = blocks = 0
    for i in range(k):
        share = SAMPLE_HEAD[i::k]
        alone = run(share, capacity)
        q = private["per_instance"][i]
        assert q["hit_blocks"] == alone["per_instance"][0]["hit_blocks"]
        assert q["blocks"] == alone["blocks"]
        assert q["ttft_s"]["with_drive"] == alone["ttft_s"]["with_drive"]
        hits += q["hit_blocks"]
        blocks += alone["blocks"]
    assert private["block_hit_ratio"] == hits / blocks
    assert private["block_hit_ratio"] < run(SAMPLE_HEAD, capacity)["block_hit_ratio"]


def test_bounded_drives_report_both_and_pooled_can_lose():
    """With small drives both are reported; neither is bound to win: hashing puts a hot
    prefix's blocks on a few drives, private drives keep their own copies."""
    for cap in ("drive=blocks:60", "drive=blocks:400"):
        r = {p: run(SAMPLE_HEAD, cap, instances=4, pool=p) for p in ("private", "pooled")}
        for p, x in r.items():
            assert 0 < x["block_hit_ratio"] <= run(SAMPLE_HEAD)["block_hit_ratio"], p
            assert x["evictions"]["drive"] > 0, p
            assert len(x["per_instance"]) == 4
        assert r["pooled"]["fabric_bytes"] > 0 == r["private"]["fabric_bytes"]


def test_prefix_routing_sends_a_request_where_its_prefix_is():
    """Round-robin sends the repeat of a request to the other instance's empty private drive;
    prefix routing sends it to the instance that holds it."""
    a = tuple(range(100, 108))
    b = tuple(range(200, 208))
    reqs = [Request(0, 8 * 512, 1, a), Request(1000, 8 * 512, 1, b),
            Request(2000, 8 * 512, 1, b), Request(3000, 8 * 512, 1, a)]
    rr = run(reqs, instances=2, pool="private")
    px = run(reqs, instances=2, pool="private", route="prefix")
    assert rr["block_hit_ratio"] == 0
    assert px["block_hit_ratio"] == 0.5  # both repeats hit: 16 of 32 blocks
    assert [q["requests"] for q in px["per_instance"]] == [2, 2]


def test_pooled_remote_hits_wait_for_the_fabric():
    """The same pooled replay with a slower fabric: the same hits, later loads."""
    fast = run(SAMPLE_HEAD, instances=4, pool="pooled", fabric=FabricSpec(400e9, 1000.0))
    slow = run(SAMPLE_HEAD, instances=4, pool="pooled", fabric=FabricSpec(1e9, 100_000.0))
    assert fast["block_hit_ratio"] == slow["block_hit_ratio"]
    assert fast["fabric_bytes"] == slow["fabric_bytes"] > 0
    assert slow["drive_load_ms"]["p50"] > fast["drive_load_ms"]["p50"]
    assert slow["ttft_s"]["with_drive"]["mean"] > fast["ttft_s"]["with_drive"]["mean"]


def test_fabric_books_both_ends():
    f = Fabric(3, FabricSpec(1e9, 500.0))  # 1 byte per ns
    assert f.move(0, 0, 10.0, 1000) == 10.0 and f.bytes == 0  # local: no fabric
    assert f.move(0, 1, 0.0, 1000) == 1500.0
    assert f.move(2, 1, 0.0, 1000) == 2500.0  # node 1's ingress is busy until 1000
    assert f.move(0, 2, 0.0, 1000) == 2500.0  # node 0's egress too
    assert f.bytes == 3000 and f.transfers == 3


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 12), blocks=st.lists(st.integers(0, 2**40), min_size=1,
                                             max_size=200))
def test_hash_ring_is_consistent(n, blocks):
    ring, grown = HashRing(n), HashRing(n + 1)
    for b in blocks:
        h = ring.home(b)
        assert 0 <= h < n and HashRing(n).home(b) == h  # deterministic
        g = grown.home(b)
        assert g == h or g == n  # a new drive only takes keys, never reshuffles


def test_hash_ring_shares_are_balanced():
    ring = HashRing(8)
    counts = [0] * 8
    for b in range(40_000):
        counts[ring.home(b)] += 1
    assert max(counts) / min(counts) < 1.25, counts


@pytest.mark.parametrize("text,msg", [("fast", "bad fabric"), ("0,5", "positive"),
                                      ("25", "bad fabric")])
def test_bad_fabric(text, msg):
    with pytest.raises(ValueError, match=msg):
        parse_fabric(text)
    assert parse_fabric("25,5") == FabricSpec(25e9, 5000.0)


@pytest.mark.parametrize("pool,cap", [("pooled", "drive=unbounded"),
                                      ("private", "drive=blocks:40")])
def test_data_mode_pool_agrees_with_model_mode(tmp_path, pool, cap):
    """Two daemons as a pooled store or as private drives: the drives' own prefix matches
    give the model's hits exactly, every block read back is right, and the fabric carries
    the same bytes."""
    trace = generate(60, seed=3, share=0.8, prefixes=5, prefix_blocks=6,
                     mean_input_tokens=3000)
    daemons = [DaemonProcess(str(tmp_path / f"s{k}.sock"), media="mem:512M",
                             extra=["--clock", "virtual"]) for k in range(2)]
    try:
        model = run(trace, cap, instances=2, pool=pool)
        with hostlib.connect(daemons[0].socket_path) as d0, \
                hostlib.connect(daemons[1].socket_path) as d1:
            data = replay_data([d0, d1], trace, PROFILE, TINY, "int8_g64", _caps(cap),
                               pool=pool)
        for key in ("block_hit_ratio", "evictions", "fabric_bytes", "host_link_bytes",
                    "nand_bytes"):
            assert data[key] == model[key], key
        assert data["block_hit_ratio"] > 0.3
        assert data["data"]["data_errors"] == 0
        assert data["data"]["match_mismatches"] == 0
        assert data["data"]["blocks_verified"] > 0
        for q in ("p50", "p99", "mean"):
            a, b = data["ttft_s"]["with_drive"][q], model["ttft_s"]["with_drive"][q]
            assert abs(a - b) <= 0.02 * b, q
    finally:
        for d in daemons:
            assert d.terminate()[0] == 0


@pytest.mark.slow
def test_cli_pool(tmp_path):
    path = tmp_path / "t.jsonl"
    write(generate(80, seed=4), str(path))
    base = [sys.executable, "-m", "ssdemu", "replay", str(path), "--model", "tiny",
            "--no-progress"]
    p = subprocess.run(base + ["--instances", "3", "--pool", "pooled", "--fabric", "10,8",
                               "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["instances"] == 3 and r["pool"] == "pooled" and r["fabric_bytes"] > 0
    assert r["fabric"] == {"bytes_per_s": 10e9, "latency_ns": 8000.0}
    p = subprocess.run(base + ["--instances", "3", "--route", "prefix"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and "instance 2:" in p.stdout and "private drives" in p.stdout
    for args, msg in ((["--instances", "0"], "--instances"),
                      (["--fabric", "x"], "bad fabric"),
                      (["--pool", "shared"], "--pool"),
                      (["--mode", "data", "--instances", "2", "--socket", "/nonexistent"],
                       "1 sockets for 2 instances"),
                      (["--mode", "data", "--instances", "2", "--media", "block:/dev/null"],
                       "cannot hold 2 drives")):
        p = subprocess.run(base + args, capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and msg in p.stderr, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 or "usage" in p.stderr


def test_bench_hops_measures_each_hop_against_memcpy():
    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "hops", "--value", "2M",
                        "--rounds", "3", "--json"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["data_ok"] and r["value_bytes"] == 2 << 20
    assert r["drive_get_vs_memcpy"] == pytest.approx(r["drive_get_s"] / r["memcpy_s"])
    assert r["tcp_vs_memcpy"] == pytest.approx(r["tcp_loopback_s"] / r["memcpy_s"])
    assert r["remote_get_s"] > r["drive_get_s"] > 0 and r["tcp_64b_round_trip_us"] > 0
