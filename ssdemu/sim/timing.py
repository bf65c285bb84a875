"""The device timing model: pure functions over next-free times per resource, in the style
of NVMeVirt and FEMU.  The arithmetic is in C (c/model), once, so that the daemon's
data plane times every command at full speed; this module wraps it and adds the analytical
figures, the fixed-latency model, the virtual clock and a closed-loop driver.

A command's data moves at once; the model only computes when it would have completed on
the device the profile describes.  Nothing here does I/O or reads a clock: callers pass
times (ns) in and get times out.

Resources: controller cores, the NAND die-planes, the NAND channels, the host link, and the
compute units (ssdemu.sim.cost.TopsBudget).  Each has a next-free time; a stage on a resource
starts at max(ready, next_free) and holds it for its duration.  A read of N bytes at byte
offset o:

1. controller: on the core free first, for command_overhead_ns;
2. each NAND page it touches (pages striped channel-first: page p sits on channel p mod C,
   die (p div C) mod D, plane (p div C·D) mod P): the plane senses it for t_read_ns, then the
   channel moves the bytes wanted from it at channel_bytes_per_s;
3. the host link moves those bytes at bandwidth_bytes_per_s once the channel has them;
4. completion = the last byte over the link + latency_ns.

A write crosses the link first, then each page is moved over its channel and programmed
(t_prog_ns).  With the volatile write cache on, the completion comes when the data is in
the cache (after the link); the NAND work still occupies the dies and channels; without
it, the completion waits for the programs.  A flush completes when every die is idle.

`analytical()` gives the bottleneck figures the model must reproduce under load:
sequential read = min(link, channels × channel rate, planes × page / t_read, controller ×
transfer size); 4 KiB random read IOPS = min(link / 4 KiB, channels × channel rate / 4 KiB,
planes / t_read, cores / overhead).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass

from ssdemu.sim import _model
from ssdemu.sim.cost import ComputeProfile, TopsBudget
from ssdemu.sim.profile import Profile

ffi, lib = _model.ffi, _model.lib


def join_runs(offs, lens, page: int) -> int:
    """Runs of the media as the drive reads them (c/model/sde_model.h sde_runs_join): offs
    and lens (contiguous uint64 arrays of one length) sorted and joined in place; returns how
    many reads lead them."""
    if len(offs) != len(lens):
        raise ValueError("join_runs: offsets and lengths differ in number")
    n = lib.sde_runs_join(ffi.from_buffer("uint64_t[]", offs),
                          ffi.from_buffer("uint64_t[]", lens), len(offs), page)
    if n < 0:
        raise MemoryError("join_runs")
    return n


class Resource:
    """One resource of the C model alone (for tests of the gap rule)."""

    def __init__(self):
        self._r = ffi.gc(lib.sde_resource_new(), lib.sde_resource_free)

    def hold(self, ready: float, duration: float) -> float:
        return lib.sde_resource_hold(self._r, ready, duration)

    def forget_before(self, t: float) -> None:
        lib.sde_resource_forget_before(self._r, t)

    @property
    def gaps(self) -> int:
        return lib.sde_resource_gaps(self._r)

    @property
    def next_free(self) -> float:
        return lib.sde_resource_next_free(self._r)


def budget_of(profile: Profile) -> TopsBudget:
    """The firmware's budget from a profile: the one place it is built (the daemon copies it
    into its data plane; model-mode replay charges it)."""
    c = profile.compute
    return TopsBudget(ComputeProfile(c.tops, c.units, c.memory_bytes_per_s, c.core_ops_per_s,
                                     c.simd_lanes, c.dram_probe_ns))


def unloaded_latencies(profile: Profile) -> tuple[float, float, float]:
    """A 4 KiB read, a 4 KiB write and a NOP on an idle detailed model."""
    return (DeviceModel(profile).read(0.0, 0, 4096), DeviceModel(profile).write(0.0, 0, 4096),
            DeviceModel(profile).nop(0.0))


def default_bulk_pages(profile: Profile) -> int:
    """Transfers of a full stripe (a row on every die) or more take the model's bulk path.  The
    model's page is a die-row: a page on each of a die's planes, sensed or programmed at once."""
    n = profile.nand
    return n.channels * n.dies_per_channel


# The FTL at a declared scale: enough lines (superblocks) for greedy GC to choose among, and no
# more state than this machine holds comfortably (a 64 TB drive is 16G units of 4 KiB).
FTL_TARGET_LINES = 256
FTL_MAX_UNITS = 1 << 24  # 64 MiB of map each way; past 64 GiB the mapping unit grows


@dataclass(frozen=True)
class FtlScale:
    """How the FTL runs for a logical size: `logical_bytes` mapped (offsets wrap past it)
    in units of `unit_bytes` (4 KiB, or up to a die-row past 64 GiB); `lines` superblocks
    of `rows_per_die` multi-plane rows on every die; GC below `gc_free_lines` free ones;
    `scale` = logical / the profile's user capacity; `block_scale` = rows per die at scale /
    pages per real block (an erase is charged that share of tBERS, which keeps erase time
    per programmed byte); `overprovisioning` as modelled."""
    logical_bytes: int
    unit_bytes: int
    lines: int
    rows_per_die: int
    gc_free_lines: int
    scale: float
    block_scale: float
    overprovisioning: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def ftl_scale(profile: Profile, logical_bytes: int) -> FtlScale:
    """The FTL for `logical_bytes` of user space: the profile's over-provisioning, lines as
    many as FTL_TARGET_LINES allows with at least one row per die and at most a real block."""
    n = profile.nand
    row = n.page_bytes * n.planes_per_die
    unit = 4096
    while logical_bytes > FTL_MAX_UNITS * unit and unit * 2 <= row:
        unit *= 2
    logical_bytes = min(int(logical_bytes), FTL_MAX_UNITS * unit) // unit * unit
    if logical_bytes <= 0:
        raise ValueError("the FTL needs at least 4 KiB of logical space")
    dies = n.channels * n.dies_per_channel
    row_units = row // unit
    phys_units = logical_bytes // unit * (1 + profile.overprovisioning)
    rows = int(phys_units // (dies * row_units * FTL_TARGET_LINES))
    rows = max(1, min(n.pages_per_block, rows))
    upl = dies * row_units * rows
    gc_free = profile.ftl.gc_free_lines
    lines = max(math.ceil(phys_units / upl), -(-logical_bytes // unit // upl) + gc_free + 3)
    return FtlScale(logical_bytes, unit, lines, rows, gc_free,
                    logical_bytes / profile.ftl.user_capacity_bytes, rows / n.pages_per_block,
                    lines * upl * unit / logical_bytes - 1)


def model_params(profile: Profile, **kw):
    """The C model's parameters (an sde_model_params of this module's ffi)."""
    return ffi.new("sde_model_params *", model_param_fields(profile, **kw))


def model_param_fields(profile: Profile, fixed: bool = False, times=(None, None, None),
                       bulk_pages: int | None = None, ftl_bytes: int = 0,
                       dram: bool = True) -> dict:
    """The fields of sde_model_params (c/model/sde_model.h), by name: the daemon fills its
    own module's struct with them.  ftl_bytes: the FTL's logical size (0: no FTL, writes land
    where their offsets say); dram: model the controller's DRAM (shared by DMA and kernels)."""
    if bulk_pages is None:
        bulk_pages = default_bulk_pages(profile)
    ftl = ftl_scale(profile, ftl_bytes) if ftl_bytes else None
    if fixed:
        defaults = unloaded_latencies(profile)
        times = [t if t is not None else d for t, d in zip(times, defaults, strict=True)]
    else:
        times = (0.0, 0.0, 0.0)
    out = declared_model_params(profile)
    if not dram:
        out["dram_bytes_per_s"] = 0.0
    out.update({
        "fixed": int(fixed), "fixed_read_ns": times[0], "fixed_write_ns": times[1],
        "fixed_other_ns": times[2], "bulk_pages": bulk_pages,
        "ftl_logical_bytes": ftl.logical_bytes if ftl else 0,
        "ftl_unit_bytes": ftl.unit_bytes if ftl else 0,
        "ftl_lines": ftl.lines if ftl else 0, "ftl_rows_per_die": ftl.rows_per_die if ftl else 0,
        "ftl_gc_free_lines": ftl.gc_free_lines if ftl else 0,
        "ftl_erase_share": ftl.block_scale if ftl else 0.0})
    return out


def declared_model_params(profile: Profile) -> dict:
    """The sde_model_params fields a profile's parameters fill as they are, by their
    declarations (ssdemu/sim/profile.py `param(c=...)`): no field is mapped by hand."""
    out = {}
    for section in dataclasses.fields(profile):
        value = getattr(profile, section.name)
        if not dataclasses.is_dataclass(value):
            continue
        for f in dataclasses.fields(value):
            if f.metadata.get("c"):
                v = getattr(value, f.name)
                out[f.metadata["c"]] = int(v) if isinstance(v, bool) else v
    return out


class DeviceModel:
    """The detailed model of one profile (c/model, the one definition the daemon's data
    plane uses too)."""

    def __init__(self, profile: Profile, bulk_pages: int | None = None, ftl_bytes: int = 0,
                 dram: bool = True, threads: int = 1, params=None):
        """bulk_pages: transfers of this many pages or more are booked in bulk (0: never;
        default: a full stripe); ftl_bytes: the FTL's logical size (0: none); dram: model the
        controller's DRAM (the virtual-clock daemon does not: c/dev); threads: 2 books
        half of a batch's dies (the recipes' blocks of a request) on a helper thread, with
        identical results, on a host with two CPUs or more (c/model/sde_model.h); params:
        model_params(profile, ...) made once by a caller that makes many models of it (the
        C model copies them)."""
        if threads not in (1, 2):
            raise ValueError(f"the timing model runs on 1 or 2 threads, got {threads}")
        self.p = profile
        self.ftl = ftl_scale(profile, ftl_bytes) if ftl_bytes else None
        out = ffi.new("sde_model **")
        if params is None:
            params = model_params(profile, bulk_pages=bulk_pages, ftl_bytes=ftl_bytes,
                                  dram=dram)
        if lib.sde_model_new(params, out) < 0:
            raise ValueError(f"profile {profile.name} does not make a model")
        self._m = ffi.gc(out[0], lib.sde_model_free)
        lib.sde_model_set_threads(self._m, threads)

    @staticmethod
    def _check(t: float, submit: float) -> float:
        if t < 0:
            raise ValueError(f"submission at {submit} ns precedes an earlier one")
        return t

    def read(self, submit: float, offset: int, nbytes: int) -> float:
        return self._check(lib.sde_model_read(self._m, submit, offset, nbytes), submit)

    def write(self, submit: float, offset: int, nbytes: int) -> float:
        return self._check(lib.sde_model_write(self._m, submit, offset, nbytes), submit)

    def flush(self, submit: float) -> float:
        return self._check(lib.sde_model_flush(self._m, submit), submit)

    # the stages of commands the firmware transforms in between (c/model/sde_model.h)
    def sense(self, submit: float, offset: int, nbytes: int) -> float:
        """A read's NAND half: when the bytes are in the controller (no link)."""
        return self._check(lib.sde_model_sense(self._m, submit, offset, nbytes), submit)

    def sense_runs(self, submit: float, offs, lens) -> float:
        """sense() of each run submitted at `submit` (offs, lens: contiguous uint64 arrays of
        one length): the latest completion (submit when there are none)."""
        if len(offs) != len(lens):
            raise ValueError("sense_runs: offsets and lengths differ in number")
        return self._check(lib.sde_model_sense_runs(
            self._m, submit, ffi.from_buffer("uint64_t[]", offs),
            ffi.from_buffer("uint64_t[]", lens), len(offs)), submit)

    @property
    def handle(self):
        """The C model (for the recipes of c/model/sde_recipe.h)."""
        return self._m

    def receive(self, submit: float, nbytes: int) -> float:
        """A write's link half: when the bytes are in the controller (no NAND)."""
        return self._check(lib.sde_model_receive(self._m, submit, nbytes), submit)

    def transfer(self, ready: float, nbytes: int) -> float:
        """nbytes over the link from `ready` on, plus its latency."""
        return lib.sde_model_transfer(self._m, ready, nbytes)

    def program(self, ready: float, offset: int, nbytes: int) -> float:
        """nbytes from the controller programmed at offset from `ready` on."""
        return lib.sde_model_program(self._m, ready, offset, nbytes)

    def nop(self, submit: float) -> float:
        return self._check(lib.sde_model_nop(self._m, submit), submit)

    def closed_loop(self, op: str, qd: int, commands: int, nbytes: int, span: int,
                    seed: int = 0, start: float | None = None, marks: int = 0):
        """`qd` commands always in flight (in C: c/model/sde_model.h), sequential (seed 0) or
        uniformly random over [0, span).  Returns (last completion, the times by which each
        1/marks of the commands had completed)."""
        start = lib.sde_model_horizon(self._m) if start is None else start
        out = ffi.new("double[]", max(marks, 1))
        last = lib.sde_model_closed_loop(self._m, int(op == "write"), qd, commands, nbytes,
                                         span, seed, start, out, marks)
        if last < 0:
            raise ValueError("closed loop: bad arguments or a start before an earlier submission")
        return last, list(out)[:marks]

    def trim(self, offset: int, nbytes: int) -> None:
        """The whole 4 KiB units of the range are no longer valid (deallocate, KV delete)."""
        lib.sde_model_trim(self._m, offset, nbytes)

    def trim_many(self, offsets: list[int], nbytes: int) -> None:
        """trim() of each offset's nbytes, in order, in one call."""
        if offsets:
            lib.sde_model_trim_many(self._m, ffi.new("uint64_t[]", offsets), len(offsets),
                                    nbytes)

    def next_free_times(self) -> list[float]:
        n = lib.sde_model_next_free(self._m, ffi.NULL, 0)
        buf = ffi.new("double[]", n)
        lib.sde_model_next_free(self._m, buf, n)
        return list(buf)

    def stats(self) -> dict:
        st = ffi.new("sde_model_stats *")
        lib.sde_model_get_stats(self._m, st)
        return {name: getattr(st, name) for name, _ in ffi.typeof("sde_model_stats").fields}


class FixedLatencyModel(DeviceModel):
    """The simple model beside the detailed one: every command takes a fixed time, with no
    contention (NVMeVirt's simple FTL).  The times default to the detailed model's unloaded
    latencies for a 4 KiB command."""

    def __init__(self, profile: Profile, read_ns: float | None = None,
                 write_ns: float | None = None, other_ns: float | None = None):
        self.p = profile
        params = model_params(profile, fixed=True, times=(read_ns, write_ns, other_ns))
        out = ffi.new("sde_model **")
        if lib.sde_model_new(params, out) < 0:
            raise ValueError(f"profile {profile.name} does not make a model")
        self._m = ffi.gc(out[0], lib.sde_model_free)
        self.read_ns = params.fixed_read_ns
        self.write_ns = params.fixed_write_ns
        self.other_ns = params.fixed_other_ns


@dataclass(frozen=True)
class Analytical:
    seq_read_bytes_per_s: float
    seq_read_bottleneck: str
    rand_read_4k_iops: float
    rand_read_bottleneck: str


def analytical(profile: Profile, seq_bytes: int = 1 << 20) -> Analytical:
    """The bottleneck formulas of the module doc."""
    n, link, c = profile.nand, profile.host_link, profile.controller
    dies = n.channels * n.dies_per_channel
    seq = {
        "host link": link.bandwidth_bytes_per_s,
        "channels": n.channels * n.channel_bytes_per_s,
        "dies": dies * n.planes_per_die * n.page_bytes / (n.t_read_ns * 1e-9),
        "controller": c.cores / (c.command_overhead_ns * 1e-9) * seq_bytes,
    }
    rnd = {
        "host link": link.bandwidth_bytes_per_s / 4096,
        "channels": n.channels * n.channel_bytes_per_s / 4096,
        "dies": dies / (n.t_read_ns * 1e-9),
        "controller": c.cores / (c.command_overhead_ns * 1e-9),
    }
    s = min(seq, key=seq.get)
    r = min(rnd, key=rnd.get)
    return Analytical(seq[s], s, rnd[r], r)


class VirtualClock:
    """Simulated time that never goes backwards (trio's MockClock): jump() to a later time
    only."""

    def __init__(self, start_ns: float = 0.0):
        self.now_ns = start_ns

    def jump(self, to_ns: float) -> None:
        if to_ns < self.now_ns:
            raise ValueError(f"virtual time cannot go back: {to_ns} < {self.now_ns}")
        self.now_ns = to_ns


def closed_loop(model, op: str, qd: int, commands: int, nbytes: int, offsets) -> tuple[float,
                                                                                       list]:
    """Drive `model` in virtual time with `qd` commands always in flight: each completion
    submits the next at its completion time.  Returns (elapsed ns, [(submit, done), ...])."""
    clock = VirtualClock()
    issue = getattr(model, op)
    heap: list[float] = []
    spans = []
    submitted = 0
    for _ in range(min(qd, commands)):
        done = issue(0.0, next(offsets), nbytes)
        spans.append((0.0, done))
        heapq.heappush(heap, done)
        submitted += 1
    last = 0.0
    while heap:
        t = heapq.heappop(heap)
        clock.jump(t)
        last = t
        if submitted < commands:
            done = issue(t, next(offsets), nbytes)
            spans.append((t, done))
            heapq.heappush(heap, done)
            submitted += 1
    return last, spans
