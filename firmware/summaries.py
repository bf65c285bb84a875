"""Page summaries made when a block is stored: per layer, per KV head, per page of `page`
tokens, per channel, the min and the max of the keys (Quest, Tang et al., ICML 2024), in
the block's own element type.

They are a section of the drive's compressed block (firmware/blockfmt.py), after the body,
made from the keys as the block gives them back (the dequantized values, not the ones sent:
Quest's score must bound q.k for the keys attention will read).  A min or a max of values
is one of them, so keeping it in their element type is exact, and the bound holds bit for
bit.

Section layout: (layers, 2, kv_heads, pages, head_dim) elements, min then max, so that one
layer's summaries are one contiguous run (TOPK_PAGES scores one layer), padded to 8 bytes.
"""

import numpy as np
from numba import njit

from firmware import blockparams as _registers_sizes  # noqa: F401
from firmware import sizes
from firmware.bits import fp16_bits_as_f32, u32_as_f32

MAX_PAGE = 4096  # tokens per page, as a profile's retrieval.page_tokens allows


# plain Python (firmware/sizes.py), compiled inline where the kernels call them
# (firmware.blockparams registers them with Numba)
pages_of, section_bytes = sizes.pages_of, sizes.summary_section_bytes


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _as_f32(v, dtype):
    if dtype == 0:
        return fp16_bits_as_f32(v)
    if dtype == 1:
        return u32_as_f32(np.uint32(v) << np.uint32(16))
    return np.float32(v)


@njit(cache=True, nogil=True, error_model="numpy")
def write_summaries(x, dtype, layout_2lt, tokens, layers, heads, head_dim, page, out):
    """x: a block's elements (uint16 fp16/bf16 bits, or float32), in the drive's (tokens, 2,
    layers, heads, head_dim) order, or (2, layers, tokens, heads, head_dim) when layout_2lt;
    out: the section (uint8, section_bytes long).  Writes every layer's min and max per head,
    page and channel, as elements of x's type."""
    P = pages_of(tokens, page)
    HD = heads * head_dim
    sec = out[:layers * 2 * heads * P * head_dim * x.itemsize].view(x.dtype)
    sec_f = np.empty(2 * HD, np.float32)  # this page's running min and max, as floats
    for layer in range(layers):
        base = layer * 2 * heads * P * head_dim
        for pg in range(P):
            t0 = pg * page
            t1 = min(tokens, t0 + page)
            for t in range(t0, t1):
                # the key row of token t in this layer
                if layout_2lt:
                    row = (layer * tokens + t) * HD
                else:
                    row = (t * 2 * layers + layer) * HD
                for i in range(HD):
                    v = x[row + i]
                    f = _as_f32(v, dtype)
                    h, d = i // head_dim, i % head_dim
                    at_min = base + (h * P + pg) * head_dim + d
                    at_max = at_min + heads * P * head_dim
                    if t == t0 or f < sec_f[i]:
                        sec_f[i] = f
                        sec[at_min] = v
                    if t == t0 or f > sec_f[HD + i]:
                        sec_f[HD + i] = f
                        sec[at_max] = v
    used = sec.shape[0] * x.itemsize
    out[used:] = 0  # the padding: a block's bytes depend on its contents only
