"""No-Thinking mode (CLS-RL's equality reward, format answer_only, ``thinking: false`` tasks) and
Scaf-GRPO's tiered hints on the counting and grounding tasks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.core.reward_computer import RewardComputer
from mmrl.data.scenes import position_word
from mmrl.registry import REWARDS, TASKS
from mmrl.rewards.format import MODES


def reward(name):
    return REWARDS.get(name)


def _text(messages):
    return " ".join(i["text"] for m in messages for i in m["content"] if i.get("type") == "text")


# -- equality --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "completion,answer,expected",
    [
        ("2", "2", 1.0),  # a direct answer, no tags
        ("  2 \n", "2", 1.0),
        ("Red  Circle", "red circle", 1.0),  # case-folded, internal whitespace collapsed
        ("RED\tcircle", " red circle ", 1.0),
        ("<answer>2</answer>", "2", 1.0),  # exactly one answer block: its content counts
        ("\n <answer> Red\n Circle </answer> ", "red circle", 1.0),
        ("<answer>3</answer>", "2", 0.0),
        ("2.0", "2", 0.0),  # no numeric tolerance, unlike accuracy
        ("two", "2", 0.0),
        ("<answer>2 circles</answer>", "2", 0.0),  # extra text inside the block
        ("The answer is 2", "2", 0.0),  # extra text, no block
        ("<answer>2</answer> done", "2", 0.0),  # extra text after the block
        ("<think>count</think><answer>2</answer>", "2", 0.0),  # not exactly one block
        ("<answer>1</answer><answer>2</answer>", "2", 0.0),
        ("<answer><answer>2</answer>", "2", 0.0),  # a tag hidden inside the block
        ("<answer>2", "2", 0.0),
        ("", "", 1.0),  # empty equals empty: the truth decides, never the layout alone
        ("<answer></answer>", "", 1.0),
    ],
)
def test_equality_hand_cases(completion, answer, expected):
    assert reward("equality")([completion], [{"answer": answer}]) == [expected]


def test_equality_non_str_and_missing_answer_score_zero():
    eq = reward("equality")
    assert eq([None, 2, b"2", ["2"]], [{"answer": "2"}] * 4) == [0.0] * 4
    assert eq(["2", "2", "2"], [{}, {"answer": None}, None]) == [0.0, 0.0, 0.0]
    assert eq(["2"], [{"answer": 2}]) == [1.0]  # a non-str truth compares as its str


def test_equality_is_stricter_than_accuracy():
    completions = ["<answer>2</answer>", "<answer>2.0</answer>", "<think>x</think><answer>2</answer>"]
    examples = [{"answer": "2"}] * 3
    assert reward("accuracy")(completions, examples) == [1.0, 1.0, 1.0]
    assert reward("equality")(completions, examples) == [1.0, 0.0, 0.0]


def test_equality_batch_length_mismatch_is_an_error():
    with pytest.raises(ValueError):
        reward("equality")(["a", "b"], [{"answer": "a"}])


# -- format answer_only ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,expected",
    [
        ("<answer>2</answer>", 1.0),
        ("  \n<answer>[1, 2, 3, 4]</answer>\n", 1.0),
        ("<answer>a\nb</answer>", 1.0),
        ("<answer></answer>", 1.0),
        ("<think>a</think><answer>2</answer>", 0.0),  # a think block is not wanted
        ("<answer>2</answer> extra", 0.0),
        ("pre <answer>2</answer>", 0.0),
        ("<answer>1</answer><answer>2</answer>", 0.0),
        ("<answer><think>a</think>2</answer>", 0.0),  # tags hidden inside the block
        ("<answer><answer>2</answer>", 0.0),
        ("<answer>2", 0.0),
        ("2", 0.0),
        ("", 0.0),
    ],
)
def test_format_answer_only(text, expected):
    assert reward("format")([text], [{}], mode="answer_only") == [expected]


def test_format_answer_only_leaves_other_modes_alone():
    fmt = reward("format")
    assert MODES == ("strict", "lenient", "answer_only")
    texts = ["<answer>2</answer>", "<think>a</think><answer>2</answer>"]
    assert fmt(texts, [{}, {}]) == [0.0, 1.0]
    assert fmt(texts, [{}, {}], mode="lenient") == [1.0, 1.0]
    assert fmt(texts, [{}, {}], mode="answer_only") == [1.0, 0.0]
    with pytest.raises(ValueError, match="answer_only"):
        fmt(texts, [{}, {}], mode="bare")


# -- properties: floats in {0, 1}, never an exception ----------------------------------------------
FRAGMENTS = st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "\t", "2", "Red", "ſ", "İ"])
TEXTS = st.one_of(st.text(), st.lists(st.one_of(FRAGMENTS, st.text(max_size=3)), max_size=12).map("".join))
COMPLETIONS = st.one_of(TEXTS, st.none(), st.integers(), st.binary(max_size=4))
EXAMPLES = st.one_of(st.fixed_dictionaries({"answer": TEXTS}), st.just({}), st.just({"answer": None}), st.none())


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(COMPLETIONS, EXAMPLES), min_size=1, max_size=4))
def test_equality_and_format_are_binary_and_never_raise(pairs):
    completions, examples = [c for c, _ in pairs], [e for _, e in pairs]
    outs = [reward("equality")(completions, examples)]
    outs += [reward("format")(completions, examples, mode=mode) for mode in MODES]
    for out in outs:
        assert len(out) == len(pairs)
        assert all(type(v) is float and v in (0.0, 1.0) for v in out)


@settings(max_examples=100, deadline=None)
@given(TEXTS)
def test_equality_accepts_its_own_answer_block(answer):
    """Whatever the truth, the bare answer and its one-block form score 1.0 when they carry no tag."""
    if any(tag in answer for tag in ("<think>", "</think>", "<answer>", "</answer>")):
        return
    assert reward("equality")([answer, f"<answer>{answer}</answer>"], [{"answer": answer}] * 2) == [1.0, 1.0]


# -- thinking: false -------------------------------------------------------------------------------
def test_counting_no_thinking_prompt_target_and_rewards():
    task = TASKS.get("counting")(thinking=False)
    ex = task.examples("eval")[0]
    assert _text(task.prompt(ex)) == f"{ex['question']} Answer with <answer>number</answer>."
    assert task.target(ex) == f"<answer>{ex['answer']}</answer>"
    assert task.target({"answer": "3", "query": {"color": "red", "shape": None}}) == "<answer>3</answer>"
    assert task.rewards == {"equality": 1.0} and task.reward_kwargs == {}
    assert type(task).rewards == {"format": 0.5, "accuracy": 1.0}  # class defaults untouched
    assert TASKS.get("counting")().rewards == {"format": 0.5, "accuracy": 1.0}


def test_grounding_no_thinking_prompt_target_and_rewards():
    task = TASKS.get("grounding")(thinking=False)
    ex = task.examples("eval")[0]
    assert _text(task.prompt(ex)) == f"{ex['question']} Answer with <answer>[x1, y1, x2, y2]</answer>."
    ex2 = {"query": {"color": "blue", "shape": "square"}, "box": (12, 8, 30, 27), "answer": "[12, 8, 30, 27]",
           "image_size": (112, 112)}
    assert task.target(ex2) == "<answer>[12, 8, 30, 27]</answer>"
    assert task.rewards == {"format": 0.5, "iou": 1.0}
    assert task.reward_kwargs == {"format": {"mode": "answer_only"}}
    assert type(task).reward_kwargs == {} and TASKS.get("grounding")().reward_kwargs == {}


@pytest.mark.parametrize("name", ["counting", "grounding"])
@pytest.mark.parametrize("thinking", [True, False])
def test_target_passes_its_own_rewards(name, thinking):
    task = TASKS.get(name)(thinking=thinking)
    examples = [task.examples("eval")[i] for i in range(30)]
    targets = [task.target(ex) for ex in examples]
    total, components, stats = RewardComputer(task.rewards, task.reward_kwargs)(targets, examples)
    assert set(components) == set(task.rewards)
    for scores in components.values():
        assert scores.tolist() == [1.0] * 30
    assert total.tolist() == pytest.approx([sum(task.rewards.values())] * 30)
    assert all(v == 0.0 for k, v in stats.items() if k.endswith("unparsable_frac"))
    assert task.metrics(targets, examples)["accuracy"] == 1.0


def test_no_thinking_targets_fail_the_thinking_layout_and_vice_versa():
    examples = [TASKS.get("counting")().examples("eval")[i] for i in range(5)]
    bare = [TASKS.get("counting")(thinking=False).target(ex) for ex in examples]
    full = [TASKS.get("counting")().target(ex) for ex in examples]
    assert reward("format")(bare, examples, mode="strict") == [0.0] * 5
    assert reward("format")(full, examples, mode="answer_only") == [0.0] * 5
    assert reward("equality")(full, examples) == [0.0] * 5


@pytest.mark.parametrize("name", ["counting", "grounding"])
@pytest.mark.parametrize("bad", ["false", 0, 1, None])
def test_thinking_must_be_a_bool(name, bad):
    with pytest.raises(ValueError, match="thinking must be true or false"):
        TASKS.get(name)(thinking=bad)


def test_thinking_true_is_unchanged():
    counting = TASKS.get("counting")(thinking=True)
    ex = counting.examples("eval")[3]
    assert _text(counting.prompt(ex)) == f"{ex['question']} Answer with <think>...</think><answer>number</answer>."
    assert _text(counting.prompt(ex)) == _text(TASKS.get("counting")().prompt(ex))
    ex = {"answer": "1", "query": {"color": "red", "shape": "circle"}}
    assert counting.target(ex) == "<think>I count 1 red circle.</think><answer>1</answer>"
    assert "rewards" not in vars(counting) and "reward_kwargs" not in vars(counting)

    grounding = TASKS.get("grounding")(thinking=True)
    ex = grounding.examples("eval")[3]
    assert _text(grounding.prompt(ex)) == (
        f"{ex['question']} Answer with <think>...</think><answer>[x1, y1, x2, y2]</answer>."
    )
    ex = {"query": {"color": "blue", "shape": "square"}, "box": (12, 8, 30, 27), "answer": "[12, 8, 30, 27]",
          "image_size": (112, 112)}
    assert grounding.target(ex) == "<think>The blue square is at the top left.</think><answer>[12, 8, 30, 27]</answer>"
    assert grounding.rewards == {"format": 0.5, "iou": 1.0} and grounding.reward_kwargs == {}


# -- hints -----------------------------------------------------------------------------------------
def _obj(color, shape, box):
    return {"color": color, "shape": shape, "box": box}


def test_counting_hints_hand_built():
    """Centres on 112 px, thirds at 37.3 and 74.7: (60, 60) center, (22, 50) left, (20, 20) top left;
    the blue circle (top right) and the red square (bottom right) do not match "red circles"."""
    ex = {
        "answer": "4",
        "query": {"color": "red", "shape": "circle"},
        "image_size": (112, 112),
        "objects": [
            _obj("red", "circle", (50, 50, 70, 70)),
            _obj("blue", "circle", (80, 10, 100, 30)),
            _obj("red", "circle", (12, 40, 32, 60)),
            _obj("red", "circle", (10, 10, 30, 30)),
            _obj("red", "square", (80, 80, 100, 100)),
            _obj("red", "circle", (11, 12, 29, 28)),  # a second one top left: named once
        ],
    }
    hints = TASKS.get("counting")().hints(ex)
    assert hints == [
        "Count only red circles; ignore other shapes.",
        "Look at: top left, left, center.",  # reading order, not object order
        "The answer is 4.",
    ]


def test_counting_hints_generic_queries_and_zero():
    task = TASKS.get("counting")()
    objects = [_obj("red", "square", (80, 80, 100, 100))]
    by_color = {"answer": "1", "query": {"color": "red", "shape": None}, "image_size": (112, 112), "objects": objects}
    assert task.hints(by_color) == [
        "Count red shapes of any kind; ignore other colors.", "Look at: bottom right.", "The answer is 1."
    ]
    by_shape = {"answer": "0", "query": {"color": None, "shape": "circle"}, "image_size": (112, 112), "objects": objects}
    assert task.hints(by_shape) == [
        "Count circles of any color; ignore other shapes.", "None are there.", "The answer is 0."
    ]


def test_grounding_hints_hand_built():
    """Centre (90, 95) lies in the last third both ways: bottom right."""
    ex = {"query": {"color": "green", "shape": "triangle"}, "box": (80, 85, 100, 105), "answer": "[80, 85, 100, 105]",
          "image_size": (112, 112)}
    assert TASKS.get("grounding")().hints(ex) == [
        "Look for the green triangle.", "Look at: bottom right.", "The box is [80, 85, 100, 105]."
    ]


@pytest.mark.parametrize("name", ["counting", "grounding"])
def test_hints_on_generated_examples(name):
    task = TASKS.get(name)()
    for i in range(40):
        ex = task.examples("train")[i]
        hints = task.hints(ex)
        assert len(hints) == 3 and all(isinstance(h, str) and h for h in hints)
        knowledge, planning, solution = hints
        assert ex["answer"] not in knowledge + planning  # only the solution tier gives it away
        assert ex["answer"] in solution
        if name == "grounding":
            assert planning == f"Look at: {position_word(ex['box'], 112)}."
            assert f"{ex['query']['color']} {ex['query']['shape']}" in knowledge
        elif ex["answer"] == "0":
            assert planning == "None are there."
        else:
            assert planning.startswith("Look at: ")


@pytest.mark.parametrize("name", ["counting", "grounding"])
@pytest.mark.parametrize("thinking", [True, False])
def test_build_prompt_appends_the_hint(name, thinking):
    task = TASKS.get(name)(thinking=thinking)
    ex = dict(task.examples("eval")[1])
    plain = _text(task.prompt(ex))
    assert _text(task.build_prompt(ex)) == plain  # no hint: the plain prompt
    for hint in task.hints(ex):
        ex["hint"] = hint
        messages = task.build_prompt(ex)
        assert _text(messages) == f"{plain} Hint: {hint}"
        images = [i for m in messages for i in m["content"] if i.get("type") == "image"]
        assert len(images) == 1 and images[0]["image"] is ex["image"]
    assert _text(task.prompt(ex)) == plain  # prompt() itself never shows the hint
