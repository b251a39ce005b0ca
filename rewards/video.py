"""Video rewards: ``tiou`` (temporal grounding) and ``video_r1_accuracy`` (Video-R1's QA mix).

``tiou``: the temporal IoU of the ``[start, end]`` segment (seconds) in the ``<answer>`` block with
the example's ``segment``, the reward of TimeZero ("TimeZero: Temporal Video Grounding with
Reasoning-Guided LVLM"), Temporal-R1 and VideoChat-R1 (see :mod:`mmrl.measures.temporal`).

``video_r1_accuracy``: the accuracy reward of "Video-R1: Reinforcing Video Reasoning in MLLMs"
(Feng et al., 2025), chosen per example by ``problem_type`` (see
:func:`mmrl.measures.video_r1.video_r1_score`). It is the reward whose group means T-GRPO compares
(:mod:`mmrl.core.batch.temporal`).
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.video_r1 import answer_accuracies, answer_tious


@register_reward("tiou")
def tiou(completions, examples, **ctx) -> list:
    """Temporal IoU in [0, 1] of the answer block's segment with ``ex["segment"]`` (``(start,
    end)`` seconds). Hand-worked: "<answer>[2, 6]</answer>" for (4, 10) -> 2 / 8 = 0.25. None where
    unparsable (:func:`mmrl.measures.video_r1.answer_tious`)."""
    if len(completions) != len(examples):
        raise ValueError(f"tiou: {len(completions)} completions for {len(examples)} examples")
    return answer_tious(completions, examples)


@register_reward("video_r1_accuracy")
def video_r1_accuracy(completions, examples, **ctx) -> list:
    """Video-R1's accuracy reward of the answer block, by ``ex["problem_type"]``, against
    ``ex["solution"]`` or ``ex["answer"]`` (:func:`mmrl.measures.video_r1.answer_accuracies`)."""
    if len(completions) != len(examples):
        raise ValueError(f"video_r1_accuracy: {len(completions)} completions for {len(examples)} examples")
    return answer_accuracies(completions, examples)
