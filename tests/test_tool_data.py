"""Data for thinking with images: DeepEyes' parquet rows, V* Bench folders, the zoom_qa task."""

import base64
import io
import json
import logging

import pytest
from PIL import Image

from mmrl import make_task
from mmrl.data.deepeyes import parse_deepeyes_record
from mmrl.data.hrbench import parse_hrbench_record
from mmrl.data.records import FileExamples
from mmrl.data.vstar import VStarExamples
from mmrl.media.coords import qwen_resized_size
from mmrl.tools import ToolBudget, ToolState, make_tool, run_turn


def png(size=(64, 48), color=(200, 10, 10)):
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


SYSTEM = "You are a helpful assistant.\n# Tools\n<tools>{...image_zoom_in_tool...}</tools>"


def deepeyes_row(question="What colour is the car?", truth="red", images=None, user=None, **extra):
    return {
        "data_source": "vstar",
        "prompt": [{"role": "system", "content": SYSTEM},
                   {"role": "user", "content": user if user is not None else f"<image>\n{question} Think first."}],
        "images": images if images is not None else [{"bytes": png(), "path": "car.png"}],
        "ability": "vl_chart", "env_name": "visual_toolbox_v5",
        "reward_model": {"style": "model", "ground_truth": truth},
        "extra_info": {"split": "train", "index": "0", "answer": truth, "question": question},
        **extra,
    }


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def test_deepeyes_parquet_rows(tmp_path, caplog):
    rows = [deepeyes_row(),
            deepeyes_row(truth=None),  # row 1: no ground truth
            deepeyes_row(images=[]),  # row 2: no image
            deepeyes_row(user="<image><image> two markers, one image"),  # row 3
            deepeyes_row(question="Which sign is blue?", truth="B")]
    path = tmp_path / "train.parquet"
    write_parquet(path, rows)
    with caplog.at_level(logging.WARNING):
        data = FileExamples(path, parse_deepeyes_record)
    assert len(data) == 2 and [n for n, _ in data.skipped] == [1, 2, 3]
    assert "row 1 skipped: no 'reward_model.ground_truth'" in caplog.text
    assert "row 2 skipped" in caplog.text and "2 <image> markers for 1 images" in caplog.text
    ex = data[0]
    assert ex["question"] == "What colour is the car?" and ex["answer"] == "red"
    assert ex["system"] == SYSTEM and ex["data_source"] == "vstar" and ex["image"].size == (64, 48)
    assert data[1]["answer"] == "B"
    # the zoom_qa task reads it and keeps DeepEyes' system prompt (its tool list)
    task = make_task("zoom_qa", train_path=str(path))
    messages = task.prompt(task.examples("train")[0])
    assert messages[0] == {"role": "system", "content": SYSTEM}
    assert messages[1]["content"][1]["text"] == "What colour is the car? Think first."


def hrbench_row(index, answer="B", image=None, **options):
    cols = {"A": "red", "B": "blue", "C": "green", "D": "white", **options}
    return {"index": index, "question": "What colour is the flag?", "answer": answer, "category": "single",
            "cycle_category": "0", "image": image if image is not None else base64.b64encode(png()).decode(), **cols}


def test_hrbench_rows(tmp_path, caplog):
    rows = [hrbench_row(0),
            hrbench_row(1, answer="E"),  # no option E
            hrbench_row(2, image="not base64!"),
            hrbench_row(3, C=None, D=None),  # two options: fine
            hrbench_row(4, B=None)]  # a gap in the option columns
    path = tmp_path / "hr_bench_4k.parquet"
    write_parquet(path, rows)
    with caplog.at_level(logging.WARNING):
        data = FileExamples(path, parse_hrbench_record)
    assert len(data) == 2 and [n for n, _ in data.skipped] == [1, 2, 4]
    assert "row 1 skipped: 'answer' must be one of the option letters A, B, C, D" in caplog.text
    assert "not base64" in caplog.text and "without gaps" in caplog.text
    ex = data[0]
    assert ex["answer"] == "blue" and ex["answer_letter"] == "B" and ex["options"] == ["red", "blue", "green", "white"]
    assert ex["image"].size == (64, 48) and ex["id"] == 0 and ex["category"] == "single"
    assert data[1]["options"] == ["red", "blue"]
    # zoom_qa tells HR-Bench rows from DeepEyes rows; "B" scores right through the option letter
    task = make_task("zoom_qa", eval_path=str(path))
    ex = task.examples("eval")[0]
    assert "A. red\nB. blue\nC. green\nD. white" in task.prompt(ex)[0]["content"][1]["text"]
    assert task.reference_answer(ex) == "B" and task.metrics(["<answer>B</answer>"], [ex])["accuracy"] == 1.0


def write_vstar(root, anno, name, category="direct_attributes", size=(200, 100)):
    folder = root / category
    folder.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (0, 0, 255)).save(folder / f"{name}.jpg")
    if anno is not None:
        (folder / f"{name}.json").write_text(anno if isinstance(anno, str) else json.dumps(anno))


def test_vstar_folder(tmp_path, caplog):
    good = {"target_object": ["umbrella"], "bbox": [[10, 20, 30, 40]], "question": "What is the color of the umbrella?",
            "options": ["red", "blue", "green", "white"]}
    write_vstar(tmp_path, good, "sa_1")
    write_vstar(tmp_path, None, "sa_2")  # no JSON
    write_vstar(tmp_path, "{not json", "sa_3")
    write_vstar(tmp_path, {"question": "Q?", "options": ["only one"]}, "sa_4")
    write_vstar(tmp_path, {"question": "Is the cup left or right of the dog?", "options": ["left", "right"]},
                "sa_5", category="relative_position")
    write_vstar(tmp_path, {**good, "bbox": [[190, 20, 30, 40]]}, "sa_6")  # box off the 200 px wide image
    with caplog.at_level(logging.WARNING):
        data = VStarExamples(tmp_path)
    assert len(data) == 3 and len(data.skipped) == 3
    assert "sa_2.jpg skipped: no annotation sa_2.json" in caplog.text and "not valid JSON" in caplog.text
    ex = data.usable(0)
    assert ex["answer"] == "red" and ex["answer_letter"] == "A" and ex["options"][0] == "red"
    assert ex["target_boxes"] == [(10.0, 20.0, 40.0, 60.0)]  # [x, y, w, h] -> [x1, y1, x2, y2]
    assert ex["category"] == "direct_attributes" and ex["id"] == "direct_attributes/sa_1"
    assert data.usable(1) is None and "lies outside" in data.bad_targets[str(tmp_path / "direct_attributes/sa_6.jpg")]
    assert data[2]["category"] == "relative_position" and data[2]["answer"] == "left"
    assert data.stats() == {"examples": 3, "skipped_lines": 3, "bad_images": 0, "bad_targets": 1}
    shuffled = VStarExamples(tmp_path, shuffle_options=True).usable(0)
    again = VStarExamples(tmp_path, shuffle_options=True).usable(0)
    assert shuffled["options"] == again["options"] and shuffled["options"][ord(shuffled["answer_letter"]) - 65] == "red"
    with pytest.raises(FileNotFoundError, match="relative_position"):
        VStarExamples(tmp_path / "direct_attributes" / "..", categories=("direct_attributes", "relative_position", "x"))
    # zoom_qa reads a V* folder and lists the options
    task = make_task("zoom_qa", eval_path=str(tmp_path))
    text = task.prompt(task.examples("eval")[0])[0]["content"][1]["text"]
    assert "Options:\nA. red\nB. blue" in text


def test_zoom_qa_is_deterministic_and_held_out():
    task = make_task("zoom_qa")
    train, eval_ = task.examples("train"), task.examples("eval")
    a, b = train[3], make_task("zoom_qa").examples("train")[3]
    assert a["image"].tobytes() == b["image"].tobytes() and a["answer"] == b["answer"]
    train_ids = {train[i]["id"] for i in range(50)}
    assert not train_ids & {eval_[i]["id"] for i in range(50)}
    assert eval_[0]["image"].tobytes() != train[0]["image"].tobytes()


def test_zoom_qa_target_is_unreadable_at_the_tiny_budget_and_readable_zoomed():
    """At the tiny recipes' budget (max_pixels 12544 = 112x112) the 1024 px canvas is shrunk 9.1
    times: the digit's ink (7 px high) is under N = 1 px, its frame (21 px) under 3 px."""
    task = make_task("zoom_qa")
    ex = task.examples("eval")[0]
    w, h = qwen_resized_size(1024, 1024, 3136, 12544)
    assert (w, h) == (112, 112)
    x1, y1, x2, y2 = ex["target_box"]
    frame = ex["image"].crop((x1, y1, x2, y2))
    ink = frame.crop((5, 5, frame.width - 5, frame.height - 5)).convert("L").point(lambda v: 255 if v < 60 else 0)
    top, bottom = ink.getbbox()[1], ink.getbbox()[3]
    assert 5 <= bottom - top <= 8 and (bottom - top) * h / 1024 < 1.0
    assert (y2 - y1) * h / 1024 < 3.0
    assert frame.getpixel((0, frame.height // 2)) == (220, 0, 0)  # the red frame
    # the reference zoom call through the zoom_in tool shows the frame at the budget's resolution
    zoom = make_tool("zoom_in", min_pixels=12544, max_pixels=12544)
    first_turn = task.reference_turns(ex)[0]
    obs, (rec,) = run_turn(first_turn, {"zoom_in": zoom}, ToolState([ex["image"]], ex), ToolBudget())
    # the 16x21 frame (plus a pixel) grows to DeepEyes' 28 px minimum side: 28x39; smart_resize up to
    # min_pixels 12544 scales by sqrt(12544 / (28 * 39)) = 3.39 and ceils to multiples of 28: 112x140
    assert rec["ok"] and obs[0].image.size == (112, 140)
    gx1, gy1, gx2, gy2 = rec["box"]
    assert gx1 <= x1 and gy1 <= y1 and gx2 >= x2 and gy2 >= y2  # the whole frame is in view
    assert (bottom - top) * obs[0].image.height / (gy2 - gy1) >= 15  # the digit is 15+ px high now
    ex = {**ex, "tool_calls": [rec]}
    trajectory = first_turn + "<tool_response><image></tool_response>" + task.target(ex)
    assert task.target(ex) == f"<think>The zoomed image shows {ex['answer']}.</think><answer>{ex['answer']}</answer>"
    m = task.metrics([trajectory], [ex])
    assert m["accuracy"] == 1.0 and m["format_error"] == 0.0 and m["tool/rapr"] == 1.0 and 0 < m["crop_iou"] < 1
    assert REWARDS_DEEPEYES([trajectory], [ex]) == [pytest.approx(2.0)]


def REWARDS_DEEPEYES(completions, examples):
    from mmrl.registry import REWARDS

    return REWARDS.get("deepeyes_rule_judge")(completions, examples)


def test_zoom_qa_options_are_checked():
    with pytest.raises(ValueError, match="canvas_size"):
        make_task("zoom_qa", canvas_size=20)
    with pytest.raises(ValueError, match="glyph_scale"):
        make_task("zoom_qa", glyph_scale=0)
    assert make_task("zoom_qa", glyph_scale=3).examples("train")[0]["target_box"][3] - \
        make_task("zoom_qa", glyph_scale=3).examples("train")[0]["target_box"][1] == 11 * 3 + 2 * (3 + 2)
    with pytest.raises(ValueError, match="unknown split"):
        make_task("zoom_qa").examples("test")


# -- detail: pattern (the tiny default's task) --------------------------------------------------------
def _pattern_task(**options):
    """The tiny recipe's settings (configs/vlm/zoom_qa_tiny.yaml)."""
    return make_task("zoom_qa", canvas_size=224, grid=2, detail="pattern", pattern_size=80, distractors=3,
                     thinking=False, tools={"zoom_cell": {"grid": 2}}, tools_in_prompt=False, max_turns=1, **options)


def _texture(cell: Image.Image) -> str:
    """A hand-written reader of a full-resolution texture: the pattern whose neighbours along its
    stripes are alike (horizontal: along a row; vertical: along a column; checkerboard: diagonally)."""
    import numpy as np

    a = np.asarray(cell.convert("L"), dtype=float)
    alike = {"horizontal": np.abs(np.diff(a, axis=1)).mean(), "vertical": np.abs(np.diff(a, axis=0)).mean(),
             "checkerboard": np.abs(a[1:, 1:] - a[:-1, :-1]).mean()}
    return min(alike, key=alike.get)


def test_pattern_detail_names_the_cell_and_the_zoomed_cell_shows_the_texture():
    from mmrl.tools import cell_name

    task = _pattern_task()
    answers = set()
    for i in range(12):
        ex = task.examples("eval")[i]
        cell = cell_name(ex["target_box"], 2, 224, 224)
        assert ex["question"] == f'Which pattern fills the square in cell "{cell}"?'
        cells = {cell_name(b, 2, 224, 224) for b in [ex["target_box"], *ex["distractor_boxes"]]}
        assert len(cells) == 4  # one square per cell: zooming another cell shows another square
        call, answer = task.reference_turns(ex)
        assert call == '<tool_call>\n{"name": "zoom_cell", "arguments": {"cell": "%s"}}\n</tool_call>' % cell
        assert answer == f"<answer>{ex['answer']}</answer>"
        obs, [rec] = run_turn(call, task.make_tools(), ToolState([ex["image"]], ex), ToolBudget())
        assert rec["ok"] and obs[0].image.size == (112, 112)  # the cell at full resolution
        x1, y1, x2, y2 = ex["target_box"]
        cx, cy = rec["box"][0], rec["box"][1]
        square = obs[0].image.crop((x1 - cx + 16, y1 - cy + 16, x2 - cx - 16, y2 - cy - 16))  # inside the fade
        assert _texture(square) == ex["answer"]
        answers.add(ex["answer"])
    assert answers == {"horizontal", "vertical", "checkerboard"}
    text = task.prompt(ex)[0]["content"][1]["text"]
    assert "zoom_cell" in text and "(checkerboard, horizontal, vertical)" in text


@pytest.mark.parametrize("canvas", [224, 448])
def test_pattern_is_the_same_flat_square_for_every_texture_at_the_tiny_budget(canvas):
    """The tiny recipes' processor (max_pixels 12544: a 224 px canvas at 112 px, 2x smaller; a 448 px
    one 4x) gives the same pixel values, to about two grey levels, whichever texture fills a square,
    black and white at full contrast: each texture is half dark, half light with period 2 px, and
    its contrast fades in over 16 px from the edges (without the fade: 0.21 at 4x)."""
    import numpy as np
    from assets import asset_path
    from transformers import AutoImageProcessor

    from mmrl.tasks.zoom_qa import PATTERNS, draw_pattern

    processor = AutoImageProcessor.from_pretrained(str(asset_path("tiny-qwen2.5-vl")))
    for box in ((37, 50, 117, 130), (120, 130, 200, 210), (121, 131, 201, 211)):  # odd and even offsets
        values = {}
        for name in PATTERNS:
            image = Image.new("RGB", (canvas, canvas), (230, 225, 240))
            draw_pattern(image, name, box, (0, 0, 0), (255, 255, 255))
            out = processor(images=[image], return_tensors="pt")
            assert out["image_grid_thw"].tolist() == [[1, 8, 8]]
            values[name] = out["pixel_values"].numpy()
        spread = max(np.abs(values[a] - values[b]).max() for a in values for b in values)
        # normalised units, (v / 255 - mean) / std with std ~0.27: 0.035 is 2.4 grey levels of 255
        assert spread < 0.035, (box, spread)
        assert _texture(image.crop((box[0] + 16, box[1] + 16, box[2] - 16, box[3] - 16))) == name  # the last drawn


def test_pattern_distractors_of_the_same_texture_make_any_zoom_show_the_answer():
    """distractor_pattern: same (the tiny recipe's): every cell's square has the target's texture."""
    task = _pattern_task(distractor_pattern="same")
    for i in range(6):
        ex = task.examples("train")[i]
        for cell in ("A1", "A2", "B1", "B2"):
            from mmrl.tools import call_text

            obs, [rec] = run_turn(call_text("zoom_cell", {"cell": cell}), task.make_tools(),
                                  ToolState([ex["image"]], ex), ToolBudget())
            box = next(b for b in [ex["target_box"], *ex["distractor_boxes"]]
                       if rec["box"][0] <= b[0] and b[2] <= rec["box"][2] and rec["box"][1] <= b[1] and b[3] <= rec["box"][3])
            x, y = box[0] - rec["box"][0], box[1] - rec["box"][1]
            assert _texture(obs[0].image.crop((x + 16, y + 16, x + 64, y + 64))) == ex["answer"]


def test_pattern_options_are_checked():
    with pytest.raises(ValueError, match="detail must be one of"):
        make_task("zoom_qa", detail="colour")
    with pytest.raises(ValueError, match="needs a grid"):
        make_task("zoom_qa", detail="pattern")
    with pytest.raises(ValueError, match="distractor_pattern"):
        make_task("zoom_qa", detail="pattern", grid=2, canvas_size=224, distractors=3, distractor_pattern="other")
    with pytest.raises(ValueError, match="pattern_size"):
        make_task("zoom_qa", detail="pattern", grid=4, canvas_size=448, pattern_size=110)
