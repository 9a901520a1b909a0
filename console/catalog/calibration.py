"""How measured loads correct later estimates (pure: numbers in, numbers out).

The correction of one architecture family on one device kind is a factor on the estimator's total:
the 90th percentile (nearest rank) of measured / estimated over the last WINDOW loads. A high
percentile rather than the median because the corrected figure is what admission reserves: a
replica admitted into too little memory fails to load (or, on CUDA, hits its memory fraction),
while a little slack only costs packing density. With one or two loads it is their largest ratio.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

WINDOW = 20  # loads per family and device kind that calibrate; older ones age out
QUANTILE = 0.9
# A ratio outside these bounds is a measurement of something else (another process's memory, a
# worker that did not warm up); it is kept as a sample but does not steer admission.
MIN_RATIO, MAX_RATIO = 0.25, 4.0


@dataclass(frozen=True)
class Correction:
    factor: float
    samples: int  # loads it was derived from

    def apply(self, estimated_bytes: int) -> int:
        return math.ceil(estimated_bytes * self.factor)


NONE = Correction(1.0, 0)


def correction(pairs: Iterable[tuple[int, int]]) -> Correction:
    """The correction from (estimated, measured) byte pairs, most recent first; NONE without usable ones."""
    ratios = sorted(
        measured / estimated
        for estimated, measured in list(pairs)[:WINDOW]
        if estimated > 0 and MIN_RATIO <= measured / estimated <= MAX_RATIO
    )
    if not ratios:
        return NONE
    rank = max(math.ceil(QUANTILE * len(ratios)), 1)
    return Correction(ratios[rank - 1], len(ratios))


def error_fraction(estimated: int | None, measured: int | None) -> float | None:
    """(estimated - measured) / measured: positive when the estimate was generous."""
    if not estimated or not measured:
        return None
    return (estimated - measured) / measured
