"""95% intervals for small experiments: over seeds (Student's t), over task items (bootstrap), and paired.

* ``t_interval``: mean ± t(0.975, n-1) · s / √n over seeds (None with fewer than 2 values).
* ``bootstrap_interval``: a ``runs × items`` matrix of per-item scores (one row per seed); items are resampled
  with replacement (the same items for every run) and the interval is the 2.5-97.5 percentiles of the resampled
  mean. The generator's seed is fixed, so the same scores always give the same interval.
* A paired difference is the interval of ``variant - base`` run by run (the same seed paired), over seeds or,
  for task scores, over the same items; it is "within noise" when the interval holds 0.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (t_{0.975, df}).
_T95 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
_Z975 = 1.959964
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0

Interval = tuple[float, float]


def t_quantile_95(df: int) -> float:
    """t_{0.975, df}: the table up to 30, the Cornish-Fisher expansion beyond (error under 1e-4 there)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1; got {df}")
    if df <= len(_T95):
        return _T95[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def t_interval(values: Sequence[float]) -> Interval | None:
    """The 95% t-interval of the mean of ``values``; None for fewer than two."""
    if len(values) < 2:
        return None
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    half = t_quantile_95(len(values) - 1) * sd / math.sqrt(len(values))
    return (mean - half, mean + half)


def bootstrap_interval(
    scores: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> Interval | None:
    """The 95% percentile bootstrap interval of the mean of a ``runs × items`` (or ``items``) score array,
    resampling items; None for fewer than two items."""
    matrix = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    n = matrix.shape[1]
    if n < 2:
        return None
    per_item = matrix.mean(axis=0)  # the mean over runs and resampled items is the mean of these
    picks = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    means = per_item[picks].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return (float(low), float(high))


def holds_zero(interval: Interval | None) -> bool | None:
    """True when the interval holds 0 (the difference is within noise); None when there is no interval."""
    if interval is None:
        return None
    return interval[0] <= 0.0 <= interval[1]
