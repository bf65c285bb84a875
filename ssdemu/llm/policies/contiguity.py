"""Contiguity-aware spans ("Contiguity, Not Importance"): H2O's accumulated attention, but
what is kept beside the recent half is whole spans of SPAN adjacent windows, best summed
score first, so that the kept context stays in runs rather than scattered windows."""

from ssdemu.llm.policies.h2o import H2O

SPAN = 2


class Contiguity(H2O):
    name = "contiguity"

    def choose(self, rest, n: int) -> list:
        rest = sorted(rest, key=lambda w: w.index)
        spans = [rest[i:i + SPAN] for i in range(len(rest))]
        spans.sort(key=lambda s: (-sum(w.score for w in s), s[0].index))
        kept: dict[int, object] = {}
        for s in spans:
            room = n - len(kept)
            if room <= 0:
                break
            new = [w for w in s if w.index not in kept][:room]
            for w in new:
                kept[w.index] = w
        return list(kept.values())
