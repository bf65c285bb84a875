"""The compressed block's checksum: position-weighted 64-bit sums (Fletcher-style).

Over the little-endian uint64 words w_0.. of the data (zero-padded to whole words),
s1 = sum(w_i), s2 = sum((i + 1) * w_i), both mod 2^64; the checksum is s1 XOR (s2 rotated by
32 bits).  Any single-bit error changes s1; swapped or shifted words change s2.  It is not
cryptographic: it guards against corruption, not against an adversary.  Chosen over CRC-32
because zlib's CRC runs at about 3 GB/s here, which would cap the quantizer below the speed
it must reach, while these sums vectorize (~25 GB/s in cache).

Both sums are linear, so a stretch of words can be summed on its own (`word_sums`, weights
counted from the stretch's first word) and folded in later (`sum64_around`): the quantizer
sums its codes piece by piece while they are still in cache, instead of reading the whole
block back from memory at the end.
"""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, inline="always")
def word_sums(words):
    """(sum(w_j), sum((j + 1) * w_j)) over uint64 words, mod 2^64."""
    s1 = np.uint64(0)
    s2 = np.uint64(0)
    for i in range(words.shape[0]):
        w = words[i]
        s1 += w
        s2 += w * np.uint64(i + 1)
    return s1, s2


@njit(cache=True, nogil=True)
def sum64_around(data, skip_word, lo, hi, s1_mid, s2_mid) -> np.uint64:
    """sum64 of data whose words [lo, hi) were summed already: (s1_mid, s2_mid) is their
    word_sums.  skip_word lies outside [lo, hi)."""
    n8 = data.shape[0] // 8
    words = data[:n8 * 8].view(np.uint64)
    s1, s2 = word_sums(words[:lo])
    a1, a2 = word_sums(words[hi:])
    s1 += np.uint64(s1_mid) + a1
    s2 += np.uint64(s2_mid) + np.uint64(lo) * np.uint64(s1_mid) + a2 + np.uint64(hi) * a1
    if 0 <= skip_word < n8:  # take it back out rather than branch in the loop
        w = words[skip_word]
        s1 -= w
        s2 -= w * np.uint64(skip_word + 1)
    rest = data.shape[0] - n8 * 8
    if rest:
        w = np.uint64(0)
        for j in range(rest):
            w |= np.uint64(data[n8 * 8 + j]) << np.uint64(8 * j)
        s1 += w
        s2 += w * np.uint64(n8 + 1)
    return s1 ^ ((s2 << np.uint64(32)) | (s2 >> np.uint64(32)))


@njit(cache=True, nogil=True)
def sum64(data, skip_word) -> np.uint64:
    """Checksum of a uint8 array whose start is 8-byte aligned, with word `skip_word` taken as
    zero (where the checksum itself is stored; -1: none)."""
    return sum64_around(data, skip_word, 0, 0, np.uint64(0), np.uint64(0))
