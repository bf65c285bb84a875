"""`ssdemu bench mlperf-kv`: the MLPerf Storage KV-cache benchmark, unmodified, its own file
backend (NVMeBackend: one .npy file an entry, written with fsync, read after dropping the page
cache) with its cache directory on ext4 on the drive, then on the machine's own disk, with
the same arguments and seed.

The benchmark is not shipped with ssdemu (nor on PyPI): point --benchmark at a checkout's
kv_cache_benchmark folder (mlcommons/storage, or russfellows/mlc-storage), whose kv-cache.py
is run as its README runs it.  Its figures are its own (its JSON summary); what ssdemu adds:
the bytes the drive wrote and read meanwhile, and its files checked after the run: how many
load as the .npy files they are, how many are short (an entry still being written when the
run ended: a prefix of what its header says; the benchmark joins its user threads for 2 s at
the end, then exits with their writes cut off) and how many corrupt (whole length, and not
loading: none may be), and that all read back the same after the filesystem was taken down and
mounted again (what it wrote is on the drive, not in a cache).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

import hostlib
from ssdemu.tools import mount
from ssdemu.tools.daemon_process import DaemonProcess, socket_dir

GIB = 1 << 30


def _npy_state(path: str) -> str:
    """whole (loads), short (a prefix of what its header says: its writer was still writing
    when the run ended) or corrupt (as long as its header says, and does not load)."""
    import numpy as np

    try:
        np.load(path, allow_pickle=False)
        return "whole"
    except (ValueError, EOFError, OSError):
        pass
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                    else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read(f)
            want = f.tell() + int(np.prod(shape)) * dtype.itemsize
    except (ValueError, EOFError, OSError):
        return "short" if os.path.getsize(path) < 128 else "corrupt"  # not even a header
    return "short" if os.path.getsize(path) < want else "corrupt"


def _files(folder: str) -> tuple[dict[str, str], dict[str, int]]:
    """(name: digest of each .npy the benchmark left, how many are whole, short, corrupt)."""
    out, states = {}, {"whole": 0, "short": 0, "corrupt": 0}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".npy"):
            path = os.path.join(folder, name)
            states[_npy_state(path)] += 1
            with open(path, "rb") as f:
                out[name] = hashlib.blake2b(f.read()).hexdigest()
    return out, states


def _run(script: str, cache_dir: str, args: list[str], out_json: str) -> dict:
    import json

    p = subprocess.run([sys.executable, script, "--cache-dir", cache_dir, "--output", out_json,
                        *args], capture_output=True, text=True, cwd=os.path.dirname(script),
                       timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"the benchmark failed ({p.returncode}): "
                           f"{(p.stderr or p.stdout).strip()[-300:]}")
    with open(out_json) as f:
        s = json.load(f)["summary"]
    cache = s.get("cache_stats", {})
    return {"requests": s["total_requests"],
            "tokens_per_s": s["avg_throughput_tokens_per_sec"],
            "storage_tokens_per_s": s["storage_throughput_tokens_per_sec"],
            "storage_io_latency_ms": s["storage_io_latency_ms"],
            "cache_hit_rate": cache.get("cache_hit_rate")}


def bench_mlperf_kv(benchmark: str, *, users: int = 8, duration: int = 20,
                    capacity_gb: float = 1.0, profile: str = "star2000d", seed: int = 7,
                    where: str | None = None) -> dict:
    script = os.path.join(benchmark, "kv-cache.py")
    if not os.path.isfile(script):
        raise RuntimeError(f"{script} not found: --benchmark is a checkout's "
                           "kv_cache_benchmark folder (mlcommons/storage)")
    args = ["--model", "llama3.1-8b", "--num-users", str(users), "--duration", str(duration),
            "--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--storage-capacity-gb",
            str(capacity_gb), "--seed", str(seed)]
    base = tempfile.mkdtemp(prefix="ssdemu-bench-mlperf-", dir=where or "/var/tmp")
    ns_bytes = int((capacity_gb * 1.5 + 0.25) * GIB) >> 20 << 20  # entries, ext4's own
    # the socket apart: `where` (a test's tmp_path) can be past a Unix socket path's length
    sock_dir = socket_dir("ssdemu-mlperf-")
    d = DaemonProcess(os.path.join(sock_dir, "s.sock"),
                      media=f"file:{os.path.join(base, 'drive.img')}:"
                            f"{-(-ns_bytes * 2 // GIB) + 1}G",
                      extra=["--profile", profile], log_path=os.path.join(base, "d.log"))
    try:
        with hostlib.connect(d.socket_path) as dev:
            nsid = dev.ns_create(ns_bytes)
            before = dev.log()["classes"]
        fs = os.path.join(base, "fs")
        os.mkdir(fs)
        mount.fs_up(d.socket_path, nsid, fs, mkfs=True)
        try:
            on_drive = _run(script, os.path.join(fs, "kv"), args, os.path.join(base, "d.json"))
            files, bad = _files(os.path.join(fs, "kv"))
        finally:
            mount.fs_down(fs)
        with hostlib.connect(d.socket_path) as dev:
            after = dev.log()["classes"]
        mount.fs_up(d.socket_path, nsid, fs)  # again: the files as the drive holds them
        try:
            again, _ = _files(os.path.join(fs, "kv"))
        finally:
            mount.fs_down(fs)
        on_drive["files"] = bad
        on_drive["files_same_after_remount"] = again == files
        on_drive["drive_write_bytes"] = after["write"]["bytes"] - before["write"]["bytes"]
        on_drive["drive_read_bytes"] = after["read"]["bytes"] - before["read"]["bytes"]
        own_dir = os.path.join(base, "own", "kv")
        own = _run(script, own_dir, args, os.path.join(base, "own.json"))
        own["files"] = _files(own_dir)[1]
    finally:
        d.terminate()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(sock_dir, ignore_errors=True)
    return {"on_drive": on_drive, "own_disk": own, "profile": profile, "users": users,
            "duration_s": duration, "capacity_gb": capacity_gb, "seed": seed,
            "own_disk_dir": where or "/var/tmp"}


def format_table(r: dict) -> str:
    rows = [f"MLPerf Storage KV-cache benchmark, its file backend: {r['users']} users, "
            f"{r['duration_s']} s, {r['capacity_gb']} GiB tier, seed {r['seed']}",
            f"{'where':<12}{'requests':>9}{'tokens/s':>10}{'storage tok/s':>14}"
            f"{'storage p95 ms':>15}{'hit rate':>9}{'files w/s/c':>12}"]
    for name in ("on_drive", "own_disk"):
        x = r[name]
        rows.append(f"{name:<12}{x['requests']:>9}{x['tokens_per_s']:>10.1f}"
                    f"{x['storage_tokens_per_s']:>14.1f}"
                    f"{x['storage_io_latency_ms']['p95']:>15.1f}"
                    f"{(x['cache_hit_rate'] or 0):>9.2f}"
                    f"{'/'.join(str(x['files'][k]) for k in ('whole', 'short', 'corrupt')):>9}")
    o = r["on_drive"]
    rows.append(f"on the drive ({r['profile']}): {o['drive_write_bytes'] / 1e6:.0f} MB written, "
                f"{o['drive_read_bytes'] / 1e6:.0f} MB read; files the same after a remount: "
                f"{o['files_same_after_remount']}")
    return "\n".join(rows)
