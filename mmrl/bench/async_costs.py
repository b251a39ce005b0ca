"""What a finished run measured, read back for ``mmrl bench async``: samples/s, the trainer's idle
share, the held-out metric, and (from a sync run) the per-step costs :mod:`mmrl.bench.async_model`
takes.

Per step, ``metrics.jsonl`` holds ``step_time`` (the whole step) and ``rollout_wait_time`` (the
seconds the trainer waited for the step's rollouts: in a sync run the whole rollout stage, runs
from before asynchronous training wrote ``rollout_time``); an engine with its own copy of the
weights reports its push as ``rollout/weight_sync_time`` (in a sync run it happens inside the
rollout stage: the next generate pushes first). The trainer's own log-prob passes (old log-probs for
the engine correction, the reference's for the KL) are part of a sync run's rollout stage; an
asynchronous run computes them when it trains the batch, inside ``rollout_time`` after the wait
(``rollout_time - rollout_wait_time``): :meth:`RunMeasure.costs` moves them from generation to the
update when told how long they take. ``summary.json`` holds the held-out metrics
after training; ``config.yaml`` the samples per step (``train.prompts_per_step`` x
``rollout.num_generations``) and whether the run was asynchronous.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .algo_figures import read_train_metrics
from .async_model import Costs

WAIT_KEYS = ("rollout_wait_time", "rollout_time")  # the first a row has is read
SYNC_TIME_KEY = "rollout/weight_sync_time"
STALENESS_KEY = "async/staleness"


class RunReadError(ValueError):
    """A run directory that cannot give what was asked (named, with what to do)."""


@dataclass
class RunMeasure:
    """The measured steps of one run (the first ``warmup`` logged steps left out)."""

    run_dir: str
    samples_per_step: int
    asynchronous: bool
    max_staleness: int
    step_s: list[float]
    wait_s: list[float]
    sync_s: list[float] = field(default_factory=list)  # empty when the engine does not report it
    staleness: list[float] = field(default_factory=list)
    scoring_s: list[float] = field(default_factory=list)  # asynchronous runs: rollout_time - rollout_wait_time
    after: dict[str, Any] = field(default_factory=dict)  # summary.json's held-out metrics after training

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_step * len(self.step_s) / sum(self.step_s)

    @property
    def trainer_idle(self) -> float:
        """sum(rollout_wait_time) / sum(step_time): the share of the step the trainer waited."""
        return sum(self.wait_s) / sum(self.step_s)

    def costs(self, sync_s: float | None = None, scoring_s: float = 0.0) -> Costs:
        """A sync run's steps as the model's costs on one device of each kind: gen = wait - the push
        the run reported (0 when it reported none) - ``scoring_s`` (the trainer's log-prob passes,
        which asynchronous training does on the trainer); update = step - wait + ``scoring_s``; the
        model's push is ``sync_s`` when given, else the run's. Variation: std / mean over the steps."""
        if self.asynchronous:
            raise RunReadError(f"{self.run_dir}: an asynchronous run (train.async_rollouts=true) cannot give "
                               "the model its costs (its rollouts overlap its updates); give a sync run's directory")
        measured_sync = statistics.fmean(self.sync_s) if self.sync_s else 0.0
        pushes = self.sync_s if len(self.sync_s) == len(self.wait_s) else [measured_sync] * len(self.wait_s)
        gens = [w - p - scoring_s for w, p in zip(self.wait_s, pushes)]
        updates = [t - w + scoring_s for t, w in zip(self.step_s, self.wait_s)]
        return Costs(gen_s=max(statistics.fmean(gens), 0.0), update_s=max(statistics.fmean(updates), 0.0),
                     sync_s=measured_sync if sync_s is None else sync_s, samples=self.samples_per_step,
                     gen_cv=_cv(gens), update_cv=_cv(updates))


def _cv(values: list[float]) -> float:
    if len(values) < 2 or statistics.fmean(values) <= 0:
        return 0.0
    return statistics.stdev(values) / statistics.fmean(values)


def read_run(run_dir: Path | str, warmup: int = 1) -> RunMeasure:
    """The run's measured steps after ``warmup`` (the first step pays engine and server start-up)."""
    run_dir = Path(run_dir)
    metrics, config = run_dir / "metrics.jsonl", run_dir / "config.yaml"
    for path in (metrics, config):
        if not path.exists():
            raise RunReadError(f"{path} not found: give a run directory (the one `mmrl train` printed)")
    cfg = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    train, rollout = cfg.get("train") or {}, cfg.get("rollout") or {}
    rows = read_train_metrics(metrics)[warmup:]
    if not rows:
        raise RunReadError(f"{metrics}: no training steps after the first {warmup} (warm-up); "
                           "run more steps or pass a smaller warm-up")
    missing = [r["step"] for r in rows if "step_time" not in r or not any(k in r for k in WAIT_KEYS)]
    if missing:
        raise RunReadError(f"{metrics}: step(s) {missing[:5]} lack step_time or rollout_wait_time "
                           "(log.log_every > 1 logs only some steps: rerun with log.log_every=1)")
    summary = run_dir / "summary.json"
    after = (json.loads(summary.read_text(encoding="utf-8")).get("after") or {}) if summary.exists() else {}
    return RunMeasure(
        run_dir=str(run_dir),
        samples_per_step=int(train.get("prompts_per_step", 8)) * int(rollout.get("num_generations", 8)),
        asynchronous=bool(train.get("async_rollouts", False)),
        max_staleness=int(train.get("max_staleness", 1)),
        step_s=[float(r["step_time"]) for r in rows],
        wait_s=[float(next(r[k] for k in WAIT_KEYS if k in r)) for r in rows],
        sync_s=[float(r[SYNC_TIME_KEY]) for r in rows if SYNC_TIME_KEY in r],
        staleness=[float(r[STALENESS_KEY]) for r in rows if STALENESS_KEY in r],
        scoring_s=[float(r["rollout_time"]) - float(r["rollout_wait_time"]) for r in rows
                   if "rollout_time" in r and "rollout_wait_time" in r] if train.get("async_rollouts") else [],
        after=after,
    )
