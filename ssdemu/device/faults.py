"""Fault rules as they travel: the control plane's `fault` request (from `ssdemu ctl fault`
or `hostlib.Device.inject_fault`) checked and turned into the C rule the data plane applies
(c/dev/sde_fault.h), and back into a dict for `list`.  Pure: no I/O."""

from __future__ import annotations

import math

from ssdemu.device import _device

ffi, lib = _device.ffi, _device.lib

KINDS = {"read-error": lib.SDE_FAULT_READ_ERROR, "write-error": lib.SDE_FAULT_WRITE_ERROR,
         "latency": lib.SDE_FAULT_LATENCY}
KIND_NAMES = {v: k for k, v in KINDS.items()}
DIRECTIONS = {"both": 0, "read": lib.SDE_FAULT_DIR_READ, "write": lib.SDE_FAULT_DIR_WRITE}
DIRECTION_NAMES = {v: k for k, v in DIRECTIONS.items()}


class FaultError(ValueError):
    """A fault request that cannot be applied; the message says why, in one line."""


def finite_number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FaultError(f"{name} must be a number")
    if not math.isfinite(value) or value < 0:
        raise FaultError(f"{name} must be a finite number >= 0, got {value}")
    return float(value)


def _int(msg: dict, name: str, default: int, lo: int = 0, hi: int = (1 << 64) - 1) -> int:
    value = msg.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise FaultError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
    return value


def rule_from_request(msg: dict):
    """(sde_fault_rule cdata, seed) for an `add` request: kind, and optionally nsid (absent:
    every namespace), lba [first, count], key (hex), count (0: until cleared), probability,
    latency_us, directions, seed."""
    kind = msg.get("kind")
    if kind not in KINDS:
        raise FaultError(f"fault kind must be one of {', '.join(KINDS)}, got {kind!r}")
    r = ffi.new("sde_fault_rule *")
    r.kind = KINDS[kind]
    if msg.get("nsid") is None:
        r.all_ns = 1
    else:
        r.nsid = _int(msg, "nsid", 0, 0, lib.SDE_MAX_NS)
    lba = msg.get("lba")
    key = msg.get("key")
    if lba is not None and key is not None:
        raise FaultError("a fault names an LBA range or a key, not both")
    if lba is not None:
        if (not isinstance(lba, list) or len(lba) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                           for v in lba) or lba[1] == 0):
            raise FaultError("lba is [first, count] with count >= 1")
        if r.all_ns or r.nsid == 0:
            raise FaultError("an LBA range needs the namespace it is in (nsid >= 1)")
        r.lba_first, r.lba_count = lba
    if key is not None:
        try:
            raw = bytes.fromhex(key)
        except (TypeError, ValueError):
            raise FaultError(f"key must be hex, got {key!r}") from None
        if not 1 <= len(raw) <= 16:
            raise FaultError(f"a key is 1 to 16 bytes, got {len(raw)}")
        r.klen = len(raw)
        ffi.memmove(r.key, raw, len(raw))
        if r.all_ns:
            r.all_ns, r.nsid = 0, 0  # a key without a namespace: the shared default's
    r.count = _int(msg, "count", 0)
    p = finite_number(msg.get("probability", 1.0), "probability")
    if not 0 < p <= 1:
        raise FaultError(f"probability must be in (0, 1], got {p}")
    r.probability = p
    if kind == "latency":
        us = finite_number(msg.get("latency_us", 0), "latency_us")
        if not 0 < us <= 60e6:
            raise FaultError("a latency fault needs latency_us in (0, 60 s]")
        r.latency_ns = max(1, round(us * 1000))
        direction = msg.get("directions", "both")
        if direction not in DIRECTIONS:
            raise FaultError(f"directions must be one of {', '.join(DIRECTIONS)}")
        r.directions = DIRECTIONS[direction]
    elif msg.get("latency_us") is not None:
        raise FaultError("latency_us is for latency faults")
    return r, _int(msg, "seed", 0)


def rule_to_dict(r) -> dict:
    out = {"id": r.id, "kind": KIND_NAMES.get(r.kind, str(r.kind)),
           "nsid": None if r.all_ns else r.nsid, "count": r.count,
           "probability": r.probability, "hits": r.hits}
    if r.lba_count:
        out["lba"] = [r.lba_first, r.lba_count]
    if r.klen:
        out["key"] = bytes(ffi.buffer(r.key, r.klen)).hex()
    if r.kind == lib.SDE_FAULT_LATENCY:
        out["latency_us"] = r.latency_ns / 1000
        out["directions"] = DIRECTION_NAMES.get(r.directions, "both")
    return out


def describe(msg: dict) -> str:
    """One line for the daemon's log."""
    parts = [str(msg.get("kind"))]
    for name in ("nsid", "lba", "key", "count", "probability", "latency_us", "seed"):
        if msg.get(name) is not None:
            parts.append(f"{name}={msg[name]}")
    return " ".join(parts)
