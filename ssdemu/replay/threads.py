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
import statistics
import time


def choose_threads(cpus: int, others_running: int) -> int:
    """2 when, beside the replay's own thread, a whole core is left for the helper."""
    return 2 if cpus - others_running >= 2 else 1


def others_running(samples: int = 5, gap_s: float = 0.01) -> int:
    """Tasks running or runnable on the host besides this one (/proc/stat's procs_running,
    the median of a few samples: an instant, not the minute a load average spans)."""
    seen = []
    for i in range(samples):
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("procs_running"):
                    seen.append(int(line.split()[1]) - 1)  # not counting this reader
                    break
        if i + 1 < samples:
            time.sleep(gap_s)
    return max(0, int(statistics.median(seen))) if seen else 0


def auto_threads() -> int:
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        return 1
    try:
        return choose_threads(cpus, others_running())
    except OSError:  # no /proc: the helper only where there are cores to spare for sure
        return 2 if cpus > 2 else 1
