"""`ssdemu bench retrieval`: query-aware page selection, its accuracy against dense attention on
a synthetic long-context suite, and its modelled cost per decode step.

The suite (one KV head of 128 channels with a GQA group of 4 query heads, per context length;
a slice of one layer is what selection sees, so per-head slices are enough here):
- keys N(0, 1) with 4 outlier channels of 10x the others' magnitude (as KIVI and KVQuant
  observe in real keys: [KIVI], [KVQuant]), rotary position embeddings (Llama-3's base
  500,000) applied to keys at their positions and queries at the decode position;
- attention sinks: the first 4 tokens' keys aligned with the queries' mean direction;
- queries drawn from a shifted distribution (a common mean plus noise), not the keys';
- needles: a key planted at a depth (5%-95% of the context), of the keys' usual norm, turned
  towards a later query's first head just enough to hold 60% of that head's dense softmax
  mass (a needle a model could retrieve, and no more): 32 depths;
- aggregation heads: queries of small norm whose mass spreads over the whole context, where
  top-k is known to fail ([MagicPIG]): 8 of them; and 8 plain queries.

Methods, at budgets of 1%, 3% and 10% of the pages (the sink page and the most recent page
always kept and counted): Quest (float32 summaries, and int8 rounded outwards), Quest then the
drive's exact re-rank of 16 x k candidates by page mass (the same pages cross the link: only
ids and outputs do; the candidates' keys are read inside the drive: `rerank_key_fraction` of
the context's keys) with its candidates half by Quest's bound and half by the channel-
selective score (`quest_rerank`) or all by the bound (`quest_rerank_bound`: when the second
half helps), and random pages (the control).  Metrics against dense attention: needle
hit rate, recall of the oracle top-k by true maximum score, softmax mass captured, relative
output error (attention over the chosen pages, by the firmware's own kernel).

The cost half models one decode step of Llama-3-8B on each profile at each length
(ssdemu/sim/retrieval.py), and the selection command alone under a batch over one shared
context, where the TOPS budget binds.
"""

from __future__ import annotations

import time

import numpy as np

from firmware import retrieval as R
from ssdemu.bench.retrieval_layout import format_table as layout_table
from ssdemu.bench.retrieval_layout import layout_comparison, real_layout_comparison
from ssdemu.sim.profile import load
from ssdemu.sim.retrieval import MODES, AttentionShape, decode_step, selection_step

D = 128
GROUP = 4
PAGE = 16
OUTLIERS = 4
SINKS = 4
NEEDLES = 32
AGGREGATION = 8
PLAIN = 8
NEEDLE_MASS = 0.6
RERANK = 16
BUDGETS = (0.01, 0.03, 0.10)
# queries whose needle_at is scored: the synthetic suite's planted needles, and the real
# model's most attended token (ssdemu/bench/retrieval_real.py)
NEEDLE_KINDS = ("needle", "real")
LENGTHS = (32768, 131072, 1 << 20)
LLAMA3_8B = AttentionShape(layers=32, kv_heads=8, group=4, head_dim=128)
PROFILES = ("star2000d", "pcie4-tlc")


def _rope(x: np.ndarray, positions: np.ndarray, base: float = 500_000.0) -> np.ndarray:
    """Llama's rotary embedding (rotate_half pairing channel i with i + D/2)."""
    half = x.shape[-1] // 2
    freq = base ** (-np.arange(half, dtype=np.float64) * 2 / x.shape[-1])
    ang = positions[:, None].astype(np.float64) * freq[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _logsumexp(x: np.ndarray, axis=-1) -> np.ndarray:
    m = x.max(axis=axis, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))).squeeze(axis)


class Suite:
    """One context of n tokens and its queries (q: (queries, GROUP, D), kind per query)."""

    def __init__(self, n: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.n = n
        scale = np.ones(D, np.float32)
        scale[rng.choice(D, OUTLIERS, replace=False)] = 10.0
        keys = rng.standard_normal((n, D), dtype=np.float32) * scale
        mean_q = rng.standard_normal(D, dtype=np.float32) * 1.5
        keys[:SINKS] = mean_q * 4.0  # sinks: every query looks there a lot
        pos = np.arange(n)
        keys = _rope(keys, pos)
        self.values = rng.standard_normal((n, D), dtype=np.float32)
        nq = NEEDLES + AGGREGATION + PLAIN
        q = mean_q + rng.standard_normal((nq, GROUP, D), dtype=np.float32)
        q[NEEDLES:NEEDLES + AGGREGATION] *= 0.05  # spread: small logits everywhere
        q = _rope(q.reshape(-1, D), np.full(nq * GROUP, n)).reshape(nq, GROUP, D)
        self.kind = ["needle"] * NEEDLES + ["aggregation"] * AGGREGATION + ["plain"] * PLAIN
        # needles: depth 5%..95%, each aligned with its query's first head, strong enough
        # to hold NEEDLE_MASS of that head's dense mass
        self.needle_at = np.linspace(0.05 * n, 0.95 * n, NEEDLES).astype(np.int64)
        norm = float(np.median(np.linalg.norm(keys[SINKS:SINKS + 4096], axis=1)))
        for i, t in enumerate(self.needle_at):
            q0 = q[i, 0].astype(np.float64)
            logits = keys.astype(np.float64) @ q0 / np.sqrt(D)
            logits[t] = -np.inf
            target = _logsumexp(logits) + np.log(NEEDLE_MASS / (1 - NEEDLE_MASS))
            # a key of the usual norm, turned towards the query just enough (keys come out
            # of a normalized projection: a needle is a direction, not a longer key)
            qhat = q0 / np.linalg.norm(q0)
            r = rng.standard_normal(D)
            r -= (r @ qhat) * qhat
            r /= np.linalg.norm(r)
            cos = min(1.0, target * np.sqrt(D) / (np.linalg.norm(q0) * norm))
            k = norm * (cos * qhat + np.sqrt(1 - cos * cos) * r)
            k *= max(1.0, target * np.sqrt(D) / (q0 @ k))  # past cos = 1: longer
            keys[t] = k.astype(np.float32)
        self.keys = keys
        self.q = q.astype(np.float32)

    def dense(self, i: int):
        return dense_masses(self.keys, self.values, self.q[i])


def dense_masses(keys: np.ndarray, values: np.ndarray, q: np.ndarray):
    """Per head of one query (G, D) over keys and values (n, D): page masses (G, pages),
    output (G, D), page max logit (pages,) over the group."""
    n, d = keys.shape
    g = q.shape[0]
    P = R.pages_of(n, PAGE)
    pad = P * PAGE - n
    logits = (keys @ q.T).T.astype(np.float64) / np.sqrt(d)  # (G, n)
    lse = _logsumexp(logits)
    p = np.exp(logits - lse[:, None])
    out = p @ values.astype(np.float64)
    pp = np.pad(p, ((0, 0), (0, pad)))
    masses = pp.reshape(g, P, PAGE).sum(axis=2)
    lp = np.pad(logits, ((0, 0), (0, pad)), constant_values=-np.inf)
    page_max = lp.reshape(g, P, PAGE).max(axis=2).max(axis=0)
    return masses, out, page_max


def _select(scores: np.ndarray, k: int) -> np.ndarray:
    ids = np.empty((1, k), np.int32)
    sc = np.empty((1, k), np.float32)
    R.topk_pages(scores[None, :].astype(np.float32), k, 1, 1, ids, sc)
    return ids[0][ids[0] >= 0]


def _quest(q, mins, maxs) -> np.ndarray:
    """Quest's scores of one head's pages; mins, maxs channel-major (1, D, P)."""
    s = np.empty((1, mins.shape[2]), np.float32)
    R.quest_scores(q, mins, maxs, s)
    return s[0]


def accuracy_on(suite, seed: int) -> dict:
    """The methods' metrics on a suite: n, keys (n, D), values, q (queries, G, D), kind and
    needle_at per query (a needle's token, for the queries of kind "needle")."""
    n = suite.n
    _, G, D = suite.q.shape
    P = R.pages_of(n, PAGE)
    keys3 = suite.keys[None]
    values3 = suite.values[None]
    mins = np.empty((1, P, D), np.float32)
    maxs = np.empty((1, P, D), np.float32)
    R.page_bounds(keys3, PAGE, mins, maxs)
    cmin = np.empty(mins.shape, np.int8)
    cmax = np.empty(mins.shape, np.int8)
    sc = np.empty((1, P), np.float32)
    R.bounds_to_int8(mins, maxs, cmin, cmax, sc)
    imins = np.empty_like(mins)
    imaxs = np.empty_like(maxs)
    R.int8_to_bounds(cmin, cmax, sc, imins, imaxs)
    # as the scoring kernels take them: channel-major (1, D, P)
    mins, maxs, imins, imaxs = (np.ascontiguousarray(x.transpose(0, 2, 1))
                                for x in (mins, maxs, imins, imaxs))
    rng = np.random.default_rng(seed + 1)
    forced = [0, P - 1]
    spread = np.empty((1, D), np.float32)
    R.channel_spread(mins, maxs, spread)
    methods = ("quest", "quest_int8", "quest_rerank", "quest_rerank_bound", "random")
    acc: dict = {}
    for frac in BUDGETS:
        total = max(3, int(round(frac * P)))  # pages attended, forced ones included
        k = total - len(forced)
        rows = {m: {"needle_hits": 0, "needles": 0, "recall": [], "mass": [], "error": [],
                    "mass_by_kind": {}} for m in methods}
        for i in range(len(suite.kind)):
            q = suite.q[i]
            masses, dense_out, page_max = suite.dense(i)
            middle = page_max[1:P - 1]
            oracle = set((np.lexsort((np.arange(1, P - 1), -middle))[:k] + 1).tolist())
            qs = np.empty((1, P), np.float32)
            sel = np.empty((1, P), np.float32)
            R.selective_scores(q, mins, maxs, spread, R.select_channels(D), sel, qs)
            qs = qs[0]
            picks = {"quest": _select(qs, k),
                     "quest_int8": _select(_quest(q, imins, imaxs), k),
                     "random": rng.choice(np.arange(1, P - 1), min(k, P - 2), replace=False)}
            mixed = np.empty((1, RERANK * k), np.int32)
            R.rerank_candidates(qs[None], sel, RERANK * k, 1, 1, mixed)  # as the drive: the
            # sink and last pages are kept anyway, never candidates
            for m, cand in (("quest_rerank", mixed[0]),
                            ("quest_rerank_bound", _select(qs, RERANK * k))):
                ids = np.empty((1, k), np.int32)
                scs = np.empty((1, k), np.float32)
                R.rerank_pages(q, keys3, PAGE, cand[None].astype(np.int32), k, ids, scs)
                picks[m] = ids[0][ids[0] >= 0]
            for m, sel in picks.items():
                pages = np.unique(np.concatenate([np.asarray(sel, np.int64), forced]))
                r = rows[m]
                if suite.kind[i] in NEEDLE_KINDS:
                    r["needles"] += 1
                    r["needle_hits"] += int(suite.needle_at[i] // PAGE in pages)
                r["recall"].append(len(oracle & set(int(p) for p in sel)) / k)
                mass = float(masses[:, pages].sum(axis=1).mean())
                r["mass"].append(mass)
                r["mass_by_kind"].setdefault(suite.kind[i], []).append(mass)
                out = np.empty((G, D), np.float32)
                lse = np.empty(G, np.float32)
                R.attend_pages(q, keys3, values3, PAGE, pages[None].astype(np.int32), out, lse)
                err = np.linalg.norm(out - dense_out, axis=1) / np.linalg.norm(dense_out, axis=1)
                r["error"].append(float(err.mean()))
        acc[f"{frac:g}"] = {
            "pages": P, "pages_attended": total, "budget_fraction": total / P,
            "rerank_key_fraction": min(1.0, RERANK * k / P),
            **{m: {"needle_hit_rate": r["needle_hits"] / max(1, r["needles"]),
                   "recall_vs_oracle": float(np.mean(r["recall"])),
                   "mass_captured": float(np.mean(r["mass"])),
                   "mass_by_kind": {kk: float(np.mean(v)) for kk, v in r["mass_by_kind"].items()},
                   "relative_output_error": float(np.mean(r["error"]))}
               for m, r in rows.items()}}
    return acc


def _costs(lengths, profiles) -> dict:
    out = {}
    for name in profiles:
        prof = load(name)
        rows = []
        for n in lengths:
            for mode in MODES:
                rows.append(decode_step(prof, LLAMA3_8B, n, mode, 2048).as_dict())
            rows.append({**decode_step(prof, LLAMA3_8B, n, "drive-select", 2048,
                                       rerank=RERANK).as_dict(), "mode": "drive-select+rerank"})
            rows.append({**decode_step(prof, LLAMA3_8B, n, "drive-select", 2048,
                                       int8_summaries=True).as_dict(),
                         "mode": "drive-select,int8-summaries"})
            rows.append({**decode_step(prof, LLAMA3_8B, n, "drive-select", 2048,
                                       summaries="nand").as_dict(),
                         "mode": "drive-select,summaries-on-nand"})
        best = {}
        for n in lengths:
            cands = [r for r in rows if r["context_tokens"] == n and r["mode"] in MODES]
            best[str(n)] = min(cands, key=lambda r: r["latency_ms"])["mode"]
        out[name] = {"decode_step": rows, "fastest_mode": best,
                     "selection_batch": [selection_step(prof, LLAMA3_8B, n, 2048, b)
                                         for n in lengths for b in (1, 64)]}
    return out


def bench_retrieval(lengths=LENGTHS, profiles=PROFILES, seed: int = 0, model_context: int = 0,
                    model_queries: int = 16, model_path: str | None = None,
                    layout_context: int = 0, layout_scheme: str = "plain") -> dict:
    """model_context > 0: also the real model's part (ssdemu/bench/retrieval_real.py) at that
    many tokens of context; layout_context > 0: the drive's commands on both block layouts
    (ssdemu/bench/retrieval_layout.py), on Gaussian KV and, with model_context, on the real
    model's (its first min(layout_context, model_context) tokens, whole blocks)."""
    t0 = time.perf_counter()
    kv = None
    if model_context:
        from ssdemu.bench.model_eval import DEFAULT_TEXT
        from ssdemu.bench.retrieval_real import model_queries as prefill

        kv = prefill(model_context, model_queries, DEFAULT_TEXT, model_path)
    accuracy = {}
    for n in lengths:
        accuracy[str(n)] = accuracy_on(Suite(n, seed), seed)
    agg = {}
    for m in ("quest", "quest_rerank", "quest_rerank_bound"):
        agg[m] = float(np.mean([accuracy[str(n)][f"{b:g}"][m]["mass_captured"]
                                for n in lengths for b in BUDGETS]))
    at3 = {m: {str(n): accuracy[str(n)]["0.03"][m]["needle_hit_rate"] for n in lengths}
           for m in ("quest", "quest_rerank", "quest_rerank_bound")}
    return {
        "suite": {"head_dim": D, "gqa_group": GROUP, "page_tokens": PAGE,
                  "outlier_channels": OUTLIERS, "sinks": SINKS, "needles": NEEDLES,
                  "needle_mass": NEEDLE_MASS, "aggregation_queries": AGGREGATION,
                  "plain_queries": PLAIN, "rerank_candidates_per_page": RERANK,
                  "rope_base": 500_000, "seed": seed},
        "accuracy": accuracy,
        "aggregate_mass_captured": agg,
        "rerank_over_quest_mass": agg["quest_rerank"] - agg["quest"],
        "needle_hit_rate_at_3pct": at3,
        "cost": _costs(lengths, profiles),
        **(_real_part(model_context, model_queries, seed, model_path, agg, kv)
           if model_context else {}),
        **({"layout": layout_comparison(layout_context, scheme=layout_scheme, seed=seed)}
           if layout_context else {}),
        **({"layout_real": _real_layout(kv, min(layout_context, model_context), layout_scheme)}
           if layout_context and kv is not None and min(layout_context, model_context) >= 64
           else {}),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _real_layout(kv, context: int, scheme: str) -> dict:
    cfg, keys, values, qs = kv
    return real_layout_comparison(cfg, keys, values, qs, context // 64 * 64, scheme=scheme)


def _real_part(context, queries, seed, model_path, synthetic_mass, kv) -> dict:
    from ssdemu.bench.retrieval_real import real_model_accuracy

    real = real_model_accuracy(context, queries, seed, model_path=model_path, kv=kv)
    mass = {m: float(np.mean([real["accuracy"][f"{b:g}"][m]["mass_captured"]
                              for b in BUDGETS]))
            for m in ("quest", "quest_rerank", "quest_rerank_bound")}
    real["aggregate_mass_captured"] = mass
    real["rerank_over_quest_mass"] = mass["quest_rerank"] - mass["quest"]
    return {"real_model": real,
            "rerank_over_quest_mass_synthetic_vs_real": [
                synthetic_mass["quest_rerank"] - synthetic_mass["quest"],
                real["rerank_over_quest_mass"]]}


def format_table(r: dict) -> str:
    lines = ["accuracy (mean over queries; budget = pages attended / pages)",
             f"{'length':>8} {'budget':>6} {'method':<18} {'needle':>7} {'recall':>7} "
             f"{'mass':>6} {'agg.mass':>8} {'out.err':>8}"]
    for n, by_budget in r["accuracy"].items():
        for b, row in by_budget.items():
            for m in ("quest", "quest_int8", "quest_rerank", "quest_rerank_bound", "random"):
                x = row[m]
                lines.append(f"{n:>8} {b:>6} {m:<18} {x['needle_hit_rate']:7.3f} "
                             f"{x['recall_vs_oracle']:7.3f} {x['mass_captured']:6.3f} "
                             f"{x['mass_by_kind'].get('aggregation', 0):8.3f} "
                             f"{x['relative_output_error']:8.4f}")
    lines.append(f"aggregate mass captured: {r['aggregate_mass_captured']}")
    if "real_model" in r:
        x = r["real_model"]
        lines.append(f"the real model's keys: {x['model']}, {x['context_tokens']} tokens of "
                     f"context, {x['queries']} decode steps' queries, layers {x['layers']} x "
                     f"{x['kv_heads']} KV heads (needle: its most attended token)")
        for b, row in x["accuracy"].items():
            for m in ("quest", "quest_int8", "quest_rerank", "quest_rerank_bound", "random"):
                y = row[m]
                lines.append(f"{'real':>8} {b:>6} {m:<18} {y['needle_hit_rate']:7.3f} "
                             f"{y['recall_vs_oracle']:7.3f} {y['mass_captured']:6.3f} "
                             f"{'':>8} {y['relative_output_error']:8.4f}")
    lines.append("modelled decode step, Llama-3-8B, 2,048-token budget")
    lines.append(f"{'profile':<10} {'length':>8} {'mode':<31} {'ms':>10} {'link MB':>10} "
                 f"{'util':>5} {'binds':>6}")
    for prof, c in r["cost"].items():
        for x in c["decode_step"]:
            lines.append(f"{prof:<10} {x['context_tokens']:>8} {x['mode']:<31} "
                         f"{x['latency_ms']:10.2f} {x['link_bytes'] / 1e6:10.2f} "
                         f"{x['compute_utilization']:5.2f} {x['binds']:>6}")
        for x in c["selection_batch"]:
            lines.append(f"{prof:<10} {x['context_tokens']:>8} selection, batch {x['batch']:<3} "
                         f"{'':<14} {x['latency_ms']:10.2f} {'':>10} "
                         f"{x['compute_utilization']:5.2f} mac {x['mac_utilization']:.2f}")
    for part in ("layout", "layout_real"):
        if part in r:
            lines.append(layout_table(r[part]))
    return "\n".join(lines)
