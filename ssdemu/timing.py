"""The device timing model: pure functions over next-free times per resource, in the style
of NVMeVirt and FEMU.  The arithmetic is in C (c/sde_model.c), once, so that the daemon's
data plane times every command at full speed; this module wraps it and adds the analytical
figures, the fixed-latency model, the virtual clock and a closed-loop driver.

A command's data moves at once; the model only computes when it would have completed on
the device the profile describes.  Nothing here does I/O or reads a clock: callers pass
times (ns) in and get times out.

Resources: controller cores, the NAND die-planes, the NAND channels, the host link, and the
compute units (firmware.cost.TopsBudget).  Each has a next-free time; a stage on a resource
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

import heapq
from dataclasses import dataclass

from ssdemu import _engine
from ssdemu.profile import Profile

ffi, lib = _engine.ffi, _engine.lib


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


def unloaded_latencies(profile: Profile) -> tuple[float, float, float]:
    """A 4 KiB read, a 4 KiB write and a NOP on an idle detailed model."""
    return (DeviceModel(profile).read(0.0, 0, 4096), DeviceModel(profile).write(0.0, 0, 4096),
            DeviceModel(profile).nop(0.0))


def default_bulk_pages(profile: Profile) -> int:
    """Transfers of a full stripe (a page on every plane) or more take the model's bulk path."""
    n = profile.nand
    return n.channels * n.dies_per_channel * n.planes_per_die


def model_params(profile: Profile, fixed: bool = False, times=(None, None, None),
                 bulk_pages: int | None = None):
    n, link, c = profile.nand, profile.host_link, profile.controller
    if bulk_pages is None:
        bulk_pages = default_bulk_pages(profile)
    if fixed:
        defaults = unloaded_latencies(profile)
        times = [t if t is not None else d for t, d in zip(times, defaults, strict=True)]
    else:
        times = (0.0, 0.0, 0.0)
    return ffi.new("sde_model_params *", {
        "fixed": int(fixed), "fixed_read_ns": times[0], "fixed_write_ns": times[1],
        "fixed_other_ns": times[2],
        "link_bytes_per_s": link.bandwidth_bytes_per_s, "link_latency_ns": link.latency_ns,
        "channels": n.channels, "dies_per_channel": n.dies_per_channel,
        "planes_per_die": n.planes_per_die, "page_bytes": n.page_bytes,
        "t_read_ns": n.t_read_ns, "t_prog_ns": n.t_prog_ns,
        "channel_bytes_per_s": n.channel_bytes_per_s, "cores": c.cores,
        "command_overhead_ns": c.command_overhead_ns,
        "write_cache": int(profile.write_cache.enabled), "bulk_pages": bulk_pages,
        "write_cache_bytes": int(profile.write_cache.bytes)})


class DeviceModel:
    """The detailed model of one profile (c/sde_model.c, the one definition the daemon's data
    plane uses too)."""

    def __init__(self, profile: Profile, bulk_pages: int | None = None):
        """bulk_pages: transfers of this many pages or more are booked in bulk (0: never;
        default: a full stripe)."""
        self.p = profile
        out = ffi.new("sde_model **")
        if lib.sde_model_new(model_params(profile, bulk_pages=bulk_pages), out) < 0:
            raise ValueError(f"profile {profile.name} does not make a model")
        self._m = ffi.gc(out[0], lib.sde_model_free)

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

    # the stages of commands the firmware transforms in between (c/sde_model.h)
    def sense(self, submit: float, offset: int, nbytes: int) -> float:
        """A read's NAND half: when the bytes are in the controller (no link)."""
        return self._check(lib.sde_model_sense(self._m, submit, offset, nbytes), submit)

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
    planes = n.channels * n.dies_per_channel * n.planes_per_die
    seq = {
        "host link": link.bandwidth_bytes_per_s,
        "channels": n.channels * n.channel_bytes_per_s,
        "die-planes": planes * n.page_bytes / (n.t_read_ns * 1e-9),
        "controller": c.cores / (c.command_overhead_ns * 1e-9) * seq_bytes,
    }
    rnd = {
        "host link": link.bandwidth_bytes_per_s / 4096,
        "channels": n.channels * n.channel_bytes_per_s / 4096,
        "die-planes": planes / (n.t_read_ns * 1e-9),
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
