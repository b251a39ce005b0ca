"""GUI-G1's box-size-constrained reward ``gui_g1_box`` (arXiv 2505.15810):
R = R_hit + 0.25 R_IoU + 0.125 R_box, R_box = 4 / sum_i 1 / (1 - |pred_i - gt_i| / S_i)."""

from __future__ import annotations

import math

import pytest

import mmrl.rewards.screen  # noqa: F401  (registers the rewards)
from mmrl.media.coords import Frame
from mmrl.measures.screen import gui_g1_box_reward, gui_g1_box_score, gui_g1_box_term
from mmrl.registry import REWARDS

# Element (100, 200)-(300, 300): 200 x 100 px, area 20000, centre (200, 250), on a 1000 x 500 screen.
EX = {"box": (100, 200, 300, 300), "image_size": (1000, 500)}
SIZE = (1000, 500)


def _ans(text: str) -> str:
    return f"<think>the toggle</think><answer>{text}</answer>"


def test_exact_box_is_the_maximum():
    # hit 1, IoU 1, every closeness 1 -> R_box 1: 1 + 0.25 + 0.125 = 1.375
    assert gui_g1_box_score(_ans("[100, 200, 300, 300]"), EX) == pytest.approx(1.375)


def test_too_large_box():
    # (50, 150)-(350, 350): centre (200, 250) inside -> hit 1.
    # IoU = 20000 / (300 * 200 = 60000) = 1/3.
    # closeness x1, x2: 1 - 50/1000 = 0.95; y1, y2: 1 - 50/500 = 0.9
    # R_box = harmonic mean = 2 * 0.95 * 0.9 / 1.85 = 1.71 / 1.85 = 0.9243243...
    # R = 1 + 0.25/3 + 0.125 * 0.9243243 = 1 + 0.0833333 + 0.1155405 = 1.1988739
    assert gui_g1_box_term((50, 150, 350, 350), EX["box"], SIZE) == pytest.approx(1.71 / 1.85)
    assert gui_g1_box_score(_ans("[50, 150, 350, 350]"), EX) == pytest.approx(1 + 0.25 / 3 + 0.125 * 1.71 / 1.85)
    assert gui_g1_box_score(_ans("[50, 150, 350, 350]"), EX) == pytest.approx(1.1988739, abs=1e-6)


def test_too_small_box_centred_on_the_element():
    # (150, 225)-(250, 275): centre (200, 250) inside -> hit 1; IoU = (100 * 50) / 20000 = 0.25.
    # closeness x: 1 - 50/1000 = 0.95; y: 1 - 25/500 = 0.95 -> R_box = 0.95.
    # R = 1 + 0.25 * 0.25 + 0.125 * 0.95 = 1 + 0.0625 + 0.11875 = 1.18125
    assert gui_g1_box_score(_ans("[150, 225, 250, 275]"), EX) == pytest.approx(1.18125)


def test_box_off_the_element():
    # (600, 300)-(800, 400): same size, 500 px right and 100 px down; centre (700, 350) outside
    # -> hit 0, IoU 0. closeness x: 1 - 500/1000 = 0.5; y: 1 - 100/500 = 0.8
    # R_box = 2 * 0.5 * 0.8 / 1.3 = 8/13; R = 0.125 * 8/13 = 1/13 = 0.0769231
    assert gui_g1_box_score(_ans("[600, 300, 800, 400]"), EX) == pytest.approx(1 / 13)


def test_registered_reward_is_normalised_to_one():
    # The registered reward divides by 1 + 0.25 + 0.125 = 1.375 (every reward lies in [0, 1]):
    # exact box 1.375 / 1.375 = 1; off box (1/13) / 1.375 = 8/143; normalize=False: the paper's scale.
    texts = [_ans("[100, 200, 300, 300]"), _ans("[600, 300, 800, 400]")]
    assert REWARDS.get("gui_g1_box")(texts, [EX] * 2) == pytest.approx([1.0, 8 / 143])
    assert REWARDS.get("gui_g1_box")(texts, [EX] * 2, normalize=False) == pytest.approx([1.375, 1 / 13])


def test_ordering_of_the_four_cases_and_a_full_screen_miss():
    scores = REWARDS.get("gui_g1_box")(
        [_ans("[100, 200, 300, 300]"), _ans("[50, 150, 350, 350]"), _ans("[150, 225, 250, 275]"),
         _ans("[600, 300, 800, 400]")], [EX] * 4)
    assert scores[0] == max(scores) and scores[3] == min(scores)
    # An edge a whole screen width off: closeness 0 -> R_box 0 (the harmonic mean's limit).
    assert gui_g1_box_reward((1100, 200, 1300, 300), EX["box"], SIZE) == 0.0


def test_no_box_is_none():
    reward = REWARDS.get("gui_g1_box")
    assert reward([_ans("(200, 250)"), "no answer block [100, 200, 300, 300]", _ans("the toggle"), ""],
                  [EX] * 4) == [None] * 4


def test_rel1000_answer_scores_like_the_pixel_answer():
    # A 2000 x 1000 screen; the element is EX's box doubled: (200, 400)-(600, 600) px.
    # In 0-1000: x * 1000/2000, y * 1000/1000 -> the too-large box (100, 300)-(700, 700) px
    # is (50, 300, 350, 700). Same relative errors as test_too_large_box -> 1.1988739.
    pixel_ex = {"box": (200, 400, 600, 600), "image_size": (2000, 1000)}
    rel_ex = {**pixel_ex, "pred_space": "rel1000", "frame": Frame(2000, 1000)}
    pixel = REWARDS.get("gui_g1_box")([_ans("[100, 300, 700, 700]")], [pixel_ex], normalize=False)[0]
    rel = REWARDS.get("gui_g1_box")([_ans("[50, 300, 350, 700]")], [rel_ex], normalize=False)[0]
    assert rel == pytest.approx(pixel) == pytest.approx(1 + 0.25 / 3 + 0.125 * 1.71 / 1.85)
    # The frame alone (no image_size) also gives the screen size.
    frame_only = {"box": pixel_ex["box"], "pred_space": "rel1000", "frame": Frame(2000, 1000)}
    assert REWARDS.get("gui_g1_box")([_ans("[50, 300, 350, 700]")], [frame_only], normalize=False)[0] == pytest.approx(pixel)
    assert gui_g1_box_score(_ans("[50, 300, 350, 700]"), rel_ex) == pytest.approx(pixel)


@pytest.mark.parametrize("text", [
    "", "<answer></answer>", "<answer>[1e999, 2, 3, 4]</answer>", "<answer>[nan, nan, nan, nan]</answer>",
    "<answer>[300, 300, 100, 200]</answer>", "<answer>[5, 5, 5, 5]</answer>", "<answer>[-1e308, 0, 1e308, 9]</answer>",
    "<answer><answer>[1,2,3,4]", "\x00\uffff<answer>((((</answer>", "<answer>{'bbox_2d': [1, 2, 3]}</answer>",
])
def test_arbitrary_text_never_raises(text):
    (score,) = REWARDS.get("gui_g1_box")([text], [EX])
    assert score is None or (isinstance(score, float) and 0.0 <= score <= 1.0)
    raw = gui_g1_box_score(text, EX)
    assert raw is None or (math.isfinite(raw) and 0.0 <= raw <= 1.375)


def test_bad_configuration_raises():
    with pytest.raises(ValueError):
        REWARDS.get("gui_g1_box")([_ans("[1, 2, 3, 4]")], [{"box": (1, 2, 3, 4)}])  # no screen size
    with pytest.raises(ValueError):
        REWARDS.get("gui_g1_box")([_ans("[1, 2, 3, 4]")], [EX], beta=-1)
    with pytest.raises(ValueError):
        REWARDS.get("gui_g1_box")([], [EX])
