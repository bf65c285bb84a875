"""Merging partial attention on the host: the drive's ATTEND over the pages it holds, the
host's own over tokens it holds (the current window in HBM), as flash-attention merges blocks:
with outputs o_i and log-sum-exps l_i over disjoint key sets, l = log sum_i e^l_i and
o = sum_i e^(l_i - l) o_i."""

from __future__ import annotations

import numpy as np


def merge_attention(parts) -> tuple[np.ndarray, np.ndarray]:
    """parts: (out (heads, D), lse (heads,)) pairs over disjoint key sets -> their union's."""
    outs = [np.asarray(o, np.float64) for o, _ in parts]
    lses = np.stack([np.asarray(lse, np.float64) for _, lse in parts])
    if not outs:
        raise ValueError("nothing to merge")
    lse = np.logaddexp.reduce(lses, axis=0)
    safe = np.where(np.isfinite(lse), lse, 0.0)
    out = sum(np.exp(li - safe)[:, None] * o for o, li in zip(outs, lses, strict=True))
    return out.astype(np.float32), lse.astype(np.float32)
