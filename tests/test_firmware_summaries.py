"""Page summaries made as a block is stored (firmware/summaries.py, in the block format of
firmware/blockfmt.py): against a plain numpy reference over the keys as the block gives them
back, for every scheme (plain included), element type, layout and page size; the checksum
covers them; a block without them is as it was."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quant_ref import make_block, ref_to_f32

from firmware import blockops as B
from firmware.blockfmt import CorruptBlockError, layer_summaries, open_block
from firmware.layout import KVShape, dtype_code
from firmware.quant import compressed_nbytes, dequantize, params, quantize


def ref_summaries(keys: np.ndarray, page: int) -> tuple[np.ndarray, np.ndarray]:
    """keys (tokens, heads, D) float32 -> per page min and max (heads, pages, D)."""
    T = keys.shape[0]
    pages = -(-T // page)
    lo = np.stack([keys[p * page:(p + 1) * page].min(0) for p in range(pages)], 1)
    hi = np.stack([keys[p * page:(p + 1) * page].max(0) for p in range(pages)], 1)
    return lo, hi


SCHEMES = ["plain", "int8_g32", "int4_g64_sym", "kivi4_g32_r32", "kivi8_g64_r0", "fp8_tensor",
           "fp8_head"]


@settings(max_examples=80, deadline=None)
@given(shape=st.tuples(st.integers(1, 70), st.integers(1, 3), st.integers(1, 3),
                       st.sampled_from([8, 16, 64])),
       dtype=st.sampled_from(["fp16", "bf16", "fp32"]), scheme=st.sampled_from(SCHEMES),
       page=st.sampled_from([1, 5, 16, 64]),
       fill=st.sampled_from(["gauss", "zeros", "const", "outliers", "tiny", "large"]),
       seed=st.integers(0, 2**31))
def test_summaries_are_the_pages_min_and_max_of_the_keys_a_retrieve_gives_back(
        shape, dtype, scheme, page, fill, seed):
    x = make_block(shape, dtype, fill, seed)
    if scheme.startswith("kivi") and shape[0] < 32:
        scheme = "kivi4_g32_r0"  # whole groups or full precision: every token count is fine
    blob = quantize(x, dtype, scheme, summary_page=page)
    assert blob.size == compressed_nbytes(KVShape(*shape), scheme, dtype, page)
    y, _ = dequantize(blob)
    plain_blob = quantize(x, dtype, scheme)
    assert np.array_equal(y, dequantize(plain_blob)[0])  # the body is the same
    if scheme == "plain":
        assert np.array_equal(y, x)
    keys = ref_to_f32(y, dtype)[:, 0]  # (tokens, layers, heads, D)
    for layer in range(shape[1]):
        header, run = layer_summaries(blob, layer)
        assert header.summary_page == page
        lo, hi = ref_summaries(keys[:, layer], page)
        assert np.array_equal(ref_to_f32(run[0], dtype), lo)
        assert np.array_equal(ref_to_f32(run[1], dtype), hi)


@pytest.mark.parametrize("scheme", ["plain", "int8_g64", "fp8_head", "kivi4_g32_r0"])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_lmcache_order_blocks_are_summarized_by_token(scheme, dtype):
    """A block in LMCache's (2, layers, tokens, heads, D) order: each layer's summaries are
    the pages' min and max over the keys it gives back, read in that order."""
    T, L, H, D = 40, 2, 2, 16
    x = make_block((T, L, H, D), dtype, "gauss", 7)
    two_lt = np.ascontiguousarray(x.transpose(1, 2, 0, 3, 4))
    p = params(KVShape(T, L, H, D), scheme, dtype, 16)
    p[B.P_LAYOUT] = B.LAYOUT_2LT
    out = np.empty(int(B.compressed_bytes(p)), np.uint8)
    assert B.quantize_block(p.copy(), two_lt.reshape(-1).view(np.uint8).copy(), out) == out.size
    assert B.add_summaries(out, np.zeros(B.NPARAM, np.int64)) == out.size
    back = np.empty(two_lt.nbytes, np.uint8)
    assert B.dequantize_block(out, back, np.zeros(B.NPARAM, np.int64)) == back.size
    y = back.view(x.dtype).reshape(2, L, T, H, D)
    if scheme == "plain":
        assert np.array_equal(y, two_lt)
    for layer in range(L):
        lo, hi = ref_summaries(ref_to_f32(y[0, layer], dtype), 16)
        run = layer_summaries(out, layer)[1]
        assert np.array_equal(ref_to_f32(run[0], dtype), lo)
        assert np.array_equal(ref_to_f32(run[1], dtype), hi)


def test_the_checksum_covers_the_summaries_and_the_length_counts_them():
    x = make_block((32, 2, 2, 16), "fp16", "gauss", 3)
    blob = quantize(x, "fp16", "int8_g64", summary_page=16)
    header, _ = open_block(blob)
    bad = blob.copy()
    bad[-3] ^= 1  # a bit of the last layer's max
    with pytest.raises(CorruptBlockError, match="checksum"):
        open_block(bad)
    with pytest.raises(CorruptBlockError, match="checksum"):
        dequantize(bad)
    with pytest.raises(CorruptBlockError, match="bytes"):
        open_block(blob[:-8])  # a section cut short
    assert header.summary_page == 16 and layer_summaries(quantize(x, "fp16", "int8_g64"),
                                                         0)[1] is None


def test_a_request_with_a_page_past_the_limit_is_refused():
    with pytest.raises(ValueError, match="summary_page"):
        quantize(make_block((4, 1, 1, 8), "fp16", "gauss", 1), "fp16", "plain",
                 summary_page=4097)
    req = np.zeros(64, np.uint8)
    from ssdemu_wire.layout import pack_quant_request
    for page, ok in ((4096, True), (4097, False)):
        req[:] = np.frombuffer(pack_quant_request(dtype_code("fp16"), "plain", 4, 1, 1, 8,
                                                  summary_page=page), np.uint8)
        p = np.zeros(B.NPARAM, np.int64)
        assert (B.parse_request(req, p) == 0) == ok
