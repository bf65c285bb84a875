"""A streaming reader of Mooncake JSONL traces that validates every line."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass

BLOCK_TOKENS = 512
SAMPLE = pathlib.Path(__file__).resolve().parent / "mooncake_synthetic_trace.jsonl"


class TraceError(ValueError):
    """A line that is not a valid request; names the file and the line."""

    def __init__(self, path: str, line: int, reason: str):
        self.path, self.line, self.reason = path, line, reason
        super().__init__(f"{path}:{line}: {reason}")


@dataclass(frozen=True)
class Request:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _parse(text: str) -> Request:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in obj:
            raise ValueError(f"missing {key!r}")
    ts, n_in, n_out, ids = obj["timestamp"], obj["input_length"], obj["output_length"], \
        obj["hash_ids"]
    for name, v in (("timestamp", ts), ("input_length", n_in), ("output_length", n_out)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool)
                                            and h >= 0 for h in ids):
        raise ValueError("hash_ids must be a list of non-negative integers")
    if len(ids) != -(-n_in // BLOCK_TOKENS):
        raise ValueError(f"{len(ids)} hash_ids for {n_in} input tokens "
                         f"(expected ceil({n_in} / {BLOCK_TOKENS}))")
    return Request(ts, n_in, n_out, tuple(ids))


class TraceReader:
    """Iterate requests from a file.  A bad line raises TraceError, or with skip_bad is
    skipped and counted in `skipped`.  Timestamps must not go backwards."""

    def __init__(self, path: str | pathlib.Path, skip_bad: bool = False):
        self.path = str(path)
        self.skip_bad = skip_bad
        self.skipped = 0
        self.read = 0

    def __iter__(self) -> Iterator[Request]:
        last_ts = -1
        try:
            f = open(self.path, "rb")  # decoded line by line: a bad byte is that line's error
        except OSError as e:
            raise TraceError(self.path, 0, f"cannot open: {e.strerror}") from None
        with f:
            for n, raw in enumerate(f, start=1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    if self.skip_bad:
                        self.skipped += 1
                        continue
                    raise TraceError(self.path, n, f"not UTF-8 (byte {e.start + 1})") from None
                if not text.strip():
                    continue
                try:
                    req = _parse(text)
                    if req.timestamp_ms < last_ts:
                        raise ValueError(f"timestamp {req.timestamp_ms} goes back "
                                         f"(previous {last_ts})")
                except ValueError as e:
                    if self.skip_bad:
                        self.skipped += 1
                        continue
                    raise TraceError(self.path, n, str(e)) from None
                last_ts = req.timestamp_ms
                self.read += 1
                yield req
