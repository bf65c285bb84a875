"""Query-aware retrieval inside the drive: page summaries, Quest's page score, top-k page
selection, an exact re-rank, and softmax attention over chosen pages.

Everything here works on one layer of one sequence, per KV head, in float32:
- keys, values: (kv_heads, tokens, head_dim); a page is `page` consecutive tokens (the last
  one may be short);
- queries: (q_heads, head_dim) with q_heads = kv_heads x group (GQA): query head j reads KV
  head j // group, as in Llama-style grouped-query attention;
- summaries (Quest, Tang et al., ICML 2024, github mit-han-lab/Quest): per page, per KV head,
  per channel the min and max of the keys, as float32 or as int8 codes with a scale per page
  and head, rounded outwards (min down, max up) so that the decoded bounds still contain every
  key: the score stays an upper bound.  Made a block at a time as (kv_heads, pages, head_dim);
  scored channel-major, (kv_heads, head_dim, pages): a channel's bounds over every page are
  contiguous, so the pages are a score's vector lanes.

A page's Quest score for query q is sum_c max(q_c min_c, q_c max_c) >= q.k for every key k of
the page.  A KV head's score of a page is the largest over its query group (a page one query
head of the group needs is needed).  Sums run in float64 over channels in order (products of
two float32 are exact in float64), so the scores, and the pages chosen, are the same bits as
the numpy reference that sums in the same order (tests/retrieval_ref.py).

The re-rank's candidates come half from Quest's bound and half from a channel-selective
score (Quest's sum over the channels where the query weighs most against the keys' usual
page range; `selective_scores`): a bound alone lets outlier channels hide a page that holds
one key turned towards the query.

Selection is by score, ties to the lower page id; `sink_pages` first and `recent_pages` last
pages are never candidates (the caller always keeps them: attention sinks and the window of
recent tokens, as Quest keeps the current page).

Inputs are trusted to be finite and shaped as documented: the drive's command layer checks
them before a kernel runs (no kernel raises; nothing raised can cross a C callback).
"""

import numpy as np
from numba import njit

from firmware.bits import f32_as_u32, fp16_bits_as_f32, u32_as_f32
from firmware.fastexp import exp_nonpositive
from firmware.prefetch import prefetch_range

# int8 summaries: the scale leaves room so that the largest bound still fits after rounding
# outwards (|bound| / scale <= 126.5, +1 for the rounding, < 127)
INT8_SPAN = np.float32(126.5)


@njit(cache=True, nogil=True, error_model="numpy")
def pages_of(tokens, page):
    return (tokens + page - 1) // page


@njit(cache=True, nogil=True, error_model="numpy")
def page_bounds(keys, page, mins, maxs):
    """Per page per KV head per channel min and max of keys (H, T, D) into mins, maxs
    (H, pages, D)."""
    H, T, D = keys.shape
    for h in range(H):
        for p in range(pages_of(T, page)):
            t0 = p * page
            t1 = min(T, t0 + page)
            for d in range(D):
                mins[h, p, d] = keys[h, t0, d]
                maxs[h, p, d] = keys[h, t0, d]
            for t in range(t0 + 1, t1):
                for d in range(D):
                    v = keys[h, t, d]
                    if v < mins[h, p, d]:
                        mins[h, p, d] = v
                    if v > maxs[h, p, d]:
                        maxs[h, p, d] = v


@njit(cache=True, nogil=True, error_model="numpy")
def bounds_to_int8(mins, maxs, cmin, cmax, scales):
    """float32 bounds (H, P, D) -> int8 codes (H, P, D) and a float32 scale per (H, P), so
    that float32(cmin) * scale <= min and float32(cmax) * scale >= max exactly."""
    H, P, D = mins.shape
    for h in range(H):
        for p in range(P):
            m = np.float32(0.0)
            for d in range(D):
                m = max(m, abs(mins[h, p, d]), abs(maxs[h, p, d]))
            s = m / INT8_SPAN if m > 0 else np.float32(1.0)
            if s == 0:  # subnormal bounds: the smallest scale that still covers them
                s = np.float32(1e-45)
            # among subnormals the scale has few digits and m / 126.5 can round far down
            # (m = 182 units of 1e-45: s = 1 unit, and 127 s < m); the next floats up until
            # 127 s covers m, so that no code below needs clamping (a clamp narrows a bound)
            while np.float32(127.0) * s < m:
                s = u32_as_f32(f32_as_u32(s) + np.uint32(1))
            scales[h, p] = s
            for d in range(D):
                c = np.floor(mins[h, p, d] / s)
                if np.float32(c) * s > mins[h, p, d]:
                    c -= 1
                cmin[h, p, d] = np.int8(max(c, np.float32(-128.0)))
                c = np.ceil(maxs[h, p, d] / s)
                if np.float32(c) * s < maxs[h, p, d]:
                    c += 1
                cmax[h, p, d] = np.int8(min(c, np.float32(127.0)))


@njit(cache=True, nogil=True, error_model="numpy")
def int8_to_bounds(cmin, cmax, scales, mins, maxs):
    H, P, D = cmin.shape
    for h in range(H):
        for p in range(P):
            s = scales[h, p]
            for d in range(D):
                mins[h, p, d] = np.float32(cmin[h, p, d]) * s
                maxs[h, p, d] = np.float32(cmax[h, p, d]) * s


@njit(cache=True, nogil=True, error_model="numpy")
def quest_scores(queries, mins, maxs, scores):
    """scores (H, P) float32: per KV head, the largest over its query group of
    sum_c max(q_c min_c, q_c max_c); mins, maxs channel-major (H, D, P)."""
    H, D, P = mins.shape
    group = queries.shape[0] // H
    qd = np.empty(D, np.float64)
    acc = np.empty(P, np.float64)
    for h in range(H):
        for p in range(P):
            scores[h, p] = -np.inf
        for g in range(group):
            for d in range(D):
                qd[d] = np.float64(queries[h * group + g, d])
            _bound_rows(qd, mins[h], maxs[h], acc, scores[h])


# the channel-selective score keeps a quarter of the channels (SELECT_DIVISOR: 32 of 128)
SELECT_DIVISOR = 4


@njit(cache=True, nogil=True, error_model="numpy")
def select_channels(head_dim):
    return max(1, head_dim // SELECT_DIVISOR)


@njit(cache=True, nogil=True, error_model="numpy")
def channel_range_sums(mins, maxs, acc):
    """acc (H, D) float64 += per KV head and channel the sum of max - min over the pages
    (mins, maxs channel-major (H, D, P)), in order: a sequence's pages a block at a time add
    up to the same bits as all at once."""
    H, D, P = mins.shape
    for h in range(H):
        for d in range(D):
            s = acc[h, d]
            for p in range(P):
                s += np.float64(maxs[h, d, p]) - np.float64(mins[h, d, p])
            acc[h, d] = s


@njit(cache=True, nogil=True, error_model="numpy")
def spread_of_sums(acc, pages, spread):
    """spread (H, D) float32 from channel_range_sums's acc over `pages` pages: the mean."""
    H, D = acc.shape
    for h in range(H):
        for d in range(D):
            spread[h, d] = np.float32(acc[h, d] / pages) if pages > 0 else np.float32(0.0)


@njit(cache=True, nogil=True, error_model="numpy")
def channel_spread(mins, maxs, spread):
    """spread (H, D) float32: per KV head and channel the mean over pages of max - min (in
    float64, pages in order; mins, maxs channel-major (H, D, P)): how wide a page's range in
    that channel usually is."""
    H, D, P = mins.shape
    acc = np.zeros((H, D), np.float64)
    channel_range_sums(mins, maxs, acc)
    spread_of_sums(acc, P, spread)


@njit(cache=True, nogil=True, error_model="numpy")
def _channel_order(q, spread_row, r, chosen):
    """The r channels with the largest |q_c| / spread_c (a zero spread: infinite if q_c is
    not 0), ties to the lower channel, into chosen in ascending channel order."""
    D = q.shape[0]
    w = np.empty(D, np.float32)
    ids = np.arange(D)
    for d in range(D):
        a = abs(np.float64(q[d]))
        s = np.float64(spread_row[d])
        w[d] = np.float32(a / s) if s > 0 else (np.float32(np.inf) if a > 0 else 0.0)
    top = np.empty(r, np.int64)
    ws = np.empty(r, np.float32)
    select_top(w, ids, D, r, top, ws)
    chosen[:] = np.sort(top)


@njit(cache=True, nogil=True, error_model="numpy")
def selective_scores(queries, mins, maxs, spread, r, scores, bound):
    """scores (H, P): per KV head the largest over its query group of Quest's sum restricted
    to the r channels where the query weighs most against the keys' usual page range
    (|q_c| / spread_c); bound (H, P): Quest's score (quest_scores's, the same bits), from the
    same pass over the summaries (channel-major (H, D, P)).  The selective score is not an
    upper bound: it ranks the re-rank's candidates.  A channel whose keys range widely in
    every page (an outlier channel: 10x the others' magnitude in KIVI's and KVQuant's keys)
    adds about as much to every page's bound and buries a page that holds one key turned
    towards the query; the channels kept are where such a key stands out of its page's range
    (SparQ Attention, Ribar et al. 2024, scores on the query's largest components; here
    weighed by the keys' spread, which the summaries give)."""
    H, D, P = mins.shape
    group = queries.shape[0] // H
    chosen = np.empty(r, np.int64)
    qd = np.empty(D, np.float64)
    acc = np.empty(P, np.float64)
    for h in range(H):
        for p in range(P):
            scores[h, p] = -np.inf
            bound[h, p] = -np.inf
        for g in range(group):
            q = queries[h * group + g]
            _channel_order(q, spread[h], r, chosen)
            for d in range(D):
                qd[d] = np.float64(q[d])
            _bound_rows(qd, mins[h], maxs[h], acc, bound[h])
            for p in range(P):  # the kept channels, ascending: Quest's sum restricted
                acc[p] = 0.0
            for j in range(r):
                _add_channel(qd[chosen[j]], mins[h, chosen[j]], maxs[h, chosen[j]], acc)
            for p in range(P):
                if np.float32(acc[p]) > scores[h, p]:
                    scores[h, p] = np.float32(acc[p])


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _add_channel(x, lo, hi, acc):
    """acc[p] += max(x lo[p], x hi[p]) over the pages: one channel's term of every page's
    sum (each page's sum still runs over its channels in order)."""
    for p in range(acc.shape[0]):
        a = x * np.float64(lo[p])
        b = x * np.float64(hi[p])
        acc[p] += a if a > b else b


@njit(cache=True, nogil=True, error_model="numpy")
def _bound_rows(qd, mins, maxs, acc, best):
    """best[p] = max(best[p], Quest's sum of query qd (float64) over page p), mins and maxs
    (D, P) a head's channel-major summaries, acc (P,) float64 scratch.  A channel at a time
    over every page: each page's sum runs over its channels in order (quest_scores's bits,
    the reference's), and the pages are the vector lanes (measured at 4K tokens: the
    selective score 183 -> 61 us against a page at a time over (P, D) rows)."""
    for p in range(acc.shape[0]):
        acc[p] = 0.0
    for d in range(mins.shape[0]):
        _add_channel(qd[d], mins[d], maxs[d], acc)
    for p in range(acc.shape[0]):
        best[p] = max(best[p], np.float32(acc[p]))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _better(sa, ia, sb, ib):
    """Is (score a, page a) ranked before (score b, page b)?"""
    return sa > sb or (sa == sb and ia < ib)


@njit(cache=True, nogil=True, error_model="numpy")
def _sift_down(hs, hi, n, i):
    # a heap whose root is the worst kept entry
    while True:
        w = i
        left = 2 * i + 1
        right = left + 1
        if left < n and _better(hs[w], hi[w], hs[left], hi[left]):
            w = left
        if right < n and _better(hs[w], hi[w], hs[right], hi[right]):
            w = right
        if w == i:
            return
        hs[i], hs[w] = hs[w], hs[i]
        hi[i], hi[w] = hi[w], hi[i]
        i = w


# select_top keeps its best in order by insertion up to this many, else in a heap.  Measured
# on fresh scores each call (a repeated input trains the branch predictor and hides the
# heap's cost): the 124 best of 254 (a 4K-token re-rank's candidates) 11.7 us by the heap,
# 8.1 by insertion; 31 of 16,384 25.2 against 18.0; but 256 of 16,384 105 against 118, and
# 1,024 of 4,096 200 against 580 (each insertion moves up to k entries)
INSERT_MAX = 128


@njit(cache=True, nogil=True, error_model="numpy")
def select_top(scores, ids, n, k, out_ids, out_scores):
    """The k best of n (score, id) pairs, best first, into out_ids / out_scores; ranks by
    score, ties to the lower id.  Returns how many (min(n, k))."""
    kk = min(n, k)
    if kk <= 0:
        return 0
    if kk <= INSERT_MAX:
        _select_by_insertion(scores, ids, n, kk, out_ids, out_scores)
    else:
        _select_by_heap(scores, ids, n, kk, out_ids, out_scores)
    return kk


@njit(cache=True, nogil=True, error_model="numpy")
def _select_by_insertion(scores, ids, n, kk, out_ids, out_scores):
    """select_top's kk best kept in order in the output as they come: a pair better than
    the worst kept moves the worse ones down one place and the last falls off."""
    m = 0
    for i in range(n):
        s = scores[i]
        d = ids[i]
        if m == kk:
            if not _better(s, d, out_scores[m - 1], out_ids[m - 1]):
                continue
            j = m - 1
        else:
            j = m
            m += 1
        while j > 0 and _better(s, d, out_scores[j - 1], out_ids[j - 1]):
            out_scores[j] = out_scores[j - 1]
            out_ids[j] = out_ids[j - 1]
            j -= 1
        out_scores[j] = s
        out_ids[j] = d


@njit(cache=True, nogil=True, error_model="numpy")
def _select_by_heap(scores, ids, n, kk, out_ids, out_scores):
    """select_top's kk best by a heap of kk: n log kk."""
    hs = np.empty(kk, np.float32)
    hi = np.empty(kk, np.int64)
    for i in range(kk):
        hs[i] = scores[i]
        hi[i] = ids[i]
    for i in range(kk // 2 - 1, -1, -1):
        _sift_down(hs, hi, kk, i)
    for i in range(kk, n):
        if _better(scores[i], ids[i], hs[0], hi[0]):
            hs[0] = scores[i]
            hi[0] = ids[i]
            _sift_down(hs, hi, kk, 0)
    # pop worst first into the back of the output
    m = kk
    while m > 0:
        out_scores[m - 1] = hs[0]
        out_ids[m - 1] = hi[0]
        m -= 1
        hs[0] = hs[m]
        hi[0] = hi[m]
        _sift_down(hs, hi, m, 0)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _emit(chosen, got, out_ids, out_scores):
    """One head's row: the chosen ids, then -1 (score -inf) past them."""
    for i in range(got):
        out_ids[i] = chosen[i]
    for i in range(got, out_ids.shape[0]):
        out_ids[i] = -1
        out_scores[i] = -np.inf


@njit(cache=True, nogil=True, error_model="numpy")
def topk_pages(scores, k, sink_pages, recent_pages, out_ids, out_scores):
    """Per KV head the k best pages by score among those neither sinks nor recent, into
    out_ids (H, k) int32 and out_scores (H, k); slots past the candidates hold id -1.
    Returns the number chosen per head."""
    H, P = scores.shape
    lo = min(sink_pages, P)
    hi_ = max(lo, P - recent_pages)
    n = hi_ - lo
    ids = np.arange(lo, hi_)
    got = 0
    tmp_ids = np.empty(k, np.int64)
    for h in range(H):
        got = select_top(scores[h, lo:hi_], ids, n, k, tmp_ids, out_scores[h])
        _emit(tmp_ids, got, out_ids[h], out_scores[h])
    return got


@njit(cache=True, nogil=True, error_model="numpy")
def rerank_candidates(bound_scores, select_scores, c, sink_pages, recent_pages, out_ids):
    """The re-rank's c candidates per KV head (out_ids (H, c), -1 past them): the c - c // 2
    best pages by Quest's bound, then the best by the channel-selective score that are not
    among them, until c.  Both rankings as topk_pages's (ties to the lower page id)."""
    H, P = bound_scores.shape
    nb = c - c // 2  # only these of the bound's ranking are used: ranked no further
    a_ids = np.empty((H, nb), np.int32)
    a_sc = np.empty((H, nb), np.float32)
    b_ids = np.empty((H, c), np.int32)
    b_sc = np.empty((H, c), np.float32)
    topk_pages(bound_scores, nb, sink_pages, recent_pages, a_ids, a_sc)
    topk_pages(select_scores, c, sink_pages, recent_pages, b_ids, b_sc)
    seen = np.zeros(P, np.bool_)
    for h in range(H):
        seen[:] = False
        n = 0
        for j in range(nb):
            p = a_ids[h, j]
            if p < 0:
                break
            seen[p] = True
            out_ids[h, n] = p
            n += 1
        for j in range(c):
            if n == c:
                break
            p = b_ids[h, j]
            if p < 0:
                break
            if not seen[p]:
                seen[p] = True
                out_ids[h, n] = p
                n += 1
        for j in range(n, c):
            out_ids[h, j] = -1


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _f32(x, bf16):
    """An element of keys or values as float32: a float32 as it is; a uint16, the bits of an
    fp16 (bf16 False) or of a bf16 (True)."""
    if bf16:
        return u32_as_f32(np.uint32(x) << np.uint32(16))
    return fp16_bits_as_f32(x)


TOKENS_AT_ONCE = 4  # _group_logits's tokens a pass (its loop is written for 4): its rows' length


# the dot products may be summed in any order (LLVM then sums them lane by lane): the re-rank
# and attention are compared with their references to rounding, unlike Quest's score
@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def _group_logits(qs, keys, h, t0, t1, scale, bf16, rows, out):
    """out[g, t - t0] = qs[g] . keys[h, t] * scale for t in [t0, t1), every query g of the
    group (qs (group, D) float64): each key row converted once (into rows (TOKENS_AT_ONCE, D),
    float64) for the whole group, and TOKENS_AT_ONCE tokens' sums of a query run side by side
    (one sum at a time waited on its own additions and horizontal sum: 183 against 166 us a
    4K-token re-rank's logits, measured)."""
    group, D = qs.shape
    t = t0
    while t + TOKENS_AT_ONCE <= t1:
        for d in range(D):
            rows[0, d] = np.float64(_f32(keys[h, t, d], bf16))
            rows[1, d] = np.float64(_f32(keys[h, t + 1, d], bf16))
            rows[2, d] = np.float64(_f32(keys[h, t + 2, d], bf16))
            rows[3, d] = np.float64(_f32(keys[h, t + 3, d], bf16))
        for g in range(group):
            s0 = 0.0
            s1 = 0.0
            s2 = 0.0
            s3 = 0.0
            for d in range(D):
                q = qs[g, d]
                s0 += q * rows[0, d]
                s1 += q * rows[1, d]
                s2 += q * rows[2, d]
                s3 += q * rows[3, d]
            out[g, t - t0] = s0 * scale
            out[g, t + 1 - t0] = s1 * scale
            out[g, t + 2 - t0] = s2 * scale
            out[g, t + 3 - t0] = s3 * scale
        t += TOKENS_AT_ONCE
    while t < t1:  # a page's last tokens, fewer than TOKENS_AT_ONCE
        for d in range(D):
            rows[0, d] = np.float64(_f32(keys[h, t, d], bf16))
        for g in range(group):
            s0 = 0.0
            for d in range(D):
                s0 += qs[g, d] * rows[0, d]
            out[g, t - t0] = s0 * scale
        t += 1


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def _page_lse(logits, n, out):
    """out[g] = log sum_t e**logits[g, t] over a page's n tokens, for each query g: every
    query's max first, then each one's sum of exponentials (vectorized,
    firmware/fastexp.py, summed in any order) and its log."""
    G = logits.shape[0]
    for g in range(G):
        m = logits[g, 0]
        for t in range(1, n):
            m = max(m, logits[g, t])
        out[g] = m
    for g in range(G):
        m = out[g]
        acc = 0.0
        for t in range(n):
            acc += exp_nonpositive(logits[g, t] - m)
        out[g] = m + np.log(acc)


# pages hinted ahead of the one worked on (measured at 4K tokens, a layer out of the caches:
# the re-rank 424 us without, 404 one page ahead, 390 two, 391 four)
AHEAD = 2


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _prefetch_page(x, h, ids, j, page):
    """Page ids[h, j]'s rows of KV head h in x (H, T, D), C-contiguous, on their way to the
    caches (firmware/prefetch.py) while the page before it is worked on; nothing past the
    list's end or for an id that is none."""
    H, T, D = x.shape
    if j < ids.shape[1]:
        pid = ids[h, j]
        if pid >= 0 and pid * page < T:
            t0 = pid * page
            prefetch_range(x, (h * T + t0) * D, (min(T, t0 + page) - t0) * D)


@njit(cache=True, nogil=True, error_model="numpy")
def _group_queries(queries, h, group):
    """KV head h's query group as float64 (group, D): converted once per command."""
    D = queries.shape[1]
    qs = np.empty((group, D), np.float64)
    for g in range(group):
        for d in range(D):
            qs[g, d] = np.float64(queries[h * group + g, d])
    return qs


@njit(cache=True, nogil=True, error_model="numpy")
def rerank_pages(queries, keys, page, cand_ids, k, out_ids, out_scores, bf16=False):
    """The second stage: for each KV head, re-rank its candidate pages (cand_ids (H, c), -1
    for none) by the exact attention they hold, and keep the k best (ties to the lower page
    id).  A page's score is the largest over the query group of the log of its share of
    that query head's attention over all the candidates: logsumexp over the page's tokens of
    q.k / sqrt(head_dim), less the same over every candidate's tokens.  A share, not a raw
    mass: each query head's softmax has its own normalizer, so a head with larger logits
    would otherwise outrank a page that holds most of another head's attention.  Returns the
    number kept per head.  keys: float32, or uint16 carrying fp16 (bf16 False) or bf16 bits:
    a sequence's layer as stored, read in place."""
    H, T, D = keys.shape
    group = queries.shape[0] // H
    c = cand_ids.shape[1]
    scale = 1.0 / np.sqrt(np.float64(D))
    logits = np.empty((group, page), np.float64)
    rows = np.empty((TOKENS_AT_ONCE, D), np.float64)
    lse = np.empty((c, group), np.float64)
    total = np.empty(group, np.float64)
    cs = np.empty(c, np.float32)
    ci = np.empty(c, np.int64)
    tmp = np.empty(k, np.int64)
    got = 0
    for h in range(H):
        n = 0
        qs = _group_queries(queries, h, group)
        for j in range(AHEAD):
            _prefetch_page(keys, h, cand_ids, j, page)
        for j in range(c):
            pid = cand_ids[h, j]
            if pid < 0:
                continue
            _prefetch_page(keys, h, cand_ids, j + AHEAD, page)
            t0 = pid * page
            t1 = min(T, t0 + page)
            _group_logits(qs, keys, h, t0, t1, scale, bf16, rows, logits)
            _page_lse(logits, t1 - t0, lse[n])
            ci[n] = pid
            n += 1
        for g in range(group):  # each query head's log-sum-exp over every candidate
            m = -np.inf
            for j in range(n):
                m = max(m, lse[j, g])
            acc = 0.0
            for j in range(n):
                acc += np.exp(lse[j, g] - m)
            total[g] = m + np.log(acc) if n else 0.0
        for j in range(n):
            best = -np.inf
            for g in range(group):
                best = max(best, lse[j, g] - total[g])
            cs[j] = np.float32(best)
        got = select_top(cs, ci, n, k, tmp, out_scores[h])
        _emit(tmp, got, out_ids[h], out_scores[h])
    return got


@njit(cache=True, nogil=True, error_model="numpy")
def _value_rows(values, h, t0, t1, bf16, out):
    """A page's value rows of KV head h as float64 (out[t - t0]): once for the group."""
    for t in range(t0, t1):
        for d in range(values.shape[2]):
            out[t - t0, d] = np.float64(_f32(values[h, t, d], bf16))


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def _softmax_page(x, n, vrows, m, den, acc, g, w):
    """Query g's running softmax (max m[g], denominator den[g], weighted sum acc[g]) over a
    page's n logits x and value rows: rescaled once when the page raises the max."""
    mp = x[0]
    for t in range(1, n):
        mp = max(mp, x[t])
    if mp > m[g]:
        r = exp_nonpositive(m[g] - mp)
        den[g] *= r
        for d in range(acc.shape[1]):
            acc[g, d] *= r
        m[g] = mp
    mg = m[g]
    s = 0.0
    for t in range(n):
        w[t] = exp_nonpositive(x[t] - mg)
        s += w[t]
    den[g] += s
    for t in range(n):
        wt = w[t]
        for d in range(acc.shape[1]):
            acc[g, d] += wt * vrows[t, d]


@njit(cache=True, nogil=True, error_model="numpy")
def attend_pages(queries, keys, values, page, ids, out, lse, bf16=False):
    """Exact softmax attention of each query head over the pages ids (H, n) of its KV head
    (-1: no page; a page listed twice counts once), scaled by 1 / sqrt(head_dim): the output
    vectors into out (q_heads, D) and the natural log-sum-exp of the scaled logits into lse
    (q_heads), so that the host can merge this with attention over other tokens (o = sum_i
    e^(lse_i - lse) o_i, lse = log sum_i e^lse_i, as flash-attention merges blocks).  A head
    with no page gets a zero output and lse = -inf.  keys and values as rerank_pages's."""
    H, T, D = keys.shape
    group = queries.shape[0] // H
    n = ids.shape[1]
    scale = 1.0 / np.sqrt(np.float64(D))
    logits = np.empty((group, page), np.float64)
    rows = np.empty((TOKENS_AT_ONCE, D), np.float64)
    vrows = np.empty((page, D), np.float64)
    w = np.empty(page, np.float64)
    acc = np.empty((group, D), np.float64)
    m = np.empty(group, np.float64)
    den = np.empty(group, np.float64)
    P = pages_of(T, page)
    seen = np.zeros(P, np.bool_)
    for h in range(H):
        qs = _group_queries(queries, h, group)
        m[:] = -np.inf
        den[:] = 0.0
        acc[:] = 0.0
        seen[:] = False
        for j in range(min(AHEAD, n)):
            _prefetch_page(keys, h, ids, j, page)
            _prefetch_page(values, h, ids, j, page)
        for j in range(n):
            pid = ids[h, j]
            if pid < 0 or pid >= P or seen[pid]:
                continue
            seen[pid] = True
            _prefetch_page(keys, h, ids, j + AHEAD, page)
            _prefetch_page(values, h, ids, j + AHEAD, page)
            t0 = pid * page
            t1 = min(T, t0 + page)
            _group_logits(qs, keys, h, t0, t1, scale, bf16, rows, logits)
            _value_rows(values, h, t0, t1, bf16, vrows)
            for g in range(group):  # online softmax a page at a time
                _softmax_page(logits[g], t1 - t0, vrows, m, den, acc, g, w)
        for g in range(group):
            qh = h * group + g
            if den[g] > 0:
                for d in range(D):
                    out[qh, d] = np.float32(acc[g, d] / den[g])
                lse[qh] = np.float32(m[g] + np.log(den[g]))
            else:
                for d in range(D):
                    out[qh, d] = 0.0
                lse[qh] = -np.inf
