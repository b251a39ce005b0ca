"""SSL4RL pretext tasks ``rotation`` and ``jigsaw``: transforms are pixel-exact, labels come from
the seed, folders of unlabelled images work, targets score the max, and ``jigsaw_position``."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mmrl.config import load_config
from mmrl.core.reward_computer import RewardComputer
from mmrl.registry import REWARDS, TASKS
from mmrl.measures.jigsaw import parse_positions
from mmrl.tasks.ssl import ANGLES, rotate_clockwise, shaded_background, shuffle_tiles, split_files

jigsaw_position = REWARDS.get("jigsaw_position")


def _text(messages):
    return " ".join(i["text"] for m in messages for i in m["content"] if i.get("type") == "text")


def quadrants(size=112):
    """Red top-left, green top-right, blue bottom-left, yellow bottom-right."""
    im = Image.new("RGB", (size, size))
    h = size // 2
    for (x, y), color in zip([(0, 0), (h, 0), (0, h), (h, h)], ["red", "green", "blue", "yellow"]):
        im.paste(Image.new("RGB", (h, h), color), (x, y))
    return im


def corner_colors(im):
    w, h = im.size
    return [im.getpixel(p) for p in [(2, 2), (w - 3, 2), (2, h - 3), (w - 3, h - 3)]]


RED, GREEN, BLUE, YELLOW = (255, 0, 0), (0, 128, 0), (0, 0, 255), (255, 255, 0)


def near(a, b, tol=40):
    """Colours equal up to JPEG / resize noise."""
    return all(abs(x - y) <= tol for x, y in zip(a, b))


# -- transforms ------------------------------------------------------------------------------------
def test_rotate_clockwise_hand_checked():
    """Turning clockwise by 90 moves the top-left corner to the top right."""
    im = quadrants()
    assert corner_colors(rotate_clockwise(im, 0)) == [RED, GREEN, BLUE, YELLOW]
    assert corner_colors(rotate_clockwise(im, 90)) == [BLUE, RED, YELLOW, GREEN]
    assert corner_colors(rotate_clockwise(im, 180)) == [YELLOW, BLUE, GREEN, RED]
    assert corner_colors(rotate_clockwise(im, 270)) == [GREEN, YELLOW, RED, BLUE]
    with pytest.raises(ValueError):
        rotate_clockwise(im, 45)


def test_shuffle_tiles_hand_checked():
    """Permutation (2, 0, 3, 1): the top-left place shows tile 2 (blue), top right tile 0 (red),
    bottom left tile 3 (yellow), bottom right tile 1 (green)."""
    out = shuffle_tiles(quadrants(), (2, 0, 3, 1), 2)
    assert corner_colors(out) == [BLUE, RED, YELLOW, GREEN]
    assert shuffle_tiles(quadrants(), (0, 1, 2, 3), 2).tobytes() == quadrants().tobytes()
    with pytest.raises(ValueError):
        shuffle_tiles(quadrants(), (0, 0, 1, 2), 2)


def test_shaded_background_differs_by_region():
    bg = shaded_background(112)
    corners = [bg.getpixel(p) for p in [(0, 0), (111, 0), (0, 111), (111, 111)]]
    assert corners == [(250, 245, 250), (250, 245, 160), (160, 245, 250), (160, 245, 160)]


# -- synthetic examples ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rotation", "jigsaw"])
def test_synthetic_deterministic_and_disjoint(name):
    a, b = TASKS.get(name)(), TASKS.get(name)()
    x, y = a.examples("train")[3], b.examples("train")[3]
    assert x["answer"] == y["answer"] and x["image"].tobytes() == y["image"].tobytes()
    assert x["image"].size == (112, 112) and x["synthetic"]
    train = {a.examples("train")[i]["id"] for i in range(100)}
    assert not train & {a.examples("eval")[i]["id"] for i in range(100)}


def test_rotation_labels_and_prompt():
    t = TASKS.get("rotation")()
    answers = [t.examples("train")[i]["answer"] for i in range(80)]
    assert set(answers) == {"0", "90", "180", "270"}
    ex = t.examples("train")[0]
    assert _text(t.prompt(ex)) == ("How far is this image turned clockwise? Options: 0, 90, 180, 270. "
                                   "Answer with <think>...</think><answer>number</answer>.")
    # the shaded background's light corner moves with the turn: turn back and it is top left
    for i in range(8):
        ex = t.examples("eval")[i]
        back = rotate_clockwise(ex["image"], (360 - ex["angle"]) % 360)
        assert back.getpixel((0, 0)) == (250, 245, 250)


def test_jigsaw_labels_undo_the_shuffle():
    t = TASKS.get("jigsaw")()
    perms = set()
    for i in range(40):
        ex = t.examples("train")[i]
        perm = ex["permutation"]
        assert sorted(perm) == [0, 1, 2, 3] and ex["answer"] == " ".join(map(str, perm))
        perms.add(perm)
        # put each shown tile back at its original place: the background is smooth again
        tile = 56
        restored = Image.new("RGB", (112, 112))
        for place, source in enumerate(perm):
            r, c = divmod(place, 2)
            sr, sc = divmod(source, 2)
            restored.paste(ex["image"].crop((c * tile, r * tile, (c + 1) * tile, (r + 1) * tile)), (sc * tile, sr * tile))
        assert restored.getpixel((0, 0)) == (250, 245, 250)
    assert len(perms) > 10
    assert _text(t.prompt(ex)).startswith("The 4 tiles of this image are mixed.")


def test_jigsaw_grid_three():
    t = TASKS.get("jigsaw")(grid=3)
    ex = t.examples("eval")[0]
    assert sorted(ex["permutation"]) == list(range(9)) and ex["image"].size == (111, 111)
    assert "The 9 tiles" in ex["question"]
    with pytest.raises(ValueError):
        TASKS.get("jigsaw")(grid=4)


@pytest.mark.parametrize("name", ["rotation", "jigsaw"])
@pytest.mark.parametrize("bad", [{"thinking": "no"}, {"image_size": 20}, {"eval_fraction": 1.5},
                                 {"eval_image_dir": "x"}, {"label": "shape"}])
def test_bad_options(name, bad):
    with pytest.raises(ValueError):
        TASKS.get(name)(**bad)


@pytest.mark.parametrize("name", ["rotation", "jigsaw"])
@pytest.mark.parametrize("thinking", [True, False])
def test_targets_score_the_max(name, thinking):
    t = TASKS.get(name)(thinking=thinking)
    examples = [t.examples("eval")[i] for i in range(24)]
    targets = [t.target(ex) for ex in examples]
    total, components, stats = RewardComputer(t.rewards, t.reward_kwargs)(targets, examples)
    for scores in components.values():
        assert scores.tolist() == [1.0] * 24
    assert total.tolist() == pytest.approx([sum(t.rewards.values())] * 24)
    assert all(v == 0.0 for k, v in stats.items() if k.endswith("unparsable_frac"))
    assert t.metrics(targets, examples)["accuracy"] == 1.0


def test_rewards_by_mode():
    assert TASKS.get("rotation")().rewards == {"format": 0.5, "accuracy": 1.0}
    assert TASKS.get("rotation")(thinking=False).rewards == {"equality": 1.0}
    assert TASKS.get("jigsaw")().rewards == {"format": 0.5, "jigsaw_position": 1.0}
    no_think = TASKS.get("jigsaw")(thinking=False)
    assert no_think.reward_kwargs == {"format": {"mode": "answer_only"}} and TASKS.get("jigsaw")().reward_kwargs == {}


def test_hints_metrics_visualize():
    rot = TASKS.get("rotation")()
    ex = {"answer": "90", "angle": 90, "synthetic": True}
    assert rot.hints(ex) == ["Triangle tips point up when the image is not turned.", "It lies on its side.",
                             "The answer is 90."]
    assert rot.hints({"answer": "180", "angle": 180})[1:] == ["It is upright or upside down.", "The answer is 180."]
    exs = [{"answer": "90"}] * 3
    assert rot.metrics(["<answer>90.0</answer>", "<answer>270</answer>", "90"], exs) == {
        "accuracy": pytest.approx(1 / 3), "parsed": pytest.approx(2 / 3)}

    jig = TASKS.get("jigsaw")()
    ex = jig.examples("eval")[0]
    knowledge, planning, solution = jig.hints(ex)
    assert ex["answer"] not in knowledge + planning and solution == f"The answer is {ex['answer']}."
    assert planning == f"The top left tile came from place {ex['permutation'][0]}."
    exs = [{"answer": "2 0 3 1", "permutation": (2, 0, 3, 1)}] * 3
    m = jig.metrics(["<answer>2 0 3 1</answer>", "<answer>2 0 1 3</answer>", "no answer"], exs)
    assert m == {"accuracy": pytest.approx(1 / 3), "tile_accuracy": pytest.approx(0.5), "parsed": pytest.approx(2 / 3)}
    for task in (rot, jig):
        ex = task.examples("eval")[1]
        right, wrong = task.visualize(ex, task.target(ex)), task.visualize(ex, "?")
        assert right.size == (448, 466) and right.tobytes() != wrong.tobytes()


# -- folders of unlabelled images ------------------------------------------------------------------
def _images(root, n, corrupt=()):
    for i in range(n):
        path = root / ("sub" if i % 2 else "") / f"img{i}.{('png', 'jpg', 'webp')[i % 3]}"
        path.parent.mkdir(parents=True, exist_ok=True)
        if i in corrupt:
            path.write_bytes(b"not an image")
        else:
            quadrants(64).save(path)
    (root / "readme.txt").write_text("ignored")
    return root


@pytest.mark.parametrize("name", ["rotation", "jigsaw"])
def test_image_dir(tmp_path, name):
    root = _images(tmp_path / "imgs", 10, corrupt={4})
    t = TASKS.get(name)(image_dir=str(root), eval_fraction=0.2)
    train, evals = t.examples("train"), t.examples("eval")
    assert len(train) == 8 and len(evals) == 2
    train_paths = {train[i]["image_path"] for i in range(len(train))}
    eval_paths = {evals[i]["image_path"] for i in range(len(evals))}
    assert not train_paths & eval_paths
    bad = train.stats()["bad_images"] + evals.stats()["bad_images"]
    assert bad == 1  # img4 is unreadable: skipped, counted once, the next file used instead
    ex = train[0]
    assert ex["image"].size == (112, 112) and not ex["synthetic"]
    assert t.examples("train")[0]["answer"] == TASKS.get(name)(image_dir=str(root), eval_fraction=0.2).examples("train")[0]["answer"]
    examples = [train[i] for i in range(len(train))]
    targets = [t.target(e) for e in examples]
    total, _, _ = RewardComputer(t.rewards, t.reward_kwargs)(targets, examples)
    assert total.tolist() == [1.5] * len(examples)
    if name == "rotation":
        for e in examples:  # the red quadrant is back at the top left after turning back
            back = rotate_clockwise(e["image"], (360 - e["angle"]) % 360)
            assert near(back.getpixel((3, 3)), RED)
    else:
        for e in examples:
            assert near(corner_colors(e["image"])[e["permutation"].index(0)], RED)  # tile 0 is red


def test_image_dir_eval_dir_and_errors(tmp_path):
    train = _images(tmp_path / "a", 3)
    evald = _images(tmp_path / "b", 2)
    t = TASKS.get("rotation")(image_dir=str(train), eval_image_dir=str(evald))
    assert len(t.examples("train")) == 3 and len(t.examples("eval")) == 2
    one = _images(tmp_path / "one", 1)
    with pytest.raises(ValueError, match="at least 2 images"):
        TASKS.get("rotation")(image_dir=str(one)).examples("train")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no images"):
        TASKS.get("jigsaw")(image_dir=str(tmp_path / "empty")).examples("train")
    with pytest.raises(FileNotFoundError):
        TASKS.get("jigsaw")(image_dir=str(tmp_path / "missing")).examples("eval")


def test_split_files_is_stable(tmp_path):
    root = _images(tmp_path / "s", 20)
    paths = sorted(p for p in root.rglob("*") if p.suffix != ".txt" and p.is_file())
    a = split_files(paths, root, 0.25)
    assert len(a["eval"]) == 5 and len(a["train"]) == 15 and not set(a["eval"]) & set(a["train"])
    assert split_files(list(reversed(paths)), root, 0.25) == a
    # dropping a training file leaves the other files' splits alone
    b = split_files([p for p in paths if p != a["train"][0]], root, 0.25)
    assert b["eval"] == a["eval"]


# -- jigsaw_position -------------------------------------------------------------------------------
EX = {"answer": "2 0 3 1", "permutation": (2, 0, 3, 1)}


@pytest.mark.parametrize(
    "completion,expected",
    [
        ("<answer>2 0 3 1</answer>", 1.0),
        ("<think>x</think><answer>[2, 0, 3, 1]</answer>", 1.0),
        ("<answer>2031</answer>", 1.0),  # one run of exactly 4 digits
        ("<answer>2,0,1,3</answer>", 0.5),  # places 0 and 1 right: 2/4
        ("<answer>2 1 0 3</answer>", 0.25),  # only place 0 right
        ("<answer>0 1 2 3</answer>", 0.0),
        ("<answer>0 0 0 0</answer>", 0.25),  # a constant guess: 1/n
        ("<answer>9 9 9 1</answer>", 0.25),
        ("<answer>2 0 3</answer>", None),  # three numbers for four places
        ("<answer>2 0 3 1 4</answer>", None),
        ("<answer>20311</answer>", None),
        ("<answer>none</answer>", None),
        ("2 0 3 1", None),  # no answer block
        (None, None),
    ],
)
def test_jigsaw_position_hand_cases(completion, expected):
    assert jigsaw_position([completion], [EX]) == [expected]


def test_jigsaw_position_truth_from_answer_and_options():
    assert jigsaw_position(["<answer>2 0 3 1</answer>"], [{"answer": "2 0 3 1"}]) == [1.0]
    assert jigsaw_position(["<answer>2 0 3 1</answer>"], [{"answer": "2031"}]) == [1.0]
    assert jigsaw_position(["<answer>1</answer>"], [{"answer": "2"}]) == [0.0]
    assert jigsaw_position(["<answer>2 0 3 1</answer>"], [{}]) == [None]
    assert jigsaw_position(["<answer>0 0 0 0</answer>", "<answer>2 0 1 3</answer>"], [EX, EX],
                           require_permutation=True) == [0.0, 0.5]
    with pytest.raises(ValueError):
        jigsaw_position(["a", "b"], [EX])
    assert parse_positions("tile order: 1-2-3-0", 4) == (1, 2, 3, 0)
    assert parse_positions("9" * 5000 + " 1 2 3", 4) == (-1, 1, 2, 3)  # over-long runs never raise


FRAGMENTS = st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", " ", ",", "[", "]", "0", "1",
                             "2", "3", "2031", "9" * 30, "-", "٣", "²"])
TEXTS = st.one_of(st.text(), st.lists(st.one_of(FRAGMENTS, st.text(max_size=3)), max_size=16).map("".join))
TRUTHS = st.one_of(st.just(EX), st.fixed_dictionaries({"answer": TEXTS}), st.just({}), st.none(),
                   st.fixed_dictionaries({"permutation": st.lists(st.integers(0, 8), min_size=1, max_size=9)}))


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(TEXTS, st.none(), st.integers()), TRUTHS), min_size=1, max_size=5))
def test_jigsaw_position_is_none_or_unit_float(pairs):
    out = jigsaw_position([c for c, _ in pairs], [e for _, e in pairs])
    assert len(out) == len(pairs)
    for v in out:
        assert v is None or (type(v) is float and 0.0 <= v <= 1.0 and not math.isnan(v))


def test_config_loads():
    cfg = load_config("configs/vlm/rotation_tiny.yaml")
    assert cfg.task.name == "rotation" and cfg.rollout.max_completion_length == 32
    t = TASKS.get(cfg.task.name)(**dict(cfg.task.options))
    assert t.examples("eval")[0]["answer"] in {str(a) for a in ANGLES}
