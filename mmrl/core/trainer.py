"""The RL loop: build the batch (rollouts, rewards, advantages) -> update -> log -> evaluate -> save.

Modality-free: it talks to a policy through :class:`~mmrl.core.policy.Policy` (capabilities are
declared and checked once, at setup), to a task through the plugin API, and builds each step's
batch with :class:`~mmrl.core.batch.BatchBuilder`. Determinism: every step reseeds from
``(train.seed, step)`` and the data order is a pure function of the step, so a run resumed from a
checkpoint continues exactly as the uninterrupted run would have.

Several processes (``accelerate launch`` / ``torchrun``, :mod:`~mmrl.core.distributed`): each rank
rolls out whole groups of the step's prompts with seeds of its own, the batch builder gathers what
estimators and metrics need of the whole batch, gradients are averaged by the backend (the policy
base), and rank 0 alone logs, shows progress and writes checkpoints (every rank's RNG included).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import check_unused_keys
from ..measures.intervals import describe
from ..registry import TASKS, load_plugins
from ..runs.checkpoint import set_rng_state
from ..runs.config_history import record_start
from ..runs.logging import RunLogger, write_summary
from ..runs.resume import finished_steps, open_run, resuming_line
from ..runs.terminal import TrainingProgress, print_before_after
from ..runs.trackers import tracker_names
from ..runs.report import report_after_run
from ..task import Task
from . import distributed as dist
from .batch import BatchBuilder
from .evaluation import run_evaluation
from .interrupt import StopOnInterrupt, TrainingInterrupted
from .policy_checkpoint import save_run_checkpoint
from .reward_computer import make_reward_computer
from .rollouts import Rollouts
from .run_checks import check_eval_split, check_world
from .schedules import should_reset_reference
from .seeding import seed_everything, stream_seed
from .skip_record import SkipRecord
from .update import PolicyUpdate

log = logging.getLogger(__name__)


def build_task(cfg) -> Task:
    load_plugins(cfg.plugins)
    return TASKS.get(cfg.task.name)(**dict(cfg.task.options))


def run_name(cfg) -> str:
    return cfg.log.run_name or f"{cfg.task.name}-{time.strftime('%Y%m%d-%H%M%S')}"


class NonFiniteTrainingError(RuntimeError):
    """Too many consecutive steps had non-finite gradients (``train.max_consecutive_skipped_steps``)."""


@dataclass
class TrainResult:
    run_dir: Path
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    finished: bool = False  # the run had already trained every step (a resume found nothing to do)


class Trainer:
    """Runs the loop of the module docstring for one policy."""

    def __init__(self, cfg, policy, task: Task | None = None, run_dir: Path | None = None):
        dist.init(cfg.train.device, cfg.train.distributed_timeout)
        self.cfg = cfg
        self.policy = policy
        self.task = task or build_task(cfg)
        check_unused_keys(cfg, policy.unused_config, f"a {type(policy).__name__}")
        check_unused_keys(cfg, ["data.thought_dropout"], "RL (mmrl train); it is read by mmrl sft")
        tracker_names(cfg.log.report_to, cfg.log.tensorboard)  # every rank: a bad name stops them all, not rank 0 alone
        check_eval_split(self.task)
        self.rewards = make_reward_computer(self.task, cfg.task)
        self.batches = BatchBuilder(cfg, self.task, policy, self.rewards)
        self.updater = PolicyUpdate(cfg, policy, track_kl=self.batches.tracks_policy_kl)
        check_world(cfg)
        # Rank 0 names the run (a timestamp): every rank must agree on it.
        self.run_dir = Path(dist.broadcast(str(run_dir or Path(cfg.log.output_dir) / run_name(cfg))))
        self.main = dist.is_main()
        self.ckpt = open_run(self.run_dir, cfg, self.main)  # a resume's changes checked, stale .tmp removed

    # -- one RL step ------------------------------------------------------------------------------
    def rollout_step(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        """The trained batch of ``step`` (rollouts, rewards, advantages) and its metrics."""
        seed_everything(stream_seed(self.cfg.train.seed, step, "step", rank_salt=dist.rank_salt()))  # rank 0: salt 0
        self.policy.begin_step(step)
        return self.batches.build(step)

    def update(self, batch: Rollouts, step: int) -> dict[str, float]:
        """Train on the step's batch (:class:`~mmrl.core.update.PolicyUpdate`)."""
        out = self.updater(batch, step)
        if self.updater.track_kl:
            self.batches.policy_kl = self.updater.policy_kl
        return out

    # -- checkpoints ------------------------------------------------------------------------------
    def save(self, step: int, before: dict[str, float]) -> None:
        """Every rank takes part (a sharding backend gathers the weights; each rank's RNG state
        is gathered); rank 0 writes into the temp directory and publishes it atomically."""
        save_run_checkpoint(self.ckpt, step, self.policy, lambda rngs: {
            "step": step, "rng": rngs[0], "rank_rngs": rngs, "world_size": dist.world_size(), "before": before,
            "before_intervals": self.before_intervals, **self.batches.state_dict()})

    def _resume(self) -> tuple[int, dict[str, float]]:
        """Every rank reads the same checkpoint (a shared run directory); each restores its own
        RNG state when the process count is unchanged (the per-step reseeding makes the draws of
        later steps exact either way)."""
        latest = self.ckpt.latest()
        if latest is None:
            return 0, {}
        self.policy.load(latest / "policy")
        state = torch.load(latest / "trainer.pt", map_location="cpu", weights_only=False)
        rngs = state.get("rank_rngs") or [state["rng"]]
        if dist.rank() < len(rngs):
            set_rng_state(rngs[dist.rank()])
        self.batches.load_state_dict(state)
        self.before_intervals = dict(state.get("before_intervals") or {})
        return int(state["step"]), dict(state.get("before") or {})

    def evaluate(self, **outputs: Any) -> dict[str, float]:
        return self.evaluation(**outputs).metrics

    def evaluation(self, **outputs: Any):
        return run_evaluation(self.policy, self.task, self.rewards, self.cfg, **outputs)

    # -- the loop ---------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        """Train to ``train.steps``. A first Ctrl-C finishes the step, saves it and raises
        :class:`~mmrl.core.interrupt.TrainingInterrupted`; a second raises it at once."""
        cfg, main = self.cfg, self.main
        if cfg.resume and finished_steps(self.run_dir, cfg.train.steps):
            return self._finished()
        self.policy.configure_optimizer(cfg.train, cfg.train.steps)
        if main and dist.world_size() > 1:
            print(f"mmrl: {dist.world_size()} processes, {self.policy.distributed_backend}", flush=True)
        logger = RunLogger(self.run_dir, cfg.log.tensorboard, cfg.log.report_to, config=cfg) if main else None
        skips = SkipRecord({"train": self.batches.train_examples, "eval": self.task.examples("eval")})
        log = skips.with_counts(logger.log if main else None)  # + data/<split>/<count> of what was skipped
        self.before_intervals, after_intervals = {}, {}
        start, before = (self._resume() if cfg.resume else (0, {}))
        if main:
            record_start(self.run_dir, cfg, resumed_from=start)
        if cfg.resume and main:  # what a killed attempt logged after its checkpoint is re-run: drop it
            print(resuming_line(self.run_dir, start, cfg.train.steps), flush=True)
            logger.truncate_after(start if start else -1, final=start == cfg.train.steps)
        self.step_done, stopped = start, False
        try:
            if not start and cfg.eval.before:
                first = self.evaluation(grid_path=self.run_dir / "samples_before.png", intervals=True)
                before, self.before_intervals = first.metrics, first.intervals
                log(0, {f"eval/{k}": v for k, v in before.items()})
            skipped_in_a_row = 0
            with TrainingProgress(cfg.train.steps, start_step=start, enabled=cfg.log.progress and main,
                                  description=f"mmrl {self.task.name}") as progress, \
                    StopOnInterrupt(self._announce_stop) as interrupt:
                for step in range(start + 1, cfg.train.steps + 1):
                    t0 = time.perf_counter()
                    batch, metrics = self.rollout_step(step)
                    metrics["rollout_time"] = time.perf_counter() - t0
                    metrics.update(self.update(batch, step))
                    if should_reset_reference(step, cfg.algo.ref_reset_every):
                        self.policy.reset_reference()
                    metrics["step_time"] = time.perf_counter() - t0
                    if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.train.steps:
                        metrics.update({f"eval/{k}": v for k, v in self.evaluate().items()})
                    if step % max(cfg.log.log_every, 1) == 0 or step == cfg.train.steps:
                        log(step, metrics)
                    # done as soon as it is logged: a second Ctrl-C during the writes below must not
                    # report one step fewer than metrics.jsonl holds
                    self.step_done = step
                    if main and cfg.log.save_rollouts_every and step % cfg.log.save_rollouts_every == 0:
                        logger.save_rollouts(step, self._rollout_records(batch))
                    skipped_in_a_row = self._record_skips(step, skipped_in_a_row, before)
                    progress.update(step, reward=metrics["reward"], step_time=metrics["step_time"])
                    saved = bool(cfg.log.save_every) and step % cfg.log.save_every == 0
                    stopped = step < cfg.train.steps and _agreed(interrupt.requested)
                    if (saved or stopped) and step < cfg.train.steps:
                        self.save(step, before)
                    if stopped:
                        break
            if not stopped:
                if start < cfg.train.steps:  # a resumed run that stopped in its final eval has this one
                    self.save(cfg.train.steps, before)
                last = self.evaluation(grid_path=self.run_dir / "samples_after.png", intervals=True)
                after, after_intervals = last.metrics, last.intervals
                log(cfg.train.steps, {f"eval/{k}": v for k, v in after.items()})
        except KeyboardInterrupt as exc:  # a second Ctrl-C, or one before the loop
            raise TrainingInterrupted(self.run_dir, self.step_done, self.ckpt.latest_step()) from exc
        finally:
            if logger is not None:
                logger.close()
        if stopped:
            raise TrainingInterrupted(self.run_dir, self.step_done, self.step_done, saved=True)
        result = TrainResult(self.run_dir, before, after, cfg.train.steps)
        if main:
            intervals = {"before": self.before_intervals, "after": after_intervals, **describe()}
            write_summary(self.run_dir, before=before, after=after, steps=cfg.train.steps,
                          data=skips.summary(self.run_dir / "metrics.jsonl"), intervals=intervals)
            if before:
                print_before_after(before, after, title=f"held-out eval ({self.task.name}, {last.num_scored} "
                                   "examples; 95% bootstrap intervals)", intervals=intervals)
            report_after_run(self.run_dir)  # report.html; a failure is a warning
        return result

    def _announce_stop(self) -> None:
        if self.main:
            last = self.ckpt.latest_step()
            lost = f"the steps after step {last} are then lost" if last else "nothing has been saved yet"
            print(f"\nCtrl-C: finishing step {self.step_done + 1}, then saving a checkpoint and stopping. "
                  f"Press Ctrl-C again to stop at once ({lost}).", file=sys.stderr, flush=True)

    def _finished(self) -> TrainResult:
        """A resumed run that already trained every step: its summary, nothing trained again."""
        summary = json.loads((self.run_dir / "summary.json").read_text(encoding="utf-8"))
        return TrainResult(self.run_dir, summary.get("before") or {}, summary.get("after") or {},
                           self.cfg.train.steps, finished=True)

    def _record_skips(self, step: int, in_a_row: int, before: dict[str, float]) -> int:
        """Steps whose optimizer update was skipped (a non-finite gradient): each goes to
        ``skipped_steps.jsonl`` with its cause and a warning; after
        ``train.max_consecutive_skipped_steps`` in a row the run saves the last good weights (a
        skipped step changed nothing) and stops. Returns the new count of skips in a row."""
        causes = self.updater.skip_causes  # those of this step's update
        if not causes:
            return 0
        in_a_row += 1
        if self.main:
            with open(self.run_dir / "skipped_steps.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, "causes": causes}) + "\n")
            log.warning("step %d: %d update(s) skipped: %s", step, len(causes), causes[0])
        limit = self.cfg.train.max_consecutive_skipped_steps
        if limit and in_a_row >= limit:
            self.save(step, before)
            raise NonFiniteTrainingError(
                f"{in_a_row} steps in a row skipped their update ({causes[0]}, step {step}); the run "
                f"stopped, its last good weights are in {self.ckpt.latest()} (see skipped_steps.jsonl; lower "
                "train.learning_rate, compute in bfloat16 or float32 rather than float16, or check the rewards)")
        return in_a_row

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


def _agreed(flag: bool) -> bool:
    """Whether any rank's ``flag`` is set: every rank must stop after the same step."""
    return dist.all_max(float(flag)) > 0 if dist.world_size() > 1 else flag
