"""AndroidControl / GUI-Odyssey episode readers (mmrl.data.gui_episodes) and the gui_actions task.

Small episode files in each layout as the datasets (and their common JSON conversions) ship them:
every action mapped into mmrl's space, GUI-Odyssey's 0-1000 points and boxes to pixels, scroll
directions as the content moves, bad entries skipped with file:line and counted, strict mode;
history flattening; the task's prompt, target and metrics, a perfect answer scoring 1 in a
Qwen2.5-VL (resized pixels) and a 0-1000 policy space; and an AndroidControl file training a step.
"""

from __future__ import annotations

import json
import logging
import re

import pytest

import mmrl
from mmrl.data.gui_episodes import read_android_control, read_episodes, read_gui_odyssey
from mmrl.data.gui_steps import StepExamples, episode_steps, fit_to_image, format_history
from mmrl.measures.gui import format_action, parse_action
from mmrl.media.coords import Frame, qwen_frame
from mmrl.media.draw import FOOTER
from mmrl.registry import REWARDS, load_plugins

GUI_REWARDS = ("gui_action_type", "gui_action_args", "format")
PHONE = (108, 240)  # a 1080x2400 phone screen, scaled down 10x


def _object_line(path, marker):
    """The line (1-based) of the ``{`` opening the JSON object whose text holds ``marker``."""
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if marker in line)
    return next(i for i in range(at, -1, -1) if lines[i].strip() == "{") + 1


def _png(path, size=PHONE, color=(250, 250, 250)):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


# -- AndroidControl --------------------------------------------------------------------------------
# Actions as AndroidControl stores them: JSON strings with action_type and its arguments (pixels).
AC_ACTIONS = [
    {"action_type": "click", "x": 54, "y": 120},
    {"action_type": "long_press", "x": 10, "y": 20},
    {"action_type": "scroll", "direction": "down"},
    {"action_type": "swipe", "direction": "up"},  # android_world: the finger's direction
    {"action_type": "open_app", "app_name": "Settings"},
    {"action_type": "input_text", "text": "wifi"},
    {"action_type": "type", "x": 50, "y": 30, "text": "hello"},
    {"action_type": "navigate_home"},
    {"action_type": "navigate_back"},
    {"action_type": "wait"},
    {"action_type": "double_tap", "x": 5, "y": 6},  # no equivalent in mmrl's space
    {"action_type": "status", "goal_status": "complete"},
]
AC_EXPECTED = [
    {"action": "click", "point": [54.0, 120.0]},
    {"action": "long_press", "point": [10.0, 20.0]},
    {"action": "scroll", "direction": "down"},
    {"action": "scroll", "direction": "down"},  # swipe up = the content scrolls down
    {"action": "open_app", "app": "Settings"},
    {"action": "type", "text": "wifi"},
    {"action": "type", "text": "hello"},  # AndroidControl's type clicks first; the point is dropped
    {"action": "navigate_home"},
    {"action": "navigate_back"},
    {"action": "wait"},
    None,
    {"action": "terminate", "status": "success"},
]


def write_android_control(tmp_path):
    """A JSONL file, one episode a line, in the TFRecord's field layout with screenshots written
    out as files (goal / episode_id as one-element lists, as several conversions write them),
    plus a bad line, an episode without a goal and one with a malformed step, a missing
    screenshot and an infeasible status."""
    n = len(AC_ACTIONS) + 1  # one screenshot per action, plus the final screen
    shots = [f"screenshots/101/screenshot_101_{i}.png" for i in range(n)]
    for i, s in enumerate(shots):
        _png(tmp_path / s, color=(10 * i, 100, 200))
    good = {"episode_id": [101], "goal": ["Turn on wifi in Settings"], "screenshots": shots,
            "screenshot_widths": [PHONE[0]] * n, "screenshot_heights": [PHONE[1]] * n,
            "actions": [json.dumps(a) for a in AC_ACTIONS],
            "step_instructions": [f"do step {i}" for i in range(len(AC_ACTIONS))],
            "accessibility_trees": [f"tree {i}" for i in range(n)]}
    _png(tmp_path / "screenshots/102/a.png")
    _png(tmp_path / "screenshots/102/c.png")
    bad_steps = {"episode_id": 102, "goal": "Give up",
                 "screenshots": [f"screenshots/102/{name}.png" for name in ("a", "b", "c", "c")],
                 "actions": [{"action_type": "click", "x": 5}, {"action_type": "click", "x": 5, "y": 6},
                             {"action_type": "status", "goal_status": "infeasible"}]}
    lines = [json.dumps(good), "{not json", json.dumps({"episode_id": 103, "actions": []}), json.dumps(bad_steps)]
    path = tmp_path / "android_control_train.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_android_control_steps(tmp_path):
    """The other common conversion: one JSON file per episode with a ``steps`` list (image_before,
    image_size, the action as a dict, step_instruction) and screenshots keyed by index."""
    folder = tmp_path / "episode_5"
    for i in range(3):
        _png(folder / f"5_{i}.png")
    episode = {
        "episode_id": 5, "goal": "Search for cats",
        "screenshots": {str(i): f"5_{i}.png" for i in range(3)},
        "steps": [
            {"step_id": 0, "image_before": "5_0.png", "image_after": "5_1.png", "image_size": list(PHONE),
             "action": {"action_type": "click", "x": 20, "y": 40}, "bbox": [10, 30, 40, 50],
             "step_instruction": "Tap the search bar"},
            {"step_id": 1, "image_before": "5_1.png", "image_size": list(PHONE),
             "action": {"action_type": "scroll", "direction": "sideways"}},  # malformed
            {"step_id": 2, "image_size": list(PHONE),  # no image_before: the episode's screenshots[2]
             "action": json.dumps({"action_type": "input_text", "text": "cats"})},
        ],
    }
    path = folder / "episode_5.json"
    path.write_text(json.dumps(episode, indent=4), encoding="utf-8")
    return path


def test_android_control_every_action_mapped(tmp_path):
    path = write_android_control(tmp_path)
    episodes = read_android_control(path, accessibility_trees=True)
    ep = episodes[0]
    assert ep["episode_id"] == "101" and ep["instruction"] == "Turn on wifi in Settings"
    assert [s["action"] for s in ep["steps"]] == AC_EXPECTED
    assert [s["raw_action"] for s in ep["steps"]] == [json.dumps(a) for a in AC_ACTIONS]  # as the file gives it
    first = ep["steps"][0]
    assert first["image"] == str(tmp_path / "screenshots/101/screenshot_101_0.png")  # relative to the file
    assert first["image_size"] == PHONE and first["step_instruction"] == "do step 0"
    assert first["accessibility_tree"] == "tree 0"
    assert "accessibility_tree" not in read_android_control(path)[0]["steps"][0]  # off by default
    assert ep["steps"][10]["history_text"] == '{"action": "double_tap", "x": 5, "y": 6}'
    assert episodes.unmapped == [(f"{path}:1 (episode 0, step 10)",
                                  "action_type 'double_tap' has no equivalent in mmrl's action space")]
    # the episode with a malformed step, a missing screenshot and an infeasible status
    last = episodes[1]["steps"]
    assert [s["action"] for s in last] == [None, {"action": "click", "point": [5.0, 6.0]},
                                           {"action": "terminate", "status": "failure"}]
    assert last[1]["image"] is None  # its screenshot is absent


def test_android_control_steps_layout(tmp_path):
    path = write_android_control_steps(tmp_path)
    episodes = read_android_control(path.parent.parent)  # a folder: its episode files, recursively
    (ep,) = episodes
    assert ep["episode_id"] == "5" and ep["instruction"] == "Search for cats"
    s0, s1, s2 = ep["steps"]
    assert s0["action"] == {"action": "click", "point": [20.0, 40.0], "bbox": [10.0, 30.0, 40.0, 50.0]}
    assert s0["step_instruction"] == "Tap the search bar" and s0["image_size"] == PHONE
    assert s1["action"] is None
    assert s2["image"] == str(path.parent / "5_2.png") and s2["action"] == {"action": "type", "text": "cats"}
    # the malformed step is named by the line it starts on in the pretty-printed file
    line = _object_line(path, '"step_id": 1,')
    ((where, reason),) = episodes.skipped
    assert where == f"{path}:{line} (episode 0, step 1)" and "'direction'" in reason and "'sideways'" in reason
    assert episodes.stats() == {"examples": 2, "episodes": 1, "skipped_lines": 1, "bad_images": 0, "missing_images": 0,
                                "bad_targets": 0, "unmapped_steps": 0}


def test_bad_entries_skipped_with_file_line_and_counted(tmp_path, caplog):
    path = write_android_control(tmp_path)
    with caplog.at_level(logging.WARNING):
        episodes = read_android_control(path)
    assert len(episodes) == 2  # the bad line and the goal-less episode are left out
    where = dict(episodes.skipped)
    assert "not valid JSON" in where[f"{path}:2 (episode 1)"]
    assert "'goal'" in where[f"{path}:3 (episode 2)"]
    assert "'y'" in where[f"{path}:4 (episode 3, step 0)"]
    ((missing_at, missing_path),) = episodes.missing_images
    assert missing_at == f"{path}:4 (episode 3, step 1)" and missing_path == str(tmp_path / "screenshots/102/b.png")
    assert f"{path}:4 (episode 3, step 1) skipped: screenshot" in caplog.text and "image_root" in caplog.text
    assert episodes.stats() == {"examples": 11 + 1, "episodes": 2, "skipped_lines": 3, "bad_images": 1,
                                "missing_images": 1, "bad_targets": 0, "unmapped_steps": 1}
    # image_root: where relative screenshot paths start
    moved = tmp_path / "moved"
    moved.mkdir()
    (tmp_path / "screenshots").rename(moved / "screenshots")
    with pytest.raises(ValueError, match="no usable step"):
        read_android_control(path)
    assert read_android_control(path, image_root=moved).stats()["examples"] == 12


def test_an_off_screen_click_is_a_bad_target_not_a_skipped_line(tmp_path):
    """docs/reliability.md: clicks off the screenshot are counted in bad_targets. x = 500 on the
    108-px-wide screen lies beyond the 2-px slack; the step keeps its place in the history."""
    for i in range(3):
        _png(tmp_path / f"s{i}.png")
    episode = {"episode_id": 9, "goal": "Open mail", "screenshots": [f"s{i}.png" for i in range(3)],
               "screenshot_widths": [PHONE[0]] * 3, "screenshot_heights": [PHONE[1]] * 3,
               "actions": [{"action_type": "click", "x": 500, "y": 10}, {"action_type": "click", "x": 50, "y": 10}]}
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps(episode) + "\n")
    episodes = read_android_control(path)
    ((where, reason),) = episodes.bad_targets
    assert where == f"{path}:1 (episode 0, step 0)" and reason == "the click point [500.0, 10.0] lies off the 108x240 screenshot"
    assert episodes.skipped == [] and episodes[0]["steps"][0]["action"] is None
    assert episodes.stats() == {"examples": 1, "episodes": 1, "skipped_lines": 0, "bad_images": 0, "missing_images": 0,
                                "bad_targets": 1, "unmapped_steps": 0}
    steps = _task(path).examples("train")  # the step examples add what they find on access to the file's count
    assert steps[0]["history"] == ['{"action": "click", "x": 500, "y": 10}'] and steps.stats()["bad_targets"] == 1
    with pytest.raises(ValueError, match=r"step 0\): the click point \[500\.0, 10\.0\] lies off"):
        read_android_control(path, strict=True)


def test_strict_mode_raises_on_the_first_problem(tmp_path):
    path = write_android_control(tmp_path)
    with pytest.raises(ValueError, match=re.escape(f"{path}:2 (episode 1): not valid JSON") + ".*strict=False"):
        read_android_control(path, strict=True)
    odyssey = write_gui_odyssey(tmp_path / "odyssey")[0]
    with pytest.raises(ValueError, match=r"bad_ep\.json:\d+ \(episode 0, step 2\): a CLICK needs info.*'somewhere'"):
        read_gui_odyssey(odyssey / "bad_ep.json", strict=True)
    # an unmapped action is the dataset's own: never an error
    assert read_gui_odyssey(odyssey / "ep1.json", strict=True).stats()["unmapped_steps"] == 1


def test_no_usable_step_is_an_error_naming_the_first_problem(tmp_path):
    path = tmp_path / "empty.jsonl"
    episode = {"goal": "x", "screenshots": ["absent.png"], "actions": [{"action_type": "wait"}]}
    path.write_text(json.dumps(episode) + "\n")
    with pytest.raises(ValueError, match=r"no usable step.*absent\.png does not exist"):
        read_android_control(path)
    with pytest.raises(FileNotFoundError):
        read_android_control(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="unknown GUI episode format"):
        read_episodes(path, format="aitw")


# -- GUI-Odyssey -----------------------------------------------------------------------------------
ODYSSEY_STEPS = [  # (action, info, sam2_bbox) as the annotation files store them; 0-1000 coordinates
    ("CLICK", [[500, 250]], [400, 200, 600, 300]),
    ("LONG_PRESS", [[100, 900]], []),
    ("SCROLL", [[500, 800], [500, 200]], []),  # the finger moves up: the content scrolls down
    ("SCROLL", [[800, 500], [200, 510]], []),  # the finger moves left: the content scrolls right
    ("SCROLL", [[500, 200], [490, 800]], []),  # the finger moves down: the content scrolls up
    ("TEXT", "hello world", []),
    ("CLICK", "KEY_HOME", []),
    ("CLICK", "KEY_BACK", []),
    ("CLICK", "KEY_APPSELECT", []),  # the recent-apps button: unmapped
    ("COMPLETE", "", []),
]
ODYSSEY_EXPECTED = [  # on the 1080x2400 screen of device_info
    {"action": "click", "point": [540.0, 600.0], "bbox": [432.0, 480.0, 648.0, 720.0]},
    {"action": "long_press", "point": [108.0, 2160.0]},
    {"action": "scroll", "direction": "down"},
    {"action": "scroll", "direction": "right"},
    {"action": "scroll", "direction": "up"},
    {"action": "type", "text": "hello world"},
    {"action": "navigate_home"},
    {"action": "navigate_back"},
    None,
    {"action": "terminate", "status": "success"},
]


def _odyssey_episode(episode_id, steps, device=True):
    episode = {
        "episode_id": episode_id,
        "task_info": {"category": "Multi_Apps", "app": ["Settings", "Chrome"], "meta_task": "Look up {} and note it.",
                      "task": "Look up wifi and note it.", "instruction": "Use Chrome to look up wifi, then note it."},
        "step_length": len(steps),
        "steps": [{"step": i, "screenshot": f"{episode_id}_{i}.png", "action": a, "info": info, "ps": "",
                   "sam2_bbox": box, "low_level_instruction": f"low {i}", "description": "", "intention": "",
                   "context": ""} for i, (a, info, box) in enumerate(steps)],
    }
    if device:
        episode["device_info"] = {"product": "sdk_phone64", "release_version": "14", "sdk_version": "34",
                                  "h": 2400, "w": 1080, "device_name": "Medium Phone"}
    return episode


def write_gui_odyssey(root):
    """The release layout: annotations/<episode_id>.json, screenshots/<episode_id>_<step>.png. The
    screenshots of ep1 are stored at a tenth of device_info's 1080x2400; bad_ep has no device_info
    (its 54x120 screenshots give the size), an INCOMPLETE end and a step whose info is no point."""
    annotations, shots = root / "annotations", root / "screenshots"
    annotations.mkdir(parents=True)
    for i in range(len(ODYSSEY_STEPS)):
        _png(shots / f"ep1_{i}.png", PHONE)
    bad = [("CLICK", [[500, 500]], []), ("CLICK", [[250, 250]], [200, 200, 300, 300]), ("CLICK", "somewhere", []),
           ("INCOMPLETE", "", [])]
    for i in range(len(bad)):
        _png(shots / f"bad_ep_{i}.png", (54, 120))
    for name, steps, device in (("ep1", ODYSSEY_STEPS, True), ("bad_ep", bad, False)):
        (annotations / f"{name}.json").write_text(json.dumps(_odyssey_episode(name, steps, device), indent=4))
    return annotations, shots


def test_gui_odyssey_actions_and_0_1000_points_to_pixels(tmp_path):
    annotations, shots = write_gui_odyssey(tmp_path)
    episodes = read_gui_odyssey(annotations)  # screenshots found in the sibling screenshots/ folder
    by_id = {ep["episode_id"]: ep for ep in episodes}
    ep1 = by_id["ep1"]
    assert ep1["instruction"] == "Use Chrome to look up wifi, then note it."
    assert [s["action"] for s in ep1["steps"]] == ODYSSEY_EXPECTED
    assert all(s["image_size"] == (1080, 2400) for s in ep1["steps"])  # device_info's size
    assert ep1["steps"][0]["image"] == str(shots / "ep1_0.png") and ep1["steps"][0]["step_instruction"] == "low 0"
    assert ep1["steps"][8]["history_text"] == '{"action": "recent_apps"}'
    assert ep1["steps"][0]["raw_action"] == {"action": "CLICK", "info": [[500, 250]]}
    # without device_info the screenshot's own size converts the 0-1000 point and box
    bad = by_id["bad_ep"]["steps"]
    assert bad[0]["image_size"] == (54, 120) and bad[0]["action"] == {"action": "click", "point": [27.0, 60.0]}
    assert bad[1]["action"]["bbox"] == [10.8, 24.0, 16.2, 36.0]
    assert bad[2]["action"] is None and bad[3]["action"] == {"action": "terminate", "status": "failure"}
    ((where, reason),) = episodes.skipped
    line = _object_line(annotations / "bad_ep.json", '"step": 2,')
    assert where.endswith(f"bad_ep.json:{line} (episode 0, step 2)") and "'somewhere'" in reason
    assert episodes.stats() == {"examples": 9 + 3, "episodes": 2, "skipped_lines": 1, "bad_images": 0,
                                "missing_images": 0, "bad_targets": 0, "unmapped_steps": 1}
    assert len(read_gui_odyssey(annotations / "ep1.json", image_root=shots)) == 1
    # the whole data folder: its splits file is no episode, skipped and named
    splits = tmp_path / "splits" / "random_split.json"
    splits.parent.mkdir()
    splits.write_text(json.dumps({"train": ["ep1.json"], "test": ["bad_ep.json"]}))
    everything = read_gui_odyssey(tmp_path)
    assert len(everything) == 2 and "not an episode file" in dict(everything.skipped)[f"{splits}:1 (episode 0)"]


def test_steps_rescaled_to_the_opened_screenshot(tmp_path):
    """ep1's screenshots are a tenth of device_info's size: on access the labels follow the image."""
    annotations, _ = write_gui_odyssey(tmp_path)
    steps = episode_steps(read_gui_odyssey(annotations / "ep1.json"), 4)
    data = StepExamples(steps)
    ex = data[0]
    assert ex["image"].size == PHONE and ex["image_size"] == PHONE and ex["image_path"].endswith("ep1_0.png")
    assert ex["action"]["point"] == pytest.approx([54.0, 60.0])
    assert ex["action"]["bbox"] == pytest.approx([43.2, 48.0, 64.8, 72.0])
    assert steps[0]["action"]["point"] == [540.0, 600.0]  # the flattened step itself is untouched
    assert fit_to_image({"action": {"action": "wait"}, "image_size": PHONE}, PHONE)["image_size"] == PHONE


# -- flattening ------------------------------------------------------------------------------------
def test_episode_steps_history(tmp_path):
    annotations, _ = write_gui_odyssey(tmp_path)
    episodes = read_gui_odyssey(annotations / "ep1.json")
    steps = episode_steps(episodes, history_length=2)
    assert [s["step_index"] for s in steps] == [0, 1, 2, 3, 4, 5, 6, 7, 9]  # step 8 (recent apps) has no label
    first, fourth, last = steps[0], steps[3], steps[-1]
    assert first["history"] == [] and format_history(first) == "none"
    assert fourth["history"] == [format_action(ODYSSEY_EXPECTED[1]), format_action(ODYSSEY_EXPECTED[2])]
    assert fourth["history_start"] == 1
    assert format_history(fourth) == ('Step 2: {"action": "long_press", "point": [108, 2160]}; '
                                      'Step 3: {"action": "scroll", "direction": "down"}')
    assert last["history"] == [format_action(ODYSSEY_EXPECTED[7]), '{"action": "recent_apps"}']  # unmapped kept
    assert (last["instruction"], last["source_episode"], last["num_steps"]) == (episodes[0]["instruction"], "ep1", 10)
    assert "episode_id" not in last  # that key marks environment-episode rows in the trainer
    assert last["step_instruction"] == "low 9" and last["image_size"] == (1080, 2400)
    assert episode_steps(episodes, 0)[5]["history"] == []
    full = episode_steps(episodes, 100)[-1]
    assert len(full["history"]) == 9 and full["history_start"] == 0
    # the history in another coordinate space: points converted, numbering kept
    half = format_history(fourth, lambda p: [v / 2 for v in p])
    assert half.startswith('Step 2: {"action": "long_press", "point": [54, 1080]}')
    with pytest.raises(ValueError, match="history_length"):
        episode_steps(episodes, -1)


# -- the task --------------------------------------------------------------------------------------
def _task(path, fmt="android_control", **options):
    load_plugins()
    return mmrl.make_task("gui_actions", train_path=str(path), eval_path=str(path), format=fmt, **options)


def _qwen25_processor(max_pixels=12845056):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=max_pixels)


def _score(task, completions, ex):
    out = {name: REWARDS.get(name)(completions, [ex] * len(completions)) for name in task.rewards}
    return out, task.metrics(completions, [ex] * len(completions))


def test_task_prompt_target_and_metrics(tmp_path):
    task = _task(write_android_control(tmp_path))
    data = task.examples("train")
    assert len(data) == 12 and data.stats()["skipped_lines"] == 3
    ex = data[2]  # the scroll, third step of the episode
    assert ex["image"].size == PHONE and ex["step_index"] == 2
    messages = task.prompt(ex)
    (content,) = [m["content"] for m in messages]
    assert content[0]["image"] is ex["image"]
    text = content[1]["text"]
    assert text.startswith("Task: Turn on wifi in Settings. Previous actions: "
                           'Step 1: {"action": "click", "point": [54, 120]}; '
                           'Step 2: {"action": "long_press", "point": [10, 20]}. ')
    assert text.endswith("</answer>: one JSON action, points [x, y] in the image's pixel coordinates.")
    assert "Step: do step 2" not in text and "Step: do step 2." in _task(tmp_path / "android_control_train.jsonl",
                                                                         step_instruction=True).text(ex)
    target = task.target(ex)
    assert target == '<think>do step 2</think><answer>{"action": "scroll", "direction": "down"}</answer>'
    assert parse_action(target) == ex["action"]
    wrong = '<think>x</think><answer>{"action": "scroll", "direction": "up"}</answer>'
    other = '<think>x</think><answer>{"action": "click", "point": [1, 1]}</answer>'
    metrics = task.metrics([target, wrong, other, "no answer"], [ex] * 4)
    assert metrics == {"step_success": 0.25, "type_accuracy": 0.5, "parsed": 0.75}
    assert task.success(target, ex) is True and task.success(wrong, ex) is False
    assert task.hints(ex)[0] == "The next action is scroll."
    record = task.record(ex, wrong)
    assert record["prompt"] == text and record["answer"] == format_action(ex["action"])
    image = task.visualize(data[0], other)
    assert image.size == (320, PHONE[1] + 2 * FOOTER)  # 448 // 240: drawn at 1x, widened for two text lines
    answer_only = _task(tmp_path / "android_control_train.jsonl", thinking=False)
    assert answer_only.target(ex) == '<answer>{"action": "scroll", "direction": "down"}</answer>'
    assert answer_only.reward_kwargs == {"format": {"mode": "answer_only"}}


@pytest.mark.parametrize("layout", ["android_control", "gui_odyssey"])
@pytest.mark.parametrize("space", ["resized", "resized_small", "rel1000"])
def test_perfect_target_scores_one_in_each_policy_space(tmp_path, layout, space):
    """What the trainer records on each example (VLMPolicy.prepare_examples), per family: a
    Qwen2.5-VL policy answers in pixels of the resized screenshot (Qwen's default budget, and a
    small one that shrinks it), a Qwen2-VL / Qwen3-VL one in 0-1000. The reference answer scores
    1 on every reward and step_success; the same answer read in the wrong space misses a click."""
    if layout == "android_control":
        task = _task(write_android_control(tmp_path))
    else:
        task = _task(write_gui_odyssey(tmp_path)[0], "gui_odyssey")
    clicks = 0
    for ex in task.examples("eval"):
        if space == "rel1000":
            ex = {**ex, "pred_space": "rel1000", "frame": Frame(*ex["image_size"])}
        else:
            budget = 12845056 if space == "resized" else 3136
            ex = {**ex, "pred_space": "resized", "frame": qwen_frame(ex["image_size"], _qwen25_processor(budget))}
            assert (ex["frame"].resized_width, ex["frame"].resized_height) != ex["image_size"]
        target = task.target(ex)
        rewards, metrics = _score(task, [target], ex)
        assert rewards == {name: [1.0] for name in GUI_REWARDS}, (ex["action"], target, rewards)
        assert metrics == {"step_success": 1.0, "type_accuracy": 1.0, "parsed": 1.0}
        if "point" in ex["action"] and ex["step_index"] == 0 and space == "rel1000":
            clicks += 1  # the first click, mid-screen: its pixel point read as 0-1000 lands near the corner
            pixels = format_action(ex["action"])
            assert _score(task, [f"<think>x</think><answer>{pixels}</answer>"], ex)[1]["step_success"] == 0.0
        if space == "rel1000" and ex["history_actions"] and "point" in ex["history_actions"][-1]:
            shown = ex["history_actions"][-1]["point"]
            expected = [round(shown[0] / ex["image_size"][0] * 1000), round(shown[1] / ex["image_size"][1] * 1000)]
            assert f'"point": {expected}' in task.text(ex)  # history in the answer's space
            assert "0-1000 coordinates" in task.text(ex)
    assert clicks == (1 if space == "rel1000" else 0) + (layout == "gui_odyssey" and space == "rel1000")


def test_synthetic_fallback(tmp_path):
    load_plugins()
    task = mmrl.make_task("gui_actions", train_size=20, eval_size=6)
    data = task.examples("eval")
    assert len(data) == 6 and data[0] == data[0]
    seen = set()
    for ex in data:
        seen.add(ex["step_index"])
        assert len(ex["history"]) == ex["step_index"]
        rewards, metrics = _score(task, [task.target(ex)], ex)
        assert rewards == {name: [1.0] for name in GUI_REWARDS} and metrics["step_success"] == 1.0
        assert "Tap the" in task.text(ex)
    assert len(seen) >= 2
    assert task.examples("train")[0]["source_episode"] != data[0]["source_episode"]
    assert task.visualize(data[0], "nothing").size[0] == 448  # 112 px screens drawn 4x
    with pytest.raises(ValueError, match="format must be"):
        mmrl.make_task("gui_actions", format="aitw")
    with pytest.raises(ValueError, match="history_length"):
        mmrl.make_task("gui_actions", history_length=-2)


@pytest.mark.slow
def test_android_control_episode_file_trains_a_step(tmp_path):
    """The must-show: an AndroidControl-style episode file trains a step of the tiny default
    model, and the run writes the UI-R1 reward components."""
    path = write_android_control(tmp_path / "data")
    result = mmrl.train("vlm/counting_tiny", [
        "task.name=gui_actions", f"task.options.train_path={path}", f"task.options.eval_path={path}",
        "task.options.format=android_control", "train.steps=1", "train.prompts_per_step=2",
        "rollout.num_generations=2", "rollout.max_completion_length=8", "eval.num_examples=2", "eval.before=false",
        "eval.pass_k=1", "algo.beta=0",  # no pass@8 sampling, no reference copy: a quick step
        f"log.output_dir={tmp_path / 'runs'}", "log.progress=false", "log.save_every=0", "log.save_rollouts_every=0",
    ])
    assert result.steps == 1
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = next(x for x in lines if "reward" in x and "loss" in x)
    assert {"reward/gui_action_type", "reward/gui_action_args", "reward/format"} <= set(train)
    assert {"step_success", "type_accuracy", "parsed", "reward/gui_action_args"} <= set(result.after)
