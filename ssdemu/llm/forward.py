"""The model's forward pass on the CPU, in numpy (float32, BLAS matrix products): prefill over
a sequence, then decoding a token at a time with attention served by whoever holds the KV.

Per layer a step exposes the post-RoPE query, and the new token's post-RoPE key and value;
`decode_step(token, pos, attend)` calls attend(layer, q, k, v) for the attention output, so
that the KV can live in memory (KVCache), in the drive, or be selected by a policy.  Rotary
embedding is llama.cpp's "normal" mode (rotated pairs of adjacent channels), the order the
GGUF converter wrote the query and key projections in.

numpy rather than torch or Numba, by measurement (`ssdemu bench forward`, 2K-token context,
this 2-core machine): a decode step reads every weight once (651 MB in float32), so it is bound
by memory bandwidth, and numpy's BLAS decoded at 55 ms a token where torch 2.13 on the CPU,
running the same weights the same way, took 103 ms (prefill: torch 0.84x numpy's time); a
Numba kernel cannot read the weights faster than BLAS does."""

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


CAUSAL_CHUNK = 256  # a prefill's queries attended this many at a time


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal_from: int | None = 0,
              with_lse: bool = False):
    """Softmax attention of queries (Tq, Hq, d) over keys and values (Tk, Hkv, d), GQA by
    head groups; causal_from: query i sees keys up to causal_from + i (None: all).  With
    with_lse, also each query head's log-sum-exp of its scaled logits (Tq, Hq), for merging
    with attention over other keys (hostlib.merge_attention).

    A long causal prefill goes CAUSAL_CHUNK queries at a time, each chunk over the keys it
    can see: the masked half of the score matrix is never computed, and a chunk's scores
    (heads x 256 x Tk) stay small where the whole matrix of a 4K-token prompt was 600 MB a
    layer, made, masked and exponentiated in memory (`ssdemu bench forward`: prefill)."""
    tq = q.shape[0]
    if causal_from is not None and tq > CAUSAL_CHUNK:
        parts = [_attention(q[i:i + CAUSAL_CHUNK], k[:causal_from + min(tq, i + CAUSAL_CHUNK)],
                            v[:causal_from + min(tq, i + CAUSAL_CHUNK)], causal_from + i,
                            with_lse) for i in range(0, tq, CAUSAL_CHUNK)]
        if not with_lse:
            return np.concatenate(parts)
        return (np.concatenate([o for o, _ in parts]),
                np.concatenate([x for _, x in parts]))
    return _attention(q, k, v, causal_from, with_lse)


def _attention(q, k, v, causal_from, with_lse):
    tq, hq, d = q.shape
    tk, hkv, _ = k.shape
    g = hq // hkv
    qg = q.reshape(tq, hkv, g, d).transpose(1, 2, 0, 3)  # (Hkv, g, Tq, d)
    kt = k.transpose(1, 2, 0)  # (Hkv, d, Tk)
    # a Python float: numpy's own float64 scalar would make every later product float64,
    # and each weight matrix then cast to float64 per call (7x slower decoding)
    s = (qg @ kt[:, None]) * float(d ** -0.5)  # (Hkv, g, Tq, Tk)
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

    def prefill(self, tokens, start: int = 0, cache: KVCache | None = None,
                last_only: bool = False, keep_queries: int = 0):
        """Logits (T, vocab) of a sequence (positions start..), its keys and values appended
        to cache (each layer's post-RoPE (T, kv_heads, head_dim)); last_only: the last
        token's alone, (1, vocab) (a 2K-token prompt's all are 400 MB and 2 s).
        keep_queries n: the last n tokens' post-RoPE queries per layer into
        self.last_queries ((n, heads, head_dim) each: what a predictive placement reads)."""
        self.last_queries = []
        tokens = np.asarray(tokens, np.int64)
        positions = np.arange(start, start + len(tokens))
        x = self.w.embed[tokens]
        for layer in range(self.cfg.layers):
            lw = self.w.layers[layer]
            h = rms_norm(x, lw.attn_norm, self.cfg.eps)
            q, k, v = self._qkv(layer, h, positions)
            if keep_queries:
                self.last_queries.append(q[-keep_queries:].copy())
            if cache is not None:
                cache.append(layer, k, v)
                k, v = cache.keys(layer), cache.values(layer)
            out = attention(q, k, v, causal_from=k.shape[0] - len(tokens))
            x = x + out.reshape(len(tokens), -1) @ lw.wo.T
            x = self._mlp(layer, x)
        return self.logits(x[-1:] if last_only else x)

    def decode_step(self, token: int, pos: int, attend) -> np.ndarray:
        """Logits (vocab,) of one token at position pos; attend(layer, q (heads, head_dim),
        k (kv_heads, head_dim), v) gives each layer's attention output (heads, head_dim)
        over every earlier token and this one."""
        x = self.w.embed[np.array([token])]
        for layer in range(self.cfg.layers):
            lw = self.w.layers[layer]
            h = rms_norm(x, lw.attn_norm, self.cfg.eps)
            q, k, v = self._qkv(layer, h, np.array([pos]))
            out = np.asarray(attend(layer, q[0], k[0], v[0]), np.float32)  # whoever served it
            x = x + out.reshape(1, -1) @ lw.wo.T
            x = self._mlp(layer, x)
        return self.logits(x)[0]


class KVCache:
    """The model alone holding its KV in memory: per layer, post-RoPE keys and values
    (tokens, kv_heads, head_dim) rounded to `dtype` (np.float16: as a drive stores plain
    fp16).  Kept as float32 holding those values exactly, in buffers that grow by doubling:
    a decode step appends one token per layer, and converting or copying the whole cache on
    each was most of a step's time at 2K tokens."""

    def __init__(self, cfg: LlamaConfig, dtype=np.float32):
        self.cfg, self.dtype = cfg, np.dtype(dtype)
        self._k = [np.zeros((0, cfg.kv_heads, cfg.head_dim), np.float32)
                   for _ in range(cfg.layers)]
        self._v = [a.copy() for a in self._k]
        self._n = [0] * cfg.layers

    def __len__(self) -> int:
        return self._n[0]

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        n, t = self._n[layer], k.shape[0]
        if n + t > self._k[layer].shape[0]:
            cap = max(64, 2 * (n + t))
            for bufs in (self._k, self._v):
                grown = np.empty((cap, *bufs[layer].shape[1:]), np.float32)
                grown[:n] = bufs[layer][:n]
                bufs[layer] = grown
        self._k[layer][n:n + t] = k.astype(self.dtype).astype(np.float32)
        self._v[layer][n:n + t] = v.astype(self.dtype).astype(np.float32)
        self._n[layer] = n + t

    @property
    def k(self) -> list[np.ndarray]:
        """Per layer the keys (tokens, kv_heads, head_dim), float32 (values of `dtype`)."""
        return [b[:n] for b, n in zip(self._k, self._n, strict=True)]

    @property
    def v(self) -> list[np.ndarray]:
        return [b[:n] for b, n in zip(self._v, self._n, strict=True)]

    def keys(self, layer: int) -> np.ndarray:
        return self._k[layer][:self._n[layer]]

    def values(self, layer: int) -> np.ndarray:
        return self._v[layer][:self._n[layer]]

    def attend(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """decode_step's attend: the new token's KV kept, attention over all of it."""
        self.append(layer, k[None], v[None])
        return attention(q[None], self.keys(layer), self.values(layer), None)[0]
