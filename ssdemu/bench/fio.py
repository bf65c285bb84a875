"""Running fio as the baseline of an I/O benchmark, and reading its JSON."""

from __future__ import annotations

import json
import shutil
import subprocess


def fio_available() -> bool:
    return shutil.which("fio") is not None


def fio_command(path: str, *, rw: str, bs: int, qd: int, seconds: float, size: int,
                submit_batch: int = 1, offset: int = 0) -> list[str]:
    """fio with the io_uring engine and O_DIRECT, shaped like our closed-loop job: uniform
    random offsets (no random map), one job, time based, the same submit batch (0: all
    ready I/Os, which fio spells as the queue depth)."""
    return [
        "fio", "--name=ssdemu-baseline", f"--filename={path}", "--ioengine=io_uring",
        "--direct=1", f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}",
        f"--runtime={max(1, round(seconds * 1000))}ms", "--time_based", f"--size={size}",
        f"--offset={offset}", "--norandommap", "--randrepeat=0", "--output-format=json",
        f"--iodepth_batch_submit={submit_batch or qd}",
    ]


def parse_fio_json(text: str, rw: str) -> dict:
    """The figures we compare from fio's JSON output (first job)."""
    start = text.find("{")  # fio may print notes before the JSON
    data = json.loads(text[start:])
    side = data["jobs"][0]["write" if "write" in rw else "read"]
    pct = side["clat_ns"].get("percentile", {})

    def p(key: str) -> float:
        return pct[key] / 1000.0 if key in pct else float("nan")

    return {
        "iops": side["iops"],
        "bandwidth_bytes_per_s": float(side["bw_bytes"]),
        "lat_us_p50": p("50.000000"),
        "lat_us_p99": p("99.000000"),
        "lat_us_p999": p("99.900000"),
    }


def run_fio(path: str, **kw) -> dict:
    cmd = fio_command(path, **kw)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"fio failed ({proc.returncode}): {proc.stderr.strip()[:300]}")
    return parse_fio_json(proc.stdout, kw["rw"])
