"""GUI-agent rewards for one action step: ``gui_action_type``, ``gui_action_args``, ``gui_r1``,
``gui_type_f1``.

From "UI-R1: Enhancing Efficient Action Prediction of GUI Agents by Reinforcement Learning" (Lu et
al., 2025: an action-type reward and an argument reward, summed with a format reward by the task's
weights) and "GUI-R1: A Generalist R1-Style Vision-Language Action Model For GUI Agents" (Luo et
al., 2025: one reward, 0.8 * accuracy + 0.2 * format). The action space, parser and scoring are
:mod:`mmrl.measures.gui`.

Examples carry the label as ``ex["action"]``: a normalised action dict (``{"action": "click",
"point": [x, y]}``, ``{"action": "type", "text": ...}``, ...) with, for clicks, an optional
``"bbox"``, the target element's box; points and boxes are original-image pixels. A predicted point
is converted from the policy's space with ``ex["pred_space"]``/``ex["frame"]`` (recorded by the
trainer, see ``mmrl.media.coords``); without a bbox a click is judged by distance on the screen
``ex["image_size"]`` (w, h). Every reward is None (scores 0, counted as unparsable) when the
completion's ``<answer>`` block holds no readable action or the example has no readable action.
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.gui import action_match, parse_action, truth_action
from mmrl.parsing import follows_layout

ACCURACY_WEIGHT, FORMAT_WEIGHT = 0.8, 0.2  # GUI-R1


def _matches(name, completions, examples):
    """(completion, action_match or None) per pair; None when either action is unreadable."""
    if len(completions) != len(examples):
        raise ValueError(f"{name}: {len(completions)} completions for {len(examples)} examples")
    out = []
    for c, ex in zip(completions, examples):
        pred = parse_action(c)
        out.append((c, action_match(pred, ex) if pred is not None and truth_action(ex) is not None else None))
    return out


@register_reward("gui_action_type")
def gui_action_type(completions, examples, **ctx) -> list:
    """UI-R1's action-type reward: 1.0 when the predicted action type is the labelled one, else 0.0."""
    return [None if m is None else m["type"] for _, m in _matches("gui_action_type", completions, examples)]


@register_reward("gui_action_args")
def gui_action_args(completions, examples, **ctx) -> list:
    """UI-R1's argument reward: 1.0 when the type is right and so are its arguments (click in the
    element's box, typed text F1 >= 0.5, same scroll direction / terminate status), else 0.0."""
    return [None if m is None else m["args"] for _, m in _matches("gui_action_args", completions, examples)]


@register_reward("gui_r1")
def gui_r1(completions, examples, **ctx) -> list:
    """GUI-R1's reward, 0.8 * accuracy + 0.2 * format: accuracy 1 when type and arguments are both
    right; format 1 when the completion is exactly ``<think>...</think><answer>...</answer>`` (the
    ``format`` reward's strict mode) with a readable action in the answer."""
    out = []
    for c, m in _matches("gui_r1", completions, examples):
        if m is None:
            out.append(None)
            continue
        layout = 1.0 if follows_layout(c, "strict") else 0.0
        out.append(ACCURACY_WEIGHT * m["type"] * m["args"] + FORMAT_WEIGHT * layout)
    return out


@register_reward("gui_type_f1")
def gui_type_f1(completions, examples, **ctx) -> list:
    """Token F1 of a typed text with the labelled one (0.0 for another action type); None unless
    the example's action is ``type``, or when the completion has no readable action."""
    out = []
    for ex, (_, m) in zip(examples, _matches("gui_type_f1", completions, examples)):
        is_type = m is not None and truth_action(ex)["action"] == "type"
        out.append(m["text_f1"] if is_type else None)
    return out
