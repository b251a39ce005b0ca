"""Building one step's trained batch: every stage, in order, in one place.

    for each generation round (one, or DAPO dynamic sampling's refills):
        1. prompts      the prompt sampler's example indices (data.sampler)
        2. perturb      Vision Matters perturbations (data.perturbation), a task hook
        3. prepare      the policy records how to read its answers (coordinate frames)
        4. rollout      n samples per prompt (n episodes of an environment task, every step a row;
                    mmrl.core.episodes), scored by the rewards (+ DAPO's soft overlong penalty)
        5. hints        Scaf-GRPO re-rolls unsolved groups with tiered hints (algo.scaffold)
        6. re-rolls     DeepVideo-R1 re-rolls all-solved / all-failed groups harder / easier
        7. references   TempSamp-R1 adds teacher-forced reference completions (algo.off_policy_guidance)
        7b. temporal    T-GRPO: samples on shuffled frames; a bonus where order helped (algo.temporal_grpo)
    8. selection        which groups are kept (algo.selection: none | dynamic_sampling)
    9. advantages       reward aggregation (algo.reward_aggregation), then the estimator with the
                        inputs it declared (lengths, prompt keys, task ids, r_max, policy KL)
    10. overlong filter truncated samples leave the loss (algo.overlong_filter)
    11. observe         the prompt sampler learns from every generated group

With several processes each rank runs stages 1-8 on its contiguous share of the step's prompts
(whole groups; its own seeds; dynamic sampling fills the rank's share of the kept groups), and
stages 9-11 run on the whole batch gathered by :mod:`.whole`, identically on every rank.

The stage functions live in the sibling modules (prompts, guidance, selection, aggregation,
shaping); this module only orders them and collects their metrics.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from mmrl.registry import ADVANTAGES, PERTURBATIONS, SELECTIONS

from .. import distributed as dist
from ..advantages import compute_advantages, estimator_options, make_advantage_state
from ..episodes import episode_metrics, is_episodic, rollout_task
from ..rollouts import Rollouts
from ..seeding import STREAMS, stream_seed
from ...options import check_options
from .aggregation import aggregate_rewards
from .guidance import augment_flat_groups, scaffold
from .prompts import make_sampler
from .selection import group_has_variance
from .shaping import overlong_mask, soft_overlong_penalty
from .temporal import COMPARISONS, shuffle_frames, temporal_contrast_bonus
from .whole import gather_whole

TEMPORAL_GRPO_OPTIONS = ("alpha", "mu", "shuffled_generations", "reward", "comparison")


class BatchBuilder:
    """The stages of the module docstring for one run (``cfg``, ``task``, ``policy``, ``rewards``)."""

    def __init__(self, cfg, task, policy, rewards):
        self.cfg, self.task, self.policy, self.rewards = cfg, task, policy, rewards
        algo, data = cfg.algo, cfg.data
        self.train_examples = task.examples("train")
        sizes = dict(getattr(self.train_examples, "source_sizes", None) or {task.name: len(self.train_examples)})
        self.source_ids = {name: i for i, name in enumerate(sizes)}
        self.sampler = make_sampler(data.sampler, sizes, cfg.train.prompts_per_step, cfg.train.seed,
                                    **dict(data.sampler_kwargs))
        self.select = SELECTIONS.get(algo.selection, "algo.selection")
        estimator = ADVANTAGES.get(algo.advantage, "algo.advantage")
        self.estimator_inputs = estimator.estimator_inputs
        self.estimator_options = estimator_options(algo.advantage, algo.advantage_kwargs, algo.scale_rewards)
        self.adv_state = make_advantage_state(algo.advantage)
        self.policy_kl: float | None = None  # KL(pi_old || pi_new) of the last update, when tracked
        self._check(cfg, policy)
        if is_episodic(task):
            self._check_episodic(cfg, policy)

    @staticmethod
    def _check(cfg, policy) -> None:
        """Setup-time checks of the stages' options against what the policy can do."""
        algo, data, n = cfg.algo, cfg.data, cfg.rollout.num_generations
        if data.perturbation is not None:
            if "image_inputs" not in policy.capabilities:
                raise ValueError(f"data.perturbation={data.perturbation!r} perturbs input images; a "
                                 f"{type(policy).__name__} reads none")
            kinds = PERTURBATIONS.names() if data.perturbation == "random" else [data.perturbation]
            check_options([PERTURBATIONS.get(k, "data.perturbation") for k in kinds], data.perturbation_kwargs,
                          "data.perturbation_kwargs", f"the {data.perturbation} perturbation",
                          ("image", "boxes", "rng", "other"))
        elif data.perturbation_kwargs:
            raise ValueError(f"data.perturbation_kwargs {dict(data.perturbation_kwargs)} set without a "
                             "data.perturbation: set one (e.g. rotation, random) or remove the kwargs")
        if not 1 <= algo.max_num_gen_batches <= STREAMS["perturbation"][1]:
            raise ValueError(f"algo.max_num_gen_batches={algo.max_num_gen_batches}: use 1 to {STREAMS['perturbation'][1]}")
        if not 0 <= algo.off_policy_guidance < n:
            raise ValueError(
                f"algo.off_policy_guidance={algo.off_policy_guidance} reference completions per group must leave "
                f"at least one on-policy sample of rollout.num_generations={n}")
        if algo.off_policy_guidance and "teacher_forcing" not in policy.capabilities:
            raise ValueError(f"algo.off_policy_guidance needs a policy that teacher-forces given completions; "
                             f"a {type(policy).__name__} does not")
        if algo.temporal_grpo and "video_inputs" not in policy.capabilities:
            raise ValueError(f"algo.temporal_grpo shuffles the frames of clips; a {type(policy).__name__} reads none")
        unknown = set(algo.temporal_grpo_kwargs) - set(TEMPORAL_GRPO_OPTIONS)
        if unknown:
            raise ValueError(f"unknown algo.temporal_grpo_kwargs {sorted(unknown)} (valid: {', '.join(TEMPORAL_GRPO_OPTIONS)})")
        if algo.temporal_grpo_kwargs.get("comparison", "gt") not in COMPARISONS:
            raise ValueError(f"algo.temporal_grpo_kwargs.comparison: one of {', '.join(COMPARISONS)} (gt: the "
                             "paper's p > mu * p~; ge: Video-R1's code's >=)")
        unknown = set(algo.scaffold_kwargs) - {"exempt_frac", "solved_reward"}
        unknown |= {f"difficulty_augmentation_kwargs.{k}" for k in
                    set(algo.difficulty_augmentation_kwargs) - {"noise_std", "solved_reward"}}
        if unknown:
            raise ValueError(f"unknown option(s) {sorted(unknown)} in algo.scaffold_kwargs / "
                             "algo.difficulty_augmentation_kwargs (valid: exempt_frac, solved_reward, noise_std)")

    @staticmethod
    def _check_episodic(cfg, policy) -> None:
        """An environment task's rows are the steps of episodes: the stages that re-roll, rewrite
        or inject single completions of an example do not apply to them."""
        algo, data = cfg.algo, cfg.data
        unsupported = {"algo.scaffold": algo.scaffold, "algo.difficulty_augmentation": algo.difficulty_augmentation,
                       "algo.off_policy_guidance": algo.off_policy_guidance, "algo.temporal_grpo": algo.temporal_grpo,
                       "data.perturbation": data.perturbation}
        on = [k for k, v in unsupported.items() if v]
        if on:
            raise ValueError(f"{', '.join(on)} cannot be used with an environment task (its samples are "
                             "multi-step episodes); turn it off")
        if "multi_turn" not in policy.capabilities:
            raise ValueError(f"an environment task needs a policy that acts over several turns; a "
                             f"{type(policy).__name__} does not")

    @property
    def tracks_policy_kl(self) -> bool:
        """An estimator that declares a ``policy_kl`` input (SPO's KL-adaptive forgetting) needs
        KL(pi_old || pi_new) of each update: two extra scoring passes, skipped with a fixed ``rho``."""
        return "policy_kl" in self.estimator_inputs and "rho" not in self.cfg.algo.advantage_kwargs

    # -- the step ---------------------------------------------------------------------------------
    def build(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        """The trained batch of ``step`` (advantages set) and the step's rollout metrics."""
        cfg = self.cfg
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

        share = len(range(*dist.shard_bounds(cfg.train.prompts_per_step)))  # this rank's groups
        batch, _, stats = self.select(generate, share, cfg.algo.max_num_gen_batches)
        extra.update(stats)
        whole = gather_whole(batch, rounds, extra, self._reward_stats, self._reward_calls)
        advantages = self._advantages(whole.trained)
        whole.trained.advantages = advantages
        batch.advantages = advantages if whole.trained is batch else advantages[whole.start:whole.stop]
        if cfg.algo.overlong_filter and batch.truncated is not None:
            batch.action_mask = batch.action_mask * overlong_mask(batch.truncated, len(batch))[:, None]
        self._reward_stats, self._reward_calls = whole.reward_stats, whole.reward_calls
        metrics = self._rollout_metrics(whole.rounds[0][0], whole.extra)
        metrics.update(self._observe(whole.rounds, whole.trained))
        return batch, metrics

    def _generate(self, step: int, round: int) -> tuple[Rollouts, list[int], dict[str, float]]:
        """Stages 1-7 for one generation round."""
        cfg, algo = self.cfg, self.cfg.algo
        indices = dist.shard(self.sampler.indices(step, round))  # whole groups: this rank's prompts
        examples = [{**self.train_examples[i], "_index": i} for i in indices]
        if cfg.data.perturbation:
            examples = self._perturb(examples, step, round)
        examples = self.policy.prepare_examples(examples)
        k_ref = algo.off_policy_guidance
        n_on = cfg.rollout.num_generations - k_ref
        batch = self.sample(examples, n_on)
        metrics: dict[str, float] = {}
        regenerate = lambda exs, n: self.sample(list(exs), n)  # noqa: E731
        if algo.scaffold and step > float(algo.scaffold_kwargs.get("exempt_frac", 0.0)) * cfg.train.steps:
            batch, stats = scaffold(batch, self._solved(algo.scaffold_kwargs), self.task.hints, regenerate, n_on)
            metrics.update(stats)
        if algo.difficulty_augmentation:
            kw = algo.difficulty_augmentation_kwargs
            rng = np.random.default_rng(stream_seed(cfg.train.seed, step, "difficulty_augmentation", round, dist.rank_salt()))
            options = {"noise_std": kw["noise_std"]} if "noise_std" in kw else {}
            augment = lambda ex, d: self.task.augment(ex, d, rng, **options)  # noqa: E731
            batch, stats = augment_flat_groups(batch, self._solved(kw), augment, regenerate, n_on)
            metrics.update(stats)
        if algo.temporal_grpo:
            metrics.update(self._temporal_contrast(batch, step, round))
        if k_ref:
            batch = self._with_references(batch, examples, k_ref)
        return batch, indices, metrics

    def _temporal_contrast(self, batch: Rollouts, step: int, round: int) -> dict[str, float]:
        """T-GRPO (Video-R1): each group's question again on its clip's frames shuffled
        (``shuffled_generations`` samples, default half the group), scored by the accuracy reward
        (``reward``, default the task's first reward other than format); the bonus is added to
        ``batch``'s rewards in place, as the ``temporal_bonus`` component. Shuffled samples are
        not trained on. Groups whose examples hold no clip are not contrasted."""
        kw = self.cfg.algo.temporal_grpo_kwargs
        name = kw.get("reward") or next(n for n in self.rewards.weights if n != "format")
        n = batch.group_ids.bincount().max().item() if len(batch) else 0
        n_shuffled = int(kw.get("shuffled_generations", max(1, n // 2)))
        rng = np.random.default_rng(stream_seed(self.cfg.train.seed, step, "temporal_shuffle", round, dist.rank_salt()))
        firsts = {int(g): i for i, g in reversed(list(enumerate(batch.group_ids.tolist())))}
        groups, shuffled = [], []
        for g, i in sorted(firsts.items()):
            ex = batch.examples[i]
            clip = ex.get("video") if isinstance(ex, dict) else None
            if clip is None or getattr(clip, "frames", None) is None or len(clip.frames) < 2:
                continue
            groups.append(g)
            shuffled.append({**ex, "video": replace(clip, frames=shuffle_frames(clip.frames, rng))})
        bonus = torch.zeros(len(batch))
        metrics: dict[str, float] = {}
        if shuffled:
            twin = self.policy.rollout(shuffled, [self.task.build_prompt(ex) for ex in shuffled], n_shuffled,
                                       "train", need_old_logps=False, need_ref_logps=False)
            _, comps, _ = self.rewards(twin.completions, twin.examples, group_ids=twin.group_ids)
            twin_groups = torch.tensor(groups)[twin.group_ids]
            bonus, metrics = temporal_contrast_bonus(batch.reward_components[name], batch.group_ids, comps[name],
                                                     twin_groups, alpha=float(kw.get("alpha", 0.3)),
                                                     mu=float(kw.get("mu", 0.8)),
                                                     comparison=str(kw.get("comparison", "gt")))
        batch.rewards = batch.rewards + bonus
        batch.reward_components["temporal_bonus"] = bonus
        return metrics

    def sample(self, examples: list[dict], n: int) -> Rollouts:
        """Roll out ``n`` samples of each example (group i = ``examples[i]``) and score them."""
        algo = self.cfg.algo
        batch = rollout_task(self.policy, self.task, examples, n, "train",
                             need_old_logps=algo.num_iterations > 1, need_ref_logps=algo.beta > 0)
        return self._score(batch)

    def _score(self, batch: Rollouts) -> Rollouts:
        """Rewards (plus DAPO's soft overlong penalty) into ``batch``; the reward computer's stats
        (unparsable fractions) accumulate for the step's metrics."""
        cfg = self.cfg
        total, comps, stats = self.rewards(batch.completions, batch.examples, group_ids=batch.group_ids)
        if cfg.algo.soft_overlong_buffer:
            lengths = batch.action_mask.sum(1)
            comps["overlong_penalty"] = soft_overlong_penalty(
                lengths, self.policy.max_actions, cfg.algo.soft_overlong_buffer, cfg.algo.soft_overlong_penalty)
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

    def _perturb(self, examples: list[dict], step: int, round: int) -> list[dict]:
        """Vision Matters perturbations, seeded by (step, round); the distractor / mixup partner is
        another training example."""
        data = self.cfg.data
        kinds = PERTURBATIONS.names()
        rng = np.random.default_rng(stream_seed(self.cfg.train.seed, step, "perturbation", round, dist.rank_salt()))
        out = []
        for ex in examples:
            if rng.random() >= data.perturbation_prob:
                out.append(ex)
                continue
            kind = str(rng.choice(kinds)) if data.perturbation == "random" else data.perturbation
            other = None
            if PERTURBATIONS.get(kind).needs_other:
                other = self.train_examples[int(rng.integers(len(self.train_examples)))]
            out.append(self.task.perturb(ex, kind, rng, other, **dict(data.perturbation_kwargs)))
        return out

    def _with_references(self, batch: Rollouts, examples: list[dict], k: int) -> Rollouts:
        """TempSamp-R1: ``k`` reference completions (``Task.target``) join each group as
        off-policy samples, weighted by the objective's off-policy shaping."""
        algo = self.cfg.algo
        refs = [ex for ex in examples for _ in range(k)]
        given = self.policy.rollout_given(
            refs, [self.task.build_prompt(ex) for ex in refs], [self.task.target(ex) for ex in refs],
            need_old_logps=algo.num_iterations > 1, need_ref_logps=algo.beta > 0)
        given.group_ids = torch.arange(len(examples)).repeat_interleave(k)
        if batch.off_policy is None:
            batch.off_policy = torch.zeros(len(batch), dtype=torch.bool)
        return Rollouts.concat([batch, self._score(given)], renumber_groups=False)

    # -- advantages -------------------------------------------------------------------------------
    def _advantages(self, batch: Rollouts) -> torch.Tensor:
        """The configured estimator on the (optionally z-scored) rewards of ``batch``, with the
        extra inputs the estimator declared at registration (``register_advantage(inputs=...)``)."""
        algo = self.cfg.algo
        signal = batch.rewards
        if algo.reward_aggregation != "weighted_sum":
            weights = dict(self.rewards.weights)
            if "overlong_penalty" in batch.reward_components:
                weights["overlong_penalty"] = 1.0
            signal = aggregate_rewards(batch.reward_components, weights, algo.reward_aggregation, group_ids=batch.group_ids)
        extra = dict(self.estimator_options)
        for name in self.estimator_inputs:
            if name not in extra:
                value = self._estimator_input(name, batch)
                if value is not None:
                    extra[name] = value
        if self.adv_state is not None:
            extra["state"] = self.adv_state
        return compute_advantages(algo.advantage, signal, batch.group_ids, **extra)

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
        if name in ("episode_ids", "step_indices", "anchor_keys"):  # environment tasks' rows
            if not batch.examples or "episode_id" not in batch.examples[0]:
                return None
            if name == "anchor_keys":
                return [ex["anchor_key"] for ex in batch.examples]
            if name == "step_indices":
                return torch.tensor([ex["step_index"] for ex in batch.examples])
            # Unique across the gathered batch: a rank's (or refill round's) episode ids restart at 0.
            keys = list(zip(batch.group_ids.tolist(), (ex["episode_id"] for ex in batch.examples)))
            ids = {k: i for i, k in enumerate(dict.fromkeys(keys))}
            return torch.tensor([ids[k] for k in keys])
        raise ValueError(f"advantage estimator {self.cfg.algo.advantage!r} needs input {name!r}, which the "
                         "trainer does not provide (known: lengths, prompt_keys, task_ids, r_max, policy_kl, "
                         "episode_ids, step_indices, anchor_keys)")

    # -- metrics and the sampler's feedback -------------------------------------------------------
    def _rollout_metrics(self, first: Rollouts, extra: dict[str, float]) -> dict[str, float]:
        """Reward metrics of the unfiltered first round (the honest estimate of the policy's reward):
        injected reference completions are reported apart (``reward/off_policy``)."""
        if first.off_policy is not None and bool(first.off_policy.any()):
            extra["reward/off_policy"] = float(first.rewards[first.off_policy].mean())
            first = first.select((~first.off_policy).nonzero().flatten())
        lengths = first.action_mask.sum(1)
        variance = group_has_variance(first.rewards, first.group_ids)
        return {
            "reward": float(first.rewards.mean()),
            "reward_std": float(first.rewards.std()) if len(first) > 1 else 0.0,
            **{f"reward/{k}": float(v.mean()) for k, v in first.reward_components.items()},
            **{k: v / max(self._reward_calls, 1) for k, v in self._reward_stats.items()},  # mean over scoring calls
            "completion_length": float(lengths.mean()),
            "truncated_frac": float(first.truncated.float().mean()) if first.truncated is not None else 0.0,
            **({"rollout_timeouts": float(self.policy.take_generation_timeouts())}
               if self.cfg.rollout.max_time > 0 else {}),
            "zero_std_group_frac": sum(not v for v in variance.values()) / max(len(variance), 1),
            **episode_metrics(first),
            **extra,
        }

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

    # -- checkpoint state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"advantage_state": self.adv_state.state_dict() if self.adv_state is not None else None,
                "sampler_state": self.sampler.state_dict(), "policy_kl": self.policy_kl}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.adv_state is not None and state.get("advantage_state") is not None:
            self.adv_state.load_state_dict(state["advantage_state"])
        self.sampler.load_state_dict(state.get("sampler_state") or {})
        self.policy_kl = state.get("policy_kl")

