"""`ssdemu bench device`: the timing model alone, in virtual time, against the analytical
bottleneck figures of its profile (no media, no daemon)."""

from __future__ import annotations

import random
import time

from ssdemu.profile import load
from ssdemu.timing import DeviceModel, analytical, closed_loop

MIB = 1 << 20


def bench_device(profile_name: str, seq_commands: int = 4096, rand_commands: int = 200_000,
                 seed: int = 1) -> dict:
    profile = load(profile_name)
    a = analytical(profile)
    t0 = time.perf_counter()

    def sequential():
        off = 0
        while True:
            yield off
            off += MIB

    elapsed, _ = closed_loop(DeviceModel(profile), "read", 32, seq_commands, MIB, sequential())
    seq_bw = seq_commands * MIB / (elapsed * 1e-9)
    rng = random.Random(seed)
    span = 1 << 40  # random 4 KiB offsets over a 1 TiB range

    def scattered():
        while True:
            yield rng.randrange(span // 4096) * 4096

    elapsed, _ = closed_loop(DeviceModel(profile), "read", 256, rand_commands, 4096,
                             scattered())
    iops = rand_commands / (elapsed * 1e-9)
    return {
        "profile": profile.name,
        "seq_read_1m_qd32": {
            "modelled_bytes_per_s": seq_bw, "analytical_bytes_per_s": a.seq_read_bytes_per_s,
            "bottleneck": a.seq_read_bottleneck,
            "error_pct": (seq_bw / a.seq_read_bytes_per_s - 1) * 100,
        },
        "rand_read_4k_qd256": {
            "modelled_iops": iops, "analytical_iops": a.rand_read_4k_iops,
            "bottleneck": a.rand_read_bottleneck,
            "error_pct": (iops / a.rand_read_4k_iops - 1) * 100,
        },
        "commands": seq_commands + rand_commands,
        "wall_seconds": time.perf_counter() - t0,
    }


def format_table(r: dict) -> str:
    s, q = r["seq_read_1m_qd32"], r["rand_read_4k_qd256"]
    return "\n".join([
        f"{r['profile']}: timing model in virtual time vs the analytical bottleneck",
        f"  1 MiB seq read QD32   {s['modelled_bytes_per_s'] / 1e9:8.3f} GB/s   analytical "
        f"{s['analytical_bytes_per_s'] / 1e9:8.3f} ({s['bottleneck']})   "
        f"{s['error_pct']:+.2f}%",
        f"  4 KiB rand read QD256 {q['modelled_iops'] / 1e3:8.1f} K IOPS analytical "
        f"{q['analytical_iops'] / 1e3:8.1f} ({q['bottleneck']})   {q['error_pct']:+.2f}%",
        f"  {r['commands']:,} commands in {r['wall_seconds']:.1f} s of wall time",
    ])
