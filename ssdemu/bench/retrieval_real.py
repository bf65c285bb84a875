"""`bench retrieval`'s real-model part: the synthetic suite's metrics on a real model's keys.

The synthetic suite (ssdemu/bench/retrieval.py) plants what the literature reports of real
keys — outlier channels, attention sinks, needles — into random ones.  Here the keys,
values and queries are SmolLM2-135M's own (ssdemu.llm): a text's first `context` tokens
prefilled (their post-RoPE K and V kept as fp16, as the drive stores them), then `queries`
tokens decoded teacher-forced with that KV in memory, each step's post-RoPE query of every
layer kept.  Per layer from 2 on (layers 0 and 1 attend broadly: Quest skips them too) and
per KV head, the same methods at the same page budgets as the synthetic suite, with a KV
head's GQA group of query heads as its queries, scored against dense attention over the
context's keys: recall of the oracle's pages, mass captured, relative output error, and in
place of a planted needle the query's most attended token outside the sink and last pages
(does the selection hold it).  Means over layers and heads, and the mass per layer.
"""

from __future__ import annotations

import pathlib

import numpy as np

from ssdemu.bench.retrieval import BUDGETS, PAGE, accuracy_on, dense_masses

METHODS = ("quest", "quest_int8", "quest_rerank", "quest_rerank_bound", "random")
FIRST_LAYER = 2
METRICS = ("needle_hit_rate", "recall_vs_oracle", "mass_captured", "relative_output_error")


class RealSuite:
    """One KV head of one layer: keys and values (n, D) float32, its group's queries
    (queries, G, D); each query's needle is its most attended token past the sink page and
    before the last page (the pages every method keeps)."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, q: np.ndarray):
        self.n, self.keys, self.values, self.q = len(keys), keys, values, q
        self.kind = ["real"] * len(q)
        last = (self.n - 1) // PAGE * PAGE
        self.needle_at = np.empty(len(q), np.int64)
        for i in range(len(q)):
            logits = (keys[PAGE:last] @ q[i].T).max(axis=1)  # over the group's heads
            self.needle_at[i] = PAGE + int(np.argmax(logits))

    def dense(self, i: int):
        return dense_masses(self.keys, self.values, self.q[i])


def model_queries(context: int, queries: int, text: str, model_path=None):
    """The model, the context's K and V per layer (tokens, kv_heads, D) as fp16 values in
    float32, and the next `queries` steps' query per layer (queries, layers, heads, D)."""
    from ssdemu.llm.forward import KVCache, Llama
    from ssdemu.llm.gguf_model import load

    cfg, w, tok = load(model_path)
    m = Llama(cfg, w)
    ids = tok.encode(pathlib.Path(text).read_text())
    if len(ids) < context + queries + 1:
        raise ValueError(f"{text} has {len(ids)} tokens: fewer than context + queries + 1")
    mem = KVCache(cfg, np.float16)
    m.prefill(ids[:context], cache=mem, last_only=True)
    keys = [k.copy() for k in mem.k]
    values = [v.copy() for v in mem.v]
    qs = np.empty((queries, cfg.layers, cfg.heads, cfg.head_dim), np.float32)
    for j, pos in enumerate(range(context, context + queries)):
        def attend(layer, q, k, v, j=j):
            qs[j, layer] = q
            return mem.attend(layer, q, k, v)

        m.decode_step(ids[pos], pos, attend)
    return cfg, keys, values, qs


def real_model_accuracy(context: int = 2048, queries: int = 16, seed: int = 0,
                        text: str | None = None, model_path: str | None = None,
                        kv: tuple | None = None) -> dict:
    """kv: model_queries' answer for this context, queries and text, when the caller has it
    (bench retrieval's layout part uses the same prefill)."""
    from ssdemu.bench.model_eval import DEFAULT_TEXT

    text = text or DEFAULT_TEXT
    cfg, keys, values, qs = kv or model_queries(context, queries, text, model_path)
    g = cfg.heads // cfg.kv_heads
    sums = {f"{b:g}": {m: {x: [] for x in METRICS} for m in METHODS} for b in BUDGETS}
    per_layer = {m: [] for m in METHODS}  # mass at 3%, per layer (mean over heads)
    shape = {}
    for layer in range(FIRST_LAYER, cfg.layers):
        at3 = {m: [] for m in METHODS}
        for h in range(cfg.kv_heads):
            suite = RealSuite(keys[layer][:, h], values[layer][:, h],
                              np.ascontiguousarray(qs[:, layer, h * g:(h + 1) * g]))
            acc = accuracy_on(suite, seed)
            for b, row in acc.items():
                shape[b] = {k: row[k] for k in ("pages", "pages_attended", "budget_fraction",
                                                 "rerank_key_fraction")}
                for m in METHODS:
                    for x in METRICS:
                        sums[b][m][x].append(row[m][x])
            for m in METHODS:
                at3[m].append(acc["0.03"][m]["mass_captured"])
        for m in METHODS:
            per_layer[m].append(round(float(np.mean(at3[m])), 4))
    accuracy = {b: {**shape[b], **{m: {x: float(np.mean(v)) for x, v in by.items()}
                                   for m, by in rows.items()}}
                for b, rows in sums.items()}
    return {"model": cfg.name, "text": text, "context_tokens": context, "queries": queries,
            "layers": f"{FIRST_LAYER}..{cfg.layers - 1}", "kv_heads": cfg.kv_heads,
            "gqa_group": g, "head_dim": cfg.head_dim,
            "needle": "each query's most attended token past the sink page, before the last",
            "accuracy": accuracy, "mass_at_3pct_per_layer": per_layer}
