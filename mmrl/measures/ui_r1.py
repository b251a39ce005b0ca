"""UI-R1's two accuracy rewards as its code computes them: ``ui_r1_action_type`` and ``ui_r1_coord``.

"UI-R1: Enhancing Efficient Action Prediction of GUI Agents by Reinforcement Learning" (Lu et al.,
2025), ``src/ui_r1/src/open_r1/grpo_json_action_coord.py`` (github.com/lll6gg/UI-R1):
``accuracy_reward_action`` and ``accuracy_reward_coord``, summed with a format reward. The policy
answers in UI-R1's own format, ``<answer>[{'action': 'click', 'coordinate': [x, y]}]</answer>``;
its lines, quoted, and so what this does:

- the first ``<answer>(.*?)</answer>`` block (DOTALL), stripped;
- the action: ``r"'action':\\s*'(\\w+)'"``, else ``r"'action':\\s*(\\w+)"`` -- single quotes only, so
  JSON's ``"action": "click"`` reads as no action -- compared with the label's as strings, exactly
  (``Click`` or ``tap`` for ``click`` score 0);
- ``accuracy_reward_action``: 1.0 when both actions were read and are equal, else 0.0;
- ``accuracy_reward_coord``: types equal and the label ``click``: the first ``r'\\[(\\d+),\\s*(\\d+)]'``
  of the answer, integers only (``[0, 0]`` when there is none, a float point included), scaled to
  the screenshot as ``int(x * scale[0])`` (``scale`` = original / resized size), inside the element's
  box with ``<=`` on every edge; types equal and any other action: 1.0, its arguments unchecked (no
  typed-text F1, no scroll direction); types different: 0.0.

The label is mmrl's action dict (``ex["action"]``, :mod:`mmrl.measures.gui`), named as UI-R1's data
(AndroidControl's ``action_type``) names it: ``type`` is ``input_text``, the other names are the same.
The predicted point goes from the policy's space to original pixels with
:func:`mmrl.media.coords.prediction_to_pixels` (for Qwen2.5-VL exactly UI-R1's ``x * scale``), then
``int``. A click label without an element box cannot be scored by UI-R1's rule (its data gives every
click one): ``ui_r1_coord`` is None there, as for an example without a label.
"""

from __future__ import annotations

import re
from typing import Optional

from mmrl.measures.gui import truth_action, truth_bbox
from mmrl.media.coords import prediction_to_pixels

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ACTION_RES = (re.compile(r"'action':\s*'(\w+)'"), re.compile(r"'action':\s*(\w+)"))
_POINT_RE = re.compile(r"\[(\d+),\s*(\d+)]")
LABEL_NAMES = {"type": "input_text"}  # mmrl's action name -> UI-R1's (AndroidControl's) where they differ


def _answer(text) -> Optional[str]:
    m = _ANSWER_RE.search(text) if isinstance(text, str) else None
    return m.group(1).strip() if m else None


def ui_r1_action(text) -> Optional[str]:
    """UI-R1's ``extract_action``: the action name in the first answer block, or None."""
    answer = _answer(text)
    for pattern in _ACTION_RES if answer is not None else ():
        m = pattern.search(answer)
        if m:
            return m.group(1)
    return None


def ui_r1_point(text) -> list[int]:
    """UI-R1's ``extract_coord``: the first ``[x, y]`` of whole numbers in the first answer block,
    ``[0, 0]`` when there is none."""
    answer = _answer(text)
    m = _POINT_RE.search(answer) if answer is not None else None
    return [int(m.group(1)), int(m.group(2))] if m else [0, 0]


def label_action(ex) -> Optional[str]:
    """The example's action in UI-R1's names, or None without a readable label."""
    truth = truth_action(ex)
    return None if truth is None else LABEL_NAMES.get(truth["action"], truth["action"])


def action_type_reward(completion, ex) -> Optional[float]:
    """``accuracy_reward_action``: 1.0 when the answer's action string is the label's, else 0.0;
    None without a label."""
    want = label_action(ex)
    if want is None:
        return None
    got = ui_r1_action(completion)
    return 1.0 if got and got == want else 0.0


def coord_reward(completion, ex) -> Optional[float]:
    """``accuracy_reward_coord`` (module docstring); None without a label, or for a click label
    without an element box."""
    want = label_action(ex)
    box = truth_bbox(ex) if want == "click" else None
    if want is None or (want == "click" and box is None):
        return None
    if ui_r1_action(completion) != want:
        return 0.0
    if want != "click":
        return 1.0
    try:
        x, y = (int(v) for v in prediction_to_pixels(ui_r1_point(completion), ex))
    except Exception:  # a frame that cannot convert, an overflow: UI-R1's try/except scores 0
        return 0.0
    return 1.0 if box[0] <= x <= box[2] and box[1] <= y <= box[3] else 0.0
