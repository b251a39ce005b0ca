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

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import torch

from ..config import check_unused_keys
from ..measures.intervals import describe
from ..registry import TASKS, load_plugins
from ..runs.terminal import print_before_after
from ..task import Task
from . import distributed as dist
from .async_rollouts import RolloutsAhead, check_async, stale_groups, staleness_metrics
from .batch import BatchBuilder
from .batch.scoring import complete_logps
from .evaluation import Evaluation, run_evaluation
from .lifecycle import NonFiniteTrainingError, RunLifecycle, TrainResult, begin_step, run_name, seed_step
from .reward_computer import make_reward_computer
from .rollouts import Rollouts
from .run_checks import check_eval_split, check_world
from .schedules import should_reset_reference
from .update import PolicyUpdate

__all__ = ["NonFiniteTrainingError", "TrainResult", "Trainer", "build_task", "run_name"]

log = logging.getLogger(__name__)


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
        check_async(cfg, policy, self.batches.tracks_policy_kl)
        # train.async_rollouts: the next steps' batches are generated in a thread (mmrl.core.async_rollouts)
        self.asynchronous = cfg.train.async_rollouts and cfg.train.max_staleness > 0
        self.batches.defer_logps = self.asynchronous
        self.ahead: RolloutsAhead | None = None
        self.pending: dict[int, tuple] = {}  # generated batches a checkpoint held (asynchronous resume)
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
        if self.asynchronous:
            return self._train_step_async(step)
        t0 = time.perf_counter()
        batch, metrics = self.rollout_step(step)
        metrics["rollout_time"] = metrics["rollout_wait_time"] = time.perf_counter() - t0
        metrics.update(self.update(batch, step))
        if should_reset_reference(step, self.cfg.algo.ref_reset_every):
            self.policy.reset_reference()
        self.last_batch = batch
        return metrics

    # -- asynchronous training (train.async_rollouts) -----------------------------------------------
    def _generate(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        """The batch of ``step`` in the generator thread: the step's seeds, then the batch stages
        (the trainer's log-probs are left to :meth:`_train_step_async`)."""
        seed_step(self.cfg, step)
        return self.batches.build(step)

    def _train_step_async(self, step: int) -> dict[str, float]:
        """Train the batch generated ahead for ``step`` (its samples more than
        ``train.max_staleness`` versions old dropped), then publish the new weights."""
        cfg, algo, k = self.cfg, self.cfg.algo, self.cfg.train.max_staleness
        self.policy.begin_step(step)  # the learning rate; the generator thread seeds its own steps
        if self.ahead is None:
            self.ahead = RolloutsAhead(self._generate, self.policy.publish_weights, k, step - 1, cfg.train.steps,
                                       self.pending)
        batch, metrics, versions, waited = self.ahead.take(step)
        t0 = time.perf_counter()
        stale = stale_groups(batch.group_ids, versions, step - 1, k)
        dropped = int(stale.sum())
        if dropped == len(batch):  # nothing fresh enough: this step rolls out on-policy
            with self.ahead.paused():
                seed_step(cfg, step)
                batch, metrics = self.batches.build(step)
            versions = torch.full((len(batch),), step - 1, dtype=torch.long)
        elif dropped:
            keep = (~stale).nonzero().flatten()
            batch, versions = batch.select(keep), versions[keep]
        complete_logps(batch, self.policy, algo.num_iterations > 1, algo.beta > 0,
                       algo.vllm_importance_sampling_correction)
        metrics["rollout_wait_time"] = waited
        metrics["rollout_time"] = waited + time.perf_counter() - t0
        metrics.update(staleness_metrics(versions, step - 1, dropped))
        metrics.update(self.update(batch, step))
        if should_reset_reference(step, algo.ref_reset_every):
            self.policy.reset_reference()
        # the trainer also waits when the batch k steps on is not generated yet (its push waits for it)
        metrics["rollout_wait_time"] += self.ahead.publish(step)
        self.last_batch = batch
        return metrics

    def close(self) -> None:
        """The end of the loop (finished, stopped or failed): the generator thread stops."""
        if self.ahead is not None:
            self.ahead.close()
            self.pending, self.ahead = self.ahead.pending(), None

    @property
    def skip_causes(self) -> list[str]:
        return self.updater.skip_causes

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The data order's state and, asynchronous, this rank's batches generated for the next
        steps (each rank holds its own share; read while the generator thread is idle, so both
        describe the same point of its schedule)."""
        if self.ahead is None:
            return {**self.batches.state_dict(), "rank": {"async_pending": dict(self.pending)}}
        with self.ahead.paused():
            return {**self.batches.state_dict(), "rank": {"async_pending": self.ahead.pending()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches.load_state_dict(state)
        pending = state.get("async_pending") or {}
        saved_world = state.get("world_size", 1)
        why = ""
        if not self.asynchronous:
            why = "this run is on-policy"
        elif saved_world != dist.world_size():  # each rank generated its share of the prompts
            why = f"they are shares of {saved_world} process(es) and this launch has {dist.world_size()}"
        if pending and why:
            log.warning("the checkpoint holds %d batch(es) generated ahead for steps %s (asynchronous training); "
                        "%s, so they are dropped and those steps roll out again", len(pending),
                        ", ".join(map(str, sorted(pending))), why)
            pending = {}
        self.pending = dict(pending)

    # -- evaluation and results ---------------------------------------------------------------------
    def evaluate(self, **outputs: Any) -> dict[str, float]:
        return self.evaluation(**outputs).metrics

    def evaluation(self, **outputs: Any) -> Evaluation:
        return run_evaluation(self.policy, self.task, self.rewards, self.cfg, **outputs)

    def held_out(self, when: str) -> Evaluation:
        """The eval split's metrics; before and after training with their intervals and the
        contact sheet of the samples (``samples_before.png``, ``samples_after.png``)."""
        if when == "during":
            with self.ahead.paused() if self.ahead is not None else contextlib.nullcontext():
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

