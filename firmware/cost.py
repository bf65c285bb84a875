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

The formulas and the budget are defined once, in C (c/sde_budget.c), where the daemon's
data plane charges them; this module is their Python face, for model-mode replay, reports and
tests.  The budget holds a profile's figures: TOPS, compute units and device-memory
bandwidth.  One call runs on the compute unit that frees up first: start = max(submit time,
unit's busy-until), device time = max(ops / per-unit rate, bytes / memory bandwidth),
busy-until = start + device time.  Memory bandwidth is not split between units: a
simplification that over-estimates throughput when every unit streams at once.  Each call
also records the host time the real kernel took, so that the daemon can tell when this host
is slower than the device it emulates (`host_lag_calls`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from firmware.quant import Scheme, parse_scheme
from ssdemu import _engine

ffi, lib = _engine.ffi, _engine.lib


@dataclass(frozen=True)
class KernelCost:
    ops: int
    bytes: int

    def __post_init__(self):
        if self.ops <= 0 or self.bytes <= 0:
            # a kernel charged nothing would run in zero device time: always a bug
            raise ValueError(f"a kernel cost must be positive, got {self}")


def _cost(c) -> KernelCost:
    return KernelCost(int(c.ops), int(c.bytes))


def _scheme(scheme: Scheme | str) -> tuple[int, int]:
    s = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    kind = {"int": lib.SDE_SCHEME_INT, "kivi": lib.SDE_SCHEME_KIVI, "fp8": lib.SDE_SCHEME_FP8}
    return kind[s.kind], s.group


def quantize_cost(elements: int, element_bytes: int, scheme: Scheme | str,
                  compressed_bytes: int) -> KernelCost:
    return _cost(lib.sde_cost_quantize(elements, element_bytes, *_scheme(scheme),
                                       compressed_bytes))


def dequantize_cost(elements: int, element_bytes: int, scheme: Scheme | str,
                    compressed_bytes: int) -> KernelCost:
    return _cost(lib.sde_cost_dequantize(elements, element_bytes, *_scheme(scheme),
                                         compressed_bytes))


def prefix_hash_cost(blocks: int, block_tokens: int) -> KernelCost:
    return _cost(lib.sde_cost_prefix_hash(blocks, block_tokens))


def prefix_match_cost(keys_probed: int) -> KernelCost:
    return _cost(lib.sde_cost_prefix_match(keys_probed))


def index_insert_cost(keys: int) -> KernelCost:
    return _cost(lib.sde_cost_index_insert(keys))


# every kernel the firmware runs, with an example shape, so tests can check them all; the
# order is the C side's kernel numbering (SDE_KERNEL_*)
KERNELS = {
    "quantize": lambda: quantize_cost(4096, 2, "int8_g64", 4096 + 512),
    "dequantize": lambda: dequantize_cost(4096, 2, "int8_g64", 4096 + 512),
    "prefix_hash": lambda: prefix_hash_cost(1, 16),
    "prefix_match": lambda: prefix_match_cost(1),
    "index_insert": lambda: index_insert_cost(1),
}
KERNEL_IDS = {"quantize": lib.SDE_KERNEL_QUANTIZE, "dequantize": lib.SDE_KERNEL_DEQUANTIZE,
              "prefix_hash": lib.SDE_KERNEL_PREFIX_HASH,
              "prefix_match": lib.SDE_KERNEL_PREFIX_MATCH,
              "index_insert": lib.SDE_KERNEL_INDEX_INSERT}
assert len(KERNEL_IDS) == lib.SDE_NKERNELS


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


def kernel_stats(b) -> dict[str, KernelStats]:
    """The per-kernel counters of a C budget (an sde_budget), for kernels called at least
    once."""
    out = {}
    for name, i in KERNEL_IDS.items():
        k = b.kernels[i]
        if k.calls:
            out[name] = KernelStats(k.calls, k.ops, k.bytes, k.device_ns, k.host_ns,
                                    k.host_lag_calls)
    return out


class TopsBudget:
    """Busy-until time per compute unit; device time per kernel call (see the module doc):
    the C budget (c/sde_budget.c) the daemon charges, held here for model-mode replay."""

    def __init__(self, profile: ComputeProfile):
        self.profile = profile
        self._b = ffi.new("sde_budget *")
        r = lib.sde_budget_init(self._b, profile.tops, profile.compute_units,
                                profile.device_memory_bytes_per_s)
        if r < 0:
            raise ValueError(f"compute profile figures must be positive and finite, with 1 to "
                             f"{lib.SDE_MAX_UNITS} units: {profile}")

    @property
    def busy_until_ns(self) -> list[float]:
        return list(self._b.busy_until_ns[0:self._b.units])

    @property
    def busy_ns(self) -> list[float]:
        return list(self._b.busy_ns[0:self._b.units])

    @property
    def kernels(self) -> dict[str, KernelStats]:
        return kernel_stats(self._b)

    def device_ns(self, cost: KernelCost) -> float:
        return lib.sde_budget_device_ns(self._b, (cost.ops, cost.bytes))

    def charge(self, kernel: str, cost: KernelCost, submit_ns: float,
               host_ns: float = 0.0) -> tuple[float, float]:
        """Account one call submitted at submit_ns (device clock); returns (start, done)."""
        start = ffi.new("double *")
        done = lib.sde_budget_charge(self._b, KERNEL_IDS[kernel], (cost.ops, cost.bytes),
                                     submit_ns, host_ns, start)
        return start[0], done

    def run(self, kernel: str, cost: KernelCost, submit_ns: float, fn, *args):
        """Run a real kernel, time it on the host, charge it; returns (result, done_ns)."""
        t0 = time.perf_counter_ns()
        result = fn(*args)
        _, done = self.charge(kernel, cost, submit_ns, float(time.perf_counter_ns() - t0))
        return result, done

    def utilization(self, elapsed_ns: float) -> float:
        """Busy unit-time over available unit-time since the clock's origin."""
        return lib.sde_budget_utilization(self._b, elapsed_ns)

    @property
    def host_lag_calls(self) -> int:
        return sum(s.host_lag_calls for s in self.kernels.values())
