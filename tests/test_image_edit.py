"""Image editing as a task (issue 56 item 2): the synthetic edit set, its pixel checks, the task
(synthetic and from files, ImgEdit's and GEdit-Bench's layouts) and the edit rewards."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from mmrl import GenerationPrompt, make_task
from mmrl.data.shape_edits import KINDS, draw_objects, edit_example
from mmrl.measures.edits import CHECKS, edit_checks, masked_preservation
from mmrl.plugins import load_plugins
from mmrl.registry import REWARDS
from test_judge_service import Judge, _png, _top, judge  # noqa: F401  (judge: the stand-in server fixture)

load_plugins()


def _pixels(image) -> np.ndarray:
    return np.asarray(image, dtype=np.int16)


def test_edits_are_deterministic_and_their_targets_differ_from_the_source_only_inside_the_mask():
    kinds = set()
    for seed in range(150):
        ex, again = edit_example(seed), edit_example(seed)
        assert ex["instruction"] == again["instruction"] and ex["spec"] == again["spec"]
        assert np.array_equal(_pixels(ex["target"]), _pixels(again["target"]))
        assert np.array_equal(ex["mask"], again["mask"])
        changed = (_pixels(ex["target"]) != _pixels(ex["source"])).any(-1)
        assert changed.any() and not (changed & ~ex["mask"]).any()
        assert ex["source"].size == (16, 16)
        kinds.add(ex["kind"])
    assert kinds == set(KINDS)
    assert edit_example(7)["instruction"] != edit_example(8)["instruction"] or edit_example(7)["spec"] != edit_example(8)["spec"]


def test_the_instructions_name_the_edit():
    seen = {}
    for seed in range(60):
        ex = edit_example(seed)
        seen.setdefault(ex["kind"], ex)
    recolor, move, add = seen["recolor"], seen["move"], seen["add"]
    e = recolor["edit"]
    assert recolor["instruction"] == f"make the {e['color']} {e['shape']} {e['new_color']}"
    e = move["edit"]
    assert move["instruction"] == f"move the {e['color']} {e['shape']} to the {e['direction']}"
    assert add["instruction"] == f"add a {add['edit']['color']} {add['edit']['shape']}"


def test_color_noise_misstates_only_the_new_colour():
    misstated = 0
    for seed in range(100):
        true, noisy = edit_example(seed), edit_example(seed, color_noise=1.0)
        assert noisy["edit"] == true["edit"] and noisy["spec"] == true["spec"]
        if true["kind"] == "move":
            assert noisy["instruction"] == true["instruction"]
        elif noisy["instruction"] != true["instruction"]:
            misstated += 1
            said = noisy["instruction"].split()
            assert said[-1 if true["kind"] == "recolor" else -2] not in {o["color"] for o in true["source_objects"]}
    assert misstated > 50


def test_checks_pass_the_target_and_catch_each_failure():
    for seed in range(100):
        ex = edit_example(seed)
        assert all(edit_checks(ex["target"], ex).values())
        assert not all(edit_checks(ex["source"], ex).values())  # doing nothing is no edit
    ex = next(e for e in map(edit_example, range(100)) if e["kind"] == "recolor")
    wrong = [dict(o) for o in ex["spec"]]
    wrong[0]["color"] = next(c for c in ("red", "green", "blue", "yellow")
                             if c not in {o["color"] for o in ex["spec"]} | {ex["edit"]["color"]})
    checks = edit_checks(draw_objects(wrong, 16), ex)
    assert not checks["color"] and checks["kept"] and checks["background"]
    ex = next(e for e in map(edit_example, range(100)) if e["kind"] == "move")
    copy_left = draw_objects(ex["spec"] + [ex["source_objects"][0]], 16)  # moved, and the original still there
    checks = edit_checks(copy_left, ex)
    assert checks["position"] and checks["shape"] and not checks["no_extra"]
    ex = next(e for e in map(edit_example, range(100)) if e["kind"] == "add" and len(e["source_objects"]) == 2)
    dropped = draw_objects([o for o in ex["spec"] if o is not ex["spec"][0]], 16)  # an untouched object lost
    checks = edit_checks(dropped, ex)
    assert checks["color"] and not checks["kept"]
    smeared = np.array(ex["target"])
    smeared[~ex["mask"]] = (40, 80, 220)  # everything outside the edit region repainted
    assert not edit_checks(Image.fromarray(smeared), ex)["background"]


def test_masked_preservation_scores_only_outside_the_mask():
    ex = next(e for e in map(edit_example, range(50)) if e["kind"] == "recolor")
    inside = np.array(ex["source"])
    inside[ex["mask"]] = 0  # anything inside the edit region is free
    assert masked_preservation(Image.fromarray(inside), ex["source"], ex["mask"]) == 1.0
    assert masked_preservation(Image.fromarray(inside), ex["source"]) < 1.0  # no mask: the whole image
    shifted = np.array(ex["source"]).astype(np.int16)
    shifted[~ex["mask"]] -= 51  # 0.2 of the range on every channel outside
    assert masked_preservation(Image.fromarray(shifted.clip(0, 255).astype(np.uint8)), ex["source"],
                               ex["mask"]) == pytest.approx(0.8, abs=1e-6)
    big = ex["source"].resize((64, 64), Image.NEAREST)  # another size: source and mask are resized
    assert masked_preservation(big, ex["source"], ex["mask"]) > 0.95


def test_task_prompts_carry_the_source_and_hold_out_instructions():
    task = make_task("image_edit", train_size=300, eval_size=40)
    train, held = task.examples("train"), task.examples("eval")
    assert {ex["instruction"] for ex in train}.isdisjoint({ex["instruction"] for ex in held})
    ex = held[0]
    prompt = task.build_prompt(ex)
    assert isinstance(prompt, GenerationPrompt) and str(prompt) == ex["instruction"] and prompt.image is ex["source"]
    perfect = task.metrics([e["target"] for e in held], list(held))
    assert perfect["edit_success"] == 1.0 and perfect["preservation"] == 1.0
    assert all(perfect[f"check/{k}"] == 1.0 for k in CHECKS)
    nothing = task.metrics([e["source"] for e in held], list(held))
    assert nothing["edit_success"] == 0.0
    assert task.metrics(["text"], [ex])["edit_success"] == 0.0
    picture = task.visualize(ex, ex["target"])
    assert picture.size[0] > 3 * 16 * 6  # source | result | target, 6x
    assert make_task("image_edit", kinds=["add"]).examples("eval")[0]["kind"] == "add"
    with pytest.raises(ValueError, match="task.options.kinds"):
        make_task("image_edit", kinds=["rotate"])
    with pytest.raises(ValueError, match="task.options.format"):
        make_task("image_edit", format="magicbrush")


def _save(image: Image.Image, path) -> str:
    image.save(path)
    return path.name


def test_an_edit_file_with_masks(tmp_path):
    ex = edit_example(3)
    rows = [{"image": _save(ex["source"], tmp_path / "a.png"), "instruction": ex["instruction"],
             "mask": _save(Image.fromarray(ex["mask"].astype(np.uint8) * 255), tmp_path / "a_mask.png")},
            {"image": "a.png", "instruction": "make it blue"},
            {"image": "a.png"}]  # no instruction: skipped
    (tmp_path / "edits.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    task = make_task("image_edit", train_path=str(tmp_path / "edits.jsonl"))
    examples = task.examples("train")
    assert len(examples) == 2
    first, second = examples[0], examples[1]
    assert np.array_equal(first["mask"], ex["mask"]) and second["mask"] is None
    assert str(task.prompt(first)) == ex["instruction"] and task.prompt(first).image.size == (16, 16)
    metrics = task.metrics([ex["target"], ex["target"]], [first, second])
    assert "edit_success" not in metrics and metrics["preservation"] < 1.0  # the unmasked one pays for the edit
    assert task.metrics([ex["target"]], [first])["preservation"] == 1.0


def test_imgedit_basic_layout(tmp_path):
    """ImgEdit's Benchmark/Basic/basic_edit.json as it ships: records keyed by id, the image path under the
    original-images folder in "id", the instruction in "prompt"."""
    (tmp_path / "original_images" / "animal").mkdir(parents=True)
    Image.new("RGB", (24, 20), (10, 120, 30)).save(tmp_path / "original_images" / "animal" / "000342021.jpg")
    bench = {"1082": {"id": "animal/000342021.jpg", "prompt": "Change the tortoise's shell texture to a smooth surface.",
                      "edit_type": "alter"},
             "1068": {"id": "animal/000342021.jpg", "prompt": "Change the animal's fur color to a darker shade.",
                      "edit_type": "alter"}}
    (tmp_path / "basic_edit.json").write_text(json.dumps(bench, indent=4))
    task = make_task("image_edit", eval_path=str(tmp_path / "basic_edit.json"), format="imgedit",
                     image_root=str(tmp_path / "original_images"))
    examples = task.examples("eval")
    assert [ex["instruction"] for ex in examples] == [b["prompt"] for b in bench.values()]
    assert examples[0]["source"].size == (24, 20) and examples[0]["edit_type"] == "alter"


def test_gedit_bench_layout(tmp_path):
    """GEdit-Bench's rows (parquet): the image as a datasets Image feature ({"bytes", "path"}) in
    input_image_raw, the instruction in "instruction"."""
    import pandas as pd

    buffer = io.BytesIO()
    Image.new("RGB", (20, 12), (200, 30, 30)).save(buffer, format="PNG")
    png = buffer.getvalue()
    rows = [{"key": "k1", "task_type": "color_alter", "instruction": "Make the car blue.", "instruction_language": "en",
             "input_image": {"bytes": png, "path": None}, "input_image_raw": {"bytes": png, "path": None},
             "Intersection_exist": True},
            {"key": "k2", "task_type": "subject-add", "instruction": "添加一只猫", "instruction_language": "cn",
             "input_image": {"bytes": png, "path": None}, "input_image_raw": {"bytes": png, "path": None},
             "Intersection_exist": False}]
    pd.DataFrame(rows).to_parquet(tmp_path / "train-00000.parquet")
    task = make_task("image_edit", eval_path=str(tmp_path / "train-00000.parquet"), format="gedit")
    examples = task.examples("eval")
    assert [ex["instruction"] for ex in examples] == ["Make the car blue.", "添加一只猫"]
    assert examples[0]["source"].size == (20, 12) and examples[1]["task_type"] == "subject-add"


def test_pixel_rewards():
    examples = [edit_example(s) for s in range(6)]
    results = [ex["target"] for ex in examples[:3]] + [ex["source"] for ex in examples[3:5]] + ["text"]
    success = REWARDS.get("edit_success")(results, examples)
    score = REWARDS.get("edit_score")(results, examples)
    kept = REWARDS.get("edit_preservation")(results, examples)
    assert success[:3] == [1.0] * 3 and success[3:5] == [0.0] * 2 and success[5] is None
    assert score[:3] == [1.0] * 3 and all(0 < s < 1 for s in score[3:5]) and score[5] is None
    assert kept[:5] == [1.0] * 5 and kept[5] is None  # doing nothing keeps everything
    assert REWARDS.get("edit_success")([examples[0]["target"]], [{"prompt": "x"}]) == [None]
    with pytest.raises(ValueError, match="edit_score: 2 completions for 1 examples"):
        REWARDS.get("edit_score")(results[:2], examples[:1])


@pytest.mark.slow
def test_edit_instruction_asks_a_served_judge_with_source_and_result(judge):
    from mmrl.core.reward_computer import RewardComputer

    Judge.answer = staticmethod(lambda body: _top(yes=0.6, no=0.2, maybe=0.001))
    ex = edit_example(4)
    options = {"judge_url": judge, "judge_model": "judge-7b"}
    total, parts, stats = RewardComputer({"edit_instruction": 1.0}, {"edit_instruction": options})(
        [ex["target"], "text"], [ex, ex])
    assert parts["edit_instruction"].tolist() == [pytest.approx(0.75), 0.0]
    [(_, body, _)] = Judge.seen
    image, text = body["messages"][0]["content"]
    assert f'"{ex["instruction"]}"' in text["text"] and text["text"].endswith("Answer yes or no.")
    shown = np.asarray(_png(image["image_url"]["url"]).convert("RGB"))
    assert shown.shape == (16, 33, 3)  # source | 1-px gap | result
    assert np.array_equal(shown[:, :16], np.asarray(ex["source"])) and np.array_equal(shown[:, 17:], np.asarray(ex["target"]))
    with pytest.raises(FileNotFoundError, match="task.reward_kwargs.edit_instruction.path"):
        REWARDS.get("edit_instruction").reward_check()
