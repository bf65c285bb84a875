"""`ssdemu sweep SPEC.yaml`: every cell of a spec's grid (ssdemu/replay/sweep_spec.py) as one replay
task on Ray, the existing distributed engine: a local Ray instance by default, a cluster with
--address.  Traces travel to the nodes as Ray objects (no shared filesystem); a data-mode cell
starts its own daemon on the node that runs it, on media under that node's temp dir, and
stops it.  Each finished cell is written to OUT/cells/ID.json at once, so a sweep that stops
resumes where it was; the table is OUT/results.csv."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

from ssdemu.replay.sweep_spec import WALL_FIELDS, Cell, load_spec, row, write_table

__all__ = ["WALL_FIELDS", "run_sweep"]


def run_cell(cell: Cell, trace_bytes: bytes, scratch: str | None = None) -> dict:
    """One replay, on whichever node Ray chose: {"report": ...} or {"error": one line}.
    scratch: where its temp dir goes (the local Ray instance's own temp dir, removed after
    the sweep even when a cell is killed mid-way; on a cluster, the node's temp dir)."""
    from ssdemu.replay.job import ReplayJob, run

    with tempfile.TemporaryDirectory(prefix="ssdemu-sweep-", dir=scratch) as d:
        trace = os.path.join(d, os.path.basename(cell.trace))
        with open(trace, "wb") as f:
            f.write(trace_bytes)
        media = None
        if cell.mode == "data":
            media = (cell.media if cell.media.startswith("mem:")
                     else f"file:{os.path.join(d, 'media')}:{cell.media[5:]}")
        rate = cell.prefill_rate
        job = ReplayJob(
            trace=trace, profile=cell.profile, model=cell.model, mode=cell.mode,
            quant=None if cell.quant == "none" else cell.quant, capacity=cell.capacity,
            prefill_rate=None if rate == "model" else rate if rate == "auto" else float(rate),
            requests=cell.requests, media=media, progress=False, instances=cell.instances,
            pool=cell.pool, route=cell.route, fabric=cell.fabric, dequant=cell.dequant,
            store_when=cell.store_when, store_queue=cell.store_queue)
        t0 = time.perf_counter()
        try:
            report = run(job)
        except Exception as e:  # the cell fails, the sweep goes on
            return {"error": f"{type(e).__name__}: {e}".splitlines()[0][:500],
                    "node": os.uname().nodename}
        report.pop("plots", None)
        return {"report": report, "node": os.uname().nodename,
                "task_seconds": time.perf_counter() - t0}


def _cell_path(out: str, cell: Cell) -> str:
    return os.path.join(out, "cells", f"{cell.id}.json")


def _done(out: str, cell: Cell) -> dict | None:
    try:
        with open(_cell_path(out, cell)) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None  # not run, or cut off mid-write: run it


def _save(out: str, cell: Cell, result: dict) -> None:
    path = _cell_path(out, cell)
    with open(path + ".tmp", "w") as f:
        json.dump({"cell": cell.__dict__, **result}, f)
    os.replace(path + ".tmp", path)


def _ray_init(address: str | None) -> str | None:
    """Connect to the cluster, or start a local instance; returns the local instance's temp
    dir (its sessions and logs), which the caller removes after ray.shutdown()."""
    import ray

    if address:
        ray.init(address=address, log_to_driver=False)
        return None
    # this machine alone: no dashboard, a small object store (traces are a few MB), its
    # sessions in a temp dir of its own rather than piling up in /tmp/ray
    temp = tempfile.mkdtemp(prefix="ssdemu-ray-")
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             object_store_memory=256 << 20, _temp_dir=temp)
    return temp


def run_sweep(spec_path: str, out: str, address: str | None = None, plot: bool = False,
              retry_failed: bool = False, progress: bool = True) -> dict:
    """Run the cells not yet in `out`; returns the summary (the CLI's JSON)."""
    cells = load_spec(spec_path)
    os.makedirs(os.path.join(out, "cells"), exist_ok=True)
    results: dict[str, dict] = {}
    todo = []
    for c in cells:
        r = _done(out, c)
        if r is not None and not (retry_failed and "error" in r):
            results[c.id] = r
        else:
            todo.append(c)
    ran = 0
    if todo:
        import ray

        ray_temp = _ray_init(address)
        try:
            task = ray.remote(num_cpus=1, max_retries=0)(run_cell)
            # a data-mode cell's daemon and client want both cores of a small node
            data_task = ray.remote(num_cpus=min(2, os.cpu_count() or 1),
                                   max_retries=0)(run_cell)
            traces = {t: ray.put(pathlib.Path(t).read_bytes()) for t in {c.trace for c in todo}}
            pending = {(data_task if c.mode == "data" else task).remote(c, traces[c.trace],
                                                                         ray_temp): c
                       for c in todo}
            bar = _bar(len(cells), len(cells) - len(todo)) if progress else None
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                c = pending.pop(ready[0])
                try:
                    r = ray.get(ready[0])
                except Exception as e:  # the worker died: the cell fails, not the sweep
                    r = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:500]}
                _save(out, c, r)
                results[c.id] = r
                ran += 1
                if bar is not None:
                    bar.update(1)
                    if "error" in r and not bar.disable:  # listed at the end too
                        bar.write(f"ssdemu: cell failed: {c.label()}: {r['error']}",
                                  file=sys.stderr)
            if bar is not None:
                bar.close()
        finally:
            ray.shutdown()
            if ray_temp:
                shutil.rmtree(ray_temp, ignore_errors=True)
    rows = [row(c, results[c.id]) for c in cells]
    table = os.path.join(out, "results.csv")
    write_table(rows, table)
    summary = {"spec": spec_path, "out": out, "table": table, "cells": len(cells),
               "ran": ran, "skipped": len(cells) - len(todo),
               "failed": sum("error" in results[c.id] for c in cells),
               "errors": [{"cell": c.label(), "error": results[c.id]["error"]}
                          for c in cells if "error" in results[c.id]]}
    if plot:
        from ssdemu.replay.plots import write_sweep_plots

        summary["plots"] = write_sweep_plots(cells, [results[c.id] for c in cells], out)
    return summary


def _bar(total: int, done: int):
    from tqdm import tqdm

    return tqdm(total=total, initial=done, unit="cell", desc="sweep", file=sys.stderr,
                disable=None, dynamic_ncols=True)
