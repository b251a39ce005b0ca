"""The counting and grounding task plugins: examples, prompts, targets, metrics, visualisation."""

import math
from collections import Counter

import pytest

from mmrl.data.scenes import COLORS
from mmrl.registry import REWARDS, TASKS
from mmrl.measures.boxes import box_iou


@pytest.fixture(params=["counting", "grounding"])
def task(request):
    return TASKS.get(request.param)()


def _images(messages):
    return [item for m in messages for item in m["content"] if item.get("type") == "image"]


def test_registered_with_declared_rewards(task):
    assert task.modality == "vlm"
    for name in task.rewards:
        assert name in REWARDS


def test_examples_deterministic_and_splits_differ(task):
    train, again, eval_ = task.examples("train"), type(task)().examples("train"), task.examples("eval")
    assert len(eval_) == 1000 and len(train) == 1_000_000
    for i in range(5):
        a, b = train[i], again[i]
        assert a["image"].tobytes() == b["image"].tobytes() and a["objects"] == b["objects"]
    train_ids = {train[i]["id"] for i in range(50)}
    assert train_ids.isdisjoint(eval_[i]["id"] for i in range(50))
    assert [train[i]["objects"] for i in range(10)] != [eval_[i]["objects"] for i in range(10)]


def test_unknown_split_names_valid_ones(task):
    with pytest.raises(ValueError, match="eval.*train"):
        task.examples("test")


def test_prompt_has_one_image_and_the_question(task):
    ex = task.examples("train")[0]
    messages = task.prompt(ex)
    assert len(_images(messages)) == 1 and _images(messages)[0]["image"] is ex["image"]
    text = " ".join(i["text"] for m in messages for i in m["content"] if i.get("type") == "text")
    assert ex["question"] in text and "<answer>" in text
    assert len(text) < 120  # short prompts keep the tiny model's sequences small


def test_target_scores_full_reward(task):
    examples = [task.examples("eval")[i] for i in range(30)]
    targets = [task.target(ex) for ex in examples]
    for name in task.rewards:
        assert REWARDS.get(name)(targets, examples) == [1.0] * len(examples), name
    assert REWARDS.get("format")(targets, examples, mode="strict") == [1.0] * len(examples)
    metrics = task.metrics(targets, examples)
    assert metrics["accuracy"] == 1.0


# -- counting --------------------------------------------------------------------------------------
@pytest.mark.parametrize("query", ["color", "shape", "color_shape"])
def test_counting_answer_matches_scene(query):
    task = TASKS.get("counting")(query=query)
    for i in range(60):
        ex = task.examples("train")[i]
        q = ex["query"]
        assert (q["color"] is None) == (query == "shape") and (q["shape"] is None) == (query == "color")
        matching = [
            o for o in ex["objects"]
            if (q["color"] is None or o["color"] == q["color"]) and (q["shape"] is None or o["shape"] == q["shape"])
        ]
        assert ex["answer"] == str(len(matching))
        assert ex["image_size"] == ex["image"].size == (112, 112)
        for o in ex["objects"]:
            x1, y1, x2, y2 = o["box"]
            assert 0 <= x1 < x2 <= 112 and 0 <= y1 < y2 <= 112


def test_counting_question_wording():
    qs = {q: TASKS.get("counting")(query=q).examples("train")[0]["question"] for q in ("color", "shape", "color_shape")}
    assert qs["color"].startswith("How many ") and qs["color"].endswith(" shapes are there?")
    assert qs["shape"].split()[2] in ("circles", "squares", "triangles")
    assert len(qs["color_shape"].split()) == 6  # How many red circles are there?


def test_counting_target_text():
    task = TASKS.get("counting")()
    ex = {"answer": "1", "query": {"color": "red", "shape": "circle"}}
    assert task.target(ex) == "<think>I count 1 red circle.</think><answer>1</answer>"
    ex = {"answer": "0", "query": {"color": "blue", "shape": None}}
    assert task.target(ex) == "<think>I count 0 blue shapes.</think><answer>0</answer>"


def test_counting_enumerating_target_lists_the_matching_cells():
    """reasoning=enumerate: the matches' cells of the 4x4 grid (1-16, reading order) precede the count."""
    task = TASKS.get("counting")(reasoning="enumerate")
    objects = [{"color": "red", "shape": "circle", "box": (60, 2, 80, 22)},     # centre (70, 12): cell 3
               {"color": "blue", "shape": "circle", "box": (2, 30, 20, 48)},    # a distractor
               {"color": "red", "shape": "square", "box": (30, 88, 50, 108)}]   # centre (40, 98): cell 14
    ex = {"answer": "2", "query": {"color": "red", "shape": None}, "objects": objects, "image_size": (112, 112)}
    assert task.target(ex) == "<think>Red shapes in cells 3, 14: I count 2 red shapes.</think><answer>2</answer>"
    none = dict(ex, answer="0", query={"color": "green", "shape": "square"})
    assert task.target(none) == "<think>Green squares in cells none: I count 0 green squares.</think><answer>0</answer>"
    # a record read from a file has no scene description: the plain counting thought
    assert task.target({"answer": "2"}) == "<think>I count 2.</think><answer>2</answer>"
    with pytest.raises(ValueError, match="reasoning"):
        TASKS.get("counting")(reasoning="guess")


def test_counting_distribution_covers_all_counts():
    task = TASKS.get("counting")(max_count=4)
    counts = Counter(int(task.examples("train")[i]["answer"]) for i in range(500))
    assert set(counts) == {0, 1, 2, 3, 4}
    assert min(counts.values()) > 60  # roughly uniform: 100 expected each


def test_counting_options_validated():
    with pytest.raises(ValueError, match="query"):
        TASKS.get("counting")(query="size")
    with pytest.raises(ValueError, match="valid options"):
        TASKS.get("counting")(colour="red")
    with pytest.raises(ValueError):
        TASKS.get("counting")(max_count=10, max_distractors=10)


def test_counting_metrics_hand_made():
    task = TASKS.get("counting")()
    examples = [{"answer": "2"}, {"answer": "3"}, {"answer": "0"}, {"answer": "1"}]
    completions = [
        "<think>.</think><answer>2</answer>",  # right
        "<answer>5</answer>",  # off by 2
        "<answer>zero</answer>",  # right
        "no answer",  # unparsable: wrong, not in mae
    ]
    m = task.metrics(completions, examples)
    assert m["accuracy"] == pytest.approx(0.5)
    assert m["mae"] == pytest.approx(2 / 3)
    assert m["parsed"] == pytest.approx(0.75)
    assert math.isnan(task.metrics(["x"], [{"answer": "1"}])["mae"])


# -- grounding -------------------------------------------------------------------------------------
def test_grounding_examples_are_unambiguous():
    task = TASKS.get("grounding")()
    for i in range(60):
        ex = task.examples("train")[i]
        pairs = [(o["color"], o["shape"]) for o in ex["objects"]]
        assert 2 <= len(pairs) <= 4 and len(set(pairs)) == len(pairs)
        q = ex["query"]
        assert ex["question"] == f"Give the bounding box of the {q['color']} {q['shape']}."
        (obj,) = [o for o in ex["objects"] if (o["color"], o["shape"]) == (q["color"], q["shape"])]
        assert tuple(obj["box"]) == ex["box"] and all(isinstance(v, int) for v in ex["box"])
        assert ex["answer"] == "[{}, {}, {}, {}]".format(*ex["box"])
        assert ex["image_size"] == (112, 112)
        cx, cy = (ex["box"][0] + ex["box"][2]) // 2, (ex["box"][1] + ex["box"][3]) // 2
        assert ex["image"].getpixel((cx, cy)) == COLORS[q["color"]]


def test_grounding_target_text():
    task = TASKS.get("grounding")()
    ex = {"query": {"color": "blue", "shape": "square"}, "box": (12, 8, 30, 27), "answer": "[12, 8, 30, 27]",
          "image_size": (112, 112)}
    assert task.target(ex) == "<think>The blue square is at the top left.</think><answer>[12, 8, 30, 27]</answer>"


def test_grounding_metrics_hand_made():
    task = TASKS.get("grounding")()
    ex = {"box": (0, 0, 10, 10)}
    completions = [
        "<answer>[0, 0, 10, 10]</answer>",  # 1.0
        "<answer>[0, 0, 5, 10]</answer>",  # 0.5 -> counts as accurate
        "<answer>[5, 5, 15, 15]</answer>",  # 25/175
        "<answer>none</answer>",  # unparsable -> 0
    ]
    m = task.metrics(completions, [ex] * 4)
    assert m["accuracy"] == pytest.approx(0.5)
    assert m["mean_iou"] == pytest.approx((1 + 0.5 + 25 / 175) / 4)
    assert m["parsed"] == pytest.approx(0.75)


def test_grounding_visualize_draws_both_boxes():
    task = TASKS.get("grounding")()
    ex = task.examples("eval")[0]
    x1, y1, x2, y2 = ex["box"]
    far = (x1 + 56) % 100, (y1 + 56) % 100
    completion = f"<answer>[{far[0]}, {far[1]}, {far[0] + 10}, {far[1] + 10}]</answer>"
    assert box_iou((far[0], far[1], far[0] + 10, far[1] + 10), ex["box"]) == 0.0
    img = task.visualize(ex, completion)
    s = img.size[0] // 112
    assert img.size == (112 * s, 112 * s) and s >= 2
    assert img.getpixel((x1 * s, y1 * s)) == (0, 200, 0)  # true box, green
    assert img.getpixel((far[0] * s, far[1] * s)) == (255, 0, 0)  # predicted box, red
    assert ex["image"].size == (112, 112)  # the example's image is not modified
    # unparsable and absurd predictions still give an image
    assert task.visualize(ex, "garbage").size == img.size
    assert task.visualize(ex, "<answer>[-1e300, 0, 1e300, 5]</answer>").size == img.size


def test_counting_visualize_boxes_matching_objects_and_labels_the_answer():
    task = TASKS.get("counting")(query="color")
    ex = next(e for e in (task.examples("eval")[i] for i in range(50)) if int(e["answer"]) >= 1)
    right = task.visualize(ex, f"<answer>{ex['answer']}</answer>")
    wrong = task.visualize(ex, "<answer>99</answer>")
    s = right.size[0] // 112
    for obj in ex["objects"]:
        x1, y1 = obj["box"][:2]
        hit = right.getpixel((x1 * s, y1 * s)) == (0, 200, 0)
        assert hit == (obj["color"] == ex["query"]["color"]), obj  # only matching objects are boxed
    h = right.size[1]
    assert right.size[1] > right.size[0]  # a label strip under the image
    assert right.crop((0, h - 18, 200, h)).tobytes() != wrong.crop((0, h - 18, 200, h)).tobytes()
