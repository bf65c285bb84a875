"""`ssdemu bench keepup`: does the emulator finish a decode step's retrieval commands by the
time the drive it models would, on the real clock?

A daemon on the real clock with the detailed model (its profile); one sequence of a long
context stored as a decoding engine stores it (64-token blocks with their page summaries, in
the drive's block format); then, for each decoded token, every layer's TOPK_PAGES (the
default re-rank) and ATTEND over the pages it chose, one after the other as DriveKV sends
them.  The daemon measures each command's host lag: how far past its modelled completion its
host work ended (0: it kept up).  The baseline in the same run is the modelled time itself:
lag is reported against it.  The KV is Gaussian in SmolLM2-135M's shape (30 layers, 3 KV
heads, 9 query heads, head_dim 64): the host's work per command depends on the shapes, not
on the values."""

from __future__ import annotations

import time

import numpy as np

import hostlib
from ssdemu.device.latency import bucket_values_ns, new_histogram, percentiles_us
from ssdemu.tools.daemon_process import private_daemon

SHAPE = dict(layers=30, kv_heads=3, q_heads=9, head_dim=64)
BLOCK_TOKENS, PAGE = 64, 16


def _hist(log: dict) -> np.ndarray:
    """The daemon's retrieval host-lag histogram, back in its buckets (ssdemu.device.latency)."""
    out = new_histogram()
    at_us = bucket_values_ns() / 1e3
    for us, n in log["retrieval"]["host_lag"]["histogram"]:
        out[int(np.searchsorted(at_us, us))] = n
    return out


def budget_pages(pages: int, budget_pct: float) -> int:
    """Pages a TOPK keeps at budget_pct of the context's, the sink and recent pages apart."""
    return max(1, min(round(pages * budget_pct / 100), pages - 2))


def store_sequence(dev, prefix: str, blocks, scheme: str = "plain") -> list[bytes]:
    """Blocks (fp16, SHAPE) stored as a decoding engine stores them (quantized in the drive,
    with their page summaries); their keys, in order."""
    keys = [f"{prefix}/{i:05d}".encode() for i in range(len(blocks))]
    for key, block in zip(keys, blocks, strict=True):
        dev.kv_put_quantized(key, block.view(np.uint16), "fp16", scheme, summary_page=PAGE)
    return keys


def gaussian_blocks(rng, n: int) -> list[np.ndarray]:
    s = SHAPE
    return [rng.standard_normal((BLOCK_TOKENS, 2, s["layers"], s["kv_heads"],
                                 s["head_dim"])).astype(np.float16) for _ in range(n)]


def bench_keepup(context: int = 4096, tokens: int = 64, budget_pct: float = 12.0,
                 rerank: int = 4,  # the eval's drive-select (ssdemu.bench.model_eval.METHODS)
                 profile: str | None = None, media: str = "mem:2G",
                 warmup: int = 2, seed: int = 0, kv_layout: str = "head") -> dict:
    if context < BLOCK_TOKENS or context % BLOCK_TOKENS:
        raise ValueError(f"--context is a multiple of {BLOCK_TOKENS} tokens, got {context}")
    s = SHAPE
    extra = ("--kv-layout", kv_layout) + (("--profile", profile) if profile else ())
    rng = np.random.default_rng(seed)
    with private_daemon("ssdemu-keepup-", media, extra) as d:
        with hostlib.connect(d.socket_path) as dev:
            keys = store_sequence(dev, "ku", gaussian_blocks(rng, context // BLOCK_TOKENS))
            pages = context // PAGE
            k = budget_pages(pages, budget_pct)
            kw = dict(layers=s["layers"], page_tokens=PAGE, sink_pages=1, recent_pages=1)
            wall, before = [], None
            for t in range(warmup + tokens):
                if t == warmup:
                    before = dev.log()
                t0 = time.perf_counter()
                for layer in range(s["layers"]):
                    q = rng.standard_normal((s["q_heads"], s["head_dim"])).astype(np.float32)
                    ids, _ = dev.topk_pages(keys, q, kv_heads=s["kv_heads"], k=k,
                                            rerank=rerank, layer=layer, **kw)
                    dev.attend(keys, q, ids, layer=layer, **kw)
                if t >= warmup:
                    wall.append(time.perf_counter() - t0)
            after = dev.log()
            for key in keys:
                dev.kv_delete(key)
    lag = _hist(after) - _hist(before)  # the measured tokens' commands
    r0, r1 = before["retrieval"], after["retrieval"]
    n = r1["commands"] - r0["commands"]
    p50, p99, p999 = percentiles_us(lag) if lag.any() else [None] * 3
    modelled_ms = (r1["device_ns"] - r0["device_ns"]) / n / 1e6
    host_ms = (r1["host_ns"] - r0["host_ns"]) / n / 1e6
    return {"context_tokens": context, "decoded_tokens": tokens, "layers": s["layers"],
            "kv_layout": kv_layout,
            "budget_pages": k, "rerank": rerank, "commands": n,
            "profile": after.get("model", {}).get("profile", profile),
            "modelled_ms_per_command": modelled_ms, "host_ms_per_command": host_ms,
            "host_vs_modelled": host_ms / modelled_ms,
            "host_lag_us": {"p50": p50, "p99": p99, "p999": p999,
                            "late_commands": int(lag[1:].sum())},  # bucket 0: no lag
            "wall_ms_per_token": float(np.mean(wall) * 1e3),
            "modelled_ms_per_token": modelled_ms * n / tokens}


def format_table(r: dict) -> str:
    lag = r["host_lag_us"]

    def us(v):
        return "n/a" if v is None else f"{v:.0f} us"
    return (f"{r['context_tokens']}-token context, {r['layers']} layers x (TOPK rerank "
            f"{r['rerank']}, k={r['budget_pages']} + ATTEND), {r['decoded_tokens']} tokens: "
            f"{r['commands']} commands\n"
            f"modelled {r['modelled_ms_per_command']:.3f} ms a command, host "
            f"{r['host_ms_per_command']:.3f} ms ({r['host_vs_modelled']:.2f}x)\n"
            f"host lag p50 {us(lag['p50'])}, p99 {us(lag['p99'])}, p99.9 {us(lag['p999'])}; "
            f"late {lag['late_commands']} of {r['commands']}\n"
            f"wall {r['wall_ms_per_token']:.1f} ms a token, modelled "
            f"{r['modelled_ms_per_token']:.1f} ms")

