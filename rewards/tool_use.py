"""Rewards for trajectories that call tools ("thinking with images"): DeepEyes' reward as its code
computes it (``deepeyes_rule_judge``: its formula, a rule in place of its LLM judge), the grounding of the crops (``crop_iou``, mmrl's own) and Pixel
Reasoner's curiosity-driven terms (``pixel_reasoner_curiosity``, ``pixel_reasoner_penalty``).

They read the trajectory record of :mod:`mmrl.measures.tool_use`: ``ex["trajectory"]`` (else the
completion) is the whole trajectory's text, ``ex["tool_calls"]`` the calls (an example without it
called no tool). Every turn-row of a multi-turn rollout carries its trajectory's record, so all
rows of a trajectory score the trajectory's reward (``episode_grpo`` with ``episode_return: final``
takes it once).

Papers: "DeepEyes: Incentivizing 'Thinking with Images' via Reinforcement Learning" (Zheng et al.,
2025) and "Pixel Reasoner: Incentivizing Pixel-Space Reasoning with Curiosity-Driven Reinforcement
Learning" (Su et al., 2025): r'(x, y) = r(x, y) + alpha * r_curiosity(x, y) + beta * r_penalty(y),
r_curiosity = max(H - RaPR(x), 0) * 1_PR(y), r_penalty = min(N - n_vo(y), 0), with H = 0.3,
alpha = 0.5, N = 1, beta = 0.05 (the constants of its released code for images). In mmrl the two
terms are two rewards, so each is logged: weight ``pixel_reasoner_curiosity`` by alpha = 0.5 and
``pixel_reasoner_penalty`` (which returns max(n_vo - N, 0) = -r_penalty) by -beta = -0.05.
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.batch import check_batch, score_each
from mmrl.measures.tool_use import (CURIOSITY_H, PENALTY_N, crop_iou, curiosity_terms, deepeyes_score,
                                    overuse)


@register_reward("deepeyes_rule_judge", minimum=-0.2, maximum=2.0)
def deepeyes(completions, examples) -> list:
    """DeepEyes' ``compute_score`` (verl/utils/reward_score/vl_agent.py in Visual-Agent/DeepEyes):
    0.8 * accuracy + 0.2 * format + 1.2 * tool, where format is -1 on a format error and tool is 1
    only when the answer is right and a tool image came back (:func:`mmrl.measures.tool_use.deepeyes_parts`).
    Accuracy is rule-based (equal after normalisation, or the right option letter): DeepEyes asks an
    LLM judge (Qwen2.5-72B-Instruct), hence the name: it is not the paper's reward where the judge
    would disagree with the rule; ``deepeyes`` (rewards/model_scorers.py) asks a local chat model as
    DeepEyes does. None without ``ex["answer"]``."""
    return score_each("deepeyes_rule_judge", completions, examples, deepeyes_score)


@register_reward("crop_iou")
def crop_iou_reward(completions, examples, which: str = "best") -> list:
    """mmrl's own: IoU of the regions the trajectory zoomed into or cropped with the example's
    annotated target region (``target_box`` / ``target_boxes``, original pixels), of the best crop
    (``which="best"``) or the last (``"last"``); 0.0 with no successful crop, None without a target.
    No paper defines it as a reward (DeepEyes reports the grounding of its crops as an analysis)."""
    if which not in ("best", "last"):
        raise ValueError(f"crop_iou: which must be 'best' or 'last', got {which!r}")
    return score_each("crop_iou", completions, examples, lambda _, ex: crop_iou(ex, which))


@register_reward("pixel_reasoner_curiosity")
def pixel_reasoner_curiosity(completions, examples, threshold: float = CURIOSITY_H, group_ids=None) -> list:
    """Pixel Reasoner's r_curiosity = max(H - RaPR(x), 0) * 1_PR(y): a trajectory that made a
    visual operation, in a group (same prompt; ``group_ids`` from the trainer, else the whole
    batch) where fewer than H = ``threshold`` of the trajectories did, gets H - RaPR. In [0, H];
    weight it by alpha (0.5 in the paper)."""
    check_batch("pixel_reasoner_curiosity", completions, examples)
    if not 0.0 <= float(threshold) <= 1.0:
        raise ValueError(f"pixel_reasoner_curiosity: threshold H must be in [0, 1], got {threshold!r}")
    return curiosity_terms(examples, group_ids, float(threshold))


@register_reward("pixel_reasoner_penalty", maximum=float("inf"))
def pixel_reasoner_penalty(completions, examples, limit: int = PENALTY_N) -> list:
    """max(n_vo - N, 0): the visual operations beyond N = ``limit`` (1 in the paper), i.e.
    -r_penalty of Pixel Reasoner; give it a negative weight, -beta (-0.05 in the paper)."""
    return score_each("pixel_reasoner_penalty", completions, examples, lambda _, ex: overuse(ex, int(limit)))
