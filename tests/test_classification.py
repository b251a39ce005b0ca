"""``classification`` (CLS-RL / No-Thinking-CLS-RL): synthetic generator, image-folder and JSONL
readers, targets that score the max, hints, metrics, visualisation, config."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from mmrl.config import load_config
from mmrl.core.reward_computer import RewardComputer
from mmrl.data.scenes import COLORS, SHAPES
from mmrl.registry import TASKS
from mmrl.data.images import ImageFiles, find_images
from mmrl.tasks.classification import image_folder


def task(**options):
    return TASKS.get("classification")(**options)


def _text(messages):
    return " ".join(i["text"] for m in messages for i in m["content"] if i.get("type") == "text")


# -- synthetic -------------------------------------------------------------------------------------
def test_synthetic_is_deterministic_and_splits_differ():
    a, b = task(), task()
    ex1, ex2 = a.examples("train")[5], b.examples("train")[5]
    assert ex1["answer"] == ex2["answer"] and ex1["box"] == ex2["box"]
    assert ex1["image"].tobytes() == ex2["image"].tobytes()
    assert ex1["image"].size == (112, 112)
    train_ids = {a.examples("train")[i]["id"] for i in range(200)}
    eval_ids = {a.examples("eval")[i]["id"] for i in range(200)}
    assert not train_ids & eval_ids
    assert len(a.examples("eval")) == 1000


@pytest.mark.parametrize("label,classes", [("shape", list(SHAPES)), ("color", sorted(COLORS))])
def test_synthetic_labels_and_prompt(label, classes):
    t = task(label=label)
    seen = set()
    for i in range(60):
        ex = t.examples("train")[i]
        assert ex["classes"] == classes and ex["answer"] in classes
        assert ex["object"][label] == ex["answer"]
        x1, y1, x2, y2 = ex["box"]
        assert 0 <= x1 < x2 <= 112 and 0 <= y1 < y2 <= 112 and x2 - x1 >= 50  # one large object
        # the object's pixels have its colour
        assert ex["image"].getpixel(((x1 + x2) // 2, y2 - 2)) == COLORS[ex["object"]["color"]]
        seen.add(ex["answer"])
    assert seen == set(classes)  # every class shows up
    question = "Which shape is this?" if label == "shape" else "Which color is this?"
    assert _text(t.prompt(ex)) == (
        f"{question} Options: {', '.join(classes)}. Answer with <think>...</think><answer>option</answer>."
    )


def test_no_thinking_mode():
    t = task(thinking=False)
    ex = t.examples("eval")[0]
    assert _text(t.prompt(ex)).endswith("Options: circle, square, triangle. Answer with <answer>option</answer>.")
    assert t.target(ex) == f"<answer>{ex['answer']}</answer>"
    assert t.rewards == {"equality": 1.0} and t.reward_kwargs == {}
    assert type(t).rewards == {"format": 0.5, "accuracy": 1.0} and task().rewards == {"format": 0.5, "accuracy": 1.0}


@pytest.mark.parametrize("bad", [
    {"label": "size"}, {"thinking": "false"}, {"image_size": 8}, {"classes": "circle"},
    {"classes": ["circle", "circle"]}, {"classes": ["hexagon"]}, {"train_dir": "x"},
    {"train_dir": "x", "train_path": "y", "eval_dir": "z"}, {"colour": "red"},
])
def test_bad_options(bad):
    with pytest.raises(ValueError):
        task(**bad)


def test_synthetic_classes_subset():
    t = task(classes=["triangle", "circle"])
    answers = {t.examples("train")[i]["answer"] for i in range(30)}
    assert answers == {"triangle", "circle"}
    assert t.examples("train")[0]["question"] == "Which shape is this? Options: triangle, circle."


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("label", ["shape", "color"])
def test_targets_score_the_max(thinking, label):
    t = task(thinking=thinking, label=label)
    examples = [t.examples("eval")[i] for i in range(30)]
    targets = [t.target(ex) for ex in examples]
    total, components, stats = RewardComputer(t.rewards, t.reward_kwargs)(targets, examples)
    for scores in components.values():
        assert scores.tolist() == [1.0] * 30
    assert total.tolist() == pytest.approx([sum(t.rewards.values())] * 30)
    assert all(v == 0.0 for k, v in stats.items() if k.endswith("unparsable_frac"))
    m = t.metrics(targets, examples)
    assert m["accuracy"] == 1.0 and m["valid_option"] == 1.0


def test_target_hand_built():
    ex = {"answer": "circle", "object": {"color": "red", "shape": "circle"}, "classes": list(SHAPES)}
    assert task().target(ex) == "<think>It is a red circle.</think><answer>circle</answer>"
    assert task().target({"answer": "cat"}) == "<think>This is cat.</think><answer>cat</answer>"


# -- metrics, hints, visualize ---------------------------------------------------------------------
def test_metrics_per_class_hand_worked():
    """Two circles (one right), one square (right), one triangle (no answer block): accuracy
    2/4 = 0.5, circle 1/2, square 1/1, triangle 0/1; valid options: circle, square, "Circle." = 3/4."""
    exs = [{"answer": a, "classes": list(SHAPES)} for a in ("circle", "circle", "square", "triangle")]
    completions = ["<answer>Circle.</answer>", "<answer>square</answer>", "<answer>square</answer>", "triangle"]
    m = task().metrics(completions, exs)
    assert m == {"accuracy": 0.5, "accuracy/circle": 0.5, "accuracy/square": 1.0, "accuracy/triangle": 0.0,
                 "valid_option": 0.75}
    # answer-only: graded by equality, so the bare "triangle" counts and "Circle." does not
    m = task(thinking=False).metrics(completions, exs)
    assert m["accuracy/triangle"] == 1.0 and m["accuracy/circle"] == 0.0 and m["accuracy"] == 0.5


def test_hints_tiers():
    t = task()
    assert t.hints({"answer": "circle", "label_kind": "shape", "classes": list(SHAPES)}) == [
        "Look at the outline, not the color.", "It is round, with no corners.", "The answer is circle."]
    colors = sorted(COLORS)  # blue, green, red, yellow
    assert t.hints({"answer": "red", "label_kind": "color", "classes": colors}) == [
        "Look at the color, not the outline.", "It is not yellow.", "The answer is red."]
    assert t.hints({"answer": "dog", "label_kind": "class", "classes": ["cat", "dog"]}) == [
        "Answer with one of the options, as written.", "Look at the whole image.", "The answer is dog."]
    for label in ("shape", "color"):
        tt = task(label=label)
        for i in range(30):
            ex = tt.examples("train")[i]
            knowledge, planning, solution = tt.hints(ex)
            assert ex["answer"] not in knowledge + planning and ex["answer"] in solution


def test_build_prompt_and_visualize():
    t = task()
    ex = dict(t.examples("eval")[2])
    ex["hint"] = t.hints(ex)[1]
    assert _text(t.build_prompt(ex)).endswith(f"Hint: {ex['hint']}")
    right = t.visualize(ex, t.target(ex))
    wrong = t.visualize(ex, "garbage")
    assert right.size == wrong.size == (448, 448 + 18)
    assert right.tobytes() != wrong.tobytes()  # the label colour differs


# -- readers ---------------------------------------------------------------------------------------
def _folder(root, layout):
    """``layout``: class -> list of (file name, colour or None for a corrupt file)."""
    for cls, files in layout.items():
        for name, color in files:
            path = root / cls / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if color is None:
                path.write_bytes(b"\x89PNG\r\n\x1a\n not an image")
            else:
                Image.new("RGB", (40, 30), color).save(path)
    return root


def test_image_folder_reader(tmp_path):
    train = _folder(tmp_path / "train", {
        "dog": [("d1.png", "blue"), ("sub/d2.jpg", "blue"), ("bad.png", None)],
        "cat": [("c1.webp", "red")],
    })
    (train / "cat" / "notes.txt").write_text("not an image")  # ignored: not an image extension
    (train / ".hidden").mkdir()  # hidden folder: not a class
    evald = _folder(tmp_path / "eval", {"cat": [("c.png", "red")], "dog": [("d.png", "blue")]})
    t = task(train_dir=str(train), eval_dir=str(evald))
    ds = t.examples("train")
    assert len(ds) == 4  # c1.webp, bad.png, d1.png, sub/d2.jpg; the corrupt one counts until opened
    labels = [ds[i]["answer"] for i in range(4)]
    assert labels == ["cat", "dog", "dog", "dog"]  # bad.png (index 1) falls through to d1.png
    assert ds[1]["image_path"].endswith("d1.png")
    assert ds.stats() == {"examples": 4, "bad_images": 1}
    ex = ds[0]
    assert ex["classes"] == ["cat", "dog"] and ex["image"].size == (112, 112)
    assert ex["image"].getpixel((5, 5))[0] > 200  # the red image, resized
    assert ex["question"] == "What is in this image? Options: cat, dog."
    assert _text(t.prompt(ex)) == "What is in this image? Options: cat, dog. Answer with <think>...</think><answer>option</answer>."
    assert t.target(ex) == "<think>This is cat.</think><answer>cat</answer>"
    assert t.examples("eval")[1]["answer"] == "dog"
    examples = [ds[i] for i in range(4)] + [t.examples("eval")[i] for i in range(2)]
    targets = [t.target(e) for e in examples]
    total, _, _ = RewardComputer(t.rewards, t.reward_kwargs)(targets, examples)
    assert total.tolist() == [1.5] * 6
    # classes pins the subfolders and their order; image_size null keeps the size
    t2 = task(train_dir=str(train), eval_dir=str(evald), classes=["dog", "cat"], image_size=None,
              question="Which pet is this?")
    ex = t2.examples("train")[0]
    assert ex["answer"] == "dog" and ex["image"].size == (40, 30)
    assert ex["question"] == "Which pet is this? Options: dog, cat."
    with pytest.raises(ValueError, match="bird"):
        task(train_dir=str(train), eval_dir=str(evald), classes=["bird"]).examples("train")


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        image_folder(tmp_path / "nope")
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    with pytest.raises(ValueError, match="no images"):
        image_folder(tmp_path / "empty")
    with pytest.raises(ValueError, match="no class subfolders"):
        image_folder(tmp_path / "empty" / "cat")
    _folder(tmp_path / "allbad", {"cat": [("a.png", None)]})
    files = image_folder(tmp_path / "allbad")
    with pytest.raises(ValueError, match="no image could be opened"):
        files[0]


def test_find_images_and_image_files(tmp_path):
    _folder(tmp_path, {"a": [("x.PNG", "red"), ("y.jpeg", "red")], "b": [("z.gif", "red")]})
    assert [p.name for p in find_images(tmp_path)] == ["x.PNG", "y.jpeg"]
    files = ImageFiles(find_images(tmp_path), [{"k": 1}, {"k": 2}], size=20)
    assert files[-1]["k"] == 2 and files[0]["image"].size == (20, 20) and files[0]["image_size"] == (20, 20)
    assert [f["k"] for f in files[0:2]] == [1, 2]
    with pytest.raises(IndexError):
        files[2]


def test_jsonl_reader(tmp_path):
    for name, color in (("a.png", "red"), ("b.png", "blue"), ("c.png", "green")):
        Image.new("RGB", (20, 20), color).save(tmp_path / name)
    (tmp_path / "bad.png").write_bytes(b"junk")
    lines = [
        json.dumps({"image": "a.png", "label": "cat"}),
        "{broken json",
        json.dumps({"image": "b.png", "label": "dog"}),
        json.dumps({"image": "c.png"}),  # no label
        json.dumps({"image": "bad.png", "label": "bird"}),
        json.dumps({"image": "c.png", "label": 7}),  # numbers are labels too
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "eval.jsonl").write_text(json.dumps({"image": "b.png", "label": "dog"}) + "\n")
    t = task(train_path=str(tmp_path / "train.jsonl"), eval_path=str(tmp_path / "eval.jsonl"))
    ds = t.examples("train")
    assert len(ds) == 4
    assert ds.stats()["skipped_lines"] == 2
    assert ds[0]["classes"] == ["7", "bird", "cat", "dog"]  # labels seen, sorted
    assert [ds[i]["answer"] for i in range(4)] == ["cat", "dog", "7", "7"]  # bad.png falls through
    assert ds.stats()["bad_images"] == 1
    assert ds[0]["image"].size == (112, 112)
    assert t.examples("eval")[0]["classes"] == ["dog"]
    ex = ds[2]
    assert t.metrics(["<answer>7.0</answer>"], [ex])["accuracy"] == 1.0  # numbers compare as numbers
    # classes: lines with other labels are skipped, the list keeps its order
    t2 = task(train_path=str(tmp_path / "train.jsonl"), eval_path=str(tmp_path / "eval.jsonl"),
              classes=["dog", "cat"], image_root=str(tmp_path))
    ds2 = t2.examples("train")
    assert len(ds2) == 2 and ds2[0]["classes"] == ["dog", "cat"]
    assert ds2.stats()["skipped_lines"] == 4


def test_real_source_needs_both_splits(tmp_path):
    with pytest.raises(ValueError, match="eval_dir or eval_path"):
        task(train_dir=str(tmp_path))


def test_config_loads():
    cfg = load_config("configs/vlm/classification_tiny.yaml")
    assert cfg.task.name == "classification"
    t = TASKS.get(cfg.task.name)(**dict(cfg.task.options))
    assert t.examples("eval")[0]["answer"] in SHAPES
    assert cfg.rollout.num_generations == load_config("configs/vlm/counting_tiny.yaml").rollout.num_generations
