"""`ssdemu bench forward`: the real model's CPU forward pass (ssdemu/llm/forward.py, numpy),
against torch on the CPU running the same weights the same way, and against memcpy.

Why numpy: a decode step is matrix-vector products over every weight (135M float32 values,
540 MB for SmolLM2), so it is bound by memory bandwidth, not arithmetic; numpy's BLAS
streams the weights near memcpy's rate, and neither torch nor a Numba kernel can read them
faster.  This bench measures that claim in one run: per token, numpy's decode (KV in memory
at `context` tokens) and prefill, torch's (when importable: the LMCache venv has it), and the
weights' bytes over the decode's time against a copy's memory traffic (read plus write) over a
buffer of their size.
torch's logits are checked against numpy's."""

from __future__ import annotations

import time

import numpy as np


def _weights_bytes(w) -> int:
    n = w.embed.nbytes + w.output.nbytes + w.out_norm.nbytes
    for lw in w.layers:
        n += sum(getattr(lw, f).nbytes for f in lw.__dataclass_fields__)
    return n


def _memcpy_gb_s(nbytes: int, repeat: int = 3) -> float:
    """Memory traffic of a copy (bytes read plus bytes written per second)."""
    src = np.ones(nbytes // 8, np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.nbytes / best / 1e9


def _numpy_run(m, cfg, ids, context, steps):
    from ssdemu.llm.forward import KVCache

    cache = KVCache(cfg, np.float16)
    t = time.perf_counter()
    m.prefill(ids[:context], cache=cache, last_only=True)
    prefill = time.perf_counter() - t
    logits = []
    t = time.perf_counter()
    for pos in range(context, context + steps):
        logits.append(m.decode_step(ids[pos], pos, cache.attend))
    return prefill, time.perf_counter() - t, np.stack(logits)


def _torch_run(cfg, w, ids, context, steps):
    """The same forward in torch (float32, CPU), KV in preallocated tensors."""
    import warnings

    import torch
    import torch.nn.functional as F

    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    T = torch.from_numpy  # read-only weights, only read
    L = [{f: T(getattr(lw, f)) for f in lw.__dataclass_fields__} for lw in w.layers]
    embed, out_w, out_norm = T(w.embed), T(w.output), T(w.out_norm)
    half = cfg.head_dim // 2
    inv = cfg.rope_base ** (-torch.arange(half, dtype=torch.float64) * 2 / cfg.head_dim)
    n = context + steps
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = ang.cos().float(), ang.sin().float()
    kc = torch.zeros(cfg.layers, cfg.kv_heads, n, cfg.head_dim)
    vc = torch.zeros_like(kc)
    g = cfg.heads // cfg.kv_heads

    def norm(x, wt):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + cfg.eps) * wt

    def rope(x, pos):  # x (t, h, d), pairs (2i, 2i+1)
        c, s = cos[pos][:, None], sin[pos][:, None]
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)

    def forward(tokens, start):
        t = len(tokens)
        pos = torch.arange(start, start + t)
        x = embed[torch.tensor(tokens)]
        for li, lw in enumerate(L):
            h = norm(x, lw["attn_norm"])
            q = rope((h @ lw["wq"].T).view(t, cfg.heads, cfg.head_dim), pos)
            k = rope((h @ lw["wk"].T).view(t, cfg.kv_heads, cfg.head_dim), pos)
            v = (h @ lw["wv"].T).view(t, cfg.kv_heads, cfg.head_dim)
            kc[li, :, start:start + t] = k.transpose(0, 1).half().float()  # fp16 KV
            vc[li, :, start:start + t] = v.transpose(0, 1).half().float()
            keys = kc[li, :, :start + t].repeat_interleave(g, 0)
            vals = vc[li, :, :start + t].repeat_interleave(g, 0)
            o = F.scaled_dot_product_attention(q.transpose(0, 1), keys, vals,
                                               is_causal=t > 1 and start == 0)
            x = x + o.transpose(0, 1).reshape(t, -1) @ lw["wo"].T
            h = norm(x, lw["ffn_norm"])
            x = x + (F.silu(h @ lw["w_gate"].T) * (h @ lw["w_up"].T)) @ lw["w_down"].T
        return norm(x[-1:], out_norm) @ out_w.T

    with torch.inference_mode():
        t = time.perf_counter()
        forward(ids[:context], 0)
        prefill = time.perf_counter() - t
        logits = []
        t = time.perf_counter()
        for pos in range(context, context + steps):
            logits.append(forward([ids[pos]], pos)[0].numpy())
        decode = time.perf_counter() - t
    return prefill, decode, np.stack(logits), torch.get_num_threads(), torch.__version__


def bench_forward(context: int = 2048, steps: int = 8, text: str | None = None,
                  model_path: str | None = None) -> dict:
    import pathlib

    from ssdemu.bench.model_eval import DEFAULT_TEXT
    from ssdemu.llm.forward import Llama
    from ssdemu.llm.gguf_model import load

    cfg, w, tok = load(model_path)
    m = Llama(cfg, w)
    ids = tok.encode(pathlib.Path(text or DEFAULT_TEXT).read_text())[:context + steps + 1]
    if len(ids) < context + steps + 1:
        raise ValueError("the text is shorter than context + steps + 1 tokens")
    nbytes = _weights_bytes(w)
    memcpy = _memcpy_gb_s(nbytes)
    p, d, ours = _numpy_run(m, cfg, ids, context, steps)
    out = {"model": cfg.name, "context_tokens": context, "decode_steps": steps,
           "weights_bytes": nbytes, "memcpy_gb_s": round(memcpy, 2),
           "numpy": {"prefill_ms_per_token": round(p / context * 1e3, 3),
                     "decode_ms_per_token": round(d / steps * 1e3, 2),
                     "weights_gb_s": round(nbytes / (d / steps) / 1e9, 2)}}
    out["numpy"]["weights_over_memcpy"] = round(out["numpy"]["weights_gb_s"] / memcpy, 3)
    try:
        import torch  # noqa: F401
    except ImportError:
        out["torch"] = None
        return out
    tp, td, theirs, threads, version = _torch_run(cfg, w, ids, context, steps)
    out["torch"] = {"version": version, "threads": threads,
                    "prefill_ms_per_token": round(tp / context * 1e3, 3),
                    "decode_ms_per_token": round(td / steps * 1e3, 2),
                    "largest_logit_difference": float(np.abs(theirs - ours).max())}
    out["numpy_over_torch_decode"] = round(td / d, 3)  # > 1: numpy faster
    out["numpy_over_torch_prefill"] = round(tp / p, 3)
    return out
