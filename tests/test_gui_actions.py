"""Single-step GUI actions (mmrl.measures.gui) and their rewards (rewards/gui.py): every parser
form and alias, hand-worked scores, a Qwen2.5-VL click on a phone screen, never-raise fuzzing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.measures.gui import ACTION_TYPES, normalize_action, parse_action, read_action
from mmrl.measures.gui_match import action_match, text_f1
from mmrl.measures.screen import point_in_box
from mmrl.media.coords import Frame, qwen_resized_size
from mmrl.registry import REWARDS

GUI_REWARDS = ("gui_action_type", "gui_action_args", "gui_action_score", "gui_type_f1")
CLICK = {"action": "click", "point": [10.0, 20.0]}


def ans(body: str) -> str:
    return f"<answer>{body}</answer>"


def think(body: str) -> str:
    return f"<think>I look at the screen.</think>\n<answer>{body}</answer>"


def rewards(completions, example):
    return {name: REWARDS.get(name)(completions, [example] * len(completions)) for name in GUI_REWARDS}


# -- parsing: every form and alias -----------------------------------------------------------------
@pytest.mark.parametrize("body,expected", [
    # JSON objects
    ('{"action": "click", "point": [10, 20]}', CLICK),
    ("{'action': 'click', 'point': [10, 20]}", CLICK),
    ('{"action": "click", "point": [10, 20],}', CLICK),
    ("{'action': 'click', 'point': [10, 20,],}", CLICK),
    ('[{"action": "click", "point": [10, 20]}]', CLICK),
    ('```json\n{"action": "click", "point": [10, 20]}\n```', CLICK),
    ('Action: {"action": "click", "point": [10, 20]} done', CLICK),
    ('{"action": "click", "coordinate": [10, 20]}', CLICK),
    ('{"action": "click", "x": 10, "y": 20}', CLICK),
    ('{"action": "click", "x": "10", "y": "20.0"}', CLICK),
    ('{"action": "click", "point": "(10, 20)"}', CLICK),
    ('{"action": "click", "point": {"x": 10, "y": 20}}', CLICK),
    ('{"action": "click", "point": [0, 10, 20, 30]}', CLICK),  # a box: its centre
    ('{"action": "click", "bbox": [[0, 10], [20, 30]]}', CLICK),
    ('{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [10, 20]}}', CLICK),
    ('{"action_type": "click", "x": 10, "y": 20}', CLICK),
    # names: case and aliases
    ('{"action": "CLICK", "point": [10, 20]}', CLICK),
    ('{"action": "tap", "point": [10, 20]}', CLICK),
    ('{"action": "Long_Press", "point": [10, 20]}', {"action": "long_press", "point": [10.0, 20.0]}),
    ('{"action": "long_click", "point": [10, 20]}', {"action": "long_press", "point": [10.0, 20.0]}),
    ('{"action": "long press", "point": [10, 20]}', {"action": "long_press", "point": [10.0, 20.0]}),
    ('{"action": "type", "text": "hello"}', {"action": "type", "text": "hello"}),
    ('{"action": "input", "text": "hello"}', {"action": "type", "text": "hello"}),
    ('{"action": "type_text", "text": "hello"}', {"action": "type", "text": "hello"}),
    ("{'action': 'type', 'input_text': 'hello'}", {"action": "type", "text": "hello"}),
    ('{"action": "type", "text": 42}', {"action": "type", "text": "42"}),
    ('{"action": "scroll", "direction": "Down"}', {"action": "scroll", "direction": "down"}),
    ('{"action": "swipe", "direction": "left"}', {"action": "scroll", "direction": "left"}),
    ('{"action": "open_app", "app": "Chrome"}', {"action": "open_app", "app": "Chrome"}),
    ('{"action": "open", "app_name": "Chrome"}', {"action": "open_app", "app": "Chrome"}),
    ('{"action": "navigate_back"}', {"action": "navigate_back"}),
    ('{"action": "back"}', {"action": "navigate_back"}),
    ('{"action": "press_back"}', {"action": "navigate_back"}),
    ('{"action": "navigate_home"}', {"action": "navigate_home"}),
    ('{"action": "home"}', {"action": "navigate_home"}),
    ('{"action": "press_home"}', {"action": "navigate_home"}),
    ('{"action": "wait", "seconds": 2}', {"action": "wait"}),  # extra keys dropped
    ('{"action": "terminate", "status": "success"}', {"action": "terminate", "status": "success"}),
    ('{"action": "finish", "status": "failure"}', {"action": "terminate", "status": "failure"}),
    ('{"action": "done", "status": "successful"}', {"action": "terminate", "status": "success"}),
    ('{"action": "stop", "status": "infeasible"}', {"action": "terminate", "status": "failure"}),
    # function calls
    ("click(x=10, y=20)", CLICK),
    ("click(10, 20)", CLICK),
    ("click([10, 20])", CLICK),
    ("click(point=(10, 20))", CLICK),
    ("tap(x=10.0, y=20.0)", CLICK),
    ("click(start_box='<|box_start|>(10,20)<|box_end|>')", CLICK),
    ("I will press it: click(x=10, y=20)", CLICK),
    ('type(text="hello")', {"action": "type", "text": "hello"}),
    ("type(text=hello world)", {"action": "type", "text": "hello world"}),  # unquoted: forgiving split
    ("type(text=it's)", {"action": "type", "text": "it's"}),  # an unmatched quote
    ('type("it\'s, ok")', {"action": "type", "text": "it's, ok"}),
    ('scroll(direction="down")', {"action": "scroll", "direction": "down"}),
    ("swipe('up')", {"action": "scroll", "direction": "up"}),
    ('open_app(app="Maps")', {"action": "open_app", "app": "Maps"}),
    ("navigate_back()", {"action": "navigate_back"}),
    ("press_home()", {"action": "navigate_home"}),
    ('terminate(status="success")', {"action": "terminate", "status": "success"}),
    # a bare argument-free name
    ("navigate_back", {"action": "navigate_back"}),
    ("Home.", {"action": "navigate_home"}),
    ("wait", {"action": "wait"}),
])
def test_parse_action_forms(body, expected):
    got = parse_action(ans(body))
    assert got == expected
    assert all(type(v) is float for v in got.get("point", ()))
    assert normalize_action(got) == got  # idempotent


@pytest.mark.parametrize("body", [
    '{"action": "click"}',                        # no point
    '{"action": "click", "point": [10]}',         # one number
    '{"action": "click", "point": [1, 2, 3]}',    # three numbers
    '{"action": "click", "point": [NaN, 2]}',     # not finite
    '{"action": "click", "point": [1e999, 2]}',
    '{"action": "click", "point": [true, 2]}',    # a bool is no coordinate
    '{"action": "click", "x": 10}',               # no y
    '{"action": "long_press"}',
    '{"action": "type"}',
    '{"action": "type", "text": "  "}',           # blank text
    '{"action": "scroll"}',
    '{"action": "scroll", "direction": "sideways"}',
    '{"action": "open_app"}',
    '{"action": "terminate"}',                    # the status is required
    '{"action": "finish", "status": "maybe"}',
    '{"action": "fly", "point": [1, 2]}',         # unknown action
    '{"point": [1, 2]}',                          # no action name
    '[{"action": "back"}, {"action": "home"}]',   # two actions: not one step
    "click(x=10)",
    "click(10, 20",                               # unclosed call
    "type()",
    "I would click the button",
    "",
])
def test_missing_or_invalid_arguments_are_none(body):
    assert parse_action(ans(body)) is None


def test_only_the_answer_block_counts():
    """As answer_box: without an answer block there is no action, even if the text holds one;
    with several, the last block is the answer."""
    assert parse_action("click(10, 20)") is None
    assert parse_action('<think>maybe {"action": "back"}</think>') is None
    assert parse_action(ans("navigate_back") + ans("click(10, 20)")) == CLICK
    assert read_action("click(10, 20)") == CLICK  # answer text already extracted (labels)
    assert parse_action(None) is None and read_action(5) is None and normalize_action("click") is None


# -- text F1 and point in box ----------------------------------------------------------------------
@pytest.mark.parametrize("pred,truth,f1", [
    ("turn on wifi", "turn wifi on now", 6 / 7),  # overlap 3: P 3/3, R 3/4, F1 2*(3/4)/(7/4)
    ("Hello, World!", "hello world", 1.0),        # case and punctuation ignored
    ("a a b", "a b b", 2 / 3),                    # multiset overlap 2: P 2/3, R 2/3
    ("york bay", "new york", 0.5),                # P 1/2, R 1/2
    ("york bay area", "new york", 0.4),           # P 1/3, R 1/2: 2*(1/6)/(5/6)
    ("cat", "dog", 0.0),
    ("", "", 1.0),
    ("", "dog", 0.0),
    ("dog", "", 0.0),
    ("...", "!", 1.0),                            # both empty after normalisation
])
def test_text_f1_hand_values(pred, truth, f1):
    assert text_f1(pred, truth) == pytest.approx(f1, abs=1e-12)


@pytest.mark.parametrize("point,box,inside", [
    ((15, 15), (10, 10, 20, 20), True),
    ((10, 10), (10, 10, 20, 20), True),    # corner: edges are inclusive
    ((20, 15), (10, 10, 20, 20), True),    # right edge
    ((15, 20), (10, 10, 20, 20), True),    # bottom edge
    ((20.001, 15), (10, 10, 20, 20), False),
    ((15, 9.999), (10, 10, 20, 20), False),
    ((15, 15), (20, 20, 10, 10), True),    # corners in either order
    ((float("nan"), 15), (10, 10, 20, 20), False),
    (("a", 1), (10, 10, 20, 20), False),
    ((15, 15), (10, 10, 20), False),
])
def test_point_in_box(point, box, inside):
    assert point_in_box(point, box) is inside


# -- rewards on hand-worked completions ------------------------------------------------------------
BUTTON = {"action": {"action": "click", "point": [150, 250], "bbox": [100, 200, 200, 300]}, "image_size": (1000, 2000)}


def test_click_rewards_and_the_gui_action_score_split():
    completions = [
        think('{"action": "click", "point": [150, 250]}'),        # right everything
        think('{"action": "click", "point": [500, 500]}'),        # right type, wrong point
        think('{"action": "long_press", "point": [150, 250]}'),   # wrong type
        ans('{"action": "click", "point": [150, 250]}'),          # right, no think block
        ans('{"action": "navigate_back"}'),                       # wrong, no think block
        think("I don't know"),                                    # unparsable
        'click(150, 250)',                                        # no answer block
        think('{"action": "click", "point": [200, 300]}'),        # on the box corner
    ]
    got = rewards(completions, BUTTON)
    assert got["gui_action_type"] == [1.0, 1.0, 0.0, 1.0, 0.0, None, None, 1.0]
    assert got["gui_action_args"] == [1.0, 0.0, 0.0, 1.0, 0.0, None, None, 1.0]
    assert got["gui_action_score"] == [1.0, 0.2, 0.2, 0.8, 0.0, None, None, 1.0]  # 0.8 accuracy + 0.2 format
    assert got["gui_type_f1"] == [None] * 8  # the label is not a type action
    # the format part is the `format` reward's strict layout
    fmt = REWARDS.get("format")(completions[:5], [BUTTON] * 5)
    assert fmt == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_click_without_element_box_uses_14_percent_of_the_screen():
    """Distance with x as a fraction of the width (1000) and y of the height (2000)."""
    ex = {"action": {"action": "click", "point": [500, 1000]}, "image_size": (1000, 2000)}
    points = [(600, 1000), (500, 1300), (600, 1200), (580, 1160)]  # .10, .15, .1414, .1131
    completions = [ans(f"click({x}, {y})") for x, y in points]
    assert REWARDS.get("gui_action_args")(completions, [ex] * 4) == [1.0, 0.0, 0.0, 1.0]
    wider = {**ex, "click_tolerance": 0.2}
    assert REWARDS.get("gui_action_args")(completions, [wider] * 4) == [1.0, 1.0, 1.0, 1.0]
    no_screen = {"action": ex["action"]}  # nothing to measure the distance with: not right
    assert REWARDS.get("gui_action_args")(completions[:1], [no_screen]) == [0.0]
    framed = {"action": ex["action"], "frame": Frame(1000, 2000)}  # the screen from the frame
    assert REWARDS.get("gui_action_args")(completions[:1], [framed]) == [1.0]


def test_type_rewards_use_text_f1():
    ex = {"action": {"action": "type", "text": "new york"}}
    completions = [think('type(text="New York")'), think('type(text="york bay")'),
                   think('type(text="york bay area")'), think("click(1, 2)"), think("nothing")]
    got = rewards(completions, ex)
    assert got["gui_action_type"] == [1.0, 1.0, 1.0, 0.0, None]
    assert got["gui_action_args"] == [1.0, 1.0, 0.0, 0.0, None]  # F1 1, 0.5, 0.4: threshold 0.5
    assert got["gui_action_score"] == [1.0, 1.0, 0.2, 0.2, None]
    assert got["gui_type_f1"][:4] == pytest.approx([1.0, 0.5, 0.4, 0.0]) and got["gui_type_f1"][4] is None
    assert action_match({"action": "type", "text": "york bay"}, ex) == {"type": 1.0, "args": 1.0, "text_f1": 0.5}


@pytest.mark.parametrize("truth,right,wrong_args", [
    ({"action": "scroll", "direction": "down"}, 'scroll(direction="down")', 'scroll(direction="up")'),
    ({"action": "open_app", "app": "Google Maps"}, 'open_app(app="maps")', 'open_app(app="Chrome")'),
    ({"action": "terminate", "status": "success"}, '{"action": "done", "status": "success"}',
     '{"action": "terminate", "status": "failure"}'),
])
def test_argument_rewards(truth, right, wrong_args):
    got = rewards([think(right), think(wrong_args), think("wait")], {"action": truth})
    assert got["gui_action_type"] == [1.0, 1.0, 0.0]
    assert got["gui_action_args"] == [1.0, 0.0, 0.0]
    assert got["gui_action_score"] == [1.0, 0.2, 0.2]


@pytest.mark.parametrize("name", ["navigate_back", "navigate_home", "wait"])
def test_argument_free_actions_are_right_when_the_type_is(name):
    got = rewards([ans(f"{name}()"), ans("click(1, 2)")], {"action": {"action": name}})
    assert got["gui_action_type"] == [1.0, 0.0] and got["gui_action_args"] == [1.0, 0.0]
    assert got["gui_action_score"] == [0.8, 0.0]


def test_label_given_as_text_or_missing():
    """A label may be answer text; an example without a readable action scores None everywhere."""
    got = rewards([ans("back")], {"action": "press_back()"})
    assert got["gui_action_type"] == [1.0] and got["gui_action_args"] == [1.0]
    for ex in ({}, {"action": None}, {"action": {"action": "click"}}, {"answer": "2"}):
        assert all(v == [None] for v in rewards([ans("click(1, 2)")], ex).values())


def test_registered_and_batch_lengths_checked():
    for name in GUI_REWARDS:
        assert name in REWARDS
        with pytest.raises(ValueError, match="2 completions for 1 examples"):
            REWARDS.get(name)(["a", "b"], [BUTTON])


# -- coordinate spaces: a Qwen2.5-VL click on a phone screen ---------------------------------------
PHONE = (1170, 2532)  # an iPhone 12/13 screenshot
KEY = [100, 2200, 400, 2350]  # a 300 px wide button near the bottom, original pixels


def test_qwen2_5_vl_resized_click_on_a_phone_screen():
    """Under a 1280-token budget (max_pixels 1280 * 28 * 28) Qwen2.5-VL sees the 1170x2532 screen
    at 672x1456 and answers in those pixels: the button's centre (250, 2275) is written
    (250 * 672 / 1170, 2275 * 1456 / 2532) = (143.6, 1308.2). That click converts back onto the
    button; one button-width (300 px = 172.3 resized px) to the right it misses; the same numbers
    read as original pixels miss too."""
    assert qwen_resized_size(*PHONE, min_pixels=3136, max_pixels=1280 * 28 * 28) == (672, 1456)
    ex = {"action": {"action": "click", "point": [250, 2275], "bbox": KEY}, "image_size": PHONE,
          "frame": Frame(*PHONE, 672, 1456), "pred_space": "resized"}
    perfect, next_door = think("click(143.6, 1308.2)"), think("click(315.9, 1308.2)")
    assert REWARDS.get("gui_action_args")([perfect, next_door], [ex, ex]) == [1.0, 0.0]
    assert REWARDS.get("gui_action_score")([perfect, next_door], [ex, ex]) == [1.0, 0.2]
    as_pixels = {k: v for k, v in ex.items() if k not in ("frame", "pred_space")}
    assert REWARDS.get("gui_action_args")([perfect], [as_pixels]) == [0.0]
    # Qwen2-VL / Qwen3-VL write 0-1000: (250 / 1170 * 1000, 2275 / 2532 * 1000) = (213.7, 898.5)
    rel = {**ex, "pred_space": "rel1000"}
    assert REWARDS.get("gui_action_args")([think("click(214, 898)"), perfect], [rel, rel]) == [1.0, 0.0]
    # a resized-space example whose frame lacks the resized size cannot convert: wrong, no crash
    broken = {**ex, "frame": Frame(*PHONE)}
    assert REWARDS.get("gui_action_args")([perfect], [broken]) == [0.0]


# -- properties: no text ever makes the parser or a reward raise -----------------------------------
FRAGMENTS = st.sampled_from(
    ["<think>", "</think>", "<answer>", "</answer>", "{", "}", "[", "]", "(", ")", ",", ":", "=", " ", "\n",
     "'", '"', "-", ".", "`", "```json", "1e999", "nan", "NaN", "inf", "true", "null", '"action"', "'action'",
     '"point"', '"coordinate"', "x", "y", "text", "direction", "status", "app", "arguments", "click", "tap",
     "long_press", "type", "input", "scroll", "swipe", "open_app", "back", "home", "wait", "finish",
     "terminate", "success", "down", "\\", "**", "lambda", "(((((((((("]
)
NUMBERS = st.one_of(st.integers(-10**30, 10**30).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr))
VALUES = st.one_of(NUMBERS, st.text(max_size=8).map(repr), st.text(max_size=8),
                  st.lists(NUMBERS, max_size=5).map(lambda v: f"[{', '.join(v)}]"))
NEAR_ACTIONS = st.builds(  # mostly-valid actions, so the argument checks are fuzzed too
    lambda name, key, value, form: [f'{{"action": "{name}", "{key}": {value}}}', f"{name}({key}={value})",
                                    f"{name}({value})", f"[{{'action': '{name}', '{key}': {value},}}]"][form],
    st.sampled_from(["click", "Tap", "long_press", "type", "input", "scroll", "swipe", "open_app", "back",
                     "wait", "terminate", "done", "fly"]),
    st.sampled_from(["point", "coordinate", "bbox", "x", "text", "app", "direction", "status", "input_text"]),
    VALUES, st.integers(0, 3))
TEXTS = st.one_of(st.text(), st.lists(st.one_of(FRAGMENTS, NUMBERS, st.text(max_size=3)), max_size=30).map("".join),
                  NEAR_ACTIONS)
EXAMPLES = st.sampled_from([
    BUTTON,
    {"action": {"action": "click", "point": [500, 1000]}, "image_size": (1000, 2000)},
    {"action": {"action": "click", "point": [5, 5]}, "frame": Frame(*PHONE), "pred_space": "resized"},
    {"action": {"action": "long_press", "point": [5, 5]}, "frame": Frame(*PHONE, 672, 1456), "pred_space": "resized"},
    {"action": {"action": "type", "text": "new york"}},
    {"action": {"action": "scroll", "direction": "down"}},
    {"action": {"action": "terminate", "status": "failure"}},
    {"action": "navigate_back"},
    {"action": {"action": "click", "bbox": ["a", 1, 2, 3]}},
    {"answer": "2"},
])
ARG_KEYS = {"click": {"point"}, "long_press": {"point"}, "type": {"text"}, "open_app": {"app"},
            "scroll": {"direction"}, "terminate": {"status"}}


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(TEXTS, st.booleans())
def test_parse_action_never_raises(text, wrap):
    got = parse_action(ans(text) if wrap else text)
    if got is not None:
        assert got["action"] in ACTION_TYPES
        assert set(got) == {"action"} | ARG_KEYS.get(got["action"], set())
        assert all(type(v) is float and math.isfinite(v) for v in got.get("point", ()))
        assert normalize_action(got) == got
    assert read_action(text) is None or read_action(text)["action"] in ACTION_TYPES


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(TEXTS, st.integers(0, 2), EXAMPLES), min_size=1, max_size=4))
def test_gui_rewards_never_raise(cases):
    completions = [[t, ans(t), think(t)][w] for t, w, _ in cases]
    examples = [ex for _, _, ex in cases]
    fmt = REWARDS.get("format")(completions, examples)
    out = {name: REWARDS.get(name)(completions, examples) for name in GUI_REWARDS}
    for name, values in out.items():
        assert len(values) == len(cases)
        for v in values:
            assert v is None or (type(v) is float and 0.0 <= v <= 1.0 and not math.isnan(v)), (name, v)
    for i, v in enumerate(out["gui_action_score"]):  # 0.8 * (type and args) + 0.2 * the format reward's layout
        if v is not None:
            assert v == pytest.approx(0.8 * out["gui_action_args"][i] + 0.2 * fmt[i])
