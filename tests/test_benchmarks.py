"""Benchmark protocols (mmrl.eval_protocols): each table worked out by hand on a small fixture, the
intervals, and `mmrl eval --benchmark` end to end on ScreenSpot-v2 files as they ship."""

from __future__ import annotations

import json
import math

import pytest

from mmrl.eval_protocols import benchmark_table
from mmrl.eval_protocols.protocols import geneval_task
from mmrl.measures.intervals import mean_interval, resampled_intervals, stratified_mean_interval
from mmrl.registry import BENCHMARKS


def click(x, y):
    return f"<answer>[{x}, {y}]</answer>"


def screen(platform_file, data_type, hit: bool, **extra):
    """An example whose element is the box (0, 0, 10, 10), with a completion clicking in or out."""
    ex = {"box": (0.0, 0.0, 10.0, 10.0), "data_type": data_type, "source_file": platform_file, **extra}
    return ex, click(5, 5) if hit else click(50, 50)


# mobile text 1/2, mobile icon 1/1, desktop text 0/1, desktop icon 1/1, web text 2/2, web icon 0/1
SCREENS = [screen("screenspot_mobile_v2", "text", True), screen("screenspot_mobile_v2", "text", False),
           screen("screenspot_mobile_v2", "icon", True), screen("screenspot_desktop_v2", "text", False),
           screen("screenspot_desktop_v2", "icon", True), screen("screenspot_web_v2", "text", True),
           screen("screenspot_web_v2", "text", True), screen("screenspot_web_v2", "icon", False)]


def table(name, pairs, task=None, split=None):
    examples, completions = [p[0] for p in pairs], [p[1] for p in pairs]
    rows = benchmark_table(BENCHMARKS.get(name), task, completions, examples, split=split)
    return {r["cell"]: r for r in rows}


def test_screenspot_average_is_the_mean_of_the_six_cells_as_seeclick_prints_it():
    rows = table("screenspot", SCREENS)
    assert list(rows) == ["mobile text", "mobile icon", "desktop text", "desktop icon", "web text", "web icon", "average"]
    assert [rows[c]["accuracy"] for c in list(rows)[:6]] == [0.5, 1.0, 0.0, 1.0, 1.0, 0.0]
    assert [rows[c]["n"] for c in list(rows)[:6]] == [2, 1, 1, 1, 2, 1]
    assert rows["average"]["accuracy"] == pytest.approx(3.5 / 6)  # not 5 / 8
    assert rows["average"]["n"] == 8


def test_screenspot_v2_average_is_over_the_examples_as_os_atlas_prints_it():
    rows = table("screenspot_v2", SCREENS)
    assert rows["average"]["accuracy"] == pytest.approx(5 / 8) and rows["average"]["n"] == 8
    assert rows["mobile text"]["accuracy"] == 0.5


def test_screenspot_platform_falls_back_to_the_data_source():
    ex = {"box": (0, 0, 10, 10), "data_type": "icon", "data_source": "android"}
    assert list(table("screenspot_v2", [(ex, click(1, 1))])) == ["mobile icon", "average"]


def test_screenspot_pro_groups_and_overall_are_micro_averages():
    pairs = [screen("vscode_macos", "text", True, group="Dev"), screen("vscode_macos", "icon", False, group="Dev"),
             screen("vscode_macos", "icon", False, group="Dev"), screen("autocad_windows", "text", True, group="CAD"),
             (screen("autocad_windows", "icon", True, group="CAD")[0], "no answer")]  # unreadable: wrong
    rows = table("screenspot_pro", pairs)
    assert list(rows) == ["CAD text", "CAD icon", "CAD", "Dev text", "Dev icon", "Dev", "all text", "all icon", "average"]
    assert rows["Dev"]["accuracy"] == pytest.approx(1 / 3) and rows["CAD"]["accuracy"] == 0.5
    assert rows["CAD icon"]["accuracy"] == 0.0 and rows["CAD icon"]["n"] == 1
    assert rows["all text"]["accuracy"] == 1.0 and rows["all icon"]["accuracy"] == 0.0
    assert rows["average"]["accuracy"] == pytest.approx(2 / 5)  # micro: not the mean of Dev and CAD


def test_refcoco_counts_iou_strictly_above_one_half_per_file():
    truth = {"box": (0.0, 0.0, 10.0, 10.0)}
    half = "<answer>[0, 0, 10, 5]</answer>"  # IoU exactly 0.5: wrong in VLM-R1's test_rec_r1.py
    more = "<answer>[0, 0, 10, 6]</answer>"  # 0.6
    rows = table("refcoco", [(truth, half), (truth, more), (truth, "<answer>none</answer>"), (truth, more)],
                 split="refcoco_val")
    assert list(rows) == ["refcoco_val"]
    assert rows["refcoco_val"]["Acc@0.5"] == 0.5 and rows["refcoco_val"]["n"] == 4


def test_charades_recall_at_each_threshold_and_miou():
    truth = {"segment": [0.0, 10.0]}
    answers = ["<answer>0 to 3</answer>",  # tIoU 0.3: counts for R1@0.3 (>=)
               "<answer>0 to 5.5</answer>",  # 0.55
               "<answer>0 to 8</answer>",  # 0.8
               "no answer"]  # 0
    rows = table("charades_sta", [(truth, a) for a in answers])
    row = rows["all"]
    assert (row["R1@0.3"], row["R1@0.5"], row["R1@0.7"]) == (0.75, 0.5, 0.25)
    assert row["mIoU"] == pytest.approx((0.3 + 0.55 + 0.8 + 0.0) / 4)


def test_video_r1_accuracy_per_problem_type():
    pairs = [({"solution": "<answer>B</answer>", "problem_type": "multiple choice"}, "<answer>B</answer>"),
             ({"solution": "<answer>C</answer>", "problem_type": "multiple choice"}, "<answer>A</answer>"),
             ({"solution": "<answer>4</answer>", "problem_type": "numerical"}, "<answer>4</answer>")]
    rows = table("video_r1", pairs, split="eval_mmvu")
    assert rows["eval_mmvu"]["accuracy"] == pytest.approx(2 / 3)
    assert rows["eval_mmvu multiple choice"]["accuracy"] == 0.5 and rows["eval_mmvu numerical"]["accuracy"] == 1.0


def test_geneval_tasks_of_composition_prompts_and_the_overall_mean():
    red, blue = {"count": 1, "color": "red", "shape": "circle", "position": None}, \
        {"count": 2, "color": "blue", "shape": "square", "position": None}
    assert geneval_task([red]) == "colors" and geneval_task([blue]) == "counting"
    assert geneval_task([red, blue]) == "color_attr" and geneval_task([{**red, "position": "left"}]) == "position"
    bench = BENCHMARKS.get("geneval")
    assert bench.macro["overall"] == ("single_object", "two_object", "counting", "colors", "position", "color_attr")


def test_geneval_scores_rendered_scenes_with_the_built_in_checker():
    from mmrl.data.shapes_t2i import render

    red = [{"count": 1, "color": "red", "shape": "circle", "position": None}]
    two = [{"count": 2, "color": "blue", "shape": "square", "position": None}]
    right, wrong = render(red, 0), render(two, 0)  # the second prompt asks for red, gets two blue squares
    rows = table("geneval", [({"spec": red}, right), ({"spec": red}, wrong), ({"spec": two}, wrong)])
    assert rows["colors"]["accuracy"] == 0.5 and rows["counting"]["accuracy"] == 1.0
    assert rows["overall"]["accuracy"] == pytest.approx((0.5 + 1.0) / 2)  # the tasks present


def test_mathvista_breaks_down_by_metadata_task_and_version():
    from mmrl.registry import TASKS

    task = TASKS.get("visual_math")()
    fqa = {"answer": "3", "options": None, "kind": "open", "metadata": {"task": "figure question answering"}}
    vqa = {**fqa, "metadata": {"task": "visual question answering"}, "problem_version": "Vision Only"}
    rows = table("mathvista", [(fqa, "<answer>3</answer>"), (fqa, "<answer>4</answer>"), (vqa, "<answer>3.0</answer>")],
                 task=task)
    assert rows["all"]["accuracy"] == pytest.approx(2 / 3)
    assert rows["figure question answering"]["accuracy"] == 0.5
    assert rows["visual question answering"]["accuracy"] == 1.0 and rows["Vision Only"]["n"] == 1


def test_clevr_count_is_exact():
    from mmrl.registry import TASKS

    task = TASKS.get("counting")()
    rows = table("clevr_count", [({"answer": 3}, "<answer>3</answer>"), ({"answer": 3}, "<answer>4</answer>")], task=task)
    assert rows["all"]["accuracy"] == 0.5


def test_intervals_hold_the_value_and_repeat():
    values = [1.0] * 30 + [0.0] * 10
    low, high = mean_interval(values)
    assert low < 0.75 < high and (low, high) == mean_interval(values)
    assert 0.55 < low and high < 0.9  # sd of the mean ~0.068: the 95% interval is about +-0.13
    assert mean_interval([1.0, 1.0, 1.0]) == (1.0, 1.0)  # nothing varies
    assert all(math.isnan(v) for v in mean_interval([]))
    s_low, s_high = stratified_mean_interval([[1.0, 0.0], [1.0] * 5])
    assert s_low <= 0.75 <= s_high and s_high == 1.0


def test_resampled_intervals_recompute_a_metric_that_is_not_a_mean():
    data = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]

    def spread(idx):  # max - min: no per-example decomposition
        picked = [data[i] for i in idx]
        return {"range": max(picked) - min(picked)}

    (low, high), = resampled_intervals(spread, len(data), ["range"]).values()
    assert 0 < low <= high <= 7.0


def test_the_eval_intervals_bootstrap_means_and_recompute_the_rest():
    """A task whose ``acc`` is a mean over examples and whose ``best`` (the max) is not: the first
    is bootstrapped from per-example values, the second computed again on resamples."""
    from mmrl.core.evaluation import metric_intervals

    class Task:
        def metrics(self, completions, examples):
            return {"acc": sum(completions) / len(completions), "best": float(max(completions))}

    completions = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    metrics = {**Task().metrics(completions, completions), "reward": sum(completions) / 8}
    out = metric_intervals(Task(), completions, [{}] * 8, list(range(8)), metrics, {"reward": completions}, [], 0)
    assert out["acc"] == mean_interval(completions)  # the per-example bootstrap
    assert out["reward"] == mean_interval(completions)
    assert out["best"] == (1.0, 1.0)  # some resample may draw only zeros: 2.5% quantile still 1 here
    assert set(out) == {"acc", "best", "reward"}


def test_an_unknown_benchmark_or_missing_data_is_a_clear_error(tmp_path):
    from mmrl.eval_protocols.run import benchmark_configs
    from mmrl.config import builtin_config_path, load_config

    with pytest.raises(KeyError, match="unknown benchmark 'screenspot_v3'.*screenspot_v2"):
        BENCHMARKS.get("screenspot_v3")
    cfg = load_config(builtin_config_path("gui/screen_grounding_tiny"), [])
    with pytest.raises(ValueError, match="--data"):
        benchmark_configs(cfg, BENCHMARKS.get("screenspot_v2"), None, None)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        benchmark_configs(cfg, BENCHMARKS.get("screenspot_v2"), str(tmp_path / "nope.json"), None)
    (one,) = benchmark_configs(cfg, BENCHMARKS.get("screenspot_v2"), str(tmp_path), None)
    assert one[1].task.options["format"] == "screenspot" and one[1].task.options["eval_path"] == str(tmp_path)
    assert {k: v for k, v in one[1].task.options.items() if k not in ("eval_path", "image_root", "format")} == \
        {k: v for k, v in cfg.task.options.items() if k not in ("eval_path", "image_root", "format")}  # the run's kept
    assert one[1].eval.num_generations == 1
    files = benchmark_configs(cfg, BENCHMARKS.get("refcoco"), f"{tmp_path},{tmp_path}", None)
    assert [f[1].task.name for f in files] == ["grounding", "grounding"] and files[0][1].task.options.get("answer") is None


def test_entries_left_out_count_screenspot_entries_without_their_screenshot(tmp_path):
    """The benchmark's "N entries skipped" adds the entries read as malformed and those whose
    screenshot is absent (ScreenSpot's reader looks for each file as it reads)."""
    from PIL import Image

    import mmrl
    from mmrl.data.sequence import left_out_when_read
    from mmrl.registry import load_plugins

    Image.new("RGB", (320, 200), "white").save(tmp_path / "pc_1.png")
    rows = [{"img_filename": "pc_1.png", "bbox": [20, 30, 60, 20], "instruction": "close", "data_type": "icon"},
            {"img_filename": "gone.png", "bbox": [20, 30, 60, 20], "instruction": "open", "data_type": "icon"},
            {"img_filename": "pc_1.png", "bbox": [20, 30, -5, 20], "instruction": "save", "data_type": "text"}]
    (tmp_path / "screenspot_desktop_v2.json").write_text(json.dumps(rows), encoding="utf-8")
    load_plugins()
    task = mmrl.make_task("screen_grounding", eval_path=str(tmp_path / "screenspot_desktop_v2.json"))
    examples = task.examples("eval")
    assert len(examples) == 1 and examples.stats()["missing_images"] == 1 and examples.stats()["skipped_lines"] == 1
    assert left_out_when_read(examples) == 2


@pytest.mark.slow
def test_mmrl_eval_benchmark_prints_the_table_of_screenspot_v2_files(tmp_path):
    from typer.testing import CliRunner

    from PIL import Image

    from mmrl.cli import app

    # ScreenSpot-v2's layout: screenspot_<platform>_v2.json beside screenspotv2_image/
    images = tmp_path / "screenspotv2_image"
    images.mkdir()
    Image.new("RGB", (320, 200), "white").save(images / "pc_1.png")
    Image.new("RGB", (200, 320), "white").save(images / "mobile_1.png")
    desktop = [{"img_filename": "pc_1.png", "bbox": [20, 30, 60, 20], "instruction": "close the window",
                "data_type": "icon", "data_source": "windows"},
               {"img_filename": "pc_1.png", "bbox": [100, 100, 80, 30], "instruction": "open the file menu",
                "data_type": "text", "data_source": "windows"}]
    mobile = [{"img_filename": "mobile_1.png", "bbox": [10, 40, 150, 50], "instruction": "turn on Wi-Fi",
               "data_type": "text", "data_source": "ios"},
              {"img_filename": "mobile_gone.png", "bbox": [10, 40, 150, 50], "instruction": "turn off Wi-Fi",
               "data_type": "text", "data_source": "ios"}]  # its screenshot is missing: skipped and counted
    for name, rows in (("desktop", desktop), ("mobile", mobile), ("web", [])):
        (tmp_path / f"screenspot_{name}_v2.json").write_text(json.dumps(rows), encoding="utf-8")
    folder = tmp_path
    res = CliRunner().invoke(app, ["eval", "gui/screen_grounding_tiny", "--benchmark", "screenspot_v2", "--data",
                                   str(folder), "--image-root", str(images), "--gallery", str(tmp_path / "g")])
    assert res.exit_code == 0, res.output
    assert "ScreenSpot-v2" in res.output and "desktop icon" in res.output and "average" in res.output
    report = json.loads((tmp_path / "g" / "benchmark_screenspot_v2.json").read_text())
    rows = {r["cell"]: r for r in report["rows"]}
    # the fixture: two desktop entries (icon, text) and one mobile (text), as the v2 files hold them
    assert {c: r["n"] for c, r in rows.items()} == {"mobile text": 1, "desktop text": 1, "desktop icon": 1, "average": 3}
    assert report["skipped"] == 1 and "1 entries skipped" in res.output
    cells = [rows[c]["accuracy"] for c in ("mobile text", "desktop text", "desktop icon")]
    assert rows["average"]["accuracy"] == pytest.approx(sum(cells) / 3)
    assert all(r["accuracy_ci"][0] <= r["accuracy"] <= r["accuracy_ci"][1] for r in rows.values())
