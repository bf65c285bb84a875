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
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_the_cli_prints_tpot():
    r = subprocess.run([sys.executable, "-m", "ssdemu", "replay", SAMPLE, "--requests", "50",
                        "--decode", "host-select", "--no-progress"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert "decode (host-select" in r.stdout and "TPOT p50 / p99" in r.stdout
    r = subprocess.run([sys.executable, "-m", "ssdemu", "replay", SAMPLE, "--requests", "50",
                        "--decode", "drive-select", "--json"], capture_output=True, text=True)
    assert json.loads(r.stdout)["decode"]["storage_mode"] == "drive-select"
