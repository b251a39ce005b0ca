"""ocr_score (rewards/ocr_score.py): Flow-GRPO's text-rendering reward, hand-worked, with a tiny
recogniser registered here; the PaddleOCR adapter against a stand-in paddleocr module (PaddleOCR is
not installed), returning PaddleOCR 2.x's result shape."""

from __future__ import annotations

import sys
import types

import pytest
from PIL import Image

from mmrl.registry import REWARDS
from mmrl.rewards.ocr_score import clear_recognizers, ocr_reward, quoted_text, register_recognizer

READS = {(255, 0, 0): "helloworld", (0, 255, 0): "HELL0 W0RLD", (0, 0, 255): "xx Hello World yy",
         (0, 0, 0): "", (9, 9, 9): "abcdefghijklmnopqrstuvwxyz", (1, 1, 1): None}
LOADS = []


@register_recognizer("test_colour_reader")
def load_colour_reader(path, device):
    """A tiny recogniser: the 'text' of an image is looked up by its top-left pixel's colour."""
    LOADS.append(path)
    return lambda images: [READS[im.getpixel((0, 0))] for im in images]


def test_quoted_text_and_the_formula_by_hand():
    assert quoted_text('a neon sign that says "Open Late" at night') == "Open Late"
    assert quoted_text('"A" and "B"') == "A" and quoted_text("no quotes") is None
    assert ocr_reward("hel1o", "Hello") == pytest.approx(0.8)  # one substitution in 5
    assert ocr_reward("OPEN LATE!!", "Open Late") == 1.0  # spaces and case ignored, contained -> 0
    assert ocr_reward("opn", "Open Late") == pytest.approx(1 - 5 / 8)  # 5 insertions into 8 characters
    assert ocr_reward("z" * 40, "Open Late") == 0.0  # distance 40 capped at len("OpenLate") = 8


def test_ocr_score_with_a_tiny_recogniser():
    clear_recognizers()
    LOADS.clear()
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (0, 0, 0), (9, 9, 9), (1, 1, 1), (255, 0, 0), (255, 0, 0)]
    images = [Image.new("RGB", (8, 8), c) for c in colours] + ["not an image"]
    prompts = ['a sign saying "Hello World"'] * 6 + ["no quotes", 'empty "  " quote', 'x "Hello World"']
    scores = REWARDS.get("ocr_score")(images, [{"prompt": p} for p in prompts], recognizer="test_colour_reader",
                                      device="cpu")
    # helloworld: contained -> 1; hell0w0rld vs helloworld: 2 substitutions / 10 -> 0.8; contained -> 1;
    # empty: 10 insertions / 10 -> 0; 26 letters: distance capped at 10 -> 0; a failed read -> 0;
    # no quoted text, an empty one, not an image -> None
    assert scores == [1.0, pytest.approx(0.8), 1.0, 0.0, 0.0, 0.0, None, None, None]
    REWARDS.get("ocr_score")(images[:1], [{"prompt": prompts[0]}], recognizer="test_colour_reader", device="cpu")
    assert LOADS == [None]  # loaded once, then cached


def test_ocr_score_configuration_errors(tmp_path):
    reward = REWARDS.get("ocr_score")
    with pytest.raises(ValueError, match=r"task\.reward_kwargs\.ocr_score\.recognizer.*paddleocr"):
        reward([Image.new("RGB", (4, 4))], [{"prompt": '"a"'}], recognizer="nope")
    with pytest.raises(FileNotFoundError, match=r"task\.reward_kwargs\.ocr_score\.path"):
        reward([Image.new("RGB", (4, 4))], [{"prompt": '"a"'}], recognizer="test_colour_reader",
               path=str(tmp_path / "missing"))


def test_paddleocr_adapter(monkeypatch, tmp_path):
    """Flow-GRPO's call (use_angle_cls=False, lang="en", ocr(img, cls=False)) and its reading of the
    result: the lines with confidence > 0 joined; a raising read scores 0."""
    made = []

    class FakePaddleOCR:
        def __init__(self, **kwargs):
            made.append(kwargs)

        def ocr(self, img, cls):
            assert cls is False and img.shape == (4, 4, 3)
            if img[0, 0, 0] == 7:
                raise RuntimeError("unreadable")
            box = [[0, 0], [1, 0], [1, 1], [0, 1]]
            return [[[box, ("HEL", 0.9)], [box, ("zzz", 0.0)], [box, ("lo", 0.5)]]]

    monkeypatch.setitem(sys.modules, "paddleocr", types.SimpleNamespace(PaddleOCR=FakePaddleOCR))
    clear_recognizers()
    images = [Image.new("RGB", (4, 4), (0, 0, 0)), Image.new("RGB", (4, 4), (7, 0, 0))]
    scores = REWARDS.get("ocr_score")(images, [{"prompt": 'say "Hello"'}] * 2, path=str(tmp_path), device="cpu")
    assert scores == [1.0, 0.0]
    assert made == [{"use_angle_cls": False, "lang": "en", "use_gpu": False, "show_log": False,
                     "det_model_dir": str(tmp_path.resolve() / "det"),
                     "rec_model_dir": str(tmp_path.resolve() / "rec")}]
    clear_recognizers()
