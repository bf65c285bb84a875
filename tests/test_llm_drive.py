"""The real model's KV in the drive (ssdemu/llm/drive_kv.py): decoding through the drive
against the model holding the same KV in memory, and the drive's page selection on the real
model's keys against an independent restatement of Quest's rule."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from envcheck import missing

import hostlib
from ssdemu.tools.daemon_process import DaemonProcess

pytestmark = pytest.mark.slow  # a real model's prefill and decode: `make test` runs them

CONTEXT, HELD = 250, 12  # tokens of the GPL's text in the context (3 blocks and 58 in the tail:
# a block fills and is stored on the 6th step decoded); tokens decoded after it


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The model, its prefill of CONTEXT tokens (fp16 KV in memory), a daemon."""
    from ssdemu.llm.forward import KVCache, Llama
    from ssdemu.llm.gguf_model import ModelFileError, load

    try:
        cfg, w, tok = load()
    except ModelFileError as e:
        missing(str(e))
    m = Llama(cfg, w)
    ids = tok.encode(open("/usr/share/common-licenses/GPL-3").read())[:CONTEXT + HELD + 1]
    mem = KVCache(cfg, np.float16)
    m.prefill(ids[:CONTEXT], cache=mem)
    d = DaemonProcess(str(tmp_path_factory.mktemp("llm") / "s.sock"), media="mem:512M",
                      extra=["--timing", "off"])
    try:
        with hostlib.connect(d.socket_path) as dev:
            yield cfg, m, ids, mem, dev
    finally:
        assert d.terminate()[0] == 0


def _decode(m, ids, attend, begin=None, steps=HELD):
    """Teacher-forced steps after the context: each next token's cross-entropy, and the
    greedy choice at each step."""
    ce, greedy = [], []
    for pos in range(CONTEXT, CONTEXT + steps):
        if begin is not None:
            begin()
        z = m.decode_step(ids[pos], pos, attend)
        z = z - z.max()
        ce.append(float(np.log(np.exp(z).sum()) - z[ids[pos + 1]]))
        greedy.append(int(z.argmax()))
    return np.array(ce), greedy


def _drive(cfg, dev, mem, **kw):
    from ssdemu.llm.drive_kv import DriveKV

    kv = DriveKV(dev, cfg, **kw)
    for layer in range(cfg.layers):
        kv.append(layer, mem.k[layer], mem.v[layer])
    return kv


def test_dense_decoding_through_the_drive_is_the_model_holding_the_same_kv(run):
    """Plain blocks, every one read back dequantized by the drive at each step, against
    the model holding the same fp16 KV in memory: the same greedy tokens, cross-entropy
    equal within 1e-4 at every step (a block fills and is stored during the steps)."""
    cfg, m, ids, mem, dev = run
    ce_mem, g_mem = _decode(m, ids, copy.deepcopy(mem).attend)
    kv = _drive(cfg, dev, mem, mode="dense", scheme="plain", prefix=b"dense")
    assert len(kv.keys) == CONTEXT // 64
    ce, g = _decode(m, ids, kv.attend, kv.begin_step)
    assert g == g_mem
    assert np.abs(ce - ce_mem).max() <= 1e-4
    assert kv.commands["retrieve"] >= HELD * (CONTEXT // 64)
    kv.end()


def test_host_select_over_every_page_is_dense(run):
    """Summaries on the host, Quest's rule there, the blocks read back: with a budget over
    every page, dense's attention."""
    cfg, m, ids, mem, dev = run
    ce_mem, g_mem = _decode(m, ids, copy.deepcopy(mem).attend, steps=3)
    kv = _drive(cfg, dev, mem, mode="host-select", budget_pages=64, prefix=b"hall")
    ce, g = _decode(m, ids, kv.attend, kv.begin_step, steps=3)
    assert g == g_mem and np.abs(ce - ce_mem).max() <= 1e-3
    assert kv.commands["topk"] == 0 and kv.commands["retrieve"] == 3 * (CONTEXT // 64)
    kv.end()


def test_drive_select_over_every_page_is_dense(run):
    """TOPK_PAGES and ATTEND in the drive, merged with the host's tail: with a budget that
    covers every page, the same attention as dense (within the drive's float32)."""
    cfg, m, ids, mem, dev = run
    ce_mem, g_mem = _decode(m, ids, copy.deepcopy(mem).attend, steps=3)
    kv = _drive(cfg, dev, mem, mode="drive-select", budget_pages=64, prefix=b"all")
    ce, g = _decode(m, ids, kv.attend, steps=3)
    assert g == g_mem
    # the first step is the drive's float32 attention alone; each later step also carries
    # the last one's rounding in its decoded token's KV, and the order of float32 sums is
    # the CPU's (BLAS and Numba's vector width): measured 2e-5, 1.6e-4, 1.1e-3 on an AMD
    # EPYC, all below 1e-3 on an Intel Xeon
    assert abs(ce[0] - ce_mem[0]) <= 1e-4 and np.abs(ce - ce_mem).max() <= 2e-3
    assert kv.commands["topk"] == kv.commands["attend"] == 3 * cfg.layers
    kv.end()


def test_topk_pages_is_quests_rule_on_the_real_models_keys(run):
    """For every layer from 2 on and every KV head, TOPK_PAGES with rerank 1 (no sink page,
    the last page the caller's) chooses exactly the pages an independent restatement of
    Quest's rule chooses: the last page kept, the top budget - 1 others by
    sum_c max(q_c min_c, q_c max_c) over the page's keys, GQA by the largest over the
    group's query heads; host-select's Quest chooses them too."""
    cfg, m, ids, mem, dev = run
    kv = _drive(cfg, dev, mem, mode="dense", scheme="plain", prefix=b"quest")
    hosts = {b: _drive(cfg, dev, mem, mode="host-select", scheme="plain", budget_pages=b - 1,
                       sink_pages=0, recent_pages=1, prefix=b"host%d" % b) for b in (3, 6)}
    empty = np.zeros((0, cfg.kv_heads, cfg.head_dim), np.float32)
    queries = {}

    def record(layer, q, k, v):  # the next token's post-RoPE queries, layer by layer
        queries[layer] = q.copy()
        return copy_mem.attend(layer, q, k, v)

    copy_mem = copy.deepcopy(mem)
    m.decode_step(ids[CONTEXT], CONTEXT, record)
    stored = len(kv.keys) * 64  # the drive's tokens: the whole blocks
    pages = stored // 16
    for layer in range(2, cfg.layers):
        keys = mem.k[layer][:stored].astype(np.float32)  # (tokens, kv heads, dim), fp16 values
        q = queries[layer].astype(np.float32)
        for budget in (3, 6):
            ids_drive, _ = dev.topk_pages(kv.keys, q, layer=layer, layers=cfg.layers,
                                          kv_heads=cfg.kv_heads, k=budget - 1,
                                          sink_pages=0, recent_pages=1, rerank=1)
            for h in range(cfg.kv_heads):
                kp = keys[:, h].reshape(pages, 16, cfg.head_dim)
                lo, hi = kp.min(axis=1), kp.max(axis=1)  # (pages, dim)
                group = q[h * cfg.group:(h + 1) * cfg.group]  # (group, dim)
                bound = np.maximum(group[:, None, :] * lo[None], group[:, None, :] * hi[None])
                score = bound.sum(axis=-1).max(axis=0)[:pages - 1]  # the last page: kept
                want = set(np.argsort(-score, kind="stable")[:budget - 1].tolist())
                assert set(ids_drive[h].tolist()) == want, (layer, h, budget)
            # host-select's own Quest, on the summaries it kept as the blocks were stored
            hosts[budget]._host_select(layer, q, empty, empty)
            chosen, _ = hosts[budget].last_ids[layer]
            for h in range(cfg.kv_heads):
                assert set(chosen[h].tolist()) == set(ids_drive[h].tolist()), (layer, h)
    kv.end()
    for hs in hosts.values():
        hs.end()


def test_eval_over_several_context_lengths(tmp_path):
    """`--context 128,256`: a report per length under "contexts", each with its own pages,
    reference and runs, a plot each; the model loads once."""
    import json
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "ssdemu", "eval", "--context", "128,256",
                        "--held", "2", "--schemes", "plain", "--methods", "dense,drive-select",
                        "--budgets", "25", "--profiles", "star2000d", "--plot", str(tmp_path),
                        "--json"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert [c["context_tokens"] for c in r["contexts"]] == [128, 256]
    assert [c["pages"] for c in r["contexts"]] == [8, 16]
    for c in r["contexts"]:
        assert len(c["runs"]) == 2
        dense = next(x for x in c["runs"] if x["method"] == "dense")
        assert dense["perplexity"] == pytest.approx(c["reference"]["perplexity"], rel=1e-6)
        assert (tmp_path / f"quality_vs_tpot_{c['context_tokens']}.png").stat().st_size > 0


def test_eval_puts_quality_beside_modelled_time(tmp_path):
    """`ssdemu eval --json` on a short context: plain dense through the drive has the
    reference's perplexity and every greedy choice; every run carries its modelled decode
    step per profile; drive-select's pages capture part of the attention mass; the plot is
    written.  A bad method is one line and exit 1, a bad budget exit 2."""
    import json
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "ssdemu", "eval", "--context", "128", "--held",
                        "4", "--schemes", "plain,int8_g64", "--budgets", "25",
                        "--profiles", "star2000d", "--plot", str(tmp_path), "--json"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["pages"] == 8 and r["budget_pages"] == [2]
    runs = {(x["scheme"], x["method"]): x for x in r["runs"]}
    assert len(runs) == 8  # 2 schemes x dense, host-select, drive-select (rerank 1, default)
    dense = runs[("plain", "dense")]
    assert dense["perplexity"] == pytest.approx(r["reference"]["perplexity"], rel=1e-6)
    assert dense["greedy_agreement"] == 1.0
    for x in r["runs"]:
        m = x["modelled"]
        assert m["star2000d"]["latency_ms"] > 0 and m["ttft_s"] > 0
        step = m["star2000d"]
        assert step["tpot_ms"] == pytest.approx(2.0 + step["latency_ms"], abs=1e-3)  # 500/s
        if x["method"] != "dense":
            assert 0 < x["attention_mass"]["mean"] <= 1
            assert len(x["attention_mass"]["per_layer"]) == 30
    assert (tmp_path / "quality_vs_tpot.png").stat().st_size > 0
    bad = subprocess.run([sys.executable, "-m", "ssdemu", "eval", "--methods", "oracle"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "oracle" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "ssdemu", "eval", "--budgets", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "percentages" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "ssdemu", "eval", "--context", "100000",
                          "--no-progress"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "fewer than" in bad.stderr


def test_passkey_prompts_and_a_small_run():
    """The passkey prompt holds its key once, near the length asked for, at the depth asked
    for; `ssdemu eval --passkey` reports each method's accuracy (dense finds the key in a
    short prompt: SmolLM2 does)."""
    import json
    import subprocess
    import sys

    from ssdemu.bench.model_eval import passkey_prompt
    from ssdemu.llm.gguf_model import ModelFileError, load

    try:
        _, _, tok = load()
    except ModelFileError as e:
        missing(str(e))
    ids = passkey_prompt(tok, 1024, 31415, 0.25)
    text = tok.decode(ids)
    assert 900 <= len(ids) <= 1100 and text.count("31415") == 2
    assert 0.15 < text.index("31415") / len(text) < 0.35
    assert text.endswith("What is the pass key? The pass key is")
    p = subprocess.run([sys.executable, "-m", "ssdemu", "eval", "--passkey", "384", "--trials",
                        "1", "--methods", "dense,drive-select-rerank1", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["trials"] == 1 and set(r["accuracy"]["384"]) == {"dense", "drive-select-rerank1"}
    assert r["accuracy"]["384"]["dense"] == 1.0
