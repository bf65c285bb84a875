"""`ssdemu bench queue`: the queue pair and the daemon, measured from a client process.

NOP round trips through hostlib (one command, and batches of 32); 4 KiB random reads at QD32
through the queue by a closed loop in C (c/tools/sde_client_loop.c), fio through the queue (its
ssdemu engine, c/fio), and fio on the same media, in the same run, in alternating slices
(SLICES); the bytes the daemon copies per read, registered buffer vs bounce path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import numpy as np

import hostlib
from ssdemu.bench import closed_loop
from ssdemu.bench.fio import fio_available, parse_fio_json, run_fio
from ssdemu.device.latency import new_histogram, percentiles_us
from ssdemu.tools import fio_engine
from ssdemu.tools.daemon_process import DaemonProcess, socket_dir
from ssdemu_wire.layout import OPCODES

NOP_ROUNDS = 3000
BATCH_ROUNDS = 500
COPY_READS = 64
# ours and fio in turn, this many slices each, and the median of each side: on a busy host
# the figure of one run moved 2x with where the scheduler put the threads (ratios 0.43 to 0.81
# in five runs of the same code beside two neighbours), and a slice of each side sees the
# same placements
SLICES = 8


def _pcts(samples_s: list[float]) -> tuple[float, float]:
    a = np.asarray(samples_s) * 1e6
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def _nop_rtts(dev, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        dev.nop()
        out.append(time.perf_counter() - t)
    return out


def _batch_rtts(dev, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        dev.reap(dev.submit_batch([{"opcode": OPCODES["NOP"]}] * 32), 32)
        out.append(time.perf_counter() - t)
    return out


def _read_slice(dev, nsid: int, handle: int, bs: int, qd: int, ns_bytes: int,
                seconds: float, hist: np.ndarray, seed: int) -> float:
    """IOPS of one slice of the C closed loop's random reads; their latencies add to hist."""
    n, secs = closed_loop.run(dev, OPCODES["READ"], handle, bs, qd, ns_bytes // 512, seconds,
                              nsid=nsid, seed=seed, hist=hist)
    return n / secs


def _copied_per_read(dev, nsid: int, buf: np.ndarray) -> float:
    before = dev.log()["classes"]["read"]
    for i in range(COPY_READS):
        dev.read(nsid, i * 8, buf)
    after = dev.log()["classes"]["read"]
    return (after["bytes_copied"] - before["bytes_copied"]) / (after["commands"]
                                                               - before["commands"])


def filled_namespace(dev, ident: dict, ns_bytes: int) -> tuple[int, int, int]:
    """A namespace of ns_bytes (within the drive and this uid's share of it, serve
    --max-namespace-bytes-per-uid; whole MiBs), written all over: reads of holes would
    measure the zero page.  (nsid, its first byte on the media, its bytes)."""
    ns_bytes = min(ns_bytes, ident["capacity_bytes"],
                   dev.log()["quotas"]["namespace_bytes"]) >> 20 << 20
    nsid = dev.ns_create(ns_bytes)
    start = next(n["start"] for n in dev.namespaces() if n["nsid"] == nsid)
    chunk = dev.alloc(1 << 20)
    chunk[:] = np.random.default_rng(1).integers(0, 256, chunk.size, dtype=np.uint8)
    futures = [dev.write_async(nsid, off // 512, chunk) for off in range(0, ns_bytes, 1 << 20)]
    for f in futures:
        f.result()
    dev.free(chunk)
    return nsid, start, ns_bytes


def run_bench(socket_path: str, seconds: float, ns_bytes: int) -> dict:
    dev = hostlib.connect(socket_path, entries=256)
    try:
        ident = dev.identify()
        nsid, start, ns_bytes = filled_namespace(dev, ident, ns_bytes)
        qd, bs = 32, 4096
        buf = dev.alloc(qd * bs)
        handle, _ = dev._locate(buf)
        hist = new_histogram()  # every slice's reads
        nop, batch, ours, fio, engine, null = [], [], [], [], [], []
        with_fio = fio_available()
        with_engine = with_fio and fio_engine.ENGINE.is_file()
        for i in range(SLICES):
            nop += _nop_rtts(dev, NOP_ROUNDS // SLICES)
            batch += _batch_rtts(dev, BATCH_ROUNDS // SLICES)

            def read_slice(i=i):
                ours.append(_read_slice(dev, nsid, handle, bs, qd, ns_bytes,
                                        seconds / SLICES, hist, seed=7 + i))

            def fio_slice():
                fio.append(run_fio(ident["media_path"], rw="randread", bs=bs, qd=qd,
                                   seconds=seconds / SLICES, size=ns_bytes,
                                   offset=start)["iops"])

            def engine_slice():
                engine.append(run_engine(socket_path, nsid, bs, qd, seconds / SLICES,
                                         ns_bytes))
                # fio's own cost per I/O, which the C loop does not pay: its null engine
                null.append(run_engine(socket_path, nsid, bs, qd, seconds / SLICES / 4,
                                       ns_bytes, engine="null"))

            steps = ([read_slice, fio_slice] if with_fio else [read_slice]) + (
                [engine_slice] if with_engine else [])
            for step in steps if i % 2 == 0 else steps[::-1]:  # ABBA: drift favours neither
                step()
        nop_p50, nop_p99 = _pcts(nop)
        b_p50, b_p99 = _pcts(batch)
        iops = float(np.median(ours))
        fio_iops = float(np.median(fio)) if fio else None
        engine_iops = float(np.median(engine)) if engine else None
        p50, p99, p999 = percentiles_us(hist)

        log = dev.log()
        registered = _copied_per_read(dev, nsid, dev.alloc(4096))
        bounce = _copied_per_read(dev, nsid, np.zeros(4096, np.uint8))
        return {
            "nop_rtt_us_p50": nop_p50, "nop_rtt_us_p99": nop_p99,
            "nop_batch32_rtt_us_p50": b_p50, "nop_batch32_rtt_us_p99": b_p99,
            "randread_4k_qd32_iops": iops,
            "randread_4k_qd32_lat_us": {"p50": p50, "p99": p99, "p999": p999},
            "fio_randread_4k_qd32_iops": fio_iops,
            "ratio_fio": iops / fio_iops if fio else None,
            # fio itself through the queue (its ssdemu engine, one job): against the C loop
            "fio_engine_randread_4k_qd32_iops": engine_iops,
            "ratio_engine": engine_iops / iops if engine else None,
            # fio's null engine, the same job: fio's own work per I/O (1/IOPS), the part of the
            # engine's time that the C loop does not spend
            "fio_null_randread_4k_qd32_iops": float(np.median(null)) if null else None,
            # each slice's figure, in the order run: how far one placement of the threads
            # on a busy host moves either side
            "randread_4k_qd32_iops_slices": ours, "fio_randread_4k_qd32_iops_slices": fio,
            "fio_engine_randread_4k_qd32_iops_slices": engine,
            "slices": SLICES,
            "bytes_copied_per_read_registered": registered,
            "bytes_copied_per_read_bounce": bounce,
            # the data plane's idle spins: given up (descheduled mid-spin), and not started
            # (a client waited on its CPU); sde_spin.h
            "data_plane_spin_backoffs": log["spin_backoffs"],
            "data_plane_sleeps_shared_cpu": log["spin_shared_cpu"],
            "data_plane_sleeps": log["sleeps"],
            "media": ident["media"], "seconds": seconds,
            "note": (None if with_engine
                     else "fio not found (apt-get install fio): reporting ours only"
                     if not with_fio else "fio's ssdemu engine not built (make fio-engine)"),
        }
    finally:
        dev.close()


def run_engine(socket_path: str, nsid: int, bs: int, qd: int, seconds: float,
               ns_bytes: int, engine: str | None = None) -> float:
    """IOPS of fio's random reads through its ssdemu engine, on the bench's namespace (or
    through fio's `engine` in its place: `null` completes every I/O at once)."""
    cmd = fio_engine.command(socket_path, rw="randread", bs=bs, qd=qd, nsid=nsid,
                             seconds=seconds, size=ns_bytes)
    if engine:
        cmd = [a for a in cmd if not a.startswith(("--ioengine", "--nsid", "--filename"))]
        cmd += [f"--ioengine={engine}", "--filename=ssdemu-null"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"fio through the engine failed ({proc.returncode}): "
                           f"{proc.stderr.strip()[:300]}")
    return parse_fio_json(proc.stdout, "randread")["iops"]


def bench_queue(socket_path: str | None, media: str, seconds: float, ns_bytes: int) -> dict:
    """Against a running daemon, or one started here on `media` and stopped afterwards."""
    if socket_path:
        return run_bench(socket_path, seconds, ns_bytes)
    d = socket_dir("ssdemu-bench-", "sde.sock")
    # the transport is measured, not the modelled drive: no timing model
    daemon = DaemonProcess(os.path.join(d, "sde.sock"), media=media, extra=["--timing", "off"])
    try:
        return run_bench(daemon.socket_path, seconds, ns_bytes)
    finally:
        code, err = daemon.terminate()
        shutil.rmtree(d, ignore_errors=True)
        if code != 0:
            raise RuntimeError(f"the benchmark's daemon exited with {code}: {err[-300:]}")


def format_table(r: dict) -> str:
    fio = r["fio_randread_4k_qd32_iops"]
    lines = [
        f"queue bench on {r['media']}, {r['seconds']} s",
        f"  NOP round trip          p50 {r['nop_rtt_us_p50']:8.1f} us   "
        f"p99 {r['nop_rtt_us_p99']:8.1f} us",
        f"  NOP x32 round trip      p50 {r['nop_batch32_rtt_us_p50']:8.1f} us   "
        f"p99 {r['nop_batch32_rtt_us_p99']:8.1f} us",
        f"  4 KiB randread QD32     {r['randread_4k_qd32_iops']:,.0f} IOPS through the queue"
        + (f", fio {fio:,.0f} ({r['ratio_fio']:.2f}x)" if fio else ""),
        *([f"  fio through the engine   {r['fio_engine_randread_4k_qd32_iops']:,.0f} IOPS "
           f"({r['ratio_engine']:.2f}x the queue's; fio's null engine "
           f"{r['fio_null_randread_4k_qd32_iops']:,.0f})"] if r.get("ratio_engine") else []),
        f"  bytes copied per read   registered {r['bytes_copied_per_read_registered']:.0f}, "
        f"bounce {r['bytes_copied_per_read_bounce']:.0f}",
    ]
    if r.get("note"):
        lines.append("  note: " + r["note"])
    return "\n".join(lines)
