"""The block checksum against a plain numpy definition, and the piecewise form the quantizer
uses (codes summed piece by piece, folded in around the rest) against the whole-block form."""

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from firmware.checksum import sum64, sum64_around, word_sums


def ref_sum64(data: np.ndarray, skip_word: int) -> int:
    padded = np.zeros(-(-data.size // 8) * 8, np.uint8)
    padded[:data.size] = data
    words = [int(w) for w in padded.view(np.uint64)]
    if 0 <= skip_word < data.size // 8:  # only a whole word holds a stored checksum
        words[skip_word] = 0
    m = (1 << 64) - 1
    s1 = sum(words) & m
    s2 = sum((i + 1) * w for i, w in enumerate(words)) & m
    return s1 ^ (((s2 << 32) | (s2 >> 32)) & m)


blobs = st.binary(min_size=0, max_size=600).map(lambda b: np.frombuffer(b, np.uint8).copy())


@settings(max_examples=200, deadline=None)
@given(data=blobs, skip=st.integers(-1, 80))
def test_sum64_matches_definition(data, skip):
    assert int(sum64(data, skip)) == ref_sum64(data, skip)


@settings(max_examples=200, deadline=None)
@given(data=blobs, cut=st.tuples(st.integers(0, 75), st.integers(0, 75)), skip=st.integers(-1, 80))
# word sums past 2**63 (a word with its top bit set, weighted by 2)
@example(data=np.array([0] * 15 + [64], np.uint8), cut=(0, 2), skip=-1)
def test_stretch_summed_apart_folds_in_to_the_same_checksum(data, cut, skip):
    n8 = data.size // 8
    lo, hi = sorted(min(c, n8) for c in cut)
    if lo <= skip < hi:
        skip = -1  # the stored checksum never lies inside the pre-summed codes
    s1, s2 = word_sums(data[:n8 * 8].view(np.uint64)[lo:hi])
    # as uint64, as the quantizer holds them (a Python int past 2**63 would be typed int64)
    got = sum64_around(data, skip, lo, hi, np.uint64(s1), np.uint64(s2))
    assert int(got) == ref_sum64(data, skip)


def test_a_flipped_bit_or_swapped_words_change_it():
    data = np.arange(64, dtype=np.uint8)
    base = int(sum64(data, -1))
    flipped = data.copy()
    flipped[37] ^= 0x10
    swapped = data.copy()
    swapped[:16] = np.concatenate([data[8:16], data[:8]])
    assert int(sum64(flipped, -1)) != base
    assert int(sum64(swapped, -1)) != base
