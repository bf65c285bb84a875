"""Retrieval inside the drive (TOPK_PAGES, ATTEND: c/wire/sde_queue.h); a mixin of
hostlib.Device (each command defined once, as X_async: hostlib/commands.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hostlib.commands import command
from hostlib.staging import Staging, copy_bytes
from ssdemu_wire.layout import OPCODES

if TYPE_CHECKING:
    from hostlib.client import Future, QueuePair


class RetrievalCommands(Staging):
    def _retrieval(self, opcode: int, what: str, payload: np.ndarray, out: np.ndarray,
                   parse, qp: QueuePair | None, nsid: int) -> Future:
        """The request and the result in one share of the bounce buffer (one command, one
        share), or in a registered buffer of their own when they do not fit it."""
        qp = qp or self.qp
        n_in = -(-payload.nbytes // 64) * 64  # the result starts 64-byte aligned
        total = n_in + out.nbytes
        tmp = None
        if total <= qp.bounce.nbytes:
            off, share = qp.bounce_take(total)
            handle, bounced = qp.bounce_handle, True
        else:
            share, tmp = self._staging_take(total)
            handle, off, bounced = tmp, 0, False
        share[:payload.nbytes] = payload
        result = share[n_in:n_in + out.nbytes]

        def after(pages):
            copy_bytes(out.reshape(-1).view(np.uint8), result)
            return parse(pages)

        release = None if tmp is None else (lambda: self._staging_give(tmp))
        return self.submit(opcode, what, qp=qp, bounce=bounced, after=after, release=release,
                           nsid=nsid,
                           buf=handle, buf_offset=off, length=payload.nbytes,
                           param0=(handle << 40) | (off + n_in), param1=out.nbytes)

    @command(finish=lambda r, _a: r[:2])
    def topk_pages_async(self, keys, queries: np.ndarray, *, layer: int, layers: int,
                         kv_heads: int, k: int, dtype: str = "fp16", page_tokens: int = 16,
                         sink_pages: int = 1, recent_pages: int = 1, rerank: int = 1,
                         int8: bool = False, qp: QueuePair | None = None,
                         nsid: int = 0) -> Future:
        """The drive scores every page of the sequence stored under `keys` (its blocks, in
        order; plain blocks of `layers` x `kv_heads` x head_dim in `dtype`, or quantized ones)
        against one layer's queries (q_heads x head_dim, float32) and keeps the k best pages
        per KV head, never the sink or recent pages (the caller always has those): rerank > 1
        re-ranks rerank x k candidates (half by the bound, half by a channel-selective score)
        by their exact share of each query head's attention.  The Future's result: (page
        ids (kv_heads, k) int32, -1 past the candidates; their scores), and the pages
        (topk_pages: the ids and scores)."""
        from ssdemu_wire.codes import dtype_code
        from ssdemu_wire.layout import pack_retrieval_request

        q = np.ascontiguousarray(queries, np.float32)
        payload = pack_retrieval_request(
            dtype_code=dtype_code(dtype), layer=layer, layers=layers, kv_heads=kv_heads,
            q_heads=q.shape[0], head_dim=q.shape[1], page_tokens=page_tokens, keys=keys, k=k,
            sink_pages=sink_pages, recent_pages=recent_pages, rerank=rerank, int8=int8,
            queries=q)
        out = np.zeros(kv_heads * k * 2, np.int32)

        def parse(pages):
            ids = out[:kv_heads * k].reshape(kv_heads, k).copy()
            scores = out[kv_heads * k:].view(np.float32).reshape(kv_heads, k).copy()
            return ids, scores, int(pages)

        return self._retrieval(OPCODES["TOPK_PAGES"], "topk pages", payload, out, parse, qp,
                               nsid)

    @command()
    def attend_async(self, keys, queries: np.ndarray, page_ids: np.ndarray, *, layer: int,
                     layers: int, dtype: str = "fp16", page_tokens: int = 16,
                     sink_pages: int = 1, recent_pages: int = 1, qp: QueuePair | None = None,
                     nsid: int = 0) -> Future:
        """Softmax attention of one layer's queries over the given pages of each KV head
        (page_ids (kv_heads, n) int32, -1: none) and the sink and recent pages, inside the
        drive: only queries, ids and outputs cross the link.  The Future's result: (outputs
        (q_heads, head_dim) float32, log-sum-exp per query head), for the host to merge with
        attention over tokens it holds (hostlib.merge_attention)."""
        from ssdemu_wire.codes import dtype_code
        from ssdemu_wire.layout import pack_retrieval_request

        q = np.ascontiguousarray(queries, np.float32)
        ids = np.ascontiguousarray(page_ids, np.int32)
        if ids.ndim != 2:
            raise ValueError("page_ids is (kv_heads, n)")
        payload = pack_retrieval_request(
            dtype_code=dtype_code(dtype), layer=layer, layers=layers, kv_heads=ids.shape[0],
            q_heads=q.shape[0], head_dim=q.shape[1], page_tokens=page_tokens, keys=keys,
            k=ids.shape[1], sink_pages=sink_pages, recent_pages=recent_pages, queries=q,
            page_ids=ids)
        qh, d = q.shape
        out = np.zeros(qh * (d + 1), np.float32)

        def parse(_pages):
            return out[:qh * d].reshape(qh, d).copy(), out[qh * d:].copy()

        return self._retrieval(OPCODES["ATTEND"], "attend", payload, out, parse, qp, nsid)
