"""Every way of waiting at once (issue 35, item 1): blocking calls, futures and asyncio
coroutines on one connection, two threads sharing another connection's queue pair, an
event loop on a third; small values, values that take a large share of the bounce buffer,
values larger than it, a queue of 8 entries that fills.  Each worker checks every value it
reads.  A watchdog fails the test within seconds when a worker stops making progress (a
lost wake-up, a deadlock), rather than the suite hanging."""

from __future__ import annotations

import asyncio
import functools
import random
import threading
import time
import traceback

import numpy as np
import pytest

import hostlib
import hostlib.aio
from ssdemu.tools.daemon_process import DaemonProcess

STALL_S = 5.0  # a worker that has not finished a round in this long is stuck
BIG = 1 << 20  # a quarter of a queue pair's 4 MiB bounce buffer
HUGE = 6 << 20  # more than the bounce buffer: a temporary registered buffer


@functools.cache  # the same bytes as made afresh: a 1 MiB value took ~0.9 ms to make, ~2 ms
def _value(tag: bytes, n: int) -> bytes:  # of each round's Python under the GIL
    return (tag * (n // len(tag) + 1))[:n]


class _Stress:
    def __init__(self, sock: str, rounds: int, seed: int):
        self.sock, self.rounds, self.seed = sock, rounds, seed
        self.progress: dict[str, int] = {}
        self.errors: list[str] = []
        self.stop = threading.Event()

    def _run(self, name: str, body) -> None:
        self.progress[name] = 0
        try:
            rng = random.Random(f"{self.seed}-{name}")
            for r in range(self.rounds):
                if self.stop.is_set():
                    return
                body(rng, r)
                self.progress[name] = r + 1
        except Exception:
            self.errors.append(f"{name}: {traceback.format_exc()}")

    # -- one connection (a, 8 entries): blocking calls, futures and an event loop --
    def blocking_a(self, rng: random.Random, r: int) -> None:
        k = b"ba-%d" % (r % 8)
        v = _value(k, rng.choice((1, 100, 4096, BIG)))
        self.a.kv_put(k, v)
        assert self.a.kv_get(k) == v  # no `out`: a bounce share as large as the value
        if r % 97 == 0:
            self.a.kv_put(b"ba-huge", _value(b"huge", HUGE))
            assert self.a.kv_get(b"ba-huge") == _value(b"huge", HUGE)
        self.a.nop()

    def futures_a(self, rng: random.Random, r: int) -> None:
        ks = [b"fa-%d-%d" % (r % 4, i) for i in range(4)]
        vs = [_value(k, rng.choice((64, 8192, BIG))) for k in ks]
        futures = [self.a.kv_put_async(k, v) for k, v in zip(ks, vs, strict=True)]
        for f in futures:
            f.result()
        out = self.a_out
        got = [self.a.kv_get_async(k, out[i * BIG:(i + 1) * BIG]) for i, k in enumerate(ks)]
        for i, (f, v) in enumerate(zip(got, vs, strict=True)):
            n = f.result()
            assert bytes(out[i * BIG:i * BIG + n]) == v

    async def _aio_round(self, adev, tag: bytes, rng: random.Random, r: int) -> None:
        k = tag + b"-%d" % (r % 8)
        v = _value(k, rng.choice((10, 5000, BIG)))
        await adev.kv_put(k, v)
        got = await asyncio.gather(adev.kv_get(k), adev.kv_get(k), adev.nop())
        assert got[0] == v and got[1] == v

    # -- another connection (b): two threads on its one queue pair --
    def shared_b(self, rng: random.Random, r: int, who: bytes) -> None:
        k = b"sb-%s-%d" % (who, r % 8)
        v = _value(k, rng.choice((1, 333, 70000)))
        self.b.kv_put(k, v)
        assert self.b.kv_get(k) == v
        if r % 5 == 0:
            self.b.nop()

    def run(self) -> None:
        self.a = hostlib.connect(self.sock, entries=8)
        self.b = hostlib.connect(self.sock)
        self.a_out = self.a.alloc(4 * BIG)
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        holder = {}

        def loop_thread():
            asyncio.set_event_loop(loop)
            holder["a"] = hostlib.aio.AsyncDevice(self.a, loop)  # shares a's queue pair
            holder["c"] = loop.run_until_complete(hostlib.aio.connect(self.sock))
            ready.set()
            loop.run_forever()

        lt = threading.Thread(target=loop_thread, daemon=True)
        lt.start()
        assert ready.wait(30)

        def aio_worker(name: str, adev, tag: bytes):
            def body(rng, r):
                fut = asyncio.run_coroutine_threadsafe(self._aio_round(adev, tag, rng, r), loop)
                while True:
                    try:
                        return fut.result(timeout=0.5)
                    except TimeoutError:
                        if self.stop.is_set():
                            fut.cancel()
                            return
            self._run(name, body)

        workers = {
            "blocking-a": lambda: self._run("blocking-a", self.blocking_a),
            "futures-a": lambda: self._run("futures-a", self.futures_a),
            "asyncio-a": lambda: aio_worker("asyncio-a", holder["a"], b"aa"),
            "asyncio-c": lambda: aio_worker("asyncio-c", holder["c"], b"ac"),
            "shared-b1": lambda: self._run("shared-b1",
                                           lambda rng, r: self.shared_b(rng, r, b"1")),
            "shared-b2": lambda: self._run("shared-b2",
                                           lambda rng, r: self.shared_b(rng, r, b"2")),
        }
        threads = {n: threading.Thread(target=w, name=n, daemon=True)
                   for n, w in workers.items()}
        for t in threads.values():
            t.start()
        last = {n: (0, time.monotonic()) for n in threads}
        self.stuck: list[str] = []
        while any(t.is_alive() for t in threads.values()) and not self.errors:
            time.sleep(0.2)
            now = time.monotonic()
            for n, t in threads.items():
                p = self.progress.get(n, 0)
                if p != last[n][0]:
                    last[n] = (p, now)
                elif t.is_alive() and now - last[n][1] > STALL_S:
                    self.stuck.append(f"{n} stuck at round {p} for {STALL_S} s")
            if self.stuck:
                break
        self.stop.set()
        self.threads, self.loop, self.loop_thread = threads, loop, lt

    def close(self) -> None:
        """After the daemon is gone (a stuck worker then fails with DeviceGoneError)."""
        for t in self.threads.values():
            t.join(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop_thread.join(10)


def _stress_test(tmp_path, rounds: int, seed: int) -> None:
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:256M", extra=["--timing", "off"])
    s = _Stress(d.socket_path, rounds, seed)
    try:
        s.run()
    finally:
        code, err = d.terminate()
        if hasattr(s, "threads"):
            s.close()
        _value.cache_clear()  # ~46 MiB of values, not kept for the worker's later files
    assert not s.stuck, "; ".join(s.stuck) + f" (progress {s.progress})"
    assert not s.errors, s.errors[0]
    assert all(p == rounds for p in s.progress.values()), s.progress
    assert code == 0, err


def test_every_kind_of_waiter_at_once(tmp_path):
    _stress_test(tmp_path, rounds=300, seed=1)


@pytest.mark.slow
def test_every_kind_of_waiter_at_once_ten_thousand_rounds(tmp_path):
    _stress_test(tmp_path, rounds=10_000, seed=2)


def test_the_stress_test_catches_a_stall(tmp_path):
    """The watchdog itself: a worker that stops (here: waits on nothing, forever) is
    reported within seconds, not left to hang the suite."""
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:64M", extra=["--timing", "off"])
    s = _Stress(d.socket_path, 50, 3)
    never = threading.Event()
    s.shared_b = lambda rng, r, who: never.wait() if (r == 10 and who == b"1") else None
    try:
        s.run()
    finally:
        d.terminate()
        never.set()
        if hasattr(s, "threads"):
            s.close()
    assert s.stuck and s.stuck[0].startswith("shared-b1 stuck at round 10")
    np.testing.assert_equal(s.progress["shared-b2"], 50)


def test_threads_sharing_one_queue_pair(tmp_path):
    """Four threads on a connection's one queue pair (issue 33, item 10: with no lock they
    corrupted each other; the old client hung and then crashed on this).  Every value read
    back is the one written; a watchdog bounds the wait."""
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:64M", extra=["--timing", "off"])
    errors, done = [], []
    try:
        with hostlib.connect(d.socket_path, entries=16) as dev:
            def worker(t: int) -> None:
                try:
                    for i in range(1000):
                        k = b"t%d-%03d" % (t, i % 64)
                        v = k * (1 + i % 40)
                        dev.kv_put(k, v)
                        assert dev.kv_get(k) == v
                        if i % 9 == 0:
                            dev.nop()
                    done.append(t)
                except Exception:
                    errors.append(traceback.format_exc())

            threads = [threading.Thread(target=worker, args=(t,), daemon=True)
                       for t in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert not errors, errors[0]
            assert sorted(done) == [0, 1, 2, 3], "a thread hung on the shared queue pair"
    finally:
        assert d.terminate()[0] == 0
