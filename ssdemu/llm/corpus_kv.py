"""Real KV of real text: the model's post-RoPE keys and values over the licence texts every
Debian system ships (/usr/share/common-licenses, from base-files: ~52K tokens), for data mode's
blocks (ssdemu/replay/real_kv.py).

The texts (each regular file once, by name) are tokenized as one stream and cut into
CHUNK-token chunks, each prefilled on its own (positions 0..CHUNK-1, the model's own context
in a serving engine's chunk); a chunk's KV is (CHUNK, 2, layers, kv_heads, head_dim) fp16,
the drive's block layout.  A chunk takes ~13 s to prefill here, so each is kept in the user's
cache (~/.cache/ssdemu/real-kv, 47 MB a chunk for SmolLM2), named by the model file's name
and size, the texts' hash and the chunk's number."""

from __future__ import annotations

import hashlib
import os
import pathlib

import numpy as np

LICENSES = pathlib.Path("/usr/share/common-licenses")
CHUNK = 2048


def corpus_text(root: pathlib.Path = LICENSES) -> str:
    files = sorted(p for p in root.iterdir() if p.is_file() and not p.is_symlink())
    if not files:
        raise FileNotFoundError(f"no texts in {root} (Debian's base-files ships them)")
    return "\n\n".join(p.read_text(errors="replace") for p in files)


def cache_dir() -> pathlib.Path:
    home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return pathlib.Path(home) / "ssdemu" / "real-kv"


class CorpusKV:
    """The model and the corpus' tokens; chunk(i) is chunk i's KV (made or from the cache)."""

    def __init__(self, model_path: str | None = None, root: pathlib.Path = LICENSES):
        from ssdemu.llm.gguf_model import default_path, load

        self.cfg, self._weights, tok = load(model_path)
        self._model = None  # made for the first chunk not in the cache
        text = corpus_text(root)
        self.tokens = tok.encode(text)
        self.chunks = len(self.tokens) // CHUNK
        path = pathlib.Path(model_path or default_path())
        tag = hashlib.sha256(f"{path.name}:{path.stat().st_size}:{CHUNK}:".encode()
                             + text.encode()).hexdigest()[:16]
        self._stem = f"{self.cfg.name.replace(' ', '_')}-{tag}"

    @property
    def model(self):
        from ssdemu.llm.forward import Llama

        if self._model is None:
            self._model = Llama(self.cfg, self._weights)
        return self._model

    @property
    def shape(self) -> tuple[int, ...]:
        c = self.cfg
        return (CHUNK, 2, c.layers, c.kv_heads, c.head_dim)

    def chunk(self, i: int) -> np.ndarray:
        """Chunk i's KV, fp16 (CHUNK, 2, layers, kv_heads, head_dim)."""
        from ssdemu.llm.forward import KVCache

        if not 0 <= i < self.chunks:
            raise ValueError(f"the corpus has {self.chunks} chunks of {CHUNK} tokens, not {i + 1}")
        path = cache_dir() / f"{self._stem}-{i}.npy"
        try:
            kv = np.load(path, allow_pickle=False)
            if kv.shape == self.shape and kv.dtype == np.float16:
                return kv
        except (OSError, ValueError):
            pass
        cache = KVCache(self.cfg, np.float16)
        self.model.prefill(self.tokens[i * CHUNK:(i + 1) * CHUNK], cache=cache, last_only=True)
        kv = np.stack([np.stack(cache.k, axis=1), np.stack(cache.v, axis=1)], axis=1)
        kv = kv.astype(np.float16)  # exact: the cache holds fp16 values
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                np.save(f, kv)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home: made again next time
        return kv
