"""Device profiles: YAML files, validated on load, units in the field names.  A profile is
named (a file in ssdemu/sim/profiles/) or given as a path.  Nothing anywhere branches on a
profile's name: only its figures matter.

Every parameter is declared once, below (`param`): its unit, bounds, the C model field it
fills (ssdemu/sim/timing.py maps them from these declarations) and, if profiles may leave it
out, its default with the source of that default.  Each profile cites the source of each
figure it gives (docs/sources.md gathers them)."""

from __future__ import annotations

import dataclasses
import math
import pathlib
from dataclasses import dataclass

import yaml

from ssdemu.errors import SsdemuError

PROFILE_DIR = pathlib.Path(__file__).resolve().parent / "profiles"


class ProfileError(SsdemuError):
    """A profile that cannot be found or does not hold."""


def param(*, zero: bool = False, high: float = math.inf, unit: str = "",
          c: str | None = None, default=dataclasses.MISSING, source: str = ""):
    """A profile parameter, declared once: its unit, its bounds (positive, or also zero with
    `zero`; `high` catches a unit mistake, a latency in seconds or a size in GB), the field
    of the C model's sde_model_params it fills (`c`, c/model/sde_model.h: timing.py maps it
    from this), and a default with the public source it comes from (a profile may then leave
    it out).  A new parameter is its declaration here and, if the C model reads it, its
    field there."""
    if default is not dataclasses.MISSING and not source:
        raise ValueError("a default needs its source")
    return dataclasses.field(default=default, metadata={
        "zero": zero, "high": high, "unit": unit, "c": c, "source": source})


@dataclass(frozen=True)
class HostLink:
    # effective, after encoding and protocol overhead
    bandwidth_bytes_per_s: float = param(unit="B/s", high=1e12, c="link_bytes_per_s")
    latency_ns: float = param(unit="ns", zero=True, c="link_latency_ns")  # one way, per command


@dataclass(frozen=True)
class Nand:
    channels: int = param(high=256, c="channels")
    dies_per_channel: int = param(c="dies_per_channel")
    planes_per_die: int = param(c="planes_per_die")
    page_bytes: int = param(unit="B", high=1 << 20, c="page_bytes")
    t_read_ns: float = param(unit="ns", c="t_read_ns")
    t_prog_ns: float = param(unit="ns", c="t_prog_ns")
    t_erase_ns: float = param(unit="ns", c="t_erase_ns")
    channel_bytes_per_s: float = param(unit="B/s", high=1e11, c="channel_bytes_per_s")
    pages_per_block: int = param(high=1 << 16)  # per plane: a block's pages (its erase unit)
    blocks_per_plane: int = param(high=1 << 20)


@dataclass(frozen=True)
class Controller:
    cores: int = param(high=256, c="cores")
    command_overhead_ns: float = param(unit="ns", c="command_overhead_ns")  # on one core
    # firmware latency before a read's NAND work (not a held core)
    read_latency_ns: float = param(unit="ns", zero=True, high=1e7, c="read_latency_ns")
    # firmware latency of a write's acknowledgement from the cache
    write_latency_ns: float = param(unit="ns", zero=True, high=1e7, c="write_latency_ns")
    # the most the controller can have programmed (power, datapath)
    program_bytes_per_s: float = param(unit="B/s", high=1e12, c="program_bytes_per_s")


@dataclass(frozen=True)
class WriteCache:
    # volatile: with it, flush makes writes durable; without, completion does
    enabled: bool = param(c="write_cache")
    bytes: int = param(unit="B", zero=True, c="write_cache_bytes")


@dataclass(frozen=True)
class Ftl:
    # what the host sees; raw NAND beyond it is over-provisioning
    user_capacity_bytes: int = param(unit="B", high=1 << 60)
    # GC runs while this many free lines (superblocks) or fewer are left
    gc_free_lines: int = param(high=64)
    # raw NAND the FTL does not use for data (parity, bad blocks, map)
    reserved_fraction: float = param(zero=True, high=1)


@dataclass(frozen=True)
class Figure:
    """A figure the profile is calibrated to: a value or a [low, high] range, and where it
    comes from (`assumed` when no public source gives it)."""
    name: str
    low: float
    high: float
    source: str
    assumed: bool


@dataclass(frozen=True)
class Compute:
    tops: float = param(unit="TOPS", high=1e4)  # the MAC array (scoring, dot products)
    units: int = param(high=1024)  # embedded cores that run the firmware's kernels
    # the controller's DRAM, shared with NAND and PCIe DMA
    memory_bytes_per_s: float = param(unit="B/s", high=1e13, c="dram_bytes_per_s")
    # scalar ops per second per core (hashing, bookkeeping)
    core_ops_per_s: float = param(unit="op/s", high=1e12)
    simd_lanes: int = param(high=256)  # element-wise ops a core does at once (quantizing, packing)
    dram_probe_ns: float = param(unit="ns", zero=True, high=1e5)  # a dependent table probe


@dataclass(frozen=True)
class QueueConfig:
    max_queue_pairs: int = param(high=256)
    max_entries: int = param(high=65536)
    io_depth: int = param(high=4096)
    spin_us: int = param(unit="us")


@dataclass(frozen=True)
class KvConfig:
    # keys the drive's DRAM index holds (the store's index capacity)
    index_keys: int = param(high=(1 << 32) - 2)
    max_value_bytes: int = param(unit="B", high=1 << 31)  # the largest value one key holds


@dataclass(frozen=True)
class Retrieval:
    """Query-aware retrieval (ssdemu/sim/retrieval.py): a page's tokens, and the controller
    DRAM that holds page summaries (the rest are read from NAND)."""
    page_tokens: int = param(high=4096)
    summary_dram_bytes: int = param(unit="B", zero=True)


# a profile without a retrieval section: Quest's 16-token pages, every summary on NAND (the
# costlier assumption, when a profile does not say what DRAM its summaries get)
DEFAULT_RETRIEVAL = Retrieval(page_tokens=16, summary_dram_bytes=0)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    host_link: HostLink
    nand: Nand
    controller: Controller
    write_cache: WriteCache
    compute: Compute
    queue: QueueConfig
    kv: KvConfig
    ftl: Ftl
    calibration: tuple[Figure, ...] = ()
    retrieval: Retrieval = DEFAULT_RETRIEVAL

    @property
    def raw_bytes(self) -> int:
        n = self.nand
        return (n.channels * n.dies_per_channel * n.planes_per_die * n.blocks_per_plane
                * n.pages_per_block * n.page_bytes)

    @property
    def overprovisioning(self) -> float:
        """The NAND GC can use beyond the user capacity (raw less the reserved fraction), as
        a fraction of the user capacity."""
        return self.raw_bytes * (1 - self.ftl.reserved_fraction) / self.ftl.user_capacity_bytes - 1


# The figures `ssdemu bench device` measures, by name (units in the names).
FIGURES = ("seq_read_bytes_per_s", "seq_write_bytes_per_s", "rand_read_4k_iops",
           "rand_read_4k_iops_steady", "rand_write_4k_iops_fresh", "rand_write_4k_iops_steady",
           "qd1_read_4k_latency_ns", "qd1_write_4k_latency_ns")

SECTIONS = {"host_link": HostLink, "nand": Nand, "controller": Controller,
            "write_cache": WriteCache, "compute": Compute, "queue": QueueConfig, "kv": KvConfig,
            "ftl": Ftl}
def available() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def _section(where: str, data, cls):
    if not isinstance(data, dict):
        raise ProfileError(f"{where} must be a mapping")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise ProfileError(f"{where}: unknown fields {sorted(unknown)}")
    missing = {n for n, f in fields.items() if n not in data and f.default is dataclasses.MISSING}
    if missing:
        raise ProfileError(f"{where}: missing fields {sorted(missing)}")
    values = {}
    for name, f in fields.items():
        if name not in data:
            continue  # its declared default
        v = data[name]
        if f.type == "bool":
            if not isinstance(v, bool):
                raise ProfileError(f"{where}.{name} must be true or false, got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ProfileError(f"{where}.{name} must be a number, got {v!r}")
        elif not math.isfinite(v):  # NaN passes every comparison below; inf is no figure
            raise ProfileError(f"{where}.{name} must be a finite number, got {v!r}")
        elif f.type == "int" and int(v) != v:
            raise ProfileError(f"{where}.{name} must be a whole number, got {v!r}")
        elif v <= 0 and not f.metadata["zero"]:
            raise ProfileError(f"{where}.{name} must be positive, got {v!r}")
        elif v < 0:
            raise ProfileError(f"{where}.{name} must not be negative, got {v!r}")
        elif v > f.metadata["high"]:
            raise ProfileError(f"{where}.{name} = {v!r} is past {f.metadata['high']:g}: "
                               f"check units")
        values[name] = int(v) if f.type == "int" else v
    return cls(**values)


def load(name_or_path: str) -> Profile:
    path = pathlib.Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ProfileError(f"no profile {name_or_path!r} (shipped: {', '.join(available())})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        why = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ProfileError(f"{path}{at}: not valid YAML: {why}") from None
    return parse(data, str(path))


def parse(data, where: str = "profile") -> Profile:
    if not isinstance(data, dict):
        raise ProfileError(f"{where} must be a mapping")
    unknown = set(data) - {"name", "description", "calibration", "retrieval", *SECTIONS}
    if unknown:
        raise ProfileError(f"{where}: unknown fields {sorted(unknown)}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ProfileError(f"{where}: name must be a non-empty string")
    sections = {key: _section(f"{where}: {key}", data.get(key), cls)
                for key, cls in SECTIONS.items()}
    q = sections["queue"]
    if q.max_entries & (q.max_entries - 1):
        raise ProfileError(f"{where}: queue.max_entries must be a power of two")
    if "retrieval" in data:
        sections["retrieval"] = _section(f"{where}: retrieval", data["retrieval"], Retrieval)
    profile = Profile(name=name, description=str(data.get("description", "")),
                      calibration=_calibration(where, data.get("calibration", [])), **sections)
    if profile.ftl.reserved_fraction >= 1:
        raise ProfileError(f"{where}: ftl.reserved_fraction must be below 1")
    if profile.overprovisioning <= 0:
        raise ProfileError(f"{where}: ftl.user_capacity_bytes {profile.ftl.user_capacity_bytes} "
                           f"is not below the raw NAND less its reserve "
                           f"({profile.raw_bytes} bytes): no room for GC")
    return profile


def _calibration(where: str, items) -> tuple[Figure, ...]:
    """calibration: a list of {figure, value | range: [low, high], source | assumed: why}."""
    if not isinstance(items, list):
        raise ProfileError(f"{where}: calibration must be a list")
    out = []
    for i, item in enumerate(items):
        at = f"{where}: calibration[{i}]"
        if not isinstance(item, dict) or set(item) - {"figure", "value", "range", "source",
                                                       "assumed"}:
            raise ProfileError(f"{at}: fields are figure, value or range, source or assumed")
        name = item.get("figure")
        if name not in FIGURES:
            raise ProfileError(f"{at}: figure {name!r} is none of {', '.join(FIGURES)}")
        if ("value" in item) == ("range" in item):
            raise ProfileError(f"{at}: give one of value or range")
        lo_hi = item["range"] if "range" in item else [item["value"]] * 2
        if (not isinstance(lo_hi, list) or len(lo_hi) != 2
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                           and math.isfinite(v) and v > 0 for v in lo_hi)
                or lo_hi[0] > lo_hi[1]):
            raise ProfileError(f"{at}: a value is a positive number, a range [low, high]")
        if ("source" in item) == ("assumed" in item):
            raise ProfileError(f"{at}: give one of source (where the figure comes from) or "
                               f"assumed (why no source gives it)")
        why = item.get("source") or item.get("assumed")
        if not isinstance(why, str) or not why.strip():
            raise ProfileError(f"{at}: source or assumed must say something")
        out.append(Figure(name, float(lo_hi[0]), float(lo_hi[1]), why, "assumed" in item))
    return tuple(out)
