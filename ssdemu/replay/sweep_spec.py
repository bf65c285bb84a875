"""A sweep's spec: a YAML grid of replay parameters, its cells, their ids, and the table of
their results.  Pure logic (no Ray, no replay): docs/sweeps.md describes the format.

    traces: [mooncake_synthetic_trace.jsonl]   # paths relative to the spec file
    profiles: [star2000d, pcie4-tlc]
    models: [llama-3-8b]
    capacities: ["drive=64G", "drive=unbounded"]
    quant: [int8_g64, none]
    prefill_rates: [auto]                     # tokens/s, 'auto' or 'model' (the model's)
    modes: [model]                            # model, data
    requests: 1000                            # optional: the first N requests of each trace
    instances: [1]                            # optional, with pools and routes
    media: mem:1G                             # data-mode cells: mem:SIZE or file:SIZE

Every listed dimension multiplies the grid; a scalar is a list of one.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import os
from dataclasses import asdict, dataclass

import yaml

# spec key -> the cell field it fills, and its default
DIMENSIONS = {
    "traces": ("trace", None),
    "profiles": ("profile", "star2000d"),
    "models": ("model", "llama-3-8b"),
    "capacities": ("capacity", "hbm=0,dram=0,drive=unbounded"),
    "quant": ("quant", "int8_g64"),
    "dequant": ("dequant", "drive"),
    "prefill_rates": ("prefill_rate", "auto"),  # a baseline GPU that keeps up
    "modes": ("mode", "model"),
    "instances": ("instances", 1),
    "pools": ("pool", "private"),
    "routes": ("route", "round-robin"),
    "store_when": ("store_when", "arrival"),
}
SCALARS = {"requests": None, "media": "mem:1G", "fabric": None, "store_queue": None}
# what varies from run to run of the same cell: left out of the comparison of rows
WALL_FIELDS = ("wall_seconds", "requests_per_s", "blocks_per_s")


class SpecError(ValueError):
    """A spec that cannot be expanded; names the key."""


@dataclass(frozen=True)
class Cell:
    trace: str
    profile: str
    model: str
    capacity: str
    quant: str
    dequant: str
    prefill_rate: str
    mode: str
    instances: int
    pool: str
    route: str
    store_when: str
    requests: int | None
    media: str
    fabric: str | None
    store_queue: int | None

    @property
    def id(self) -> str:
        """Stable across runs and machines: the trace by name and content digest, not by
        path, so a resumed sweep on another checkout finds its cells."""
        d = asdict(self)
        d["trace"] = os.path.basename(self.trace)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def label(self) -> str:
        return (f"{os.path.basename(self.trace)} {self.profile} {self.model} {self.capacity} "
                f"{self.quant} prefill={self.prefill_rate} {self.mode}"
                + (f" x{self.instances} {self.pool}" if self.instances > 1 else ""))


def _as_list(key: str, v) -> list:
    items = v if isinstance(v, list) else [v]
    if not items:
        raise SpecError(f"{key}: an empty list makes an empty grid")
    for x in items:
        if not isinstance(x, (str, int, float)) or isinstance(x, bool):
            raise SpecError(f"{key}: {x!r} is not a string or a number")
    return items


def load_spec(path: str) -> list[Cell]:
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise SpecError(f"cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{path} is not YAML: {' '.join(str(e).split())}") from None
    return expand(data, os.path.dirname(os.path.abspath(path)))


def expand(data, base_dir: str = ".") -> list[Cell]:
    """The spec's cells, in grid order (traces outermost)."""
    if not isinstance(data, dict):
        raise SpecError("a spec is a mapping of dimensions to lists")
    unknown = sorted(set(data) - set(DIMENSIONS) - set(SCALARS))
    if unknown:
        raise SpecError(f"unknown key {unknown[0]!r}: expected some of "
                        f"{', '.join(list(DIMENSIONS) + list(SCALARS))}")
    if "traces" not in data:
        raise SpecError("traces: a spec needs at least one trace")
    lists = {}
    for key, (field, default) in DIMENSIONS.items():
        lists[field] = [x if field == "instances" else str(x)
                        for x in _as_list(key, data.get(key, default))]
    lists["trace"] = [t if os.path.isabs(t) else os.path.normpath(os.path.join(base_dir, t))
                      for t in lists["trace"]]
    for t in lists["trace"]:
        if not os.path.isfile(t):
            raise SpecError(f"traces: {t} is not a file")
    for d in lists["dequant"]:
        if d not in ("drive", "host"):
            raise SpecError(f"dequant: {d!r}: expected drive or host")
    for n in lists["instances"]:
        if not isinstance(n, int) or n < 1:
            raise SpecError(f"instances: {n!r} is not a positive whole number")
    scalars = {k: data.get(k, d) for k, d in SCALARS.items()}
    req = scalars["requests"]
    if req is not None and (not isinstance(req, int) or isinstance(req, bool) or req < 1):
        raise SpecError(f"requests: {req!r} is not a positive whole number")
    sq = scalars["store_queue"]
    if sq is not None and (not isinstance(sq, int) or isinstance(sq, bool) or sq < 1):
        raise SpecError(f"store_queue: {sq!r} is not a positive whole number")
    media = str(scalars["media"])
    if not (media.startswith("mem:") or media.startswith("file:")):
        raise SpecError(f"media: {media!r}: a data-mode cell's media is mem:SIZE or "
                        "file:SIZE (a file under the node's temp dir)")
    fields = list(lists)
    cells = []
    for combo in itertools.product(*(lists[f] for f in fields)):
        cells.append(Cell(**dict(zip(fields, combo, strict=True)), requests=req, media=media,
                          fabric=None if scalars["fabric"] is None else str(scalars["fabric"]),
                          store_queue=scalars["store_queue"]))
    return cells


def flatten(prefix: str, value, out: dict) -> None:
    """Nested report fields as dotted columns; lists as JSON."""
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list):
        out[prefix] = json.dumps(value)
    else:
        out[prefix] = value


def row(cell: Cell, result: dict) -> dict:
    """One table row: the cell's parameters (cell.*), then its report's fields, or its
    error."""
    out: dict = {"cell.id": cell.id}
    flatten("cell", asdict(cell), out)
    out["error"] = result.get("error", "")
    flatten("", result.get("report", {}), out)
    return out


def write_table(rows: list[dict], path: str) -> None:
    """CSV, one row per cell; columns in first-seen order (a failed cell leaves its report's
    columns empty)."""
    columns: dict[str, None] = {}
    for r in rows:
        columns.update(dict.fromkeys(r))
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        for r in rows:
            w.writerow(r)
    os.replace(tmp, path)
