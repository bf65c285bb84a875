"""`ssdemu bench stack`: what each layer between a program and the drive adds, in one run.

4 KiB random reads, at QD1 (latency) and QD32 (IOPS), on one drive, through each layer in turn:

- media: fio (psync at QD1, io_uring at QD32, O_DIRECT) on the daemon's own media, at the
  namespace's offset: the floor, no drive;
- queue: the C closed loop through a queue pair (what `bench queue` measures);
- engine: fio through its ssdemu engine (c/fio): fio's own work on top of the queue;
- mount: fio (psync at QD1, io_uring at QD32, O_DIRECT) on the mount's file (c/mount, FUSE);
- ext4: fio (the same) on a file of ext4 on the mount's file through a loop device
  (`ssdemu fs up`).

Each row gives its p50/p99 and IOPS and what it adds over the row below it (microseconds at
the median, and the IOPS ratio).  The drive's own time is in every row but the first: with
--timing off (the default) the rows show the layers alone; with a profile, a layer that hides
behind the drive's time shows as none.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import hostlib
from ssdemu.bench import closed_loop
from ssdemu.bench.fio import parse_fio_json
from ssdemu.bench.queue import filled_namespace
from ssdemu.device.latency import new_histogram, percentiles_us
from ssdemu.tools import fio_engine, mount
from ssdemu.tools.daemon_process import DaemonProcess, socket_dir
from ssdemu_wire.layout import OPCODES

BS = 4096
DEPTHS = (1, 32)
LAYERS = ("media", "queue", "engine", "mount", "ext4")


def _fio(args: list[str], cwd: str) -> dict:
    proc = subprocess.run(["fio", "--name=stack", "--rw=randread", f"--bs={BS}",
                           "--norandommap", "--randrepeat=0", "--output-format=json", *args],
                          capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"fio failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    return parse_fio_json(proc.stdout, "randread")


def _file_job(path: str, qd: int, seconds: float, size: int, cwd: str, offset: int = 0) -> dict:
    """fio on a file: psync at QD1 (a read call's own latency; io_uring's QD1 on the media's
    memfd went through its worker threads, 2.6 to 42 us a read from run to run), io_uring
    deeper."""
    engine = "psync" if qd == 1 else "io_uring"
    return _fio([f"--filename={path}", f"--ioengine={engine}", "--direct=1",
                 f"--iodepth={qd}", f"--size={size}", f"--offset={offset}", "--time_based",
                 f"--runtime={round(seconds * 1000)}ms"], cwd)


def _queue(dev, nsid: int, qd: int, seconds: float, size: int) -> dict:
    buf = dev.alloc(qd * BS)
    handle, _ = dev._locate(buf)
    hist = new_histogram()
    n, secs = closed_loop.run(dev, OPCODES["READ"], handle, BS, qd, size // 512, seconds,
                              nsid=nsid, hist=hist)
    dev.free(buf)
    p50, p99, _ = percentiles_us(hist)
    return {"iops": n / secs, "lat_us_p50": p50, "lat_us_p99": p99}


def run_layers(socket_path: str, seconds: float, size: int, work: str) -> dict:
    """Each layer's figures at each depth, on a namespace of `size` (filled) and a second
    one under ext4.  One layer's clients connected at a time: no layer's idle connections
    (the mount's threads, the bench's own) are in another layer's figures."""
    out: dict = {layer: {} for layer in LAYERS}
    dev = hostlib.connect(socket_path, entries=256)
    try:
        ident = dev.identify()
        nsid, start, size = filled_namespace(dev, ident, size)
        fs_nsid = dev.ns_create(size + (64 << 20))  # the file, and ext4's own blocks
        for qd in DEPTHS:
            out["media"][qd] = _file_job(ident["media_path"], qd, seconds, size, work,
                                         offset=start)
            out["queue"][qd] = _queue(dev, nsid, qd, seconds, size)
    finally:
        dev.close()
    for qd in DEPTHS:
        out["engine"][qd] = _fio([f"--ioengine=external:{fio_engine.path()}",
                                  f"--filename={socket_path}", f"--nsid={nsid}",
                                  f"--iodepth={qd}", f"--size={size}", "--time_based",
                                  f"--runtime={round(seconds * 1000)}ms"], work)
    os.mkdir(os.path.join(work, "m"))
    with mount.Mount(socket_path, os.path.join(work, "m")) as m:
        for qd in DEPTHS:
            out["mount"][qd] = _file_job(m.files()[nsid], qd, seconds, size, work)
    fs = os.path.join(work, "fs")
    os.mkdir(fs)
    mount.fs_up(socket_path, fs_nsid, fs, mkfs=True)
    try:
        data = os.path.join(fs, "data")
        _file_job(data, 32, 0.2, size, work)  # laid out (written) before it is read
        for qd in DEPTHS:
            out["ext4"][qd] = _file_job(data, qd, seconds, size, work)
    finally:
        mount.fs_down(fs)
    return out


def report(layers: dict, seconds: float, media: str, timing: str) -> dict:
    rows = []
    for i, layer in enumerate(LAYERS):
        row = {"layer": layer}
        for qd in DEPTHS:
            r = layers[layer][qd]
            row[f"qd{qd}_lat_us_p50"] = r["lat_us_p50"]
            row[f"qd{qd}_lat_us_p99"] = r["lat_us_p99"]
            row[f"qd{qd}_iops"] = r["iops"]
            if i:
                below = layers[LAYERS[i - 1]][qd]
                row[f"qd{qd}_adds_us_p50"] = r["lat_us_p50"] - below["lat_us_p50"]
                row[f"qd{qd}_iops_ratio"] = r["iops"] / below["iops"]
        rows.append(row)
    return {"layers": rows, "bs": BS, "seconds": seconds, "media": media, "timing": timing}


def bench_stack(media: str, timing: str, seconds: float, size: int) -> dict:
    if not shutil.which("fio"):
        raise RuntimeError("bench stack runs fio: apt-get install fio")
    d = socket_dir("ssdemu-bench-", "sde.sock")
    extra = ["--timing", "off"] if timing == "off" else ["--profile", timing]
    daemon = DaemonProcess(os.path.join(d, "sde.sock"), media=media, extra=extra)
    work = tempfile.mkdtemp(prefix="ssdemu-stack-")
    try:
        return report(run_layers(daemon.socket_path, seconds, size, work), seconds, media,
                      timing)
    finally:
        code, err = daemon.terminate()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(d, ignore_errors=True)
        if code != 0:
            raise RuntimeError(f"the benchmark's daemon exited with {code}: {err[-300:]}")


def format_table(r: dict) -> str:
    lines = [f"4 KiB random reads through each layer ({r['media']}, timing {r['timing']}, "
             f"{r['seconds']} s a cell)",
             f"  {'layer':8} {'QD1 p50':>9} {'p99':>8} {'adds':>8}   {'QD32 IOPS':>11} "
             f"{'x below':>8}"]
    for row in r["layers"]:
        adds = f"{row['qd1_adds_us_p50']:+7.1f}" if "qd1_adds_us_p50" in row else ""
        ratio = f"{row['qd32_iops_ratio']:7.2f}x" if "qd32_iops_ratio" in row else ""
        lines.append(f"  {row['layer']:8} {row['qd1_lat_us_p50']:7.1f}us "
                     f"{row['qd1_lat_us_p99']:6.1f}us {adds:>8}   {row['qd32_iops']:11,.0f} "
                     f"{ratio:>8}")
    return "\n".join(lines)
