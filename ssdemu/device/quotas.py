"""What one uid may hold of the device, whatever its connections and owner keys: queue pairs,
registered buffers and their bytes, commands in flight, namespaces and their bytes, pinned
keys.  A
quota is a uid's because the uid is what the kernel vouches for: a client can open more
connections and mint more owner keys at will.  By default each is three quarters of what
the device has, so that one user can drive the whole drive hard and a quarter always
remains for the others.  Pure: the daemon counts, this decides."""

from __future__ import annotations

from dataclasses import dataclass, replace

SHARE = 0.75  # of each resource, one uid's by default
# Pins have no device-wide limit to take a share of (a record is 40 bytes of the daemon's
# memory, hashed, so many pins cost no one else time): a uid may hold this many pinned keys,
# 2.6 MB of records, far more than LMCache pins at once (a chunk per hit while it loads).
PINS = 65536


class QuotaExceeded(Exception):
    """A request past its uid's quota; the message says which, in one line."""


@dataclass(frozen=True)
class Quotas:
    """None: the default share of the device (`resolve`); buffer_bytes None or 0: no limit
    (the pages are the client's own memfds, charged to its memory cgroup, not the
    daemon's)."""

    queue_pairs: int | None = None
    buffers: int | None = None
    buffer_bytes: int | None = None
    inflight: int | None = None
    namespaces: int | None = None
    namespace_bytes: int | None = None
    pins: int | None = None

    def resolve(self, *, queue_pairs: int, buffers: int, io_depth: int, namespaces: int,
                data_bytes: int) -> Quotas:
        """Defaults filled in from what the device has."""
        def share(n: int) -> int:
            return max(1, int(n * SHARE))
        return replace(
            self,
            queue_pairs=self.queue_pairs or share(queue_pairs),
            buffers=self.buffers or share(buffers),
            buffer_bytes=self.buffer_bytes or 0,
            inflight=self.inflight or share(io_depth),
            namespaces=self.namespaces or share(namespaces),
            namespace_bytes=self.namespace_bytes or share(data_bytes),
            pins=self.pins or PINS)

    def as_dict(self) -> dict:
        return {"queue_pairs": self.queue_pairs, "buffers": self.buffers,
                "buffer_bytes": self.buffer_bytes, "inflight": self.inflight,
                "namespaces": self.namespaces, "namespace_bytes": self.namespace_bytes,
                "pins": self.pins}


@dataclass
class Usage:
    """What one uid holds now."""

    queue_pairs: int = 0
    buffers: int = 0
    buffer_bytes: int = 0
    namespaces: int = 0
    namespace_bytes: int = 0


FLAGS = {"queue_pairs": "--max-queue-pairs-per-uid", "buffers": "--max-buffers-per-uid",
         "buffer_bytes": "--max-buffer-bytes-per-uid",
         "namespaces": "--max-namespaces-per-uid",
         "namespace_bytes": "--max-namespace-bytes-per-uid"}
WHAT = {"queue_pairs": "queue pairs", "buffers": "registered buffers",
        "buffer_bytes": "bytes of registered buffers", "namespaces": "namespaces",
        "namespace_bytes": "bytes of namespaces"}


def refusal(q: Quotas, uid: int, used: Usage, kind: str, more: int = 1) -> str | None:
    """The one-line reason uid may not take `more` of `kind`, or None when it may."""
    limit = getattr(q, kind)
    have = getattr(used, kind)
    if not limit or have + more <= limit:
        return None
    return (f"uid {uid} holds {have:,} of its quota of {limit:,} {WHAT[kind]} (over all its "
            f"connections; serve {FLAGS[kind]})")
