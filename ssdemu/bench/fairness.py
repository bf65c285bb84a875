"""`ssdemu bench fairness`: what one client's worst legal retrieval does to another's.

A hog process sends, back to back, the worst TOPK_PAGES a command may ask (each bound of
c/wire/sde_queue.h SDE_RETRIEVAL_MAX_* in turn: the most blocks, the most pages scored, the
largest re-rank, the largest result; and the most memory: the most keys, of blocks as large
as the host's decoded cache keeps a sequence of them whole), while a victim — another
connection of the same uid, another process — times its one-block TOPK_PAGES and its NOPs
on the real clock.  The baseline is the victim alone, in the same run, and beside one
process spinning on a core (what any busy neighbour costs on this host: on 2 cores it alone
doubles a NOP's p99).  The daemon's memory: its peak RSS over the hog's first command of
each kind (cold: the kernels loaded before) and over the rest, above its RSS before (/proc:
VmHWM after clear_refs).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time

import numpy as np

import hostlib
from ssdemu.bench.neighbours import Neighbours
from ssdemu.device.retrieval import DECODED_BYTES
from ssdemu.tools.daemon_process import DaemonProcess, socket_dir
from ssdemu_wire import layout as W

# the victim's sequence: one 64-token block of SmolLM2's shape (3 KV heads, 9 query heads)
VICTIM = dict(tokens=64, layers=4, kv_heads=3, q_heads=9, head_dim=64)


def _worst(name: str) -> dict:
    """The hog's request: its blocks (count, tokens, kv_heads, head_dim) and TOPK arguments,
    each at one bound of a command."""
    if name == "keys":  # the most blocks, a page each: the per-block work
        return dict(blocks=W.RETRIEVAL_MAX_KEYS, tokens=16, heads=1, dim=16,
                    args=dict(k=8, page_tokens=16))
    if name == "scored":  # the most summary elements, a token a page
        return dict(blocks=256, tokens=W.RETRIEVAL_MAX_SCORED // (256 * 64), heads=1, dim=64,
                    args=dict(k=8, page_tokens=1))
    if name == "rerank":  # the largest re-rank read: k x rerank pages of 16 tokens x 8 x 128
        return dict(blocks=64, tokens=1024, heads=8, dim=128,
                    args=dict(k=8, rerank=W.RETRIEVAL_MAX_READ // (8 * 16 * 8 * 128),
                              page_tokens=16))
    if name == "memory":  # the most keys, each block as large as the host's decoded cache
        # (DECODED_BYTES) keeps a sequence of them whole: the most that command can fill it
        dim = DECODED_BYTES // (W.RETRIEVAL_MAX_KEYS * 16 * 2 * 2 * 2)
        return dict(blocks=W.RETRIEVAL_MAX_KEYS, tokens=16, heads=2, dim=dim,
                    args=dict(k=8, page_tokens=16))
    if name == "result":  # the largest result, k pages per head of a 4096-page sequence
        heads = 8
        return dict(blocks=64, tokens=1024, heads=heads, dim=8,
                    args=dict(k=W.RETRIEVAL_MAX_RESULT // (8 * heads), page_tokens=1))
    raise ValueError(name)


# memory first: the hogs run in one daemon, and a cache the others filled gives the memory
# hog's entries room by evicting theirs (it measured 10.5 MiB cold after them, 59 MiB first)
KINDS = ("memory", "keys", "scored", "rerank", "result")


def _store_worst(dev, kind: str) -> tuple[list, np.ndarray, dict]:
    w = _worst(kind)
    rng = np.random.default_rng(7)
    keys = [f"h{kind[0]}/{i:05d}".encode() for i in range(w["blocks"])]
    block = rng.standard_normal((w["tokens"], 2, 1, w["heads"], w["dim"])).astype(np.float16)
    raw = block.view(np.uint16).tobytes()
    for key in keys:
        dev.kv_put(key, raw)
    q = rng.standard_normal((w["heads"], w["dim"])).astype(np.float32)
    return keys, q, dict(layer=0, layers=1, kv_heads=w["heads"], **w["args"])


def _rss_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def _reset_peak(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _hog(socket_path: str, kind: str, ready, stop, out) -> None:
    """The hog's process: the worst request of its kind, back to back until stopped."""
    with hostlib.connect(socket_path) as dev:
        keys, q, args = _store_worst(dev, kind)
        ready.set()
        times = []
        while not stop.is_set():
            t = time.perf_counter()
            dev.topk_pages(keys, q, **args)
            times.append(time.perf_counter() - t)
            ready.set()
        out.put(times)
        for key in keys:
            dev.kv_delete(key)


def _victim_rounds(dev, keys, q, seconds: float) -> tuple[list, list]:
    """One-block TOPKs for `seconds`, then NOPs for as long: their round trips."""
    topk, nops = [], []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        dev.topk_pages(keys, q, layer=1, layers=VICTIM["layers"],
                       kv_heads=VICTIM["kv_heads"], k=1)
        topk.append(time.perf_counter() - t)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        dev.nop()
        nops.append(time.perf_counter() - t)
    return topk, nops


def _ms(samples) -> dict:
    a = np.asarray(samples) * 1e3
    if not len(a):
        return {"n": 0}
    return {"n": int(len(a)), "p50_ms": float(np.percentile(a, 50)),
            "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max())}


def bench_fairness(media: str = "mem:1G", seconds: float = 5.0, kinds=KINDS,
                   profile: str | None = None) -> dict:
    ctx = multiprocessing.get_context("spawn")  # a process of its own: its own GIL
    where = socket_dir("ssdemu-fair-", "sde.sock")
    sock = os.path.join(where, "sde.sock")
    extra = ("--profile", profile) if profile else ()
    try:
        d = DaemonProcess(sock, media=media, extra=extra, log_path=os.path.join(where, "log"))
    except BaseException:  # it did not start: its error carries the log's tail
        shutil.rmtree(where, ignore_errors=True)
        raise
    try:
        with hostlib.connect(sock) as dev:
            rng = np.random.default_rng(1)
            v = VICTIM
            block = rng.standard_normal((v["tokens"], 2, v["layers"], v["kv_heads"],
                                         v["head_dim"])).astype(np.float16)
            vkeys = [b"victim/0"]
            dev.kv_put(vkeys[0], block.view(np.uint16).tobytes())
            q = rng.standard_normal((v["q_heads"], v["head_dim"])).astype(np.float32)
            _victim_rounds(dev, vkeys, q, 0.5)  # the kernels compiled / loaded
            alone = _victim_rounds(dev, vkeys, q, seconds)
            with Neighbours(1):  # what any busy core beside it costs, on this host
                beside = _victim_rounds(dev, vkeys, q, seconds)
            report = {"media": media, "seconds": seconds, "workers":
                      dev.log()["retrieval"]["workers"],
                      "bounds": {"keys": W.RETRIEVAL_MAX_KEYS,
                                 "scored": W.RETRIEVAL_MAX_SCORED,
                                 "read": W.RETRIEVAL_MAX_READ,
                                 "result_bytes": W.RETRIEVAL_MAX_RESULT},
                      "alone": {"topk": _ms(alone[0]), "nop": _ms(alone[1])},
                      "beside_a_spinning_process": {"topk": _ms(beside[0]),
                                                    "nop": _ms(beside[1])},
                      "hogs": {}}
            for kind in kinds:
                ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
                hog = ctx.Process(target=_hog, args=(sock, kind, ready, stop, out))
                hog.start()
                if not ready.wait(300):
                    raise RuntimeError(f"the {kind} hog did not store its blocks")
                ready.clear()
                rss0 = _rss_kib(d.pid, "VmRSS")
                peak_ok = _reset_peak(d.pid)
                if not ready.wait(600):  # its first command, cold
                    raise RuntimeError(f"the {kind} hog's first command did not end")
                cold = _rss_kib(d.pid, "VmHWM") - rss0 if peak_ok else None
                rss1 = _rss_kib(d.pid, "VmRSS")
                _reset_peak(d.pid)
                topk, nops = _victim_rounds(dev, vkeys, q, seconds)
                warm = _rss_kib(d.pid, "VmHWM") - rss1 if peak_ok else None
                stop.set()
                hog_times = out.get(timeout=600)
                hog.join(600)
                r = {"request": {k: v for k, v in _worst(kind).items()},
                     "hog_command": _ms(hog_times), "topk": _ms(topk), "nop": _ms(nops),
                     "memory_growth_cold_mib": None if cold is None else cold / 1024,
                     "memory_growth_mib": None if warm is None else warm / 1024}
                r["topk_p99_vs_alone"] = r["topk"]["p99_ms"] / report["alone"]["topk"]["p99_ms"]
                r["nop_p99_vs_alone"] = r["nop"]["p99_ms"] / report["alone"]["nop"]["p99_ms"]
                r["nop_p99_vs_beside_a_spinning_process"] = (
                    r["nop"]["p99_ms"] / report["beside_a_spinning_process"]["nop"]["p99_ms"])
                report["hogs"][kind] = r
            dev.kv_delete(vkeys[0])
    finally:
        code, err = d.terminate()
        shutil.rmtree(where, ignore_errors=True)
    if code != 0:
        raise RuntimeError(f"the daemon exited {code}: {err[-500:]}")
    return report


def format_table(r: dict) -> str:
    a, n = r["alone"], r["beside_a_spinning_process"]
    n_busy = r.get("neighbours") or 0
    busy = (f" (beside {n_busy} spinning process{'es' if n_busy > 1 else ''} throughout)"
            if n_busy else "")
    lines = [f"retrieval workers: {r['workers']}{busy}; victim alone: one-block TOPK p99 "
             f"{a['topk']['p99_ms']:.2f} ms, NOP p99 {a['nop']['p99_ms']:.3f} ms; beside one "
             f"spinning process: {n['topk']['p99_ms']:.2f} ms, {n['nop']['p99_ms']:.3f} ms",
             f"{'hog':8} {'hog cmd p50':>12} {'TOPK p99':>9} {'x alone':>8} {'NOP p99':>9} "
             f"{'x alone':>8} {'mem cold':>9} {'mem warm':>9}"]
    for kind, h in r["hogs"].items():
        def mib(v):
            return "n/a" if v is None else f"{v:.1f}M"
        lines.append(f"{kind:8} {h['hog_command']['p50_ms']:10.1f}ms "
                     f"{h['topk']['p99_ms']:7.2f}ms {h['topk_p99_vs_alone']:7.2f}x "
                     f"{h['nop']['p99_ms']:7.3f}ms {h['nop_p99_vs_alone']:7.2f}x "
                     f"{mib(h['memory_growth_cold_mib']):>9} {mib(h['memory_growth_mib']):>9}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(format_table(bench_fairness(seconds=float(os.environ.get("SECONDS_", 3)))))
