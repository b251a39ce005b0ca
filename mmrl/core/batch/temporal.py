"""T-GRPO's temporal contrast: the stage, and its bonus (a pure function).

From "Video-R1: Reinforcing Video Reasoning in MLLMs" (Feng et al., 2025). Each video question gets
two groups of answers: ``G`` on its frames in order and ``G~`` on the same frames shuffled (Video-R1
samples ``G~ = G / 2``, one permutation per clip). With ``p`` and ``p~`` the accuracy of the two
groups, a question whose ordered answers beat the shuffled ones by the margin ``mu`` earns a bonus
``alpha`` for each of its correct ordered answers; the bonus is added to the accuracy reward before
the group advantage is computed, so among the answers of a question that needs the frame order the
correct ones are pushed up further (alpha = 0.3 as the paper sets it; mu = 0.8 as its code)::

    r_i <- r_i + alpha   if  p > mu * p~  and  answer i is correct,   else  r_i

Read against Video-R1's code (``src/r1-v/src/open_r1/trainer/grpo_trainer.py``, github.com/tulerfeng/Video-R1)::

    acc_mean = temporal_rewards_per_func[:, 0].mean()
    shuffled_acc_mean = shuffled_rewards_per_func[:, 0].mean()
    if acc_mean >= 0.8 * shuffled_acc_mean:
        mask = temporal_rewards_per_func[:, 0] > 0.1
        temporal_rewards_per_func[mask, 0] = temporal_rewards_per_func[mask, 0] + 0.3

- ``p`` and ``p~`` are the *means of the accuracy reward* (graded rewards such as ROUGE or 1 - WER
  enter with their value, not thresholded), over one question's samples (Video-R1 trains with one
  question per device, ``per_device_train_batch_size 1``, so its batch mean is the group mean; here
  the means are taken per group id);
- "correct" is ``accuracy > 0.1`` (``correct_threshold``), as in the code: a graded answer with a
  tenth of the credit already counts;
- the comparison is the paper's strict ``p > mu * p~`` (``comparison="gt"``, the default); the
  code's ``p >= mu * p~`` is ``comparison="ge"``. They differ exactly when ``p == mu * p~``. With
  binary accuracy and mu = 4/5 that is ``5 k G~ = 4 k~ G`` for k of G ordered and k~ of G~ shuffled
  answers right: with Video-R1's G = 8, G~ = 4 only at k = k~ = 0 (no answer then gets a bonus
  either way), but with G = 5, G~ = 2 also at k = 2, k~ = 1 (ordered [1, 1, 0, 0, 0] against
  shuffled [1, 0]: 0.4 = 0.8 * 0.5), where the code gives the two right answers the bonus and the
  paper's rule does not.

A group with no shuffled samples (an image question, or a clip of one frame) gets no bonus and is
left out of the metrics.

The stage (:func:`temporal_contrast`) asks the policy for each question's shuffled twin
(``policy.temporally_shuffled``: the policy knows where a clip sits in its examples, and shuffles its
frames with :func:`mmrl.media.frame_order.shuffle_frames`), rolls the twins out and scores them.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor

from ..rollouts import Rollouts

__all__ = ["COMPARISONS", "TEMPORAL_GRPO_OPTIONS", "check_temporal_grpo", "temporal_contrast", "temporal_contrast_bonus"]

COMPARISONS = ("gt", "ge")  # the paper's p > mu * p~, Video-R1's code's p >= mu * p~
TEMPORAL_GRPO_OPTIONS = ("alpha", "mu", "shuffled_generations", "reward", "comparison")


def check_temporal_grpo(on: bool, options: Mapping[str, Any], policy) -> None:
    """Setup-time check of ``algo.temporal_grpo`` / ``algo.temporal_grpo_kwargs``."""
    if on and "video_inputs" not in policy.capabilities:
        raise ValueError(f"algo.temporal_grpo shuffles the frames of clips; a {type(policy).__name__} reads none")
    unknown = set(options) - set(TEMPORAL_GRPO_OPTIONS)
    if unknown:
        raise ValueError(f"unknown algo.temporal_grpo_kwargs {sorted(unknown)} (valid: {', '.join(TEMPORAL_GRPO_OPTIONS)})")
    if options.get("comparison", "gt") not in COMPARISONS:
        raise ValueError(f"algo.temporal_grpo_kwargs.comparison: one of {', '.join(COMPARISONS)} (gt: the "
                         "paper's p > mu * p~; ge: Video-R1's code's >=)")


def temporal_contrast(batch: Rollouts, policy, task, rewards, options: Mapping[str, Any],
                      rng: np.random.Generator) -> dict[str, float]:
    """T-GRPO (Video-R1) on a scored batch: each group's question again on its clip's frames
    shuffled (``shuffled_generations`` samples, default half the group), scored by the accuracy
    reward (``reward``, default the first reward other than format); the bonus is added to
    ``batch``'s rewards in place, as the ``temporal_bonus`` component. Shuffled samples are not
    trained on. Groups whose example has no shuffled twin (no clip) are not contrasted."""
    name = options.get("reward") or next(n for n in rewards.weights if n != "format")
    n = batch.group_ids.bincount().max().item() if len(batch) else 0
    n_shuffled = int(options.get("shuffled_generations", max(1, n // 2)))
    firsts = {int(g): i for i, g in reversed(list(enumerate(batch.group_ids.tolist())))}
    groups, twins = [], []
    for g, i in sorted(firsts.items()):
        twin = policy.temporally_shuffled(batch.examples[i], rng)
        if twin is not None:
            groups.append(g)
            twins.append(twin)
    bonus = torch.zeros(len(batch))
    metrics: dict[str, float] = {}
    if twins:
        shuffled = policy.rollout(twins, [task.build_prompt(ex) for ex in twins], n_shuffled, "train",
                                  need_old_logps=False, need_ref_logps=False)
        _, comps, _ = rewards(shuffled.completions, shuffled.examples, group_ids=shuffled.group_ids)
        bonus, metrics = temporal_contrast_bonus(batch.reward_components[name], batch.group_ids, comps[name],
                                                 torch.tensor(groups)[shuffled.group_ids],
                                                 alpha=float(options.get("alpha", 0.3)),
                                                 mu=float(options.get("mu", 0.8)),
                                                 comparison=str(options.get("comparison", "gt")))
    batch.rewards = batch.rewards + bonus
    batch.reward_components["temporal_bonus"] = bonus
    return metrics

def temporal_contrast_bonus(correct: Tensor, group_ids: Tensor, shuffled_correct: Tensor,
                            shuffled_group_ids: Tensor, alpha: float = 0.3, mu: float = 0.8,
                            correct_threshold: float = 0.1, comparison: str = "gt") -> tuple[Tensor, dict[str, float]]:
    """The per-sample T-GRPO bonus (same length and float dtype as ``correct``) and its metrics.

    ``correct``/``group_ids``: the accuracy reward (in [0, 1]) and group id of each answer on
    ordered frames; ``shuffled_correct``/``shuffled_group_ids``: the same for the answers on
    shuffled frames, whose ids name the ordered group of the same question. For each group with
    shuffled samples, ``p = mean(correct)``, ``p~ = mean(shuffled_correct)``; if ``p > mu * p~``
    (``comparison="ge"``: ``p >= mu * p~``, Video-R1's code), every sample of the group with
    ``correct > correct_threshold`` gets ``alpha``, all others 0.

    Metrics: ``temporal/ordered_acc`` and ``temporal/shuffled_acc``, the mean accuracy over the
    samples of the contrasted groups (those with shuffled samples); ``temporal/bonus_groups``, the
    fraction of contrasted groups that got the bonus (all three 0.0 when no group was contrasted).

    Hand-worked (mu 0.8): group 0 ordered [1, 1, 0, 1], shuffled [1, 0, 0, 0]: p = 0.75 >
    0.8 * 0.25 = 0.2, so its three correct answers get 0.3; group 1 ordered [0, 1, 0, 0], shuffled
    [1, 1, 0, 0]: p = 0.25 < 0.8 * 0.5 = 0.4, no bonus.
    """
    if comparison not in COMPARISONS:
        raise ValueError(f"temporal_contrast_bonus: comparison must be one of {', '.join(COMPARISONS)}, got {comparison!r}")
    correct = torch.as_tensor(correct)
    if not correct.is_floating_point():
        correct = correct.to(torch.get_default_dtype())
    group_ids = torch.as_tensor(group_ids, device=correct.device)
    shuffled_correct = torch.as_tensor(shuffled_correct, device=correct.device).to(correct.dtype)
    shuffled_group_ids = torch.as_tensor(shuffled_group_ids, device=correct.device)
    if correct.dim() != 1 or correct.shape != group_ids.shape:
        raise ValueError(f"temporal_contrast_bonus: correct {tuple(correct.shape)} and group_ids "
                         f"{tuple(group_ids.shape)} must be 1-d of one length")
    if shuffled_correct.dim() != 1 or shuffled_correct.shape != shuffled_group_ids.shape:
        raise ValueError(f"temporal_contrast_bonus: shuffled_correct {tuple(shuffled_correct.shape)} and "
                         f"shuffled_group_ids {tuple(shuffled_group_ids.shape)} must be 1-d of one length")
    orphans = set(shuffled_group_ids.tolist()) - set(group_ids.tolist())
    if orphans:
        raise ValueError(f"temporal_contrast_bonus: shuffled samples of groups {sorted(orphans)} have no "
                         "ordered samples; shuffled_group_ids must name the ordered group of the same question")

    bonus = torch.zeros_like(correct)
    contrasted = torch.unique(shuffled_group_ids).tolist()
    ordered_sum = shuffled_sum = 0.0
    ordered_n = shuffled_n = bonus_groups = 0
    for g in contrasted:
        in_group = group_ids == g
        ordered, shuffled = correct[in_group], shuffled_correct[shuffled_group_ids == g]
        p, p_shuffled = ordered.double().mean().item(), shuffled.double().mean().item()
        if p > mu * p_shuffled or (comparison == "ge" and p == mu * p_shuffled):
            bonus[in_group & (correct > correct_threshold)] = alpha
            bonus_groups += 1
        ordered_sum += ordered.double().sum().item()
        shuffled_sum += shuffled.double().sum().item()
        ordered_n += ordered.numel()
        shuffled_n += shuffled.numel()
    metrics = {
        "temporal/ordered_acc": ordered_sum / ordered_n if ordered_n else 0.0,
        "temporal/shuffled_acc": shuffled_sum / shuffled_n if shuffled_n else 0.0,
        "temporal/bonus_groups": bonus_groups / len(contrasted) if contrasted else 0.0,
    }
    return bonus, metrics
