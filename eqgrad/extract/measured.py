"""The measured extractor: time the best few candidate plans on the device, keep the fastest.

Candidates are the distinct legal plans the local search (greedy + flips + toggles) costed, best
predicted first. Each of the top ``k`` is compiled and run on random inputs of the right shapes
(median of a few runs). The winner is cached on disk by graph structure, active rules and device
(``~/.cache/eqgrad/measured.json``, written atomically, versioned; a corrupt or stale entry is
ignored and measured again), like tinygrad's BEAM cache.
"""
from __future__ import annotations

import hashlib
from typing import Callable

from eqgrad.cache import JsonCache, check_fields
from eqgrad.extract.cost import CostModel
from eqgrad.extract.egraph import EGraph
from eqgrad.extract.evaluate import Choice
from eqgrad.extract.greedy import ImproveExtractor, Result

CACHE_VERSION = 1


def choice_signature(g: EGraph, choice: Choice, reachable: set[int]) -> str:
    h = hashlib.sha256()
    for c in sorted(reachable):
        h.update(f"{c}:{g.classes[c].index(choice[c])};".encode())
    return h.hexdigest()[:20]


def _check_entry(v: object) -> str | None:
    """Why a stored choice is unusable (not ``{"signature": str, "seconds": number >= 0}``), or None."""
    return check_fields(v, non_negative=("seconds",), strings=("signature",))


CACHE = JsonCache("measured", CACHE_VERSION, check=_check_entry)


class MeasuredExtractor(ImproveExtractor):
    name = "measured"

    def __init__(self, g: EGraph, cost: CostModel, inputs: list[tuple], measure: Callable[[Choice], float] | None = None,
                 k: int = 4, cache_key: str | None = None, progress: Callable[[int, int], None] | None = None):
        super().__init__(g, cost, inputs, keep_candidates=max(k, 1))
        self.measure, self.k, self.cache_key, self.progress = measure, k, cache_key, progress

    def extract(self) -> Result:
        res = super().extract()
        res.extractor = self.name
        if self.measure is None:
            res.info.update(measured="no device to measure on: kept the predicted best")
            return res
        cands = res.candidates[: self.k] or [(res.evaluation.total, res.choice)]
        sigs = [choice_signature(self.g, c, self.ev.reachable(c)) for _, c in cands]
        if self.cache_key:
            hit = CACHE.get(self.cache_key)
            if hit and hit.get("signature") in sigs:
                choice = cands[sigs.index(hit["signature"])][1]
                res.info.update(measured="cache hit", seconds=hit.get("seconds"))
                return Result(choice, self.ev.evaluate(choice), self.name, res.alternatives_of, cands, res.info)
        times = []
        for i, (_, choice) in enumerate(cands):
            times.append(self.measure(choice))
            if self.progress:
                self.progress(i + 1, len(cands))
        best = min(range(len(cands)), key=lambda i: times[i])
        choice = cands[best][1]
        res.info.update(measured=[(round(p * 1e6, 1), round(t * 1e6, 1)) for (p, _), t in zip(cands, times)],
                        picked=best)
        if self.cache_key:
            CACHE.put(self.cache_key, dict(signature=sigs[best], seconds=times[best]))
        return Result(choice, self.ev.evaluate(choice), self.name, res.alternatives_of, cands, res.info)
