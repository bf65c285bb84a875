"""fio's external ioengine for the drive (c/fio/ssdemu_fio.c), built by `make fio-engine`
against the installed fio's own source: where it is, and a job's command line.

    fio --ioengine=external:build/fio/ssdemu-fio.so --filename=SOCKET --nsid=N JOB...
"""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENGINE = ROOT / "build" / "fio" / "ssdemu-fio.so"


class EngineMissing(RuntimeError):
    """The engine was not built (make fio-engine)."""


def path() -> str:
    if not ENGINE.is_file():
        raise EngineMissing(f"fio's ssdemu engine is not built ({ENGINE}): run `make "
                            "fio-engine` (it needs fio and Debian's source package of it)")
    return str(ENGINE)


def command(socket_path: str, *, rw: str, bs: int, qd: int, nsid: int = 0,
            seconds: float | None = None, size: int | None = None, jobs: int = 1,
            extra: tuple[str, ...] = ()) -> list[str]:
    """fio through the engine, JSON out, shaped like bench queue's closed loop (uniform random
    offsets, no random map); seconds None: until `size` is done."""
    cmd = ["fio", "--name=ssdemu-engine", f"--ioengine=external:{path()}",
           f"--filename={socket_path}", f"--nsid={nsid}", f"--rw={rw}", f"--bs={bs}",
           f"--iodepth={qd}", f"--numjobs={jobs}", "--norandommap", "--randrepeat=0",
           "--output-format=json"]
    if seconds is not None:
        cmd += [f"--runtime={max(1, round(seconds * 1000))}ms", "--time_based"]
    if size is not None:
        cmd.append(f"--size={size}")
    return cmd + list(extra)
