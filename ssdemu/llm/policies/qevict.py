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
from ssdemu.llm.tiers import DRIVE_INT4, DRIVE_INT8, DRIVE_KIVI2, DROPPED, HBM, TIERS

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
        split = band_split(self.band(m), self.levels)
        for i, w in enumerate(below):
            target = split[i] if i < len(split) else DROPPED
            if w.tier == HBM or TIERS.index(target) > TIERS.index(w.tier):
                m.move(w, target)


def band_split(band: int, levels) -> list:
    """The band's ranks, best first, each given its level: level j takes the ranks
    [j * band // n, (j + 1) * band // n) (two levels: the upper band // 2 and the rest).
    Replay's model of the policy (ssdemu/replay/decode.py) splits its band alike."""
    n = len(levels)
    return [levels[j] for j in range(n) for _ in range((j + 1) * band // n - j * band // n)]


class QEvict2Bit(QEvict):
    name = "qevict-2bit"
    levels = (DRIVE_INT8, DRIVE_INT4, DRIVE_KIVI2)

