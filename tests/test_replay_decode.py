"""`ssdemu replay --decode`: TPOT for the three ways of reaching a long context's KV
(ssdemu/replay/decode.py over ssdemu/sim/retrieval.py)."""

import json
import subprocess
import sys

import pytest

from ssdemu.replay.decode import decode_report
from ssdemu.replay.job import ReplayJob, run
from ssdemu.replay.serving import model_config
from ssdemu.sim.profile import load
from traces.mooncake import Request

SAMPLE = "traces/mooncake_synthetic_trace.jsonl"


@pytest.fixture(scope="module")
def reports():
    return {mode: run(ReplayJob(trace=SAMPLE, profile="star2000d", model="llama-3-8b",
                                mode="model", quant="int8_g64",
                                capacity="hbm=0,dram=0,drive=unbounded", requests=300,
                                progress=False, decode=mode))["decode"]
            for mode in ("dense", "host-select", "drive-select")}


def test_every_mode_reports_tpot_above_the_gpus_own_step(reports):
    for mode, d in reports.items():
        assert d["mode"] == mode and d["requests"] == 300 and d["output_tokens"] > 0
        assert d["tpot_s"]["p99"] >= d["tpot_s"]["p50"] > d["gpu_s_per_token"]


def test_the_link_carries_less_the_more_the_drive_does(reports):
    dense, host, drive = (reports[m]["link_bytes_per_token_mean"]
                          for m in ("dense", "host-select", "drive-select"))
    assert dense > 5 * host and host > 100 * drive
    # queries in, outputs out: 32 layers x 32 heads x (128 x 2 in, 128 x 2 + 4 out) bytes
    assert drive == pytest.approx(32 * 32 * (256 + 260))


def test_a_longer_context_costs_dense_decode_more():
    p, m = load("star2000d"), model_config("llama-3-8b")
    short = decode_report([Request(0, 4096, 8, (0,))], p, m, "dense")
    long = decode_report([Request(0, 65536, 8, (0,))], p, m, "dense")
    assert long["tpot_s"]["p50"] > 8 * (short["tpot_s"]["p50"] - short["gpu_s_per_token"])


def test_a_bad_decode_mode_is_one_line():
    r = subprocess.run([sys.executable, "-m", "ssdemu", "replay", SAMPLE, "--decode", "psychic"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "--decode: unknown psychic" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run([sys.executable, "-m", "ssdemu", "replay", SAMPLE, "--decode", "qevict",
                        "--drift", "/nonexistent.json"], capture_output=True, text=True)
    assert r.returncode == 1 and "cannot read a drift model" in r.stderr


# ---- placement policies at trace scale (ssdemu/replay/drift.py, decode.tier_report) ------


def _eval_report(promotions: dict, fmm: dict) -> dict:
    """An `eval --policies` report's shape: two contexts, budgets as fractions."""
    runs = lambda ctx: [{"policy": p, "hbm_tokens": int(f * ctx), "promotions_per_step": v,  # noqa: E731
                         "fmm": fmm[p][f]} for p, by in promotions.items()
                        for f, v in by.items()]
    return {"reports": [{"context_tokens": c, "runs": runs(c)} for c in (2048, 4096)]}


def test_the_drift_model_is_fitted_from_an_eval_report():
    from ssdemu.replay.drift import DriftModel

    d = DriftModel.from_report(_eval_report({"qevict": {0.125: 0.2, 0.5: 0.05}},
                                            {"qevict": {0.125: 0.04, 0.5: 0.01}}))
    assert d.promotions("qevict", 0.125) == pytest.approx(0.2)
    assert d.promotions("qevict", 0.3125) == pytest.approx(0.125)  # halfway, linearly
    assert d.promotions("qevict", 0.9) == pytest.approx(0.05)  # flat past the last point
    assert d.fmm("qevict", 0.05) == pytest.approx(0.04)
    with pytest.raises(ValueError, match="no points for 'h2o'"):
        d.fmm("h2o", 0.25)
    assert DriftModel.load().points  # the bundled fit loads, and has points


@pytest.fixture(scope="module")
def policies():
    r = run(ReplayJob(trace=SAMPLE, profile="star2000d", model="llama-3-8b", mode="model",
                      quant="int8_g64", capacity="hbm=0,dram=0,drive=unbounded",
                      requests=300, progress=False, decode="h2o,predictive,qevict",
                      decode_budget_pct=25.0))
    return {d["mode"]: d for d in r["decodes"]}, r


def test_placement_policies_at_trace_scale(policies):
    """Dropping costs the drive nothing per token; the quantized band is read every step
    (predictive), and promotions add to it (qevict); every figure is the drift model's."""
    d, report = policies
    assert report["decode"] == d["h2o"]
    h2o, pred, qe = d["h2o"], d["predictive"], d["qevict"]
    assert h2o["link_bytes_per_token_mean"] == h2o["nand_bytes_per_token_mean"] == 0
    assert h2o["tpot_s"]["p50"] == pytest.approx(h2o["gpu_s_per_token"])
    assert pred["link_bytes_per_token_mean"] > 1e6 and pred["tpot_s"]["p50"] > \
        pred["gpu_s_per_token"]
    assert qe["promotions_per_step"] >= 0
    assert qe["link_bytes_per_token_mean"] >= pred["link_bytes_per_token_mean"]
    assert qe["tpot_s"]["p50"] >= pred["tpot_s"]["p50"]
    for x in d.values():
        assert x["requests"] == 300 and len(x["tpot_per_request_s"]) == 300
        assert 0 <= x["future_missed_mass"] <= 1


def test_the_replay_plots_its_policies(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ssdemu", "replay", SAMPLE, "--requests", "60",
                        "--decode", "h2o,qevict", "--no-progress", "--plot", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "decode (h2o, HBM 25% of the context)" in r.stdout
    assert "decode (qevict, HBM 25% of the context)" in r.stdout
    assert (tmp_path / "decode_policies.png").stat().st_size > 10_000


def test_the_cli_prints_tpot():
    r = subprocess.run([sys.executable, "-m", "ssdemu", "replay", SAMPLE, "--requests", "50",
                        "--decode", "host-select", "--no-progress"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert "decode (host-select" in r.stdout and "TPOT p50 / p99" in r.stdout
    r = subprocess.run([sys.executable, "-m", "ssdemu", "replay", SAMPLE, "--requests", "50",
                        "--decode", "drive-select", "--json"], capture_output=True, text=True)
    assert json.loads(r.stdout)["decode"]["storage_mode"] == "drive-select"


def test_a_policy_step_reads_its_band_and_its_promotions():
    """tier_step: the band's blocks (half int8, half int4 windows of the model) and a new
    window's store every 64 steps; qevict's promotions add raw windows; dropping reads
    nothing."""
    from ssdemu.replay.decode import WINDOW_TOKENS, tier_step, window_bytes

    p, m = load("star2000d"), model_config("llama-3-8b")
    for policy in ("streaming", "h2o", "random", "contiguity"):
        assert tier_step(p, m, 8192, policy, 25.0, 0.5) == (0.0, 0.0, 0.0)
    plain, int8, int4 = (window_bytes(m, s) for s in ("plain", "int8_g64", "int4_g64"))
    t, link, nand = tier_step(p, m, 8192, "predictive", 25.0, 0.0)
    band = 8192 // 4 // WINDOW_TOKENS  # 32 windows in HBM, as many in the band
    assert link == pytest.approx(band // 2 * (int8 + int4) + plain / WINDOW_TOKENS)
    assert tier_step(p, m, 8192, "qevict", 25.0, 0.0) == (t, link, nand)
    tq, lq, _ = tier_step(p, m, 8192, "qevict", 25.0, 0.5)
    raw = WINDOW_TOKENS * m.layers * m.kv_heads * m.head_dim * 2 * m.element_bytes
    assert lq == pytest.approx(link + 0.5 * raw) and tq > t
    assert tier_step(p, m, 8192, "predictive", 50.0, 0.0)[1] > link  # a larger band
    kivi2 = window_bytes(m, "kivi2_g32_r0")  # qevict-2bit: the band in thirds
    t2, l2, n2 = tier_step(p, m, 8192, "qevict-2bit", 25.0, 0.0)
    assert l2 == pytest.approx(10 * int8 + 11 * int4 + 11 * kivi2 + plain / WINDOW_TOKENS)
    assert l2 < link and t2 <= t
    _, _, n2p = tier_step(p, m, 8192, "qevict-2bit", 25.0, 0.5)
    assert n2p == pytest.approx(n2 + 0.5 * (kivi2 + 2 * int8))
    with pytest.raises(ValueError, match="not a placement policy"):
        tier_step(p, m, 8192, "lru", 25.0, 0.0)
