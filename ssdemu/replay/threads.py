"""`replay --threads auto`: the timing model's helper thread only when a core is free for it.

The helper books half of each batch's dies beside the replay's own thread. On a host whose
cores are all busy (a sweep with a cell per core, a compile beside the replay) it is rarely
scheduled when a batch is posted, and the replay pays for the hand-offs without the help:
measured with two CPU-bound neighbours on two cores, 3.3 s with it against 2.9 s without on
the bundled trace (50.6 s against 11.6 s on a larger one before the poster stopped waiting for
a helper that had not started). The figures are the same whatever the count.
"""

from __future__ import annotations

import os
import time


def choose_threads(cpus: int, others_running: int) -> int:
    """2 when, beside the replay's own thread, a whole core is left for the helper."""
    return 2 if cpus - others_running >= 2 else 1


def others_running(samples: int = 5, gap_s: float = 0.01, stat: str = "/proc/stat") -> int:
    """Tasks of other processes running or runnable on the host, all the time: /proc/stat's
    procs_running less this process's runnable threads, the least of a few samples (an
    instant, not the minute a load average spans)."""
    seen = []
    for i in range(samples):
        with open(stat) as f:
            for line in f:
                if line.startswith("procs_running"):
                    seen.append(int(line.split()[1]) - own_running())
                    break
        if i + 1 < samples:
            time.sleep(gap_s)
    return steady_count(seen)


def own_running() -> int:
    """This process's threads that are running or runnable, this reader included (at least
    1).  OpenBLAS's threads spin for a while after numpy is imported: counted as neighbours,
    they took the helper away from every replay."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                # the state follows the command name, which may hold spaces or parentheses
                n += f.read().rpartition(")")[2].split()[0] == "R"
        except OSError:  # the thread ended while listed
            pass
    return max(n, 1)


def steady_count(seen: list[int]) -> int:
    """The neighbours present in every sample.  A CPU-bound neighbour is runnable in each;
    the kernel's own threads (kworkers, kdamond) are in one sample of two on a quiet VM, and
    their median took the helper away from a third of quiet replays (1.9 s against 1.2 s)."""
    return max(0, min(seen)) if seen else 0


def auto_threads() -> int:
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        return 1
    try:
        return choose_threads(cpus, others_running())
    except OSError:  # no /proc: the helper only where there are cores to spare for sure
        return 2 if cpus > 2 else 1
