"""The attention-drift model that carries the real model's tier measurements to trace scale.

A Mooncake trace has no attention in it: a request is lengths and block hashes.  What a
placement policy costs per decoded token depends on how attention moves during decoding:
how often a window the policy demoted becomes important again (QEvict's promotions), and
how much attention falls on state the policy did not attend (Future Missed Mass).  Both
are measured on the real model by `ssdemu eval --policies` (ssdemu/bench/tier_eval.py).
This model is fitted from such a report: per policy, the points (budget fraction: HBM
tokens / context tokens; promotions per step; FMM), averaged where several contexts give
the same fraction, interpolated linearly between fractions and held flat outside them.

What it leaves out: the drift of one small model (SmolLM2-135M) on one text stands in for
every model and request of the trace; the fraction alone carries it across context lengths
(a 32K context at 25% is taken to drift as a 2K one at 25%); promotions are an expected
rate, not bursts.  DEFAULT is the bundled fit (drift_smollm2.json, from the 2K-token run in
docs/tiers.md); `ssdemu replay --drift REPORT.json` fits another.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np

DEFAULT = pathlib.Path(__file__).with_name("drift_smollm2.json")


@dataclasses.dataclass
class DriftModel:
    source: str
    # policy -> [(budget fraction, promotions per step, FMM)], by fraction
    points: dict[str, list[tuple[float, float, float]]]

    def _at(self, policy: str, fraction: float, column: int) -> float:
        pts = self.points.get(policy)
        if not pts:
            raise ValueError(f"the drift model ({self.source}) has no points for {policy!r}: "
                             f"it has {', '.join(sorted(self.points))}")
        xs = [p[0] for p in pts]
        return float(np.interp(fraction, xs, [p[column] for p in pts]))

    def promotions(self, policy: str, fraction: float) -> float:
        return self._at(policy, fraction, 1)

    def fmm(self, policy: str, fraction: float) -> float:
        return self._at(policy, fraction, 2)

    def as_dict(self) -> dict:
        return {"source": self.source, "points": self.points}

    @classmethod
    def from_report(cls, report: dict, source: str = "") -> DriftModel:
        """Fitted from an `eval --policies --json` report (its "reports", one per context)."""
        acc: dict[str, dict[float, list]] = {}
        for rep in report.get("reports", [report]):
            ctx = rep["context_tokens"]
            for r in rep["runs"]:
                f = round(r["hbm_tokens"] / ctx, 4)
                acc.setdefault(r["policy"], {}).setdefault(f, []).append(
                    (r["promotions_per_step"], r.get("fmm", 0.0)))
        if not acc:
            raise ValueError("the report has no runs to fit a drift model from")
        points = {p: [(f, float(np.mean([v[0] for v in vs])), float(np.mean([v[1] for v in vs])))
                      for f, vs in sorted(by.items())] for p, by in acc.items()}
        return cls(source or "an eval --policies report", points)

    @classmethod
    def load(cls, path: str | pathlib.Path | None = None) -> DriftModel:
        """A fitted model (DEFAULT), or one fitted from an eval report at path."""
        p = pathlib.Path(path) if path is not None else DEFAULT
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read a drift model from {p}: {e}") from None
        if "points" in data:
            return cls(data["source"], {k: [tuple(x) for x in v]
                                        for k, v in data["points"].items()})
        return cls.from_report(data, source=str(p))
