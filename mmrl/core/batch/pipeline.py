"""Building one step's trained batch: every stage, in order, in one place.

    for each generation round (one, or DAPO dynamic sampling's refills):
        1. prompts      the prompt sampler's example indices (data.sampler)             .prompts
        2. perturb      Vision Matters perturbations (data.perturbation), drawn here,
                        applied by the policy                                           .perturbation
        3. prepare      the policy records how to read its answers (coordinate frames)
        4. rollout      n samples per prompt (n episodes of an environment task, every step a row:
                        the task runs them, mmrl.core.episodes), scored by the rewards
                        (+ DAPO's soft overlong penalty; served rewards are awaited after
                        the trainer's log-prob passes)                                  .scoring
        5. hints        Scaf-GRPO re-rolls unsolved groups with tiered hints (algo.scaffold)   .guidance
        6. re-rolls     DeepVideo-R1 re-rolls all-solved / all-failed groups harder / easier   .guidance
        7. temporal     T-GRPO: samples on shuffled frames; a bonus where order helped
                        (algo.temporal_grpo)                                            .temporal
        8. references   TempSamp-R1 adds teacher-forced reference completions
                        (algo.off_policy_guidance)                                      .references
    9. selection        which groups are kept (algo.selection: none | dynamic_sampling)  .selection
    10. advantages      reward aggregation (algo.reward_aggregation), then the estimator with the
                        inputs it declared (a table of named inputs)                    .estimation
    11. overlong filter truncated samples leave the loss (algo.overlong_filter)          .shaping
    12. observe         the prompt sampler learns from every generated group              .metrics

With several processes each rank runs stages 1-9 on its contiguous share of the step's prompts
(whole groups; its own seeds; dynamic sampling fills the rank's share of the kept groups), and
stages 10-12 run on the whole batch gathered by :mod:`.whole`, identically on every rank.

Each stage is a function of the sibling module named on its right; this module only orders them,
seeds them, and collects their metrics. Their options are checked at setup (:mod:`.checks`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from mmrl.registry import ADVANTAGES, SELECTIONS

from .. import distributed as dist
from ..advantages import estimator_options, make_advantage_state
from ..episodes import is_episodic, rollout_task
from ..rollouts import Rollouts
from ..seeding import stream_seed
from .checks import check_episodic, check_stages
from .estimation import RunFacts, batch_advantages, check_estimator_inputs
from .guidance import augment_flat_groups, scaffold
from .metrics import observe, rollout_metrics
from .perturbation import perturb_examples
from .prompts import make_sampler
from .references import with_references
from .scoring import StepScorer, complete_logps
from .shaping import overlong_mask
from .temporal import temporal_contrast
from .whole import gather_whole


class BatchBuilder:
    """The stages of the module docstring for one run (``cfg``, ``task``, ``policy``, ``rewards``)."""

    def __init__(self, cfg, task, policy, rewards):
        self.cfg, self.task, self.policy, self.rewards = cfg, task, policy, rewards
        algo, data = cfg.algo, cfg.data
        self.train_examples = task.examples("train")
        sizes = task.source_sizes(self.train_examples)
        self.sampler = make_sampler(data.sampler, sizes, cfg.train.prompts_per_step, cfg.train.seed,
                                    **dict(data.sampler_kwargs))
        self.select = SELECTIONS.get(algo.selection, "algo.selection")
        self.estimator_inputs = ADVANTAGES.get(algo.advantage, "algo.advantage").estimator_inputs
        self.estimator_options = estimator_options(algo.advantage, algo.advantage_kwargs, algo.scale_rewards)
        self.adv_state = make_advantage_state(algo.advantage)
        self.facts = RunFacts(dict(rewards.weights), {name: i for i, name in enumerate(sizes)})
        # the trainer's log-probs are computed when the batch is trained, not when it is generated
        # (asynchronous training: the generator thread never runs the trained module)
        self.defer_logps = False
        self.score = StepScorer(rewards, policy.max_actions, algo.soft_overlong_buffer, algo.soft_overlong_penalty)
        check_stages(cfg, policy)
        check_estimator_inputs(algo.advantage, self.estimator_inputs, self.estimator_options)
        if is_episodic(task):
            check_episodic(cfg, policy)

    @property
    def policy_kl(self) -> float | None:
        """KL(pi_old || pi_new) of the last update, when tracked (set by the trainer)."""
        return self.facts.policy_kl

    @policy_kl.setter
    def policy_kl(self, value: float | None) -> None:
        self.facts.policy_kl = value

    @property
    def tracks_policy_kl(self) -> bool:
        """An estimator that declares a ``policy_kl`` input (SPO's KL-adaptive forgetting) needs
        KL(pi_old || pi_new) of each update: two extra scoring passes, skipped with a fixed ``rho``."""
        return "policy_kl" in self.estimator_inputs and "rho" not in self.cfg.algo.advantage_kwargs

    # -- the step ---------------------------------------------------------------------------------
    def build(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        """The trained batch of ``step`` (advantages set) and the step's rollout metrics."""
        cfg, algo = self.cfg, self.cfg.algo
        self.score.start()
        extra: dict[str, float] = {}
        rounds: list[tuple[Rollouts, list[int]]] = []

        def generate(round: int) -> Rollouts:
            batch, indices, stats = self._generate(step, round)
            rounds.append((batch, indices))
            for k, v in stats.items():
                extra[k] = extra.get(k, 0.0) + v
            return batch

        share = len(range(*dist.shard_bounds(cfg.train.prompts_per_step)))  # this rank's groups
        batch, _, stats = self.select(generate, share, algo.max_num_gen_batches)                 # 9
        extra.update(stats)
        extra.update(self.policy.take_rollout_stats())  # each rank's counters, summed over ranks
        whole = gather_whole(batch, rounds, extra, self.score.stats, self.score.calls,
                             self.task.metric_keys if is_episodic(self.task) else ())
        advantages = self._advantages(whole.trained)                                             # 10
        whole.trained.advantages = advantages
        batch.advantages = advantages if whole.trained is batch else advantages[whole.start:whole.stop]
        if algo.overlong_filter and batch.truncated is not None:                                 # 11
            batch.action_mask = batch.action_mask * overlong_mask(batch.truncated, len(batch))[:, None]
        self.score.stats, self.score.calls = whole.reward_stats, whole.reward_calls
        metrics = rollout_metrics(whole.rounds[0][0], self.score.mean_stats(), whole.extra)
        if is_episodic(self.task):
            metrics.update(self.task.rollout_metrics(whole.rounds[0][0]))
        metrics.update(observe(self.sampler, whole.rounds, whole.trained))                       # 12
        return batch, metrics

    def _generate(self, step: int, round: int) -> tuple[Rollouts, list[int], dict[str, float]]:
        """Stages 1-8 for one generation round."""
        cfg, algo, data = self.cfg, self.cfg.algo, self.cfg.data
        rng, salt = np.random.default_rng, dist.rank_salt()  # each stage's stream (core.seeding.STREAMS)
        indices = dist.shard(self.sampler.indices(step, round))  # 1: whole groups, this rank's prompts
        examples = [{**self.train_examples[i], "_index": i} for i in indices]
        if data.perturbation:                                                                     # 2
            examples = perturb_examples(examples, self.policy, data.perturbation, data.perturbation_prob,
                                        data.perturbation_kwargs, self.train_examples,
                                        rng(stream_seed(cfg.train.seed, step, "perturbation", round, salt)))
        examples = self.policy.prepare_examples(examples)                                         # 3
        k_ref = algo.off_policy_guidance
        n_on = cfg.rollout.num_generations - k_ref
        batch = self.sample(examples, n_on)                                                       # 4
        metrics: dict[str, float] = {}
        regenerate = lambda exs, n: self.sample(list(exs), n)  # noqa: E731
        if algo.scaffold and step > float(algo.scaffold_kwargs.get("exempt_frac", 0.0)) * cfg.train.steps:  # 5
            batch, stats = scaffold(batch, self._solved(algo.scaffold_kwargs), self.task.hints, regenerate, n_on)
            metrics.update(stats)
        if algo.difficulty_augmentation:                                                          # 6
            kw = algo.difficulty_augmentation_kwargs
            noise = rng(stream_seed(cfg.train.seed, step, "difficulty_augmentation", round, salt))
            options = {"noise_std": kw["noise_std"]} if "noise_std" in kw else {}
            augment = lambda ex, d: self.task.augment(ex, d, noise, **options)  # noqa: E731
            batch, stats = augment_flat_groups(batch, self._solved(kw), augment, regenerate, n_on)
            metrics.update(stats)
        if algo.temporal_grpo:                                                                    # 7
            metrics.update(temporal_contrast(batch, self.policy, self.task, self.rewards, algo.temporal_grpo_kwargs,
                                             rng(stream_seed(cfg.train.seed, step, "temporal_shuffle", round, salt))))
        if k_ref:                                                                                 # 8
            batch = with_references(batch, examples, k_ref, self.policy, self.task, self.score, *self.needed_logps())
        return batch, indices, metrics

    def sample(self, examples: list[dict], n: int) -> Rollouts:
        """Roll out ``n`` samples of each example (group i = ``examples[i]``) and score them."""
        need_old, need_ref = self.needed_logps()
        # a policy that re-scores batches computes the log-probs while served rewards are computed
        later = "scoring" in self.policy.capabilities and not is_episodic(self.task)
        batch = rollout_task(self.policy, self.task, examples, n, "train", need_old_logps=need_old and not later,
                             need_ref_logps=need_ref and not later)
        if self.defer_logps:
            return self.score(batch)
        correct = self.cfg.algo.vllm_importance_sampling_correction
        return self.score(batch, meanwhile=lambda: complete_logps(batch, self.policy, need_old, need_ref, correct))

    def needed_logps(self) -> tuple[bool, bool]:
        """Whether the batch needs the trainer's old and reference log-probs now: several
        iterations, a KL term (a policy that re-scores batches computes them while the rewards
        are computed, others in the rollout); neither when they are computed when the batch is
        trained (``defer_logps``: asynchronous training)."""
        algo = self.cfg.algo
        return (algo.num_iterations > 1 and not self.defer_logps, algo.beta > 0 and not self.defer_logps)

    def _advantages(self, batch: Rollouts):
        """The configured estimator's advantages of ``batch`` (stage 10)."""
        algo = self.cfg.algo
        return batch_advantages(batch, algo.advantage, algo.reward_aggregation, self.estimator_inputs,
                                self.estimator_options, self.adv_state, self.facts)

    def _solved(self, kwargs: dict) -> Callable[[Any], Any]:
        """Which rewards count as "solved" for Scaf-GRPO / augmentation: >= ``solved_reward``
        (default: every positively weighted reward at its maximum of 1)."""
        default = sum(w for w in self.rewards.weights.values() if w > 0)
        threshold = float(kwargs.get("solved_reward", default)) - 1e-6
        return lambda rewards: rewards >= threshold

    # -- checkpoint state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"advantage_state": self.adv_state.state_dict() if self.adv_state is not None else None,
                "sampler_state": self.sampler.state_dict(), "policy_kl": self.policy_kl}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.adv_state is not None and state.get("advantage_state") is not None:
            self.adv_state.load_state_dict(state["advantage_state"])
        self.sampler.load_state_dict(state.get("sampler_state") or {})
        self.policy_kl = state.get("policy_kl")
