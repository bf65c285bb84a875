"""`ssdemu sweep`: the spec's grid, and a real sweep on a local Ray instance whose rows are
the single `ssdemu replay` runs of the same cells."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest
import yaml

from ssdemu.replay.sweep_spec import WALL_FIELDS, SpecError, expand, flatten, load_spec
from traces.synthetic import generate, write


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.jsonl"
    write(generate(60, seed=7, share=0.8, prefixes=5, prefix_blocks=6,
                   mean_input_tokens=3000), str(path))
    return str(path)


def test_the_grid_is_the_product_of_its_lists(trace):
    cells = expand({"traces": [trace], "profiles": ["star2000d", "pcie4-tlc"],
                    "capacities": ["drive=1G", "drive=2G", "drive=unbounded"],
                    "quant": ["int8_g64", "none"], "requests": 10})
    assert len(cells) == 12 and len({c.id for c in cells}) == 12
    assert {c.profile for c in cells} == {"star2000d", "pcie4-tlc"}
    assert all(c.requests == 10 and c.mode == "model" and c.instances == 1 for c in cells)
    # ids are stable: the same cell from another expansion (another path to the same file
    # name) has the same id
    again = expand({"traces": [trace], "profiles": ["star2000d", "pcie4-tlc"],
                    "capacities": ["drive=1G", "drive=2G", "drive=unbounded"],
                    "quant": ["int8_g64", "none"], "requests": 10})
    assert [c.id for c in again] == [c.id for c in cells]


def test_a_spec_file_names_traces_relative_to_itself(tmp_path, trace):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"traces": ["t.jsonl"], "models": "tiny"}))
    (cell,) = load_spec(str(spec))
    assert cell.trace == trace and cell.model == "tiny"


@pytest.mark.parametrize("spec,msg", [
    ({"profiles": ["star2000d"]}, "needs at least one trace"),
    ({"traces": ["/nonexistent.jsonl"]}, "is not a file"),
    ({"traces": "T", "colour": ["red"]}, "unknown key 'colour'"),
    ({"traces": "T", "quant": []}, "empty list"),
    ({"traces": "T", "instances": [0]}, "positive whole number"),
    ({"traces": "T", "requests": -1}, "positive whole number"),
    ({"traces": "T", "dequant": ["gpu"]}, "expected drive or host"),
    ({"traces": "T", "media": "block:/dev/sda"}, "mem:SIZE or file:SIZE"),
    ({"traces": "T", "profiles": [{"a": 1}]}, "not a string or a number"),
    ([1, 2], "a mapping"),
])
def test_bad_specs(spec, msg, trace):
    if isinstance(spec, dict) and spec.get("traces") == "T":
        spec["traces"] = trace
    with pytest.raises(SpecError, match=msg):
        expand(spec)


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "ssdemu", *args], capture_output=True,
                          text=True, timeout=timeout)


def _ray_processes() -> int:
    p = subprocess.run(["pgrep", "-c", "-f", "raylet|gcs_server"], capture_output=True,
                       text=True)
    return int(p.stdout.strip() or 0)


def _as_csv(flat: dict) -> dict:
    """Values as the csv module writes them."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(flat))
    w.writerow(flat)
    return dict(zip(flat, next(csv.reader(io.StringIO(buf.getvalue()))), strict=True))


@pytest.mark.external
def test_a_sweep_on_local_ray_is_its_single_replays(tmp_path, trace):
    """Model-mode cells and a data-mode cell (its own daemon on mem: media) on a local Ray:
    every row equals the `ssdemu replay` of its cell, field for field; the cells with a bad
    capacity fail with their one-line error while the rest finish; a second run with the
    same --out runs nothing; nothing of Ray is left running."""
    before = _ray_processes()
    spec = tmp_path / "grid.yaml"
    spec.write_text(yaml.safe_dump({
        "traces": [trace], "models": ["tiny"], "modes": ["model", "data"],
        "capacities": ["hbm=0,dram=blocks:10,drive=blocks:60", "drive=lots"],
        "quant": ["int8_g64"], "prefill_rates": ["model", 150000], "media": "mem:512M"}))
    out = tmp_path / "out"
    p = _cli("sweep", str(spec), "--out", str(out), "--json", "--no-progress", "--plot")
    assert p.returncode == 1, p.stderr  # some cells failed
    s = json.loads(p.stdout)
    assert (s["cells"], s["ran"], s["skipped"], s["failed"]) == (8, 8, 0, 4)
    assert all("bad size 'lots'" in e["error"] for e in s["errors"])
    with open(s["table"]) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8
    compared = 0
    for r in rows:
        if r["error"]:
            assert r["block_hit_ratio"] == ""
            continue
        args = ["replay", trace, "--model", "tiny", "--json", "--no-progress",
                "--capacity", r["cell.capacity"], "--quant", r["cell.quant"],
                "--mode", r["cell.mode"], "--prefill-rate", r["cell.prefill_rate"]]
        if r["cell.mode"] == "data":
            args += ["--media", "mem:512M"]
        q = _cli(*args)
        assert q.returncode == 0, q.stderr
        single = json.loads(q.stdout)
        flat: dict = {}
        flatten("", {k: v for k, v in single.items() if k not in WALL_FIELDS}, flat)
        want = _as_csv(flat)
        got = {k: r[k] for k in want}
        if r["cell.mode"] == "data":
            # two single data-mode runs of one cell differ in their times: a compute command's
            # later stages (a quantized store's program, a dequantized block's transfer) are
            # booked when its kernel comes back, among other commands' first stages as this
            # host's threads time them, and dies are shared by senses and programs (the
            # utilization span also follows the store's journal group commits); every hit,
            # byte and check is exact
            timed = ("drive_utilization", "drive_load_ms", "ttft_s.with_drive",
                     "per_instance.0.ttft_s.with_drive")
            for k in [k for k in want if k.startswith(timed)]:
                assert float(got.pop(k)) == pytest.approx(float(want.pop(k)), rel=0.05), k
            # and host_lag counts the kernels this host ran slower than the model's time for
            # them: a measure of the host's speed at that moment (379 and 380 seen in two runs)
            for k in [k for k in want if k.endswith(("host_lag", "host_lag_of"))]:
                assert int(got.pop(k)) >= 0 and int(want.pop(k)) >= 0
        assert got == want, r["cell.id"]
        compared += 1
    assert compared == 4 and {r["cell.mode"] for r in rows if not r["error"]} == \
        {"model", "data"}
    # one capacity succeeded (no capacity plot), two prefill rates did
    assert s["plots"] == [str(out / "sweep_prefill.png")]
    table = open(s["table"]).read()
    p = _cli("sweep", str(spec), "--out", str(out), "--json", "--no-progress")
    s2 = json.loads(p.stdout)
    assert (s2["ran"], s2["skipped"], s2["failed"]) == (0, 8, 4)
    assert open(s2["table"]).read() == table
    assert _ray_processes() == before


def test_sweep_errors_are_one_line(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("traces: [nope.jsonl]\n")
    for args, msg in ((["sweep", str(spec)], "is not a file"),
                      (["sweep", str(tmp_path / "missing.yaml")], "cannot read"),
                      (["sweep"], "the following arguments are required")):
        p = _cli(*args)
        assert p.returncode != 0 and msg in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
