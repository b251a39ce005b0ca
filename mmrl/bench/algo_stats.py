"""How ``mmrl bench algos`` compares variants over seeds, as 'Deep Reinforcement Learning at the Edge
of the Statistical Precipice' (Agarwal et al., NeurIPS 2021) recommends, computed by the paper's own
library, rliable (loaded through :mod:`mmrl.bench.rliable_import`), not a copy of it:

- A run's score is its final held-out task metric (``Task.success_metric``: counting accuracy,
  grounding IoU >= 0.5, ..., a rate in [0, 1]), or the held-out reward where the task has none. A
  variant's scores are rliable's ``runs x tasks`` matrix: here ``seeds x 1``, one task per bench.
- Aggregates (the paper's Fig. 1): the interquartile mean, IQM = the mean of the middle 50% of the
  runs (``scipy.stats.trim_mean(x, 0.25)``, which drops floor(n / 4) runs at each end, so with
  fewer than 4 seeds it drops none and equals the mean); the mean; the median of the per-task
  means; the optimality gap ``gamma - mean(min(x, gamma))`` with gamma = 1 (rates only). With one
  task the median is the mean and the optimality gap is 1 - mean: they are in the JSON, not the table.
- 95% stratified-bootstrap confidence intervals (percentile method; runs resampled within each
  task) from ``rliable.library.get_interval_estimates``, :data:`BOOTSTRAP_REPS` resamples. One seed
  gives no interval (every resample is that run again): the report says so.
- Performance profiles: the fraction of runs whose score is > tau, for tau across the range the
  scores span, with 95% bootstrap bands (``create_performance_profile``,
  ``plot_utils.plot_performance_profiles``).

rliable 1.2.0 draws its resamples from NumPy's global random state (``np.random.choice`` in
``StratifiedBootstrap.update_indices``; its ``random_state`` argument never reaches them), so every
bootstrap here runs under :data:`BOOTSTRAP_SEED` and the global state is put back afterwards: the
same scores give the same intervals, and no other user of NumPy's random numbers sees a difference.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from . import rliable_import

BOOTSTRAP_REPS = 10_000  # resamples per interval (rliable's default is 50,000; 10,000 keeps it to seconds)
PROFILE_REPS = 2_000  # resamples per performance-profile band (rliable's default)
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
PROFILE_POINTS = 101  # tau values per profile
SHOWN = ("iqm", "mean")  # in the table; the JSON has every aggregate
DEGENERATE = "degenerate: 1 seed"


@contextmanager
def seeded_global_numpy(seed: int) -> Iterator[None]:
    """NumPy's global random state seeded with ``seed`` inside, the caller's state put back after."""
    import numpy as np

    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def score_of(results: Sequence[dict[str, Any]]) -> tuple[str, str, bool]:
    """(label, run key, is a rate in [0, 1]): the task metric after training where every run has it,
    else the held-out reward after training."""
    metric = results[0].get("metric")
    if metric and all(run.get("metric_after") is not None for r in results for run in r["runs"]):
        return f"{metric} after", "metric_after", True
    return "held-out reward after", "after", False


def _aggregate_funcs(rly: Any, is_rate: bool) -> dict[str, Any]:
    m = rly.metrics
    funcs = {"iqm": m.aggregate_iqm, "mean": m.aggregate_mean, "median": m.aggregate_median}
    if is_rate:
        funcs["optimality_gap"] = m.aggregate_optimality_gap  # gamma = 1: the top of a rate
    return funcs


def aggregate_over_seeds(results: Sequence[dict[str, Any]], reps: int | None = None,
                         seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """Every variant's aggregates with 95% stratified-bootstrap intervals (see the module doc).

    Returns ``score`` (its label), ``key``, ``confidence``, ``reps``, ``bootstrap_seed``, ``method``
    and ``variants``: variant -> ``scores`` (one per seed) and per aggregate ``{"estimate", "ci"}``,
    ``ci`` = [lower, upper], or None with one seed (``degenerate`` then says why). ``reps``:
    :data:`BOOTSTRAP_REPS` unless given.
    """
    import numpy as np

    reps = reps or BOOTSTRAP_REPS
    rly = rliable_import.load()
    label, key, is_rate = score_of(results)
    funcs = _aggregate_funcs(rly, is_rate)

    def aggregates(scores: np.ndarray) -> np.ndarray:
        return np.array([f(scores) for f in funcs.values()])

    matrices = {r["variant"]: np.array([[float(run[key])] for run in r["runs"]]) for r in results}
    several = {v: x for v, x in matrices.items() if x.shape[0] > 1}
    with seeded_global_numpy(seed):
        _, intervals = rly.library.get_interval_estimates(several, aggregates, reps=reps,
                                                          confidence_interval_size=CONFIDENCE)
    variants = {}
    for v, x in matrices.items():
        point, ci = aggregates(x), intervals.get(v)
        row: dict[str, Any] = {"scores": x[:, 0].tolist()}
        for i, name in enumerate(funcs):
            row[name] = {"estimate": float(point[i]),
                         "ci": None if ci is None else [float(ci[0][i]), float(ci[1][i])]}
        if ci is None:
            row["degenerate"] = "1 seed: no interval (every bootstrap resample is that one run again)"
        variants[v] = row
    return {"score": label, "key": key, "is_rate": is_rate, "aggregates": list(funcs), "confidence": CONFIDENCE,
            "reps": reps, "bootstrap_seed": seed, "method": "stratified bootstrap over runs, percentile intervals "
            "(rliable.library.get_interval_estimates)", "variants": variants}


def tau_grid(stats: dict[str, Any], points: int = PROFILE_POINTS) -> list[float]:
    """Thresholds across the span of every variant's scores, a little beyond each end (within
    [0, 1] for a rate), so a profile starts at 1 and ends at 0."""
    import numpy as np

    values = [s for row in stats["variants"].values() for s in row["scores"]]
    lo, hi = min(values), max(values)
    pad = max(0.05 * (hi - lo), 0.01)
    lo, hi = lo - pad, hi + pad
    if stats["is_rate"]:
        lo, hi = max(lo, 0.0), min(hi, 1.0)
    return np.linspace(lo, hi, points).tolist()


def performance_profiles(stats: dict[str, Any], reps: int | None = None,
                         seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """Score distributions (fraction of runs with score > tau) and their 95% bootstrap bands
    (None with one seed): ``tau``, ``profiles`` and ``bands`` ([lower, upper]) per variant.
    ``reps``: :data:`PROFILE_REPS` unless given."""
    import numpy as np

    reps = reps or PROFILE_REPS
    rly = rliable_import.load()
    tau = tau_grid(stats)
    matrices = {v: np.array(row["scores"], dtype=float)[:, None] for v, row in stats["variants"].items()}
    several = {v: x for v, x in matrices.items() if x.shape[0] > 1}
    profiles, bands = {}, {}
    if several:  # a variant of one seed has no band (every resample is that run again): not resampled
        with seeded_global_numpy(seed):
            profiles, bands = rly.library.create_performance_profile(several, np.array(tau), reps=reps,
                                                                     confidence_interval_size=CONFIDENCE)
    return {"tau": tau, "reps": reps,
            "profiles": {v: np.asarray(profiles[v] if v in several else
                                       rly.library.score_distributions(x, np.array(tau)), dtype=float).tolist()
                         for v, x in matrices.items()},
            "bands": {v: np.asarray(bands[v], dtype=float).tolist() if v in several else None for v in matrices}}


def plot_profiles(profile: dict[str, Any], label: str, path: Path, title: str) -> None:
    """The performance profiles as a PNG, drawn by ``rliable.plot_utils.plot_performance_profiles``."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    import numpy as np

    rly = rliable_import.load()
    styles = ("solid", "dashed", "dashdot", "dotted")  # identical profiles stay visible
    names = list(profile["profiles"])
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    rly.plot_utils.plot_performance_profiles(
        {v: np.array(p) for v, p in profile["profiles"].items()}, np.array(profile["tau"]),
        performance_profile_cis={v: np.array(b) for v, b in profile["bands"].items() if b is not None},
        ax=ax, linestyles={v: styles[i % len(styles)] for i, v in enumerate(names)},
        xlabel=f"{label} (τ)", ylabel="fraction of runs with score > τ",
        legend=True, legendsize="medium", labelsize="large", ticklabelsize="medium")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)


def interval_cell(entry: dict[str, Any]) -> str:
    """``0.630 [0.615, 0.645]``; ``0.630 [degenerate: 1 seed]`` without an interval."""
    lo_hi = entry["ci"]
    return f"{entry['estimate']:.3f} " + (f"[{DEGENERATE}]" if lo_hi is None else f"[{lo_hi[0]:.3f}, {lo_hi[1]:.3f}]")


def table_rows(stats: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The aggregates table: header and one row per variant (IQM and mean, with intervals)."""
    pct = f"{stats['confidence']:.0%}"
    header = ["variant", "seeds", f"{stats['score']}: IQM [{pct} CI]", f"mean [{pct} CI]"]
    rows = [[v, str(len(row["scores"])), *(interval_cell(row[a]) for a in SHOWN)]
            for v, row in stats["variants"].items()]
    return header, rows


def stats_notes(stats: dict[str, Any]) -> list[str]:
    """What a reader of the aggregates table needs: few seeds, no interval, where the rest is."""
    counts = [len(row["scores"]) for row in stats["variants"].values()]
    notes = []
    if min(counts) == 1:
        notes.append("with 1 seed the bootstrap interval is degenerate (every resample is that run): "
                     "run several seeds for intervals (mmrl bench algos --seeds 0,1,2)")
    elif min(counts) < 4:
        notes.append(f"IQM drops floor(n/4) runs at each end: with {min(counts)} seeds it drops none and equals "
                     "the mean; the intervals of so few runs are wide and coarse")
    extra = [a for a in stats["aggregates"] if a not in SHOWN]
    if extra:
        notes.append(f"{' and '.join(a.replace('_', ' ') for a in extra)} (with intervals) are in the JSON; "
                     "with one task the median equals the mean" + (" and the optimality gap is 1 - mean"
                                                                  if "optimality_gap" in extra else ""))
    return notes
