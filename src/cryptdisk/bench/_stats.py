"""Ratio arithmetic for interleaved runs.

Run ``i`` of strategy A and run ``i`` of strategy B ran back to back (A B A B
...), so machine drift hits both alike: the ratio is the median of the
per-round ratios ``a_i / b_i``, with their min and max. When the run counts
differ (a run failed) it falls back to the ratio of medians.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from ._model import Measurement

__all__ = ["Ratio", "median_interval", "paired_ratio", "ratio_of"]


#: Paired rounds from which a ratio also gets a bootstrap interval for its median.
INTERVAL_ROUNDS = 5


@dataclass(frozen=True)
class Ratio:
    median: float
    low: float
    high: float
    paired: bool  # True when computed round by round
    #: 90% bootstrap interval of the median, from INTERVAL_ROUNDS paired rounds or more
    interval: tuple[float, float] | None = None

    def percent_change(self) -> float:
        return (self.median - 1.0) * 100.0


def paired_ratio(a: list[float], b: list[float]) -> Ratio:
    """Median (min, max) of ``a[i] / b[i]``; ratio of medians if the lengths differ."""
    if not a or not b:
        raise ValueError("ratio of an empty series")
    if len(a) == len(b) and all(x > 0 for x in b):
        rs = [x / y for x, y in zip(a, b, strict=True)]
        interval = median_interval(rs) if len(rs) >= INTERVAL_ROUNDS else None
        return Ratio(statistics.median(rs), min(rs), max(rs), True, interval)
    med = statistics.median(a) / statistics.median(b)
    return Ratio(med, med, med, False)


def ratio_of(m: Measurement, base: Measurement, *, cpu: bool = False) -> Ratio | None:
    """``m / base`` on values (or on CPU seconds per unit of work when ``cpu``)."""
    if cpu:
        if not m.cpu_s or not base.cpu_s or not m.work or not base.work:
            return None
        a = [c / m.work for c in m.cpu_s]
        b = [c / base.work for c in base.cpu_s]
        if not all(b):
            return None
        return paired_ratio(a, b)
    if not m.values or not base.values:
        return None
    return paired_ratio(m.values, base.values)


def median_interval(values: list[float], level: float = 0.9, resamples: int = 10_000,
                    seed: int = 0) -> tuple[float, float]:
    """A percentile-bootstrap interval for the median of ``values`` (``level`` = 0.9: 5%-95%).

    How far the median of this many noisy rounds could be from the one a longer
    run would settle on; seeded, so the same values give the same interval.
    """
    if not values:
        raise ValueError("interval of an empty series")
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1, not {level}")
    rnd = random.Random(seed)
    medians = sorted(statistics.median(rnd.choices(values, k=len(values)))
                     for _ in range(resamples))
    tail = (1 - level) / 2
    return medians[int(tail * resamples)], medians[min(resamples - 1, int((1 - tail) * resamples))]
