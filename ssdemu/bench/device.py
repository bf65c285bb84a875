"""`ssdemu bench device`: the timing model alone, in virtual time (no media, no daemon),
measured the way datasheet figures are, against the figures the profile is calibrated to.

Phases, each on the model with its FTL at a declared scale (`scale` in the report):
- QD1 latency: one 4 KiB read and one 4 KiB write on an idle drive;
- sequential read and write: 1 MiB at QD32 (writes: twice the FTL's logical space, the rate
  over the second pass, once the write cache is full);
- 4 KiB random read at QD512 (deep enough that the drive, not the queue, is the bound), on a
  fresh drive and again on the steady-state drive below (its map scattered by the overwrites);
- 4 KiB random write, fresh: an empty drive, the rate after the write cache fills and before
  the drive has been written once (no GC yet);
- steady state, as SNIA's Performance Test Specification and MQSim precondition: the logical
  space written sequentially twice (128 KiB, QD32), then rounds of random 4 KiB writes at
  QD256, each round as many as the logical space holds, until two rounds agree within 2%
  (at most `max_rounds`); the last round's rate, the write amplification, GC time and free
  lines.
With `precondition`, the read and QD1 phases run on the preconditioned drive instead of a
fresh one (reads then meet the FTL's scattered layout and GC's leftovers).

Each figure the profile declares (`calibration`) is printed beside the modelled one with
`error_pct`: the distance to its value, or to the nearer end of its range (0 inside it).
"""

from __future__ import annotations

import dataclasses
import time

from ssdemu.sim.profile import FIGURES, Profile, load
from ssdemu.sim.timing import DeviceModel, analytical, ftl_scale

MIB = 1 << 20
GIB = 1 << 30
KIB4 = 4096
STEADY_TOLERANCE = 0.02


def logical_bytes_for(profile: Profile) -> int:
    """The FTL's logical space for the bench: four write caches (so that fresh random writes
    outlast the cache) and at least 8 GiB."""
    return max(4 * profile.write_cache.bytes, 8 * GIB)


def error_pct(modelled: float, low: float, high: float) -> float:
    if modelled < low:
        return (modelled / low - 1) * 100
    if modelled > high:
        return (modelled / high - 1) * 100
    return 0.0


def _rate(count: float, t0: float, t1: float) -> float:
    return count / ((t1 - t0) * 1e-9)


def precondition(model: DeviceModel, logical: int, max_rounds: int) -> dict:
    """Fill twice sequentially, then random-overwrite rounds to steady state."""
    model.closed_loop("write", 32, 2 * logical // (128 << 10), 128 << 10, logical)
    per_round = logical // KIB4
    rounds = []
    for r in range(max_rounds):
        before = model.stats()
        last, _ = model.closed_loop("write", 256, per_round, KIB4, logical, seed=1000 + r)
        rounds.append(_rate(per_round, before["horizon_ns"], last))
        if len(rounds) >= 2 and abs(rounds[-1] / rounds[-2] - 1) < STEADY_TOLERANCE:
            break
    st = model.stats()
    host = st["host_bytes_programmed"] - before["host_bytes_programmed"]
    moved = st["gc_bytes_programmed"] - before["gc_bytes_programmed"]
    return {"rounds_iops": rounds, "steady": len(rounds) >= 2 and
            abs(rounds[-1] / rounds[-2] - 1) < STEADY_TOLERANCE,
            # over the last round: NAND bytes programmed per host byte programmed
            "write_amplification": (host + moved) / host if host else 1.0,
            "write_amplification_whole_run": st["write_amplification"], "gc_ns": st["gc_ns"],
            "erases": st["erases"], "free_lines": st["ftl_free_lines"],
            "lines": st["ftl_lines"]}


def bench_device(profile_name: str | Profile, logical_bytes: int | None = None,
                 do_precondition: bool = False, max_rounds: int = 8,
                 rand_read_commands: int = 200_000, seq_commands: int = 2048) -> dict:
    profile = profile_name if isinstance(profile_name, Profile) else load(profile_name)
    logical = logical_bytes or logical_bytes_for(profile)
    t0 = time.perf_counter()
    scale = ftl_scale(profile, logical)
    logical = scale.logical_bytes

    def drive(aged: bool) -> DeviceModel:
        m = DeviceModel(profile, ftl_bytes=logical)
        if aged:
            precondition(m, logical, max_rounds)
            m.flush(m.stats()["busy_until_ns"])  # idle again before the next phase
        return m

    modelled = {}
    m = drive(do_precondition)
    t = m.stats()["busy_until_ns"]
    modelled["qd1_read_4k_latency_ns"] = m.read(t, 0, KIB4) - t
    t = m.stats()["busy_until_ns"]
    modelled["qd1_write_4k_latency_ns"] = m.write(t, 0, KIB4) - t

    m = drive(do_precondition)
    start = m.stats()["busy_until_ns"]
    last, _ = m.closed_loop("read", 32, seq_commands, MIB, logical, start=start)
    modelled["seq_read_bytes_per_s"] = _rate(seq_commands * MIB, start, last)

    m = drive(do_precondition)
    start = m.stats()["busy_until_ns"]
    last, _ = m.closed_loop("read", 512, rand_read_commands, KIB4, logical, seed=7,
                            start=start)
    modelled["rand_read_4k_iops"] = _rate(rand_read_commands, start, last)

    m = drive(False)
    n = 2 * logical // MIB
    last, marks = m.closed_loop("write", 32, n, MIB, logical, marks=2)
    modelled["seq_write_bytes_per_s"] = _rate(n // 2 * MIB, marks[0], marks[1])

    m = drive(False)
    n = logical // KIB4 * 4 // 5  # most of the drive, but no GC yet (the spare is unused)
    last, marks = m.closed_loop("write", 256, n, KIB4, logical, seed=3, marks=4)
    # the last quarter: the write cache (at most a quarter of the logical space) is full
    modelled["rand_write_4k_iops_fresh"] = _rate(n / 4, marks[2], marks[3])

    m = drive(False)
    steady = precondition(m, logical, max_rounds)
    modelled["rand_write_4k_iops_steady"] = steady["rounds_iops"][-1]
    # the same drive, idle again: random reads over the map the overwrites scattered
    m.flush(m.stats()["busy_until_ns"])
    start = m.stats()["busy_until_ns"]
    last, _ = m.closed_loop("read", 512, rand_read_commands, KIB4, logical, seed=8,
                            start=start)
    modelled["rand_read_4k_iops_steady"] = _rate(rand_read_commands, start, last)

    return _report(profile, modelled, steady, scale, do_precondition) | {
        "wall_seconds": time.perf_counter() - t0}


def _report(profile: Profile, modelled: dict, steady: dict, scale, do_precondition: bool
            ) -> dict:
    """The modelled figures beside those the profile cites, and how they were measured."""
    figures = {}
    for name in FIGURES:  # in the profile's order
        figures[name] = {"modelled": modelled[name]}
    for f in profile.calibration:
        figures[f.name].update({
            "declared": f.low if f.low == f.high else [f.low, f.high],
            "error_pct": error_pct(figures[f.name]["modelled"], f.low, f.high),
            "source" if not f.assumed else "assumed": f.source})
    a = analytical(profile)
    cited = [f for f in profile.calibration if not f.assumed]
    return {
        "profile": profile.name,
        "figures": figures,
        "cited_within_5pct": sum(abs(figures[f.name]["error_pct"]) <= 5 for f in cited),
        "cited": len(cited),
        "write_amplification": steady["write_amplification"],
        "steady_state": steady,
        "analytical": {"seq_read_bytes_per_s": a.seq_read_bytes_per_s,
                       "seq_read_bottleneck": a.seq_read_bottleneck,
                       "rand_read_4k_iops": a.rand_read_4k_iops,
                       "rand_read_bottleneck": a.rand_read_bottleneck},
        "scale": dataclasses.asdict(scale) | {
            "user_capacity_bytes": profile.ftl.user_capacity_bytes,
            "note": "the FTL maps `logical_bytes` of the drive's user capacity, lines of "
                    "`rows_per_die` rows per die instead of a real block's pages; "
                    "over-provisioning as the profile's"},
        "preconditioned_reads": do_precondition,
    }


UNITS = {"bytes_per_s": (1e9, "GB/s"), "iops": (1e3, "K IOPS"), "latency_ns": (1e3, "us")}


def _fmt(name: str, v) -> str:
    for suffix, (div, unit) in UNITS.items():
        if suffix in name:
            if isinstance(v, list):
                return f"{v[0] / div:.2f}-{v[1] / div:.2f} {unit}"
            return f"{v / div:.2f} {unit}"
    return str(v)


def format_table(r: dict) -> str:
    s = r["scale"]
    lines = [f"{r['profile']}: the timing model in virtual time against its calibration "
             f"(FTL at scale {s['scale']:.3g}: {s['logical_bytes'] / GIB:.0f} GiB in "
             f"{s['lines']} lines of {s['rows_per_die']} rows per die, "
             f"over-provisioning {s['overprovisioning']:.1%})",
             f"  {'figure':28} {'modelled':>16} {'declared':>20} {'error':>8}  source"]
    for name, f in r["figures"].items():
        declared = _fmt(name, f["declared"]) if "declared" in f else "-"
        err = f"{f['error_pct']:+.1f}%" if "error_pct" in f else ""
        src = f.get("source") or (f"assumed: {f['assumed']}" if "assumed" in f else "")
        lines.append(f"  {name:28} {_fmt(name, f['modelled']):>16} {declared:>20} {err:>8}  "
                     f"{src[:70]}")
    st = r["steady_state"]
    lines.append(f"  steady state after {len(st['rounds_iops'])} rounds "
                 f"({', '.join(f'{x / 1e3:.0f}K' for x in st['rounds_iops'])} IOPS): "
                 f"write amplification {r['write_amplification']:.2f} (last round), "
                 f"{st['erases']} erases, GC {st['gc_ns'] / 1e9:.2f} s of die time")
    lines.append(f"  {r['cited_within_5pct']} of {r['cited']} cited figures within 5%; "
                 f"{r['wall_seconds']:.1f} s of wall time")
    return "\n".join(lines)
