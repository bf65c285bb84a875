"""`ssdemu bench hops`: what each hop of a remote KV retrieve would cost, measured on this
machine, for the paper design of a data-mode pool across hosts (docs/sweeps.md): a value
retrieved from a local daemon into a registered buffer (the drive hop), the same bytes over a
TCP connection (the fabric hop of a TCP transport such as the Mooncake Transfer Engine's), and
memcpy of the same bytes in the same run (the baseline every hop is a multiple of)."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time

import numpy as np

import hostlib
from ssdemu.tools.daemon_process import DaemonProcess, socket_dir


def _median_s(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _tcp_receiver(nbytes: int, rounds: int):
    """A loopback TCP pair: the sender's side of each round blocks until the receiver has all
    the bytes (it answers one byte), so a round is a whole transfer, not a buffer fill."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    sink = bytearray(nbytes)

    def serve():
        conn, _ = srv.accept()
        with conn:
            view = memoryview(sink)
            for _ in range(rounds):
                got = 0
                while got < nbytes:
                    got += conn.recv_into(view[got:], nbytes - got)
                conn.sendall(b"k")
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return port, t


def run_bench(socket_path: str, value_bytes: int, rounds: int) -> dict:
    data = np.random.default_rng(3).integers(0, 256, value_bytes, dtype=np.uint8)
    out = np.empty_like(data)
    memcpy_s = _median_s(lambda: np.copyto(out, data), rounds)

    with hostlib.connect(socket_path) as dev:
        src = dev.alloc(value_bytes)
        dst = dev.alloc(value_bytes)
        src[:] = data
        dev.kv_put(b"hop-block", src)
        get_s = _median_s(lambda: dev.kv_get(b"hop-block", dst), rounds)
        ok = bool(np.array_equal(dst, data))
        dev.kv_delete(b"hop-block")

    port, t = _tcp_receiver(value_bytes, rounds + 1)
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def send():
            c.sendall(memoryview(data))
            c.recv(1)
        send()  # warm the connection
        tcp_s = _median_s(send, rounds)
    t.join(10)

    # a small command's round trip each way: the 64-byte command message of the design
    port, t = _tcp_receiver(64, 2001)
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg = bytes(64)

        def ping():
            c.sendall(msg)
            c.recv(1)
        ping()
        tcp_rtt_s = _median_s(ping, 2000)
    t.join(10)

    gb = value_bytes / 1e9
    return {"value_bytes": value_bytes, "rounds": rounds, "data_ok": ok,
            "memcpy_s": memcpy_s, "memcpy_gb_s": gb / memcpy_s,
            "drive_get_s": get_s, "drive_get_gb_s": gb / get_s,
            "tcp_loopback_s": tcp_s, "tcp_loopback_gb_s": gb / tcp_s,
            "tcp_64b_round_trip_us": tcp_rtt_s * 1e6,
            "drive_get_vs_memcpy": get_s / memcpy_s,
            "tcp_vs_memcpy": tcp_s / memcpy_s,
            "remote_get_s": get_s + tcp_s + tcp_rtt_s,
            "remote_vs_local_get": (get_s + tcp_s + tcp_rtt_s) / get_s}


def bench_hops(socket_path: str | None, value_bytes: int, rounds: int) -> dict:
    if socket_path:
        return run_bench(socket_path, value_bytes, rounds)
    tmp = socket_dir("ssdemu-hops-")
    d = DaemonProcess(os.path.join(tmp, "s.sock"), f"mem:{max(256, 4 * value_bytes >> 20)}M",
                      extra=["--timing", "off"])
    try:
        return run_bench(d.socket_path, value_bytes, rounds)
    finally:
        d.terminate()
        shutil.rmtree(tmp, ignore_errors=True)


def format_table(r: dict) -> str:
    mib = r["value_bytes"] / (1 << 20)
    return "\n".join([
        f"one {mib:.0f} MiB value, median of {r['rounds']} rounds (data "
        f"{'verified' if r['data_ok'] else 'WRONG'}):",
        f"  memcpy                  {r['memcpy_s'] * 1e3:8.2f} ms  {r['memcpy_gb_s']:6.2f} GB/s",
        f"  drive get (local)       {r['drive_get_s'] * 1e3:8.2f} ms  "
        f"{r['drive_get_gb_s']:6.2f} GB/s  ({r['drive_get_vs_memcpy']:.2f}x memcpy)",
        f"  TCP loopback transfer   {r['tcp_loopback_s'] * 1e3:8.2f} ms  "
        f"{r['tcp_loopback_gb_s']:6.2f} GB/s  ({r['tcp_vs_memcpy']:.2f}x memcpy)",
        f"  TCP 64-byte round trip  {r['tcp_64b_round_trip_us']:8.1f} us",
        f"  remote get (sum)        {r['remote_get_s'] * 1e3:8.2f} ms  "
        f"({r['remote_vs_local_get']:.2f}x the local get)"])
