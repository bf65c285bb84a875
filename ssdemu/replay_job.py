"""What `ssdemu replay` does, end to end: read the trace, set up the serving model and the
tiers, run model mode in this process or data mode through a daemon (a running one, or one
started here on --media and stopped afterwards), show progress, write the plots."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
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


def _progress_bar(total: int, desc: str):
    from tqdm import tqdm

    # disable=None: only on a terminal, so logs and pipes stay clean
    bar = tqdm(total=total, unit="req", desc=desc, file=sys.stderr, disable=None,
               dynamic_ncols=True, leave=False)

    def update(done: int) -> None:
        bar.update(done - bar.n)
    return bar, update


AUTO_OFFERED_LOAD = 0.8  # --prefill-rate auto: the no-drive GPU busy 80% of the trace


def stable_prefill_rate(requests) -> float:
    """The prefill rate at which a GPU with no cache is offered AUTO_OFFERED_LOAD of its
    capacity over the trace: a baseline whose queue stays bounded."""
    if len(requests) < 2 or requests[-1].timestamp_ms == requests[0].timestamp_ms:
        raise ValueError("--prefill-rate auto needs a trace that spans some time")
    span_s = (requests[-1].timestamp_ms - requests[0].timestamp_ms) / 1000.0
    return sum(r.input_length for r in requests) / span_s / AUTO_OFFERED_LOAD


def run(job: ReplayJob) -> dict:
    """The report (the CLI's JSON); with plot_dir, the PNGs are written and listed in it."""
    from ssdemu.profile import load
    from ssdemu.replay import replay_model
    from ssdemu.serving import model_config, parse_capacities
    from traces.mooncake import TraceReader

    profile = load(job.profile)
    model = model_config(job.model)
    if job.prefill_rate and job.prefill_rate != "auto":
        model = dataclasses.replace(model, prefill_tokens_per_s=job.prefill_rate)
    sizes = {"hbm": model.block_bytes, "dram": model.block_bytes,
             "drive": model.stored_block_bytes(job.quant)}
    caps = parse_capacities(job.capacity, sizes)
    reader = TraceReader(job.trace, skip_bad=job.skip_bad)
    requests = []
    for r in reader:
        if job.requests is not None and len(requests) >= job.requests:
            break
        requests.append(r)
    if job.prefill_rate == "auto":
        model = dataclasses.replace(model, prefill_tokens_per_s=stable_prefill_rate(requests))
    bar, update = (_progress_bar(len(requests), f"replay ({job.mode} mode)") if job.progress
                   else (None, None))
    try:
        if job.mode == "model":
            report = replay_model(requests, profile, model, job.quant, caps, progress=update)
        else:
            report = _run_data(job, requests, profile, model, caps, update)
    finally:
        if bar is not None:
            bar.close()
    report["skipped_lines"] = reader.skipped
    series = report.pop("series")
    if job.plot_dir:
        from ssdemu.plots import write_plots

        report["plots"] = write_plots(report, series, job.plot_dir)
    return report


def _run_data(job: ReplayJob, requests, profile, model, caps, update) -> dict:
    import hostlib
    from ssdemu.daemon_process import DaemonProcess
    from ssdemu.replay_data import replay_data

    if bool(job.socket) == bool(job.media):
        raise SsdemuError("data mode needs --socket (a daemon started with --clock virtual) "
                          "or --media (a daemon is started on it, formatted, and stopped)")
    if job.socket:
        with hostlib.connect(job.socket) as dev:
            return replay_data(dev, requests, profile, model, job.quant, caps,
                               progress=update)
    d = tempfile.mkdtemp(prefix="ssdemu-replay-")
    daemon = DaemonProcess(os.path.join(d, "sde.sock"), media=job.media,
                           extra=["--clock", "virtual", "--profile", job.profile,
                                  "--format"])
    try:
        with hostlib.connect(daemon.socket_path) as dev:
            report = replay_data(dev, requests, profile, model, job.quant, caps,
                                 progress=update)
    finally:
        code, err = daemon.terminate()
        shutil.rmtree(d, ignore_errors=True)
    if code != 0:
        raise SsdemuError(f"the daemon exited with {code}: {err.strip()[-300:]}")
    return report
