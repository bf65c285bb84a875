"""The tier manager (ssdemu/llm/tiers.py) on a real daemon: every move is the command it
should be and leaves the drive holding what the manager believes; the step's attention is
numpy's over what was attended, its masses the windows' shares; the diagnostics are what
their definitions say.  Then the policies on the real model: their invariants at every step,
and decisions that depend on the seed alone (a re-run, another BLAS thread count)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from envcheck import missing

import hostlib
from firmware.quant import dequantize, quantize, requantize
from ssdemu.llm.gguf_model import LlamaConfig
from ssdemu.llm.tiers import (
    DRIVE,
    DRIVE_INT4,
    DRIVE_INT8,
    DRIVE_KIVI2,
    DROPPED,
    HBM,
    SCHEME,
    TierManager,
    _attention_with_probs,
)
from ssdemu.tools.daemon_process import DaemonProcess

CFG = LlamaConfig("tiny", layers=2, dim=96, ffn=1, heads=6, kv_heads=2, head_dim=32,
                  rope_base=1e4, eps=1e-5, vocab=1, context=4096)
W = 16


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    d = DaemonProcess(str(tmp_path_factory.mktemp("tiers") / "s.sock"), media="mem:256M",
                      extra=["--clock", "virtual"])
    try:
        with hostlib.connect(d.socket_path) as device:
            yield device
    finally:
        assert d.terminate()[0] == 0


def manager(dev, windows: int, prefix: bytes, hbm_windows: int = 2, w: int = W) -> TierManager:
    rng = np.random.default_rng(len(prefix))
    k = [rng.standard_normal((windows * w + 5, CFG.kv_heads, CFG.head_dim)).astype(np.float16)
         for _ in range(CFG.layers)]
    v = [rng.standard_normal(x.shape).astype(np.float16) for x in k]
    m = TierManager(dev, CFG, hbm_tokens=hbm_windows * w, window=w, page_tokens=16,
                    gpu_step_ns=1e6, prefix=prefix)
    m.load_prefill(k, v, np.arange(windows, dtype=float))
    return m


def block_of(m, w) -> np.ndarray:
    return np.ascontiguousarray(np.stack([w.k, w.v], axis=1)).view(np.uint16)


def test_each_move_is_its_command_and_the_drive_holds_what_the_manager_believes(dev):
    m = manager(dev, 3, b"mv")
    assert len(m.windows) == 3 and m.tail_k.shape[0] == 5
    w = m.windows[1]
    raw = block_of(m, w)
    m.move(w, DRIVE_INT8)  # no copy: the host's is stored at int8
    assert (w.tier, w.copy, w.k) == (DRIVE_INT8, DRIVE_INT8, None)
    int8 = quantize(raw, "fp16", "int8_g64", summary_page=16)
    assert dev.kv_get(m.key(w)) == int8.tobytes()
    m.move(w, DRIVE_INT4)  # demoted in place: the drive's requantize, nothing re-sent
    int4 = requantize(int8, "int4_g64")
    assert dev.kv_get(m.key(w)) == int4.tobytes()
    assert (m.books.stores, m.books.demotions) == (1, 1)
    m.move(w, DRIVE_INT8)  # a drive cannot raise precision: the int4 copy stays
    assert w.copy == DRIVE_INT4 and dev.kv_get(m.key(w)) == int4.tobytes()
    m.move(w, HBM)  # a promotion: int4's values, dequantized in the drive
    assert np.array_equal(block_of(m, w), dequantize(int4)[0]) and m.books.promotions == 1
    m.move(w, DROPPED)
    assert not dev.kv_exists(m.key(w)) and w.copy is None and w.k is None
    with pytest.raises(ValueError, match="dropped"):
        m.move(w, HBM)
    x = m.windows[2]
    m.store(x, DRIVE)  # the full copy a drive-based policy keeps
    m.move(x, DRIVE)  # to the drive: the copy is there already
    assert m.books.stores == 2 and x.k is None
    m.finish()
    assert not dev.kv_exists(m.key(x))
    assert [e[1:] for e in m.log] == [(1, HBM, DRIVE_INT8), (1, DRIVE_INT8, DRIVE_INT4),
                                      (1, DRIVE_INT4, DRIVE_INT8), (1, DRIVE_INT8, HBM),
                                      (1, HBM, DROPPED), (2, HBM, DRIVE)]


def test_the_demotion_chain_down_to_two_bits_is_the_drives_requantize(dev):
    """int8 -> int4 -> KIVI 2-bit, each step a requantize in place (nothing re-sent), the
    drive's block the firmware's chain byte for byte, each one smaller; a promotion brings
    the 2-bit values back."""
    with pytest.raises(ValueError, match="multiple of 32"):
        m = manager(dev, 3, b"c16")  # 16-token windows: KIVI's 32-token groups hold none
        m.move(m.windows[1], DRIVE_KIVI2)
    m.finish()
    m = manager(dev, 3, b"ch", w=32)
    w = m.windows[1]
    blob = quantize(block_of(m, w), "fp16", "int8_g64", summary_page=16)
    m.move(w, DRIVE_INT8)
    sizes = [len(dev.kv_get(m.key(w)))]
    for tier in (DRIVE_INT4, DRIVE_KIVI2):
        m.move(w, tier)
        blob = requantize(blob, SCHEME[tier])
        assert dev.kv_get(m.key(w)) == blob.tobytes() and w.copy == tier
        sizes.append(len(blob))
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 3
    assert (m.books.stores, m.books.demotions) == (1, 2)
    m.move(w, HBM)
    assert np.array_equal(block_of(m, w), dequantize(blob)[0])
    m.finish()


def test_qevict_2bit_splits_its_band_in_three():
    """The band's ranks in equal shares, best at int8; two levels split it as qevict did."""
    from types import SimpleNamespace

    from ssdemu.llm.policies.qevict import QEvict, QEvict2Bit

    def targets(cls, n):
        ws = [SimpleNamespace(index=i, tier=HBM, score=float(n + 2 - i)) for i in range(n + 2)]
        moves = []
        m = SimpleNamespace(windows=ws, hbm_windows=2,
                            move=lambda w, t: (moves.append(t), setattr(w, "tier", t)))
        p = cls()
        p.band = lambda m: n - 1  # the last below-HBM window is dropped
        p._rank(m)
        return moves

    assert targets(QEvict2Bit, 7) == [DRIVE_INT8] * 2 + [DRIVE_INT4] * 2 + [DRIVE_KIVI2] * 2 \
        + [DROPPED]
    assert targets(QEvict, 7) == [DRIVE_INT8] * 3 + [DRIVE_INT4] * 3 + [DROPPED]


def test_a_step_attends_what_it_was_given_and_records_each_windows_share(dev):
    """Window 0 in HBM, window 1 read back from the drive at int4, window 2 dropped: each
    layer's output is numpy's attention over window 0, window 1's int4 values and the tail;
    the masses are the windows' shares of it, averaged over layers."""
    m = manager(dev, 3, b"st")
    m.store(m.windows[1], DRIVE)
    raw1 = block_of(m, m.windows[1])
    m.move(m.windows[1], DRIVE_INT4)
    int4 = dequantize(requantize(quantize(raw1, "fp16", "plain", summary_page=16),
                                 "int4_g64"))[0].view(np.float16)
    k0, v0 = m.windows[0].k.copy(), m.windows[0].v.copy()
    m.move(m.windows[2], DROPPED)
    m.begin_step([m.windows[1]])
    assert m.books.reads == 1 and m._critical > 0  # the read is on the step's path
    rng = np.random.default_rng(9)
    shares = np.zeros(2)
    for layer in range(CFG.layers):
        q = rng.standard_normal((CFG.heads, CFG.head_dim)).astype(np.float32)
        k = rng.standard_normal((CFG.kv_heads, CFG.head_dim)).astype(np.float32)
        out = m.attend(layer, q, k, k)
        keys = np.concatenate([k0[:, layer], int4[:, 0, layer], m.tail_k[:, layer]])
        vals = np.concatenate([v0[:, layer], int4[:, 1, layer], m.tail_v[:, layer]])
        want, _, p = _attention_with_probs(q, keys.astype(np.float32),
                                           vals.astype(np.float32), CFG.group)
        assert np.allclose(out, want, atol=1e-5)
        shares += [p[:W].sum(), p[W:2 * W].sum()]
    m.end_step()
    assert m.windows[0].mass == pytest.approx(shares[0] / CFG.layers, abs=1e-6)
    assert m.windows[1].mass == pytest.approx(shares[1] / CFG.layers, abs=1e-6)
    assert np.isnan(m.windows[2].mass)
    assert m.books.step_ns == pytest.approx(1e6 + m.books.drive_ns) and m.t == m.books.step_ns
    m.finish()


def test_the_diagnostics_are_their_definitions():
    """FMM: the mass outside what the step attended (the tail always is); LIR: outside the
    full-precision tier; match: of the windows read most, HBM's share."""
    from ssdemu.bench.tier_eval import _step_diagnostics

    class M:
        windows = [object()] * 3  # three windows of 64 tokens: 4 pages each, then the tail

    pages = np.zeros((2, 1, 13), np.float32)
    pages[:, 0, :4] = 0.05  # window 0: 0.2
    pages[:, 0, 4:8] = 0.1  # window 1: 0.4
    pages[:, 0, 8:12] = 0.075  # window 2: 0.3
    pages[:, 0, 12] = 0.1  # the tail
    d = _step_diagnostics(M(), pages, attended={0, 1}, hbm={0}, selected={})
    assert d["fmm"] == pytest.approx(0.3) and d["lir"] == pytest.approx(0.7)
    assert d["match"] == 0.0  # window 1 was read most, HBM held window 0
    # the drive selected window 2's first page for layer 0 alone
    d = _step_diagnostics(M(), pages, attended={0, 1}, hbm={1},
                          selected={0: (np.array([[0, -1]]), [2])})
    assert d["fmm"] == pytest.approx(0.3 - 0.075 / 2) and d["match"] == 1.0


def test_a_budget_below_two_windows_is_refused(dev):
    with pytest.raises(ValueError, match="two windows"):
        TierManager(dev, CFG, hbm_tokens=W, window=W)


# ---- the policies on the real model --------------------------------------------------------

CONTEXT, HELD = 512, 24
RUN = r"""
import json, sys
import numpy as np
from ssdemu.bench import tier_eval as T
from ssdemu.llm.forward import Llama
from ssdemu.llm.gguf_model import load
cfg, w, tok = load()
model = Llama(cfg, w)
ids = tok.encode(open(T.DEFAULT_TEXT).read())
ref = T.reference(model, cfg, ids, {context}, {held})
out = {{}}
with T._drive(None, "star2000d") as dev:
    for name in {names!r}:
        row, m = T.run_policy(model, cfg, dev, ids, ref, {context}, {held}, name, 192,
                              T.gpu_step_ns(), seed=7, prefix=name.encode()[:10])
        out[name] = [m.log, row["perplexity"], row["moves"]]
print(json.dumps(out))
"""


def _decisions(names, threads: int) -> dict:
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    p = subprocess.run([sys.executable, "-c", RUN.format(context=CONTEXT, held=HELD,
                                                          names=list(names))],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_decisions_depend_on_the_seed_alone():
    """The policies that move windows by attention or by chance decide the same moves on a
    re-run with the same seed, with one BLAS thread and with two."""
    from ssdemu.llm.gguf_model import ModelFileError, load

    try:
        load()
    except ModelFileError as e:
        missing(str(e))
    names = ("h2o", "random", "contiguity", "qevict", "qevict-2bit", "predictive")
    a, b = _decisions(names, 1), _decisions(names, 2)
    for name in names:
        assert a[name][0] == b[name][0], name
        assert a[name][0], f"{name} moved nothing: the test would show nothing"
        assert a[name][2] == b[name][2]  # and so the same commands


@pytest.fixture(scope="module")
def model_run(dev):
    from ssdemu.bench import tier_eval as T
    from ssdemu.llm.forward import Llama
    from ssdemu.llm.gguf_model import ModelFileError, load

    try:
        cfg, w, tok = load()
    except ModelFileError as e:
        missing(str(e))
    model = Llama(cfg, w)
    ids = tok.encode(open(T.DEFAULT_TEXT).read())
    return T, cfg, model, ids, T.reference(model, cfg, ids, CONTEXT, HELD)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["streaming", "h2o", "random", "contiguity", "drive-select",
                                  "qevict", "qevict-2bit", "predictive"])
def test_every_policy_keeps_its_invariants_at_every_step(dev, model_run, name):
    """HBM within the budget with the sink and the newest window in it; nothing dropped
    comes back; the drive holds exactly the copies the manager believes, at their schemes;
    a budget the size of the context misses nothing."""
    from ssdemu.llm.policies import POLICIES

    T, cfg, model, ids, ref = model_run
    seen_dropped: dict[int, set] = {}  # per manager

    class Checked(POLICIES[name]):
        def update(self, m):
            super().update(m)
            hbm = [w.index for w in m.windows if w.tier == HBM]
            assert len(hbm) <= m.hbm_windows, (m.step, hbm)
            assert 0 in hbm and m.windows[-1].index in hbm
            dropped = {w.index for w in m.windows if w.tier == DROPPED}
            assert seen_dropped.get(id(m), set()) <= dropped
            seen_dropped[id(m)] = dropped
            for w in m.windows:
                assert dev.kv_exists(m.key(w)) == (w.copy is not None), (w.index, w.copy)
                assert (w.k is None) == (w.tier not in (HBM,)), (w.index, w.tier)

    saved = POLICIES[name]
    POLICIES[name] = Checked
    try:
        row, m = T.run_policy(model, cfg, dev, ids, ref, CONTEXT, HELD, name, 192,
                              T.gpu_step_ns(), prefix=b"inv" + name.encode()[:8])
        full = None
        if name in ("streaming", "drive-select", "qevict", "qevict-2bit", "predictive"):
            full, _ = T.run_policy(model, cfg, dev, ids, ref, CONTEXT, HELD, name,
                                   CONTEXT + 64, T.gpu_step_ns(),
                                   prefix=b"all" + name.encode()[:8])
    finally:
        POLICIES[name] = saved
    prefix = b"inv" + name.encode()[:8]
    assert not [k for k in dev.kv_list(start=prefix) if k.startswith(prefix)]  # all deleted
    if full is not None:  # everything fits: nothing missed, the reference's quality
        assert full["fmm"] == pytest.approx(0.0, abs=1e-6)
        assert full["lir"] == pytest.approx(0.0, abs=1e-6)
        assert full["perplexity"] == pytest.approx(np.exp(ref.ce.mean()), rel=2e-3)
    assert row["tpot_ms"] >= T.gpu_step_ns() / 1e6
    if name in ("drive-select", "qevict", "qevict-2bit", "predictive"):
        assert row["link_bytes_per_token"] > 0 and row["nand_bytes_per_token"] > 0
    else:
        assert row["link_bytes_per_token"] == row["nand_bytes_per_token"] == 0


@pytest.mark.slow
def test_a_policys_time_does_not_depend_on_the_runs_before_it(dev, model_run):
    """Runs on one daemon: the second starts past the first's background work on the
    virtual clock, so the same policy gives the same modelled TPOT and bytes again (each
    run started at 0 queued behind the runs before it: TPOT grew run after run)."""
    T, cfg, model, ids, ref = model_run
    rows = [T.run_policy(model, cfg, dev, ids, ref, CONTEXT, HELD, "qevict", 192,
                         T.gpu_step_ns(), prefix=b"again%d" % i)[0] for i in range(2)]
    assert rows[0]["tpot_ms"] > T.gpu_step_ns() / 1e6  # the drive's part is there
    for key in ("link_bytes_per_token", "nand_bytes_per_token", "perplexity"):
        assert rows[1][key] == rows[0][key], key
    # the media under the second run's blocks is not the first's (other places, dies)
    assert rows[1]["tpot_ms"] == pytest.approx(rows[0]["tpot_ms"], rel=0.01)


@pytest.mark.slow
def test_eval_policies_prints_one_table_and_one_json(tmp_path):
    from ssdemu.llm.gguf_model import ModelFileError, load

    try:
        load()
    except ModelFileError as e:
        missing(str(e))
    args = [sys.executable, "-m", "ssdemu", "eval", "--policies", "h2o,qevict,random",
            "--context", "320", "--held", "6", "--memory-budgets", "40"]
    p = subprocess.run([*args, "--json", "--plot", str(tmp_path)], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    (report,) = json.loads(p.stdout)["reports"]
    assert [r["policy"] for r in report["runs"]] == ["h2o", "qevict", "random"]
    assert {r["hbm_tokens"] for r in report["runs"]} == {128}
    assert set(report["claims"]["128"]) == {"recoverable_beats_drop", "attention_beats_random"}
    assert (tmp_path / "tiers_320.png").stat().st_size > 10_000
    text = subprocess.run([*args, "--no-progress"], capture_output=True, text=True,
                          timeout=600)
    assert text.returncode == 0 and "qevict" in text.stdout and "FMM" in text.stdout
    assert "recoverable beats drop" in text.stdout
