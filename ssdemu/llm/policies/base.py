"""The interface every placement policy implements, and the helpers they share.

A policy sees the tier manager (ssdemu/llm/tiers.py) at four moments and moves windows with
its `move`, which issues the drive's commands:

- `place(m)`: the prefill is done (its windows all in HBM, `m.prefill_mass` the attention
  each received from the prefill's last queries);
- `reads(m)`, `select_pages(m)`: at a step's start, the drive windows it attends this step
  (read back whole) and how many pages per KV head the drive selects and attends in place;
- `update(m)`: the step is done, each attended window's `mass` set (nan: not attended);
- `admit(m, w)`: the tail filled a new window, in HBM.

The first window (the attention sink) and the newest `RECENT` windows stay in HBM under every
policy: each keeps what StreamingLLM showed decoding cannot do without, so that the policies
differ in what they do with the rest.  Ties break on the window's index, and scores are the
manager's rounded masses: a policy's decisions depend on the seed alone, not on the thread
count or the order of a BLAS sum (tests/test_tiers.py)."""

from __future__ import annotations

RECENT = 1


class Policy:
    name = ""
    keeps_drive_copy = False  # every window is stored in the drive (plain) as it is made

    def __init__(self, seed: int = 0):
        self.seed = seed

    def place(self, m) -> None:
        raise NotImplementedError

    def reads(self, m) -> list:
        return []

    def select_pages(self, m) -> int:
        return 0

    def update(self, m) -> None:
        pass

    def admit(self, m, w) -> None:
        pass


def protected(m) -> set[int]:
    """The sink and the newest RECENT windows that are not dropped (always in HBM)."""
    from ssdemu.llm.tiers import DROPPED

    live = [w.index for w in m.windows if w.tier != DROPPED]
    return {live[0], *live[-RECENT:]} if live else set()


def by_score(ws) -> list:
    """Highest score first, then the older window."""
    return sorted(ws, key=lambda w: (-w.score, w.index))


def keep_in_hbm(m, keep: set[int], elsewhere: str) -> None:
    """HBM's windows not in `keep` go to `elsewhere`."""
    from ssdemu.llm.tiers import HBM

    for w in m.in_tier(HBM):
        if w.index not in keep:
            m.move(w, elsewhere)


def add_mass(ws) -> None:
    """Each window's step mass onto its score (accumulated attention)."""
    for w in ws:
        if w.mass == w.mass:  # not nan: attended this step
            w.score += w.mass
