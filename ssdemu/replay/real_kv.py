"""Data mode's blocks as a real model's KV of real text (`replay --mode data --model
smollm2-135m`): what the drive quantizes, deduplicates and reads back is what the model made.

SyntheticKV's contract (ssdemu/replay/serving.py): block b is a window of one sequence held
in one registered buffer, so that no block is made by copying.  Here the sequence is the
model's KV over the corpus (ssdemu/llm/corpus_kv.py), token rows one after another, and a
window is BLOCK_TOKENS consecutive tokens inside one prefilled chunk (a block is a real run of
one sequence, never two chunks' halves): CHUNK - BLOCK_TOKENS + 1 windows a chunk, each a
distinct block.  Chunks are made as the trace's distinct ids need them, at most MAX_CHUNKS;
ids past the windows wrap onto earlier ones (the drive then deduplicates their bytes): the
report says how many did."""

from __future__ import annotations

import numpy as np

from ssdemu.llm.corpus_kv import CHUNK, CorpusKV
from ssdemu.replay.serving import BLOCK_TOKENS, ModelConfig, SyntheticKV

MAX_CHUNKS = 16  # 768 MB of SmolLM2's KV in the registered sequence, 24,592 windows
REAL_MODELS = ("smollm2-135m",)  # configs with a real model in the box (ssdemu.llm)
PER_CHUNK = CHUNK - BLOCK_TOKENS + 1


class RealKV(SyntheticKV):
    def __init__(self, model: ModelConfig, ids: int = 1 << 16, model_path: str | None = None,
                 progress=None):
        if ids < 1:
            raise ValueError(f"ids must be positive, got {ids}")
        if model.name not in REAL_MODELS:
            raise ValueError(f"real KV comes from a model in the box ({', '.join(REAL_MODELS)}),"
                             f" not {model.name!r}")
        corpus = CorpusKV(model_path)
        c = corpus.cfg
        if (c.layers, c.kv_heads, c.head_dim) != (model.layers, model.kv_heads, model.head_dim):
            raise ValueError(f"the model file's KV ({c.layers} layers x {c.kv_heads} heads x "
                             f"{c.head_dim}) is not {model.name}'s")
        self.shape = model.block_shape().array_shape
        self._n = int(np.prod(self.shape))
        self._row = self._n // BLOCK_TOKENS  # elements a token
        self.ids = ids
        n = min(MAX_CHUNKS, corpus.chunks, -(-ids // PER_CHUNK))
        self.chunks = n
        self.windows = n * PER_CHUNK
        self.wrapped = max(0, ids - self.windows)
        self.values = np.empty(n * CHUNK * self._row, np.uint16)
        for i in range(n):
            kv = corpus.chunk(i).view(np.uint16).reshape(-1)
            self.values[i * kv.size:(i + 1) * kv.size] = kv
            if progress is not None:
                progress(i + 1, n)

    def start(self, hash_id: int) -> int:
        w = hash_id % self.windows
        return ((w // PER_CHUNK) * CHUNK + w % PER_CHUNK) * self._row

    def describe(self) -> dict:
        return {"source": "real", "text": "Debian's licence texts (/usr/share/common-licenses)",
                "chunks": self.chunks, "chunk_tokens": CHUNK, "windows": self.windows,
                "distinct_ids": self.ids, "wrapped_ids": self.wrapped}
