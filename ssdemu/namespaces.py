"""Namespace allocation over the media: first fit over byte extents (pure logic, no I/O).
Namespaces live in memory for now; the device issue makes them persistent."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Namespace:
    nsid: int
    start: int
    nbytes: int


class NamespaceTable:
    def __init__(self, media_bytes: int, block: int, max_ns: int):
        self.media_bytes = media_bytes - media_bytes % block
        self.block = block
        self.max_ns = max_ns
        self.by_id: dict[int, Namespace] = {}

    def create(self, nbytes: int) -> Namespace | None:
        """A new namespace of nbytes (a positive multiple of the block), or None when no free
        extent or id is left.  Raises ValueError for a bad size."""
        if nbytes <= 0 or nbytes % self.block:
            raise ValueError(f"namespace size must be a positive multiple of {self.block}")
        nsid = next((i for i in range(1, self.max_ns + 1) if i not in self.by_id), None)
        if nsid is None:
            return None
        cursor = 0
        for ns in sorted(self.by_id.values(), key=lambda n: n.start):
            if ns.start - cursor >= nbytes:
                break
            cursor = ns.start + ns.nbytes
        if self.media_bytes - cursor < nbytes:
            return None
        ns = Namespace(nsid, cursor, nbytes)
        self.by_id[nsid] = ns
        return ns

    def delete(self, nsid: int) -> bool:
        return self.by_id.pop(nsid, None) is not None

    def free_bytes(self) -> int:
        return self.media_bytes - sum(n.nbytes for n in self.by_id.values())
