"""Device profiles: YAML files, validated on load.  A profile is named (a file in
ssdemu/profiles/) or given as a path.  Units are in the field names."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import yaml

from ssdemu.errors import SsdemuError

PROFILE_DIR = pathlib.Path(__file__).resolve().parent / "profiles"


class ProfileError(SsdemuError):
    """A profile that cannot be found or does not hold."""


@dataclass(frozen=True)
class QueueConfig:
    max_queue_pairs: int
    max_entries: int
    io_depth: int
    spin_us: int


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    queue: QueueConfig


def available() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def _positive_int(data: dict, key: str, where: str, top: int) -> int:
    v = data.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= top:
        raise ProfileError(f"{where}.{key} must be a whole number in 1..{top}, got {v!r}")
    return v


def load(name_or_path: str) -> Profile:
    path = pathlib.Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ProfileError(f"no profile {name_or_path!r} (shipped: {', '.join(available())})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ProfileError(f"profile {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"profile {path} must be a mapping")
    unknown = set(data) - {"name", "description", "queue"}
    if unknown:
        raise ProfileError(f"profile {path}: unknown fields {sorted(unknown)}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ProfileError(f"profile {path}: name must be a non-empty string")
    q = data.get("queue")
    if not isinstance(q, dict):
        raise ProfileError(f"profile {path}: queue must be a mapping")
    unknown = set(q) - {"max_queue_pairs", "max_entries", "io_depth", "spin_us"}
    if unknown:
        raise ProfileError(f"profile {path}: unknown fields queue.{sorted(unknown)}")
    queue = QueueConfig(
        max_queue_pairs=_positive_int(q, "max_queue_pairs", "queue", 256),
        max_entries=_positive_int(q, "max_entries", "queue", 65536),
        io_depth=_positive_int(q, "io_depth", "queue", 4096),
        spin_us=_positive_int(q, "spin_us", "queue", 1_000_000),
    )
    if queue.max_entries & (queue.max_entries - 1):
        raise ProfileError(f"profile {path}: queue.max_entries must be a power of two")
    return Profile(name, str(data.get("description", "")), queue)
