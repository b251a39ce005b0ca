"""How sure a held-out number is: percentile-bootstrap confidence intervals over examples.

The examples are the unit resampled (B. Efron and R. Tibshirani, "An Introduction to the
Bootstrap", 1993, ch. 13: the percentile interval), drawn through ``scipy.stats.bootstrap`` from a
fixed seed, so an evaluation's intervals are reproducible and two metrics of one evaluation are
resampled with the same draws. A metric that is a mean over examples is bootstrapped from its
per-example values (fast, vectorised); one that is not (average precision, a mean over the parsed
answers only) is computed again on each resample (:func:`resampled_intervals`, fewer resamples).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 1000  # metrics that are means: one vectorised call
RECOMPUTED_RESAMPLES = 200  # metrics computed again on each resample
METHOD = "percentile bootstrap over examples"


def describe(resamples: int = RESAMPLES) -> dict:
    """What summary.json and the eval tables say about their intervals."""
    return {"confidence": CONFIDENCE, "method": f"{METHOD} ({resamples} resamples, seed 0)"}


def mean_interval(values: Sequence[float], seed: int = 0, resamples: int = RESAMPLES,
                  confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile-bootstrap interval of the mean of ``values`` (one value per example).
    One example gives ``(v, v)``: nothing to resample."""
    from scipy.stats import bootstrap

    data = np.asarray(values, dtype=float)
    if data.size == 0 or not np.all(np.isfinite(data)):
        return (math.nan, math.nan)
    if data.size == 1 or np.all(data == data[0]):
        return (float(data[0]), float(data[0]))
    res = bootstrap((data,), np.mean, n_resamples=resamples, confidence_level=confidence, vectorized=True,
                    method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def resampled_intervals(metric: Callable[[Sequence[int]], Mapping[str, float]], n: int, keys: Sequence[str],
                        seed: int = 0, resamples: int = RECOMPUTED_RESAMPLES,
                        confidence: float = CONFIDENCE) -> dict[str, tuple[float, float]]:
    """Intervals of metrics that are not means over examples: ``metric(indices)`` computes them on
    the examples at ``indices`` (with repeats), once per resample; the percentile interval of each
    key over the resamples. A resample where a key is NaN or missing is left out of that key."""
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {k: [] for k in keys}
    for _ in range(resamples):
        values = metric(rng.integers(0, n, size=n).tolist())
        for k in keys:
            v = values.get(k)
            if v is not None and math.isfinite(float(v)):
                draws[k].append(float(v))
    alpha = (1 - confidence) / 2
    return {k: (float(np.quantile(d, alpha)), float(np.quantile(d, 1 - alpha))) if d else (math.nan, math.nan)
            for k, d in draws.items()}


def per_example_means(per_example: Mapping[str, Sequence[float]], seed: int = 0) -> dict[str, tuple[float, float]]:
    """:func:`mean_interval` of each metric's per-example values."""
    return {k: mean_interval(v, seed=seed) for k, v in per_example.items()}


def stratified_mean_interval(groups: Sequence[Sequence[float]], seed: int = 0, resamples: int = RESAMPLES,
                             confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The interval of the mean of the groups' means (a benchmark's average over its categories),
    each group resampled within itself (a stratified bootstrap: every resample keeps each
    category's size)."""
    groups = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not groups:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = np.mean([g[rng.integers(0, len(g), size=(resamples, len(g)))].mean(axis=1) for g in groups], axis=0)
    alpha = (1 - confidence) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))
