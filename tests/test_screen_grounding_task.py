"""The screen_grounding task: synthetic screens of the phone environment and ScreenSpot files,
targets in every model frame scoring 1, box answers, options, pictures."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from PIL import Image

from mmrl import make_task
from mmrl.measures.screen import point_in_box
from mmrl.media.coords import output_space, qwen_frame
from mmrl.registry import REWARDS


def test_synthetic_examples_ask_for_an_element_of_a_random_phone_screen():
    task = make_task("screen_grounding")
    ex = task.examples("train")[3]
    assert ex["instruction"] == f"Click the {ex['element']}"
    assert ex["image"].size == ex["image_size"] == (112, 224)
    again = make_task("screen_grounding").examples("train")[3]
    assert again["box"] == ex["box"] and again["image"].tobytes() == ex["image"].tobytes()
    names = {task.examples("train")[i]["element"] for i in range(200)}
    assert {"Bluetooth toggle", "Settings app", "Submit button"} <= names
    assert sum(task.examples("train")[i]["element"] == "Back button" for i in range(200)) == 0
    eval_boxes = [make_task("screen_grounding").examples("eval")[i]["box"] for i in range(5)]
    assert eval_boxes != [task.examples("train")[i]["box"] for i in range(5)]  # other seeds


def test_a_perfect_target_scores_one_and_a_miss_zero():
    task = make_task("screen_grounding")
    examples = [task.examples("eval")[i] for i in range(40)]
    targets = [task.target(ex) for ex in examples]
    assert task.metrics(targets, examples) == {"point_accuracy": 1.0, "parsed": 1.0}
    assert REWARDS.get("click_accuracy")(targets, examples) == [1.0] * 40
    outside = "<answer>[-5, -5]</answer>"
    assert task.metrics([outside, "no answer"], examples[:2]) == {"point_accuracy": 0.0, "parsed": 0.5}
    assert task.prompt(examples[0])[0]["content"][1]["text"].endswith("Answer with <answer>[x, y]</answer>.")


def write_screenspot(tmp_path, size, box_xywh):
    Image.new("RGB", size, "white").save(tmp_path / "screen.png")
    rows = [{"img_filename": "screen.png", "bbox": box_xywh, "instruction": "turn on Wi-Fi",
             "data_type": "icon", "data_source": "ios"}]
    path = tmp_path / "screenspot_mobile_v2.json"
    path.write_text(json.dumps(rows))
    return path


@pytest.mark.parametrize("model_type", ["qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("size,box", [((1170, 2532), [1000, 300, 60, 40]), ((2560, 1440), [2400, 20, 40, 30])],
                         ids=["phone", "desktop"])
def test_screenspot_files_through_the_task_in_the_models_frame(tmp_path, model_type, size, box):
    path = write_screenspot(tmp_path, size, box)
    task = make_task("screen_grounding", train_path=str(path), eval_path=str(path))
    (ex,) = task.examples("eval")
    assert ex["box"] == (box[0], box[1], box[0] + box[2], box[1] + box[3]) and ex["image_size"] == size
    processor = SimpleNamespace(min_pixels=3136, max_pixels=1003520, patch_size=14, merge_size=2)
    ex = {**ex, "pred_space": output_space(model_type), "frame": qwen_frame(size, processor)}
    answer = task.target(ex)
    assert task.metrics([answer], [ex])["point_accuracy"] == 1.0, answer
    # The same element's centre written in original pixels is in the wrong frame: a miss.
    centre = f"<answer>[{box[0] + box[2] // 2}, {box[1] + box[3] // 2}]</answer>"
    assert task.metrics([centre], [ex])["point_accuracy"] == 0.0
    picture = task.visualize(ex, answer)
    assert max(picture.size) <= 896 * 1 + 20


def test_box_answers_score_iou_and_coverage():
    task = make_task("screen_grounding", answer="box")
    assert set(task.rewards) == {"iou", "gui_g2_coverage", "format"}
    ex = task.examples("eval")[0]
    target = task.target(ex)
    assert target.count(",") == 3
    assert task.metrics([target], [ex]) == {"point_accuracy": 1.0, "parsed": 1.0, "mean_iou": pytest.approx(1.0, abs=0.05)}


def test_options_are_checked():
    with pytest.raises(ValueError, match="answer must be point or box"):
        make_task("screen_grounding", answer="polygon")
    with pytest.raises(ValueError, match="format must be one of"):
        make_task("screen_grounding", format="screenspot_v3")
    with pytest.raises(ValueError, match="unknown split"):
        make_task("screen_grounding").examples("test")


def test_visualize_draws_truth_and_click():
    task = make_task("screen_grounding")
    ex = task.examples("train")[0]
    picture = task.visualize(ex, task.target(ex))
    x1, y1, x2, y2 = ex["box"]
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    assert point_in_box((cx, cy), ex["box"])
    scale = picture.size[0] // ex["image"].size[0]
    assert scale == 2  # a 224-px-high screen drawn at 448 px
    assert picture.getpixel((int(cx * scale), int(cy * scale))) == (255, 0, 0)  # the click's centre dot
    assert picture.getpixel((int(x1 * scale), int(cy * scale))) == (0, 200, 0)  # the element's box edge


def truncated_png(path, size=(96, 64)):
    """A screenshot cut off half-way, as an interrupted download leaves it: PIL opens the header
    and fails on the pixels (``OSError: image file is truncated``)."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buffer, "PNG")
    path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])


def test_a_corrupt_screenshot_is_skipped_and_bad_boxes_are_counted_per_entry(tmp_path, caplog):
    """ScreenSpot-v2 as it ships (no img_size: a box off its screenshot is found on access).
    Entries 0 and 3 are usable; entry 1's screenshot is truncated; entries 2 and 4 are two bad
    boxes on the same screenshot, which count twice (once per entry, not once per screenshot)."""
    Image.new("RGB", (100, 80), "white").save(tmp_path / "ok.png")
    truncated_png(tmp_path / "cut.png")
    row = {"instruction": "the menu", "data_type": "icon", "data_source": "ios"}
    rows = [{**row, "img_filename": "ok.png", "bbox": [10, 10, 20, 20]},
            {**row, "img_filename": "cut.png", "bbox": [10, 10, 20, 20]},
            {**row, "img_filename": "ok.png", "bbox": [90, 10, 50, 20]},   # x2 = 140 > 100
            {**row, "img_filename": "ok.png", "bbox": [30, 40, 10, 10]},
            {**row, "img_filename": "ok.png", "bbox": [10, 70, 20, 30]}]   # y2 = 100 > 80
    path = tmp_path / "screenspot_mobile_v2.json"
    path.write_text(json.dumps(rows, indent=2))
    task = make_task("screen_grounding", train_path=str(path), eval_path=str(path))
    examples = task.examples("eval")
    got = [examples[i]["box"] for i in range(len(examples))]  # training's indexing never raises
    assert set(got) == {(10, 10, 30, 30), (30, 40, 40, 50)}
    assert examples.stats() == {"examples": 5, "skipped_lines": 0, "bad_images": 1, "missing_images": 0,
                                "bad_targets": 2}
    (cut,) = examples.bad_images
    assert cut.startswith(f"{path}:") and cut.endswith("(entry 1)") and "truncated" in examples.bad_images[cut]
    assert sorted(w.rsplit(" ", 1)[-1] for w in examples.bad_targets) == ["2)", "4)"]
    assert all("outside the 100x80 image" in r for r in examples.bad_targets.values())
    assert "(entry 1): cannot open the screenshot" in caplog.text
    # evaluation takes each usable entry once and says how many it skipped
    from mmrl.core.evaluation import usable_share

    picked, positions, skipped = usable_share(examples, 5)
    assert [ex["box"] for ex in picked] == [(10, 10, 30, 30), (30, 40, 40, 50)]
    assert positions == [0, 1] and skipped == 3
