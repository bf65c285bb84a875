"""Blocks laid out by head (format version 2, firmware/blockfmt.py): the same values and
summaries as the token-major layout, one layer's page of one KV head where page_extents says
(checked against the body's own bytes), version-1 blocks still read, a by-head flag where it
cannot be refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firmware import blockops as B
from firmware.blockfmt import (
    FLAG_BY_HEAD,
    HEADER_BYTES,
    CorruptBlockError,
    open_block,
    page_extents,
    seal,
)
from firmware.quant import dequantize, quantize

BY_HEAD_SCHEMES = ("plain", "int8_g64", "int8_g32_sym", "int4_g32", "int4_g64_sym")
TOKEN_MAJOR_SCHEMES = ("int8_g128", "fp8_head", "fp8_tensor", "kivi4_g32_r128")


def _block(rng, tokens, layers, heads, dim, dtype):
    x = rng.standard_normal((tokens, 2, layers, heads, dim)).astype(np.float32)
    return x.astype(np.float16).view(np.uint16) if dtype == "fp16" else x


shapes = st.tuples(st.integers(1, 70), st.integers(1, 3), st.integers(1, 3),
                   st.sampled_from([64, 128]))


@settings(max_examples=40, deadline=None)
@given(shapes, st.sampled_from(BY_HEAD_SCHEMES + TOKEN_MAJOR_SCHEMES),
       st.sampled_from(["fp16", "fp32"]), st.sampled_from([0, 16]), st.integers(0, 2**32 - 1))
def test_the_layout_changes_no_value_and_no_summary(shape, scheme, dtype, page, seed):
    tokens, layers, heads, dim = shape
    if scheme.startswith("kivi") and tokens < 160:
        tokens = 160  # a whole group of 32 before its 128 residual tokens
    x = _block(np.random.default_rng(seed), tokens, layers, heads, dim, dtype)
    a = quantize(x, dtype, scheme, summary_page=page)
    b = quantize(x, dtype, scheme, summary_page=page, by_head=False)
    ha, _ = open_block(a)
    hb, _ = open_block(b)
    allowed = scheme == "plain" or (scheme.startswith("int") and dim % ha.group == 0)
    assert ha.by_head == allowed and not hb.by_head
    assert len(a) == len(b)
    da, _ = dequantize(a)
    db, _ = dequantize(b)
    np.testing.assert_array_equal(da, db)  # the host's order back, the same values
    if scheme == "plain":
        np.testing.assert_array_equal(da, x)
    # the summaries after the body are the same bytes
    assert a[HEADER_BYTES + ha.body_bytes:].tobytes() == b[HEADER_BYTES + hb.body_bytes:].tobytes()


def _ref_extent_values(x, layer, kv, head, t0, t1):
    return np.ascontiguousarray(x[t0:t1, kv, layer, head]).reshape(-1)


@settings(max_examples=40, deadline=None)
@given(shapes, st.sampled_from(["fp16", "fp32"]), st.data())
def test_a_plain_page_of_one_head_is_its_extent(shape, dtype, data):
    tokens, layers, heads, dim = shape
    x = _block(np.random.default_rng(0), tokens, layers, heads, dim, dtype)
    blob = quantize(x, dtype, "plain")
    h, _ = open_block(blob)
    layer = data.draw(st.integers(0, layers - 1))
    head = data.draw(st.integers(0, heads - 1))
    kv = data.draw(st.integers(0, 1))
    t0 = data.draw(st.integers(0, tokens - 1))
    t1 = data.draw(st.integers(t0 + 1, tokens))
    ((off, n),) = page_extents(h, layer, kv, head, t0, t1)
    got = blob[off:off + n].view(x.dtype)
    np.testing.assert_array_equal(got, _ref_extent_values(x, layer, kv, head, t0, t1))


@pytest.mark.parametrize("scheme", ["int8_g64", "int8_g32_sym", "int4_g32"])
def test_an_integer_page_of_one_head_is_its_codes_and_scales(scheme):
    """The extents of a page hold everything its values are decoded from: a block whose
    every other byte is scrambled still gives that page's values."""
    rng = np.random.default_rng(1)
    tokens, layers, heads, dim = 48, 2, 3, 64
    x = _block(rng, tokens, layers, heads, dim, "fp16")
    blob = quantize(x, "fp16", scheme)
    h, _ = open_block(blob)
    want, _ = dequantize(blob)
    layer, kv, head, t0, t1 = 1, 1, 2, 16, 32
    runs = page_extents(h, layer, kv, head, t0, t1)
    keep = np.zeros(len(blob), bool)
    for off, n in runs:
        keep[off:off + n] = True
    keep[:HEADER_BYTES] = True
    body = slice(HEADER_BYTES, HEADER_BYTES + h.body_bytes)
    scrambled = blob.copy()
    noise = rng.integers(0, 256, len(blob), dtype=np.uint8)
    scrambled[body] = np.where(keep[body], blob[body], noise[body])
    scrambled = seal(h, scrambled)  # a consistent block: only the other pages changed
    got, _ = dequantize(scrambled)
    np.testing.assert_array_equal(got[t0:t1, kv, layer, head], want[t0:t1, kv, layer, head])
    read = sum(n for _, n in runs)
    assert read < h.body_bytes / (2 * layers * heads)  # a page of one head, not token rows


def test_a_token_major_block_extent_is_its_token_rows():
    x = _block(np.random.default_rng(2), 32, 2, 2, 64, "fp16")
    blob = quantize(x, "fp16", "fp8_head")
    h, _ = open_block(blob)
    assert not h.by_head
    per = h.body_bytes // 32
    assert page_extents(h, 1, 0, 1, 8, 24) == [(HEADER_BYTES + 8 * per, 16 * per)]


def test_version_1_blocks_are_read_and_cannot_claim_the_by_head_layout():
    x = _block(np.random.default_rng(3), 16, 1, 2, 64, "fp16")
    v2 = quantize(x, "fp16", "int8_g64", by_head=False)
    v1 = v2.copy()
    v1[4:6] = np.frombuffer(np.uint16(1).tobytes(), np.uint8)
    v1 = _reseal(v1)
    np.testing.assert_array_equal(dequantize(v1)[0], dequantize(v2)[0])  # read as before
    bad = v1.copy()
    bad[10] |= FLAG_BY_HEAD  # a version 1 block cannot be by head
    with pytest.raises(CorruptBlockError, match="bad header"):
        open_block(_reseal(bad))
    worse = quantize(x, "fp16", "fp8_head")  # fp8 is never by head
    worse[10] |= FLAG_BY_HEAD
    with pytest.raises(CorruptBlockError, match="bad header"):
        open_block(_reseal(worse))
    future = v2.copy()
    future[4:6] = np.frombuffer(np.uint16(B.VERSION + 1).tobytes(), np.uint8)
    with pytest.raises(CorruptBlockError, match="version"):
        open_block(future)


def _reseal(blob: np.ndarray) -> np.ndarray:
    """The block's checksum made right for its bytes as they are (firmware/checksum.py)."""
    from firmware.checksum import sum64

    out = blob.copy()
    out[40:48] = 0
    out[40:48] = np.frombuffer(np.uint64(sum64(out, 5)).tobytes(), np.uint8)
    return out


def _joined(offs, lens, page: int = 1) -> list:
    """The drive's reads of runs (join_runs, in C) as (offset, bytes) pairs."""
    from ssdemu.sim.timing import join_runs

    offs, lens = np.array(offs, np.uint64), np.array(lens, np.uint64)
    n = join_runs(offs, lens, page)
    return [(int(o), int(k)) for o, k in zip(offs[:n], lens[:n], strict=True)]


def _joined_ref(offs, lens, page: int = 1) -> list:
    """The same in numpy (the join as the retrieval worker first wrote it)."""
    offs, lens = np.asarray(offs, np.int64), np.asarray(lens, np.int64)
    order = np.argsort(offs, kind="stable")
    offs, ends = offs[order], offs[order] + lens[order]
    reach = np.maximum.accumulate(ends)
    starts = np.flatnonzero(np.r_[True, (offs[1:] > reach[:-1])
                                  & (offs[1:] // page > (reach[:-1] - 1) // page)])
    stops = np.r_[starts[1:], len(offs)] - 1
    return [(int(o), int(e - o)) for o, e in zip(offs[starts], reach[stops], strict=True)]


def test_runs_adjacent_on_the_media_are_one_read():
    offs = np.array([100, 0, 50, 300, 140, 120])
    lens = np.array([20, 50, 10, 5, 10, 30])
    # [0,50)+[50,60) adjacent; [100,120)+[120,150) adjacent, [140,150) inside; [300,305) apart
    assert _joined(offs, lens) == [(0, 60), (100, 50), (300, 5)]
    assert _joined(np.array([7]), np.array([3])) == [(7, 3)]
    # in pages of 128 bytes: [0,60) and [100,150) share page 0; [300,305) is in page 2
    assert _joined(offs, lens, 128) == [(0, 150), (300, 5)]
    # a run that begins in the page where the others end joins them; the next page does not
    assert _joined(np.array([0, 200, 256]), np.array([130, 10, 4]), 128) == [(0, 210),
                                                                             (256, 4)]
    assert _joined([], [], 128) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 40), st.integers(0, 70000)), min_size=1,
                max_size=300),
       st.sampled_from([1, 512, 4096, 16384]), st.integers(0, 3))
def test_the_join_in_c_is_the_numpy_one(runs, page, spread):
    """Offsets spread over 1 to 5 bytes' worth (the radix sort's passes) and clustered (a
    command's runs within a few megabytes), lengths 0 up to past a NAND page."""
    offs = np.array([o >> (8 * spread) for o, _ in runs], np.uint64)
    lens = np.array([n for _, n in runs], np.uint64)
    assert _joined(offs, lens, page) == _joined_ref(offs, lens, page)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(1, 3), st.integers(1, 3), st.sampled_from([1, 2, 3, 6]),
       st.sampled_from(["fp16", "fp32"]))
def test_rows_that_are_not_whole_words_move_too(tokens, layers, heads, dim, dtype):
    """head_dim rows of fewer than 8 bytes, or not a multiple of 8, take the byte path."""
    x = _block(np.random.default_rng(tokens), tokens, layers, heads, dim, dtype)
    blob = quantize(x, dtype, "plain", summary_page=4)
    h, _ = open_block(blob)
    assert h.by_head
    np.testing.assert_array_equal(dequantize(blob)[0], x)
    ((off, n),) = page_extents(h, layers - 1, 1, heads - 1, 0, tokens)
    np.testing.assert_array_equal(blob[off:off + n].view(x.dtype),
                                  _ref_extent_values(x, layers - 1, 1, heads - 1, 0, tokens))
