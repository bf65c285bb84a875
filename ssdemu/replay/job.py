"""What `ssdemu replay` does, end to end: read the trace, set up the serving model and the
tiers, run model mode in this process or data mode through a daemon (a running one, or one
started here on --media and stopped afterwards), show progress, write the plots."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from dataclasses import dataclass

from ssdemu.errors import SsdemuError


@dataclass
class ReplayJob:
    trace: str  # the defaults of these are the CLI's (ssdemu/cli.py), not repeated here
    profile: str
    model: str
    mode: str  # model or data
    quant: str | None
    capacity: str
    prefill_rate: float | str | None = None  # tokens/s, or "auto"
    skip_bad: bool = False
    requests: int | None = None  # the first N requests only
    socket: str | None = None  # data mode: a running daemon (--clock virtual)
    media: str | None = None  # data mode: start a daemon on this media (formatted)
    plot_dir: str | None = None
    progress: bool = True
    instances: int = 1  # serving instances, each with its own drive (ssdemu/replay/pool.py)
    pool: str = "private"  # private or pooled drives
    route: str = "round-robin"  # or prefix
    fabric: str | None = None  # GB/s,latency us (default: ssdemu.replay.pool's RDMA-like figures)
    dequant: str = "drive"  # or host: the GPU dequantizes the drive's blocks
    gpu_dequant_rate: float | None = None  # bytes/s (default: ssdemu.replay.model_mode's)
    store_when: str = "arrival"  # or computed
    store_queue: int | None = None  # admission control: stores in flight per drive
    # model mode: threads booking the timing model's dies (2: a helper thread, which spins
    # between batches: for a single replay, not for sweep cells running side by side)
    threads: int = 1
    # dense, host-select, drive-select or a placement policy (ssdemu/replay/decode.py); or
    # several, comma-separated: a report each (report["decodes"]), the first as "decode"
    decode: str | None = None
    decode_budget_pct: float = 25.0  # a placement policy's HBM, percent of the context
    drift: str | None = None  # the drift model (ssdemu/replay/drift.py): None, the bundled


def _progress_bar(total: int, desc: str):
    from tqdm import tqdm

    # disable=None: only on a terminal, so logs and pipes stay clean
    bar = tqdm(total=total, unit="req", desc=desc, file=sys.stderr, disable=None,
               dynamic_ncols=True, leave=False)

    def update(done: int) -> None:
        bar.update(done - bar.n)
    return bar, update


AUTO_OFFERED_LOAD = 0.8  # --prefill-rate auto: the no-drive GPU busy 80% of the trace


def stable_prefill_rate(requests, instances: int = 1) -> float:
    """The prefill rate at which each of `instances` GPUs with no cache is offered
    AUTO_OFFERED_LOAD of its capacity over the trace: a baseline whose queues stay bounded."""
    if len(requests) < 2 or requests[-1].timestamp_ms == requests[0].timestamp_ms:
        raise ValueError("--prefill-rate auto needs a trace that spans some time")
    span_s = (requests[-1].timestamp_ms - requests[0].timestamp_ms) / 1000.0
    return (sum(r.input_length for r in requests) / span_s / AUTO_OFFERED_LOAD
            / instances)


def run(job: ReplayJob) -> dict:
    """The report (the CLI's JSON); with plot_dir, the PNGs are written and listed in it."""
    from ssdemu.replay.model_mode import replay_model
    from ssdemu.replay.serving import model_config, parse_capacities
    from ssdemu.sim.profile import load
    from traces.mooncake import TraceReader

    profile = load(job.profile)
    model = model_config(job.model)
    decodes = tuple(job.decode.split(",")) if job.decode else ()
    if decodes:
        from ssdemu.replay.decode import DECODE_MODES, TIER_POLICIES
        from ssdemu.replay.drift import DriftModel

        bad = [d for d in decodes if d not in (*DECODE_MODES, *TIER_POLICIES)]
        if bad:
            raise ValueError(f"--decode: unknown {', '.join(bad)} (one of "
                             f"{', '.join((*DECODE_MODES, *TIER_POLICIES))})")
        drift = DriftModel.load(job.drift) if set(decodes) & set(TIER_POLICIES) else None
    if job.prefill_rate and job.prefill_rate != "auto":
        model = dataclasses.replace(model, prefill_tokens_per_s=job.prefill_rate)
    sizes = {"hbm": model.block_bytes, "dram": model.block_bytes,
             "drive": model.stored_block_bytes(job.quant)}
    caps = parse_capacities(job.capacity, sizes)
    from ssdemu.replay.pool import POOLS, ROUTES, parse_fabric

    if job.instances < 1:
        raise ValueError(f"--instances must be at least 1, got {job.instances}")
    if job.pool not in POOLS or job.route not in ROUTES:
        raise ValueError(f"--pool must be one of {', '.join(POOLS)} and --route one of "
                         f"{', '.join(ROUTES)}")
    setup = {"pool": job.pool, "route": job.route,
             "fabric": parse_fabric(job.fabric) if job.fabric else None,
             "dequant": job.dequant, "store_when": job.store_when,
             "store_queue": job.store_queue}
    if job.gpu_dequant_rate is not None:
        setup["gpu_dequant_bytes_per_s"] = job.gpu_dequant_rate
    reader = TraceReader(job.trace, skip_bad=job.skip_bad)
    requests = []
    for r in reader:
        if job.requests is not None and len(requests) >= job.requests:
            break
        requests.append(r)
    if not requests:
        raise SsdemuError(f"{job.trace}: no requests to replay (the trace is empty"
                         + (", or --skip-bad dropped every line)" if job.skip_bad else ")"))
    if job.prefill_rate == "auto":
        model = dataclasses.replace(model, prefill_tokens_per_s=stable_prefill_rate(
            requests, job.instances))
    bar, update = (_progress_bar(len(requests), f"replay ({job.mode} mode)") if job.progress
                   else (None, None))
    try:
        if job.mode == "model":
            report = replay_model(requests, profile, model, job.quant, caps, progress=update,
                                  instances=job.instances, threads=job.threads, **setup)
        else:
            report = _run_data(job, requests, profile, model, caps, update, setup)
    finally:
        if bar is not None:
            bar.close()
    report["skipped_lines"] = reader.skipped
    if decodes:
        from ssdemu.replay.decode import decode_report

        each = [decode_report(requests, profile, model, d, budget_pct=job.decode_budget_pct,
                              drift=drift) for d in decodes]
        report["decode"] = each[0]
        if len(each) > 1:
            report["decodes"] = each
    series = report.pop("series")
    if job.plot_dir:
        from ssdemu.replay.plots import write_plots

        report["crossover"] = crossover(requests, profile, model, job.quant, caps,
                                        job.instances, setup,
                                        report if job.mode == "model" else None)
        report["plots"] = write_plots(report, series, job.plot_dir)
    return report


CROSSOVER_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)  # of the replay's own prefill rate


def crossover(requests, profile, model, quant, caps, instances: int, setup: dict,
              own: dict | None = None) -> list:
    """TTFT p50 and p99 with and without the drive at prefill rates around the replay's own
    (model mode, the same setup): where the lines cross, recompute has caught up with
    loading.  own: the model-mode report at the replay's own rate, reused."""
    from ssdemu.replay.model_mode import replay_model

    points = []
    for f in CROSSOVER_FACTORS:
        m = dataclasses.replace(model, prefill_tokens_per_s=model.prefill_tokens_per_s * f)
        r = (own if f == 1.0 and own is not None else
             replay_model(requests, profile, m, quant, caps, instances=instances, **setup))
        points.append({"prefill_tokens_per_s": m.prefill_tokens_per_s,
                       "ttft_with_drive_s": r["ttft_s"]["with_drive"],
                       "ttft_without_drive_s": r["ttft_s"]["without_drive"]})
    return points


def _media_of(media: str, k: int, instances: int) -> str:
    """Instance k's media when one --media names all: mem: is each daemon's own; a file gets
    a suffix per instance; a block device cannot be shared."""
    if instances == 1 or media.startswith("mem:"):
        return media
    if media.startswith("file:"):
        path, sep, size = media[5:].partition(":")
        return f"file:{path}.{k}{sep}{size}"
    raise SsdemuError(f"--media {media!r} cannot hold {instances} drives: give mem:SIZE or "
                      "file:PATH[:SIZE] (one file per drive, PATH.0, PATH.1, ...) or "
                      "--socket with one daemon per instance")


def _run_data(job: ReplayJob, requests, profile, model, caps, update, setup) -> dict:
    import contextlib

    import hostlib
    from ssdemu.replay.data_mode import replay_data
    from ssdemu.tools.daemon_process import DaemonProcess, socket_dir

    if bool(job.socket) == bool(job.media):
        raise SsdemuError("data mode needs --socket (a daemon started with --clock virtual; "
                          "with --instances K, K of them, comma-separated) or --media (a "
                          "daemon per instance is started on it, formatted, and stopped)")
    if job.socket:
        sockets = [s for s in job.socket.split(",") if s]
        if len(sockets) != job.instances:
            raise SsdemuError(f"{len(sockets)} sockets for {job.instances} instances: give "
                              "one daemon per instance")
        with contextlib.ExitStack() as stack:
            devs = [stack.enter_context(hostlib.connect(s)) for s in sockets]
            return replay_data(devs, requests, profile, model, job.quant, caps,
                               progress=update, **setup)
    d = socket_dir("ssdemu-replay-", f"sde{job.instances - 1}.sock")
    daemons = []
    try:
        for k in range(job.instances):
            daemons.append(DaemonProcess(
                os.path.join(d, f"sde{k}.sock"), media=_media_of(job.media, k, job.instances),
                extra=["--clock", "virtual", "--profile", job.profile, "--format"]))
        with contextlib.ExitStack() as stack:
            devs = [stack.enter_context(hostlib.connect(x.socket_path)) for x in daemons]
            report = replay_data(devs, requests, profile, model, job.quant, caps,
                                 progress=update, **setup)
    finally:
        results = [x.terminate() for x in daemons]
        shutil.rmtree(d, ignore_errors=True)
    for code, err in results:
        if code != 0:
            raise SsdemuError(f"the daemon exited with {code}: {err.strip()[-300:]}")
    return report
