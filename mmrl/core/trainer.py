"""The RL loop: sample prompts -> rollout -> rewards -> advantages -> update -> log -> checkpoint.

Modality-free: it talks to a policy (``rollout``, ``train_step``, ``save``/``load``,
``configure_optimizer``) and a task (examples, prompts, rewards, metrics). Determinism: every step
reseeds from ``(train.seed, step)`` and the data order is a pure function of the step, so a run
resumed from a checkpoint continues exactly as the uninterrupted run would have.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ..config import save_config
from ..registry import TASKS, load_plugins
from ..task import Task
from .advantages import compute_advantages, make_advantage_state
from .checkpoint import CheckpointManager, rng_state, set_rng_state
from .logging import RunLogger, TrainingProgress, print_before_after
from .objective import Objective, ObjectiveConfig
from .reward_aggregation import aggregate_rewards
from .rewards import RewardComputer
from .schedules import kl_coef_at, should_reset_reference
from .shaping import overlong_mask, soft_overlong_penalty
from .rollouts import Rollouts


def step_seed(seed: int, step: int, salt: int = 0) -> int:
    """A well-mixed 63-bit seed for (run seed, step, purpose)."""
    x = (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + salt * 0x94D049BB133111EB) % (1 << 63)
    return x


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


class DataStream:
    """Which examples step k trains on: epoch-wise seeded permutations, a pure function of k."""

    def __init__(self, size: int, batch: int, seed: int):
        if size <= 0:
            raise ValueError("the task's train split is empty")
        self.size, self.batch, self.seed = size, batch, seed
        self._perm: tuple[int, torch.Tensor] | None = None

    def _permutation(self, epoch: int) -> torch.Tensor:
        if self._perm is None or self._perm[0] != epoch:
            g = torch.Generator().manual_seed(step_seed(self.seed, epoch, salt=7))
            self._perm = (epoch, torch.randperm(self.size, generator=g))
        return self._perm[1]

    def indices(self, step: int) -> list[int]:
        out = []
        for pos in range(step * self.batch, (step + 1) * self.batch):
            epoch, i = divmod(pos, self.size)
            out.append(int(self._permutation(epoch)[i]))
        return out


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


def evaluate(policy, task: Task, rewards: RewardComputer, cfg, num_examples: int | None = None) -> dict[str, float]:
    """Held-out mean reward, each reward component and the task's metrics on the eval split."""
    examples_all = task.examples("eval")
    n = min(num_examples or cfg.eval.num_examples, len(examples_all))
    examples = [examples_all[i] for i in range(n)]
    prompts = [task.prompt(ex) for ex in examples]
    batch = policy.rollout(examples, prompts, cfg.eval.num_generations, _eval_sampling(cfg),
                           need_old_logps=False, need_ref_logps=False)
    total, comps, _ = rewards(batch.completions, batch.examples)
    out = {"reward": float(total.mean())}
    out.update({f"reward/{k}": float(v.mean()) for k, v in comps.items()})
    out.update({k: float(v) for k, v in task.metrics(batch.completions, batch.examples).items()})
    return out


def _eval_sampling(cfg) -> SimpleNamespace:
    """Rollout settings for evaluation: the training budget, the eval temperature."""
    return SimpleNamespace(temperature=cfg.eval.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                           max_completion_length=cfg.rollout.max_completion_length,
                           batch_size=cfg.rollout.batch_size)


class Trainer:
    """Runs the loop of the module docstring for one policy (see :class:`~mmrl.core.policy.Policy`)."""

    def __init__(self, cfg, policy, task: Task | None = None, run_dir: Path | None = None):
        self.cfg = cfg
        self.policy = policy
        self.task = task or build_task(cfg)
        weights = dict(cfg.task.rewards) or dict(self.task.rewards)
        kwargs = {**self.task.reward_kwargs, **{k: dict(v) for k, v in cfg.task.reward_kwargs.items()}}
        self.rewards = RewardComputer(weights, kwargs)
        self.run_dir = Path(run_dir or Path(cfg.log.output_dir) / run_name(cfg))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt = CheckpointManager(self.run_dir / "checkpoints", keep=cfg.log.save_total_limit)
        self.objective_cfg = ObjectiveConfig.from_algo(cfg.algo, max_completion_length=cfg.rollout.max_completion_length)
        self.adv_state = make_advantage_state(cfg.algo.advantage)
        self.adv_kwargs = self._advantage_kwargs(weights)
        train_split = self.task.examples("train")
        self.train_examples = train_split
        self.stream = DataStream(len(train_split), cfg.train.prompts_per_step, cfg.train.seed)

    # -- one RL step ------------------------------------------------------------------------------
    def rollout_step(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        cfg = self.cfg
        seed_everything(step_seed(cfg.train.seed, step))
        indices = self.stream.indices(step)
        examples = [self.train_examples[i] for i in indices]
        prompts = [self.task.prompt(ex) for ex in examples]
        batch = self.policy.rollout(
            examples, prompts, cfg.rollout.num_generations, cfg.rollout,
            need_old_logps=cfg.algo.num_iterations > 1, need_ref_logps=cfg.algo.beta > 0,
        )
        total, comps, stats = self.rewards(batch.completions, batch.examples)
        lengths = batch.action_mask.sum(1)
        if cfg.algo.soft_overlong_buffer:
            comps["overlong_penalty"] = soft_overlong_penalty(
                lengths, cfg.rollout.max_completion_length, cfg.algo.soft_overlong_buffer, cfg.algo.soft_overlong_penalty)
            total = total + comps["overlong_penalty"]
        batch.rewards, batch.reward_components = total, comps
        batch.advantages = self._advantages(batch, indices)
        if cfg.algo.overlong_filter and batch.truncated is not None:
            batch.action_mask = batch.action_mask * overlong_mask(batch.truncated, len(batch))[:, None]
        metrics = {
            "reward": float(total.mean()),
            "reward_std": float(total.std()) if len(total) > 1 else 0.0,
            **{f"reward/{k}": float(v.mean()) for k, v in comps.items()},
            **stats,
            "completion_length": float(lengths.mean()),
            "truncated_frac": float(batch.truncated.float().mean()) if batch.truncated is not None else 0.0,
            "zero_std_group_frac": _zero_std_fraction(total, batch.group_ids),
        }
        return batch, metrics

    def _advantages(self, batch: Rollouts, indices: list[int]) -> torch.Tensor:
        """The configured estimator on the (optionally z-scored) rewards of ``batch``."""
        algo = self.cfg.algo
        signal = batch.rewards
        if algo.reward_aggregation != "weighted_sum":
            weights = {**self.rewards.weights, **({"overlong_penalty": 1.0} if "overlong_penalty" in batch.reward_components else {})}
            signal = aggregate_rewards(batch.reward_components, weights, algo.reward_aggregation, group_ids=batch.group_ids)
        extra = dict(self.adv_kwargs)
        if self.adv_state is not None:
            extra["state"] = self.adv_state
        if algo.advantage == "spo":  # the per-prompt value tracker keys on the example index
            extra["prompt_keys"] = [str(indices[int(g)]) for g in batch.group_ids]
        return compute_advantages(algo.advantage, signal, batch.group_ids, scale_rewards=algo.scale_rewards, **extra)

    def _advantage_kwargs(self, weights: dict[str, float]) -> dict[str, Any]:
        """Estimator options; NGRPO/BNPO need the best reachable reward (rewards lie in [0, 1])."""
        kwargs = dict(self.cfg.algo.advantage_kwargs)
        if self.cfg.algo.advantage in ("ngrpo", "bnpo"):
            kwargs.setdefault("r_max", float(sum(w for w in weights.values() if w > 0)))
        return kwargs

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
        n = len(batch)
        mini = cfg.train.mini_batch_size or n
        sums: dict[str, float] = {}
        count = 0
        for it in range(cfg.algo.num_iterations):
            g = torch.Generator().manual_seed(step_seed(cfg.train.seed, step, salt=11 + it))
            order = torch.randperm(n, generator=g) if mini < n else torch.arange(n)
            for start in range(0, n, mini):
                sub = batch.select(order[start:start + mini])
                metrics = self.policy.train_step(
                    sub, objective,
                    num_tokens=float(sub.action_mask.sum()), num_seqs=float(len(sub)),
                )
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        out = {k: v / count for k, v in sums.items()}
        if cfg.algo.beta > 0:
            out["kl_coef"] = objective.cfg.beta
        return out

    # -- checkpoints ------------------------------------------------------------------------------
    def save(self, step: int, before: dict[str, float]) -> None:
        def write(d: Path) -> None:
            self.policy.save(d / "policy")
            torch.save({"step": step, "rng": rng_state(), "before": before,
                        "advantage_state": self.adv_state.state_dict() if self.adv_state is not None else None},
                       d / "trainer.pt")

        self.ckpt.save(step, write)

    def _resume(self) -> tuple[int, dict[str, float]]:
        latest = self.ckpt.latest()
        if latest is None:
            return 0, {}
        self.policy.load(latest / "policy")
        state = torch.load(latest / "trainer.pt", map_location="cpu", weights_only=False)
        set_rng_state(state["rng"])
        if self.adv_state is not None and state.get("advantage_state") is not None:
            self.adv_state.load_state_dict(state["advantage_state"])
        return int(state["step"]), dict(state.get("before") or {})

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
            before = evaluate(self.policy, self.task, self.rewards, cfg)
            logger.log(0, {f"eval/{k}": v for k, v in before.items()})
        try:
            with TrainingProgress(cfg.train.steps, start_step=start, enabled=cfg.log.progress,
                                  description=f"mmrl {self.task.name}") as progress:
                for step in range(start + 1, cfg.train.steps + 1):
                    t0 = time.perf_counter()
                    batch, metrics = self.rollout_step(step)
                    t_rollout = time.perf_counter() - t0
                    metrics.update(self.update(batch, step))
                    if should_reset_reference(step, cfg.algo.ref_reset_every):
                        self.policy.reset_reference()
                    metrics["step_time"] = time.perf_counter() - t0
                    metrics["rollout_time"] = t_rollout
                    if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.train.steps:
                        metrics.update({f"eval/{k}": v for k, v in
                                        evaluate(self.policy, self.task, self.rewards, cfg).items()})
                    if step % max(cfg.log.log_every, 1) == 0 or step == cfg.train.steps:
                        logger.log(step, metrics)
                    if cfg.log.save_rollouts_every and step % cfg.log.save_rollouts_every == 0:
                        logger.save_rollouts(step, self._rollout_records(batch))
                    progress.update(step, reward=metrics["reward"], step_time=metrics["step_time"])
                    if cfg.log.save_every and step % cfg.log.save_every == 0 and step < cfg.train.steps:
                        self.save(step, before)
            self.save(cfg.train.steps, before)
            after = evaluate(self.policy, self.task, self.rewards, cfg)
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
        records = []
        k = min(self.cfg.log.num_rollouts_to_save, len(batch))
        for i in range(k):
            ex = batch.examples[i]
            records.append({
                "image": ex.get("image"),
                "visualization": self.task.visualize(ex, batch.completions[i]),
                "prompt": ex.get("question", ""),
                "answer": str(ex.get("answer", "")),
                "completion": batch.completions[i],
                "rewards": {name: float(v[i]) for name, v in batch.reward_components.items()},
                "reward": float(batch.rewards[i]),
                "advantage": float(batch.advantages[i]),
            })
        return records


def _zero_std_fraction(rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Fraction of groups whose rewards are all equal (they carry no GRPO signal)."""
    groups = torch.unique(group_ids)
    flat = sum(1 for g in groups if rewards[group_ids == g].unique().numel() == 1)
    return flat / max(len(groups), 1)
