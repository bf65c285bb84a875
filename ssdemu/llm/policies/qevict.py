"""QEvict-like (arXiv 2608.05326): three tiers by importance, importance updated every step,
promotion on drift.

Every window's full-precision copy is in the drive (stored as the window is made).  The
windows it is surest of are in HBM; the next BAND windows (as many as HBM holds, times
BAND_FACTOR) are a quantized, recoverable tier in the drive, the upper half at int8 and the
lower at int4, each demoted in place by the drive (KV_REQUANTIZE: no byte crosses the link);
only the rest is dropped (its copy deleted).  Each step attends the quantized band too, read
back from the drive (a GPU-resident quantized tier in the paper; the drive's here), so that
its windows' importance is measured as HBM's is.  Importance is the accumulated attention
(the prefill's, then every step's).  A band window whose importance passes the least
important HBM window's is promoted (a dequantized retrieve) and that one demoted to int8.

`qevict-2bit` splits the band in three, int8, int4 and KIVI's 2-bit (the demotion chain
int8 -> int4 -> 2-bit, every step of it the drive's requantize), at the same band size: the
same memory, fewer bytes read per step, coarser values."""

from ssdemu.llm.policies.base import Policy, add_mass, by_score, protected
from ssdemu.llm.tiers import DRIVE_INT4, DRIVE_INT8, DRIVE_KIVI2, DROPPED, HBM

BAND_FACTOR = 1.0


class QEvict(Policy):
    name = "qevict"
    keeps_drive_copy = True
    band_factor = BAND_FACTOR
    levels = (DRIVE_INT8, DRIVE_INT4)  # the band's tiers, best first, equal shares

    def place(self, m) -> None:
        for w in m.windows:
            w.score = float(m.prefill_mass[w.index])
        self._rank(m)

    def reads(self, m) -> list:
        return m.in_tier(*self.levels)

    def update(self, m) -> None:
        add_mass(m.in_tier(HBM, *self.levels))
        self._promote(m)
        self._rank(m)

    def admit(self, m, w) -> None:
        w.score = 0.0
        self._rank(m)

    def band(self, m) -> int:
        return max(1, round(m.hbm_windows * self.band_factor))

    def _promote(self, m) -> None:
        """Promotion on drift: the band's best in place of HBM's weakest, while it beats it."""
        keep = protected(m)
        band = by_score(m.in_tier(*self.levels))
        hbm = by_score([w for w in m.in_tier(HBM) if w.index not in keep])
        while band and hbm and band[0].score > hbm[-1].score:
            up, down = band.pop(0), hbm.pop()
            m.move(up, HBM)
            m.move(down, self.levels[0])

    def _rank(self, m) -> None:
        """HBM for the protected and the best, the band below them (its levels in equal
        shares, the best at the most precise), the rest dropped.  A window moves down only
        (a promotion is _promote's)."""
        keep = protected(m)
        live = [w for w in m.windows if w.tier != DROPPED]
        ranked = by_score([w for w in live if w.index not in keep])
        n_hbm = max(0, m.hbm_windows - len(keep))
        hbm_now = [w for w in ranked if w.tier == HBM]
        stay = set(w.index for w in by_score(hbm_now)[:n_hbm]) | keep
        below = [w for w in ranked if w.index not in stay]
        band, n = self.band(m), len(self.levels)
        for i, w in enumerate(below):
            # level j takes band's ranks [j * band // n, (j + 1) * band // n): for two
            # levels, int8 the upper band // 2 and int4 the rest, as before the third
            target = (self.levels[max(j for j in range(n) if i >= j * band // n)]
                      if i < band else DROPPED)
            if w.tier == HBM or _lower(target, w.tier):
                m.move(w, target)


class QEvict2Bit(QEvict):
    name = "qevict-2bit"
    levels = (DRIVE_INT8, DRIVE_INT4, DRIVE_KIVI2)


def _lower(target: str, tier: str) -> bool:
    order = (HBM, DRIVE_INT8, DRIVE_INT4, DRIVE_KIVI2, DROPPED)
    return order.index(target) > order.index(tier)
