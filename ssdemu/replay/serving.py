"""The serving side of a replay: model configurations, KV tiers with LRU by block count, and
the capacity syntax.  Pure logic: no I/O, no clock."""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from firmware import sizes  # plain arithmetic: model mode never loads Numba
from firmware.layout import KVShape
from ssdemu.units import parse_size

BLOCK_TOKENS = 512
TIERS = ("hbm", "dram", "drive")


@dataclass(frozen=True)
class ModelConfig:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    element_bytes: int = 2  # fp16
    prefill_tokens_per_s: float = 10_000.0  # the modelled GPU, configurable
    decode_tokens_per_s: float = 50.0
    query_heads: int = 0  # attention's query heads (GQA: a multiple of kv_heads); 0: kv_heads

    def __post_init__(self):
        if not self.query_heads:
            object.__setattr__(self, "query_heads", self.kv_heads)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.element_bytes

    @property
    def block_bytes(self) -> int:
        return BLOCK_TOKENS * self.kv_bytes_per_token

    def block_shape(self) -> KVShape:
        return KVShape(BLOCK_TOKENS, self.layers, self.kv_heads, self.head_dim)

    def stored_block_bytes(self, quant: str | None) -> int:
        """Bytes of one 512-token block in a tier that stores it under `quant` (None: fp16)."""
        if not quant:
            return self.block_bytes
        return sizes.compressed_nbytes(BLOCK_TOKENS, self.layers, self.kv_heads,
                                       self.head_dim, quant, dtype=0)  # fp16


MODELS = {
    # Llama-3-8B: 32 layers x 8 KV heads x 128 -> 128 KiB per token (fp16)
    # (32 query heads: GQA groups of 4)
    "llama-3-8b": ModelConfig("llama-3-8b", 32, 8, 128, prefill_tokens_per_s=50_000.0,
                              query_heads=32),
    # Qwen2.5-7B: 28 layers x 4 KV heads x 128 -> 56 KiB per token
    # (28 query heads: GQA groups of 7)
    "qwen2.5-7b": ModelConfig("qwen2.5-7b", 28, 4, 128, prefill_tokens_per_s=55_000.0,
                              query_heads=28),
    # SmolLM2-135M (the real model of ssdemu.llm, from its GGUF: 30 layers x 3 KV heads x 64
    # -> 22.5 KiB per token; 9 query heads: GQA groups of 3).  Its prefill rate is assumed:
    # 20x Llama-3-8B's (the FLOPs per token are 59x fewer; a model this small does not keep
    # a GPU's matrix units busy)
    # Its decode rate is assumed too: 500 tokens/s, a step of 2 ms bound by launching ~300
    # kernels a token, not by reading its 270 MB of fp16 weights (0.1 ms at 2 TB/s)
    "smollm2-135m": ModelConfig("smollm2-135m", 30, 3, 64, prefill_tokens_per_s=1_000_000.0,
                                decode_tokens_per_s=500.0, query_heads=9),
    # a tiny test model: 2 layers x 2 heads x 64 -> 1 KiB per token
    "tiny": ModelConfig("tiny", 2, 2, 64, prefill_tokens_per_s=200_000.0, query_heads=4),
}


def model_config(name: str) -> ModelConfig:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}: expected one of "
                         f"{', '.join(sorted(MODELS))}") from None


def drive_key(hash_id: int) -> bytes:
    """The 16-byte drive key of a Mooncake hash id: the id as 8 little-endian bytes, then
    b"mooncake" (ids of other traces would take another suffix)."""
    return int(hash_id).to_bytes(8, "little") + b"mooncake"


def parse_capacities(text: str, block_bytes: dict[str, int]) -> dict[str, int | None]:
    """'hbm=80G,dram=blocks:1000,drive=unbounded' -> blocks per tier (None: unbounded).  A
    tier of B bytes holds floor(B / its stored block size) blocks; tiers not named hold 0."""
    out: dict[str, int | None] = {t: 0 for t in TIERS}
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise ValueError("no capacity given: expected TIER=SIZE[,TIER=SIZE...], e.g. "
                         "drive=16G")
    seen = set()
    for part in filter(None, parts):
        m = re.match(r"^(hbm|dram|drive)=(.+)$", part)
        if not m:
            raise ValueError(f"bad capacity {part!r}: expected TIER=SIZE with TIER one of "
                             f"{', '.join(TIERS)}")
        tier, value = m.groups()
        if tier in seen:
            raise ValueError(f"capacity of {tier} given twice in {text!r}")
        seen.add(tier)
        if value == "unbounded":
            out[tier] = None
        elif value.startswith("blocks:"):
            try:
                out[tier] = int(value[7:])
            except ValueError:
                raise ValueError(f"bad block count in {part!r}") from None
            if out[tier] < 0:
                raise ValueError(f"bad block count in {part!r}")
        else:
            out[tier] = parse_size(value) // block_bytes[tier]
    return out


class LRUTier:
    """A KV tier: block ids, least recently used first; capacity in blocks (None: unbounded)."""

    def __init__(self, capacity: int | None):
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def __contains__(self, block: int) -> bool:
        return block in self.blocks

    def leading_run(self, ids) -> int:
        """How many of the request's leading blocks this tier holds."""
        n = 0
        for b in ids:
            if b not in self.blocks:
                break
            n += 1
        return n

    def refresh(self, ids) -> None:
        """Touch the blocks this tier holds (most recent last); insert nothing."""
        blocks = self.blocks
        for b in ids:
            if b in blocks:
                blocks.move_to_end(b)

    def touch_all(self, ids) -> list[int]:
        """Insert or touch every block in order (most recent last), then evict LRU blocks
        down to the capacity; returns the evicted blocks."""
        evicted: list[int] = []
        if self.capacity == 0:
            return evicted
        blocks = self.blocks
        for b in ids:
            if b in blocks:
                blocks.move_to_end(b)
            else:
                blocks[b] = None
        if self.capacity is not None:
            while len(blocks) > self.capacity:
                evicted.append(blocks.popitem(last=False)[0])
                self.evictions += 1
        return evicted


class SyntheticKV:
    """Synthetic KV values of a model's blocks: block b is the window of one Gaussian fp16
    sequence (as uint16 bits) that starts at its b-th value, so every block is a view, no
    block is made by copying, and no two blocks of ids below `ids` have the same bytes
    (identical-bytes deduplication in the drive never merges them; ids past it wrap)."""

    def __init__(self, model: ModelConfig, seed: int = 0, ids: int = 1 << 16):
        if ids < 1:
            raise ValueError(f"ids must be positive, got {ids}")
        self.shape = model.block_shape().array_shape
        self._n = int(np.prod(self.shape))
        self.ids = ids
        self.values = (np.random.default_rng(seed).standard_normal(self._n + ids - 1)
                       .astype(np.float16).view(np.uint16))

    def place(self, mem: np.ndarray) -> None:
        """Keep the sequence in mem (uint16, its size: a registered buffer, so that blocks
        reach the drive from where they lie)."""
        if mem.dtype != np.uint16 or mem.shape != self.values.shape:
            raise ValueError(f"the sequence needs {self.values.size} uint16 values")
        mem[:] = self.values
        self.values = mem

    def start(self, hash_id: int) -> int:
        """Where block hash_id starts in the sequence."""
        return hash_id % self.ids

    def window(self, hash_id: int) -> np.ndarray:
        """Block hash_id (the block's shape, uint16): a view of the sequence, not to be
        written."""
        at = self.start(hash_id)
        return self.values[at:at + self._n].reshape(self.shape)

    def block(self, hash_id: int) -> np.ndarray:
        """Block hash_id, a copy of its own."""
        return self.window(hash_id).copy()

    def sample(self, hash_id: int, index: np.ndarray) -> np.ndarray:
        """Elements `index` (flat) of block hash_id."""
        return self.values[self.start(hash_id) + index]

    def describe(self) -> dict:
        return {"source": "synthetic", "what": "Gaussian fp16, block b the window at value b",
                "distinct_ids": self.ids}
