"""H2O-like (Zhang et al., NeurIPS 2023): half of HBM for the most recent windows, half for
the heavy hitters by accumulated attention (the prefill's, then every step's); what falls
out is dropped for good."""

from ssdemu.llm.policies.base import Policy, add_mass, by_score, keep_in_hbm, protected
from ssdemu.llm.tiers import DROPPED, HBM


class H2O(Policy):
    name = "h2o"

    def place(self, m) -> None:
        for w in m.windows:
            w.score = float(self.initial_score(m, w))
        self._fit(m)

    def initial_score(self, m, w) -> float:
        return m.prefill_mass[w.index]

    def update(self, m) -> None:
        add_mass(m.in_tier(HBM))
        self._fit(m)

    def admit(self, m, w) -> None:
        w.score = self.new_score(m, w)
        self._fit(m)

    def new_score(self, m, w) -> float:
        return 0.0

    def _fit(self, m) -> None:
        live = m.in_tier(HBM)
        n_recent = max(1, m.hbm_windows // 2)
        keep = protected(m) | {w.index for w in live[-n_recent:]}
        rest = [w for w in live if w.index not in keep]
        keep |= {w.index for w in self.choose(rest, m.hbm_windows - len(keep))}
        keep_in_hbm(m, keep, DROPPED)

    def choose(self, rest, n: int) -> list:
        return by_score(rest)[:max(0, n)]
