"""The model's KV in the drive: decode attends over what the drive holds.

Tokens' post-RoPE keys and values gather on the host until a block of `block_tokens` is
full; the block (tokens, 2, layers, kv_heads, head_dim) in fp16, the drive's layout, is then
stored quantized in the drive by `scheme` (plain, int8, int4, KIVI, fp8: the firmware's
schemes) with page summaries of `page_tokens`, under a key of the sequence.  Each decode
step's attention comes back through the drive, one way per run:

- dense: every stored block read and dequantized in the drive (KV_RETRIEVE_DEQUANTIZED),
  once per step, then attention over it and the host's tail on the host;
- host-select: the host keeps each stored block's page summaries (the per-channel min and
  max of its keys, per layer, KV head and page, made as the block is stored), picks pages
  by Quest's rule itself, and reads the blocks holding them back dequantized from the drive
  (whole blocks: the drive returns values whole; the timing model books the pages alone),
  then attends on the host;
- drive-select: per layer, TOPK_PAGES picks `budget_pages` pages per KV head by their
  summaries (rerank 1: Quest's rule; more: the drive's exact re-rank among that many
  candidates per page), ATTEND attends them with the sink and recent pages in the drive,
  and the host merges that with attention over its tail (hostlib.merge_attention): only
  queries, page ids and outputs cross the link.

Nothing bypasses the drive: the host keeps only the tokens of the block not yet full."""

from __future__ import annotations

import contextlib
import time

import numpy as np

import hostlib
from ssdemu.llm.forward import attention
from ssdemu.llm.gguf_model import LlamaConfig

MODES = ("dense", "host-select", "drive-select")


class DriveKV:
    def __init__(self, dev, cfg: LlamaConfig, *, mode: str = "dense", scheme: str = "plain",
                 block_tokens: int = 64, page_tokens: int = 16, budget_pages: int = 8,
                 rerank: int = 1, sink_pages: int = 1, recent_pages: int = 1, nsid: int = 0,
                 prefix: bytes = b"seq"):
        if mode not in MODES:
            raise ValueError(f"mode is one of {', '.join(MODES)}, not {mode!r}")
        if block_tokens % page_tokens:
            raise ValueError("a block holds whole pages: block_tokens % page_tokens == 0")
        self.dev, self.cfg, self.mode, self.scheme = dev, cfg, mode, scheme
        self.block_tokens, self.page_tokens = block_tokens, page_tokens
        self.budget_pages, self.rerank = budget_pages, rerank
        self.sink_pages, self.recent_pages = sink_pages, recent_pages
        self.nsid, self.prefix = nsid, prefix
        self.keys: list[bytes] = []  # the stored blocks' keys, in token order
        shape = (0, cfg.kv_heads, cfg.head_dim)
        self.tail_k = [np.zeros(shape, np.float16) for _ in range(cfg.layers)]
        self.tail_v = [np.zeros(shape, np.float16) for _ in range(cfg.layers)]
        self._step: list[tuple[np.ndarray, np.ndarray]] | None = None  # dense: this step's
        # drive-select: each layer's last choice (page ids (kv_heads, k), tokens stored then)
        self.last_ids: dict[int, tuple[np.ndarray, int]] = {}
        self.commands = {"store": 0, "retrieve": 0, "topk": 0, "attend": 0}
        self.drive_s = 0.0  # wall time in the drive's commands (sent and waited for)
        # host-select: per stored block, its summaries (layers, kv_heads, pages, head_dim) x 2,
        # and this step's blocks read back so far (index -> (tokens, 2, layers, heads, dim))
        self.summaries: list[tuple[np.ndarray, np.ndarray]] = []
        self._read: dict[int, np.ndarray] = {}

    @contextlib.contextmanager
    def _in_drive(self):
        """Time spent in the drive's commands (sent and waited for), into drive_s."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.drive_s += time.perf_counter() - t0

    def __len__(self) -> int:
        return len(self.keys) * self.block_tokens + self.tail_k[0].shape[0]

    # -- storing --
    def _key(self, i: int) -> bytes:
        return (self.prefix + b"/" + i.to_bytes(4, "big"))[-16:]

    def append(self, layer: int, k: np.ndarray, v: np.ndarray, store: bool = True) -> None:
        """Tokens' keys and values (T, kv_heads, head_dim) of one layer; a block is stored
        when every layer has filled it (store=False: not yet, the caller stores)."""
        self.tail_k[layer] = np.concatenate([self.tail_k[layer], k.astype(np.float16)])
        self.tail_v[layer] = np.concatenate([self.tail_v[layer], v.astype(np.float16)])
        if store and layer == self.cfg.layers - 1:
            self._store_full()

    def _store_full(self) -> None:
        while self.tail_k[0].shape[0] >= self.block_tokens:
            self._store_block()

    def _store_block(self) -> None:
        n = self.block_tokens
        k = np.stack([t[:n] for t in self.tail_k], axis=1)  # (tokens, layers, heads, dim)
        v = np.stack([t[:n] for t in self.tail_v], axis=1)
        block = np.ascontiguousarray(np.stack([k, v], axis=1)).view(np.uint16)
        key = self._key(len(self.keys))
        with self._in_drive():
            self.dev.kv_put_quantized(key, block, "fp16", self.scheme, nsid=self.nsid,
                                      summary_page=self.page_tokens)
        pages = k.astype(np.float32).reshape(n // self.page_tokens, self.page_tokens,
                                             *k.shape[1:])  # (pages, tokens, layers, h, d)
        self.summaries.append((pages.min(axis=1).transpose(1, 2, 0, 3),
                               pages.max(axis=1).transpose(1, 2, 0, 3)))
        self.commands["store"] += 1
        self.keys.append(key)
        for layer in range(self.cfg.layers):
            self.tail_k[layer] = self.tail_k[layer][n:]
            self.tail_v[layer] = self.tail_v[layer][n:]

    # -- decoding --
    def begin_step(self) -> None:
        """dense: every stored block, dequantized in the drive, for this step's layers."""
        self._step = None
        self._read = {}
        if self.mode != "dense" or not self.keys:
            return
        c = self.cfg
        shape = (self.block_tokens, 2, c.layers, c.kv_heads, c.head_dim)
        blocks = []
        for key in self.keys:
            out = np.empty(shape, np.uint16)
            with self._in_drive():
                self.dev.kv_get_dequantized(key, out, nsid=self.nsid)
            self.commands["retrieve"] += 1
            blocks.append(out.view(np.float16))
        kv = np.concatenate(blocks)  # (tokens, 2, layers, heads, dim)
        # one conversion a step, each layer's K and V then contiguous float32
        kv = np.ascontiguousarray(kv.transpose(2, 1, 3, 0, 4), dtype=np.float32)
        self._step = [(kv[layer, 0], kv[layer, 1]) for layer in range(c.layers)]

    def attend(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """decode_step's attend: the new token's KV joins the tail; attention over the
        drive's blocks and the tail, by this run's mode.  A block the step fills is stored
        after the last layer has attended: every layer of a step sees the blocks stored
        before it and the tail (before, the last layer's attention missed the block stored
        under it, in dense mode, where the step's blocks were read at its start)."""
        self.append(layer, k[None], v[None], store=False)
        out = self._attend(layer, q)
        if layer == self.cfg.layers - 1:
            self._store_full()
        return out

    def _attend(self, layer: int, q: np.ndarray) -> np.ndarray:
        tail_k = self.tail_k[layer].astype(np.float32)
        tail_v = self.tail_v[layer].astype(np.float32)
        if self.mode == "dense":
            if self._step is None:
                return attention(q[None], tail_k, tail_v, None)[0]
            sk, sv = self._step[layer]  # (heads, tokens, dim): one softmax with the tail's
            keys = np.concatenate([sk, tail_k.transpose(1, 0, 2)], axis=1).transpose(1, 0, 2)
            values = np.concatenate([sv, tail_v.transpose(1, 0, 2)], axis=1).transpose(1, 0, 2)
            return attention(q[None], keys, values, None)[0]
        if self.mode == "host-select":
            return self._host_select(layer, q, tail_k, tail_v)
        return self._drive_select(layer, q, tail_k, tail_v)

    def _block(self, i: int) -> np.ndarray:
        """Stored block i, dequantized in the drive, read once a step."""
        if i not in self._read:
            c = self.cfg
            out = np.empty((self.block_tokens, 2, c.layers, c.kv_heads, c.head_dim), np.uint16)
            with self._in_drive():
                self.dev.kv_get_dequantized(self.keys[i], out, nsid=self.nsid)
            self.commands["retrieve"] += 1
            self._read[i] = out.view(np.float16)
        return self._read[i]

    def _host_select(self, layer: int, q, tail_k, tail_v) -> np.ndarray:
        c, pt = self.cfg, self.page_tokens
        if not self.keys:
            return attention(q[None], tail_k, tail_v, None)[0]
        lo = np.concatenate([s[0][layer] for s in self.summaries], axis=1)  # (h, pages, d)
        hi = np.concatenate([s[1][layer] for s in self.summaries], axis=1)
        pages = lo.shape[1]
        per_block = self.block_tokens // pt
        first, last = self.sink_pages, pages - self.recent_pages
        k = max(1, min(self.budget_pages, last - first))
        out = np.empty_like(q, dtype=np.float32)
        chosen = np.full((c.kv_heads, k), -1, np.int32)
        for h in range(c.kv_heads):
            group = q[h * c.group:(h + 1) * c.group].astype(np.float32)
            bound = np.maximum(group[:, None] * lo[h][None], group[:, None] * hi[h][None])
            score = bound.sum(axis=-1).max(axis=0)[first:last]
            top = (np.argsort(-score, kind="stable")[:k] + first).tolist()
            chosen[h, :len(top)] = top
            keep = sorted({*top, *range(self.sink_pages), *range(last, pages)})
            ks = [self._block(p // per_block)[(p % per_block) * pt:(p % per_block + 1) * pt,
                                               :, layer, h] for p in keep]
            kk = np.concatenate([x[:, 0] for x in ks] + [tail_k[:, h].astype(np.float16)])
            vv = np.concatenate([x[:, 1] for x in ks] + [tail_v[:, h].astype(np.float16)])
            out[h * c.group:(h + 1) * c.group] = attention(
                group[None], kk[:, None].astype(np.float32), vv[:, None].astype(np.float32),
                None)[0]
        self.last_ids[layer] = (chosen, len(self.keys) * self.block_tokens)
        return out

    def _drive_select(self, layer: int, q, tail_k, tail_v) -> np.ndarray:
        parts = []
        if tail_k.shape[0]:
            out, lse = attention(q[None], tail_k, tail_v, None, with_lse=True)
            parts.append((out[0], lse[0]))
        if self.keys:
            c = self.cfg
            kw = dict(layer=layer, layers=c.layers, page_tokens=self.page_tokens,
                      sink_pages=self.sink_pages, recent_pages=self.recent_pages,
                      nsid=self.nsid)
            q32 = np.ascontiguousarray(q, np.float32)
            pages = len(self.keys) * self.block_tokens // self.page_tokens
            k = max(1, min(self.budget_pages, pages - self.sink_pages - self.recent_pages))
            with self._in_drive():
                ids, _ = self.dev.topk_pages(self.keys, q32, kv_heads=c.kv_heads, k=k,
                                             rerank=self.rerank, **kw)
                self.last_ids[layer] = (ids, len(self.keys) * self.block_tokens)
                out, lse = self.dev.attend(self.keys, q32, ids, **kw)
            self.commands["topk"] += 1
            self.commands["attend"] += 1
            parts.append((out, lse))
        return hostlib.merge_attention(parts)[0]

    def end(self) -> None:
        """The sequence's blocks deleted from the drive."""
        for key in self.keys:
            self.dev.kv_delete(key, nsid=self.nsid)
        self.keys = []

