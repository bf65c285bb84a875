"""Prefix block keys inside the drive: BLAKE2b-128 chained over token blocks, in Numba.

key_i = BLAKE2b-128(key_(i-1) || token ids of block i, little-endian uint32); the host's plain
Python version is hostlib/prefix_hash.py and the two are bit-identical (tested).

Why BLAKE2b: a prefix-cache key must not collide, and in a shared drive one tenant could
craft prompts against another's keys, so the hash is cryptographic (vLLM moved its prefix
hash to SHA-256 for the same reason); BLAKE2b is faster than SHA-256 in software, takes a
16-byte digest as a parameter of the function rather than by truncation, and is in Python's
standard library, so hosts need nothing extra.  128 bits fit the NVMe KV 16-byte key limit.
"""

import numpy as np
from numba import njit

_IV = np.array([
    0x6A09E667F3BCC908, 0xBB67AE8584CAA73B, 0x3C6EF372FE94F82B, 0xA54FF53A5F1D36F1,
    0x510E527FADE682D1, 0x9B05688C2B3E6C1F, 0x1F83D9ABFB41BD6B, 0x5BE0CD19137E2179,
], dtype=np.uint64)
_SIGMA = np.array([
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
    [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
    [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
    [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
    [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
    [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
    [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
    [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
    [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
], dtype=np.int64)
_DIGEST_BYTES = 16
KEY_BYTES = 16


@njit(cache=True, nogil=True, inline="always")
def _rotr(x, n):
    return (x >> np.uint64(n)) | (x << np.uint64(64 - n))


@njit(cache=True, nogil=True, inline="always")
def _g(v, a, b, c, d, x, y):
    v[a] = v[a] + v[b] + x
    v[d] = _rotr(v[d] ^ v[a], 32)
    v[c] = v[c] + v[d]
    v[b] = _rotr(v[b] ^ v[c], 24)
    v[a] = v[a] + v[b] + y
    v[d] = _rotr(v[d] ^ v[a], 16)
    v[c] = v[c] + v[d]
    v[b] = _rotr(v[b] ^ v[c], 63)


@njit(cache=True, nogil=True)
def _compress(h, m, counter, last, v, iv, sigma):
    """One BLAKE2b compression of the 16 message words m into state h (RFC 7693, 3.2)."""
    for i in range(8):
        v[i] = h[i]
        v[i + 8] = iv[i]
    v[12] ^= np.uint64(counter)
    if last:
        v[14] = ~v[14]
    for r in range(12):
        s = sigma[r % 10]
        _g(v, 0, 4, 8, 12, m[s[0]], m[s[1]])
        _g(v, 1, 5, 9, 13, m[s[2]], m[s[3]])
        _g(v, 2, 6, 10, 14, m[s[4]], m[s[5]])
        _g(v, 3, 7, 11, 15, m[s[6]], m[s[7]])
        _g(v, 0, 5, 10, 15, m[s[8]], m[s[9]])
        _g(v, 1, 6, 11, 12, m[s[10]], m[s[11]])
        _g(v, 2, 7, 8, 13, m[s[12]], m[s[13]])
        _g(v, 3, 4, 9, 14, m[s[14]], m[s[15]])
    for i in range(8):
        h[i] ^= v[i] ^ v[i + 8]


@njit(cache=True, nogil=True)
def _blake2b_128(msg, length, out, h, v, iv, sigma):
    """BLAKE2b with a 16-byte digest of msg[:length] (msg: uint8, zero-padded to a multiple of
    128 bytes, 8-byte aligned) into out uint8[16]."""
    for i in range(8):
        h[i] = iv[i]
    h[0] ^= np.uint64(0x01010000 | _DIGEST_BYTES)
    words = msg.view(np.uint64)
    nblocks = max(1, (length + 127) // 128)
    for b in range(nblocks):
        last = b == nblocks - 1
        counter = length if last else (b + 1) * 128
        _compress(h, words[b * 16:(b + 1) * 16], counter, last, v, iv, sigma)
    out[:] = h[:2].view(np.uint8)


@njit(cache=True, nogil=True)
def hash_chain(tokens, block_tokens, root, keys):
    """keys[i] (uint8[nblocks, 16]) = the chained key of full block i of tokens (uint32[n]);
    root: uint8[16].  Returns the number of full blocks."""
    nblocks = tokens.shape[0] // block_tokens
    length = KEY_BYTES + 4 * block_tokens
    padded = (length + 127) // 128 * 128
    msg = np.zeros(padded, np.uint8)
    h = np.empty(8, np.uint64)
    v = np.empty(16, np.uint64)
    iv = _IV
    sigma = _SIGMA
    tok_bytes = tokens.view(np.uint8)
    prev = root
    for i in range(nblocks):
        msg[:KEY_BYTES] = prev
        msg[KEY_BYTES:length] = tok_bytes[4 * i * block_tokens:4 * (i + 1) * block_tokens]
        _blake2b_128(msg, length, keys[i], h, v, iv, sigma)
        prev = keys[i]
    return nblocks
