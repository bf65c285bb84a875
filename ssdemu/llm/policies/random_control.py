"""The random control ("Random Attention"): H2O's shape (recent half, the rest kept by a
score) with scores drawn at random from the policy's seed instead of attention, so that the
two differ only in the importance signal."""

import numpy as np

from ssdemu.llm.policies.h2o import H2O


class RandomControl(H2O):
    name = "random"

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.rng = np.random.default_rng(seed)

    def initial_score(self, m, w) -> float:
        return float(self.rng.random())

    def new_score(self, m, w) -> float:
        return float(self.rng.random())

    def update(self, m) -> None:  # no attention signal: only new windows change anything
        self._fit(m)
