"""What the firmware's kernels cost on the emulated device, and the TOPS budget that turns
those costs into device time.

Every kernel declares its cost as formulas of its input shape: `ops` (elementary integer or
floating-point operations, the unit of TOPS) and `bytes` (what it reads and writes in device
memory).  The formulas count the work of the algorithm as written in firmware/, per element
or per block:

- quantize, int / KIVI: 8 ops per element (convert, min, max, subtract, multiply, add,
  round, store) + 6 per group (scale, reciprocal, zero point), KIVI + 1 per element
  (transpose); bytes = input + compressed output.
- dequantize, int / KIVI: 4 per element (unpack, multiply, add, convert) + 1 per group;
  bytes = compressed input + output.
- quantize, fp8: 7 per element (convert, abs, max, multiply, clamp, round, sign) + 2 per
  scale; dequantize, fp8: 3 per element (table lookup, multiply, convert).
- prefix hash: 1,400 per 128-byte BLAKE2b compression (12 rounds x 8 G functions x 14 ops,
  plus setup and finalisation); bytes = message + 16 per key.
- prefix match: 20 per key probed (mix 10, compare 4, step and test 6); 48 bytes per key
  (the key and a 32-byte slot).
- index insert: 40 per key (probe, slot and LRU updates); 112 bytes per key.

The budget (`TopsBudget`) holds a profile's figures: TOPS, compute units and device-memory
bandwidth.  One call runs on the compute unit that frees up first:
start = max(submit time, unit's busy-until), device time = max(ops / per-unit rate,
bytes / memory bandwidth), busy-until = start + device time.  Memory bandwidth is not split
between units: a simplification that over-estimates throughput when every unit streams at
once.  Each call also records the host time the real kernel took, so that the daemon can
tell when this host is slower than the device it emulates (`host_lag_calls`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from firmware.quant import Scheme, parse_scheme


@dataclass(frozen=True)
class KernelCost:
    ops: int
    bytes: int

    def __post_init__(self):
        if self.ops <= 0 or self.bytes <= 0:
            # a kernel charged nothing would run in zero device time: always a bug
            raise ValueError(f"a kernel cost must be positive, got {self}")


def _groups(n: int, group: int) -> int:
    return (n + group - 1) // group


def quantize_cost(elements: int, element_bytes: int, scheme: Scheme | str,
                  compressed_bytes: int) -> KernelCost:
    s = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    if s.kind == "fp8":
        ops = 7 * elements + 2
    else:
        ops = 8 * elements + 6 * _groups(elements, s.group)
        if s.kind == "kivi":
            ops += elements
    return KernelCost(ops, elements * element_bytes + compressed_bytes)


def dequantize_cost(elements: int, element_bytes: int, scheme: Scheme | str,
                    compressed_bytes: int) -> KernelCost:
    s = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    if s.kind == "fp8":
        ops = 3 * elements
    else:
        ops = 4 * elements + _groups(elements, s.group)
    return KernelCost(ops, elements * element_bytes + compressed_bytes)


def prefix_hash_cost(blocks: int, block_tokens: int) -> KernelCost:
    message = 16 + 4 * block_tokens
    compressions = (message + 127) // 128
    return KernelCost(blocks * compressions * 1400, blocks * (message + 16))


def prefix_match_cost(keys_probed: int) -> KernelCost:
    return KernelCost(20 * keys_probed, 48 * keys_probed)


def index_insert_cost(keys: int) -> KernelCost:
    return KernelCost(40 * keys, 112 * keys)


# every kernel the firmware runs, with an example shape, so tests can check them all
KERNELS = {
    "quantize": lambda: quantize_cost(4096, 2, "int8_g64", 4096 + 512),
    "dequantize": lambda: dequantize_cost(4096, 2, "int8_g64", 4096 + 512),
    "prefix_hash": lambda: prefix_hash_cost(1, 16),
    "prefix_match": lambda: prefix_match_cost(1),
    "index_insert": lambda: index_insert_cost(1),
}


@dataclass(frozen=True)
class ComputeProfile:
    tops: float
    compute_units: int
    device_memory_bytes_per_s: float

    def __post_init__(self):
        if self.tops <= 0 or self.compute_units <= 0 or self.device_memory_bytes_per_s <= 0:
            raise ValueError(f"compute profile figures must be positive: {self}")


@dataclass
class KernelStats:
    calls: int = 0
    ops: int = 0
    bytes: int = 0
    device_ns: float = 0.0
    host_ns: float = 0.0
    host_lag_calls: int = 0  # calls whose real host time exceeded their device time


@dataclass
class TopsBudget:
    """Busy-until time per compute unit; device time per kernel call (see the module doc)."""

    profile: ComputeProfile
    busy_until_ns: list[float] = field(default_factory=list)
    busy_ns: list[float] = field(default_factory=list)
    kernels: dict[str, KernelStats] = field(default_factory=dict)

    def __post_init__(self):
        units = self.profile.compute_units
        self.busy_until_ns = [0.0] * units
        self.busy_ns = [0.0] * units
        self.unit_ops_per_ns = self.profile.tops * 1e12 / units / 1e9
        self.memory_bytes_per_ns = self.profile.device_memory_bytes_per_s / 1e9

    def device_ns(self, cost: KernelCost) -> float:
        return max(cost.ops / self.unit_ops_per_ns, cost.bytes / self.memory_bytes_per_ns)

    def charge(self, kernel: str, cost: KernelCost, submit_ns: float,
               host_ns: float = 0.0) -> tuple[float, float]:
        """Account one call submitted at submit_ns (device clock); returns (start, done)."""
        unit = min(range(len(self.busy_until_ns)), key=self.busy_until_ns.__getitem__)
        start = max(submit_ns, self.busy_until_ns[unit])
        duration = self.device_ns(cost)
        done = start + duration
        self.busy_until_ns[unit] = done
        self.busy_ns[unit] += duration
        st = self.kernels.setdefault(kernel, KernelStats())
        st.calls += 1
        st.ops += cost.ops
        st.bytes += cost.bytes
        st.device_ns += duration
        st.host_ns += host_ns
        if host_ns > duration:
            st.host_lag_calls += 1
        return start, done

    def run(self, kernel: str, cost: KernelCost, submit_ns: float, fn, *args):
        """Run a real kernel, time it on the host, charge it; returns (result, done_ns)."""
        t0 = time.perf_counter_ns()
        result = fn(*args)
        _, done = self.charge(kernel, cost, submit_ns, float(time.perf_counter_ns() - t0))
        return result, done

    def utilization(self, elapsed_ns: float) -> float:
        """Busy unit-time over available unit-time since the clock's origin."""
        if elapsed_ns <= 0:
            return 0.0
        return sum(self.busy_ns) / (elapsed_ns * len(self.busy_ns))

    @property
    def host_lag_calls(self) -> int:
        return sum(s.host_lag_calls for s in self.kernels.values())
