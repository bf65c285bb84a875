"""A stand-in for fio on PATH (tests/fio_standin.py): records each call's arguments as a JSON
line in $FIO_STANDIN_LOG and prints fio's JSON with known figures, so that a benchmark's
check can say which file, offset, block size and depth it ran fio with, and that it reports
fio's figures as fio gave them.  install(dir) writes it as dir/fio."""

import json
import os
import pathlib
import sys

IOPS = 123_456.0
BW_BYTES = 505_678_901
P50_NS, P99_NS, P999_NS = 41_000, 99_000, 250_000


def fio_json(rw: str) -> dict:
    side = {"iops": IOPS, "bw_bytes": BW_BYTES,
            "clat_ns": {"percentile": {"50.000000": P50_NS, "99.000000": P99_NS,
                                       "99.900000": P999_NS}}}
    job = {"jobname": "ssdemu-baseline", "read": dict(side), "write": dict(side)}
    return {"fio version": "fio-standin", "jobs": [job]}


def install(bindir: pathlib.Path) -> pathlib.Path:
    """dir/fio running this file with this interpreter; returns the log's path."""
    fio = bindir / "fio"
    fio.write_text(f"#!{sys.executable}\nimport runpy, sys\n"
                   f"runpy.run_path({str(pathlib.Path(__file__))!r}, run_name='__main__')\n")
    fio.chmod(0o755)
    return bindir / "fio-calls.jsonl"


def calls(log: pathlib.Path) -> list[dict]:
    """Each recorded call's --name=value options as a dict (flags map to True)."""
    out = []
    for line in log.read_text().splitlines():
        opts = {}
        for a in json.loads(line)[1:]:
            k, _, v = a.lstrip("-").partition("=")
            opts[k] = v if _ else True
        out.append(opts)
    return out


if __name__ == "__main__":
    with open(os.environ["FIO_STANDIN_LOG"], "a") as f:
        f.write(json.dumps(sys.argv) + "\n")
    rw = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--rw=")), "read")
    print(json.dumps(fio_json(rw)))
