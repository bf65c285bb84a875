"""A reproducible busy machine for the benchmarks (`--neighbours N`): N processes that spin on
a core each, started before the measurement and its baseline (fio, the kernel alone) and
stopped after, so that a figure measured beside other work can be measured again by anyone.
Each neighbour dies with the process that started it (PR_SET_PDEATHSIG), so a benchmark
killed mid-run leaves nothing spinning."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

# the neighbour: ask the kernel for SIGKILL when our parent goes, then spin (no syscalls)
SPIN = ("import ctypes, os, sys\n"
        "ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG = SIGKILL\n"
        "if os.getppid() != int(sys.argv[1]):\n"
        "    sys.exit(0)  # the parent went before the request took\n"
        "while True:\n"
        "    pass\n")
MARK = "ssdemu-bench-neighbour"


class Neighbours:
    """`with Neighbours(n):` n CPU-bound processes for the duration of the block."""

    def __init__(self, n: int):
        if n < 0:
            raise ValueError(f"--neighbours takes a count of 0 or more, got {n}")
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Neighbours:
        for _ in range(self.n):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", SPIN, str(os.getpid()), MARK],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait()
        self.procs.clear()
