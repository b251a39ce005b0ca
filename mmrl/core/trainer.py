"""The RL loop: build the batch (rollouts, rewards, advantages) -> update -> log -> evaluate -> save.

Modality-free: it talks to a policy through :class:`~mmrl.core.policy.Policy` (capabilities are
declared and checked once, at setup), to a task through the plugin API, and builds each step's
batch with :class:`~mmrl.core.batch.BatchBuilder`. Determinism: every step reseeds from
``(train.seed, step)`` and the data order is a pure function of the step, so a run resumed from a
checkpoint continues exactly as the uninterrupted run would have.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import check_unused_keys, save_config
from ..registry import TASKS, load_plugins
from ..runs.checkpoint import CheckpointManager, rng_state, set_rng_state
from ..runs.logging import RunLogger, TrainingProgress, print_before_after
from ..task import Task
from .batch import BatchBuilder
from .evaluation import evaluate
from .losses import Objective, ObjectiveConfig, count_sequences, kl_penalty
from .reward_computer import make_reward_computer
from .rollouts import Rollouts
from .schedules import kl_coef_at, should_reset_reference
from .seeding import seed_everything, step_seed


def build_task(cfg) -> Task:
    load_plugins(cfg.plugins)
    return TASKS.get(cfg.task.name)(**dict(cfg.task.options))


def run_name(cfg) -> str:
    return cfg.log.run_name or f"{cfg.task.name}-{time.strftime('%Y%m%d-%H%M%S')}"


@dataclass
class TrainResult:
    run_dir: Path
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    steps: int = 0


class Trainer:
    """Runs the loop of the module docstring for one policy."""

    def __init__(self, cfg, policy, task: Task | None = None, run_dir: Path | None = None):
        self.cfg = cfg
        self.policy = policy
        self.task = task or build_task(cfg)
        check_unused_keys(cfg, policy.unused_config, f"a {type(policy).__name__}")
        self.rewards = make_reward_computer(self.task, cfg.task)
        self.batches = BatchBuilder(cfg, self.task, policy, self.rewards)
        self.objective_cfg = ObjectiveConfig.from_algo(cfg.algo, max_completion_length=policy.max_actions)
        if self.batches.tracks_policy_kl and "scoring" not in policy.capabilities:
            raise ValueError(f"algo.advantage={cfg.algo.advantage!r} measures each update's policy KL by "
                             f"re-scoring the batch, which a {type(policy).__name__} cannot; set "
                             "algo.advantage_kwargs.rho to a fixed forgetting factor")
        self.run_dir = Path(run_dir or Path(cfg.log.output_dir) / run_name(cfg))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt = CheckpointManager(self.run_dir / "checkpoints", keep=cfg.log.save_total_limit)

    # -- one RL step ------------------------------------------------------------------------------
    def rollout_step(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        """The trained batch of ``step`` (rollouts, rewards, advantages) and its metrics."""
        seed_everything(step_seed(self.cfg.train.seed, step))
        self.policy.begin_step(step)
        return self.batches.build(step)

    def objective_at(self, step: int) -> Objective:
        """The loss for ``step``, with the KL weight of the configured schedule."""
        algo = self.cfg.algo
        beta = kl_coef_at(step - 1, algo.beta, algo.kl_schedule, total_steps=self.cfg.train.steps,
                          **dict(algo.kl_schedule_kwargs))
        return Objective(dataclasses.replace(self.objective_cfg, beta=beta))

    def update(self, batch: Rollouts, step: int) -> dict[str, float]:
        """``num_iterations`` passes over the batch in shuffled mini-batches, one optimizer step each."""
        cfg = self.cfg
        objective = self.objective_at(step)
        track_kl = self.batches.tracks_policy_kl
        before = None
        if track_kl:
            before = batch.old_logps if batch.old_logps is not None else self.policy.score(batch, reference=False)
        n = len(batch)
        mini = cfg.train.mini_batch_size or n
        sums: dict[str, float] = {}
        count = 0
        for it in range(cfg.algo.num_iterations):
            g = torch.Generator().manual_seed(step_seed(cfg.train.seed, step, salt=11 + it))
            order = torch.randperm(n, generator=g) if mini < n else torch.arange(n)
            for start in range(0, n, mini):
                sub = batch.select(order[start:start + mini])
                metrics = self.policy.train_step(sub, objective, num_tokens=float(sub.action_mask.sum()),
                                                 num_seqs=count_sequences(sub.action_mask))
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        out = {k: v / count for k, v in sums.items()}
        if cfg.algo.beta > 0:
            out["kl_coef"] = objective.cfg.beta
        if track_kl:
            after = self.policy.score(batch, reference=False)
            kl = kl_penalty(before, after, "k3") * batch.action_mask
            self.batches.policy_kl = float(kl.sum() / batch.action_mask.sum().clamp(min=1))
            out["policy_kl"] = self.batches.policy_kl
        return out

    # -- checkpoints ------------------------------------------------------------------------------
    def save(self, step: int, before: dict[str, float]) -> None:
        def write(d: Path) -> None:
            self.policy.save(d / "policy")
            torch.save({"step": step, "rng": rng_state(), "before": before, **self.batches.state_dict()},
                       d / "trainer.pt")

        self.ckpt.save(step, write)

    def _resume(self) -> tuple[int, dict[str, float]]:
        latest = self.ckpt.latest()
        if latest is None:
            return 0, {}
        self.policy.load(latest / "policy")
        state = torch.load(latest / "trainer.pt", map_location="cpu", weights_only=False)
        set_rng_state(state["rng"])
        self.batches.load_state_dict(state)
        return int(state["step"]), dict(state.get("before") or {})

    def evaluate(self, **outputs: Any) -> dict[str, float]:
        return evaluate(self.policy, self.task, self.rewards, self.cfg, **outputs)

    # -- the loop ---------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        cfg = self.cfg
        save_config(cfg, self.run_dir / "config.yaml")
        self.policy.configure_optimizer(cfg.train, cfg.train.steps)
        logger = RunLogger(self.run_dir, tensorboard=cfg.log.tensorboard)
        start, before = (self._resume() if cfg.resume else (0, {}))
        if start:
            logger.truncate_after(start)
        elif cfg.eval.before:
            before = self.evaluate(grid_path=self.run_dir / "samples_before.png")
            logger.log(0, {f"eval/{k}": v for k, v in before.items()})
        try:
            with TrainingProgress(cfg.train.steps, start_step=start, enabled=cfg.log.progress,
                                  description=f"mmrl {self.task.name}") as progress:
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
                        logger.log(step, metrics)
                    if cfg.log.save_rollouts_every and step % cfg.log.save_rollouts_every == 0:
                        logger.save_rollouts(step, self._rollout_records(batch))
                    progress.update(step, reward=metrics["reward"], step_time=metrics["step_time"])
                    if cfg.log.save_every and step % cfg.log.save_every == 0 and step < cfg.train.steps:
                        self.save(step, before)
            self.save(cfg.train.steps, before)
            after = self.evaluate(grid_path=self.run_dir / "samples_after.png")
            logger.log(cfg.train.steps, {f"eval/{k}": v for k, v in after.items()})
        finally:
            logger.close()
        result = TrainResult(self.run_dir, before, after, cfg.train.steps)
        (self.run_dir / "summary.json").write_text(json.dumps(
            {"before": before, "after": after, "steps": cfg.train.steps}, indent=2))
        if before:
            print_before_after(before, after, title=f"held-out eval ({self.task.name}, {cfg.eval.num_examples} examples)")
        return result

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
