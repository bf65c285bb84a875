"""Traces and model-mode replay: the reader, the generator, exact hit accounting."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ssdemu.replay.model_mode import replay_model
from ssdemu.replay.serving import LRUTier, SyntheticKV, drive_key, model_config, parse_capacities
from ssdemu.sim.profile import load
from traces.mooncake import SAMPLE, Request, TraceError, TraceReader
from traces.synthetic import generate, write

TINY = model_config("tiny")
SIZES = {"hbm": TINY.block_bytes, "dram": TINY.block_bytes,
         "drive": TINY.stored_block_bytes("int8_g64")}


def replay(requests, capacity="drive=unbounded", quant="int8_g64"):
    return replay_model(requests, load("star2000d"), TINY, quant,
                        parse_capacities(capacity, SIZES))


def req(t, ids):
    return Request(t, len(ids) * 512, 1, tuple(ids))


def test_the_sample_trace_reads_whole():
    r = TraceReader(SAMPLE)
    reqs = list(r)
    assert len(reqs) == 3993 and r.skipped == 0
    assert sum(len(x.hash_ids) for x in reqs) == 121877
    assert len({h for x in reqs for h in x.hash_ids}) == 43924


def test_unbounded_drive_gives_the_published_0640():
    r = replay(TraceReader(SAMPLE))
    assert round(r["block_hit_ratio"], 3) == 0.640
    assert r["tier_hit_ratio"]["drive"] == r["block_hit_ratio"]
    assert r["ttft_s"]["with_drive"]["p50"] <= r["ttft_s"]["without_drive"]["p50"]


def test_bulk_timing_agrees_with_page_timing_on_a_replay():
    """The replay's modelled times with the bulk path (the default) and page by page, on the
    first 300 requests of the sample with an 8B model (34 MiB blocks)."""
    reqs = list(TraceReader(SAMPLE))[:300]
    llama = model_config("llama-3-8b")
    caps = parse_capacities("drive=unbounded", {"hbm": 1, "dram": 1, "drive": 1})
    runs = [replay_model(reqs, load("star2000d"), llama, "int8_g64", caps, bulk_pages=b)
            for b in (None, 0)]
    bulk, paged = runs
    assert bulk["block_hit_ratio"] == paged["block_hit_ratio"]
    for q in ("p50", "p99", "mean"):
        a, b = bulk["ttft_s"]["with_drive"][q], paged["ttft_s"]["with_drive"][q]
        assert abs(a - b) <= 0.02 * b, (q, a, b)
    # the same busy time booked on each resource (utilization times the span of the work),
    # and that span within the same 2% as the completion times
    sb, sp = bulk["drive_utilization_span_s"], paged["drive_utilization_span_s"]
    assert abs(sb - sp) <= 0.02 * sp
    for k in ("link", "nand_channels"):
        assert bulk["drive_utilization"][k] * sb == pytest.approx(
            paged["drive_utilization"][k] * sp, rel=1e-6)


def test_hand_made_traces_exact():
    trace = [req(0, [1, 2, 3]), req(1, [1, 2, 4]), req(2, [9, 2, 3]), req(3, [1, 2, 3, 4])]
    # hits: 0, then 2 (1,2), then 0 (9 breaks the run), then 4 (1,2,3,4): 6 of 13 blocks
    assert replay(trace)["block_hit_ratio"] == pytest.approx(6 / 13)
    # a drive of 3 blocks: LRU by block count
    r = replay(trace, "drive=blocks:3")
    # after r0: [1,2,3]; r1 hits 1,2 -> [3,1,2,4] -> evict 3 -> [1,2,4]; r2 hits 0 ->
    # [9,2,3] after evictions; r3: 1 missing -> 0 hits
    assert r["block_hit_ratio"] == pytest.approx(2 / 13)


def test_tiers_are_inclusive_and_the_fastest_serves():
    trace = [req(0, [1, 2, 3, 4]), req(1, [1, 2, 3, 4])]
    r = replay(trace, "hbm=blocks:2,dram=blocks:3,drive=unbounded")
    # hbm holds 3,4 (the last two): its leading run is 0; dram holds 2,3,4: 0; drive all 4
    assert r["tier_hit_ratio"] == {"hbm": 0.0, "dram": 0.0, "drive": pytest.approx(4 / 8)}
    trace = [req(0, [1, 2]), req(1, [1, 2, 3])]
    r = replay(trace, "hbm=blocks:2,dram=blocks:3,drive=unbounded")
    assert r["tier_hit_ratio"]["hbm"] == pytest.approx(2 / 5)


@settings(deadline=None, max_examples=10)
@given(seed=st.integers(0, 1000))
def test_hit_ratio_never_falls_as_capacity_grows(seed):
    trace = generate(150, seed=seed, prefixes=5, prefix_blocks=6, mean_input_tokens=3000)
    ratios = [replay(trace, f"drive=blocks:{n}", quant=None)["block_hit_ratio"]
              for n in (0, 10, 50, 200, 1000)]
    ratios.append(replay(trace, "drive=unbounded", quant=None)["block_hit_ratio"])
    assert ratios == sorted(ratios)


def test_lru_tier():
    t = LRUTier(3)
    t.touch_all([1, 2, 3])
    t.touch_all([1, 4])  # 2 is now the least recent
    assert list(t.blocks) == [3, 1, 4] and t.evictions == 1
    assert t.leading_run([3, 1, 5]) == 2 and LRUTier(0).leading_run([1]) == 0


def test_generator_is_seeded_and_shares_prefixes(tmp_path):
    a, b = generate(50, seed=3), generate(50, seed=3)
    assert a == b and a != generate(50, seed=4)
    for r in a:
        assert len(r.hash_ids) == -(-r.input_length // 512)
    low = replay(generate(300, seed=1, share=0.1), quant=None)["block_hit_ratio"]
    high = replay(generate(300, seed=1, share=0.9), quant=None)["block_hit_ratio"]
    assert high > low
    path = tmp_path / "t.jsonl"
    write(a, str(path))
    assert list(TraceReader(path)) == a


@pytest.mark.parametrize("line,reason", [
    ("not json", "not JSON"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1}', "missing 'hash_ids'"),
    ('{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1]}',
     "1 hash_ids for 1000 input tokens"),
    ('{"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [1]}',
     "non-negative"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["x"]}',
     "list of non-negative integers"),
    ('[1, 2]', "not a JSON object"),
])
def test_bad_lines_name_file_and_line(tmp_path, line, reason):
    path = tmp_path / "bad.jsonl"
    good = '{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [1]}'
    path.write_text(good + "\n" + line + "\n" + good + "\n")
    with pytest.raises(TraceError, match=rf"bad.jsonl:2: .*{reason}"):
        list(TraceReader(path))
    r = TraceReader(path, skip_bad=True)
    assert len(list(r)) == 2 and r.skipped == 1


def test_bad_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = b'{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
    path.write_bytes(good + b'{"timestamp": 6, \xff\xfe}\n' + good)
    with pytest.raises(TraceError, match=r"bad.jsonl:2: not UTF-8 \(byte 18\)"):
        list(TraceReader(path))
    r = TraceReader(path, skip_bad=True)
    assert len(list(r)) == 2 and r.skipped == 1


def test_timestamps_must_not_go_back(tmp_path):
    path = tmp_path / "t.jsonl"
    write([req(10, [1]), req(5, [2])], str(path))
    with pytest.raises(TraceError, match=":2: timestamp 5 goes back"):
        list(TraceReader(path))


@pytest.mark.parametrize("text,msg", [("ssd=1G", "bad capacity"), ("drive=blocks:x", "block count"),
                                      ("drive=12Q", "bad size")])
def test_bad_capacities(text, msg):
    with pytest.raises(ValueError, match=msg):
        parse_capacities(text, SIZES)


def test_capacity_in_bytes_uses_the_stored_block_size():
    caps = parse_capacities("hbm=1M,drive=1M", SIZES)
    assert caps["hbm"] == (1 << 20) // TINY.block_bytes
    assert caps["drive"] == (1 << 20) // SIZES["drive"] > caps["hbm"]  # quantized: more fit
    assert caps["dram"] == 0


def test_drive_keys():
    assert len(drive_key(7)) == 16 and drive_key(7) != drive_key(8)
    assert drive_key(2**64 - 1)[:8] == b"\xff" * 8


@settings(max_examples=25, deadline=None)
@given(ids=st.integers(1, 5000), a=st.integers(0, 20000), b=st.integers(0, 20000))
def test_synthetic_blocks_are_windows_of_one_sequence(ids, a, b):
    """Data mode's values: block b starts at the sequence's (b mod ids)-th value; a view,
    and a copy of it; its sample is its elements; blocks of ids below `ids` differ."""
    import numpy as np

    kv = SyntheticKV(TINY, ids=ids)
    wa = kv.window(a)
    assert wa.shape == kv.shape and wa.base is not None  # a view, not a copy
    assert np.array_equal(kv.block(a), wa) and kv.block(a).base is None
    index = np.array([0, 5, wa.size - 1])
    assert np.array_equal(kv.sample(a, index), wa.reshape(-1)[index])
    same = a % ids == b % ids
    assert np.array_equal(wa, kv.window(b)) == same  # ids past `ids` wrap around


def test_synthetic_blocks_can_live_in_a_given_buffer():
    import numpy as np

    kv = SyntheticKV(TINY, ids=100)
    before = kv.block(42)
    mem = np.zeros(kv.values.size, np.uint16)
    kv.place(mem)
    assert np.shares_memory(kv.window(42), mem) and np.array_equal(kv.window(42), before)
    with pytest.raises(ValueError, match="uint16 values"):
        kv.place(np.zeros(10, np.uint16))
    with pytest.raises(ValueError, match="ids must be positive"):
        SyntheticKV(TINY, ids=0)


def test_plot_draws_the_crossover_of_recompute_and_the_drive(tmp_path):
    """--plot adds TTFT against prefill rate around the replay's own, with and without the
    drive: a faster GPU never makes recomputing slower, the replay's own point is its
    report's, and with a GPU 4x slower the drive wins."""
    path = tmp_path / "t.jsonl"
    write(generate(150, seed=3, share=0.8, rate_per_s=20.0), str(path))
    p = subprocess.run([sys.executable, "-m", "ssdemu", "replay", str(path), "--model", "tiny",
                        "--json", "--no-progress", "--plot", str(tmp_path / "p")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    pts = r["crossover"]
    rates = [q["prefill_tokens_per_s"] for q in pts]
    assert rates == sorted(rates) and len(rates) == 5
    assert rates[2] == r["prefill_tokens_per_s"]
    assert pts[2]["ttft_with_drive_s"] == r["ttft_s"]["with_drive"]
    without = [q["ttft_without_drive_s"]["p50"] for q in pts]
    assert all(a >= b for a, b in zip(without, without[1:], strict=False))
    assert pts[0]["ttft_with_drive_s"]["p50"] < pts[0]["ttft_without_drive_s"]["p50"]
    png = (tmp_path / "p" / "crossover.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and str(tmp_path / "p" / "crossover.png") in r["plots"]


def test_cli_replay(tmp_path):
    path = tmp_path / "t.jsonl"
    write(generate(100, seed=2), str(path))
    p = subprocess.run([sys.executable, "-m", "ssdemu", "replay", str(path), "--model", "tiny",
                        "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert 0 < r["block_hit_ratio"] < 1 and r["requests"] == 100
    # the figures, not just their names: they add up, and they say what a drive tier does
    assert sum(r["tier_hit_ratio"].values()) == pytest.approx(r["block_hit_ratio"])
    assert r["tier_hit_ratio"]["drive"] > 0
    assert 0 < r["prefill_tokens_saved"] <= sum(q.input_length for q in generate(100, seed=2))
    assert r["host_link_bytes"] > 0 and r["nand_bytes"] > 0
    assert r["compression_ratio"] >= 1
    assert r["blocks_per_s"] == pytest.approx(r["blocks"] / r["wall_seconds"])
    assert r["blocks_per_s"] > r["requests_per_s"] > 0
    ttft = r["ttft_s"]
    assert 0 < ttft["with_drive"]["p50"] <= ttft["without_drive"]["p50"]
    assert all(0 <= v for v in r["drive_utilization"].values()) and r["host_lag"] >= 0
    with open(path, "a") as f:
        f.write("garbage\n")
    p = subprocess.run([sys.executable, "-m", "ssdemu", "replay", str(path), "--model", "tiny"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and f"{path}:101: not JSON" in p.stderr
    p = subprocess.run([sys.executable, "-m", "ssdemu", "replay", str(path), "--model", "tiny",
                        "--skip-bad"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "skipped 1 bad lines" in p.stdout


UNBOUNDED = parse_capacities("drive=unbounded", {"hbm": 1, "dram": 1, "drive": 1})


@settings(deadline=None, max_examples=15)
@given(st.integers(0, 10_000), st.sampled_from(["star2000d", "pcie4-tlc"]),
       st.sampled_from([None, "int8_g64", "int4_g64"]), st.integers(1, 40))
def test_utilization_never_exceeds_one(seed, profile, quant, gap_ms):
    """Work booked near a trace's end runs past its last arrival: utilization is over the
    span in which the work ran, so no resource is ever more than fully busy, however dense
    the trace (down to 1 ms between requests of up to 8 blocks)."""
    import random

    r = random.Random(seed)
    reqs, t = [], 0
    for _ in range(60):
        t += r.randint(0, gap_ms)
        n = r.randint(1, 8)
        start = r.randint(0, 30)
        reqs.append(Request(t, n * 512, 16, tuple(range(start, start + n))))
    rep = replay_model(reqs, load(profile), model_config("llama-3-8b"), quant,
                       UNBOUNDED)
    assert rep["drive_utilization_span_s"] * 1000 >= t - reqs[0].timestamp_ms
    for name, u in rep["drive_utilization"].items():
        assert 0 <= u <= 1.0 + 1e-9, (name, u)


def test_an_overloaded_baseline_is_named():
    """The bundled trace at the default prefill rate offers the no-drive GPU more than it can
    do (the comparison is then against a queue that grows without bound): the report says
    so, in numbers and in a warning."""
    reqs = list(TraceReader(SAMPLE))
    rep = replay_model(reqs, load("star2000d"), model_config("llama-3-8b"), None,
                       UNBOUNDED)
    assert rep["baseline_gpu_offered_load"] > 1
    assert any("overloaded" in w for w in rep["warnings"])
    half = reqs[::3]  # a third of the requests over the same span: a GPU that keeps up
    rep = replay_model(half, load("star2000d"), model_config("llama-3-8b"), None,
                       UNBOUNDED)
    assert rep["baseline_gpu_offered_load"] < 1 and rep["warnings"] == []


def test_prefill_rate_auto_gives_a_baseline_that_keeps_up():
    from ssdemu.replay.job import ReplayJob, run

    common = {"trace": str(SAMPLE), "profile": "star2000d", "model": "llama-3-8b",
              "mode": "model", "quant": "int8_g64", "capacity": "drive=unbounded",
              "requests": 2000, "progress": False}
    auto = run(ReplayJob(prefill_rate="auto", **common))
    assert auto["baseline_gpu_offered_load"] == pytest.approx(0.8)
    assert auto["warnings"] == []
    default = run(ReplayJob(**common))
    assert default["block_hit_ratio"] == auto["block_hit_ratio"]  # the drive's side as is
    # a GPU that keeps up waits far less for its own queue than an overloaded one
    assert auto["ttft_s"]["without_drive"]["p50"] < default["ttft_s"]["without_drive"]["p50"]
    p = subprocess.run([sys.executable, "-m", "ssdemu", "replay", str(SAMPLE),
                        "--prefill-rate", "banana"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "not a number" in p.stderr


def test_the_cli_compares_with_a_gpu_that_keeps_up_by_default():
    """Issue 31: the command line's default baseline is a GPU that keeps up ('auto'): the
    report of the demo's Llama-3-8B replay carries no warning about its own defaults; the
    model's own rate (an overloaded GPU on this trace) is still one flag away, and warns."""
    def cli(*extra):
        p = subprocess.run([sys.executable, "-m", "ssdemu", "replay", str(SAMPLE), "--model",
                            "llama-3-8b", "--json", "--no-progress",
                            *extra], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout), p.stderr

    report, err = cli()
    assert report["warnings"] == [] and "warning" not in err.lower()
    assert report["baseline_gpu_offered_load"] == pytest.approx(0.8)
    overloaded, err = cli("--prefill-rate", "model")
    assert overloaded["baseline_gpu_offered_load"] > 1 and overloaded["warnings"]
    assert "offered" in err
    assert overloaded["block_hit_ratio"] == report["block_hit_ratio"]


def test_dequantizing_on_the_gpu_sends_fewer_bytes_and_cuts_ttft():
    """The bundled trace, Llama-3-8B on star2000d at the defaults, int4_g64: the drive's link
    carries the fp16 blocks when the drive dequantizes, the compressed ones when the GPU does;
    the same hits, a lower TTFT p50 (the link is the bottleneck), and a slower GPU costs
    time.  Without quantization there is nothing to dequantize: identical."""
    reqs = list(TraceReader(SAMPLE))
    llama = model_config("llama-3-8b")
    caps = parse_capacities("drive=unbounded", {"hbm": 1, "dram": 1, "drive": 1})
    run = {d: replay_model(reqs, load("star2000d"), llama, "int4_g64", caps, dequant=d)
           for d in ("drive", "host")}
    drive, host = run["drive"], run["host"]
    assert host["block_hit_ratio"] == drive["block_hit_ratio"] > 0.6
    assert host["ttft_s"]["with_drive"]["p50"] < 0.8 * drive["ttft_s"]["with_drive"]["p50"]
    assert host["host_link_bytes"] < 0.6 * drive["host_link_bytes"]
    assert host["dequant"] == "host" and host["gpu_dequant_bytes_per_s"] > 0
    head = reqs[:600]
    fast = replay_model(head, load("star2000d"), llama, "int4_g64", caps, dequant="host")
    slow = replay_model(head, load("star2000d"), llama, "int4_g64", caps, dequant="host",
                        gpu_dequant_bytes_per_s=5e9)
    assert slow["ttft_s"]["with_drive"]["mean"] > fast["ttft_s"]["with_drive"]["mean"]
    plain = {d: replay_model(head, load("star2000d"), llama, None, caps, dequant=d)
             for d in ("drive", "host")}
    assert plain["host"]["ttft_s"] == plain["drive"]["ttft_s"]
    with pytest.raises(ValueError, match="dequant must be one of"):
        replay_model(head, load("star2000d"), llama, "int4_g64", caps, dequant="gpu")


def test_hits_on_kv_not_yet_computed():
    """A slow GPU: request B asks for A's blocks before A's prefill has computed them.  At
    arrival (the default) B hits them and they are counted as hits on KV not computed yet;
    stored when computed, B misses them; C, after A's first token, hits under both."""
    ids = tuple(range(100, 108))
    reqs = [Request(0, 8 * 512, 1, ids), Request(1, 8 * 512, 1, ids),
            Request(60_000, 8 * 512, 1, ids)]
    slow = model_config("tiny")
    slow = type(slow)(**{**slow.__dict__, "prefill_tokens_per_s": 1000.0})  # A: 4.1 s
    caps = _caps_tiny("drive=unbounded")
    at = replay_model(reqs, load("star2000d"), slow, "int8_g64", caps)
    comp = replay_model(reqs, load("star2000d"), slow, "int8_g64", caps, store_when="computed")
    assert at["hits_on_uncomputed_kv"] == 8 and at["block_hit_ratio"] == 16 / 24
    assert comp["hits_on_uncomputed_kv"] == 0 and comp["block_hit_ratio"] == 8 / 24
    assert at["store_when"] == "arrival" and comp["store_when"] == "computed"
    assert comp["uncomputed_hit_fraction"] == 0 and at["uncomputed_hit_fraction"] == 0.5


def _caps_tiny(text):
    return parse_capacities(text, SIZES)


@settings(deadline=None, max_examples=8)
@given(st.integers(0, 10_000), st.sampled_from([20_000.0, 200_000.0]))
def test_storing_when_computed_never_hits_more(seed, rate):
    trace = generate(120, seed=seed, share=0.8, prefixes=6, rate_per_s=40.0)
    m = type(TINY)(**{**TINY.__dict__, "prefill_tokens_per_s": rate})
    caps = _caps_tiny("drive=unbounded")
    at = replay_model(trace, load("star2000d"), m, "int8_g64", caps)
    comp = replay_model(trace, load("star2000d"), m, "int8_g64", caps, store_when="computed")
    assert comp["block_hit_ratio"] <= at["block_hit_ratio"]
    assert comp["hits_on_uncomputed_kv"] == 0
    assert (at["hits_on_uncomputed_kv"] > 0) == (comp["block_hit_ratio"] < at["block_hit_ratio"])


def test_admission_control_drops_stores_past_its_queue():
    """A bounded queue of background stores: a small one drops stores (those blocks are not
    in the drive, so fewer hits) and counts them; one too large to fill changes nothing."""
    reqs = list(TraceReader(SAMPLE))[:600]
    llama = model_config("llama-3-8b")
    caps = parse_capacities("drive=unbounded", {"hbm": 1, "dram": 1, "drive": 1})
    p = load("pcie4-tlc")
    free = replay_model(reqs, p, llama, "int8_g64", caps)
    small = replay_model(reqs, p, llama, "int8_g64", caps, store_queue=4)
    large = replay_model(reqs, p, llama, "int8_g64", caps, store_queue=1 << 30)
    assert free["stores_dropped"] == 0 and free["store_queue"] is None
    assert small["stores_dropped"] > 0 and small["block_hit_ratio"] < free["block_hit_ratio"]
    # the drive's queue no longer buries its loads
    assert small["drive_load_ms"]["p50"] < free["drive_load_ms"]["p50"]
    drop = ("wall_seconds", "requests_per_s", "blocks_per_s", "store_queue")
    assert {k: v for k, v in large.items() if k not in drop} == \
        {k: v for k, v in free.items() if k not in drop}
    with pytest.raises(ValueError, match="at least one store"):
        replay_model(reqs[:5], p, llama, "int8_g64", caps, store_queue=0)


def test_a_bounded_drive_is_its_ftls_user_capacity():
    """A finite drive capacity is the FTL's user capacity: evicted blocks are trimmed, their
    slots reused, GC runs as the drive fills; an unbounded drive has no FTL (no pressure)."""
    trace = generate(400, seed=11, share=0.5, prefixes=8, prefix_blocks=6,
                     mean_input_tokens=4000)
    p = load("star2000d")
    bounded = replay_model(trace, p, TINY, "int8_g64", _caps_tiny("drive=blocks:60"))
    unbounded = replay_model(trace, p, TINY, "int8_g64", _caps_tiny("drive=unbounded"))
    assert unbounded["drive_ftl"] is None
    (ftl,) = bounded["drive_ftl"]
    evicted = bounded["evictions"]["drive"]
    slot = -(-TINY.stored_block_bytes("int8_g64") // 4096) * 4096
    # each evicted block that reached the drive gives back its whole units (a block evicted
    # before its store was booked had none)
    assert evicted > 0 and evicted * slot // 2 <= ftl["trimmed_bytes"] <= evicted * slot
    assert ftl["scale"]["logical_bytes"] == 60 * slot
    assert ftl["write_amplification"] >= 1.0 and ftl["erases"] > 0


@pytest.mark.parametrize("content, extra, says", [
    ("", [], "the trace is empty)"),
    ('{"timestamp": "soon"}\nnot json\n', ["--skip-bad"], "--skip-bad dropped every line"),
])
def test_a_trace_with_no_requests_is_an_error(tmp_path, content, extra, says):
    """Issue 33, item 13: an empty trace, or one whose every line --skip-bad drops, exits 1
    with one line (it printed an all-zero report and exited 0)."""
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    p = subprocess.run([sys.executable, "-m", "ssdemu", "replay", str(path), "--json", *extra],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "no requests to replay" in p.stderr and says in p.stderr


@settings(deadline=None, max_examples=200)
@given(booked=st.lists(st.tuples(st.floats(0, 1e9), st.floats(0, 1e9), st.floats(0, 1e10),
                                 st.floats(0, 1e9)), min_size=1, max_size=30),
       window=st.floats(1e7, 1e9), drives=st.integers(1, 4))
def test_the_utilization_series_never_reads_above_one(booked, window, drives):
    """Issue 33, item 8: the per-window series plotted as drive_utilization.png is bounded as
    the summary is (it counted busy time when booked: 2.17 on the bundled trace's first 800
    requests on pcie4-tlc, 10^7 on a dense trace).  Each window serves at most its capacity;
    what is booked is served in full once the series drains."""
    from ssdemu.replay.model_mode import _BUSY, UtilizationSeries

    profile = load("pcie4-tlc")
    s = UtilizationSeries(profile, drives)
    counters = dict.fromkeys(_BUSY.values(), 0.0)
    total = dict.fromkeys(_BUSY, 0.0)
    for i, b in enumerate(booked):
        for k, v in zip(_BUSY, b, strict=True):
            counters[_BUSY[k]] += v
            total[k] += v
        s.sample(i * window / 1e9, dict(counters), window)
    s.drain(len(booked) * window / 1e9, window, 10**4)  # enough: 30 x 1e9 / 1e7 windows
    for _, u in s.points:
        assert all(0.0 <= v <= 1.0 for v in u.values()), u
        assert u["link"] == max(u["link_to_host"], u["link_to_device"])
    for k in _BUSY:
        served = sum(u[k] for _, u in s.points) * s.cap[k] * window
        assert served == pytest.approx(total[k], rel=1e-6, abs=1e-3 * window), k


def test_the_bundled_trace_s_utilization_series_is_bounded():
    """The issue's case: pcie4-tlc, the first 800 requests (the booked series read 2.17)."""
    reqs = list(TraceReader(SAMPLE))[:800]
    rep = replay_model(reqs, load("pcie4-tlc"), model_config("llama-3-8b"), "int8_g64",
                       parse_capacities("drive=unbounded", {"hbm": 1, "dram": 1, "drive": 1}))
    pts = rep["series"]["utilization"]
    assert len(pts) >= 50
    assert max(v for _, u in pts for v in u.values()) <= 1.0
    assert max(u["link"] for _, u in pts) > 0.5  # it does show the busy windows
