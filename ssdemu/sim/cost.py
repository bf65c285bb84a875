"""What the firmware's kernels cost on the emulated device, and the budget that turns
those costs into device time.

Every kernel declares its cost as formulas of its input shape, by the class of hardware a
controller runs it on (c/model/sde_budget.h): `ops`, scalar operations on an embedded core
(hashing, bookkeeping); `vector_ops`, element-wise operations on the cores' SIMD lanes
(quantizing, packing); `mac_ops`, multiply-accumulates on the MAC array the TOPS rating counts
(retrieval's scoring and attention), two ops each as TOPS ratings count them (a multiply and an
add); `probes`, dependent probes of a table in
the controller's DRAM; and `bytes`, what the kernel reads and writes in that DRAM.  The
formulas count the work of the algorithm as written in firmware/, per element or per block:

- quantize, int / KIVI: 8 vector ops per element (convert, min, max, subtract, multiply, add,
  round, store) + 6 per group (scale, reciprocal, zero point), KIVI + 1 per element
  (transpose); bytes = input + compressed output.
- dequantize, int / KIVI: 4 vector ops per element (unpack, multiply, add, convert) + 1 per
  group; bytes = compressed input + output.
- quantize, fp8: 7 per element (convert, abs, max, multiply, clamp, round, sign) + 2 per
  scale; dequantize, fp8: 3 per element (table lookup, multiply, convert).
- prefix hash: 1,400 scalar ops per 128-byte BLAKE2b compression (12 rounds x 8 G functions
  x 14 ops, plus setup and finalisation); bytes = message + 16 per key.
- prefix match: 20 scalar ops per key probed (mix 10, compare 4, step and test 6) and one
  DRAM probe; 48 bytes per key (the key and a 32-byte slot).
- index insert: 40 scalar ops per key (probe, slot and LRU updates) and two probes; 112 bytes.

Retrieval (firmware/retrieval.py; H KV heads, G query heads each, D channels, P pages):
- summarize: 2 vector ops per key element (min, max), + 1 to convert a 16-bit element; int8
  summaries + 3 per summary byte (scale, divide, round outwards); bytes = keys + summaries.
  Summaries are per page, head and channel a min and a max in the block's element type (exact:
  a min of values is a value), or int8 codes + a float32 scale per page and head.
- score (Quest): sum_c max(q_c min_c, q_c max_c) = q+ . max + q- . min, two dot products per
  page and query head: 2 P H G D MACs; the largest over the group on the lanes; bytes = the
  summaries + the queries.
- top-k: a heap of k on a core: 3 ops per candidate + 8 per level of log2 k for each of the
  expected k (1 + ln(n / k)) candidates that enter it.
- re-rank: 1 MAC per key element per query head (q.k) + 12 vector ops per logit (scale, max,
  subtract, exp as an 8-op polynomial, accumulate); bytes = the candidates' keys.
- attend: 2 MACs per key element per query head (q.k, then p.v) + 12 vector ops per logit;
  bytes = the pages' K and V + the outputs.
Scoring moves ~1 summary byte per 2 H G D / (4 H D) = G/2 MACs: at 8 TOPS and 64 GB/s, the
DRAM binds unless about 125 / G queries share the summaries (a batch over one context).

The formulas and the budget are defined once, in C (c/model/sde_budget.c), where the daemon's
data plane charges them; this module is their Python face, for model-mode replay, reports and
tests; ssdemu.sim.timing.budget_of builds the budget from a profile.  A unit is an embedded core.
One call runs on the unit that frees up first: start = max(submit time, unit's busy-until);
compute = ops / core rate + vector_ops / (core rate x SIMD lanes) + mac_ops / (TOPS / units)
+ probes x probe latency; its bytes go through the controller's DRAM, shared with the NAND
and PCIe DMA when the budget is tied to a timing model (share_dram); the call ends when both
are done.  Each call also records the host time the real kernel took, so that the daemon can
tell when this host is slower than the device it emulates (`host_lag_calls`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ssdemu.sim import _model

if TYPE_CHECKING:  # firmware.quant loads Numba: model mode parses names with firmware.sizes
    from firmware.quant import Scheme

ffi, lib = _model.ffi, _model.lib

# the retrieval kernels' costs are functions of their shapes alone, asked for by every
# command (each KV head's, each pass's): kept for this many shapes each
COST_CACHE = 4096


@dataclass(frozen=True)
class KernelCost:
    """By class of hardware: scalar ops on an embedded core, bytes in the DRAM, element-wise
    vector ops (simd_lanes at a time), MAC ops on the array the TOPS rating counts, and
    dependent DRAM probes."""
    ops: int
    bytes: int
    vector_ops: int = 0
    mac_ops: int = 0
    probes: int = 0

    def __post_init__(self):
        work = self.ops + self.vector_ops + self.mac_ops + self.probes
        if min(self.ops, self.vector_ops, self.mac_ops, self.probes) < 0 or work <= 0 \
                or self.bytes <= 0:
            # a kernel charged nothing would run in zero device time: always a bug
            raise ValueError(f"a kernel cost must be positive, got {self}")

    @property
    def total_ops(self) -> int:
        return self.ops + self.vector_ops + self.mac_ops

    def c(self):
        return {"ops": self.ops, "bytes": self.bytes, "vector_ops": self.vector_ops,
                "mac_ops": self.mac_ops, "probes": self.probes}


def _cost(c) -> KernelCost:
    return KernelCost(int(c.ops), int(c.bytes), int(c.vector_ops), int(c.mac_ops),
                      int(c.probes))


def _scheme(scheme: Scheme | str) -> tuple[int, int]:
    """(kind code, group) of a scheme or its name (firmware/sizes.py: plain Python, so
    that model mode's costs load no Numba)."""
    from firmware import sizes

    if isinstance(scheme, str):
        s = sizes.parse_scheme_name(scheme)
        if s is None:
            raise sizes.unknown_scheme(scheme)
        return sizes.kind_code(s["kind"]), s["group"]
    return sizes.kind_code(scheme.kind), scheme.group


def quantize_cost(elements: int, element_bytes: int, scheme: Scheme | str,
                  compressed_bytes: int) -> KernelCost:
    return _cost(lib.sde_cost_quantize(elements, element_bytes, *_scheme(scheme),
                                       compressed_bytes))


def dequantize_cost(elements: int, element_bytes: int, scheme: Scheme | str,
                    compressed_bytes: int) -> KernelCost:
    return _cost(lib.sde_cost_dequantize(elements, element_bytes, *_scheme(scheme),
                                         compressed_bytes))


def requantize_cost(elements: int, element_bytes: int, from_scheme: Scheme | str,
                    from_bytes: int, scheme: Scheme | str, compressed_bytes: int,
                    summary_nbytes: int = 0) -> KernelCost:
    """KV_REQUANTIZE: the stored block dequantized and quantized at the lower scheme, its
    page summaries (summary_nbytes of compressed_bytes) recomputed."""
    return _cost(lib.sde_cost_requantize(elements, element_bytes, *_scheme(from_scheme),
                                         from_bytes, *_scheme(scheme), compressed_bytes,
                                         summary_nbytes))


def prefix_hash_cost(blocks: int, block_tokens: int) -> KernelCost:
    return _cost(lib.sde_cost_prefix_hash(blocks, block_tokens))


def prefix_match_cost(keys_probed: int) -> KernelCost:
    return _cost(lib.sde_cost_prefix_match(keys_probed))


def index_insert_cost(keys: int) -> KernelCost:
    return _cost(lib.sde_cost_index_insert(keys))


def summary_bytes(pages: int, heads: int, head_dim: int, element_bytes: int = 2,
                  int8: bool = False) -> int:
    return int(lib.sde_summary_bytes(pages, heads, head_dim, element_bytes, int(int8)))


def store_summaries_cost(elements: int, element_bytes: int, scheme: Scheme | str,
                         compressed_bytes: int, summary_nbytes: int) -> KernelCost | None:
    """What a store with page summaries adds to its quantize (None: no summaries)."""
    if not summary_nbytes:
        return None
    return _cost(lib.sde_cost_store_summaries(elements, element_bytes, *_scheme(scheme),
                                              compressed_bytes, summary_nbytes))


def summarize_cost(tokens: int, heads: int, head_dim: int, element_bytes: int,
                   summary_nbytes: int, int8: bool = False) -> KernelCost:
    return _cost(lib.sde_cost_summarize(tokens, heads, head_dim, element_bytes, summary_nbytes,
                                        int(int8)))


@functools.lru_cache(maxsize=COST_CACHE)
def score_cost(pages: int, heads: int, group: int, head_dim: int,
               summary_nbytes: int) -> KernelCost:
    return _cost(lib.sde_cost_score(pages, heads, group, head_dim, summary_nbytes))


@functools.lru_cache(maxsize=COST_CACHE)
def selective_score_cost(pages: int, heads: int, group: int, head_dim: int,
                         channels: int) -> KernelCost:
    return _cost(lib.sde_cost_score_selective(pages, heads, group, head_dim, channels))


@functools.lru_cache(maxsize=COST_CACHE)
def topk_cost(candidates: int, k: int) -> KernelCost:
    return _cost(lib.sde_cost_topk(candidates, k))


@functools.lru_cache(maxsize=COST_CACHE)
def rerank_cost(tokens: int, pages: int, heads: int, group: int, head_dim: int,
                key_bytes: int) -> KernelCost:
    return _cost(lib.sde_cost_rerank(tokens, pages, heads, group, head_dim, key_bytes))


@functools.lru_cache(maxsize=COST_CACHE)
def attend_cost(tokens: int, heads: int, group: int, head_dim: int,
                kv_bytes: int) -> KernelCost:
    return _cost(lib.sde_cost_attend(tokens, heads, group, head_dim, kv_bytes))


# every kernel the firmware runs, with an example shape, so tests can check them all; the
# order is the C side's kernel numbering (SDE_KERNEL_*)
KERNELS = {
    "quantize": lambda: quantize_cost(4096, 2, "int8_g64", 4096 + 512),
    "dequantize": lambda: dequantize_cost(4096, 2, "int8_g64", 4096 + 512),
    "prefix_hash": lambda: prefix_hash_cost(1, 16),
    "prefix_match": lambda: prefix_match_cost(1),
    "index_insert": lambda: index_insert_cost(1),
    "summarize": lambda: summarize_cost(256, 8, 128, 2, summary_bytes(16, 8, 128)),
    "score": lambda: score_cost(64, 8, 4, 128, summary_bytes(64, 8, 128)),
    "topk": lambda: topk_cost(64, 8),
    "rerank": lambda: rerank_cost(256, 16, 1, 4, 128, 256 * 128 * 2),
    "attend": lambda: attend_cost(256, 1, 4, 128, 2 * 256 * 128 * 2),
    "requantize": lambda: requantize_cost(4096, 2, "int8_g64", 4096 + 512, "int4_g64",
                                          2048 + 512),
}
KERNEL_IDS = {"quantize": lib.SDE_KERNEL_QUANTIZE, "dequantize": lib.SDE_KERNEL_DEQUANTIZE,
              "prefix_hash": lib.SDE_KERNEL_PREFIX_HASH,
              "prefix_match": lib.SDE_KERNEL_PREFIX_MATCH,
              "index_insert": lib.SDE_KERNEL_INDEX_INSERT,
              "summarize": lib.SDE_KERNEL_SUMMARIZE, "score": lib.SDE_KERNEL_SCORE,
              "topk": lib.SDE_KERNEL_TOPK, "rerank": lib.SDE_KERNEL_RERANK,
              "attend": lib.SDE_KERNEL_ATTEND, "requantize": lib.SDE_KERNEL_REQUANTIZE}
assert len(KERNEL_IDS) == lib.SDE_NKERNELS


@dataclass(frozen=True)
class ComputeProfile:
    """The budget's figures: a profile's compute section (ssdemu/sim/profile.py declares
    them, with their sources in the profiles; timing.budget_of builds this from one)."""
    tops: float
    compute_units: int
    device_memory_bytes_per_s: float
    core_ops_per_s: float
    simd_lanes: int
    dram_probe_ns: float

    def __post_init__(self):
        if min(self.tops, self.compute_units, self.device_memory_bytes_per_s,
               self.core_ops_per_s, self.simd_lanes) <= 0 or self.dram_probe_ns < 0:
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
    the C budget (c/model/sde_budget.c) the daemon charges, held here for model-mode replay."""

    def __init__(self, profile: ComputeProfile):
        self.profile = profile
        self._b = ffi.new("sde_budget *")
        r = lib.sde_budget_init(self._b, profile.tops, profile.compute_units,
                                profile.device_memory_bytes_per_s, profile.core_ops_per_s,
                                profile.simd_lanes, profile.dram_probe_ns)
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

    def share_dram(self, model) -> None:
        """Book kernels' bytes on this timing model's DRAM (ssdemu.sim.timing.DeviceModel), where
        NAND and PCIe DMA book theirs."""
        self._dram_model = model  # kept alive as long as the budget uses it
        lib.sde_budget_share_dram(self._b, model._m)

    @property
    def struct(self):
        """The C budget, in this module's ffi (for the timing model's recipes)."""
        return self._b

    def copy_into(self, other_ffi):
        """A copy of the C budget in another cffi module built from the same header
        (c/model/sde_budget.h): the device's, whose data plane charges it."""
        size = ffi.sizeof("sde_budget")
        if other_ffi.sizeof("sde_budget") != size:
            raise RuntimeError("the device and the timing model disagree on sde_budget")
        out = other_ffi.new("sde_budget *")
        other_ffi.memmove(out, ffi.buffer(self._b, size), size)
        return out

    def device_ns(self, cost: KernelCost) -> float:
        """On an idle device (its DRAM uncontended)."""
        return lib.sde_budget_device_ns(self._b, cost.c())

    def mac_ns(self, cost: KernelCost) -> float:
        """The part of a call's compute its MAC ops take on the array."""
        return lib.sde_budget_mac_ns(self._b, cost.c())

    def charge(self, kernel: str, cost: KernelCost, submit_ns: float,
               host_ns: float = 0.0) -> tuple[float, float]:
        """Account one call submitted at submit_ns (device clock); returns (start, done)."""
        start = ffi.new("double *")
        done = lib.sde_budget_charge(self._b, KERNEL_IDS[kernel], cost.c(),
                                     submit_ns, host_ns, start)
        return start[0], done

    def charge_each(self, kernel: str, cost: KernelCost, submit_ns: float, n: int) -> float:
        """n calls of charge() at submit_ns (a kernel per KV head), in one C call: the
        latest end, or submit_ns for none."""
        return lib.sde_budget_charge_n(self._b, KERNEL_IDS[kernel], cost.c(), submit_ns, n)

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
