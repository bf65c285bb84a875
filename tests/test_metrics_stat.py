"""Metrics people can watch: Prometheus text at /metrics from a running daemon after known
traffic, and `ssdemu stat` rows under a terminal and into a pipe."""

from __future__ import annotations

import os
import pty
import select
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

import hostlib
from ssdemu.tools.daemon_process import DaemonProcess
from ssdemu.tools.stat import interval_row


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_known_traffic(tmp_path):
    port = _free_port()
    d = DaemonProcess(str(tmp_path / "s.sock"), extra=["--timing", "off", "--metrics",
                                                        f"127.0.0.1:{port}"])
    try:
        before = _scrape(port)
        assert all(name.startswith("ssdemu_") for name, _ in before)
        with hostlib.connect(d.socket_path) as dev:
            ns = dev.ns_create(1 << 20)
            buf = dev.alloc(4096)
            for i in range(10):
                dev.write(ns, i * 8, buf)
            for i in range(5):
                dev.read(ns, i * 8, buf)
            for i in range(7):
                dev.kv_put(b"m%d" % i, np.full(1000, i, np.uint8))
            for i in range(3):
                dev.kv_get(b"m%d" % i)
        m = _scrape(port)
        cls = (("class", "write"),)
        assert m[("ssdemu_commands_total", cls)] == 10
        assert m[("ssdemu_bytes_total", cls)] == 10 * 4096
        assert m[("ssdemu_commands_total", (("class", "read"),))] == 5
        assert m[("ssdemu_commands_total", (("class", "kv"),))] == 10
        assert m[("ssdemu_latency_seconds_count", cls)] == 10
        buckets = sorted((float(dict(lb)["le"]), v) for (name, lb), v in m.items()
                         if name == "ssdemu_latency_seconds_bucket" and dict(lb)["class"] ==
                         "write")
        assert buckets[-1] == (float("inf"), 10)
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:], strict=False))
        assert m[("ssdemu_store_keys", ())] == 7
        assert m[("ssdemu_store_logical_bytes", ())] == 7000
        assert m[("ssdemu_errors_total", cls)] == 0
    finally:
        assert d.terminate()[0] == 0


def _page(commands: int, lat_total: int, hist: dict[int, int], device_ns: int = 0) -> dict:
    classes = {c: {"commands": 0, "bytes": 0, "errors": 0, "latency_ns_total": 0,
                   "latency_histogram_log2_ns": {}}
               for c in ("nop", "read", "write", "flush", "zero", "admin", "invalid", "kv",
                         "compute")}
    classes["read"] = {"commands": commands, "bytes": commands * 4096, "errors": 0,
                       "latency_ns_total": lat_total,
                       "latency_histogram_log2_ns": {str(b): n for b, n in hist.items()}}
    return {"classes": classes, "compute": {"quantize": {"device_ns": device_ns},
                                            "prefix_match": {"device_ns": device_ns // 4}}}


def test_interval_figures():
    a = _page(100, 10_000_000, {10: 100})
    b = _page(1100, 2_010_000_000, {10: 100, 12: 980, 20: 20})  # 1000 reads in 2 s
    row = interval_row(a, b, 2.0, compute_units=1)
    assert row["r/s"] == 500 and row["rMB/s"] == 500 * 4096 / 1e6
    assert row["qd"] == 1.0  # 2 s of latency summed over 2 s: one in flight on average
    assert row["p50us"] == 2 ** 12.5 / 1e3 and row["p99us"] == 2 ** 20.5 / 1e3
    c = _page(1100, 2_010_000_000, {10: 100, 12: 980, 20: 20}, device_ns=500_000_000)
    row = interval_row(b, c, 1.0, compute_units=2)
    assert (row["cmp%"], row["q%"], row["pm%"], row["dq%"]) == (31.25, 25.0, 6.25, 0.0)


def test_stat_prints_rows_under_a_terminal_and_into_a_pipe(tmp_path):
    d = DaemonProcess(str(tmp_path / "s.sock"), extra=["--timing", "off"])
    try:
        cmd = [sys.executable, "-m", "ssdemu", "stat", "--socket", d.socket_path, "0.2"]
        pid, fd = pty.fork()
        if pid == 0:  # the child: stdout is a terminal
            os.execv(sys.executable, [*cmd[:1], *cmd[1:], "--count", "3"])
        out = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 1)[0]:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
        os.waitpid(pid, 0)
        lines = out.decode().splitlines()
        assert lines[1].split()[:3] == ["time", "r/s", "w/s"]
        assert len(lines) == 5 and all(len(row.split()) == 17 for row in lines[2:])
        # into a pipe: each row arrives as it is printed, not at exit, and shows the
        # traffic of its interval: kv/s times the interval, over the rows that saw 200
        # puts, is about 200
        header = lines[1].split()
        kv_col = header.index("kv/s")
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            with hostlib.connect(d.socket_path) as dev:
                p.stdout.readline()
                p.stdout.readline()
                quiet = p.stdout.readline().split()  # an interval with no traffic
                for _ in range(200):
                    dev.kv_put(b"k", b"v")
                # rows enough to hold the puts even on a busy machine (later ones show 0)
                rows = [p.stdout.readline().split() for _ in range(8)]
            assert all(len(r) == 17 for r in rows) and float(quiet[kv_col]) == 0
            seen = sum(float(r[kv_col]) * 0.2 for r in rows)  # per second x 0.2 s
            assert 100 <= seen <= 300, rows  # intervals run a little over 0.2 s
        finally:
            p.kill()
            p.wait()
    finally:
        assert d.terminate()[0] == 0
