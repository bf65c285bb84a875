"""`ssdemu bench kv`: the drive's own commands against its block path, through the same queue.

One closed-loop client at QD32, in C (c/tools/sde_client_loop.c, as `bench queue`), so that the
ratios measure the daemon and not Python in the client.  In one run, on one daemon (timing
off), each KV figure beside the figure it is held to, the two measured in turn (PAIR_SLICES
slices of each, ABBA, the median of each side):

- 4 KiB kv_put / kv_get (ops/s) against 4 KiB block writes / reads;
- 2 MiB kv_put / kv_get (bytes/s) against 1 MiB block writes / reads (a 2 MiB transfer as
  two 1 MiB commands, the block path's largest);
- a quantized store and a dequantized retrieve of a 512-token block of the tiny model at
  int8_g64 (bytes/s of the fp16 block) against the firmware kernel called directly on the
  same block shape, one thread, on QD inputs and outputs in turn (the buffers QD commands
  in flight use); the kernel on one buffer, in cache, is printed beside it;
- the bytes the daemon copies per KV put and get from registered buffers;
- hostlib's public calls with plain numpy arrays (copied through the queue pair's bounce or
  pooled staging buffers) against the same calls with registered buffers, at 64 KiB, 256 KiB
  and 2 MiB: blocking, and 8 in flight (futures); nine short slices of each in turn, the
  median of each.
Every put carries a fresh serial number in its value, so deduplication never turns a put
into a comparison.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time

import numpy as np

import hostlib
from ssdemu.bench import closed_loop
from ssdemu.tools.daemon_process import DaemonProcess, socket_dir
from ssdemu_wire.layout import OPCODES, QUANT_REQUEST_BYTES, pack_quant_request

QD = 32
KEY_HI = b"skv00000"  # the keys the C loop sends: index in bytes 0-7, this in 8-15
SIZES = {"4k": 4096, "2m": 2 << 20}
KEYS = {"4k": 16384, "2m": 96}
SCHEME = "int8_g64"


def _key(i: int) -> bytes:
    return i.to_bytes(8, "little") + KEY_HI


# each loop's seed: its offsets and keys, and the serials its stamps start from (seed << 32),
# so that no loop of a run repeats another's values (a repeated value is a dedup hit: hashed,
# never written)
_LOOP_SEEDS = itertools.count(11)


def _loop(dev, opcode: int, buf, bs: int, span: int, seconds: float, nsid: int = 0,
          stamp: bool = False, stamp_at: int = 0) -> dict:
    handle, _ = dev._locate(buf)
    n, secs = closed_loop.run(dev, opcode, handle, bs, QD, span, seconds, nsid=nsid,
                              seed=next(_LOOP_SEEDS),
                              stamp=buf.ctypes.data + stamp_at if stamp else 0)
    return {"ops_per_s": n / secs, "bytes_per_s": n * bs / secs, "commands": n}


# each drive figure and the baseline it is held to: PAIR_SLICES slices of each, in ABBA order, and
# the median of each side: on a shared VM the host's speed drifts within a run (a third within
# an hour here), and one figure measured after the other took that drift as the drive's
PAIR_SLICES = 4


def _rate_median(runs: list[dict]) -> dict:
    return {"ops_per_s": float(np.median([r["ops_per_s"] for r in runs])),
            "bytes_per_s": float(np.median([r["bytes_per_s"] for r in runs])),
            "commands": sum(r["commands"] for r in runs)}


def _paired(drive, baseline, seconds: float) -> tuple[dict, dict]:
    """drive(s) and baseline(s), each a run of s seconds returning a rate dict, in ABBA
    slices of seconds / PAIR_SLICES: the median of each side."""
    sides: tuple[list, list] = ([], [])
    for i in range(PAIR_SLICES):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for side in order:
            fn = drive if side == 0 else baseline
            sides[side].append(fn(seconds / PAIR_SLICES))
    return _rate_median(sides[0]), _rate_median(sides[1])


def _looper(dev, opcode: str, buf, bs: int, span: int, nsid: int = 0, **kw):
    """_loop with everything but its seconds given: a side of _paired."""
    return lambda seconds: _loop(dev, OPCODES[opcode], buf, bs, span, seconds, nsid, **kw)


def _copied(dev, cls: str, fn, n: int) -> float:
    before = dev.log()["classes"][cls]
    for i in range(n):
        fn(i)
    after = dev.log()["classes"][cls]
    return (after["bytes_copied"] - before["bytes_copied"]) / max(
        1, after["commands"] - before["commands"])


_SERIAL = itertools.count(1)
PY_SIZES = {"64k": 64 << 10, "256k": 256 << 10, "2m": 2 << 20}
PY_INFLIGHT = 8
PY_SLICES = 9  # per figure: registered and plain slices in turn


def _py_rate(dev, op: str, values: list, keys: list, seconds: float, inflight: int) -> float:
    """Bytes/s of hostlib's public KV calls over `values` (one per key, reused in turn)."""
    nbytes = values[0].nbytes
    # a put's value carries its serial number in its first 8 bytes (a value put again
    # unchanged is a deduplication hit: hashed, never written)
    stamps = [v[:8].view(np.uint64) for v in values]
    n, t0 = 0, time.perf_counter()
    pending: list = []
    while time.perf_counter() - t0 < seconds:
        i = n % len(keys)
        if op == "put":
            # its previous put has completed (at most `inflight` are out); a serial unique
            # to the run, so no round repeats another's values
            stamps[i][0] = next(_SERIAL)
        if inflight == 1:
            if op == "put":
                dev.kv_put(keys[i], values[i])
            else:
                dev.kv_get(keys[i], values[i])
        else:
            pending.append(dev.kv_put_async(keys[i], values[i]) if op == "put"
                           else dev.kv_get_async(keys[i], values[i]))
            if len(pending) == inflight:
                pending.pop(0).result()
        n += 1
    for f in pending:
        f.result()
    return n * nbytes / (time.perf_counter() - t0)


def _plain_vs_registered(dev, seconds: float) -> dict:
    """hostlib's calls with numpy arrays against registered buffers (issue 35, item 3)."""
    out = {}
    rng = np.random.default_rng(9)
    for name, size in PY_SIZES.items():
        reg = [dev.alloc(size) for _ in range(PY_INFLIGHT)]
        # plain arrays as numpy makes them (malloc's, 16 bytes into their pages when large)
        plain = [np.empty(size, np.uint8) for _ in range(PY_INFLIGHT)]
        for r, p in zip(reg, plain, strict=True):
            r[:] = rng.integers(0, 256, size, dtype=np.uint8)
            p[:] = r
        keys = [b"py%s-%d" % (name.encode(), i) for i in range(PY_INFLIGHT)]
        for k, r in zip(keys, reg, strict=True):
            dev.kv_put(k, r)
        row = {}
        for inflight, mode in ((1, "blocking"), (PY_INFLIGHT, "inflight8")):
            for op in ("put", "get"):
                rates: dict = {"registered": [], "plain": []}
                # short slices, the two kinds in turn, and the median of each: the host's
                # drift (2x within a minute on a shared VM) hits both alike, and one quiet
                # or noisy moment moves neither figure (a best of three did)
                for _ in range(PY_SLICES):
                    for kind, vals in (("registered", reg), ("plain", plain)):
                        rates[kind].append(_py_rate(dev, op, vals, keys,
                                                    seconds / (2 * PY_SLICES), inflight))
                mid = {k: float(np.median(v)) for k, v in rates.items()}
                row[f"{op}_{mode}"] = {"plain_bytes_per_s": mid["plain"],
                                       "registered_bytes_per_s": mid["registered"],
                                       "ratio_registered": mid["plain"] / mid["registered"]}
        for r in reg:
            dev.free(r)
        out[name] = row
    return out


class _Kernels:
    """The firmware's quantize and dequantize called directly, one thread, two ways: on the
    buffers QD commands in flight use (QD inputs and QD outputs in turn, as the drive's
    commands read the client's slots and write their own buffers or the client's: what the
    drive's kernels must do at QD32), and on one input and one output (`*_in_cache`: all in
    cache, a figure no queue of commands can reach).  The drive's ratios are held to the
    first; the second is printed beside it."""

    def __init__(self, block: np.ndarray):
        from firmware.quant import _block_shape as shape_of
        from firmware.quant import compressed_nbytes, dequantize, quantize

        size = compressed_nbytes(shape_of(block), SCHEME, "fp16")
        blocks = [block.copy() for _ in range(QD)]
        packed = [np.empty(size, np.uint8) for _ in range(QD)]
        raw = [np.empty_like(block) for _ in range(QD)]
        for i in range(QD):
            quantize(blocks[i], "fp16", SCHEME, out=packed[i])
        dequantize(packed[0], out=raw[0])  # compiled before timing
        self.nbytes = block.nbytes
        self.runs = {
            "quantize": lambda i: quantize(blocks[i], "fp16", SCHEME, out=packed[i]),
            "dequantize": lambda i: dequantize(packed[i], out=raw[i]),
            "quantize_in_cache": lambda i: quantize(blocks[0], "fp16", SCHEME, out=packed[0]),
            "dequantize_in_cache": lambda i: dequantize(packed[0], out=raw[0]),
        }

    def rate(self, name: str, seconds: float) -> dict:
        """fp16 bytes/s of one way for `seconds` (a rate dict, as _loop's)."""
        fn = self.runs[name]
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn(n % QD)
            n += 1
        secs = time.perf_counter() - t0
        return {"ops_per_s": n / secs, "bytes_per_s": n * self.nbytes / secs, "commands": n}


def run_bench(socket_path: str, seconds: float) -> dict:
    dev = hostlib.connect(socket_path, entries=256)
    try:
        out: dict = {"qd": QD}
        ns_bytes = min(256 << 20, dev.log()["quotas"]["namespace_bytes"] >> 20 << 20)
        nsid = dev.ns_create(ns_bytes)
        rng = np.random.default_rng(5)
        # the namespace written whole first, as bench queue's: the block baselines then neither
        # read holes (the zero page) nor pay for the media's first touch of a page (on memory
        # media, a page allocated and zeroed; on these VMs a host fault too), which the
        # single 2 s write loop before measured in its first ~0.3 s (4 KiB puts 0.72-0.78 of
        # it, against 0.65-0.72 of writes to written blocks)
        fill = dev.alloc(1 << 20)
        fill[:] = rng.integers(0, 256, fill.size, dtype=np.uint8)
        for f in [dev.write_async(nsid, off // 512, fill) for off in range(0, ns_bytes, 1 << 20)]:
            f.result()
        dev.free(fill)
        out.update(_kv_against_blocks(dev, nsid, ns_bytes, rng, seconds))
        out.update(_firmware_commands(dev, seconds))
        before = dev.log()["store"]["dedup_hits"]
        out["plain_vs_registered"] = _plain_vs_registered(dev, seconds)
        # 0 when every put of those rows stored its value
        out["plain_vs_registered_dedup_hits"] = dev.log()["store"]["dedup_hits"] - before
        store = dev.log()["store"]
        out["store"] = {k: store[k] for k in ("checkpoints", "journal_writes", "journal_records",
                                              "dedup_hits", "keys")}
        out["records_per_group_commit"] = (store["journal_records"]
                                           / max(1, store["journal_writes"] + store["checkpoints"]))
        return out
    finally:
        dev.close()


def _kv_against_blocks(dev, nsid: int, ns_bytes: int, rng, seconds: float) -> dict:
    """kv_put / kv_get of each size against block writes / reads of the same size through
    the same queue, and the bytes copied per 4 KiB KV command."""
    out: dict = {}
    for name, bs in SIZES.items():
        buf = dev.alloc(QD * bs)
        buf[:] = rng.integers(0, 256, buf.size, dtype=np.uint8)
        nkeys = KEYS[name]
        # load every key the gets will ask for
        for i in range(0, nkeys, QD):
            with dev.batch():
                fs = [dev.kv_put_async(_key(k), buf[(k % QD) * bs:(k % QD + 1) * bs])
                      for k in range(i, min(nkeys, i + QD))]
            for f in fs:
                f.result()
        blk = min(bs, 1 << 20)
        span = ns_bytes // 512
        p, w = _paired(_looper(dev, "KV_STORE", buf, bs, nkeys, stamp=True),
                       _looper(dev, "WRITE", buf, blk, span, nsid, stamp=True), seconds)
        g, r = _paired(_looper(dev, "KV_RETRIEVE", buf, bs, nkeys),
                       _looper(dev, "READ", buf, blk, span, nsid), seconds)
        unit = "ops_per_s" if name == "4k" else "bytes_per_s"
        out[f"kv_put_{name}"] = {unit: p[unit], "block_write": w[unit],
                                 "ratio_block": p[unit] / w[unit]}
        out[f"kv_get_{name}"] = {unit: g[unit], "block_read": r[unit],
                                 "ratio_block": g[unit] / r[unit]}
        if name == "4k":
            one = buf[:bs]
            out["bytes_copied_per_kv_put"] = _copied(
                dev, "kv", lambda i, one=one: dev.kv_put(b"copy%d" % i, one), 64)
            out["bytes_copied_per_kv_get"] = _copied(
                dev, "kv", lambda i, one=one: dev.kv_get(b"copy%d" % i, one), 64)
        dev.free(buf)

    return out


def _firmware_commands(dev, seconds: float) -> dict:
    """The in-drive quantized store and dequantized retrieve against the bare kernels."""
    out: dict = {}
    # the firmware: a 512-token block of the tiny model, fp16
    from ssdemu.replay.serving import SyntheticKV, model_config

    kv = SyntheticKV(model_config("tiny"))
    block = np.ascontiguousarray(kv.block(1))
    t, _, layers, heads, dim = block.shape
    req = np.frombuffer(pack_quant_request(0, SCHEME, t, layers, heads, dim), np.uint8)
    slot = QUANT_REQUEST_BYTES + block.nbytes
    qbuf = dev.alloc(QD * slot)
    for i in range(QD):
        qbuf[i * slot:i * slot + QUANT_REQUEST_BYTES] = req
        qbuf[i * slot + QUANT_REQUEST_BYTES:(i + 1) * slot] = block.reshape(-1).view(np.uint8)
    nq = 64
    for k in range(nq):
        dev.kv_put_quantized(_key(k), block, "fp16", SCHEME)
    before = dev.log()["store"]["dedup_hits"]
    # stamped after the request: every block differs, so every put is quantized and
    # written (the loop keeps the stamps finite)
    kernel = _Kernels(block)
    qp_, kq = _paired(_looper(dev, "KV_STORE_QUANTIZED", qbuf, slot, nq, stamp=True,
                              stamp_at=QUANT_REQUEST_BYTES),
                      lambda s: kernel.rate("quantize", s), seconds)
    dedup = dev.log()["store"]["dedup_hits"] - before
    dbuf = dev.alloc(QD * block.nbytes)
    qg, kd = _paired(_looper(dev, "KV_RETRIEVE_DEQUANTIZED", dbuf, block.nbytes, nq),
                     lambda s: kernel.rate("dequantize", s), seconds)
    k = {"quantize": kq["bytes_per_s"], "dequantize": kd["bytes_per_s"],
         **{n: kernel.rate(n, seconds / 2)["bytes_per_s"]
            for n in ("quantize_in_cache", "dequantize_in_cache")}}
    put_bps = qp_["ops_per_s"] * block.nbytes
    get_bps = qg["ops_per_s"] * block.nbytes
    out["kv_put_quantized"] = {
        "bytes_per_s": put_bps, "kernel_bytes_per_s": k["quantize"],
        "ratio_kernel": put_bps / k["quantize"],
        "kernel_in_cache_bytes_per_s": k["quantize_in_cache"],
        "ratio_kernel_in_cache": put_bps / k["quantize_in_cache"],
        "block_bytes": block.nbytes, "dedup_hits": dedup, "commands": qp_["commands"]}
    out["kv_get_dequantized"] = {
        "bytes_per_s": get_bps, "kernel_bytes_per_s": k["dequantize"],
        "ratio_kernel": get_bps / k["dequantize"],
        "kernel_in_cache_bytes_per_s": k["dequantize_in_cache"],
        "ratio_kernel_in_cache": get_bps / k["dequantize_in_cache"]}
    return out


def bench_kv(socket_path: str | None, media: str | None, seconds: float) -> dict:
    """On a running daemon, or on one started here (timing off) on `media`."""
    if socket_path:
        return run_bench(socket_path, seconds)
    tmp = socket_dir("ssdemu-bench-kv-")
    try:
        d = DaemonProcess(os.path.join(tmp, "s.sock"), media or "mem:1536M",
                          ["--timing", "off"])
        try:
            report = run_bench(d.socket_path, seconds)
        finally:
            d.terminate()
        report["media"] = media or "mem:1536M"
        return report
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def format_table(r: dict) -> str:
    lines = [f"bench kv (QD{r['qd']}, one client in C, timing off)"]
    for name in ("kv_put_4k", "kv_get_4k"):
        x = r[name]
        lines.append(f"  {name:<20} {x['ops_per_s']:>12,.0f} ops/s   block "
                     f"{x.get('block_write', x.get('block_read')):>12,.0f}   ratio "
                     f"{x['ratio_block']:.2f}")
    for name in ("kv_put_2m", "kv_get_2m"):
        x = r[name]
        lines.append(f"  {name:<20} {x['bytes_per_s'] / 1e9:>10.2f} GB/s   block "
                     f"{x.get('block_write', x.get('block_read')) / 1e9:>10.2f}   ratio "
                     f"{x['ratio_block']:.2f}")
    for name in ("kv_put_quantized", "kv_get_dequantized"):
        x = r[name]
        lines.append(f"  {name:<20} {x['bytes_per_s'] / 1e9:>10.2f} GB/s   kernel "
                     f"{x['kernel_bytes_per_s'] / 1e9:>10.2f}   ratio {x['ratio_kernel']:.2f}"
                     f"   (kernel in cache {x['kernel_in_cache_bytes_per_s'] / 1e9:.2f}, "
                     f"ratio {x['ratio_kernel_in_cache']:.2f})")
    lines.append(f"  bytes copied per kv put / get (registered): "
                 f"{r['bytes_copied_per_kv_put']:.0f} / {r['bytes_copied_per_kv_get']:.0f}")
    lines.append(f"  records per group commit: {r['records_per_group_commit']:.1f}")
    lines.append("  hostlib calls, numpy arrays vs registered buffers (GB/s, ratio):")
    for name, row in r["plain_vs_registered"].items():
        cells = "   ".join(f"{op} {x['plain_bytes_per_s'] / 1e9:.2f}/"
                           f"{x['registered_bytes_per_s'] / 1e9:.2f} {x['ratio_registered']:.2f}"
                           for op, x in row.items())
        lines.append(f"    {name:>5}  {cells}")
    return "\n".join(lines)
