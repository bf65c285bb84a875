"""`ssdemu bench retrieval` and the decode-step model behind it (ssdemu/sim/retrieval.py)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from ssdemu.bench.retrieval import LLAMA3_8B, bench_retrieval
from ssdemu.sim.profile import load
from ssdemu.sim.retrieval import decode_step, selection_step

pytestmark = pytest.mark.slow  # `make test-fast` skips it


@pytest.fixture(scope="module")
def report():
    return bench_retrieval(lengths=(16384,), profiles=("star2000d",))


def test_the_report_has_every_method_budget_and_metric(report):
    acc = report["accuracy"]["16384"]
    assert set(acc) == {"0.01", "0.03", "0.1"}
    for row in acc.values():
        for m in ("quest", "quest_int8", "quest_rerank", "quest_rerank_bound", "random"):
            assert set(row[m]) >= {"needle_hit_rate", "recall_vs_oracle", "mass_captured",
                                   "relative_output_error", "mass_by_kind"}
    json.dumps(report)  # one JSON object


def test_selection_beats_the_random_control_and_the_rerank_beats_quest(report):
    """Measured on the suite, not set: a selection no better than random pages fails."""
    for row in report["accuracy"]["16384"].values():
        assert row["quest"]["mass_captured"] > row["random"]["mass_captured"]
        assert row["quest"]["recall_vs_oracle"] > 2 * row["random"]["recall_vs_oracle"]
        assert row["quest_rerank"]["mass_captured"] > row["quest"]["mass_captured"]
    assert report["rerank_over_quest_mass"] > 0
    assert report["accuracy"]["16384"]["0.1"]["quest_rerank"]["needle_hit_rate"] >= 0.9


def test_the_rerank_finds_every_needle_and_the_selective_half_is_why(report):
    """The issue's bar at 3% of the pages, on the suite; at 1% candidates by bound alone
    miss a needle (measured: 0.969) that half of them by the selective score find."""
    assert report["needle_hit_rate_at_3pct"]["quest_rerank"]["16384"] == 1.0
    assert report["needle_hit_rate_at_3pct"]["quest"]["16384"] < 1.0
    row = report["accuracy"]["16384"]["0.01"]
    assert row["quest_rerank"]["needle_hit_rate"] == 1.0
    assert row["quest_rerank_bound"]["needle_hit_rate"] < 1.0


def test_in_drive_link_bytes_do_not_grow_with_the_context():
    p = load("star2000d")
    small = decode_step(p, LLAMA3_8B, 32768, "drive-select", 2048, layers=2)
    big = decode_step(p, LLAMA3_8B, 1 << 20, "drive-select", 2048, layers=2)
    assert small.link_bytes == big.link_bytes < 1 << 20  # queries and outputs only
    host = decode_step(p, LLAMA3_8B, 1 << 20, "host-select", 2048, layers=2)
    assert host.link_bytes > 10 * big.link_bytes


def test_ship_all_is_bound_by_the_link_at_its_rate():
    p = load("star2000d")
    c = decode_step(p, LLAMA3_8B, 32768, "ship-all")
    assert c.link_bytes == 32768 * LLAMA3_8B.kv_bytes_per_token
    assert c.latency_ns == pytest.approx(c.link_bytes / p.host_link.bandwidth_bytes_per_s * 1e9,
                                         rel=0.02)
    assert c.binds == "link"


def test_a_batch_over_one_context_makes_the_tops_budget_bind():
    p = load("star2000d")
    one = selection_step(p, LLAMA3_8B, 131072, 2048, batch=1)
    many = selection_step(p, LLAMA3_8B, 131072, 2048, batch=64)
    assert many["compute_utilization"] >= 0.9
    assert many["mac_utilization"] > 3 * one["mac_utilization"]


def test_bad_modes_and_sizes_are_refused():
    p = load("star2000d")
    with pytest.raises(ValueError, match="decode mode"):
        decode_step(p, LLAMA3_8B, 1024, "telepathy")
    with pytest.raises(ValueError, match="positive"):
        decode_step(p, LLAMA3_8B, 0, "ship-all")


def test_the_cli_says_what_is_wrong():
    r = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "retrieval", "--profiles",
                        "nosuch"], capture_output=True, text=True)
    assert r.returncode == 1 and "no profile 'nosuch'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "retrieval", "--lengths",
                        "12x"], capture_output=True, text=True)
    assert r.returncode == 2 and "not a positive count" in r.stderr
    for args, says in ((["--layout-context", "100"], "a multiple of 64 tokens"),
                       (["--layout-scheme", "int9_g7"], "unknown quantization scheme")):
        r = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "retrieval", *args],
                           capture_output=True, text=True)
        assert r.returncode == 1 and says in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("scheme", ["plain", "int8_g64"])
def test_the_drive_reads_a_page_of_one_head_by_head_and_selects_the_same(scheme):
    """Two daemons, one per block layout, the same sequence and decode step: the same pages
    chosen and the same attention, and by head the re-rank and ATTEND read a sliver of the
    NAND bytes (a page of one head, not every layer's and head's token rows) in less time."""
    from ssdemu.bench.retrieval_layout import layout_comparison

    r = layout_comparison(256, steps=1, scheme=scheme)
    assert r["selections_identical"] and r["attention_identical"]
    for part in ("topk_rerank", "attend"):
        assert r[f"{part}_head_vs_token"]["nand_bytes"] < 0.1, (part, r[part + "_head_vs_token"])
        assert r[f"{part}_head_vs_token"]["modelled_time"] < 1.0
        assert r["head"][part]["commands"] == r["token"][part]["commands"] == 30


def test_on_the_real_models_kv_by_head_reads_less_and_selects_the_same():
    """The layout comparison on SmolLM2-135M's own prefilled K and V and its decode steps'
    queries (bench retrieval's layout_real): the same pages and attention on both layouts,
    and by head a small part of the NAND bytes in less modelled time.  It fails when the
    blocks are not the model's context in the drive's layout: a block cut across layers or
    tokens changes the selections, and queries of another step or layer would too."""
    from envcheck import missing

    from ssdemu.bench.model_eval import DEFAULT_TEXT
    from ssdemu.bench.retrieval_layout import real_layout_comparison
    from ssdemu.bench.retrieval_real import model_queries
    from ssdemu.llm.gguf_model import ModelFileError

    try:
        cfg, keys, values, qs = model_queries(256, 1, DEFAULT_TEXT)
    except ModelFileError as e:
        missing(str(e))
    r = real_layout_comparison(cfg, keys, values, qs, 256, steps=1, raw=True)
    assert r["kv"].startswith("real") and r["layers"] == cfg.layers == 30
    assert r["selections_identical"] and r["attention_identical"]
    for part in ("topk_rerank", "attend"):
        assert r[f"{part}_head_vs_token"]["nand_bytes"] < 0.1, (part, r[part + "_head_vs_token"])
        assert r[f"{part}_head_vs_token"]["modelled_time"] < 1.0
    # what the drive attended is the model's own KV: each layer's ATTEND output equals numpy
    # softmax attention of that layer's query over the chosen pages and the sink and recent
    # pages of its fp16 K and V (a block cut across layers, tokens or K/V would not)
    g, d, last = cfg.heads // cfg.kv_heads, cfg.head_dim, 256 // 16 - 1
    for layer in (2, 17, 29):
        ids, out = r["raw"]["ids"][layer], r["raw"]["outputs"][layer]
        for h in range(cfg.kv_heads):
            pages = sorted({0, last, *(int(p) for p in ids[h] if p >= 0)})
            tokens = np.concatenate([np.arange(p * 16, p * 16 + 16) for p in pages])
            k = keys[layer][tokens, h].astype(np.float64)
            v = values[layer][tokens, h].astype(np.float64)
            for qh in range(h * g, (h + 1) * g):
                z = k @ qs[0, layer, qh].astype(np.float64) / np.sqrt(d)
                w = np.exp(z - z.max())
                want = (w / w.sum()) @ v
                np.testing.assert_allclose(out[qh], want, rtol=2e-3, atol=2e-4)
    with pytest.raises(ValueError, match="decode steps"):
        real_layout_comparison(cfg, keys, values, qs, 256, steps=2)
    with pytest.raises(ValueError, match="multiple of 64"):
        real_layout_comparison(cfg, keys, values, qs, 100, steps=1)


@pytest.fixture(scope="module")
def real():
    from envcheck import missing

    from ssdemu.bench.retrieval_real import real_model_accuracy
    from ssdemu.llm.gguf_model import ModelFileError

    try:
        return real_model_accuracy(context=1024, queries=8)
    except ModelFileError as e:
        missing(str(e))


def test_the_real_models_part_has_every_method_budget_and_layer(real):
    assert set(real["accuracy"]) == {"0.01", "0.03", "0.1"}
    for row in real["accuracy"].values():
        assert row["pages"] == 64
        for m in ("quest", "quest_int8", "quest_rerank", "quest_rerank_bound", "random"):
            assert set(row[m]) == {"needle_hit_rate", "recall_vs_oracle", "mass_captured",
                                   "relative_output_error"}
    assert all(len(v) == 28 for v in real["mass_at_3pct_per_layer"].values())  # layers 2..29
    json.dumps(real)


def test_on_real_keys_selection_beats_random_and_the_rerank_beats_quest(real):
    for row in real["accuracy"].values():
        assert row["quest"]["needle_hit_rate"] > row["random"]["needle_hit_rate"] + 0.2
        assert row["quest_rerank"]["mass_captured"] >= row["quest"]["mass_captured"]
    assert real["accuracy"]["0.1"]["quest_rerank"]["needle_hit_rate"] >= 0.9


def test_the_mixed_candidates_never_waste_the_budget_on_the_kept_pages(real):
    """The re-rank's candidates exclude the sink and last pages, which every method keeps
    anyway (before: the bench drew the mixed half with none excluded, and on real keys,
    whose sink page holds the most mass, the re-rank chose the sink: its needle rate at 1%
    fell to 0.07 where the bound's candidates gave 0.62)."""
    for row in real["accuracy"].values():
        assert row["quest_rerank"]["needle_hit_rate"] >= \
            row["quest_rerank_bound"]["needle_hit_rate"] - 0.05
