"""Tools a VLM calls mid-completion: the parser, the built-ins' pixels, error observations, the budget."""

import json

import numpy as np
import pytest
from PIL import Image

from mmrl.media.coords import Frame
from mmrl.registry import TOOLS
from mmrl.tools import (RECORD_KEYS, ToolBudget, ToolCall, ToolError, ToolState, call_text, make_tool,
                        parse_tool_calls, run_turn)


def noise_image(w=1000, h=500, seed=0):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8))


# A Qwen2.5-VL example: the 1000x500 image was seen at 500x250, boxes are written in that frame.
QWEN_EX = {"pred_space": "resized", "frame": Frame(1000, 500, 500, 250)}


def tools(**zoom_options):
    return {"zoom_in": make_tool("zoom_in", **zoom_options), "crop": make_tool("crop"), "rotate": make_tool("rotate")}


def call(name, **arguments):
    return call_text(name, arguments)


def test_builtins_are_registered():
    assert {"zoom_in", "image_zoom_in_tool", "crop", "rotate"} <= set(TOOLS.names())
    schema = make_tool("zoom_in").schema()
    assert schema["function"]["name"] == "zoom_in"
    assert schema["function"]["parameters"]["required"] == ["bbox_2d"]  # DeepEyes' argument name


def test_parse_tool_calls():
    text = ('<think>look</think><tool_call>\n{"name": "zoom_in", "arguments": {"bbox_2d": [1, 2, 3, 4]}}\n</tool_call>'
            '<tool_call>{"name": "rotate", "arguments": "{\\"angle\\": 90}"}</tool_call>'
            '<tool_call>```json\n{"name": "crop", "arguments": {"bbox_2d": [0, 0, 5, 5]}}\n```</tool_call>')
    calls = parse_tool_calls(text, tools())
    assert [c.name for c in calls] == ["zoom_in", "rotate", "crop"]
    assert all(isinstance(c, ToolCall) for c in calls)
    assert calls[1].arguments == {"angle": 90}  # OpenAI-style arguments as a JSON string
    assert parse_tool_calls("no call here") == [] and parse_tool_calls(None) == []


@pytest.mark.parametrize("text,what", [
    ("<tool_call>{bad json</tool_call>", "not valid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
    ('<tool_call>{"arguments": {}}</tool_call>', "no 'name'"),
    ('<tool_call>{"name": "zoom_in", "arguments": [1]}</tool_call>', "must be a JSON object"),
    ('<tool_call>{"name": "magnify", "arguments": {}}</tool_call>', "there is no tool 'magnify'"),
    ('<tool_call>{"name": "zoom_in", "arguments": {"bbox_2d": [1, 2, 3, 4]}}', "not closed"),
])
def test_parse_errors_say_what_is_wrong_and_what_is_valid(text, what):
    (err,) = parse_tool_calls(text, tools())
    assert isinstance(err, ToolError)
    assert err.message.startswith("Error: ") and what in err.message
    assert 'A valid call looks like: <tool_call>{"name": "zoom_in"' in err.message


def test_crop_pixels_are_the_hand_computed_region_in_original_pixels():
    image = noise_image()
    # [50, 25, 100, 75] in the 500x250 frame = x * 1000/500, y * 500/250 = [100, 50, 200, 150] in pixels
    obs, (rec,) = run_turn(call("crop", bbox_2d=[50, 25, 100, 75]), tools(), ToolState([image], QWEN_EX), ToolBudget())
    assert obs[0].image.size == (100, 100)
    assert obs[0].image.tobytes() == image.crop((100, 50, 200, 150)).tobytes()
    assert rec["ok"] and rec["box"] == [100.0, 50.0, 200.0, 150.0] and rec["image_size"] == [100, 100]
    assert set(rec) == set(RECORD_KEYS)


def test_crop_clamps_a_box_partly_off_the_image():
    image = noise_image()
    obs, (rec,) = run_turn(call("crop", bbox_2d=[900, 400, 1200, 600]), tools(), ToolState([image]), ToolBudget())
    assert rec["box"] == [900.0, 400.0, 1000.0, 500.0]
    assert obs[0].image.tobytes() == image.crop((900, 400, 1000, 500)).tobytes()


def test_zoom_in_grows_a_small_box_to_28_pixels_as_deepeyes_does():
    image = noise_image()
    # [10, 10, 12, 12] resized -> [20, 20, 24, 24] pixels: 4x4 < 28, ratio 28/4 = 7, half sides
    # ceil(4 * 7 * 0.5) = 14 about the centre (22, 22) -> [8, 8, 36, 36]
    state = ToolState([image], QWEN_EX)
    obs, (rec,) = run_turn(call("zoom_in", bbox_2d=[10, 10, 12, 12]), tools(resize=False), state, ToolBudget())
    assert rec["box"] == [8.0, 8.0, 36.0, 36.0]
    assert obs[0].image.tobytes() == image.crop((8, 8, 36, 36)).tobytes()
    # resized as DeepEyes' eval does: 28x28 = 784 < min_pixels 3136 -> smart_resize to 56x56
    obs, _ = run_turn(call("zoom_in", bbox_2d=[10, 10, 12, 12]), tools(), state, ToolBudget())
    assert obs[0].image.size == (56, 56)
    # and to the policy's budget when asked (zoom_qa): 28x28 -> 112x112 at min_pixels 12544
    obs, _ = run_turn(call("zoom_in", bbox_2d=[10, 10, 12, 12]), tools(min_pixels=12544, max_pixels=12544),
                      state, ToolBudget())
    assert obs[0].image.size == (112, 112)


def test_zoom_in_keeps_a_large_box_and_deepeyes_name_works():
    image = noise_image()
    t = {"image_zoom_in_tool": make_tool("image_zoom_in_tool", resize=False)}
    obs, (rec,) = run_turn(call("image_zoom_in_tool", bbox_2d=[100, 50, 300, 250], label="dog"), t,
                           ToolState([image]), ToolBudget())
    assert rec["ok"] and obs[0].image.tobytes() == image.crop((100, 50, 300, 250)).tobytes()


def test_rotate_is_clockwise_and_keeps_the_whole_image():
    image = noise_image(40, 20)
    obs, (rec,) = run_turn(call("rotate", angle=90), tools(), ToolState([image]), ToolBudget())
    assert obs[0].image.size == (20, 40)
    assert obs[0].image.tobytes() == image.transpose(Image.Transpose.ROTATE_270).tobytes()  # 270 ccw = 90 cw
    assert rec["box"] is None


@pytest.mark.parametrize("name,arguments,what", [
    ("zoom_in", {"bbox_2d": [2000, 2000, 2100, 2100]}, "has no area"),  # off the image
    ("zoom_in", {"bbox_2d": [10, 10, 10, 20]}, "has no area"),  # zero width
    ("crop", {"bbox_2d": [30, 30, 20, 40]}, "has no area"),  # inverted
    ("zoom_in", {"bbox_2d": [0, 0, 500, 2]}, "aspect ratio"),  # 500x2: DeepEyes' ratio limit 100
    ("zoom_in", {"bbox_2d": [1, 2, 3]}, "list of 4 numbers"),
    ("zoom_in", {"bbox_2d": [1, 2, "x", 4]}, "4 finite numbers"),
    ("zoom_in", {"bbox_2d": [1, 2, float("nan"), 4]}, "4 finite numbers"),
    ("crop", {}, "list of 4 numbers"),
    ("rotate", {"angle": "left"}, "finite number"),
])
def test_bad_arguments_give_an_error_observation(name, arguments, what):
    text = "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
    obs, (rec,) = run_turn(text, tools(), ToolState([noise_image()]), ToolBudget())
    assert obs[0].image is None and what in obs[0].text and "A valid call looks like" in obs[0].text
    assert not rec["ok"] and rec["error"] == obs[0].text and rec["name"] == name


def test_budget_turns_pixels_and_tokens():
    state = ToolState([noise_image()])
    budget = ToolBudget(max_turns=2, max_pixels=4000)
    zoom = call("zoom_in", bbox_2d=[0, 0, 20, 20])  # -> a 28x28 crop shown at 56x56 = 3136 pixels
    obs, (rec,) = run_turn(zoom, tools(), state, budget)
    assert rec["ok"] and budget.pixels == 3136 and budget.turns == 1
    obs, (rec,) = run_turn(zoom, tools(), state, budget)  # 3136 + 3136 > 4000: refused, turn still spent
    assert not rec["ok"] and "864 pixels left" in obs[0].text
    assert budget.pixels == 3136 and budget.turns == 2 and budget.refused == 1 and budget.exhausted
    obs, recs = run_turn(zoom + zoom, tools(), state, budget)  # no third turn: one error, both calls refused
    assert len(obs) == 1 and "limit of 2 tool turns" in obs[0].text and [r["ok"] for r in recs] == [False, False]
    assert budget.summary() == {"turns": 2, "pixels": 3136, "tokens": 0, "refused": 3}
    tokens = ToolBudget(max_turns=None, max_tokens=100)
    tokens.charge_tokens(99)
    assert not tokens.exhausted
    tokens.charge_tokens(1)
    assert tokens.exhausted and "100 tokens" in tokens.turn_refusal()
    assert run_turn("no call", tools(), state, ToolBudget()) == ([], [])


def test_at_most_three_calls_a_turn_as_deepeyes():
    zoom = call("crop", bbox_2d=[0, 0, 20, 20])
    obs, recs = run_turn(zoom * 4, tools(), ToolState([noise_image()]), ToolBudget())
    assert len(obs) == 3 and [r["ok"] for r in recs] == [True, True, True, False]
    assert "dropped" in recs[3]["error"]


def test_budget_and_tool_options_are_checked():
    with pytest.raises(ValueError, match="max_turns"):
        ToolBudget(max_turns=-1)
    with pytest.raises(ValueError, match="no option"):
        make_tool("zoom_in", min_size=3)
    with pytest.raises(KeyError, match="zoom_in"):
        make_tool("zoom")
