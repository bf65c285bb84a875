"""`ssdemu bench queue`: the queue pair and the daemon, measured from a client process.

NOP round trips through hostlib (one command, and batches of 32); 4 KiB random reads at QD32
through the queue by a closed loop in C (c/tools/sde_client_loop.c), and fio on the same media in
the same run; the bytes the daemon copies per read, registered buffer vs bounce path.
"""

from __future__ import annotations

import os
import shutil
import time

import numpy as np

import hostlib
from ssdemu.bench import _client_loop
from ssdemu.bench.fio import fio_available, run_fio
from ssdemu.device.latency import new_histogram, percentiles_us
from ssdemu.tools.daemon_process import DaemonProcess, socket_dir
from ssdemu_wire.layout import OPCODES

ffi, lib = _client_loop.ffi, _client_loop.lib
NOP_ROUNDS = 3000
BATCH_ROUNDS = 500
COPY_READS = 64


def _pcts(samples_s: list[float]) -> tuple[float, float]:
    a = np.asarray(samples_s) * 1e6
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def _copied_per_read(dev, nsid: int, buf: np.ndarray) -> float:
    before = dev.log()["classes"]["read"]
    for i in range(COPY_READS):
        dev.read(nsid, i * 8, buf)
    after = dev.log()["classes"]["read"]
    return (after["bytes_copied"] - before["bytes_copied"]) / (after["commands"]
                                                               - before["commands"])


def run_bench(socket_path: str, seconds: float, ns_bytes: int) -> dict:
    dev = hostlib.connect(socket_path, entries=256)
    try:
        ident = dev.identify()
        # within the drive and this uid's share of it (serve --max-namespace-bytes-per-uid),
        # whole MiBs (the fill below writes 1 MiB at a time)
        ns_bytes = min(ns_bytes, ident["capacity_bytes"],
                       dev.log()["quotas"]["namespace_bytes"]) >> 20 << 20
        nsid = dev.ns_create(ns_bytes)
        start = next(n["start"] for n in dev.namespaces() if n["nsid"] == nsid)
        chunk = dev.alloc(1 << 20)
        chunk[:] = np.random.default_rng(1).integers(0, 256, chunk.size, dtype=np.uint8)
        futures = [dev.write_async(nsid, off // 512, chunk) for off in range(0, ns_bytes,
                                                                            1 << 20)]
        for f in futures:  # fill it: reads of holes would measure the zero page
            f.result()
        dev.free(chunk)

        lat = []
        for _ in range(NOP_ROUNDS):
            t = time.perf_counter()
            dev.nop()
            lat.append(time.perf_counter() - t)
        nop_p50, nop_p99 = _pcts(lat)
        lat = []
        for _ in range(BATCH_ROUNDS):
            t = time.perf_counter()
            dev.reap(dev.submit_batch([{"opcode": OPCODES["NOP"]}] * 32), 32)
            lat.append(time.perf_counter() - t)
        b_p50, b_p99 = _pcts(lat)

        qd, bs = 32, 4096
        buf = dev.alloc(qd * bs)
        handle, _ = dev._locate(buf)
        hist = new_histogram()
        out = ffi.new("uint64_t[3]")
        qp = dev.qp
        r = lib.sde_client_loop(qp.mem, qp.doorbell_fd, qp.completion_fd, OPCODES["READ"],
                                nsid, handle, bs, qd, ns_bytes // 512, int(seconds * 1e9), 7,
                                ffi.NULL, ffi.cast("uint64_t *", hist.ctypes.data), out)
        if r < 0:
            raise RuntimeError(f"queue read loop failed: {os.strerror(-r)}")
        if out[1]:
            raise RuntimeError(f"{out[1]} reads through the queue failed")
        iops = out[0] / (out[2] / 1e9)
        p50, p99, p999 = percentiles_us(hist)

        fio = None
        if fio_available():
            fio = run_fio(ident["media_path"], rw="randread", bs=bs, qd=qd, seconds=seconds,
                          size=ns_bytes, offset=start)
        log = dev.log()
        registered = _copied_per_read(dev, nsid, dev.alloc(4096))
        bounce = _copied_per_read(dev, nsid, np.zeros(4096, np.uint8))
        return {
            "nop_rtt_us_p50": nop_p50, "nop_rtt_us_p99": nop_p99,
            "nop_batch32_rtt_us_p50": b_p50, "nop_batch32_rtt_us_p99": b_p99,
            "randread_4k_qd32_iops": iops,
            "randread_4k_qd32_lat_us": {"p50": p50, "p99": p99, "p999": p999},
            "fio_randread_4k_qd32_iops": fio["iops"] if fio else None,
            "ratio_fio": iops / fio["iops"] if fio else None,
            "bytes_copied_per_read_registered": registered,
            "bytes_copied_per_read_bounce": bounce,
            # the data plane's idle spins: given up (descheduled mid-spin), and not started
            # (a client waited on its CPU); sde_spin.h
            "data_plane_spin_backoffs": log["spin_backoffs"],
            "data_plane_sleeps_shared_cpu": log["spin_shared_cpu"],
            "data_plane_sleeps": log["sleeps"],
            "media": ident["media"], "seconds": seconds,
            "note": None if fio else "fio not found (apt-get install fio): reporting ours only",
        }
    finally:
        dev.close()


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
        f"  bytes copied per read   registered {r['bytes_copied_per_read_registered']:.0f}, "
        f"bounce {r['bytes_copied_per_read_bounce']:.0f}",
    ]
    if r.get("note"):
        lines.append("  note: " + r["note"])
    return "\n".join(lines)
