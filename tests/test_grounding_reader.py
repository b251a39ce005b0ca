"""Referring-expression grounding from VLM-R1 / RefCOCO-style JSONL files."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from mmrl.registry import REWARDS, TASKS


def fixture(tmp_path, lines):
    Image.new("RGB", (200, 100), "white").save(tmp_path / "img.jpg")
    p = tmp_path / "rec.jsonl"
    p.write_text("\n".join(json.dumps(x) if not isinstance(x, str) else x for x in lines) + "\n")
    return p


def test_reads_vlm_r1_lines_and_scores_its_own_targets(tmp_path):
    p = fixture(tmp_path, [
        {"image": "img.jpg", "problem": "the man on the left", "solution": [10, 20, 50, 80]},
        {"image": "img.jpg", "problem": "the red car", "solution": "<answer>[100, 10, 190, 60]</answer>"},
        "{broken",
        {"image": "img.jpg", "problem": "no box here", "solution": "none"},
    ])
    task = TASKS.get("grounding")(train_path=str(p), eval_path=str(p))
    ds = task.examples("train")
    assert len(ds) == 2 and [n for n, _ in ds.skipped] == [3, 4]
    ex = ds[1]
    assert ex["box"] == (100, 10, 190, 60) and ex["image_size"] == (200, 100)
    assert ex["question"] == "the red car" and ex["answer"] == "[100, 10, 190, 60]"
    target = task.target(ex)
    assert target == "<think>The object is at the right.</think><answer>[100, 10, 190, 60]</answer>"
    assert REWARDS.get("iou")([target], [ex]) == [1.0]
    assert task.metrics([target, "<answer>[0, 0, 5, 5]</answer>"], [ex, ex])["accuracy"] == 0.5
    assert "the red car" in task.prompt(ex)[0]["content"][1]["text"]
    assert task.hints(ex)[0] == "Find what the sentence names."


def test_box_space_of_the_file_is_converted_to_pixels(tmp_path):
    """A 0-1000 box (100, 200, 500, 800) on a 200x100 image is pixels (20, 20, 100, 80)."""
    p = fixture(tmp_path, [{"image": "img.jpg", "problem": "x", "solution": [100, 200, 500, 800]}])
    task = TASKS.get("grounding")(train_path=str(p), box_space="rel1000")
    assert task.examples("train")[0]["box"] == pytest.approx((20, 20, 100, 80))


def test_missing_file_is_named(tmp_path):
    task = TASKS.get("grounding")(train_path=str(tmp_path / "none.jsonl"))
    with pytest.raises(FileNotFoundError, match="none.jsonl"):
        task.examples("train")


def test_counting_reads_clevr_style_jsonl(tmp_path):
    Image.new("RGB", (64, 48)).save(tmp_path / "img.jpg")
    p = tmp_path / "count.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in [
        {"image": "img.jpg", "problem": "How many cubes are there?", "solution": "<answer>3</answer>"},
        {"image": "img.jpg", "question": "How many spheres?", "answer": 2},
        {"image": "img.jpg", "question": "How many?", "answer": "2.5"},
    ]) + "\n")
    task = TASKS.get("counting")(train_path=str(p))
    ds = task.examples("train")
    assert len(ds) == 2 and ds.skipped[0][0] == 3 and "not a count" in ds.skipped[0][1]
    ex = ds[0]
    assert ex["answer"] == "3" and ex["question"] == "How many cubes are there?"
    target = task.target(ex)
    assert target == "<think>I count 3.</think><answer>3</answer>"
    assert REWARDS.get("accuracy")([target], [ex]) == [1.0]
    assert task.hints(ex)[-1] == "The answer is 3." and task.visualize(ex, target) is not None


def test_counting_reads_r1_v_superclevr_file_as_it_ships(tmp_path):
    """R1-V's src/eval/prompts/superclevr_test200_counting_problems.jsonl: ``image_path`` (relative
    to the SuperCLEVR images folder), ``question``, ``ground_truth`` an integer."""
    (tmp_path / "images").mkdir()
    Image.new("RGB", (64, 48)).save(tmp_path / "images" / "superCLEVR_new_025000.png")
    p = tmp_path / "superclevr_test200_counting_problems.jsonl"
    p.write_text(json.dumps({"image_path": "./images/superCLEVR_new_025000.png",
                             "question": "How many different items are there in the image?", "ground_truth": 7}) + "\n")
    task = TASKS.get("counting")(eval_path=str(p))
    (ex,) = task.examples("eval")
    assert ex["answer"] == "7" and ex["question"] == "How many different items are there in the image?"
    assert ex["image_path"] == str(tmp_path / "images" / "superCLEVR_new_025000.png") and ex["image_size"] == (64, 48)
    assert REWARDS.get("accuracy")(["<think>.</think><answer>7</answer>"], [ex]) == [1.0]


def test_an_inverted_box_written_as_text_in_a_conversation_is_refused(tmp_path):
    """VLM-R1's ``conversations`` carry the box as text in the gpt turn. An inverted one, as text
    or as a list, is refused and counted, not reordered into a box the file may not mean (it may
    be another layout); a model's answer is still read with its corners ordered."""
    from mmrl.parsing import parse_box

    assert parse_box("[300, 40, 100, 200]") == (100, 40, 300, 200)  # answers: lenient
    assert parse_box("[300, 40, 100, 200]", order=False) == (300, 40, 100, 200)  # labels: as written

    def conversation(box_text):
        return {"image": "img.jpg", "conversations": [{"from": "human", "value": "<image>Where is the car?"},
                                                      {"from": "gpt", "value": box_text}]}
    p = fixture(tmp_path, [conversation("[10, 20, 50, 80]"), conversation("[300, 40, 100, 200]"),
                           {"image": "img.jpg", "problem": "the car", "solution": [150, 40, 100, 90]}])
    ds = TASKS.get("grounding")(train_path=str(p)).examples("train")
    assert {ds[i]["box"] for i in range(len(ds))} == {(10, 20, 50, 80)}
    assert sorted(ds.bad_targets) == [f"{p}:2", f"{p}:3"]
    assert all("inverted" in reason for reason in ds.bad_targets.values())
    assert ds.stats()["bad_targets"] == 2


def test_a_file_of_0_1_boxes_read_as_pixels_stops_naming_box_space(tmp_path):
    """[0.05, 0.2, 0.25, 0.8] on the 200x100 image means pixels (10, 20, 50, 80); read as pixels it
    would be a 0.2 x 0.6 px box that passes every per-box check."""
    p = fixture(tmp_path, [{"image": "img.jpg", "problem": "the man", "solution": [0.05, 0.2, 0.25, 0.8]},
                           {"image": "img.jpg", "problem": "the car", "solution": [0.5, 0.1, 0.95, 0.6]}])
    task = TASKS.get("grounding")(train_path=str(p))
    with pytest.raises(ValueError) as err:
        task.examples("train")
    message = str(err.value)
    assert message.startswith(f"{p}: every box lies within [0, 1] (2 boxes, e.g. {p}:1: [0.05, 0.2, 0.25, 0.8])")
    assert "200x100 images" in message and message.endswith("set task.options.box_space=norm (it is 'pixel')")
    assert "\n" not in message
    ok = TASKS.get("grounding")(train_path=str(p), box_space="norm")
    assert ok.examples("train")[0]["box"] == pytest.approx((10, 20, 50, 80))
    # one box beyond 1 in the file: pixels as said (a 1-px box among real ones may be meant)
    mixed = fixture(tmp_path, [{"image": "img.jpg", "problem": "dot", "solution": [0, 0, 1, 1]},
                               {"image": "img.jpg", "problem": "car", "solution": [100, 10, 190, 60]}])
    assert len(TASKS.get("grounding")(train_path=str(mixed)).examples("train")) == 2
    # on images of a few pixels a 0-1 box may be meant in pixels
    Image.new("RGB", (4, 4), "white").save(tmp_path / "tiny.png")
    tiny = tmp_path / "tiny.jsonl"
    tiny.write_text(json.dumps({"image": "tiny.png", "problem": "x", "solution": [0, 0, 1, 1]}) + "\n")
    assert TASKS.get("grounding")(train_path=str(tiny)).examples("train")[0]["box"] == (0, 0, 1, 1)


def test_detection_file_of_0_1_boxes_stops_too(tmp_path):
    Image.new("RGB", (64, 48), "white").save(tmp_path / "img.png")
    p = tmp_path / "det.jsonl"
    p.write_text(json.dumps({"image": "img.png", "problem": "Find every cup.", "boxes": []}) + "\n"
                 + json.dumps({"image": "img.png", "problem": "Find every cup.",
                               "boxes": [[0.1, 0.1, 0.5, 0.5], [0.6, 0.2, 0.9, 1.0]]}) + "\n")
    with pytest.raises(ValueError, match=r"det\.jsonl: every box lies within \[0, 1\] \(2 boxes, e\.g\. .*det\.jsonl:2: "
                                         r"\[0\.1, 0\.1, 0\.5, 0\.5\]\).*64x48 images.*box_space=norm"):
        TASKS.get("detection")(train_path=str(p)).examples("train")
    boxes = TASKS.get("detection")(train_path=str(p), box_space="norm").examples("train")[1]["boxes"]
    assert boxes == [pytest.approx((6.4, 4.8, 32, 24)), pytest.approx((38.4, 9.6, 57.6, 48))]
