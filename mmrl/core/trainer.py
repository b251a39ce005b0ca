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
from ..registry import ADVANTAGES, TASKS, load_plugins
from ..task import Task
from .advantages import compute_advantages, make_advantage_state
from .checkpoint import CheckpointManager, rng_state, set_rng_state
from ..media.perturb import PERTURBATIONS, perturb_example, perturbation_options
from .curriculum import augment_flat_groups, scaffold
from .logging import RunLogger, TrainingProgress, print_before_after
from .objective import Objective, ObjectiveConfig, count_sequences, kl_penalty
from .reward_aggregation import aggregate_rewards
from .rewards import make_reward_computer
from .samplers import make_sampler, step_seed
from .schedules import kl_coef_at, should_reset_reference
from .selection import SELECTIONS, dynamic_sampling, group_has_variance
from .shaping import overlong_mask, soft_overlong_penalty
from .rollouts import Rollouts


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


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


def evaluate(policy, task: Task, rewards, cfg, num_examples: int | None = None,
             gallery_dir: Path | None = None, grid_path: Path | None = None) -> dict[str, float]:
    """Held-out mean reward, each reward component and the task's metrics on the eval split;
    with ``gallery_dir``, also an HTML + PNG gallery of the first predictions (right/wrong);
    with ``grid_path`` and a generator (images as completions), a PNG grid of the samples."""
    examples_all = task.examples("eval")
    n = min(num_examples or cfg.eval.num_examples, len(examples_all))
    examples = with_coordinates(policy, [examples_all[i] for i in range(n)])
    prompts = [task.prompt(ex) for ex in examples]
    batch = policy.rollout(examples, prompts, cfg.eval.num_generations, _eval_sampling(cfg),
                           need_old_logps=False, need_ref_logps=False)
    total, comps, _ = rewards(batch.completions, batch.examples, group_ids=batch.group_ids)
    out = {"reward": float(total.mean())}
    out.update({f"reward/{k}": float(v.mean()) for k, v in comps.items()})
    out.update({k: float(v) for k, v in task.metrics(batch.completions, batch.examples).items()})
    if gallery_dir is not None:
        from .gallery import write_gallery

        best = sum(w for w in rewards.weights.values() if w > 0)
        write_gallery(gallery_dir, task, batch.completions, batch.examples, total.tolist(), comps, best)
    if grid_path is not None and batch.completions and hasattr(batch.completions[0], "convert"):
        from .gallery import save_image_grid

        save_image_grid(grid_path, batch.completions, [task.prompt(ex) for ex in batch.examples], total.tolist())
    return out


def with_coordinates(policy, examples: list[dict]) -> list[dict]:
    """Copies of ``examples`` that say how to read the policy's coordinates: ``pred_space`` (the
    space its box answers are in) and ``frame`` (the image's original and resized sizes), so box
    rewards and metrics compare in original pixels (``mmrl.media.coords.prediction_to_pixels``).
    Unchanged for policies without a coordinate frame or examples without ``image_size``."""
    if not hasattr(policy, "coordinate_frame"):
        return list(examples)
    out = []
    for ex in examples:
        if isinstance(ex, dict) and ex.get("image_size") is not None:
            ex = {**ex, "pred_space": policy.box_space, "frame": policy.coordinate_frame(ex["image_size"])}
        out.append(ex)
    return out


def _eval_sampling(cfg) -> SimpleNamespace:
    """Rollout settings for evaluation: the training budget, the eval temperature."""
    return SimpleNamespace(mode="eval", temperature=cfg.eval.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                           max_completion_length=cfg.rollout.max_completion_length,
                           batch_size=cfg.rollout.batch_size)


class Trainer:
    """Runs the loop of the module docstring for one policy (see :class:`~mmrl.core.policy.Policy`)."""

    def __init__(self, cfg, policy, task: Task | None = None, run_dir: Path | None = None):
        self.cfg = cfg
        self.policy = policy
        self.task = task or build_task(cfg)
        self.rewards = make_reward_computer(self.task, cfg.task)
        self.run_dir = Path(run_dir or Path(cfg.log.output_dir) / run_name(cfg))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt = CheckpointManager(self.run_dir / "checkpoints", keep=cfg.log.save_total_limit)
        self.objective_cfg = ObjectiveConfig.from_algo(cfg.algo, max_completion_length=cfg.rollout.max_completion_length)
        self.adv_state = make_advantage_state(cfg.algo.advantage)
        self.estimator_inputs = ADVANTAGES.get(cfg.algo.advantage).estimator_inputs
        self.train_examples = self.task.examples("train")
        sizes = dict(getattr(self.train_examples, "source_sizes", None) or {self.task.name: len(self.train_examples)})
        self.source_ids = {name: i for i, name in enumerate(sizes)}
        self.sampler = make_sampler(cfg.data.sampler, sizes, cfg.train.prompts_per_step, cfg.train.seed,
                                    **dict(cfg.data.sampler_kwargs))
        self.policy_kl: float | None = None  # SPO: KL(pi_old || pi_new) of the last update
        if cfg.data.perturbation not in (None, "random", *PERTURBATIONS):
            raise ValueError(f"unknown data.perturbation {cfg.data.perturbation!r}; valid: "
                             f"{', '.join(PERTURBATIONS)}, random")
        self.perturbation_kwargs = perturbation_options(dict(cfg.data.perturbation_kwargs))
        self._check_selection_config()

    def _check_selection_config(self) -> None:
        algo, n = self.cfg.algo, self.cfg.rollout.num_generations
        if algo.selection not in SELECTIONS:
            raise ValueError(f"unknown algo.selection {algo.selection!r}; valid values: {', '.join(SELECTIONS)}")
        if not 0 <= algo.off_policy_guidance < n:
            raise ValueError(
                f"algo.off_policy_guidance={algo.off_policy_guidance} reference completions per group must leave "
                f"at least one on-policy sample of rollout.num_generations={n}")
        if algo.off_policy_guidance and not hasattr(self.policy, "rollout_given"):
            raise ValueError("algo.off_policy_guidance needs a policy with rollout_given() (teacher-forced samples)")
        unknown = set(algo.scaffold_kwargs) - {"exempt_frac", "solved_reward"}
        unknown |= {f"difficulty_augmentation_kwargs.{k}" for k in
                    set(algo.difficulty_augmentation_kwargs) - {"noise_std", "solved_reward"}}
        if unknown:
            raise ValueError(f"unknown option(s) {sorted(unknown)} in algo.scaffold_kwargs / "
                             "algo.difficulty_augmentation_kwargs (valid: exempt_frac, solved_reward, noise_std)")

    # -- one RL step ------------------------------------------------------------------------------
    def _sample(self, examples: list[dict], n: int, step: int) -> Rollouts:
        """Roll out ``n`` samples of each example (group i = ``examples[i]``) and score them."""
        cfg = self.cfg
        prompts = [self.task.build_prompt(ex) for ex in examples]
        batch = self.policy.rollout(
            examples, prompts, n, cfg.rollout,
            need_old_logps=cfg.algo.num_iterations > 1, need_ref_logps=cfg.algo.beta > 0,
        )
        return self._score(batch)

    def _score(self, batch: Rollouts) -> Rollouts:
        """Rewards (plus DAPO's soft overlong penalty) into ``batch``; the reward computer's
        stats (unparsable fractions) accumulate in ``self._reward_stats`` for the step's metrics."""
        cfg = self.cfg
        total, comps, stats = self.rewards(batch.completions, batch.examples, group_ids=batch.group_ids)
        if cfg.algo.soft_overlong_buffer:
            lengths = batch.action_mask.sum(1)
            comps["overlong_penalty"] = soft_overlong_penalty(
                lengths, cfg.rollout.max_completion_length, cfg.algo.soft_overlong_buffer, cfg.algo.soft_overlong_penalty)
            if batch.off_policy is not None:  # a reference completion is never penalised for length
                comps["overlong_penalty"] = comps["overlong_penalty"] * (~batch.off_policy).float()
            total = total + comps["overlong_penalty"]
        batch.rewards, batch.reward_components = total, comps
        for k, v in stats.items():
            self._reward_stats[k] = self._reward_stats.get(k, 0.0) + v
        self._reward_calls += 1
        return batch

    def _solved(self, kwargs: dict) -> Any:
        """Which rewards count as "solved" for Scaf-GRPO / augmentation: >= ``solved_reward``
        (default: every positively weighted reward at its maximum of 1)."""
        default = sum(w for w in self.rewards.weights.values() if w > 0)
        threshold = float(kwargs.get("solved_reward", default)) - 1e-6
        return lambda rewards: rewards >= threshold

    def _generate(self, step: int, round: int) -> tuple[Rollouts, list[int], dict[str, float]]:
        """One generation round: the sampler's prompts, on-policy samples, Scaf-GRPO hints,
        difficulty-aware re-rolls, then TempSamp-R1 reference completions, all scored."""
        cfg, algo = self.cfg, self.cfg.algo
        indices = self.sampler.indices(step, round)
        examples = [{**self.train_examples[i], "_index": i} for i in indices]
        if cfg.data.perturbation:
            examples = self._perturb(examples, step, round)
        examples = with_coordinates(self.policy, examples)
        k_ref = algo.off_policy_guidance
        n_on = cfg.rollout.num_generations - k_ref
        batch = self._sample(examples, n_on, step)
        metrics: dict[str, float] = {}
        regenerate = lambda exs, n: self._sample(list(exs), n, step)  # noqa: E731
        if algo.scaffold and step > float(algo.scaffold_kwargs.get("exempt_frac", 0.0)) * cfg.train.steps:
            batch, stats = scaffold(batch, self._solved(algo.scaffold_kwargs), self.task.hints, regenerate, n_on)
            metrics.update(stats)
        if algo.difficulty_augmentation:
            kw = algo.difficulty_augmentation_kwargs
            rng = np.random.default_rng(step_seed(cfg.train.seed, step, salt=200 + round))
            augment = lambda ex, d: self.task.augment(ex, d, rng, **({"noise_std": kw["noise_std"]} if "noise_std" in kw else {}))  # noqa: E731
            batch, stats = augment_flat_groups(batch, self._solved(kw), augment, regenerate, n_on)
            metrics.update(stats)
        if k_ref:
            batch = self._with_references(batch, examples, k_ref)
        return batch, indices, metrics

    def _perturb(self, examples: list[dict], step: int, round: int) -> list[dict]:
        """Vision Matters perturbations (``data.perturbation``), seeded by (step, round); the
        distractor / mixup partner is another training example's image."""
        data = self.cfg.data
        rng = np.random.default_rng(step_seed(self.cfg.train.seed, step, salt=300 + round))
        out = []
        for ex in examples:
            if rng.random() >= data.perturbation_prob:
                out.append(ex)
                continue
            kind = str(rng.choice(PERTURBATIONS)) if data.perturbation == "random" else data.perturbation
            other = None
            if kind != "rotation":
                other = self.train_examples[int(rng.integers(len(self.train_examples)))].get("image")
            out.append(perturb_example(ex, kind, rng, other, **self.perturbation_kwargs))
        return out

    def _with_references(self, batch: Rollouts, examples: list[dict], k: int) -> Rollouts:
        """TempSamp-R1: ``k`` reference completions (``Task.target``) join each group as
        off-policy samples, weighted by the objective's off-policy shaping."""
        cfg = self.cfg
        refs = [ex for ex in examples for _ in range(k)]
        given = self.policy.rollout_given(
            refs, [self.task.build_prompt(ex) for ex in refs], [self.task.target(ex) for ex in refs],
            need_old_logps=cfg.algo.num_iterations > 1, need_ref_logps=cfg.algo.beta > 0)
        given.group_ids = torch.arange(len(examples)).repeat_interleave(k)
        if batch.off_policy is None:
            batch.off_policy = torch.zeros(len(batch), dtype=torch.bool)
        return Rollouts.concat([batch, self._score(given)], renumber_groups=False)

    def rollout_step(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        cfg = self.cfg
        seed_everything(step_seed(cfg.train.seed, step))
        if hasattr(self.policy, "begin_step"):  # policies that seed by RL step (generators)
            self.policy.begin_step(step)
        self._reward_stats: dict[str, float] = {}
        self._reward_calls = 0
        extra: dict[str, float] = {}
        rounds: list[tuple[Rollouts, list[int]]] = []

        def generate(round: int) -> Rollouts:
            batch, indices, stats = self._generate(step, round)
            rounds.append((batch, indices))
            for k, v in stats.items():
                extra[k] = extra.get(k, 0.0) + v
            return batch

        if cfg.algo.selection == "dynamic_sampling":
            batch, _, stats = dynamic_sampling(generate, cfg.train.prompts_per_step, cfg.algo.max_num_gen_batches)
            extra.update(stats)
        else:
            batch = generate(0)
        first = rounds[0][0]  # the unfiltered first round: the honest estimate of the policy's reward
        if first.off_policy is not None and bool(first.off_policy.any()):
            # Reference completions (off-policy guidance) are not the policy's: report them apart.
            extra["reward/off_policy"] = float(first.rewards[first.off_policy].mean())
            first = first.select((~first.off_policy).nonzero().flatten())
        batch.advantages = self._advantages(batch)
        if cfg.algo.overlong_filter and batch.truncated is not None:
            batch.action_mask = batch.action_mask * overlong_mask(batch.truncated, len(batch))[:, None]
        lengths = first.action_mask.sum(1)
        metrics = {
            "reward": float(first.rewards.mean()),
            "reward_std": float(first.rewards.std()) if len(first) > 1 else 0.0,
            **{f"reward/{k}": float(v.mean()) for k, v in first.reward_components.items()},
            **{k: v / max(self._reward_calls, 1) for k, v in self._reward_stats.items()},  # mean over scoring calls
            "completion_length": float(lengths.mean()),
            "truncated_frac": float(first.truncated.float().mean()) if first.truncated is not None else 0.0,
            "zero_std_group_frac": _zero_std_fraction(first.rewards, first.group_ids),
            **extra,
        }
        metrics.update(self._observe(rounds, batch))
        return batch, metrics

    def _observe(self, rounds: list[tuple[Rollouts, list[int]]], trained: Rollouts) -> dict[str, float]:
        """Let the sampler learn from every generated group; groups left out of the trained
        batch (dynamic sampling) count with advantage 0, which is what they would have had."""
        trained_adv: dict[int, list[float]] = {}
        adv = trained.advantages if trained.advantages.dim() == 1 else trained.advantages.mean(-1)
        for i, ex in enumerate(trained.examples):
            trained_adv.setdefault(ex["_index"], []).append(float(adv[i]))
        metrics: dict[str, float] = {}
        for batch, indices in rounds:
            advantages = torch.zeros(len(batch))
            seen: dict[int, int] = {}
            for i, ex in enumerate(batch.examples):
                values = trained_adv.get(ex["_index"])
                j = seen.get(ex["_index"], 0)
                if values and j < len(values):
                    advantages[i] = values[j]
                seen[ex["_index"]] = j + 1
            metrics = self.sampler.observe(indices, batch.rewards, advantages, batch.group_ids, batch.completions)
        return metrics

    def _advantages(self, batch: Rollouts) -> torch.Tensor:
        """The configured estimator on the (optionally z-scored) rewards of ``batch``, with the
        extra inputs the estimator declared at registration (``register_advantage(inputs=...)``)."""
        algo = self.cfg.algo
        signal = batch.rewards
        if algo.reward_aggregation != "weighted_sum":
            weights = {**self.rewards.weights, **({"overlong_penalty": 1.0} if "overlong_penalty" in batch.reward_components else {})}
            signal = aggregate_rewards(batch.reward_components, weights, algo.reward_aggregation, group_ids=batch.group_ids)
        extra = dict(algo.advantage_kwargs)
        for name in self.estimator_inputs:
            if name not in extra:
                value = self._estimator_input(name, batch)
                if value is not None:
                    extra[name] = value
        if self.adv_state is not None:
            extra["state"] = self.adv_state
        return compute_advantages(algo.advantage, signal, batch.group_ids, scale_rewards=algo.scale_rewards, **extra)

    def _estimator_input(self, name: str, batch: Rollouts) -> Any:
        """One declared estimator input for ``batch`` (None = not available: left out)."""
        if name == "lengths":
            return batch.action_mask.sum(1)
        if name == "prompt_keys":  # SPO's per-prompt value tracker keys on the example index
            return [str(ex["_index"]) for ex in batch.examples]
        if name == "task_ids":  # Stratified GRPO: the examples' data sources (a mixture's tasks)
            if len(self.source_ids) < 2:
                return None
            return torch.tensor([self.source_ids[ex["source"]] for ex in batch.examples])
        if name == "r_max":  # rewards lie in [0, 1]: the best total is the sum of positive weights
            return float(sum(w for w in self.rewards.weights.values() if w > 0))
        if name == "policy_kl":
            return self.policy_kl
        raise ValueError(f"advantage estimator {self.cfg.algo.advantage!r} needs input {name!r}, which the "
                         "trainer does not provide (known: lengths, prompt_keys, task_ids, r_max, policy_kl)")

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
        track_kl = self._tracks_policy_kl()
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
                metrics = self.policy.train_step(
                    sub, objective,
                    num_tokens=float(sub.action_mask.sum()), num_seqs=count_sequences(sub.action_mask),
                )
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        out = {k: v / count for k, v in sums.items()}
        if cfg.algo.beta > 0:
            out["kl_coef"] = objective.cfg.beta
        if track_kl:
            after = self.policy.score(batch, reference=False)
            self.policy_kl = masked_mean(kl_penalty(before, after, "k3"), batch.action_mask)
            out["policy_kl"] = self.policy_kl
        return out

    def _tracks_policy_kl(self) -> bool:
        """An estimator that declares a ``policy_kl`` input (SPO's KL-adaptive forgetting) needs
        KL(pi_old || pi_new) of each update: two extra scoring passes, skipped with a fixed ``rho``."""
        algo = self.cfg.algo
        return ("policy_kl" in self.estimator_inputs and "rho" not in algo.advantage_kwargs
                and hasattr(self.policy, "score"))

    # -- checkpoints ------------------------------------------------------------------------------
    def save(self, step: int, before: dict[str, float]) -> None:
        def write(d: Path) -> None:
            self.policy.save(d / "policy")
            torch.save({"step": step, "rng": rng_state(), "before": before,
                        "advantage_state": self.adv_state.state_dict() if self.adv_state is not None else None,
                        "sampler_state": self.sampler.state_dict(), "policy_kl": self.policy_kl},
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
        self.sampler.load_state_dict(state.get("sampler_state") or {})
        self.policy_kl = state.get("policy_kl")
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
            before = evaluate(self.policy, self.task, self.rewards, cfg, grid_path=self.run_dir / "samples_before.png")
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
            after = evaluate(self.policy, self.task, self.rewards, cfg, grid_path=self.run_dir / "samples_after.png")
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
                "prompt": ex.get("question", ex.get("prompt", "")),  # VLM question, or a generator prompt
                "answer": str(ex.get("answer", "")),
                "completion": batch.completions[i],
                "rewards": {name: float(v[i]) for name, v in batch.reward_components.items()},
                "reward": float(batch.rewards[i]),
                "advantage": float(batch.advantages[i]),
            })
        return records


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    mask = mask.to(x.dtype)
    return float((x * mask).sum() / mask.sum().clamp(min=1))


def _zero_std_fraction(rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Fraction of groups whose rewards are all equal (they carry no GRPO signal)."""
    variance = group_has_variance(rewards, group_ids)
    return sum(not v for v in variance.values()) / max(len(variance), 1)
