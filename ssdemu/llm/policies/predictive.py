"""Predictive placement (TierKV-like, arXiv 2609.21172): the cache's needs predicted from
the prefill, before decoding starts, and every window assigned in one solve.

The signal is the attention the prefill's last queries paid each window (the manager's
`prefill_mass`).  The solve ranks windows by it: HBM (exact) for the protected and the best
under the memory budget; the next band (the size QEvict's is) quantized in the drive under a
precision budget of PRECISION_BITS a band element on average (int8 for the upper part, int4
below: TierKV's low-rank tier has no drive counterpart, the drive's int4 stands in); the rest
offloaded to the drive at full precision and not read (TierKV's flash tier).  Nothing is
measured or moved after that; a new window displaces HBM's least predicted to the band's top,
and the band's last goes to the offloaded tier."""

from ssdemu.llm.policies.base import Policy, by_score, protected
from ssdemu.llm.tiers import DRIVE, DRIVE_INT4, DRIVE_INT8, HBM

PRECISION_BITS = 6.0  # of 8 (int8) and 4 (int4): the band's mean bits per element


class Predictive(Policy):
    name = "predictive"
    keeps_drive_copy = True

    def place(self, m) -> None:
        for w in m.windows:
            w.score = float(m.prefill_mass[w.index])
        keep = protected(m)
        ranked = by_score([w for w in m.windows if w.index not in keep])
        n_hbm = max(0, m.hbm_windows - len(keep))
        band = max(1, m.hbm_windows)
        # int8's share of the band that meets the precision budget: 8x + 4(1 - x) = bits
        n_int8 = round(band * (PRECISION_BITS - 4) / 4)
        for i, w in enumerate(ranked[n_hbm:]):
            m.move(w, DRIVE_INT8 if i < n_int8 else DRIVE_INT4 if i < band else DRIVE)

    def reads(self, m) -> list:
        return m.in_tier(DRIVE_INT8, DRIVE_INT4)

    def admit(self, m, w) -> None:
        w.score = -1.0  # nothing predicted it: it stays while it is recent, then goes first
        keep = protected(m)
        hbm = by_score([x for x in m.in_tier(HBM) if x.index not in keep])
        if len(m.in_tier(HBM)) <= m.hbm_windows or not hbm:
            return
        out = hbm[-1]
        m.move(out, DRIVE_INT8)
        band = by_score(m.in_tier(DRIVE_INT8, DRIVE_INT4))
        if len(band) > max(1, m.hbm_windows):
            m.move(band[-1], DRIVE)
