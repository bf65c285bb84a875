"""The storage tier of the MLPerf Storage KV-cache benchmark (mlcommons/storage,
kv_cache_benchmark: its `kv_cache` package) on an ssdemu drive.

The benchmark keeps KV entries in three tiers (GPU, CPU, NVMe); its NVMe tier is a
`StorageBackend` (kv_cache/backends.py) with four calls, which this class answers the same
way over a drive:

    write(key: str, data) -> IOTiming      data: an ndarray or any bytes-like object
    read(key: str) -> (ndarray, IOTiming)      KeyError when the key is not stored
    delete(key: str)
    clear()

IOTiming has `total`, `device` and `host` seconds, as the benchmark's: `host` is the copy
between the caller's memory and registered staging buffers, `device` the drive's commands
(submitted together, waited for together).  `read` returns the array as it was written (its
shape and dtype, as the benchmark's file tier does), a bytes-like entry as uint8.

A full drive is never silent: a write that meets CAPACITY_EXCEEDED raises (the benchmark
counts it as a failed write and goes on) and is counted in `full_writes`; the launcher then
ends with one line saying so and exit code 3.  `close()` (also at exit) waits for the calls
in flight and refuses later ones with `TierClosed`, so that the benchmark's worker threads,
still running at exit, never meet a half-closed tier.

An entry larger than the drive's largest value (identify's max_value_bytes; the benchmark's
entries reach gigabytes) is stored as parts of that size, all in flight at once.  Entries
live in a keys-only namespace of the connection's owner, made on first use; clear() deletes
what this backend wrote.

Running the benchmark on the drive (the user fetches the benchmark; nothing here copies it):

    ssdemu serve --media file:/var/tmp/drive.img:64G --socket /tmp/ssdemu.sock &
    cd storage/kv_cache_benchmark && pip install -e .
    python -m hostlib.mlperf_kv --socket /tmp/ssdemu.sock -- \\
        --model llama3.1-8b --num-users 8 --duration 60 --gpu-mem-gb 0 --cpu-mem-gb 0

`python -m hostlib.mlperf_kv` installs this class as the benchmark's NVMe tier
(`install`) and runs its command line with the arguments after `--`.  Without
--storage-capacity-gb the benchmark sizes its tier from the free space of its cache
directory (os.statvfs of the tier's base_path); the drive's tier has none, that check fails
and the benchmark takes the tier as unlimited, so the launcher gives it the drive's free
space (less a tenth for the parts' rounding and the store's own records) unless told.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import logging
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

import hostlib
from hostlib.client import copy_bytes

log = logging.getLogger("hostlib.mlperf_kv")
FREE_SHARE = 0.9  # of the drive's free bytes, offered to the benchmark as its tier's size
EXIT_FULL = 3  # the launcher's exit code when writes met a full drive


class TierClosed(OSError):
    """A call on a tier that close() has closed (or is closing)."""


@dataclass
class IOTiming:
    """The benchmark's StorageBackend.IOTiming (used instead when it can be imported)."""

    total: float
    device: float
    host: float


def _timing_class():
    try:
        from kv_cache.backends import StorageBackend
        return StorageBackend.IOTiming
    except Exception:  # the benchmark is not installed: the same fields
        return IOTiming


def _bytes_of(data) -> np.ndarray:
    """The entry's bytes as a flat uint8 array (no copy when contiguous)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(data).cast("B"), np.uint8)


class SsdemuBackend:
    """The benchmark's NVMe tier on a drive.  Thread safe: the benchmark's user threads
    share `queue_pairs` queue pairs (a thread keeps one by its id)."""

    base_path = None  # the benchmark sizes its tier from this directory's free space

    def __init__(self, socket_path: str, *, owner_key_file: str | None = None,
                 queue_pairs: int = 4, nsid: int | None = None):
        self.dev = hostlib.connect(socket_path, owner_key_file=owner_key_file)
        self.max_value = self.dev.identify()["max_value_bytes"]
        # a keys-only namespace of its own for the run, deleted at close (or exit)
        self._own_ns = nsid is None
        self.nsid = nsid if nsid is not None else self.dev.ns_create(0)
        atexit.register(self.close)
        self._qps = [self.dev.qp] + [self.dev.queue_pair() for _ in range(queue_pairs - 1)]
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # calls in flight: close waits for them
        self._active = 0
        self._closing = False
        self.full_writes = 0  # writes that met CAPACITY_EXCEEDED
        self.writes = 0
        # key -> size, parts, shape and dtype (the file tier keeps shape and dtype too)
        self.metadata: dict[str, dict] = {}
        self.IOTiming = _timing_class()
        TIERS.append(self)

    def _enter(self) -> None:
        with self._lock:
            if self._closing:
                raise TierClosed("the ssdemu tier is closed")
            self._active += 1

    def _leave(self) -> None:
        with self._lock:
            self._active -= 1
            if not self._active:
                self._idle.notify_all()

    def _qp(self):
        return self._qps[threading.get_ident() % len(self._qps)]

    def _parts(self, key: str, nbytes: int) -> list[tuple[bytes, int, int]]:
        """(drive key, start, length) of each part of an entry."""
        out, start, i = [], 0, 0
        while start < nbytes or i == 0:
            n = min(self.max_value, nbytes - start)
            out.append((hashlib.blake2b(f"{key}#{i}".encode(), digest_size=16).digest(),
                        start, n))
            start += n
            i += 1
        return out

    def write(self, key: str, data):
        self._enter()
        try:
            return self._write(key, data)
        finally:
            self._leave()

    def _write(self, key: str, data):
        t0 = time.perf_counter()
        flat = _bytes_of(data)
        if flat.nbytes == 0:
            raise ValueError(f"{key}: an empty entry (the drive stores 1 byte or more)")
        parts = self._parts(key, flat.nbytes)
        qp = self._qp()
        stages = []
        try:
            for _, start, n in parts:
                stage = self.dev.staging_take(n)
                stages.append(stage)
                copy_bytes(stage, flat[start:start + n])
            t1 = time.perf_counter()
            futures = [self.dev.kv_put_async(k, stage, qp=qp, nsid=self.nsid)
                       for (k, _, _), stage in zip(parts, stages, strict=True)]
            self._wait_puts(key, futures)
        finally:
            for stage in stages:
                self.dev.staging_give(stage)
        t2 = time.perf_counter()
        shape, dtype = ((data.shape, data.dtype.str) if isinstance(data, np.ndarray)
                        else ((flat.nbytes,), "|u1"))
        with self._lock:
            old = self.metadata.get(key)
            self.metadata[key] = {"size": flat.nbytes, "parts": len(parts), "shape": shape,
                                  "dtype": dtype}
        if old and old["parts"] > len(parts):  # a shorter entry: its old tail goes
            for k, _, _ in self._parts(key, old["size"])[len(parts):]:
                self._delete_part(k, qp)
        return self.IOTiming(total=t2 - t0, device=t2 - t1, host=t1 - t0)

    def _wait_puts(self, key: str, futures) -> None:
        """Every part's put; a full drive counted, said once in the log, and raised."""
        full = None
        for f in futures:
            try:
                f.result()
            except hostlib.CapacityError as e:
                full = e
        with self._lock:
            self.writes += 1
            self.full_writes += full is not None
            first = full is not None and self.full_writes == 1
        if full is not None:
            if first:
                log.warning("the drive is full: %s (a write failed with CAPACITY_EXCEEDED; "
                            "the benchmark counts it as failed and goes on)", full)
            raise OSError(f"{key}: the drive is full (CAPACITY_EXCEEDED): {full}")

    def read(self, key: str):
        self._enter()
        try:
            return self._read(key)
        finally:
            self._leave()

    def _read(self, key: str):
        t0 = time.perf_counter()
        with self._lock:
            meta = self.metadata.get(key)
        if meta is None:
            raise KeyError(f"Key {key} not found in the ssdemu tier")
        parts = self._parts(key, meta["size"])
        qp = self._qp()
        stages = [self.dev.staging_take(n) for _, _, n in parts]
        try:
            t1 = time.perf_counter()
            futures = [self.dev.kv_get_async(k, stage, qp=qp, nsid=self.nsid)
                       for (k, _, _), stage in zip(parts, stages, strict=True)]
            try:
                got = [f.result() for f in futures]
            except hostlib.KeyNotFoundError:
                raise KeyError(f"Key {key} not found on the drive") from None
            t2 = time.perf_counter()
            out = np.empty(meta["size"], np.uint8)
            for (_, start, n), stage, m in zip(parts, stages, got, strict=True):
                if m != n:
                    raise OSError(f"{key}: a part of {m} bytes where {n} were written")
                copy_bytes(out[start:start + n], stage[:n])
        finally:
            for stage in stages:
                self.dev.staging_give(stage)
        t3 = time.perf_counter()
        entry = out.view(np.dtype(meta["dtype"])).reshape(meta["shape"])
        return entry, self.IOTiming(total=t3 - t0, device=t2 - t1, host=(t1 - t0) + (t3 - t2))

    def _delete_part(self, k: bytes, qp) -> None:
        try:
            self.dev.kv_delete(k, qp, nsid=self.nsid)
        except hostlib.KeyNotFoundError:
            pass

    def delete(self, key: str) -> None:
        self._enter()
        try:
            self._delete(key)
        finally:
            self._leave()

    def _delete(self, key: str) -> None:
        with self._lock:
            meta = self.metadata.pop(key, None)
        if meta is not None:
            qp = self._qp()
            for k, _, _ in self._parts(key, meta["size"]):
                self._delete_part(k, qp)

    def clear(self) -> None:
        with self._lock:
            keys = list(self.metadata)
        for key in keys:
            self.delete(key)

    def close(self, timeout: float = 60.0) -> None:
        """Refuse new calls (TierClosed), wait for those in flight (at most timeout s), then
        delete the namespace this backend made (its entries with it) and disconnect."""
        with self._lock:
            if self.dev is None or self._closing:
                return
            self._closing = True
            if not self._idle.wait_for(lambda: not self._active, timeout):
                log.warning("closing the ssdemu tier with %d calls still in flight after "
                            "%.0f s", self._active, timeout)
        try:
            if self._own_ns:
                self.dev.ns_delete(self.nsid)
        except (hostlib.DeviceError, hostlib.ConnectError, hostlib.DeviceGoneError):
            pass
        self.dev.close()
        self.dev = None
        atexit.unregister(self.close)


TIERS: list[SsdemuBackend] = []  # every tier made in this process (the launcher's report)


def free_gib(socket_path: str, **kw) -> float:
    """The drive's free space offered to the benchmark (FREE_SHARE of it, GiB): the store's
    free bytes (an admin's log page), else its capacity."""
    with hostlib.connect(socket_path, **kw) as dev:
        page = dev.log()
        free = (page["store"]["free_bytes"] if page.get("scope") == "device"
                else dev.identify()["capacity_bytes"])
    return free * FREE_SHARE / 2**30


def install(socket_path: str, **kw) -> None:
    """Make the benchmark's tiered cache build its NVMe tier on the drive (it builds one per
    run: `NVMeBackend(base_path=...)` in kv_cache.cache)."""
    import kv_cache.backends
    import kv_cache.cache

    def nvme_backend(base_path=None, **_ignored):
        return SsdemuBackend(socket_path, **kw)

    kv_cache.cache.NVMeBackend = nvme_backend
    kv_cache.backends.NVMeBackend = nvme_backend


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(
        prog="python -m hostlib.mlperf_kv",
        description="run the MLPerf Storage KV-cache benchmark with its NVMe tier on an "
        "ssdemu drive; its own arguments follow --")
    p.add_argument("--socket", required=True, help="the daemon's socket")
    p.add_argument("--owner-key-file", help="the owner whose namespace the tier uses")
    p.add_argument("--queue-pairs", type=int, default=4)
    args = p.parse_args(own)
    try:
        install(args.socket, owner_key_file=args.owner_key_file, queue_pairs=args.queue_pairs)
        from kv_cache.cli import main as benchmark_main
    except ImportError as e:
        print(f"python -m hostlib.mlperf_kv: the benchmark's kv_cache package is not "
              f"importable ({e}): pip install -e storage/kv_cache_benchmark", file=sys.stderr)
        return 2
    if not any(a.split("=")[0] == "--storage-capacity-gb" for a in rest):
        gib = free_gib(args.socket, owner_key_file=args.owner_key_file)
        rest += ["--storage-capacity-gb", f"{gib:.3f}"]
        print(f"python -m hostlib.mlperf_kv: the tier's size is the drive's free space: "
              f"--storage-capacity-gb {gib:.3f}", file=sys.stderr)
    sys.argv = ["kv-cache", *rest]
    code = benchmark_main() or 0
    full = sum(t.full_writes for t in TIERS)
    if full:
        writes = sum(t.writes for t in TIERS)
        print(f"python -m hostlib.mlperf_kv: {full} of {writes} writes to the drive failed: "
              f"it is full (CAPACITY_EXCEEDED), and the benchmark's figures leave them out; "
              f"give a smaller --storage-capacity-gb or a larger drive", file=sys.stderr)
        return code or EXIT_FULL
    return code


if __name__ == "__main__":
    sys.exit(main())
