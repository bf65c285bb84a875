"""Plain numpy references for firmware/retrieval.py: what the drive's kernels must equal.

Scores sum over channels in order, in float64 (as the kernels do), so that selections can be
compared bit for bit; attention is computed densely in float64 from its definition.
"""

from __future__ import annotations

import numpy as np


def page_bounds(keys: np.ndarray, page: int) -> tuple[np.ndarray, np.ndarray]:
    H, T, D = keys.shape
    P = -(-T // page)
    pad = P * page - T
    k = np.concatenate([keys, np.repeat(keys[:, -1:, :], pad, axis=1)], axis=1) if pad else keys
    k = k.reshape(H, P, page, D)
    return k.min(axis=2), k.max(axis=2)


def bounds_to_int8(mins, maxs):
    m = np.maximum(np.abs(mins), np.abs(maxs)).max(axis=2).astype(np.float32)
    scales = np.where(m > 0, m / np.float32(126.5), np.float32(1.0)).astype(np.float32)
    scales = np.where(scales == 0, np.float32(1e-45), scales).astype(np.float32)
    while np.any(np.float32(127) * scales < m):  # subnormal scales rounded down: next float up
        scales = np.where(np.float32(127) * scales < m,
                          np.nextafter(scales, np.float32(np.inf)), scales).astype(np.float32)
    s = scales[..., None]
    cmin = np.floor(mins / s)
    cmin = np.where(cmin.astype(np.float32) * s > mins, cmin - 1, cmin)
    cmax = np.ceil(maxs / s)
    cmax = np.where(cmax.astype(np.float32) * s < maxs, cmax + 1, cmax)
    return (np.clip(cmin, -128, 127).astype(np.int8), np.clip(cmax, -128, 127).astype(np.int8),
            scales)


def int8_to_bounds(cmin, cmax, scales):
    s = scales[..., None].astype(np.float32)
    return cmin.astype(np.float32) * s, cmax.astype(np.float32) * s


def quest_scores(queries, mins, maxs) -> np.ndarray:
    H, P, D = mins.shape
    group = queries.shape[0] // H
    q = queries.astype(np.float64).reshape(H, group, 1, D)
    lo = q * mins.astype(np.float64)[:, None]
    hi = q * maxs.astype(np.float64)[:, None]
    terms = np.maximum(lo, hi)
    s = np.zeros(terms.shape[:3])
    for d in range(D):  # in channel order, as the kernel sums
        s = s + terms[..., d]
    return s.max(axis=1).astype(np.float32)


def topk_pages(scores, k, sink_pages=0, recent_pages=0):
    """ids (H, k) with -1 past the candidates; ranked by score, ties to the lower page id."""
    H, P = scores.shape
    lo = min(sink_pages, P)
    hi = max(lo, P - recent_pages)
    ids = np.full((H, k), -1, np.int32)
    for h in range(H):
        cand = np.arange(lo, hi)
        order = np.lexsort((cand, -scores[h, lo:hi].astype(np.float64)))[:k]
        ids[h, :len(order)] = cand[order]
    return ids


def page_log_share(queries, keys, page, cand):
    """(H, P): per KV head, for each of its candidate pages (cand (H, c), -1: none), the
    largest over its query group of the log of the page's share of that query head's
    attention over all its candidates' tokens; -inf for pages that are not candidates."""
    H, T, D = keys.shape
    group = queries.shape[0] // H
    P = -(-T // page)
    out = np.full((H, P), -np.inf)
    for h in range(H):
        pages = sorted({int(p) for p in cand[h] if p >= 0})
        if not pages:
            continue
        logits = (queries[h * group:(h + 1) * group].astype(np.float64)
                  @ keys[h].astype(np.float64).T) / np.sqrt(D)
        lse = np.empty((len(pages), group))
        for j, p in enumerate(pages):
            x = logits[:, p * page:(p + 1) * page]
            m = x.max(axis=1, keepdims=True)
            lse[j] = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
        m = lse.max(axis=0)
        total = m + np.log(np.exp(lse - m).sum(axis=0))
        out[h, pages] = (lse - total).max(axis=1)
    return out


def attend(queries, keys, values, page, ids):
    """Dense softmax over the union of the listed pages' tokens: (out, lse) per query head."""
    H, T, D = keys.shape
    group = queries.shape[0] // H
    out = np.zeros((queries.shape[0], D))
    lse = np.full(queries.shape[0], -np.inf)
    for h in range(H):
        pages = sorted({int(p) for p in ids[h] if 0 <= p < -(-T // page)})
        if not pages:
            continue
        toks = np.concatenate([np.arange(p * page, min(T, (p + 1) * page)) for p in pages])
        k = keys[h, toks].astype(np.float64)
        v = values[h, toks].astype(np.float64)
        for g in range(group):
            j = h * group + g
            x = k @ queries[j].astype(np.float64) / np.sqrt(D)
            m = x.max()
            w = np.exp(x - m)
            out[j] = w @ v / w.sum()
            lse[j] = m + np.log(w.sum())
    return out, lse


def merge(o1, l1, o2, l2):
    """Flash-attention's merge of two partial attentions over disjoint key sets."""
    lse = np.logaddexp(l1, l2)
    return (np.exp(l1 - lse)[:, None] * o1 + np.exp(l2 - lse)[:, None] * o2), lse


def channel_spread(mins, maxs):
    """(H, D): per KV head and channel the mean over pages of max - min (float64 sum over
    pages in order, then float32)."""
    H, P, D = mins.shape
    s = np.zeros((H, D))
    for p in range(P):
        s = s + (maxs[:, p].astype(np.float64) - mins[:, p].astype(np.float64))
    return (s / P).astype(np.float32)


def selected_channels(q, spread_row, r):
    """The r channels of largest |q_c| / spread_c (zero spread: inf, or 0 for q_c = 0;
    ties to the lower channel), ascending."""
    a = np.abs(q.astype(np.float64))
    s = spread_row.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(s > 0, a / np.where(s > 0, s, 1), np.where(a > 0, np.inf, 0.0))
    with np.errstate(over="ignore"):  # as the kernel: past float32, inf
        w = w.astype(np.float32).astype(np.float64)
    order = np.lexsort((np.arange(len(q)), -w))[:r]
    return np.sort(order)


def selective_scores(queries, mins, maxs, spread, r):
    H, P, D = mins.shape
    group = queries.shape[0] // H
    out = np.full((H, P), -np.inf, np.float32)
    for h in range(H):
        for g in range(group):
            q = queries[h * group + g]
            c = selected_channels(q, spread[h], r)
            qq = q[c].astype(np.float64)
            terms = np.maximum(qq * mins[h][:, c].astype(np.float64),
                               qq * maxs[h][:, c].astype(np.float64))
            s = np.zeros(P)
            for j in range(len(c)):  # in channel order, as the kernel sums
                s = s + terms[:, j]
            out[h] = np.maximum(out[h], s.astype(np.float32))
    return out


def rerank_candidates(bound_scores, select_scores, c, sink_pages=0, recent_pages=0):
    """c - c // 2 best by bound, then the best by the selective score not yet taken."""
    a = topk_pages(bound_scores, c, sink_pages, recent_pages)
    b = topk_pages(select_scores, c, sink_pages, recent_pages)
    H = a.shape[0]
    out = np.full((H, c), -1, np.int32)
    for h in range(H):
        row = [int(p) for p in a[h, :c - c // 2] if p >= 0]
        for p in b[h]:
            if len(row) == c or p < 0:
                break
            if int(p) not in row:
                row.append(int(p))
        out[h, :len(row)] = row
    return out
