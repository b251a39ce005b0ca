"""Video rewards: ``tiou`` (temporal grounding), ``video_r1_accuracy`` (Video-R1's QA reward, as its
code computes it) and ``video_answer_accuracy`` (mmrl's more tolerant reading of the same grading).

``tiou``: the temporal IoU of the ``[start, end]`` segment (seconds) in the ``<answer>`` block with
the example's ``segment``, the reward of TimeZero ("TimeZero: Temporal Video Grounding with
Reasoning-Guided LVLM"), Temporal-R1 and VideoChat-R1 (see :mod:`mmrl.measures.temporal`).

``video_r1_accuracy``: ``accuracy_reward`` of "Video-R1: Reinforcing Video Reasoning in MLLMs" (Feng
et al., 2025; ``src/r1-v/src/open_r1/grpo.py``), chosen per example by ``problem_type``, reproduced
line by line (:mod:`mmrl.measures.video_r1`: the first answer block, exact option strings, the
decimal-point rule, the stemmed ROUGE, even "nan" scoring 1 on regression). The ``video_qa`` task's
default, and the reward whose group means T-GRPO compares (:mod:`mmrl.core.batch.temporal`).

``video_answer_accuracy``: the same grading as mmrl reads answers (:mod:`mmrl.measures.video_answers`:
the last answer block, option letters in any common form, number words, no decimal-point rule, a
finite relative error at truth 0, unreadable answers counted as unparsable).
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.batch import check_batch
from mmrl.measures.video_answers import answer_accuracies
from mmrl.measures.video_r1 import answer_tious, video_r1_accuracies


@register_reward("tiou")
def tiou(completions, examples) -> list:
    """Temporal IoU in [0, 1] of the answer block's segment with ``ex["segment"]`` (``(start,
    end)`` seconds). Hand-worked: "<answer>[2, 6]</answer>" for (4, 10) -> 2 / 8 = 0.25. None where
    unparsable (:func:`mmrl.measures.video_r1.answer_tious`)."""
    check_batch("tiou", completions, examples)
    return answer_tious(completions, examples)


@register_reward("video_r1_accuracy")
def video_r1_accuracy(completions, examples) -> list:
    """Video-R1's accuracy reward by ``ex["problem_type"]`` against ``ex["solution"]`` (or
    ``ex["answer"]``), as Video-R1's code computes it (:func:`mmrl.measures.video_r1.video_r1_reward`);
    None only for an example without a solution."""
    check_batch("video_r1_accuracy", completions, examples)
    return video_r1_accuracies(completions, examples)


@register_reward("video_answer_accuracy")
def video_answer_accuracy(completions, examples) -> list:
    """mmrl's reading of Video-R1's grading (:func:`mmrl.measures.video_answers.answer_score`); None
    for no answer block, no truth, or an answer unreadable for its type."""
    check_batch("video_answer_accuracy", completions, examples)
    return answer_accuracies(completions, examples)
