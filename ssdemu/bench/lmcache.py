"""`ssdemu bench lmcache`: LMCache's store and retrieve of Llama-style chunks through the
ssdemu plug-in (hostlib.lmcache, a daemon on a file) and through LMCache's own
LocalDiskBackend on the same filesystem, in one run (ssdemu/bench/lmcache_run.py, in the LMCache
venv that `make test` builds).  Timing off: the figures measure the software path on this
machine, not the modelled drive."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile

from ssdemu.errors import SsdemuError
from ssdemu.tools.daemon_process import DaemonProcess

ROOT = pathlib.Path(__file__).resolve().parents[2]
LMCACHE_PYTHON = ROOT / ".venv-lmcache" / "bin" / "python"


class BenchUnavailable(SsdemuError):
    """LMCache is not installed here (the reason in one line)."""


def _run(py: pathlib.Path, base: str, socket_path: str, disk: str, chunks: int, quant: str,
         which: str) -> dict:
    """lmcache_run.py in the LMCache venv: `which` is both (the plug-in, then LocalDisk on
    disk) or local_disk (LocalDisk alone)."""
    # -I: not the script's folder on sys.path (ssdemu/bench/queue.py would shadow queue)
    p = subprocess.run([str(py), "-I", str(pathlib.Path(__file__).with_name("lmcache_run.py")),
                        socket_path, disk, str(chunks), quant, which], capture_output=True,
                       text=True, timeout=1800, cwd=base,
                       # LMCache's metrics files, else in /tmp/lmcache_prometheus; the
                       # plug-in's owner key (a fresh one), else in ~/.config
                       env=os.environ | {"PROMETHEUS_MULTIPROC_DIR":
                                         os.path.join(base, "prometheus"),
                                         "XDG_CONFIG_HOME": base})
    if p.returncode != 0:
        raise RuntimeError(f"the LMCache run failed: {p.stderr.strip().splitlines()[-1]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _on_drive(py, base: str, socket_path: str, chunks: int, quant: str) -> dict:
    """LMCache's LocalDiskBackend, unmodified, with its folder on ext4 on the drive (`fs up`
    on a namespace of its own); what the drive wrote and read meanwhile."""
    import hostlib
    from ssdemu.tools import mount

    with hostlib.connect(socket_path) as dev:
        nsid = dev.ns_create((chunks * 32 * 5 // 2 + 256) << 20)  # chunks, ext4's own
        before = dev.log()["classes"]
    fs = os.path.join(base, "on-drive")
    os.makedirs(fs)
    mount.fs_up(socket_path, nsid, fs, mkfs=True)
    try:
        out = _run(py, base, socket_path, os.path.join(fs, ""), chunks, quant,
                   "local_disk")["local_disk"]
    finally:
        mount.fs_down(fs)
    with hostlib.connect(socket_path) as dev:
        after = dev.log()["classes"]
    out["drive_write_bytes"] = after["write"]["bytes"] - before["write"]["bytes"]
    out["drive_read_bytes"] = after["read"]["bytes"] - before["read"]["bytes"]
    return out


def bench_lmcache(chunks: int = 16, where: str | None = None, quant: str = "none",
                  python: str | None = None, on_drive: bool = False) -> dict:
    """on_drive: LocalDisk a second time, its folder on ext4 on the drive."""
    py = pathlib.Path(python) if python else LMCACHE_PYTHON
    unavailable = ROOT / ".venv-lmcache" / "UNAVAILABLE"
    if not py.exists() or (python is None and unavailable.exists()):
        why = unavailable.read_text().strip() if unavailable.exists() else \
            f"{py} not found: `make test` (or `make lmcache-venv`) builds the LMCache venv"
        raise BenchUnavailable(why)
    base = tempfile.mkdtemp(prefix="ssdemu-bench-lmcache-", dir=where or "/var/tmp")
    try:
        disk = os.path.join(base, "local-disk")
        os.makedirs(disk)
        size_gib = max(2, -(-chunks * 32 * (6 if on_drive else 3) // 1024))  # room to spare
        d = DaemonProcess(os.path.join(base, "s.sock"),
                          media=f"file:{os.path.join(base, 'drive.img')}:{size_gib}G",
                          extra=["--timing", "off"], log_path=os.path.join(base, "d.log"))
        try:
            out = _run(py, base, d.socket_path, disk, chunks, quant, "both")
            if on_drive:
                out["local_disk_on_drive"] = _on_drive(py, base, d.socket_path, chunks, quant)
        finally:
            d.terminate()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out["filesystem_dir"] = where or "/var/tmp"
    out["timing"] = "off"
    plugin, disk = out["plugin"], out["local_disk"]
    out["store_ratio"] = plugin["store_MBps"] / disk["store_MBps"]
    # against LocalDisk warm (its page cache: memory) and cold (its disk)
    for op in ("retrieve", "retrieve_concurrent"):
        out[f"{op}_ratio_warm"] = plugin[f"{op}_MBps"] / disk[f"{op}_MBps"]
        out[f"{op}_ratio_cold"] = plugin[f"{op}_MBps"] / disk[f"{op}_cold_MBps"]
    return out


def format_table(r: dict) -> str:
    rows = [f"LMCache, {r['chunks']} chunks of {r['chunk_bytes'] >> 20} MiB (Llama-3-8B, 256 "
            f"tokens), quant {r['quant']}, on {r['filesystem_dir']}",
            f"{'backend':<16}{'store MB/s':>12}{'retrieve MB/s':>15}"
            f"{'all at once MB/s':>18}{'bit-exact':>11}"]
    p, d = r["plugin"], r["local_disk"]
    rows.append(f"{'plugin':<16}{p['store_MBps']:>12.0f}{p['retrieve_MBps']:>15.0f}"
                f"{p['retrieve_concurrent_MBps']:>18.0f}{str(p['bit_exact']):>11}")
    rows.append(f"{'local disk warm':<16}{d['store_MBps']:>12.0f}{d['retrieve_MBps']:>15.0f}"
                f"{d['retrieve_concurrent_MBps']:>18.0f}{str(d['bit_exact']):>11}")
    rows.append(f"{'local disk cold':<16}{'':>12}{d['retrieve_cold_MBps']:>15.0f}"
                f"{d['retrieve_concurrent_cold_MBps']:>18.0f}")
    if "local_disk_on_drive" in r:
        o = r["local_disk_on_drive"]
        rows.append(f"{'disk on drive':<16}{o['store_MBps']:>12.0f}{o['retrieve_MBps']:>15.0f}"
                    f"{o['retrieve_concurrent_MBps']:>18.0f}{str(o['bit_exact']):>11}")
        rows.append(f"{'  cold':<16}{'':>12}{o['retrieve_cold_MBps']:>15.0f}"
                    f"{o['retrieve_concurrent_cold_MBps']:>18.0f}")
    rows.append(f"plugin / local disk: store {r['store_ratio']:.2f}x; retrieve "
                f"{r['retrieve_ratio_warm']:.2f}x warm, {r['retrieve_ratio_cold']:.2f}x cold; "
                f"all at once {r['retrieve_concurrent_ratio_warm']:.2f}x warm, "
                f"{r['retrieve_concurrent_ratio_cold']:.2f}x cold")
    return "\n".join(rows)
