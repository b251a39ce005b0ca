"""The coordinate module: hand-worked conversions and each Qwen family's round trip through the
processor's min/max_pixels resizing (checked against the real HF image processor's grid)."""

from __future__ import annotations

import pytest
from PIL import Image

from mmrl.media.coords import (
    FAMILY_OUTPUT_SPACE,
    Frame,
    convert_box,
    convert_points,
    output_space,
    qwen_frame,
)


def close(a, b, tol=1e-9):
    return all(abs(x - y) <= tol for x, y in zip(a, b)) and len(a) == len(b)


def test_hand_worked_conversions():
    """A 200x100 image shown to the model at 280x140: pixel box (50, 25, 150, 75) is
    rel1000 (250, 250, 750, 750), norm (.25, .25, .75, .75), resized (70, 35, 210, 105)."""
    f = Frame(200, 100, 280, 140)
    box = (50, 25, 150, 75)
    assert close(convert_box(box, "pixel", "rel1000", f), (250, 250, 750, 750))
    assert close(convert_box(box, "pixel", "norm", f), (0.25, 0.25, 0.75, 0.75))
    assert close(convert_box(box, "pixel", "resized", f), (70, 35, 210, 105))
    assert close(convert_box((70, 35, 210, 105), "resized", "rel1000", f), (250, 250, 750, 750))
    assert close(convert_points((100, 50), "pixel", "norm", f), (0.5, 0.5))  # a click


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="valid spaces"):
        convert_box((0, 0, 1, 1), "pixels", "norm", Frame(10, 10))
    with pytest.raises(ValueError, match="resized image size"):
        convert_box((0, 0, 1, 1), "pixel", "resized", Frame(10, 10))
    with pytest.raises(ValueError, match="pairs"):
        convert_points((1, 2, 3), "pixel", "norm", Frame(10, 10))
    with pytest.raises(ValueError, match="known: .*qwen2_5_vl"):
        output_space("llava")


def _processor(min_pixels, max_pixels):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)


@pytest.mark.parametrize("size,budget", [((640, 480), (56 * 56, 200_000)),   # shrunk to fit max_pixels
                                         ((100, 60), (200_000, 1_000_000)),  # grown to min_pixels
                                         ((333, 517), (3136, 12_845_056))])  # rounded to multiples of 28
def test_frame_matches_the_hf_processor_grid(size, budget):
    """qwen_frame's resized size == what the HF image processor actually produces
    (image_grid_thw x patch size)."""
    proc = _processor(*budget)
    grid = proc(images=[Image.new("RGB", size)], return_tensors="pt")["image_grid_thw"][0].tolist()
    frame = qwen_frame(size, proc)
    assert (frame.resized_width, frame.resized_height) == (grid[2] * 14, grid[1] * 14)
    assert frame.resized_width * frame.resized_height <= budget[1]


@pytest.mark.parametrize("family", sorted(FAMILY_OUTPUT_SPACE))
def test_each_family_round_trips_through_resizing(family):
    """A label in original pixels -> the family's output space (what a perfect model writes) ->
    back to pixels is the label again, under a budget that really resizes the image."""
    proc = _processor(56 * 56, 100_000)
    frame = qwen_frame((640, 480), proc)
    assert (frame.resized_width, frame.resized_height) != (640, 480)
    label = (33.0, 47.0, 401.0, 299.0)
    space = output_space(family)
    emitted = convert_box(label, "pixel", space, frame)
    assert close(convert_box(emitted, space, "pixel", frame), label, tol=1e-6)
    if family == "qwen2_5_vl":  # absolute coordinates of the image the model saw
        assert close(emitted, (33 * frame.resized_width / 640, 47 * frame.resized_height / 480,
                               401 * frame.resized_width / 640, 299 * frame.resized_height / 480))


def test_grounding_reward_and_target_in_the_policy_space():
    """An example recorded with a Qwen2-VL policy (0-1000 space) on a 200x100 image: the target
    answers in 0-1000, and that answer scores IoU 1 against the pixel box; the same numbers read
    as pixels would not."""
    from mmrl.registry import REWARDS, TASKS

    task = TASKS.get("grounding")()
    ex = dict(task.examples("eval")[0])
    ex.update(image_size=(200, 100), box=(20, 10, 60, 50), frame=Frame(200, 100), pred_space="rel1000")
    target = task.target(ex)
    assert "[100, 100, 300, 500]" in target
    iou = REWARDS.get("iou")
    assert iou([target], [ex]) == [1.0]
    assert iou([target], [{**ex, "pred_space": "pixel"}])[0] < 0.2
    assert task.metrics([target], [ex])["accuracy"] == 1.0
