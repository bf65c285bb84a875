"""Prefix block keys on the host, in plain Python (hashlib), bit-identical to the drive's
kernel (firmware/prefix_hash.py).

key_i = BLAKE2b-128(key_(i-1) || token ids of block i as little-endian uint32), with
key_(-1) = root_key(model, adapter, tenant).  Only full blocks get keys: a partial trailing
block is never matched (as in vLLM).  BLAKE2b-128 means hashlib.blake2b(digest_size=16) with
no key, salt or personalisation.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BLOCK_SIZES = (16, 256, 512)
KEY_BYTES = 16
_ROOT_DOMAIN = b"ssdemu-prefix-root-v1"


def root_key(model: str, adapter: str = "", tenant: str = "") -> bytes:
    """The fixed 16-byte key_(-1) of a salt: chains under different models, adapters or
    tenants never share a key."""
    parts = [_ROOT_DOMAIN] + [p.encode("utf-8") for p in (model, adapter, tenant)]
    for p in parts:
        if b"\0" in p:
            raise ValueError("salt parts must not contain NUL characters")
    return hashlib.blake2b(b"\0".join(parts), digest_size=KEY_BYTES).digest()


def check_block_tokens(block_tokens: int) -> None:
    if block_tokens not in BLOCK_SIZES:
        raise ValueError(f"block size must be one of {BLOCK_SIZES} tokens, got {block_tokens}")


def chain_keys(tokens: Sequence[int], block_tokens: int, root: bytes) -> list[bytes]:
    """The key of every full block of `tokens`, in order."""
    check_block_tokens(block_tokens)
    if len(root) != KEY_BYTES:
        raise ValueError(f"root key must be {KEY_BYTES} bytes, got {len(root)}")
    keys = []
    prev = root
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        block = tokens[start:start + block_tokens]
        for t in block:
            if not 0 <= t < 2**32:
                raise ValueError(f"token id {t} does not fit in uint32")
        data = prev + struct.pack(f"<{block_tokens}I", *block)
        prev = hashlib.blake2b(data, digest_size=KEY_BYTES).digest()
        keys.append(prev)
    return keys
