"""RL's steps: build the batch (rollouts, rewards, advantages) -> update; the run around them
(resume, evaluate before and after, log, save, Ctrl-C, summary) is :mod:`~mmrl.core.lifecycle`'s,
the same for ``mmrl sft``.

Modality-free: it talks to a policy through :class:`~mmrl.core.policy.Policy` (capabilities are
declared and checked once, at setup), to a task through the plugin API, and builds each step's
batch with :class:`~mmrl.core.batch.BatchBuilder`, whose data order is a pure function of the step
(and of the sampler state a checkpoint keeps). Several processes: each rank rolls out whole groups
of the step's prompts with seeds of its own, the batch builder gathers what estimators and metrics
need of the whole batch, and gradients are averaged by the backend (the policy base).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..config import check_unused_keys
from ..measures.intervals import describe
from ..registry import TASKS, load_plugins
from ..runs.terminal import print_before_after
from ..task import Task
from . import distributed as dist
from .batch import BatchBuilder
from .evaluation import Evaluation, run_evaluation
from .lifecycle import NonFiniteTrainingError, RunLifecycle, TrainResult, begin_step, run_name
from .reward_computer import make_reward_computer
from .rollouts import Rollouts
from .run_checks import check_eval_split, check_world
from .schedules import should_reset_reference
from .update import PolicyUpdate

__all__ = ["NonFiniteTrainingError", "TrainResult", "Trainer", "build_task", "run_name"]


def build_task(cfg) -> Task:
    load_plugins(cfg.plugins)
    return TASKS.get(cfg.task.name)(**dict(cfg.task.options))


class Trainer:
    """RL on one policy (module docstring): the :class:`~mmrl.core.lifecycle.StepSource` of
    ``mmrl train``, whose :meth:`train` runs the lifecycle."""

    kind = "train"
    progress_metric = "reward"

    def __init__(self, cfg, policy, task: Task | None = None, run_dir: Path | None = None):
        dist.init(cfg.train.device, cfg.train.distributed_timeout)
        self.cfg = cfg
        self.policy = policy
        self.task = task or build_task(cfg)
        self.description = f"mmrl {self.task.name}"
        check_unused_keys(cfg, policy.unused_config, f"a {type(policy).__name__}")
        check_unused_keys(cfg, ["data.thought_dropout"], "RL (mmrl train); it is read by mmrl sft")
        check_eval_split(self.task)
        self.rewards = make_reward_computer(self.task, cfg.task)
        self.batches = BatchBuilder(cfg, self.task, policy, self.rewards)
        self.updater = PolicyUpdate(cfg, policy, track_kl=self.batches.tracks_policy_kl)
        self.splits = {"train": self.batches.train_examples, "eval": self.task.examples("eval")}
        check_world(cfg)
        self.lifecycle = RunLifecycle(cfg, policy, self, run_dir)
        self.run_dir, self.main = self.lifecycle.run_dir, self.lifecycle.main
        self.last_batch: Rollouts | None = None
        self.num_scored = 0  # examples of the last evaluation

    def train(self) -> TrainResult:
        """Train to ``train.steps`` (:meth:`~mmrl.core.lifecycle.RunLifecycle.train`: resume, Ctrl-C)."""
        return self.lifecycle.train()

    # -- one RL step ------------------------------------------------------------------------------
    def rollout_step(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        """The trained batch of ``step`` (rollouts, rewards, advantages) and its metrics."""
        begin_step(self.cfg, self.policy, step)
        return self.batches.build(step)

    def update(self, batch: Rollouts, step: int) -> dict[str, float]:
        """Train on the step's batch (:class:`~mmrl.core.update.PolicyUpdate`)."""
        out = self.updater(batch, step)
        if self.updater.track_kl:
            self.batches.policy_kl = self.updater.policy_kl
        return out

    def train_step(self, step: int) -> dict[str, float]:
        """The step of the lifecycle: rollouts, then the update (and the reference reset it is due)."""
        t0 = time.perf_counter()
        batch, metrics = self.rollout_step(step)
        metrics["rollout_time"] = time.perf_counter() - t0
        metrics.update(self.update(batch, step))
        if should_reset_reference(step, self.cfg.algo.ref_reset_every):
            self.policy.reset_reference()
        self.last_batch = batch
        return metrics

    @property
    def skip_causes(self) -> list[str]:
        return self.updater.skip_causes

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return self.batches.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches.load_state_dict(state)

    # -- evaluation and results ---------------------------------------------------------------------
    def evaluate(self, **outputs: Any) -> dict[str, float]:
        return self.evaluation(**outputs).metrics

    def evaluation(self, **outputs: Any) -> Evaluation:
        return run_evaluation(self.policy, self.task, self.rewards, self.cfg, **outputs)

    def held_out(self, when: str) -> Evaluation:
        """The eval split's metrics; before and after training with their intervals and the
        contact sheet of the samples (``samples_before.png``, ``samples_after.png``)."""
        if when == "during":
            return self.evaluation()
        result = self.evaluation(grid_path=self.run_dir / f"samples_{when}.png", intervals=True)
        self.num_scored = result.num_scored
        return result

    def samples(self) -> list[dict[str, Any]]:
        return self._rollout_records(self.last_batch)

    def finish(self, before: Evaluation, after: Evaluation) -> dict[str, Any]:
        """The before/after table (rank 0), and the intervals summary.json keeps."""
        intervals = {"before": before.intervals, "after": after.intervals, **describe()}
        if self.main and before.metrics:
            print_before_after(before.metrics, after.metrics, title=f"held-out eval ({self.task.name}, "
                               f"{self.num_scored} examples; 95% bootstrap intervals)", intervals=intervals)
        return {"intervals": intervals}

    def _rollout_records(self, batch: Rollouts) -> list[dict[str, Any]]:
        """A few of the step's rollouts as the task shows them, with completion, rewards, advantage."""
        records = []
        for i in range(min(self.cfg.log.num_rollouts_to_save, len(batch))):
            records.append({
                **self.task.record(batch.examples[i], batch.completions[i]),
                "completion": batch.completions[i],
                "rewards": {name: float(v[i]) for name, v in batch.reward_components.items()},
                "reward": float(batch.rewards[i]),
                "advantage": float(batch.advantages[i]),
            })
        return records

