"""The statistics of a model comparison (report.py): a Wilson interval for a resolve rate, an exact sign test, and a
seeded percentile bootstrap of a mean. Plain standard library on purpose: two formulas and a resampling loop do not
justify scipy."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

#: z for a two-sided 95% interval.
Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0, 1) when there is no data."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def sign_test_p(wins: int, losses: int) -> float:
    """Two-sided exact sign test (binomial, p=0.5) over the non-tied pairs; 1.0 when there are none."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def bootstrap_mean_ci(
    values: Sequence[float], *, resamples: int = 10_000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean (seeded, so a report is reproducible). One value: that value twice."""
    if not values:
        return 0.0, 0.0
    if len(values) == 1 or min(values) == max(values):
        return float(values[0]), float(values[0])
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    lo_idx = math.floor((1 - level) / 2 * resamples)
    hi_idx = math.ceil((1 + level) / 2 * resamples) - 1
    return means[lo_idx], means[min(hi_idx, resamples - 1)]
