"""`ssdemu bench retrieval --layout-context N`: the drive's retrieval commands on blocks laid
out by head (format version 2, the default) against the same blocks token by token (`serve
--kv-layout token`, the order before it), in one run: each layout's daemon stores the same
sequence and answers the same decode steps' TOPK_PAGES (the default re-rank) and ATTEND.

Per layout, from the daemon's log page: each command's modelled device time and the NAND bytes
it read (the re-rank reads its candidates' keys, ATTEND its pages' keys and values: by head, a
page of one head of one layer; token by token, that page's whole token rows, every layer and
head).  The selections must be identical (the layout moves bytes, not values).  The KV is
Gaussian in SmolLM2-135M's shape (30 layers, 3 KV heads of 64 channels, 9 query heads), in the
scheme asked (plain fp16 by default; an integer scheme reads codes and scales); or, with
`bench retrieval --model-context`, the real model's own: its prefilled context's post-RoPE K
and V as the blocks and its decode steps' queries (real_layout_comparison).  Real keys make
the selections cluster (sinks, the recent pages, a topic's span), so the pages a command reads
lie next to each other more often than Gaussian keys' picks: the NAND bytes and runs differ,
and that is the figure a user of a real model sees."""

from __future__ import annotations

import numpy as np

import hostlib
from ssdemu.bench.keepup import (
    BLOCK_TOKENS,
    PAGE,
    SHAPE,
    budget_pages,
    gaussian_blocks,
    store_sequence,
)
from ssdemu.tools.daemon_process import private_daemon

LAYOUTS = ("token", "head")


def _phase(dev, run) -> dict:
    """Commands, modelled ns and NAND bytes of the retrieval commands `run` sends."""
    before = dev.log()["retrieval"]
    out = run()
    after = dev.log()["retrieval"]
    n = after["commands"] - before["commands"]
    return {"commands": n,
            "modelled_ms_per_command": (after["device_ns"] - before["device_ns"]) / n / 1e6,
            "nand_bytes_per_command": (after["nand_bytes_read"]
                                       - before["nand_bytes_read"]) / n,
            "result": out}


def _one_layout(layout: str, blocks: list, queries: list, k: int, rerank: int,
                scheme: str, profile: str | None, media: str, s: dict) -> dict:
    extra = ("--kv-layout", layout) + (("--profile", profile) if profile else ())
    kw = dict(layers=s["layers"], page_tokens=PAGE, sink_pages=1, recent_pages=1)
    with private_daemon("ssdemu-layout-", media, extra) as d:
        with hostlib.connect(d.socket_path) as dev:
            keys = store_sequence(dev, "lay", blocks, scheme)

            def topk():
                return [dev.topk_pages(keys, q, kv_heads=s["kv_heads"], k=k, rerank=rerank,
                                       layer=layer, **kw)[0].copy()
                        for layer, q in queries]

            # the first pass reads every block's summaries into the drive's DRAM: measured
            # apart, so that both layouts' steady state is compared
            first = _phase(dev, topk)
            steady = _phase(dev, topk)
            ids = steady.pop("result")
            first.pop("result")
            attend = _phase(dev, lambda: [dev.attend(keys, q, i, layer=layer, **kw)[0].copy()
                                          for (layer, q), i in zip(queries, ids, strict=True)])
            outs = attend.pop("result")
            for key in keys:
                dev.kv_delete(key)
    return {"topk_first_pass": first, "topk_rerank": steady, "attend": attend,
            "ids": ids, "outputs": outs}


def layout_comparison(context: int = 2048, steps: int = 2, rerank: int = 4,
                      budget_pct: float = 12.0, scheme: str = "plain",
                      profile: str | None = None, media: str = "mem:1G",
                      seed: int = 0) -> dict:
    """Gaussian KV in SmolLM2-135M's shape (SHAPE): `steps` decode steps of every layer."""
    _check_context(context)
    s = SHAPE
    rng = np.random.default_rng(seed)
    blocks = gaussian_blocks(rng, context // BLOCK_TOKENS)
    queries = [(layer, rng.standard_normal((s["q_heads"], s["head_dim"])).astype(np.float32))
               for _ in range(steps) for layer in range(s["layers"])]
    return {"kv": "gaussian", **compare_layouts(blocks, queries, s, steps, rerank, budget_pct,
                                                scheme, profile, media)}


def real_layout_comparison(cfg, keys: list, values: list, qs: np.ndarray, context: int,
                           steps: int = 2, rerank: int = 4, budget_pct: float = 12.0,
                           scheme: str = "plain", profile: str | None = None,
                           media: str = "mem:1G", raw: bool = False) -> dict:
    """A real model's KV (ssdemu.bench.retrieval_real.model_queries: per layer its context's
    K and V (tokens, kv_heads, head_dim), fp16 values; qs (steps, layers, heads, head_dim),
    the decode steps' post-RoPE queries): the context's first `context` tokens as blocks in
    the drive's layout, as DriveKV stores them, and the first `steps` steps' queries.  raw:
    also the head layout's page ids and ATTEND outputs per command ("raw", not JSON)."""
    _check_context(context)
    if len(keys[0]) < context:
        raise ValueError(f"the model's context has {len(keys[0])} tokens, not {context}")
    if not 0 < steps <= len(qs):
        raise ValueError(f"{len(qs)} decode steps' queries, {steps} asked")
    s = dict(layers=cfg.layers, kv_heads=cfg.kv_heads, q_heads=cfg.heads,
             head_dim=cfg.head_dim)
    blocks = []
    for t0 in range(0, context, BLOCK_TOKENS):
        k = np.stack([x[t0:t0 + BLOCK_TOKENS] for x in keys], axis=1)  # (t, layers, h, d)
        v = np.stack([x[t0:t0 + BLOCK_TOKENS] for x in values], axis=1)
        blocks.append(np.ascontiguousarray(np.stack([k, v], axis=1), np.float16))
    queries = [(layer, np.ascontiguousarray(qs[j, layer], np.float32))
               for j in range(steps) for layer in range(cfg.layers)]
    return {"kv": f"real: {cfg.name}", **compare_layouts(blocks, queries, s, steps, rerank,
                                                        budget_pct, scheme, profile, media,
                                                        raw)}


def _check_context(context: int) -> None:
    if context < BLOCK_TOKENS or context % BLOCK_TOKENS:
        raise ValueError(f"the layout context is a multiple of {BLOCK_TOKENS} tokens, got "
                         f"{context}")


def compare_layouts(blocks: list, queries: list, s: dict, steps: int, rerank: int,
                    budget_pct: float, scheme: str, profile: str | None, media: str,
                    raw: bool = False) -> dict:
    """Both layouts' daemons on the same blocks (fp16, (tokens, 2, layers, kv_heads,
    head_dim)) and queries ((layer, (q_heads, head_dim) float32) in decode order)."""
    context = len(blocks) * BLOCK_TOKENS
    k = budget_pages(context // PAGE, budget_pct)
    runs = {lay: _one_layout(lay, blocks, queries, k, rerank, scheme, profile, media, s)
            for lay in LAYOUTS}
    tok, head = runs["token"], runs["head"]
    same_ids = all(np.array_equal(a, b) for a, b in zip(tok["ids"], head["ids"], strict=True))
    same_out = all(np.array_equal(a, b) for a, b in zip(tok["outputs"], head["outputs"],
                                                        strict=True))
    out = {"context_tokens": context, "decode_steps": steps, "layers": s["layers"],
           "kv_heads": s["kv_heads"], "head_dim": s["head_dim"], "scheme": scheme,
           "budget_pages": k, "rerank": rerank, "selections_identical": same_ids,
           "attention_identical": same_out}
    for lay in LAYOUTS:
        out[lay] = {part: runs[lay][part] for part in ("topk_first_pass", "topk_rerank",
                                                       "attend")}
    for part in ("topk_rerank", "attend"):
        t, h = tok[part], head[part]
        out[f"{part}_head_vs_token"] = {
            "modelled_time": h["modelled_ms_per_command"] / t["modelled_ms_per_command"],
            "nand_bytes": h["nand_bytes_per_command"] / t["nand_bytes_per_command"]}
    if raw:
        out["raw"] = {"ids": head["ids"], "outputs": head["outputs"]}
    return out


def format_table(r: dict) -> str:
    lines = [f"layout ({r['kv']} KV): {r['context_tokens']} tokens, {r['layers']} layers x "
             f"{r['kv_heads']} KV heads x {r['head_dim']}, {r['scheme']}, k "
             f"{r['budget_pages']} pages, rerank {r['rerank']}, {r['decode_steps']} decode "
             "steps",
             f"{'command':<14} {'layout':<6} {'modelled ms':>12} {'NAND KiB':>10}"]
    for part in ("topk_rerank", "attend"):
        for lay in LAYOUTS:
            x = r[lay][part]
            lines.append(f"{part:<14} {lay:<6} {x['modelled_ms_per_command']:12.3f} "
                         f"{x['nand_bytes_per_command'] / 1024:10.1f}")
        ratio = r[f"{part}_head_vs_token"]
        lines.append(f"{part:<14} head/token time {ratio['modelled_time']:.3f}, NAND bytes "
                     f"{ratio['nand_bytes']:.3f}")
    lines.append(f"selections identical: {r['selections_identical']}; attention identical: "
                 f"{r['attention_identical']}")
    return "\n".join(lines)
