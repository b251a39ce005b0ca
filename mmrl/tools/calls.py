"""Reading tool calls out of a completion and running them, never raising for the model's text.

Qwen2.5-VL writes a call as JSON inside tags (its chat template's tool format, also DeepEyes')::

    <tool_call>
    {"name": "zoom_in", "arguments": {"bbox_2d": [10, 20, 100, 200], "label": "the sign"}}
    </tool_call>

:func:`parse_tool_calls` returns one :class:`ToolCall` or :class:`ToolError` per tag; a ToolError
(malformed JSON, no name, arguments that are not an object, an unclosed tag, an unknown tool) and a
call whose arguments the tool refuses (a box off the image or with no area) become an error
observation: text saying what is wrong and what a valid call looks like, which the model reads as
the next turn. :func:`run_turn` runs the calls of one assistant message under a
:class:`~mmrl.tools.base.ToolBudget` and returns the observations and the trajectory records
(:data:`RECORD_KEYS`) that the rewards read from ``ex["tool_calls"]``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .base import Tool, ToolArgumentError, ToolBudget, ToolObservation, ToolState

__all__ = ["RECORD_KEYS", "ToolCall", "ToolError", "call_text", "parse_tool_calls", "run_tool_call", "run_turn"]

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FENCE_RE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
# One record per call of a trajectory, in order: what the rewards read from ex["tool_calls"].
RECORD_KEYS = ("turn", "name", "arguments", "ok", "error", "box", "image_size")


@dataclass
class ToolCall:
    name: str
    arguments: dict
    raw: str = ""


@dataclass
class ToolError:
    """A call that cannot be run; ``message`` is what the model reads."""

    message: str
    raw: str = ""
    name: Optional[str] = None
    arguments: Optional[dict] = field(default=None)


def call_text(name: str, arguments: dict) -> str:
    """A call as the model writes it: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"


def _valid_call_hint(tools: Optional[dict[str, Tool]]) -> str:
    if tools:
        tool = next(iter(tools.values()))
        example = call_text(tool.name, tool.example_arguments).replace("\n", "")
        return f"A valid call looks like: {example} (tools: {', '.join(tools)})"
    return 'A valid call looks like: <tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>'


def _parse_one(body: str, tools: Optional[dict[str, Tool]]) -> Union[ToolCall, ToolError]:
    raw = body
    text = body.strip()
    fenced = _FENCE_RE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return ToolError(f"the tool call is not valid JSON ({exc})", raw)
    if not isinstance(obj, dict):
        return ToolError(f"the tool call must be a JSON object with 'name' and 'arguments', got {type(obj).__name__}", raw)
    name, arguments = obj.get("name"), obj.get("arguments", {})
    if not isinstance(name, str) or not name:
        return ToolError("the tool call has no 'name' string", raw)
    if isinstance(arguments, str):  # the OpenAI format sends arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            pass
    if not isinstance(arguments, dict):
        return ToolError(f"the 'arguments' of {name!r} must be a JSON object", raw, name)
    if tools is not None and name not in tools:
        return ToolError(f"there is no tool {name!r}", raw, name, arguments)
    return ToolCall(name, arguments, raw)


def parse_tool_calls(text: Any, tools: Optional[dict[str, Tool]] = None) -> list[Union[ToolCall, ToolError]]:
    """Every ``<tool_call>`` of ``text`` in order, each a :class:`ToolCall` or a :class:`ToolError`
    (its message ends with what a valid call looks like); an opening tag left unclosed at the end
    is one more ToolError. ``tools`` (name -> tool): a name not among them is a ToolError. Never
    raises; [] for text with no call (or no text)."""
    if not isinstance(text, str):
        return []
    out: list[Union[ToolCall, ToolError]] = [_parse_one(m.group(1), tools) for m in _CALL_RE.finditer(text)]
    tail = text[text.rfind(CLOSE) + len(CLOSE):] if CLOSE in text else text
    if OPEN in tail:
        out.append(ToolError("the tool call is not closed with </tool_call>", tail[tail.find(OPEN):]))
    hint = _valid_call_hint(tools)
    for item in out:
        if isinstance(item, ToolError):
            item.message = f"Error: {item.message}. {hint}"
    return out


def _record(turn: int, name, arguments, ok: bool, error=None, box=None, image_size=None) -> dict:
    return {"turn": turn, "name": name, "arguments": arguments, "ok": ok, "error": error,
            "box": None if box is None else [float(v) for v in box],
            "image_size": None if image_size is None else [int(v) for v in image_size]}


def run_tool_call(call: Union[ToolCall, ToolError], tools: dict[str, Tool], state: ToolState,
                  budget: ToolBudget, turn: int = 0) -> tuple[ToolObservation, dict]:
    """Run one parsed call: its observation and its trajectory record. A ToolError, arguments the
    tool refuses (:class:`ToolArgumentError`) and an image over the pixel budget give an error
    observation (``ok`` False in the record). A tool's other exceptions are bugs and propagate."""
    if isinstance(call, ToolError):
        return ToolObservation(text=call.message), _record(turn, call.name, call.arguments, False, call.message)
    tool = tools[call.name]
    try:
        obs = tool(call.arguments, state)
    except ToolArgumentError as exc:
        message = f"Error: {exc}. {_valid_call_hint({tool.name: tool})}"
        return ToolObservation(text=message), _record(turn, call.name, call.arguments, False, message)
    size = obs.image.size if obs.image is not None else None
    if size is not None:
        why = budget.image_refusal(*size)
        if why is not None:
            budget.refused += 1
            message = f"Error: {why}."
            return ToolObservation(text=message), _record(turn, call.name, call.arguments, False, message)
        budget.charge_image(*size)
    return obs, _record(turn, call.name, call.arguments, True, None, obs.box, size)


def run_turn(text: str, tools: dict[str, Tool], state: ToolState, budget: ToolBudget,
             max_calls: int = 3) -> tuple[list[ToolObservation], list[dict]]:
    """Run the calls of one assistant message (at most ``max_calls``, DeepEyes'
    ``max_action_per_turn``; the rest are dropped, as DeepEyes drops them, and recorded as
    errors). Returns the observations (the next user turn's content, in order) and the records;
    both empty when the message has no call. A turn over the budget runs no call: one error
    observation says why."""
    calls = parse_tool_calls(text, tools)
    if not calls:
        return [], []
    why = budget.start_turn()
    if why is not None:
        budget.refused += len(calls)
        message = f"Error: {why}."
        return [ToolObservation(text=message)], [_record(budget.turns, c.name, c.arguments, False, message)
                                                  for c in calls]
    observations, records = [], []
    for i, call in enumerate(calls):
        if i >= max_calls:
            records.append(_record(budget.turns, call.name, call.arguments, False,
                                   f"dropped: more than {max_calls} calls in one turn"))
            continue
        obs, rec = run_tool_call(call, tools, state, budget, budget.turns)
        observations.append(obs)
        records.append(rec)
    return observations, records

