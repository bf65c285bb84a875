"""The device timing model: pure functions over next-free times per resource, in the style
of NVMeVirt and FEMU.  A command's data moves at once; the model only computes when it would
have completed on the device the profile describes.  Nothing here does I/O or reads a clock:
callers pass times (ns) in and get times out.

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

from ssdemu.profile import Profile


class Resource:
    """Something that does one thing at a time.

    Stages reach a resource out of time order (a read whose die was busy is ready later than
    the next one), so a plain next-free time would make every later stage wait behind the
    late one.  The resource remembers its idle gaps before `next_free`, and a stage takes
    the first gap at or after its ready time that is long enough, else it queues at the
    end.  Gaps that end before the latest submission can no longer be used (every stage is
    ready at or after its command's submission) and are forgotten.  `next_free` never
    decreases."""

    __slots__ = ("gaps", "next_free", "busy")

    def __init__(self):
        self.gaps: list[tuple[float, float]] = []  # idle (start, end) before next_free, sorted
        self.next_free = 0.0
        self.busy = 0.0

    def forget_before(self, t: float) -> None:
        g = self.gaps
        i = 0
        while i < len(g) and g[i][1] <= t:
            i += 1
        if i:
            del g[:i]

    def hold(self, ready: float, duration: float) -> float:
        self.busy += duration
        gaps = self.gaps
        for i in range(len(gaps)):
            s, e = gaps[i]
            if e <= ready:
                continue
            start = s if s > ready else ready
            done = start + duration
            if done <= e:
                split = []
                if start > s:
                    split.append((s, start))
                if done < e:
                    split.append((done, e))
                gaps[i:i + 1] = split
                return done
        start = ready if ready > self.next_free else self.next_free
        if start > self.next_free:
            gaps.append((self.next_free, start))
        self.next_free = start + duration
        return self.next_free


class Pool:
    """Interchangeable units (controller cores): a stage takes the one free first."""

    def __init__(self, n: int):
        self.units = [Resource() for _ in range(n)]

    def hold(self, ready: float, duration: float) -> float:
        unit = min(self.units, key=lambda u: u.next_free)
        return unit.hold(ready, duration)

    def forget_before(self, t: float) -> None:
        for u in self.units:
            u.forget_before(t)


class DeviceModel:
    """The detailed model of one profile."""

    def __init__(self, profile: Profile):
        self.p = profile
        n = profile.nand
        self.controller = Pool(profile.controller.cores)
        self.planes = [Resource() for _ in range(n.channels * n.dies_per_channel
                                                 * n.planes_per_die)]
        self.channels = [Resource() for _ in range(n.channels)]
        self.link = Resource()
        self._ns_per_link_byte = 1e9 / profile.host_link.bandwidth_bytes_per_s
        self._ns_per_channel_byte = 1e9 / n.channel_bytes_per_s
        self.nand_bytes_read = 0
        self.nand_bytes_written = 0
        self.link_bytes = 0
        self._horizon = 0.0
        self._resources = [self.controller, *self.planes, *self.channels, self.link]

    def _advance(self, submit: float) -> None:
        """Commands arrive in submission-time order; drop bookings no stage can use."""
        if submit < self._horizon:
            raise ValueError(f"submission at {submit} ns precedes one at {self._horizon} ns")
        if submit - self._horizon > 50_000:  # prune now and then, not on every command
            for r in self._resources:
                r.forget_before(submit)
            self._horizon = submit

    def _pages(self, offset: int, nbytes: int):
        """(plane index, channel index, bytes) for each page the range touches."""
        n = self.p.nand
        page = n.page_bytes
        p, end = offset // page, offset + nbytes
        while p * page < end:
            lo, hi = max(offset, p * page), min(end, (p + 1) * page)
            ch = p % n.channels
            die = (p // n.channels) % n.dies_per_channel
            plane = (p // (n.channels * n.dies_per_channel)) % n.planes_per_die
            yield (ch * n.dies_per_channel + die) * n.planes_per_die + plane, ch, hi - lo
            p += 1

    def read(self, submit: float, offset: int, nbytes: int) -> float:
        self._advance(submit)
        t = self.controller.hold(submit, self.p.controller.command_overhead_ns)
        n = self.p.nand
        done = t
        for plane, ch, b in self._pages(offset, nbytes):
            sensed = self.planes[plane].hold(t, n.t_read_ns)
            moved = self.channels[ch].hold(sensed, b * self._ns_per_channel_byte)
            done = max(done, self.link.hold(moved, b * self._ns_per_link_byte))
        self.nand_bytes_read += nbytes
        self.link_bytes += nbytes
        return done + self.p.host_link.latency_ns

    def write(self, submit: float, offset: int, nbytes: int) -> float:
        self._advance(submit)
        t = self.controller.hold(submit, self.p.controller.command_overhead_ns)
        n = self.p.nand
        arrived = self.link.hold(t, nbytes * self._ns_per_link_byte)
        programmed = arrived
        for plane, ch, b in self._pages(offset, nbytes):
            moved = self.channels[ch].hold(arrived, b * self._ns_per_channel_byte)
            programmed = max(programmed, self.planes[plane].hold(moved, n.t_prog_ns))
        self.nand_bytes_written += nbytes
        self.link_bytes += nbytes
        done = arrived if self.p.write_cache.enabled else programmed
        return done + self.p.host_link.latency_ns

    def flush(self, submit: float) -> float:
        t = self.controller.hold(submit, self.p.controller.command_overhead_ns)
        return max([t] + [pl.next_free for pl in self.planes]) + self.p.host_link.latency_ns

    def nop(self, submit: float) -> float:
        return self.controller.hold(submit, self.p.controller.command_overhead_ns) + \
            self.p.host_link.latency_ns


class FixedLatencyModel:
    """The simple model beside the detailed one: every command takes a fixed time, no
    contention (NVMeVirt's simple FTL)."""

    @classmethod
    def from_profile(cls, profile: Profile, nbytes: int = 4096) -> FixedLatencyModel:
        """The unloaded latencies of an nbytes read and write on the detailed model."""
        return cls(DeviceModel(profile).read(0.0, 0, nbytes),
                   DeviceModel(profile).write(0.0, 0, nbytes),
                   DeviceModel(profile).nop(0.0))

    def __init__(self, read_ns: float, write_ns: float, other_ns: float = 1000.0):
        self.read_ns, self.write_ns, self.other_ns = read_ns, write_ns, other_ns
        self.nand_bytes_read = self.nand_bytes_written = self.link_bytes = 0

    def read(self, submit: float, offset: int, nbytes: int) -> float:
        self.nand_bytes_read += nbytes
        self.link_bytes += nbytes
        return submit + self.read_ns

    def write(self, submit: float, offset: int, nbytes: int) -> float:
        self.nand_bytes_written += nbytes
        self.link_bytes += nbytes
        return submit + self.write_ns

    def flush(self, submit: float) -> float:
        return submit + self.other_ns

    def nop(self, submit: float) -> float:
        return submit + self.other_ns


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
