"""``iou``: overlap of the predicted box with the example's ``box``.

The box must be inside the ``<answer>`` block: parsing the whole completion would reward numbers
that merely appear in the reasoning. The prediction is converted from the policy's coordinate space
(``ex["pred_space"]``/``ex["frame"]``, recorded by the trainer; see ``mmrl.media.coords``) to
original-image pixels, the space of the example's ``box``, before comparing.
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.batch import score_each
from mmrl.measures.boxes import answer_iou


@register_reward("iou")
def iou(completions, examples) -> list:
    """IoU in [0, 1]; None when there is no answer block or no parsable box in it."""
    return score_each("iou", completions, examples, answer_iou)
