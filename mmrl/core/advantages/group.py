"""The group-baseline estimators: GRPO, Dr. GRPO and RLOO (papers in each docstring)."""

from __future__ import annotations

from torch import Tensor

from mmrl.registry import register_advantage

from .base import as_float_tensor, constant_groups, finalize_advantages, group_stats

@register_advantage("grpo")
def grpo(
    rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6, scale_rewards: bool = True
) -> Tensor:
    """GRPO outcome advantage.

    From "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models"
    (Shao et al., 2024):

        A_i = (r_i - mean_g(r)) / (std_g(r) + eps)

    with the unbiased sample std of the sample's group g. With ``scale_rewards=False`` the std
    division is dropped, ``A_i = r_i - mean_g(r)`` (the Dr. GRPO fix, exposed as an option as TRL
    does). A group whose rewards are all equal, including a group of size 1, gets exactly 0
    (:func:`constant_groups`; statistics in float64).
    """
    mean, std, _ = group_stats(rewards, group_ids)
    centred = as_float_tensor(rewards).to(mean.dtype) - mean
    adv = centred / (std + eps) if scale_rewards else centred
    return finalize_advantages(adv, rewards, constant_groups(rewards, group_ids))


@register_advantage("dr_grpo")
def dr_grpo(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Dr. GRPO advantage: the group mean baseline without std normalisation.

    From "Understanding R1-Zero-Like Training: A Critical Perspective" (Liu et al., 2025), which
    shows that dividing by the group std up-weights prompts that are too easy or too hard:

        A_i = r_i - mean_g(r)

    An all-equal group gets exactly 0.
    """
    mean, _, _ = group_stats(rewards, group_ids)
    return finalize_advantages(as_float_tensor(rewards).to(mean.dtype) - mean, rewards, constant_groups(rewards, group_ids))


@register_advantage("rloo")
def rloo(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE leave-one-out advantage.

    From "Buy 4 REINFORCE Samples, Get a Baseline for Free!" (Kool et al., 2019) and "Back to
    Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs"
    (Ahmadian et al., 2024). Each sample's baseline is the mean of the *other* samples of its
    group, which keeps the estimator unbiased:

        A_i = r_i - mean_{j in g, j != i} r_j = n / (n - 1) * (r_i - mean_g(r))

    A group of size 1 has no other sample and gets advantage 0 (verl's loop version gives it
    ``r``: a lone sample has no baseline, so mmrl gives it no signal); an all-equal group gets
    exactly 0.
    """
    mean, _, count = group_stats(rewards, group_ids)
    centred = as_float_tensor(rewards).to(mean.dtype) - mean
    # For n == 1, centred is exactly 0, so clamping the denominator gives 0 rather than inf*0.
    return finalize_advantages(centred * count / (count - 1).clamp(min=1), rewards, constant_groups(rewards, group_ids))
