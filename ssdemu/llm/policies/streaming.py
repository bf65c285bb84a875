"""StreamingLLM (Xiao et al., ICLR 2024): the attention sink and a window of the most recent
tokens in HBM; everything else dropped as it leaves the window."""

from ssdemu.llm.policies.base import Policy, keep_in_hbm
from ssdemu.llm.tiers import DROPPED, HBM


class StreamingLLM(Policy):
    name = "streaming"

    def place(self, m) -> None:
        self._fit(m)

    def admit(self, m, w) -> None:
        self._fit(m)

    def _fit(self, m) -> None:
        live = m.in_tier(HBM)
        keep = {live[0].index, *(w.index for w in live[1:][-(m.hbm_windows - 1):])}
        keep_in_hbm(m, keep, DROPPED)
