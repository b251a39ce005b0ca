"""Setup-time checks of the batch stages' options against the task and what the policy can do:
a run that cannot work stops before its first rollout, naming the key to change."""

from __future__ import annotations

from ..seeding import STREAMS
from .perturbation import check_perturbation
from .references import check_references
from .temporal import check_temporal_grpo


def check_stages(cfg, policy) -> None:
    """The stages' options (``algo.*``, ``data.perturbation*``) against ``policy.capabilities``."""
    algo, data = cfg.algo, cfg.data
    check_perturbation(data.perturbation, data.perturbation_kwargs, policy)
    if not 1 <= algo.max_num_gen_batches <= STREAMS["perturbation"][1]:
        raise ValueError(f"algo.max_num_gen_batches={algo.max_num_gen_batches}: use 1 to {STREAMS['perturbation'][1]}")
    check_references(algo.off_policy_guidance, cfg.rollout.num_generations, policy)
    check_temporal_grpo(algo.temporal_grpo, algo.temporal_grpo_kwargs, policy)
    unknown = set(algo.scaffold_kwargs) - {"exempt_frac", "solved_reward"}
    unknown |= {f"difficulty_augmentation_kwargs.{k}" for k in
                set(algo.difficulty_augmentation_kwargs) - {"noise_std", "solved_reward"}}
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)} in algo.scaffold_kwargs / "
                         "algo.difficulty_augmentation_kwargs (valid: exempt_frac, solved_reward, noise_std)")


def check_episodic(cfg, policy) -> None:
    """An environment task's rows are the steps of episodes: the stages that re-roll, rewrite or
    inject single completions of an example do not apply to them."""
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
