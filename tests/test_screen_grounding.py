"""Screen grounding: ScreenSpot readers, parse_point, click and GUI-G² rewards in every model frame.

The key check: a perfect click written in the model's own space (Qwen2.5-VL: pixels of the resized
screenshot; Qwen2-VL / Qwen3-VL: 0-1000) scores 1 on phone- and desktop-sized screens under real
pixel budgets, and the same click written in the wrong frame scores 0.
"""

from __future__ import annotations

import json
import logging
import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.data.records import BadRecord
from mmrl.data.screenspot import parse_entry, read_screenspot, read_screenspot_pro
from mmrl.measures.screen import ALPHA, gaussian_coverage, gaussian_point
from mmrl.media.coords import Frame, convert_points, output_space, pixels_to_prediction, qwen_frame
from mmrl.parsing import parse_point
from mmrl.registry import REWARDS

SCREEN_REWARDS = ("click_accuracy", "gui_g2_point", "gui_g2_coverage")


def reward(name):
    return REWARDS.get(name)


def _png(path, size=(8, 8)):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, "white").save(path)


# -- readers ---------------------------------------------------------------------------------------
V2_DESKTOP = [
    {"img_filename": "pc_ede36f9b.png", "bbox": [910, 78, 44, 34], "instruction": "close this window",
     "data_type": "icon", "data_source": "windows"},
    {"img_filename": "pc_ede36f9b.png", "bbox": [12, 40, 100, 20], "instruction": "the File menu",
     "data_type": "text", "data_source": "windows"},
]
V2_MOBILE = [
    {"img_filename": "mobile_3c5f.png", "bbox": [1000, 300, 60, 40], "instruction": "turn on Wi-Fi",
     "data_type": "icon", "data_source": "ios"},
]
PRO = [
    {"img_filename": "vscode_macos/screenshot_2024-12-03_15-15-02.png", "bbox": [473, 183, 503, 219],
     "instruction": "Refresh the file explorer.", "instruction_cn": "刷新文件资源管理器。",
     "id": "vscode_macos_0",
     "application": "vscode", "platform": "macos", "img_size": [2560, 1664], "ui_type": "icon", "group": "Dev"},
]


def write_v2(tmp_path):
    """The ScreenSpot-v2 layout: three JSON arrays beside a screenspotv2_image folder."""
    images = tmp_path / "screenspotv2_image"
    _png(images / "pc_ede36f9b.png")
    _png(images / "mobile_3c5f.png")
    for name, rows in (("desktop", V2_DESKTOP), ("mobile", V2_MOBILE), ("web", [])):
        (tmp_path / f"screenspot_{name}_v2.json").write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return tmp_path, images


def write_pro(tmp_path, rows=PRO):
    """The ScreenSpot-Pro layout: annotations/<app>_<platform>.json, images/<app>_<platform>/*.png."""
    _png(tmp_path / "images" / "vscode_macos" / "screenshot_2024-12-03_15-15-02.png")
    path = tmp_path / "annotations" / "vscode_macos.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, ensure_ascii=False, indent=2), encoding="utf-8")
    return path, tmp_path / "images"


def test_screenspot_v2_files_read_as_they_are(tmp_path):
    folder, images = write_v2(tmp_path)
    data = read_screenspot(folder, image_root=images)  # the folder: desktop, mobile and (empty) web
    assert len(data) == 3 and data.stats() == {"examples": 3, "skipped_lines": 0, "bad_images": 0,
                                                  "missing_images": 0}
    close = data[0]
    assert close["box"] == (910.0, 78.0, 954.0, 112.0)  # [x, y, w, h] -> corners
    assert close["image"] == str(images / "pc_ede36f9b.png")
    assert (close["instruction"], close["data_type"], close["data_source"]) == ("close this window", "icon", "windows")
    assert "bbox" not in close and "img_filename" not in close
    assert data[2]["box"] == (1000.0, 300.0, 1060.0, 340.0) and data[2]["data_source"] == "ios"
    one = read_screenspot(folder / "screenspot_mobile_v2.json", images)
    assert [r["instruction"] for r in one] == ["turn on Wi-Fi"]


def test_screenspot_pro_file_read_as_it_is(tmp_path):
    path, images = write_pro(tmp_path)
    (record,) = read_screenspot_pro(path, image_root=images)
    assert record["box"] == (473.0, 183.0, 503.0, 219.0)  # [x1, y1, x2, y2] kept
    assert record["image"] == str(images / "vscode_macos" / "screenshot_2024-12-03_15-15-02.png")
    assert record["img_size"] == [2560, 1664]
    for key in ("ui_type", "group", "platform", "application", "id", "instruction_cn"):
        assert record[key] == PRO[0][key]  # extra fields kept as given
    assert record["data_type"] == "icon"  # ui_type, under the key ScreenSpot uses
    assert len(read_screenspot_pro(path.parent, images)) == 1  # the annotations folder


def test_bad_entries_are_skipped_naming_file_entry_and_key(tmp_path, caplog):
    _png(tmp_path / "ok.png")
    good = {"img_filename": "ok.png", "bbox": [1, 2, 3, 4], "instruction": "ok", "data_type": "text",
            "data_source": "macos"}
    rows = [good,
            {**good, "bbox": [1, 2, 3]},
            {**good, "instruction": ""},
            "not an object",
            {**good, "img_filename": "absent.png"},
            {**good, "bbox": [1, 2, 0, 4]},
            {**good, "bbox": [1, 2, True, 4]}]
    path = tmp_path / "screenspot_web_v2.json"
    path.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        data = read_screenspot(path)  # images start at the file's folder by default
    assert len(data) == 1 and data.stats() == {"examples": 1, "skipped_lines": 5, "bad_images": 1,
                                                  "missing_images": 1}
    where = dict(data.skipped)
    for index, key in ((1, "'bbox'"), (2, "'instruction'"), (5, "'bbox'"), (6, "'bbox'")):
        (reason,) = [r for w, r in where.items() if w.endswith(f"(entry {index})")]
        assert key in reason, (index, reason)
    assert all(w.startswith(f"{path}:") for w in where)
    assert "[x, y, w, h]" in next(r for w, r in where.items() if w.endswith("(entry 1)"))
    assert "JSON object" in next(r for w, r in where.items() if w.endswith("(entry 3)"))
    ((missing_where, missing_path),) = data.missing_images
    assert missing_where.endswith("(entry 4)") and missing_path == str(tmp_path / "absent.png")
    assert "entry 1" in caplog.text and "image_root" in caplog.text
    with pytest.raises(ValueError, match=r"screenspot_web_v2\.json:\d+ \(entry 1\): 'bbox'.*fix or remove"):
        read_screenspot(path, strict=True)


def test_missing_images_are_an_error_in_strict_mode_and_when_nothing_is_left(tmp_path):
    path, images = write_pro(tmp_path)
    with pytest.raises(ValueError, match=r"vscode_macos\.json:\d+ \(entry 0\): image .* does not exist.*image_root"):
        read_screenspot_pro(path, image_root=tmp_path / "wrong", strict=True)
    with pytest.raises(ValueError, match=r"has no usable entry; first problem: .*\(entry 0\)"):
        read_screenspot_pro(path, image_root=tmp_path / "wrong")


def test_each_layout_refuses_the_other_with_a_hint(tmp_path):
    folder, images = write_v2(tmp_path / "v2")
    with pytest.raises(ValueError, match=r"\(entry 0\): 'bbox' \[910, 78, 44, 34\] .*no area.*read_screenspot\b"):
        read_screenspot_pro(folder / "screenspot_desktop_v2.json", images, strict=True)
    path, images = write_pro(tmp_path / "pro", [{**PRO[0], "bbox": [2000, 1500, 2400, 1600]}])
    with pytest.raises(ValueError, match=r"'bbox' .* outside .*'img_size'.*read_screenspot_pro"):
        read_screenspot(path, images, strict=True)  # [x, y, w, h] would end at (4400, 3100)
    with pytest.raises(BadRecord, match=r"'img_size' must be"):
        parse_entry({**PRO[0], "img_size": None}, "xyxy")


def test_files_that_are_not_screenspot_json_are_errors_naming_them(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('[{"img_filename": "a.png",\n "bbox": [1, 2, 3, 4],, }]', encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.json:2: not valid JSON"):
        read_screenspot(bad)
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        read_screenspot(tmp_path / "nowhere.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .json annotation file"):
        read_screenspot_pro(tmp_path / "empty")


# -- parse_point -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("(120, 45)", (120.0, 45.0)),
    ("[120,45]", (120.0, 45.0)),
    ("click at (120.5, 45)", (120.5, 45.0)),
    ("x=120, y=45", (120.0, 45.0)),
    ("x: 120 y: 45", (120.0, 45.0)),
    ('{"point": [120, 45]}', (120.0, 45.0)),
    ('{"coordinate": [120, 45]}', (120.0, 45.0)),
    ('[{"point_2d": [120, 45], "label": "Wi-Fi"}]', (120.0, 45.0)),
    ('{"x": 120, "y": 45}', (120.0, 45.0)),
    ("<point>120 45</point>", (120.0, 45.0)),
    ("Step 2: <point>120 45</point>", (120.0, 45.0)),
    ("<point>(120,45)</point>", (120.0, 45.0)),
    ("120 45", (120.0, 45.0)),
    ("[100, 40, 140, 50]", (120.0, 45.0)),  # a box gives its centre
    ("(140, 50), (100, 40)", (120.0, 45.0)),  # corner pairs too, in any order
    ('{"bbox_2d": [100, 40, 140, 50]}', (120.0, 45.0)),
    ("no point here", None),
    ("1 2 3", None),
    ("[1e999, 45]", None),
    ("", None),
    (None, None),
    (42, None),
])
def test_parse_point_forms(text, expected):
    assert parse_point(text) == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(["<point>", "</point>", "<answer>", "</answer>", "[", "]", "(", ")",
                                           ",", " ", "x=", "y:", '"x":', "1e999", "nan", "-", "."]),
                          st.integers(-10**30, 10**30).map(str), st.text(max_size=3)), max_size=16).map("".join))
def test_parse_point_and_screen_rewards_never_raise(text):
    point = parse_point(text)
    assert point is None or all(math.isfinite(v) for v in point)
    ex = {"box": (10, 20, 40, 50), "image_size": (112, 112), "pred_space": "rel1000", "frame": Frame(112, 112)}
    for name in SCREEN_REWARDS:
        for example in (ex, {"box": (10, 20, 40, 50)}):
            (value,) = reward(name)([f"<answer>{text}</answer>"], [example])
            assert value is None or (isinstance(value, float) and 0.0 <= value <= 1.0)


# -- GUI-G² hand-worked values ---------------------------------------------------------------------
BOX = (100.0, 200.0, 140.0, 220.0)  # 40 x 20: sigma_x = 20, sigma_y = 10 with ALPHA = 0.5


def test_gaussian_point_hand_values():
    assert ALPHA == 0.5
    assert gaussian_point((120, 210), BOX) == 1.0  # the centre
    assert gaussian_point((140, 210), BOX) == pytest.approx(math.exp(-0.5))  # one sigma in x
    assert gaussian_point((120, 200), BOX) == pytest.approx(math.exp(-0.5))  # one sigma in y
    assert gaussian_point((140, 220), BOX) == pytest.approx(math.exp(-1.0))  # one in each
    assert gaussian_point((160, 210), BOX) == pytest.approx(math.exp(-2.0))  # two sigma in x
    assert gaussian_point((1e308, 210), BOX) == 0.0
    assert gaussian_point((120, 210), (120, 200, 120, 220)) == 1.0  # zero width: exact x only
    assert gaussian_point((121, 210), (120, 200, 120, 220)) == 0.0


def test_gaussian_coverage_hand_values():
    assert gaussian_coverage(BOX, BOX) == pytest.approx(1.0)
    # same size, shifted one width in x: exp(-d^2 / (4 (s^2 + s^2))) with s = w/2 -> exp(-1/2)
    assert gaussian_coverage((140, 200, 180, 220), BOX) == pytest.approx(math.exp(-0.5))
    # same centre, twice as wide: sqrt(2 * 2s * s / (4s^2 + s^2)) = sqrt(4/5)
    assert gaussian_coverage((80, 200, 160, 220), BOX) == pytest.approx(math.sqrt(0.8))
    assert gaussian_coverage((120, 200, 120, 220), BOX) == 0.0  # no width: no mass to cover
    assert gaussian_coverage((-1e308, 200, 1e308, 220), BOX) == 0.0
    # the official code's formula (Bhattacharyya coefficient of the two Gaussians), generic case
    pred = (90.0, 190.0, 170.0, 215.0)
    mp = ((pred[0] + pred[2]) / 2, (pred[1] + pred[3]) / 2)
    mg = ((BOX[0] + BOX[2]) / 2, (BOX[1] + BOX[3]) / 2)
    sp = (0.5 * (pred[2] - pred[0]), 0.5 * (pred[3] - pred[1]))
    sg = (0.5 * (BOX[2] - BOX[0]), 0.5 * (BOX[3] - BOX[1]))
    avg = [(a * a + b * b) / 2 for a, b in zip(sp, sg)]
    term1 = sum((a - b) ** 2 / v for a, b, v in zip(mp, mg, avg)) / 8
    term2 = 0.5 * math.log(avg[0] * avg[1] / math.sqrt(sp[0] ** 2 * sp[1] ** 2 * sg[0] ** 2 * sg[1] ** 2))
    assert gaussian_coverage(pred, BOX) == pytest.approx(math.exp(-term1 - term2))


def test_screen_rewards_read_the_answer_block_only():
    ex = {"box": BOX}
    done = "<think>The toggle is near (5, 5).</think><answer>(120, 210)</answer>"
    assert reward("click_accuracy")([done, "<answer>(99, 210)</answer>", "(120, 210)", "<answer>none</answer>"],
                                    [ex] * 4) == [1.0, 0.0, None, None]
    assert reward("click_accuracy")(["<answer>[100, 200, 140, 220]</answer>"], [ex]) == [1.0]  # box centre
    point = reward("gui_g2_point")
    assert point([done, "<answer>(140, 210)</answer>"], [ex] * 2) == pytest.approx([1.0, math.exp(-0.5)])
    assert reward("gui_g2_point")(["<answer>[100, 200, 140, 220]</answer>"], [ex]) == [1.0]
    assert point(["<answer>(140, 210)</answer>"], [ex], alpha=1.0) == pytest.approx([math.exp(-0.125)])
    cover = reward("gui_g2_coverage")(["<answer>[100, 200, 140, 220]</answer>", "<answer>(120, 210)</answer>"],
                                      [ex] * 2)
    assert cover[0] == pytest.approx(1.0) and cover[1] is None  # a bare click has no extent
    assert reward("click_accuracy")(["<answer>(1, 2)</answer>"], [{}]) == [None]  # no box to hit
    for name in SCREEN_REWARDS:
        with pytest.raises(ValueError, match=f"{name}: 1 completions for 2 examples"):
            reward(name)(["<answer>(1, 2)</answer>"], [ex, ex])
    with pytest.raises(ValueError, match="alpha"):
        reward("gui_g2_point")(["<answer>(1, 2)</answer>"], [ex], alpha=0)


# -- the coordinate frame of each model family, on real screen sizes -------------------------------
PHONE, DESKTOP = (1170, 2532), (2560, 1440)
# Small elements: a Wi-Fi toggle near the top right of the phone, one near its bottom edge, and a
# 30 x 24 close button in the desktop's top-right corner (original pixels).
ELEMENTS = {PHONE: [(1000.0, 300.0, 1060.0, 340.0), (1090.0, 2490.0, 1130.0, 2510.0)],
            DESKTOP: [(2400.0, 20.0, 2430.0, 44.0)]}
# Qwen2.5-VL's own budget (preprocessor_config: 3136 .. 12845056) and a common RL training budget.
BUDGETS = (12845056, 1003520)


def qwen25_processor(max_pixels):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=max_pixels)  # patch 14, merge 2


def qwen3_processor(max_pixels):
    """Qwen3-VL's image processor settings (patch 16, merge 2, budget as size edges)."""
    return SimpleNamespace(size={"shortest_edge": 65536, "longest_edge": max_pixels}, patch_size=16, merge_size=2)


def family_example(model_type, size, box, max_pixels):
    """The example as the trainer records it (VLMPolicy.prepare_examples): the family's answer
    space and the screenshot's frame under the policy's image processor."""
    processor = qwen3_processor(max_pixels) if model_type.startswith("qwen3") else qwen25_processor(max_pixels)
    return {"box": box, "image_size": size, "pred_space": output_space(model_type),
            "frame": qwen_frame(size, processor)}


def click(point) -> str:
    """What the model writes: integers in its space."""
    return f"<answer>({round(point[0])}, {round(point[1])})</answer>"


def centre(box):
    return ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)


@pytest.mark.parametrize("max_pixels", BUDGETS)
@pytest.mark.parametrize("size", [PHONE, DESKTOP], ids=["phone", "desktop"])
@pytest.mark.parametrize("model_type", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl"])
def test_a_perfect_click_in_the_model_space_scores_one(model_type, size, max_pixels):
    for box in ELEMENTS[size]:
        ex = family_example(model_type, size, box, max_pixels)
        answer = click(pixels_to_prediction(centre(box), ex))
        assert reward("click_accuracy")([answer], [ex]) == [1.0], (answer, ex["frame"])
        assert reward("gui_g2_point")([answer], [ex])[0] >= 0.95, answer
        as_box = "<answer>[" + ", ".join(str(round(v)) for v in pixels_to_prediction(box, ex)) + "]</answer>"
        assert reward("click_accuracy")([as_box], [ex]) == [1.0]
        assert reward("gui_g2_coverage")([as_box], [ex])[0] >= 0.9, as_box
        assert reward("iou")([as_box], [ex])[0] >= 0.8, as_box


@pytest.mark.parametrize("max_pixels", BUDGETS)
@pytest.mark.parametrize("size", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_a_click_in_the_wrong_frame_scores_zero(size, max_pixels):
    for box in ELEMENTS[size]:
        c = centre(box)
        qwen25 = family_example("qwen2_5_vl", size, box, max_pixels)
        assert qwen25["frame"].resized_width != size[0]  # the resize is not the identity
        for ex in (qwen25, family_example("qwen3_vl", size, box, max_pixels)):
            others = {"rel1000": convert_points(c, "pixel", "rel1000", ex["frame"]),
                      "resized": convert_points(c, "pixel", "resized", ex["frame"])}
            others.pop(ex["pred_space"])
            (wrong,) = others.values()  # the other family's space
            for answer in (click(wrong), click(c) if ex["pred_space"] == "rel1000" else None):
                if answer is None:
                    continue
                assert reward("click_accuracy")([answer], [ex]) == [0.0], (ex["pred_space"], answer)
                assert reward("gui_g2_point")([answer], [ex])[0] < 0.05
    # Original pixels given to Qwen2.5-VL: far off under a training budget; under the default
    # budget the resize is within 1% of the identity, yet that still misses a small element at
    # the bottom of a tall phone screen (2532 -> 2520 rows: 12 px at the bottom edge).
    if max_pixels == 1003520 or size == PHONE:
        box = ELEMENTS[size][-1]
        ex = family_example("qwen2_5_vl", size, box, max_pixels)
        assert reward("click_accuracy")([click(centre(box))], [ex]) == [0.0]
