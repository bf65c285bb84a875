"""Data mode of `ssdemu replay`: real KV bytes through a running daemon, with hostlib.

The drive (a daemon started with `--clock virtual`) quantizes each new block in its firmware,
stores it on its media, matches each request's keys against its prefix index, reads and
dequantizes the hits, and deletes what the drive tier's LRU evicts.  Every command carries the
request's arrival time on the virtual clock, so the completion times it returns are the
drive's modelled times for the same command sequence model mode runs (ssdemu/replay.py).

Every block read back is checked: the drive's dequantized bytes must equal the host's own
dequantization of the host's own quantization of the block stored (a CRC-32, computed when
the block is first read back and kept); a mismatch is counted in `data_errors`.
"""

from __future__ import annotations

import time
import zlib

import numpy as np

from firmware.quant import dequantize, quantize
from ssdemu.errors import SsdemuError
from ssdemu.profile import Profile
from ssdemu.replay import DEFAULT_HOST_LINK_BYTES_PER_S, replay, report
from ssdemu.serving import ModelConfig, SyntheticKV, drive_key


class DataModeError(SsdemuError):
    pass


class DataDrive:
    """The drive of data mode: a hostlib Device on a virtual-clock daemon."""

    def __init__(self, dev, profile: Profile, model: ModelConfig, quant: str | None):
        info = dev.identify()
        if info.get("clock") != "virtual":
            raise DataModeError("data mode needs a daemon started with --clock virtual "
                                "(the trace's timestamps drive the drive's clock)")
        if info.get("timing") != "detailed":
            raise DataModeError("data mode needs a daemon with --timing detailed (the "
                                f"daemon has {info.get('timing')!r})")
        if info.get("profile") not in (None, profile.name):
            raise DataModeError(f"the daemon runs profile {info['profile']!r}, the replay "
                                f"asks for {profile.name!r}")
        stored, limit = model.stored_block_bytes(quant), info["max_value_bytes"]
        if stored > limit:
            raise DataModeError(
                f"a {model.name} block is {stored:,} bytes stored, over the drive's "
                f"{limit:,}-byte value limit (the profile's kv.max_value_bytes)")
        if any(k.endswith(b"mooncake") for k in dev.kv_list(max_keys=1024)):
            raise DataModeError("the drive already holds trace blocks from an earlier replay: "
                                "start from a fresh drive (ssdemu format, or serve --format)")
        self.dev, self.profile, self.model, self.quant = dev, profile, model, quant
        self.kv = SyntheticKV(model)
        self.out = dev.alloc(model.block_bytes).view(np.uint16).reshape(self.kv.shape)
        self.expected: dict[int, int] = {}  # block id -> CRC-32 of the bytes it must read
        self.data_errors = 0
        self.verified = 0
        self.match_mismatches = 0
        self._base = self._counters_now()

    def _stamp(self, t_ns: int) -> None:
        self.dev.submit_time_ns = int(t_ns)

    def match(self, t_ns: int, ids, expected: int) -> int:
        """The drive's own answer; where it differs from the host's LRU mirror of the drive
        (it must not), it is counted."""
        self._stamp(t_ns)
        run = self.dev.prefix_match([drive_key(b) for b in ids])
        self.match_mismatches += run != expected
        return run

    def load(self, t_ns: int, ids) -> int:
        self._stamp(t_ns)
        done = t_ns
        for b in ids:
            key = drive_key(b)
            if self.quant:
                self.dev.kv_get_dequantized(key, self.out)
            else:
                self.dev.kv_get(key, self.out.reshape(-1).view(np.uint8))
            done = max(done, self.dev.qp.last_device_ns)
            self.verified += 1
            if zlib.crc32(self.out) != self._expected(b):
                self.data_errors += 1
        return done

    def _expected(self, b: int) -> int:
        crc = self.expected.get(b)
        if crc is None:
            block = self.kv.block(b)
            if self.quant:
                block, _ = dequantize(quantize(block, "fp16", self.quant))
            crc = self.expected[b] = zlib.crc32(np.ascontiguousarray(block))
        return crc

    def store(self, t_ns: int, ids) -> None:
        self._stamp(t_ns)
        for b in ids:
            block = self.kv.block(b)
            key = drive_key(b)
            if self.quant:
                self.dev.kv_put_quantized(key, block, "fp16", self.quant)
            else:
                self.dev.kv_put(key, block.reshape(-1).view(np.uint8))
            self.expected.pop(b, None)

    def evict(self, ids) -> None:
        for b in ids:
            self.dev.kv_delete(drive_key(b))
            self.expected.pop(b, None)

    def _counters_now(self) -> dict:
        page = self.dev.log()
        m = page["model"]
        return {"link_busy_ns": m["link_busy_ns"], "channel_busy_ns": m["channel_busy_ns"],
                "compute_busy_ns": float(sum(k["device_ns"] for k in page["compute"].values())),
                "host_link_bytes": m["link_bytes"],
                "nand_bytes": m["nand_bytes_read"] + m["nand_bytes_written"],
                "host_lag": page["host_lag"] + sum(k["host_lag_calls"]
                                                   for k in page["compute"].values()),
                "logical_bytes": page["logical_bytes"], "physical_bytes": page["physical_bytes"]}

    def counters(self) -> dict:
        """The daemon's counters since this replay began (it may have served others)."""
        now = self._counters_now()
        out = {k: now[k] - self._base[k] for k in now}
        out["logical_bytes"], out["physical_bytes"] = now["logical_bytes"], now["physical_bytes"]
        return out


def replay_data(dev, requests, profile: Profile, model: ModelConfig, quant: str | None,
                capacities: dict, host_link_bytes_per_s: float = DEFAULT_HOST_LINK_BYTES_PER_S,
                progress=None) -> dict:
    """Data mode on a connected hostlib Device."""
    requests = list(requests)
    if capacities["drive"] == 0:
        raise DataModeError("data mode needs a drive tier (its capacity is 0)")
    t0 = time.perf_counter()
    drive = DataDrive(dev, profile, model, quant)
    with_drive = replay(requests, profile, model, capacities, drive, host_link_bytes_per_s,
                        progress)
    without = replay(requests, profile, model, capacities, None, host_link_bytes_per_s)
    out = report("data", requests, profile, model, quant, capacities, with_drive, without,
                 time.perf_counter() - t0)
    c = drive.counters()
    out["data"] = {"blocks_verified": drive.verified, "data_errors": drive.data_errors,
                   "match_mismatches": drive.match_mismatches,
                   "logical_bytes": c["logical_bytes"], "physical_bytes": c["physical_bytes"]}
    return out
