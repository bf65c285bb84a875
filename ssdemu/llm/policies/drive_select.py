"""Select per step with nothing dropped (the drive-select path): the sink and the most recent
windows in HBM; every other window stays in the drive at full precision, and each layer of
each step the drive picks and attends the best pages per KV head among them (TOPK_PAGES with
the drive's re-rank, then ATTEND), as many tokens as HBM holds; only queries, page ids and
outputs cross the link."""

from ssdemu.llm.policies.base import Policy, keep_in_hbm
from ssdemu.llm.tiers import DRIVE, HBM

RERANK = 4


class DriveSelect(Policy):
    name = "drive-select"
    keeps_drive_copy = True

    def place(self, m) -> None:
        self._fit(m)

    def admit(self, m, w) -> None:
        self._fit(m)

    def select_pages(self, m) -> int:
        return m.hbm_windows * m.window // m.page_tokens

    def _fit(self, m) -> None:
        live = m.in_tier(HBM)
        keep = {live[0].index, *(w.index for w in live[1:][-(m.hbm_windows - 1):])}
        keep_in_hbm(m, keep, DRIVE)
