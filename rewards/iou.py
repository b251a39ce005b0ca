"""``iou``: overlap of the predicted box with the example's ``box``.

The box must be inside the ``<answer>`` block: parsing the whole completion would reward numbers
that merely appear in the reasoning. The prediction is converted from the policy's coordinate space
(``ex["pred_space"]``/``ex["frame"]``, recorded by the trainer; see ``mmrl.media.coords``) to
original-image pixels, the space of the example's ``box``, before comparing.
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.media.coords import prediction_to_pixels
from mmrl.rewards._parsing import box_iou, extract_answer, parse_box


@register_reward("iou")
def iou(completions, examples, **ctx) -> list:
    """IoU in [0, 1]; None when there is no answer block or no parsable box in it."""
    if len(completions) != len(examples):
        raise ValueError(f"iou: {len(completions)} completions for {len(examples)} examples")
    out = []
    for c, ex in zip(completions, examples):
        answer = extract_answer(c)
        box = parse_box(answer) if answer is not None else None
        truth = ex.get("box") if isinstance(ex, dict) else None
        out.append(None if box is None or truth is None else box_iou(prediction_to_pixels(box, ex), truth))
    return out
