"""`replay --threads auto`: the helper thread only when a core is free for it (busy
neighbours on every core: one thread), and the option's parsing."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time

import pytest

from ssdemu.cli import main
from ssdemu.replay import threads
from ssdemu.replay.threads import choose_threads, others_running, own_running, steady_count


@pytest.mark.parametrize("cpus, others, want", [
    (1, 0, 1), (2, 0, 2), (2, 1, 1), (2, 2, 1), (2, 4, 1), (4, 2, 2), (4, 3, 1), (8, 0, 2)])
def test_the_helper_needs_a_whole_core_beside_the_replay(cpus, others, want):
    assert choose_threads(cpus, others) == want


@pytest.mark.parametrize("seen, want", [
    ([0, 1, 0, 1, 1], 0), ([1, 1, 1, 1, 1], 1), ([2, 3, 2, 2, 4], 2), ([0], 0), ([], 0),
    ([-1, 0], 0)])
def test_only_neighbours_in_every_sample_count(seen, want):
    # the kernel's threads come and go between samples; a spinning neighbour is in each
    assert steady_count(seen) == want


def test_busy_neighbours_are_counted_and_leave_no_core_for_the_helper():
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.3)  # both started and spinning
        others = others_running()
        assert others >= 2, others  # runnable whether or not on a core at the moment
        assert choose_threads(2, others) == 1
    finally:
        for p in busy:
            p.kill()
            p.wait()


def test_this_process_s_own_busy_threads_are_not_neighbours():
    # as OpenBLAS's threads spin after numpy's import: threads of this process, runnable
    # (hashing a large buffer releases the GIL)
    stop = threading.Event()
    data = bytes(16 << 20)

    def spin():
        while not stop.is_set():
            hashlib.sha256(data).digest()

    spinners = [threading.Thread(target=spin) for _ in range(2)]
    for t in spinners:
        t.start()
    try:
        time.sleep(0.05)
        assert max(own_running() for _ in range(20)) >= 3  # both spinners and the reader
    finally:
        stop.set()
        for t in spinners:
            t.join()


def test_neighbours_are_the_host_s_runnable_tasks_less_this_process_s(tmp_path, monkeypatch):
    # four runnable on the host, three of them this process's threads: one neighbour
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3 4\nprocs_running 4\nprocs_blocked 0\n")
    monkeypatch.setattr(threads, "own_running", lambda: 3)
    assert threads.others_running(samples=3, gap_s=0, stat=str(stat)) == 1
    monkeypatch.setattr(threads, "own_running", lambda: 1)
    assert threads.others_running(samples=3, gap_s=0, stat=str(stat)) == 3


def test_threads_takes_1_2_or_auto(capsys):
    with pytest.raises(SystemExit) as e:
        main(["replay", "traces/mooncake_synthetic_trace.jsonl", "--threads", "3"])
    assert e.value.code == 2
    assert "expected 1, 2 or auto, got '3'" in capsys.readouterr().err
