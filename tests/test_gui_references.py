"""The paper-named GUI rewards reproduce the papers' code: ``ui_r1_action_type`` and ``ui_r1_coord``
(UI-R1, ``src/ui_r1/src/open_r1/grpo_json_action_coord.py``), ``gui_r1`` (GUI-R1,
``verl/utils/reward_score/r1gui.py``). Every expected value is worked out by hand from the quoted
lines; mmrl's own versions (``gui_action_*``) are beside them where they differ on purpose."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.measures.gui_r1 import format_reward, gui_r1_fields, text_f1
from mmrl.measures.ui_r1 import ui_r1_action, ui_r1_point
from mmrl.media.coords import Frame
from mmrl.registry import REWARDS

BOX = {"action": {"action": "click", "point": [150, 250], "bbox": [100, 200, 200, 300]}}


def score(name, completion, ex):
    return REWARDS.get(name)([completion], [ex])[0]


# -- UI-R1 -------------------------------------------------------------------------------------------
# extract_action: answer_tag_pattern = r'<answer>(.*?)</answer>' (re.DOTALL, .strip());
#   action_pattern = r"'action':\s*'(\w+)'", then action_pattern_1 = r"'action':\s*(\w+)"
# accuracy_reward_action: reward = 1.0 if student_answer_action and ground_truth_action and
#   student_answer_action == ground_truth_action
# accuracy_reward_coord: types equal -> if student_answer_action == "click": extract_coord
#   (bbox_pattern = r'\[(\d+),\s*(\d+)]', else [0, 0]), [int(x * scale[0]), int(y * scale[1])],
#   ground_truth_bbox[0] <= x <= ground_truth_bbox[2] and ground_truth_bbox[1] <= y <= ground_truth_bbox[3];
#   else reward = 1.0
def ui(body: str) -> str:
    return f"<think>t</think> <answer>[{body}]</answer>"


UI_R1_TABLE = [
    # (completion, label, ui_r1_action_type, ui_r1_coord)
    (ui("{'action': 'click', 'coordinate': [150, 250]}"), BOX, 1.0, 1.0),
    (ui("{'action': 'click', 'coordinate': [200, 300]}"), BOX, 1.0, 1.0),  # the corner: <= on both edges
    (ui("{'action': 'click', 'coordinate': [201, 250]}"), BOX, 1.0, 0.0),
    (ui("{'action': 'click', 'coordinate': [150.5, 250.5]}"), BOX, 1.0, 0.0),  # no \d+ pair: [0, 0], outside
    (ui('{"action": "click", "coordinate": [150, 250]}'), BOX, 0.0, 0.0),  # double quotes: no action read
    (ui("{'action': 'Click', 'coordinate': [150, 250]}"), BOX, 0.0, 0.0),  # "Click" != "click"
    (ui("{'action': 'tap', 'coordinate': [150, 250]}"), BOX, 0.0, 0.0),
    (ui("{'action': click, 'coordinate': [150, 250]}"), BOX, 1.0, 1.0),  # action_pattern_1, unquoted
    ("<answer>[{'action': 'scroll'}]</answer><answer>[{'action': 'click', 'coordinate': [150, 250]}]</answer>",
     BOX, 0.0, 0.0),  # the first answer block counts
    ("{'action': 'click', 'coordinate': [150, 250]}", BOX, 0.0, 0.0),  # no answer block
    # non-click actions in UI-R1's own format: the type decides, the arguments are never read
    (ui("{'action': 'scroll', 'coordinate': [0, 0, 0, 0]}"), {"action": {"action": "scroll", "direction": "down"}},
     1.0, 1.0),
    (ui("{'action': 'input_text', 'coordinate': [0, 0, 0, 0]}"), {"action": {"action": "type", "text": "new york"}},
     1.0, 1.0),  # mmrl's "type" is UI-R1's "input_text"; the text is not checked
    (ui("{'action': 'type', 'coordinate': [0, 0, 0, 0]}"), {"action": {"action": "type", "text": "new york"}},
     0.0, 0.0),
    (ui("{'action': 'open_app', 'coordinate': [0, 0, 0, 0]}"), {"action": {"action": "open_app", "app": "Maps"}},
     1.0, 1.0),
    (ui("{'action': 'navigate_back', 'coordinate': [0, 0, 0, 0]}"), {"action": {"action": "navigate_back"}},
     1.0, 1.0),
    (ui("{'action': 'long_press', 'coordinate': [900, 900]}"),
     {"action": {"action": "long_press", "point": [150, 250], "bbox": [100, 200, 200, 300]}}, 1.0, 1.0),
]


@pytest.mark.parametrize("completion,ex,action_type,coord", UI_R1_TABLE)
def test_ui_r1_rewards_are_ui_r1s_code(completion, ex, action_type, coord):
    assert score("ui_r1_action_type", completion, ex) == action_type
    assert score("ui_r1_coord", completion, ex) == coord


def test_ui_r1_scales_and_truncates_like_its_trainer():
    """scale_x = origin_width / resized_width (grpo_trainer.py); [int(x * scale[0]), int(y * scale[1])].
    A 300x300 screenshot seen at 200x200: scale 1.5. [67, 67] -> int(100.5) = 100: outside a box from
    100.2 (the unrounded 100.5 would be inside); [68, 68] -> 102, inside."""
    ex = {"action": {"action": "click", "point": [120, 120], "bbox": [100.2, 100.2, 150, 150]},
          "frame": Frame(300, 300, 200, 200), "pred_space": "resized"}
    assert score("ui_r1_coord", ui("{'action': 'click', 'coordinate': [67, 67]}"), ex) == 0.0
    assert score("ui_r1_coord", ui("{'action': 'click', 'coordinate': [68, 68]}"), ex) == 1.0


def test_ui_r1_what_it_reads():
    assert ui_r1_action("<answer>{'action': 'open_app'}</answer>") == "open_app"
    assert ui_r1_action('<answer>{"action": "open_app"}</answer>') is None
    assert ui_r1_point("<answer>[{'coordinate': [1, 2, 3, 4]}, [5,6]]</answer>") == [5, 6]  # no ] after 2
    assert ui_r1_point("<answer>[-5, 6]</answer>") == [0, 0]  # no sign in \d+
    # a click label without a box: UI-R1's data always has one, so the coordinate reward cannot score
    point_only = {"action": {"action": "click", "point": [150, 250]}}
    assert score("ui_r1_action_type", ui("{'action': 'click', 'coordinate': [150, 250]}"), point_only) == 1.0
    assert score("ui_r1_coord", ui("{'action': 'click', 'coordinate': [150, 250]}"), point_only) is None


def test_mmrl_versions_check_what_ui_r1_does_not():
    """UI-R1 checks neither typed text nor scroll direction (both 1.0 above); mmrl's gui_action_args does."""
    scroll = {"action": {"action": "scroll", "direction": "down"}}
    args = REWARDS.get("gui_action_args")
    assert args(['<answer>{"action": "scroll", "direction": "up"}</answer>'], [scroll]) == [0.0]
    typed = {"action": {"action": "type", "text": "new york"}}
    assert args(['<answer>{"action": "type", "text": "boston"}</answer>'], [typed]) == [0.0]
    assert REWARDS.get("gui_action_type")(['<answer>{"action": "Click", "point": [1, 2]}</answer>'], [BOX]) == [1.0]


# -- GUI-R1 ------------------------------------------------------------------------------------------
# r1gui_accuracy_reward: pred_action = extract_action(predict_str).lower() (r"'action':\s*'(\w+)'",
#   "no action"); extract_input_text (r"'input_text':\s*'(.*?)'", "no input text"); extract_coord
#   (r'\{.*\[(\d+),\s*(\d+)]\s*.*\}', [0, 0, 0, 0]); if pred_action != gt_action: 0.0;
#   click: len(gt_bbox) == 2: (px - gx)**2 + (py - gy)**2 < 140**2; len 4: gt_bbox[0] < px < gt_bbox[2]
#   and gt_bbox[1] < py < gt_bbox[3]; 'type', 'select', 'scroll': calculate_f1_score(...) >= 0.5; else 1.0
# r1gui_format_reward: re.fullmatch(r"<think>.*?</think>\s*<answer>.*?</answer>", DOTALL); eval(answer)
#   is a list of dicts with "action" (str), "point" (point[0], point[1] ints), "input_text" (str); no
#   'no input text' for type/select/open_app; scroll text in left/right/up/down
# r1gui_compute_score: "overall": 0.8 * accuracy + 0.2 * format
def gr(action: str, point="[150, 250]", text="no input text", think=True) -> str:
    answer = f"<answer>[{{'action': '{action}', 'point': {point}, 'input_text': '{text}'}}]</answer>"
    return f"<think>t</think>{answer}" if think else answer


POINT = {"action": {"action": "click", "point": [500, 500]}}
TYPED = {"action": {"action": "type", "text": "hello"}}
SCROLL = {"action": {"action": "scroll", "direction": "down"}}
GUI_R1_TABLE = [
    # (completion, label, accuracy, format); gui_r1 = 0.8 * accuracy + 0.2 * format
    (gr("click"), BOX, 1, 1),
    (gr("click", "[200, 300]"), BOX, 0, 1),  # strict < : the corner misses
    (gr("click", "[100, 250]"), BOX, 0, 1),  # on the left edge: misses
    (gr("click", "[150.5, 250]"), BOX, 0, 0),  # no integer pair: [0, 0, 0, 0]; point[0] not an int
    (gr("Click"), BOX, 1, 1),  # .lower(): "click"
    (gr("tap"), BOX, 0, 1),  # "tap" != "click"
    (gr("click", think=False), BOX, 1, 0),  # no think block: format 0
    ('<think>t</think><answer>[{"action": "click", "point": [150, 250], "input_text": "no input text"}]</answer>',
     BOX, 0, 1),  # eval reads double quotes (format 1); extract_action does not (accuracy 0)
    (gr("click", "[600, 500]"), POINT, 1, 1),  # no box: 100**2 = 10000 < 19600
    (gr("click", "[640, 500]"), POINT, 0, 1),  # 140**2 = 19600, not < 19600
    (gr("click", "[599, 599]"), POINT, 0, 1),  # 99**2 + 99**2 = 19602 >= 19600
    (gr("type", "[0, 0]", "hell"), TYPED, 1, 1),  # one word each and "hell" in "hello": F1 taken as 1
    (gr("type", "[0, 0]", "help"), TYPED, 0, 1),
    (gr("type", "[0, 0]", "no input text"), TYPED, 0, 0),  # F1 0; and type with 'no input text': format 0
    (gr("type", "[0, 0]", "york"), {"action": {"action": "type", "text": "new york"}}, 1, 1),  # P 1, R 1/2: 2/3
    (gr("scroll", "[0, 0]", "down"), SCROLL, 1, 1),
    (gr("scroll", "[0, 0]", "DOWN"), SCROLL, 1, 0),  # lower-cased for F1; the format wants "down" itself
    (gr("scroll", "[0, 0]", "up"), SCROLL, 0, 1),
    (gr("open_app", "[0, 0]", "Chrome"), {"action": {"action": "open_app", "app": "Google Maps"}},
     1, 1),  # the app is not checked
    (gr("long_press", "[900, 900]"), {"action": {**BOX["action"], "action": "long_press"}},
     1, 1),  # only "click" has its point checked
    (gr("press_back", "[0, 0]"), {"action": {"action": "navigate_back"}}, 1, 1),  # GUI-R1's name
    (gr("navigate_back", "[0, 0]"), {"action": {"action": "navigate_back"}}, 0, 1),
    (gr("complete", "[0, 0]"), {"action": {"action": "terminate", "status": "success"}}, 1, 1),
    (gr("impossible", "[0, 0]"), {"action": {"action": "terminate", "status": "failure"}}, 1, 1),
]


@pytest.mark.parametrize("completion,ex,accuracy,fmt", GUI_R1_TABLE)
def test_gui_r1_is_gui_r1s_code(completion, ex, accuracy, fmt):
    assert format_reward(completion) == fmt
    assert score("gui_r1", completion, ex) == pytest.approx(0.8 * accuracy + 0.2 * fmt)


def test_gui_r1_compares_in_the_space_the_model_saw():
    """GUI-R1 scales the label to the processed image (gt_bbox[0] *= scalex ...) and compares the
    written integers: a 1000x2000 screen seen at 500x1000 puts the box [100, 200, 200, 300] at
    [50, 100, 100, 150]; [75, 125] is inside, [100, 125] on its right edge (strict: out)."""
    ex = {**BOX, "frame": Frame(1000, 2000, 500, 1000), "pred_space": "resized"}
    assert score("gui_r1", gr("click", "[75, 125]"), ex) == pytest.approx(1.0)
    assert score("gui_r1", gr("click", "[100, 125]"), ex) == pytest.approx(0.2)


def test_gui_r1_text_f1_and_fields():
    assert text_f1("hell", "hello") == 1.0 and text_f1("hello", "hell") == 1.0  # either way round
    assert text_f1("[new] york", "New York") == 1.0  # brackets dropped, lower-cased
    assert text_f1("new york city", "new york") == pytest.approx(0.8)  # P 2/3, R 1
    assert text_f1("a a b", "a c") == pytest.approx(0.5)  # sets: {a, b} vs {a, c}: P 1/2, R 1/2
    assert gui_r1_fields("no block") == ("no action", "no input text", [0, 0, 0, 0])
    assert gui_r1_fields(gr("Click", "[3, 4]", "x")) == ("click", "x", [3, 4])


def test_mmrl_versions_differ_from_gui_r1_on_purpose():
    """mmrl's gui_action_args: edges inside, float points read, a substring is no typed-text match."""
    args = REWARDS.get("gui_action_args")
    assert args(['<answer>{"action": "click", "point": [200, 300]}</answer>'], [BOX]) == [1.0]
    assert args(['<answer>{"action": "click", "point": [150.5, 250.5]}</answer>'], [BOX]) == [1.0]
    assert args(['<answer>{"action": "type", "text": "hell"}</answer>'], [TYPED]) == [0.0]
    mmrl = REWARDS.get("gui_action_score")([gr("click", "[200, 300]")], [BOX])
    assert mmrl == [pytest.approx(1.0)]  # GUI-R1's weights over mmrl's checks: the corner is inside


# -- never raise, always in range --------------------------------------------------------------------
PAPER_REWARDS = ("ui_r1_action_type", "ui_r1_coord", "gui_r1")
FRAGMENTS = st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "[", "]", "{", "}", "'action': ",
                             "'click'", "'type'", "'point': ", "'input_text': ", "'coordinate': ", "[1, 2]",
                             "[1.5, 2]", ", ", "'", '"', "9" * 30, "\n", "[" * 50])
TEXTS = st.one_of(st.text(max_size=40), st.lists(st.one_of(FRAGMENTS, st.text(max_size=3)), max_size=20).map("".join))
EXAMPLES = st.sampled_from([BOX, POINT, TYPED, SCROLL, {}, {"action": None}, {"action": "press_back()"},
                            {**BOX, "frame": Frame(10, 10), "pred_space": "resized"},
                            {"action": {"action": "terminate", "status": "failure"}}])


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(TEXTS, st.none(), st.integers()), EXAMPLES), min_size=1, max_size=4))
def test_paper_rewards_never_raise(cases):
    completions, examples = [c for c, _ in cases], [ex for _, ex in cases]
    for name in PAPER_REWARDS:
        values = REWARDS.get(name)(completions, examples)
        assert len(values) == len(cases)
        for v in values:
            assert v is None or (type(v) is float and 0.0 <= v <= 1.0 and not math.isnan(v)), (name, v)
    with pytest.raises(ValueError, match="2 completions for 1 examples"):
        REWARDS.get("gui_r1")(["a", "b"], [BOX])
