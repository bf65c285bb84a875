"""`ssdemu bench io`: our io_uring engine against fio, same job, same media, same run."""

from __future__ import annotations

import os
import statistics

import numpy as np

from ssdemu.bench import _engine_bench
from ssdemu.bench.fio import fio_available, run_fio
from ssdemu.device.buffers import address_of, alloc_aligned
from ssdemu.device.engine import OP_WRITE, Engine, make_ios
from ssdemu.device.latency import new_histogram, percentiles_us
from ssdemu.device.media import Media, open_media
from ssdemu.errors import raise_for_errno

RW_MODES = ("read", "write", "randread", "randwrite")
PREFILL_CHUNK = 1 << 20


class BenchEngine(Engine):
    """The engine as `bench io` runs it: the benchmarks' own copy of the compiled engine
    (ssdemu.bench._engine_bench, c/tools/sde_engine_bench.c), with its closed loop."""

    _module = _engine_bench

    def bench(self, *, bs: int, qd: int, seconds: float, write: bool, random: bool,
              buf: np.ndarray, buf_index: int, region_offset: int = 0,
              region_len: int | None = None, seed: int = 1,
              submit_batch: int = 0) -> tuple[dict, np.ndarray]:
        """qd I/Os of bs bytes kept in flight for `seconds`, all in C: (counts, latency
        histogram)."""
        ffi, lib = self._ffi, self._lib
        if buf.nbytes < bs * qd:
            raise ValueError(f"bench buffer holds {buf.nbytes} B, needs bs*qd = {bs * qd}")
        cfg = ffi.new("sde_bench_cfg *")
        cfg.region_offset = region_offset
        cfg.region_len = self.media.size - region_offset if region_len is None else region_len
        cfg.duration_ns = int(seconds * 1e9)
        cfg.seed = seed
        cfg.buf_addr = address_of(buf)
        cfg.bs = bs
        cfg.qd = qd
        cfg.write = int(write)
        cfg.random = int(random)
        cfg.buf_index = buf_index
        cfg.submit_batch = submit_batch
        res = ffi.new("sde_bench_result *")
        hist = new_histogram()
        raise_for_errno(
            lib.sde_bench(self._eng, cfg, res, ffi.cast("uint64_t *", address_of(hist))),
            "benchmark failed",
        )
        out = {name: getattr(res, name) for name, _ in ffi.typeof("sde_bench_result").fields}
        out.pop("reserved", None)
        return out, hist


def needs_prefill(media: Media) -> bool:
    """Reads of never-written (sparse) media measure the page cache's zero page, not the
    media: fill memory media and files that still have holes."""
    if media.kind == "mem":
        return True
    if media.kind == "file":
        st = os.stat(media.spec.path)
        return st.st_blocks * 512 < st.st_size
    return False


def prefill(engine: Engine, seed: int = 7) -> None:
    """Write the whole media once with pseudo-random bytes, 1 MiB at a time at QD 8."""
    media = engine.media
    qd = 8
    chunk = min(PREFILL_CHUNK, media.size - media.size % media.lba_size)
    buf = alloc_aligned(chunk * qd)
    buf[:] = np.random.default_rng(seed).integers(0, 256, buf.nbytes, dtype=np.uint8)
    offsets = list(range(0, media.size, chunk))
    for start in range(0, len(offsets), qd):
        batch = offsets[start:start + qd]
        ios = make_ios(len(batch))
        for i, off in enumerate(batch):
            ios[i]["op"] = OP_WRITE
            ios[i]["addr"] = buf.__array_interface__["data"][0] + i * chunk
            ios[i]["len"] = min(chunk, media.size - off)
            ios[i]["offset"] = off
        engine.run(ios)
        bad = ios["res"] < 0
        if bad.any():
            raise RuntimeError(f"prefill write failed: errno {-int(ios['res'][bad][0])}")
    engine.fsync()


def run_ours(engine: BenchEngine, *, rw: str, bs: int, qd: int, seconds: float,
             submit_batch: int) -> dict:
    buf = alloc_aligned(bs * qd)
    registered = engine.register_buffers([buf])
    res, hist = engine.bench(
        bs=bs, qd=qd, seconds=seconds, write="write" in rw, random=rw.startswith("rand"),
        buf=buf, buf_index=0, submit_batch=submit_batch,
    )
    if res["errors"]:
        raise RuntimeError(f"{res['errors']} I/Os failed, first errno {-res['first_error']}")
    secs = res["elapsed_ns"] / 1e9
    p50, p99, p999 = percentiles_us(hist)
    return {
        "iops": res["ios"] / secs,
        "bandwidth_bytes_per_s": res["bytes"] / secs,
        "lat_us_p50": p50,
        "lat_us_p99": p99,
        "lat_us_p999": p999,
        "fixed_buffers": registered,
    }


def bench_io(media_spec: str, *, rw: str, bs: int, qd: int, seconds: float,
             repeat: int = 1, prefill_mode: str = "auto", sqpoll: bool = False,
             submit_batch: int = 1) -> dict:
    """Run ours and fio `repeat` times, in ABBA order; report the median of each side."""
    if rw not in RW_MODES:
        raise ValueError(f"--rw must be one of {', '.join(RW_MODES)}")
    with open_media(media_spec) as media:
        if bs % media.lba_size or bs <= 0:
            raise ValueError(f"--bs {bs} is not a multiple of the media's {media.lba_size} B block")
        if bs > media.size:
            raise ValueError(f"--bs {bs} is larger than the media ({media.size} B)")
        with BenchEngine(media, queue_depth=max(qd, 8), sqpoll=sqpoll) as engine:
            filled = prefill_mode == "yes" or (prefill_mode == "auto" and needs_prefill(media))
            if filled:
                prefill(engine)
            ours_runs, fio_runs = [], []

            def ours():
                ours_runs.append(run_ours(engine, rw=rw, bs=bs, qd=qd, seconds=seconds,
                                          submit_batch=submit_batch))

            def fio():
                fio_runs.append(run_fio(media.fio_path, rw=rw, bs=bs, qd=qd, seconds=seconds,
                                        size=media.size, submit_batch=submit_batch))

            steps = [ours, fio] if fio_available() else [ours]
            for i in range(repeat):
                # ABBA order: a disk whose speed drifts favours neither side
                for step in steps if i % 2 == 0 else steps[::-1]:
                    step()
            report = {
                "media": str(media.spec), "media_bytes": media.size,
                "logical_block_bytes": media.lba_size, "prefilled": filled,
                "rw": rw, "bs": bs, "qd": qd, "submit_batch": submit_batch,
                "seconds": seconds, "repeat": repeat,
                "ours": _median(ours_runs), "fio": _median(fio_runs) if fio_runs else None,
            }
            if fio_runs:
                report["ratio"] = {
                    "iops": report["ours"]["iops"] / report["fio"]["iops"],
                    "bandwidth": report["ours"]["bandwidth_bytes_per_s"]
                    / report["fio"]["bandwidth_bytes_per_s"],
                }
            else:
                report["ratio"] = None
                report["note"] = "fio not found (apt-get install fio): reporting ours only"
            return report


def _median(runs: list[dict]) -> dict:
    out = {}
    for key in runs[0]:
        vals = [r[key] for r in runs]
        out[key] = statistics.median(vals) if not isinstance(vals[0], bool) else all(vals)
    return out


def format_table(report: dict) -> str:
    rows = [("", "ours", "fio", "ratio")]
    ours, fio = report["ours"], report["fio"] or {}
    ratio = report["ratio"] or {}

    def cell(side: dict, key: str, scale: float, fmt: str) -> str:
        return fmt.format(side[key] / scale) if key in side else "-"

    rows.append(("IOPS", cell(ours, "iops", 1, "{:,.0f}"), cell(fio, "iops", 1, "{:,.0f}"),
                 f"{ratio['iops']:.3f}" if ratio else "-"))
    rows.append(("MB/s", cell(ours, "bandwidth_bytes_per_s", 1e6, "{:,.1f}"),
                 cell(fio, "bandwidth_bytes_per_s", 1e6, "{:,.1f}"),
                 f"{ratio['bandwidth']:.3f}" if ratio else "-"))
    for key, label in (("lat_us_p50", "lat p50 us"), ("lat_us_p99", "lat p99 us"),
                       ("lat_us_p999", "lat p99.9 us")):
        rows.append((label, cell(ours, key, 1, "{:.1f}"), cell(fio, key, 1, "{:.1f}"), ""))
    head = (f"{report['media']}  {report['rw']} bs={report['bs']} qd={report['qd']} "
            f"{report['seconds']}s x{report['repeat']}")
    lines = [head] + ["  {:<14}{:>14}{:>14}{:>9}".format(*r) for r in rows]
    if report.get("note"):
        lines.append("  note: " + report["note"])
    return "\n".join(lines)
