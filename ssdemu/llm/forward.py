"""The model's forward pass on the CPU, in numpy (float32, BLAS matrix products): prefill over
a sequence, then decoding a token at a time with attention served by whoever holds the KV.

Per layer a step exposes the post-RoPE query, and the new token's post-RoPE key and value;
`decode_step(token, pos, attend)` calls attend(layer, q, k, v) for the attention output, so
that the KV can live in memory (KVCache), in the drive, or be selected by a policy.  Rotary
embedding is llama.cpp's "normal" mode (rotated pairs of adjacent channels), the order the
GGUF converter wrote the query and key projections in."""

from __future__ import annotations

import numpy as np

from ssdemu.llm.gguf_model import LlamaConfig, LlamaWeights


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * w


def rope_tables(cfg: LlamaConfig, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin, (len(positions), head_dim / 2), of each pair's angle."""
    half = cfg.head_dim // 2
    inv = cfg.rope_base ** (-np.arange(half, dtype=np.float64) * 2 / cfg.head_dim)
    ang = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x (T, heads, head_dim) rotated pair by pair (channels 2i, 2i+1)."""
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal_from: int | None = 0,
              with_lse: bool = False):
    """Softmax attention of queries (Tq, Hq, d) over keys and values (Tk, Hkv, d), GQA by
    head groups; causal_from: query i sees keys up to causal_from + i (None: all).  With
    with_lse, also each query head's log-sum-exp of its scaled logits (Tq, Hq), for merging
    with attention over other keys (hostlib.merge_attention)."""
    tq, hq, d = q.shape
    tk, hkv, _ = k.shape
    g = hq // hkv
    qg = q.reshape(tq, hkv, g, d).transpose(1, 2, 0, 3)  # (Hkv, g, Tq, d)
    kt = k.transpose(1, 2, 0)  # (Hkv, d, Tk)
    s = (qg @ kt[:, None]) / np.sqrt(d)  # (Hkv, g, Tq, Tk)
    if causal_from is not None:
        mask = np.arange(tk)[None, :] > (causal_from + np.arange(tq))[:, None]
        s = np.where(mask, -np.inf, s)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    z = p.sum(axis=-1, keepdims=True)
    out = ((p / z) @ v.transpose(1, 0, 2)[:, None]).transpose(2, 0, 1, 3).reshape(tq, hq, d)
    if not with_lse:
        return out
    return out, (np.log(z) + m)[..., 0].transpose(2, 0, 1).reshape(tq, hq)


class Llama:
    def __init__(self, cfg: LlamaConfig, w: LlamaWeights):
        self.cfg, self.w = cfg, w

    def _qkv(self, layer: int, h: np.ndarray, positions: np.ndarray):
        c, lw = self.cfg, self.w.layers[layer]
        t = h.shape[0]
        q = (h @ lw.wq.T).reshape(t, c.heads, c.head_dim)
        k = (h @ lw.wk.T).reshape(t, c.kv_heads, c.head_dim)
        v = (h @ lw.wv.T).reshape(t, c.kv_heads, c.head_dim)
        cos, sin = rope_tables(c, positions)
        return rope(q, cos, sin), rope(k, cos, sin), v

    def _mlp(self, layer: int, x: np.ndarray) -> np.ndarray:
        lw = self.w.layers[layer]
        h = rms_norm(x, lw.ffn_norm, self.cfg.eps)
        gate = h @ lw.w_gate.T
        return x + ((gate / (1 + np.exp(-gate))) * (h @ lw.w_up.T)) @ lw.w_down.T

    def logits(self, x: np.ndarray) -> np.ndarray:
        return rms_norm(x, self.w.out_norm, self.cfg.eps) @ self.w.output.T

    def prefill(self, tokens, start: int = 0, cache: KVCache | None = None):
        """Logits (T, vocab) of a sequence (positions start..), its keys and values appended
        to cache (each layer's post-RoPE (T, kv_heads, head_dim))."""
        tokens = np.asarray(tokens, np.int64)
        positions = np.arange(start, start + len(tokens))
        x = self.w.embed[tokens]
        for layer in range(self.cfg.layers):
            lw = self.w.layers[layer]
            h = rms_norm(x, lw.attn_norm, self.cfg.eps)
            q, k, v = self._qkv(layer, h, positions)
            if cache is not None:
                cache.append(layer, k, v)
                k, v = cache.keys(layer), cache.values(layer)
            out = attention(q, k, v, causal_from=k.shape[0] - len(tokens))
            x = x + out.reshape(len(tokens), -1) @ lw.wo.T
            x = self._mlp(layer, x)
        return self.logits(x)

    def decode_step(self, token: int, pos: int, attend) -> np.ndarray:
        """Logits (vocab,) of one token at position pos; attend(layer, q (heads, head_dim),
        k (kv_heads, head_dim), v) gives each layer's attention output (heads, head_dim)
        over every earlier token and this one."""
        x = self.w.embed[np.array([token])]
        for layer in range(self.cfg.layers):
            lw = self.w.layers[layer]
            h = rms_norm(x, lw.attn_norm, self.cfg.eps)
            q, k, v = self._qkv(layer, h, np.array([pos]))
            out = attend(layer, q[0], k[0], v[0])
            x = x + out.reshape(1, -1) @ lw.wo.T
            x = self._mlp(layer, x)
        return self.logits(x)[0]


class KVCache:
    """The model alone holding its KV in memory: per layer, post-RoPE keys and values
    (tokens, kv_heads, head_dim), in `dtype` (np.float16: as a drive stores plain fp16)."""

    def __init__(self, cfg: LlamaConfig, dtype=np.float32):
        self.cfg, self.dtype = cfg, np.dtype(dtype)
        self.k = [np.zeros((0, cfg.kv_heads, cfg.head_dim), self.dtype)
                  for _ in range(cfg.layers)]
        self.v = [a.copy() for a in self.k]

    def __len__(self) -> int:
        return self.k[0].shape[0]

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        self.k[layer] = np.concatenate([self.k[layer], k.astype(self.dtype)])
        self.v[layer] = np.concatenate([self.v[layer], v.astype(self.dtype)])

    def keys(self, layer: int) -> np.ndarray:
        return self.k[layer].astype(np.float32)

    def values(self, layer: int) -> np.ndarray:
        return self.v[layer].astype(np.float32)

    def attend(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """decode_step's attend: the new token's KV kept, attention over all of it."""
        self.append(layer, k[None], v[None])
        return attention(q[None], self.keys(layer), self.values(layer), None)[0]
