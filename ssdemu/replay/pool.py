"""Several serving instances and several drives in one replay: where a block lives in a pool
(consistent hashing), which instance a request goes to, and the fabric between nodes.  Pure
logic apart from the fabric's resources, which are the timing model's own (c/model)."""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import dataclass

from ssdemu.replay.serving import drive_key
from ssdemu.sim.timing import Resource

POOLS = ("private", "pooled")
ROUTES = ("round-robin", "prefix")
RING_POINTS_PER_DRIVE = 256  # virtual nodes: 256 keep the drives' shares within ~20% (64: 50%)


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class HashRing:
    """Consistent hashing of block keys onto n drives (as Mooncake's store and Dynamo place
    objects): each drive owns RING_POINTS_PER_DRIVE points of a 64-bit ring, a key belongs
    to the drive owning the first point at or after the key's hash.  Adding a drive moves
    only the keys that fall to the new one's points."""

    def __init__(self, drives: int, points_per_drive: int = RING_POINTS_PER_DRIVE):
        if drives < 1:
            raise ValueError(f"a pool needs at least one drive, got {drives}")
        ring = sorted((_hash64(f"drive-{d}-point-{p}".encode()), d)
                      for d in range(drives) for p in range(points_per_drive))
        self._points = [h for h, _ in ring]
        self._owners = [d for _, d in ring]
        self.drives = drives
        self._home: dict[int, int] = {}  # block id -> drive, cached: ids repeat a lot

    def home(self, block: int) -> int:
        d = self._home.get(block)
        if d is None:
            if self.drives == 1:
                d = 0
            else:
                i = bisect.bisect_left(self._points, _hash64(drive_key(block)))
                d = self._owners[i % len(self._points)]
            self._home[block] = d
        return d


# RDMA-like defaults: a 200 Gb/s HDR InfiniBand / RoCE NIC per node (NVIDIA ConnectX-6
# datasheet: 200 Gb/s, ~25 GB/s of payload) and a few microseconds per one-sided transfer
# (ConnectX-6: sub-600 ns port to port; ~2-5 us verb to completion in perftest runs; 5 us
# here, the slow end, so that the fabric does not flatter the pool).
DEFAULT_FABRIC_BYTES_PER_S = 25e9
DEFAULT_FABRIC_LATENCY_NS = 5_000.0


@dataclass(frozen=True)
class FabricSpec:
    bytes_per_s: float = DEFAULT_FABRIC_BYTES_PER_S
    latency_ns: float = DEFAULT_FABRIC_LATENCY_NS


def parse_fabric(text: str) -> FabricSpec:
    """'GBYTES_PER_S,LATENCY_US' (e.g. '25,5': 25 GB/s per node, 5 us per transfer)."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*,\s*([0-9.]+(?:e[0-9]+)?)\s*", str(text))
    if not m:
        raise ValueError(f"bad fabric {text!r}: expected GB_PER_S,LATENCY_US, e.g. 25,5")
    gbps, lat_us = float(m[1]), float(m[2])
    if gbps <= 0:
        raise ValueError(f"bad fabric {text!r}: the bandwidth must be positive")
    return FabricSpec(gbps * 1e9, lat_us * 1e3)


class Fabric:
    """The network between the nodes of a pool: each node's NIC sends and receives at the
    spec's bandwidth (full duplex, as RDMA NICs are); a transfer holds the sender's egress and
    the receiver's ingress for its bytes (a busy NIC at either end delays it) and arrives one
    latency after both."""

    def __init__(self, nodes: int, spec: FabricSpec):
        self.spec = spec
        self._ns_per_byte = 1e9 / spec.bytes_per_s
        self._egress = [Resource() for _ in range(nodes)]
        self._ingress = [Resource() for _ in range(nodes)]
        self.bytes = 0
        self.transfers = 0

    def move(self, src: int, dst: int, ready_ns: float, nbytes: int) -> float:
        """nbytes from node src to node dst, ready at ready_ns: when they have arrived."""
        if src == dst:
            return ready_ns
        self.bytes += nbytes
        self.transfers += 1
        d = nbytes * self._ns_per_byte
        out = self._egress[src].hold(ready_ns, d)
        into = self._ingress[dst].hold(ready_ns, d)
        return max(out, into) + self.spec.latency_ns

    def forget_before(self, t_ns: float) -> None:
        """Transfers are never ready before the latest arrival: older idle gaps go."""
        for r in self._egress + self._ingress:
            r.forget_before(t_ns)
