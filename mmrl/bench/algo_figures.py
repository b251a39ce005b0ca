"""What one bench run measured, and a variant's figures over its seeds.

A run's figures come from its ``metrics.jsonl`` (the train reward of every step, step times) and
its held-out evaluations before and after training (the task's metric, pass@k, reward); with
several seeds each figure is the mean over seeds, with the sample standard deviation. The train
reward curve is smoothed by a trailing moving average of :data:`MA_WINDOW` steps, which the
steps-to-threshold column reads.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Optional, Sequence

from mmrl.runs.logging import read_jsonl

MA_WINDOW = 5  # moving-average window (steps) for the curves and steps-to-threshold
FINAL_WINDOW = 5  # "final train reward" = mean of the last this many steps


def read_train_metrics(path: Path) -> list[dict[str, Any]]:
    """The per-step training rows of a metrics.jsonl (rows with ``reward``), one per step (the last
    line wins if a step was logged twice), sorted by step."""
    rows = {int(rec["step"]): rec for rec in read_jsonl(path) if "reward" in rec and "step" in rec}
    return [rows[s] for s in sorted(rows)]


def moving_average(values: Sequence[float], window: int = MA_WINDOW) -> list[float]:
    """Trailing moving average; the first ``window - 1`` points average what there is so far."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def steps_to_threshold(steps: Sequence[int], smoothed: Sequence[float], threshold: float) -> Optional[int]:
    """The first step whose smoothed reward reaches ``threshold`` (None if it never does)."""
    for s, v in zip(steps, smoothed):
        if v >= threshold - 1e-12:
            return int(s)
    return None


def mean_or_nan(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def run_figures(name: str, seed: int, res: Any, steps: int, total: float, metric: str | None) -> dict[str, Any]:
    """One run's figures: held-out task metric, pass@k, reward, train curve and times."""
    rows = read_train_metrics(Path(res.run_dir) / "metrics.jsonl")
    if len(rows) != steps:
        raise RuntimeError(f"{name}: expected {steps} logged steps in {res.run_dir}/metrics.jsonl, got {len(rows)}")
    rewards = [float(r["reward"]) for r in rows]
    step_times = [float(r.get("step_time", float("nan"))) for r in rows]
    before_eval, after_eval = dict(res.before or {}), dict(res.after)
    pass_keys = [k for k in after_eval if k.startswith("pass@") and k != "pass@1"]
    before = before_eval.get("reward")
    after = float(after_eval["reward"])
    return {
        "seed": seed,
        "metric": metric if metric and metric in after_eval else None,
        "metric_before": before_eval.get(metric) if metric else None,
        "metric_after": after_eval.get(metric) if metric else None,
        "pass1_after": after_eval.get("pass@1"),
        "passk_after": after_eval.get(pass_keys[0]) if pass_keys else None,
        "pass_k": int(pass_keys[0][5:]) if pass_keys else None,
        "before": before,
        "after": after,
        "final_train_reward": mean_or_nan(rewards[-FINAL_WINDOW:]),
        "steps": len(rows),
        "wall_time_s": sum(step_times),
        "time_per_step_s": mean_or_nan(step_times),
        "median_step_time_s": statistics.median(step_times),
        "total_time_s": total,
        "eval_before": before_eval,
        "eval_after": after_eval,
        "run_dir": str(res.run_dir),
        "curve": {"step": [int(r["step"]) for r in rows], "reward": rewards, "reward_ma": moving_average(rewards)},
        "reward_components_final": {
            k: mean_or_nan([float(r[k]) for r in rows[-FINAL_WINDOW:] if k in r]) for k in rows[-1] if k.startswith("reward/")
        },
    }


_AVERAGED = ("metric_before", "metric_after", "pass1_after", "passk_after", "before", "after",
             "final_train_reward", "wall_time_s", "time_per_step_s", "median_step_time_s", "total_time_s")


def over_seeds(name: str, runs: list[dict[str, Any]], overrides: list[str]) -> dict[str, Any]:
    """A variant's row: each figure's mean over its seeds' runs (and sample sd with several)."""
    out: dict[str, Any] = {"variant": name, "overrides": overrides, "seeds": [r["seed"] for r in runs],
                           "metric": runs[0]["metric"], "pass_k": runs[0]["pass_k"], "steps": runs[0]["steps"], "runs": runs}
    sd: dict[str, float] = {}
    for key in _AVERAGED:
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = mean_or_nan(values) if values else None
        if len(values) > 1:
            sd[key] = statistics.stdev(values)
    out["sd"] = sd
    out["delta"] = out["after"] - out["before"] if out["before"] is not None else None
    rewards = [sum(r["curve"]["reward"][i] for r in runs) / len(runs) for i in range(out["steps"])]
    out["curve"] = {"step": runs[0]["curve"]["step"], "reward": rewards, "reward_ma": moving_average(rewards)}
    # single-seed compatibility: the run's own directory and held-out dicts
    if len(runs) == 1:
        out.update(run_dir=runs[0]["run_dir"], eval_before=runs[0]["eval_before"], eval_after=runs[0]["eval_after"],
                   reward_components_final=runs[0]["reward_components_final"])
    return out
