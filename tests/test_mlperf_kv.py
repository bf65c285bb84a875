"""hostlib.mlperf_kv, the MLPerf Storage KV-cache benchmark's NVMe tier on a drive, driven the
way the benchmark drives its tier (kv_cache/backends.py and kv_cache/cache.py in
mlcommons/storage, as their source documents them): entries made as its generator makes them
(float16 arrays of layers x 2 x tokens x kv_heads x head_dim), written and read from many
user threads at once, demoted from its CPU tier as bytes, deleted by eviction, cleared.  No
code of the benchmark is fetched or copied: a stand-in `kv_cache` package checks how
`install` and the launcher hook in."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import zlib

import numpy as np
import pytest

import hostlib
from hostlib.mlperf_kv import SsdemuBackend
from ssdemu.tools.daemon_process import DaemonProcess


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:768M")
    yield d
    assert d.terminate()[0] == 0


def _entry(rng, tokens: int, layers: int = 4, kv_heads: int = 2, dim: int = 64) -> np.ndarray:
    return rng.uniform(-1, 1, (layers, 2, tokens, kv_heads, dim)).astype(np.float16)


def test_entries_from_many_threads_read_back_bit_exact(daemon):
    """8 user threads, each writing and reading its entries (sizes from one token to 3 MiB)
    while the others do; every read's CRC is the written bytes' CRC; timings add up."""
    tier = SsdemuBackend(daemon.socket_path, queue_pairs=3)
    errors = []

    def user(u: int) -> None:
        rng = np.random.default_rng(u)
        try:
            for i in range(12):
                key = f"conv_user{u}_turn_{i}"
                data = _entry(rng, int(rng.integers(1, 1536)))
                t = tier.write(key, data)
                assert t.total >= t.device >= 0 and t.total >= t.host >= 0
                got, t = tier.read(key)
                assert got.shape == data.shape and got.dtype == data.dtype
                assert zlib.crc32(got) == zlib.crc32(data.tobytes()), key
                assert t.total >= t.device >= 0 and t.total >= t.host >= 0
        except Exception as e:  # reported below, with its thread
            errors.append((u, repr(e)))

    threads = [threading.Thread(target=user, args=(u,)) for u in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(tier.metadata) == 96
    tier.close()


def test_demotion_eviction_and_clear(daemon):
    """As the tiered cache moves an entry: the CPU tier's bytes written here (a demotion), a
    rewrite with other bytes, an eviction (delete), a key never written (KeyError), clear
    (every entry gone from the drive too)."""
    tier = SsdemuBackend(daemon.socket_path)
    rng = np.random.default_rng(1)
    data = _entry(rng, 100)
    tier.write("user7_ctx", bytes(data))  # the CPU tier keeps bytes
    assert bytes(tier.read("user7_ctx")[0]) == data.tobytes()
    other = _entry(rng, 30)
    tier.write("user7_ctx", other)
    assert bytes(tier.read("user7_ctx")[0]) == other.tobytes()
    tier.delete("user7_ctx")
    with pytest.raises(KeyError):
        tier.read("user7_ctx")
    with pytest.raises(KeyError):
        tier.read("never_written")
    tier.delete("never_written")  # as the file tier: nothing to do
    for i in range(5):
        tier.write(f"k{i}", _entry(rng, 10))
    tier.clear()
    assert tier.metadata == {}
    assert tier.dev.kv_list(nsid=tier.nsid) == []
    with pytest.raises(ValueError):
        tier.write("empty", b"")
    tier.close()


def test_an_entry_larger_than_the_drives_largest_value(daemon):
    """An entry of 2.5 parts (the drive's max_value_bytes each) reads back whole; rewritten
    shorter, its old parts go from the drive; close deletes the tier's namespace."""
    tier = SsdemuBackend(daemon.socket_path)
    n = tier.max_value * 5 // 2
    data = np.random.default_rng(2).integers(0, 256, n, dtype=np.uint8)
    tier.write("rag_doc", data)
    assert len(tier.dev.kv_list(nsid=tier.nsid)) == 3
    got, _ = tier.read("rag_doc")
    assert np.array_equal(got, data)
    tier.write("rag_doc", data[:1000])
    assert len(tier.dev.kv_list(nsid=tier.nsid)) == 1
    assert bytes(tier.read("rag_doc")[0]) == data[:1000].tobytes()
    nsid = tier.nsid
    tier.close()
    with hostlib.connect(daemon.socket_path) as dev:
        assert nsid not in [x["nsid"] for x in dev.namespaces()]


_STAND_IN = {
    "kv_cache/__init__.py": "",
    "kv_cache/backends.py": """
        from dataclasses import dataclass

        class StorageBackend:
            @dataclass
            class IOTiming:
                total: float
                device: float
                host: float

        class NVMeBackend(StorageBackend):
            def __init__(self, base_path=None):
                raise AssertionError("the file tier was built, not the drive's")
        """,
    "kv_cache/cache.py": """
        from kv_cache.backends import NVMeBackend

        class MultiTierCache:
            def __init__(self, cache_dir=None):
                self.backends = {"nvme": NVMeBackend(base_path=cache_dir)}
        """,
    "kv_cache/cli.py": """
        import sys
        import numpy as np
        from kv_cache.backends import StorageBackend
        from kv_cache.cache import MultiTierCache

        def main():
            tier = MultiTierCache(cache_dir="/nonexistent").backends["nvme"]
            data = np.arange(50000, dtype=np.float16)
            t = tier.write("k", data)
            got, t2 = tier.read("k")
            assert bytes(got) == data.tobytes()
            assert isinstance(t, StorageBackend.IOTiming), type(t)
            print("ran with", type(tier).__name__, sys.argv[1:])
        """,
}


def _launch(tmp_path, socket_path: str, files: dict, args: list[str]):
    """The launcher against a stand-in kv_cache package made of files."""
    for path, text in files.items():
        f = tmp_path / "pkg" / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(textwrap.dedent(text))
    env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'pkg'}:{os.getcwd()}")
    return subprocess.run([sys.executable, "-m", "hostlib.mlperf_kv", "--socket", socket_path,
                           "--", *args], capture_output=True, text=True, timeout=120, env=env)


def test_install_and_the_launcher_put_the_tier_in_the_benchmarks_cache(daemon, tmp_path):
    """`python -m hostlib.mlperf_kv --socket S -- ARGS` against a stand-in kv_cache package
    that builds its NVMe tier as the benchmark's MultiTierCache does: the drive's tier is
    built, returns the benchmark's own IOTiming, and the benchmark gets ARGS; without the
    package, one line and exit 2."""
    p = _launch(tmp_path, daemon.socket_path, _STAND_IN, ["--model", "tiny-1b"])
    assert p.returncode == 0, p.stderr
    # the benchmark's args, and the tier's size: the drive's free space (no size was given)
    assert "ran with SsdemuBackend ['--model', 'tiny-1b', '--storage-capacity-gb', '" in p.stdout
    given = _launch(tmp_path, daemon.socket_path, _STAND_IN, ["--storage-capacity-gb", "1"])
    assert "ran with SsdemuBackend ['--storage-capacity-gb', '1']" in given.stdout
    bare = subprocess.run([sys.executable, "-m", "hostlib.mlperf_kv", "--socket",
                           daemon.socket_path], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert bare.returncode == 2
    assert bare.stderr.strip().count("\n") == 0 and "kv_cache" in bare.stderr


def test_read_returns_the_array_as_written(daemon):
    """The benchmark's file tier gives back the written array (np.load: its shape and
    dtype); the drive's tier too (it gave a flat uint8 memoryview); bytes come back uint8."""
    tier = SsdemuBackend(daemon.socket_path)
    data = _entry(np.random.default_rng(5), 33)
    tier.write("a", data)
    got, _ = tier.read("a")
    assert isinstance(got, np.ndarray)
    assert (got.shape, got.dtype) == (data.shape, data.dtype) and np.array_equal(got, data)
    tier.write("b", b"raw bytes")
    got, _ = tier.read("b")
    assert got.dtype == np.uint8 and got.tobytes() == b"raw bytes"
    tier.close()


def test_close_waits_for_the_calls_in_flight_and_refuses_later_ones(daemon):
    """close() runs at exit while the benchmark's worker threads still read: before, they
    met a tier half closed (AttributeError on its device, tens of thousands in a 4-thread
    run, and reads of a namespace already deleted).  Now every call either completes or is
    refused with TierClosed."""
    from hostlib.mlperf_kv import TierClosed

    tier = SsdemuBackend(daemon.socket_path)
    data = _entry(np.random.default_rng(6), 512)
    for i in range(8):
        tier.write(f"k{i}", data)
    seen: dict[str, int] = {}
    done = threading.Event()
    ok = [0]

    def reader(u: int) -> None:
        i = u
        while not done.is_set():
            try:
                got, _ = tier.read(f"k{i % 8}")
                assert np.array_equal(got, data)
                ok[0] += 1
            except TierClosed:
                seen["TierClosed"] = seen.get("TierClosed", 0) + 1
            except Exception as e:  # anything else is the race
                seen[type(e).__name__] = seen.get(type(e).__name__, 0) + 1
            i += 1

    threads = [threading.Thread(target=reader, args=(u,)) for u in range(4)]
    for t in threads:
        t.start()
    while ok[0] < 20:
        threading.Event().wait(0.01)
    tier.close()
    done.set()
    for t in threads:
        t.join()
    assert set(seen) <= {"TierClosed"}, seen
    tier.close()  # twice: nothing more


def test_a_full_drive_is_not_silent(tmp_path):
    """A drive too small for the workload: each write past its room raises (the benchmark
    counts a failed write and goes on) and is counted; the launcher, which gives the
    benchmark the drive's free space when it is not told a size, ends with one line and exit
    code 3 (before: CAPACITY_EXCEEDED swallowed, exit 0 with figures)."""
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:96M")
    try:
        tier = SsdemuBackend(d.socket_path)
        data = np.zeros(4 << 20, np.uint8)
        failed = 0
        for i in range(40):  # 160 MiB into a 96 MiB drive
            try:
                tier.write(f"k{i}", data + i)
            except OSError as e:
                assert "full" in str(e)
                failed += 1
        assert failed > 0 and tier.full_writes == failed and tier.writes == 40
        tier.close()
        p = _launch(tmp_path, d.socket_path, {**_STAND_IN, "kv_cache/cli.py": _FILLS},
                    ["--model", "tiny-1b"])
        assert p.returncode == 3, p.stderr
        said = [line for line in p.stderr.splitlines() if "writes to the drive failed" in line]
        assert len(said) == 1 and "full" in said[0]
        sized = [line for line in p.stdout.splitlines() if line.startswith("capacity")]
        assert sized and 0 < float(sized[0].split()[1]) < 96 / 1024  # the drive's free space
    finally:
        assert d.terminate()[0] == 0


_FILLS = """
    import sys
    import numpy as np
    from kv_cache.cache import MultiTierCache

    def main():
        # as the benchmark: a failed write is counted and the run goes on
        tier = MultiTierCache(cache_dir="/nonexistent").backends["nvme"]
        args = sys.argv[1:]
        print("capacity", args[args.index("--storage-capacity-gb") + 1])
        failed = 0
        for i in range(40):
            try:
                tier.write(f"k{i}", np.full(4 << 20, i, np.uint8))
            except Exception:
                failed += 1
        print("failed", failed)
    """
