"""GUI-agent rewards for one action step: the papers' rewards as their code computes them
(``ui_r1_action_type``, ``ui_r1_coord``, ``gui_r1``) and mmrl's stricter versions
(``gui_action_type``, ``gui_action_args``, ``gui_action_score``, ``gui_type_f1``).

Papers: "UI-R1: Enhancing Efficient Action Prediction of GUI Agents by Reinforcement Learning" (Lu et
al., 2025: an action-type reward and a coordinate reward, summed with a format reward;
:mod:`mmrl.measures.ui_r1`) and "GUI-R1: A Generalist R1-Style Vision-Language Action Model For GUI
Agents" (Luo et al., 2025: one reward, 0.8 * accuracy + 0.2 * format; :mod:`mmrl.measures.gui_r1`).
They read the answer in the paper's own format (``[{'action': 'click', 'coordinate': [x, y]}]``,
single quotes) and check what the paper's code checks, no more: UI-R1 no typed text or scroll
direction, GUI-R1 a strict ``<`` at box edges, integer points, a substring as a typed-text match.

mmrl's versions read any common action format (:mod:`mmrl.measures.gui`: JSON, function calls,
aliases such as ``tap`` or ``swipe``, float points) and check every argument: the click inside the
element's box, edges included (without a box, within 14% of the screen, AndroidControl's rule),
typed or app text with token F1 >= 0.5, the scroll direction, the terminate status. The
``gui_actions`` task uses them by default: it prompts for mmrl's JSON action, which the papers'
patterns cannot read.

Examples carry the label as ``ex["action"]``: a normalised action dict (``{"action": "click",
"point": [x, y]}``, ``{"action": "type", "text": ...}``, ...) with, for clicks, an optional
``"bbox"``, the target element's box; points and boxes are original-image pixels. A predicted point
is converted from the policy's space with ``ex["pred_space"]``/``ex["frame"]`` (recorded by the
trainer, see ``mmrl.media.coords``). Every reward is None for an example with no readable action;
mmrl's are also None (scored 0, counted as unparsable) when the completion's ``<answer>`` block
holds no readable action, the papers' score such a completion as their code does (0, or the format
part).
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.batch import score_each
from mmrl.measures.gui import parse_action, truth_action
from mmrl.measures.gui_match import action_match
from mmrl.measures.gui_r1 import gui_r1_score
from mmrl.measures.ui_r1 import action_type_reward, coord_reward
from mmrl.parsing import follows_layout

ACCURACY_WEIGHT, FORMAT_WEIGHT = 0.8, 0.2  # GUI-R1's weights, in gui_action_score


def _matches(name, completions, examples):
    """(completion, action_match or None) per pair; None when either action is unreadable."""
    def match(c, ex):
        pred = parse_action(c)
        return c, action_match(pred, ex) if pred is not None and truth_action(ex) is not None else None

    return score_each(name, completions, examples, match)


# -- the papers' rewards -----------------------------------------------------------------------------
@register_reward("ui_r1_action_type")
def ui_r1_action_type(completions, examples) -> list:
    """UI-R1's ``accuracy_reward_action``: 1.0 when the ``'action': '...'`` string of the first
    answer block is the label's (UI-R1's names: ``input_text`` for type), else 0.0."""
    return score_each("ui_r1_action_type", completions, examples, action_type_reward)


@register_reward("ui_r1_coord")
def ui_r1_coord(completions, examples) -> list:
    """UI-R1's ``accuracy_reward_coord``: types equal and a click whose integer point, scaled to the
    screenshot, lies in the element's box (edges included): 1.0; types equal, any other action: 1.0;
    else 0.0. None for a click label without a box."""
    return score_each("ui_r1_coord", completions, examples, coord_reward)


@register_reward("gui_r1")
def gui_r1(completions, examples) -> list:
    """GUI-R1's ``r1gui_compute_score``: 0.8 * accuracy + 0.2 * format, as its code computes them
    (:mod:`mmrl.measures.gui_r1`)."""
    return score_each("gui_r1", completions, examples, gui_r1_score)


# -- mmrl's versions ---------------------------------------------------------------------------------
@register_reward("gui_action_type")
def gui_action_type(completions, examples) -> list:
    """1.0 when the predicted action type (any format, aliases read) is the labelled one, else 0.0."""
    return [None if m is None else m["type"] for _, m in _matches("gui_action_type", completions, examples)]


@register_reward("gui_action_args")
def gui_action_args(completions, examples) -> list:
    """1.0 when the type is right and so are its arguments (click in the element's box, edges
    included, or within 14% of the screen; typed or app text F1 >= 0.5; same scroll direction /
    terminate status), else 0.0."""
    return [None if m is None else m["args"] for _, m in _matches("gui_action_args", completions, examples)]


@register_reward("gui_action_score")
def gui_action_score(completions, examples) -> list:
    """GUI-R1's weighting over mmrl's checks: 0.8 * (type and arguments right, as
    ``gui_action_args``) + 0.2 * (the completion is exactly ``<think>...</think><answer>...</answer>``,
    the ``format`` reward's strict mode)."""
    out = []
    for c, m in _matches("gui_action_score", completions, examples):
        if m is None:
            out.append(None)
            continue
        layout = 1.0 if follows_layout(c, "strict") else 0.0
        out.append(ACCURACY_WEIGHT * m["type"] * m["args"] + FORMAT_WEIGHT * layout)
    return out


@register_reward("gui_type_f1")
def gui_type_f1(completions, examples) -> list:
    """Token F1 of a typed text with the labelled one (0.0 for another action type); None unless
    the example's action is ``type``, or when the completion has no readable action."""
    out = []
    for ex, (_, m) in zip(examples, _matches("gui_type_f1", completions, examples)):
        is_type = m is not None and truth_action(ex)["action"] == "type"
        out.append(m["text_f1"] if is_type else None)
    return out
