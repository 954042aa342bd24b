"""The measured extractor: time the best few candidate plans on the device, keep the fastest.

Candidates are the distinct legal plans the local search (greedy + flips + toggles) costed, best
predicted first, and greedy's own plan. Each is compiled and run on random inputs of the right
shapes, in rounds (each a median of a few runs) until the fastest beats the others beyond noise
(its median below their fastest sample; 3 to 7 rounds); a winner that is not faster beyond noise
than the best predicted plan gives way to that plan, and a plan measured slower than greedy's to
greedy's. The winner is cached on disk by graph structure, active rules and device
(``~/.cache/eqgrad/measured.json``, written atomically, versioned; a corrupt or stale entry is
ignored and measured again), like tinygrad's BEAM cache.
"""
from __future__ import annotations

import hashlib
from typing import Callable

import numpy as np

from eqgrad.cache import JsonCache, check_fields
from eqgrad.extract.cost import CostModel
from eqgrad.extract.egraph import EGraph
from eqgrad.extract.evaluate import Choice
from eqgrad.extract.greedy import ImproveExtractor, Result

CACHE_VERSION = 2      # 2: winners are never slower than greedy (a version 1 entry may be)


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
                 k: int = 4, cache_key: str | None = None, progress: Callable[[int, int], None] | None = None,
                 peak_bound: int = 0):
        super().__init__(g, cost, inputs, keep_candidates=max(k, 1), peak_bound=peak_bound)
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
        # greedy's own plan is always measured: the winner is never a plan slower than it
        g = self.greedy_plan
        if g is not None and self.over(g[1]) > self.over(res.evaluation):
            g = None                  # (over the memory bound where the candidates are not)
        if g is not None:
            gsig = choice_signature(self.g, g[0], self.ev.reachable(g[0]))
            if gsig not in sigs:
                cands, sigs = cands + [(g[1].total, g[0])], sigs + [gsig]
        gi = sigs.index(gsig) if g is not None else None
        samples, rounds, verdict = self._rounds(cands)
        med = [float(np.median(t)) for t in samples]
        best = min(range(len(cands)), key=lambda i: med[i])
        model = 0                                        # the best predicted
        if best != model and not _beats(samples[best], samples[model]):
            best, verdict = model, "kept the model's choice: no candidate was faster beyond noise"
        if gi is not None and best != gi and _beats(samples[gi], samples[best]):
            best, verdict = gi, "greedy's plan: the choice measured slower than it beyond noise"
        choice = cands[best][1]
        res.info.update(measured=[(round(p * 1e6, 1), round(m * 1e6, 1)) for (p, _), m in zip(cands, med)],
                        picked=best, rounds=rounds, verdict=verdict,
                        spread=[round((max(t) - min(t)) * 1e6, 1) for t in samples])
        if self.cache_key:
            CACHE.put(self.cache_key, dict(signature=sigs[best], seconds=med[best]))
        return Result(choice, self.ev.evaluate(choice), self.name, res.alternatives_of, cands, res.info)

    def _rounds(self, cands: list) -> tuple[list[list[float]], int, str]:
        """Each candidate measured once per round (a measurement is itself a median of a few runs),
        in alternating order, until the fastest median beats every other candidate beyond noise
        (ROUNDS_MIN rounds at least, ROUNDS_MAX at most): the samples, rounds and a verdict."""
        samples: list[list[float]] = [[] for _ in cands]
        done = 0
        for r in range(ROUNDS_MAX):
            order = range(len(cands)) if r % 2 == 0 else reversed(range(len(cands)))
            for i in order:
                samples[i].append(self.measure(cands[i][1]))
                done += 1
                if self.progress:
                    self.progress(done, len(cands) * ROUNDS_MAX)
            if r + 1 >= ROUNDS_MIN:
                med = [float(np.median(t)) for t in samples]
                best = min(range(len(cands)), key=lambda i: med[i])
                if all(_beats(samples[best], samples[i]) for i in range(len(cands)) if i != best):
                    return samples, r + 1, "fastest beyond noise"
        return samples, ROUNDS_MAX, "no candidate fastest beyond noise"


ROUNDS_MIN, ROUNDS_MAX = 3, 7      # measurement rounds of the candidates (MeasuredExtractor._rounds)


def _beats(a: list[float], b: list[float]) -> bool:
    """``a`` faster than ``b`` beyond noise: a's slowest sample below b's fastest (the noise of a
    shared machine only adds time, so b's fastest is b at its best), forgiving one spike once it
    has ``SPIKE_FORGIVEN`` samples (its second slowest then). With a's *median* below b's fastest,
    candidates measuring alike (1 ms plus up to 20 % noise) gave a false winner in about one run
    in five at three rounds of four candidates (a's two fastest of three below the other nine: 1 in
    22 for each): the measured extractor then kept a plan no faster than the model's choice; now
    about 1 in 50 (three rounds), far less as the rounds add samples."""
    s = sorted(a)
    return (s[-2] if len(s) >= SPIKE_FORGIVEN else s[-1]) < min(b)


SPIKE_FORGIVEN = 5     # samples from which _beats forgives one slow sample of the faster plan
