"""The eval gallery marks right and wrong by the task's own success measure (what pass@k counts),
not by the reward; an environment task's episodes get one card each, marked by their outcome; the
contact sheet keeps each picture's aspect ratio (a video's frame strip is a wide tile)."""

from __future__ import annotations

import json
import re

import numpy as np
import torch
from PIL import Image

from conftest import make_config
from mmrl.core.episodes import episode_rows
from mmrl.core.reward_computer import make_reward_computer
from mmrl.data.shapes_t2i import render
from mmrl.registry import TASKS, load_plugins
from mmrl.runs.contact_sheet import CHAR, LINE, TITLE, caption_height, wrap
from mmrl.runs.gallery import (RIGHT, SHEET_PICTURES, SHEET_STRIPS, STRIP_WIDTH, WRONG, sample_caption,
                               save_samples_grid, write_gallery)


def card_marks(page: str) -> list[bool]:
    return [m == "right" for m in re.findall(r'class="card (right|wrong)', page)]


def sheet_marks(sheet: Image.Image, y: int) -> list[bool]:
    """The colours of the tiles' top borders along row ``y`` of the sheet, left to right."""
    runs, previous = [], None
    for x in range(sheet.width):
        colour = sheet.getpixel((x, y))
        if colour in (RIGHT, WRONG) and colour != previous:
            runs.append(colour == RIGHT)
        previous = colour
    return runs


def box_of(sheet: Image.Image, colour) -> tuple[int, int, int, int]:
    """The bounding box (left, top, right, bottom; exclusive) of the pixels of ``colour``."""
    ys, xs = np.nonzero(np.all(np.asarray(sheet) == np.array(colour, dtype=np.uint8), axis=-1))
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def test_composition_marks_follow_geneval_accuracy_not_the_reward(tmp_path):
    """A picture with one shape too many passes 3 of 4 checks (reward 0.75 >= half the best) but
    fails GenEval; reward-based marks called it right."""
    load_plugins()
    task = TASKS.get("composition")()
    spec = [{"count": 2, "color": "red", "shape": "circle", "position": None}]
    extra = [{**spec[0], "count": 3}]
    examples = [{"spec": spec, "prompt": "two red circles"}] * 3
    images = [render(spec, 0), render(extra, 1), render(spec, 2)]
    total, comps, _ = make_reward_computer(task, make_config().task)(images, examples, group_ids=torch.arange(3))
    assert total.tolist() == [1.0, 0.75, 1.0]  # the wrong picture's reward is well above half the best
    summary = write_gallery(tmp_path, task, images, examples, total.tolist(), comps, best=1.0)
    solved = [task.success(im, ex) for im, ex in zip(images, examples)]
    assert solved == [True, False, True]
    page = (tmp_path / "index.html").read_text()
    assert card_marks(page) == solved
    accuracy = task.metrics(images, examples)["geneval_accuracy"]
    assert summary["right"] == round(accuracy * 3) == 2 and summary["marked_by"] == "success"
    assert "2 of 3 right" in page and "geneval_accuracy" in page
    sheet = Image.open(tmp_path / "gallery.png").convert("RGB")
    assert sheet_marks(sheet, TITLE + 6) == solved  # the first row's top borders


def test_counting_marks_follow_accuracy_when_reward_says_otherwise(tmp_path):
    """Rewards that disagree with the answers both ways (a right answer scored low, a wrong one
    high): the marks and "k of n right" are the task's accuracy."""
    task = TASKS.get("counting")()
    exs = [task.examples("eval")[i] for i in range(4)]
    completions = [task.target(exs[0]), "<answer>99</answer>", task.target(exs[2]), "no answer"]
    rewards = [0.1, 1.5, 1.5, 0.0]
    summary = write_gallery(tmp_path, task, completions, exs, rewards, {"accuracy": rewards}, 1.5)
    solved = [task.success(c, ex) for c, ex in zip(completions, exs)]
    assert solved == [True, False, True, False]
    page = (tmp_path / "index.html").read_text()
    assert card_marks(page) == solved
    assert summary == {"right": 2, "shown": 4, "marked_by": "success", "unit": "example"}
    assert summary["right"] == task.metrics(completions, exs)["accuracy"] * 4
    assert "2 of 4 right" in page and "&lt;answer&gt;99&lt;/answer&gt;" in page  # escaped
    sheet = Image.open(tmp_path / "gallery.png").convert("RGB")
    assert sheet_marks(sheet, TITLE + 6) == solved
    assert json.loads((tmp_path / "summary.json").read_text())["right"] == 2


def test_a_task_without_per_example_success_is_marked_by_reward_and_says_so(tmp_path):
    class NoSuccess(TASKS.get("counting")):
        success_metric = None

    task = NoSuccess()
    exs = [task.examples("eval")[i] for i in range(3)]
    completions = [task.target(exs[0]), "<answer>99</answer>", "no answer"]
    summary = write_gallery(tmp_path, task, completions, exs, [0.5, 1.0, 0.0], {}, 1.5)
    assert summary["right"] == 1 and summary["marked_by"] == "reward"  # only 1.0 >= 0.75
    page = (tmp_path / "index.html").read_text()
    assert card_marks(page) == [False, True, False]
    assert "this task has no per-example success" in page


def gui_rows(task):
    """Two hand-made episodes of the synthetic phone as the runner lays them out (rows by turn,
    then episode): episode 0 succeeds in 2 steps with step rewards 0; episode 1 fails after 3
    steps with step rewards 1 (reward and outcome disagree)."""
    spec = task.examples("eval")[0]
    obs = task.make_env().reset(spec["task"])
    outcome = {0: {"episode_success": True, "episode_return": 0.0, "episode_length": 2},
               1: {"episode_success": False, "episode_return": 3.0, "episode_length": 3}}
    rows = []
    for t in range(3):
        for e in (0, 1):
            if t < outcome[e]["episode_length"]:
                rows.append({**task.step_example(spec, obs, []), "episode_id": e, "step_index": t,
                             "step_reward": float(e), "step_valid": True, "step_message": f"m{e}{t}", **outcome[e]})
    completions = [f'<answer>{{"action": "click", "point": [{10 + i}, 20]}}</answer>' for i in range(len(rows))]
    return completions, rows


def test_episodes_get_one_card_each_marked_by_their_outcome(tmp_path):
    load_plugins()
    task = TASKS.get("gui_env")()
    completions, rows = gui_rows(task)
    rewards = [row["step_reward"] for row in rows]
    summary = write_gallery(tmp_path, task, completions, rows, rewards, {"env_reward": rewards}, 1.0,
                            viewer="episodes/index.html", episodes=episode_rows(rows))
    firsts = [next(i for i, r in enumerate(rows) if r["episode_id"] == e and r["step_index"] == 0) for e in (0, 1)]
    solved = [task.success(completions[i], rows[i]) for i in firsts]  # what pass@k judges
    assert solved == [True, False]
    assert summary == {"right": 1, "shown": 2, "marked_by": "success", "unit": "episode"}
    assert summary["right"] == task.metrics(completions, rows)["success"] * 2
    page = (tmp_path / "index.html").read_text()
    assert card_marks(page) == solved and "1 of 2 right" in page and 'href="episodes/index.html"' in page
    cards = page.split('<div class="card')[1:]
    assert [c.count("<li>") for c in cards] == [2, 3]  # every action, in order
    assert cards[1].index("m10") < cards[1].index("m11") < cards[1].index("m12")
    step = task.visualize(rows[0], completions[0])
    strip = Image.open(tmp_path / "001.png")  # the failed episode's three steps side by side
    assert strip.height == step.height and strip.width > 3 * step.width


def test_a_video_strip_keeps_its_aspect_ratio_on_the_sheet(tmp_path):
    load_plugins()
    task = TASKS.get("video_qa")(kinds=["appear_count"])
    exs = [task.examples("eval")[i] for i in range(2)]
    completions = [task.target(exs[0]), "<answer>99</answer>"]
    write_gallery(tmp_path, task, completions, exs, [1.5, 0.0], {}, 1.5)
    strip = task.visualize(exs[0], completions[0])
    assert strip.width > 4 * strip.height  # a frame strip
    sheet = Image.open(tmp_path / "gallery.png").convert("RGB")
    border = 3
    right, wrong = box_of(sheet, RIGHT), box_of(sheet, WRONG)
    for left, top, r, bottom in (right, wrong):
        w, h = r - left - 2 * border, bottom - top - 2 * border  # the picture inside its border
        assert abs(w * strip.height - h * strip.width) <= max(strip.size)  # the aspect kept, to a pixel
        assert w >= 0.9 * sheet.width - 2 * border  # a wide tile across the row, not a 224-px thumbnail
    assert wrong[1] > right[3]  # one strip per row
    assert sheet.height < 2 * (right[3] - right[1]) + 120  # no big coloured field around thin strips


def test_a_video_runs_samples_sheet_shows_a_few_clips_with_frames_large_enough_to_count(tmp_path):
    """Issue 51 item 18: 200 held-out clips made a 24-px strip each in an 11,000-px sheet. The sheet
    now shows the first 4 clips, a strip across a 1280-px sheet: the strip of 8 frames of 112 px
    (frame_strip's scale 2: 8 x (224 + 2) = 1808 x 224 + 18 footer = 242 px) is fitted into
    1280 - 2 x (3 + 6) = 1262 px, a scale of 1262 / 1808 = 0.698, so each frame is 224 x 0.698 =
    156 px tall (>= 96); each tile is marked, and its caption holds the whole completion."""
    load_plugins()
    task = TASKS.get("video_qa")(kinds=["appear_count"])
    exs = [task.examples("eval")[i] for i in range(200)]
    long = "<think>" + "I count the shapes that were not there at the start, frame by frame. " * 3 + "</think>"
    completions = [long + task.target(ex) if i % 2 else "<answer>99</answer>" for i, ex in enumerate(exs)]
    rewards = [1.5 if i % 2 else 0.0 for i in range(200)]
    save_samples_grid(tmp_path / "samples_before.png", task, completions, exs, rewards, best=1.5)
    sheet = Image.open(tmp_path / "samples_before.png").convert("RGB")
    strip = task.visualize(exs[0], completions[0])
    assert strip.size == (1808, 242)
    assert sheet.width == STRIP_WIDTH and sheet.height < 1000  # 4 strips and their captions, not 200
    assert sheet_marks(sheet, TITLE + 6) == [False]  # one strip across the first row, marked wrong
    tops = [y for y in range(1, sheet.height) if sheet.getpixel((6, y)) in (RIGHT, WRONG)
            and sheet.getpixel((6, y - 1)) not in (RIGHT, WRONG)]
    assert len(tops) == SHEET_STRIPS == 4
    left, _, right, _ = box_of(sheet, WRONG)  # the red tiles (clips 0 and 2)
    inner_w = 1280 - 2 * 6 - 2 * 3
    assert right - left - 2 * 3 == inner_w
    outer_h = next(y for y in range(tops[0], sheet.height) if sheet.getpixel((6, y)) != WRONG) - tops[0]
    inner_h = outer_h - 2 * 3
    assert inner_h == round(242 * inner_w / 1808) == 169
    frame_height = inner_h * 224 / 242  # the strip's frames above its footer
    assert 156 <= frame_height < 157 and frame_height >= 96
    # the second tile's caption is the whole completion, wrapped at the tile's width in 6-px characters
    caption = sample_caption(1, True, 1.5, completions[1])
    lines = wrap(caption, (inner_w + 6) // CHAR)
    assert len(lines) == 2 and "".join(lines).replace(" ", "") == caption.replace(" ", "")
    second_bottom = tops[1] + outer_h
    for k in range(len(lines)):  # ink in each line's band under the tile, none in the band after them
        band = sheet.crop((6, second_bottom + 2 + LINE * k, 1274, second_bottom + 2 + LINE * (k + 1)))
        assert min(band.convert("L").getdata()) < 100, k
    assert tops[2] >= second_bottom + caption_height(len(lines))


def test_wrapping_keeps_tags_whole_and_every_character():
    text = "<think>The clip shows three shapes appearing.</think>\n<answer>3</answer>"
    lines = wrap(text, 16)
    assert lines == ["<think>The clip", "shows three", "shapes", "appearing.", "</think>", "<answer>3", "</answer>"]
    assert all(line.count("<") == line.count(">") for line in lines)  # no tag cut across lines
    assert wrap("a" * 20, 8) == ["aaaaaaaa", "aaaaaaaa", "aaaa"]  # a word longer than a line is cut
    many = wrap(" ".join(str(i) for i in range(100)), 9, max_lines=5)  # 100 numbers, 3 a line: 34 lines
    assert many[:2] == ["0 1 2 3 4", "5 6 7 8 9"] and many[-1].endswith("99") and len(many) == 5
    assert many[2].startswith("[...")


def test_the_eval_gallery_sheet_shows_the_first_few_of_its_cards(tmp_path):
    task = TASKS.get("counting")()
    exs = [task.examples("eval")[i] for i in range(16)]
    completions = [task.target(ex) for ex in exs]
    summary = write_gallery(tmp_path, task, completions, exs, [1.5] * 16, {}, 1.5)
    assert summary["shown"] == 16 and len(list(tmp_path.glob("0*.png"))) == 16  # every card on the page
    sheet = Image.open(tmp_path / "gallery.png").convert("RGB")
    rows = [y for y in range(1, sheet.height) if sheet.getpixel((7, y)) == RIGHT
            and sheet.getpixel((7, y - 1)) != RIGHT]
    assert len(rows) == SHEET_PICTURES // 4 == 2  # two rows of four on the sheet
    assert sheet_marks(sheet, TITLE + 6) == [True] * 4


def test_a_narrow_sheet_is_as_wide_as_its_title():
    """Two small tiles under a 90-character title: the sheet widens to the title (6 px a character
    plus the 6-px margins), not cut at the tiles' width."""
    from mmrl.runs.contact_sheet import contact_sheet

    title = "x" * 90
    sheet, boxes = contact_sheet([Image.new("RGB", (100, 200))] * 2, [RIGHT, WRONG], title, width=400)
    assert boxes[-1][2] < 300 and sheet.width == 2 * 6 + 6 * 90 == 552


def test_a_caption_in_any_script_is_drawn_not_raised():
    """A tiny model's completion may hold any character; the sheet's bitmap font draws Latin-1
    only (PIL raised UnicodeEncodeError, which ended the run). Others are drawn as '?': the sheet
    matches one whose caption was written with '?' there."""
    from mmrl.runs.contact_sheet import contact_sheet

    tiles = [Image.new("RGB", (64, 64))]
    odd, _ = contact_sheet(tiles, [WRONG], "t\u4e2d", ["000 wrong r=0.00: J\u4e2d 52\x01\u00e9"], width=200)
    plain, _ = contact_sheet(tiles, [WRONG], "t?", ["000 wrong r=0.00: J? 52\x01\u00e9"], width=200)
    assert odd.tobytes() == plain.tobytes()


def test_a_conditioned_generators_before_after_sheet_shows_the_input(tmp_path):
    """A generator given an input image: the before/after sheet shows the task's picture of each sample
    (an edit's source | result | target), captioned with the instruction, not the result alone; a
    text-to-image generator's grid stays the generated images."""
    load_plugins()
    task = TASKS.get("image_edit")()
    exs = [task.examples("eval")[i] for i in range(3)]
    drawn = []
    visualize = task.visualize
    task.visualize = lambda ex, c: drawn.append(ex["instruction"]) or visualize(ex, c)
    made = [exs[0]["target"], exs[1]["source"], exs[2]["target"]]  # the second: no edit made
    save_samples_grid(tmp_path / "edits.png", task, made, exs, [1.5, 0.5, 1.5])
    assert drawn == [ex["instruction"] for ex in exs]
    sheet = Image.open(tmp_path / "edits.png").convert("RGB")
    assert sheet_marks(sheet, TITLE + 6)[:3] == [True, False, True]
    plain = TASKS.get("composition")()
    plain.visualize = lambda ex, c: drawn.append("t2i")
    scenes = [plain.examples("eval")[i] for i in range(2)]
    save_samples_grid(tmp_path / "t2i.png", plain, [render(ex["spec"], 0, 16) for ex in scenes], scenes, [1.0, 0.0])
    assert "t2i" not in drawn
