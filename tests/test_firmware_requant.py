"""The firmware's requantize (firmware/requant.py, the drive's KV_REQUANTIZE) against plain
numpy references: for every pair of schemes, a block demoted from one to the other decodes
to the lower scheme's reference applied to what the stored block decoded to, its page
summaries bound the requantized keys, and a pair that is not a demotion is refused."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quant_ref import make_block, ref_scheme, ref_to_f32

from firmware.blockfmt import CorruptBlockError, layer_summaries, open_block
from firmware.layout import KVShape
from firmware.quant import compressed_nbytes, dequantize, parse_scheme, quantize, requantize

SCHEMES = ("plain", "fp8_tensor", "fp8_head", "int8_g64", "int8_g32_sym", "kivi8_g32_r16",
           "int4_g64", "int4_g128_sym", "kivi4_g32_r0", "kivi4_g32_r16", "int2_g64",
           "kivi2_g32_r16")
PAGE = 16


def bits(scheme: str, dtype: str) -> int:
    s = parse_scheme(scheme)
    return (32 if dtype == "fp32" else 16) if s.kind == "plain" else s.bits


def is_lower(old: str, new: str, shape: KVShape, dtype: str) -> bool:
    """The rule the drive applies: fewer bits per element and a smaller block."""
    return (bits(new, dtype) < bits(old, dtype)
            and compressed_nbytes(shape, new, dtype, PAGE) < compressed_nbytes(shape, old, dtype,
                                                                              PAGE))


def test_the_rule_admits_every_demotion_the_issue_names():
    shape = KVShape(64, 2, 2, 64)
    for old, new in [("int8_g64", "int4_g64"), ("plain", "int8_g64"), ("plain", "fp8_head"),
                     ("fp8_head", "int4_g64"), ("kivi8_g32_r16", "kivi4_g32_r16"),
                     ("int8_g64", "kivi4_g32_r0")]:
        assert is_lower(old, new, shape, "fp16"), (old, new)
    for old, new in [("int4_g64", "int8_g64"), ("fp8_head", "int8_g64"),
                     ("int8_g64", "int8_g128"), ("int4_g64", "int4_g64")]:
        assert not is_lower(old, new, shape, "fp16"), (old, new)


@pytest.mark.parametrize(("old", "new"), list(itertools.permutations(SCHEMES, 2)))
@settings(max_examples=4, deadline=None)
@given(shape=st.tuples(st.integers(1, 80), st.integers(1, 2), st.integers(1, 2),
                       st.sampled_from([32, 64])),
       dtype=st.sampled_from(["fp16", "bf16", "fp32"]),
       fill=st.sampled_from(["gauss", "zeros", "outliers", "tiny"]),
       seed=st.integers(0, 2**31))
def test_every_pair_of_schemes_against_the_reference(old, new, shape, dtype, fill, seed):
    block = make_block(shape, dtype, fill, seed)
    stored = quantize(block, dtype, old, summary_page=PAGE)
    if not is_lower(old, new, KVShape(*shape), dtype):
        with pytest.raises(ValueError, match="not below"):
            requantize(stored, new)
        return
    out = requantize(stored, new)
    decoded, _ = dequantize(stored)  # what the drive held: the new block starts from it
    back, back_dtype = dequantize(out)
    assert back_dtype == dtype and back.shape == block.shape
    assert np.array_equal(back, ref_scheme(decoded, dtype, new))
    header, _ = open_block(out)
    assert (header.summary_page, header.shape) == (PAGE, KVShape(*shape))
    assert out.nbytes == compressed_nbytes(KVShape(*shape), new, dtype, PAGE) < stored.nbytes
    # its page summaries bound the keys a retrieve now gives back (not the old ones)
    keys = ref_to_f32(back.reshape(-1), dtype).reshape(back.shape)[:, 0]
    for layer in range(shape[1]):
        run = layer_summaries(out, layer)[1]
        lo, hi = ref_to_f32(run[0], dtype), ref_to_f32(run[1], dtype)  # (heads, pages, D)
        for p in range(lo.shape[1]):
            page = keys[p * PAGE:(p + 1) * PAGE, layer].transpose(1, 0, 2)  # (heads, t, D)
            assert np.array_equal(page.min(1), lo[:, p]) and np.array_equal(page.max(1),
                                                                             hi[:, p])


def test_a_block_without_summaries_stays_without():
    block = make_block((48, 2, 2, 64), "fp16", "gauss", 1)
    out = requantize(quantize(block, "fp16", "int8_g64"), "int4_g64")
    assert open_block(out)[0].summary_page == 0
    assert np.array_equal(dequantize(out)[0],
                          ref_scheme(dequantize(quantize(block, "fp16", "int8_g64"))[0],
                                     "fp16", "int4_g64"))


def test_what_is_not_a_demotion_of_a_sound_block_is_refused():
    block = make_block((64, 2, 2, 64), "fp16", "gauss", 2)
    stored = quantize(block, "fp16", "int8_g64", summary_page=PAGE)
    with pytest.raises(ValueError, match="unknown quantization scheme"):
        requantize(stored, "int3_g64")
    with pytest.raises(ValueError, match="not below"):
        requantize(stored, "kivi4_g32_r128")  # the window covers the block: nothing saved
    bad = stored.copy()
    bad[300] ^= 1
    with pytest.raises(CorruptBlockError):
        requantize(bad, "int4_g64")
    with pytest.raises(CorruptBlockError):
        requantize(np.frombuffer(b"not a block at all" * 8, np.uint8), "int4_g64")
