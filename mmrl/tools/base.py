"""The tool plugin API: what a VLM can call in the middle of a completion, and its budget.

A tool is a class registered by name, written like a task plugin::

    from mmrl.tools import Tool, ToolObservation, register_tool

    @register_tool("zoom_in")
    class ZoomIn(Tool):
        description = "Zoom in on a region of the image ..."
        parameters = {"type": "object", "properties": {"bbox_2d": {...}}, "required": ["bbox_2d"]}
        def __call__(self, arguments, state) -> ToolObservation: ...

``schema()`` is the entry of the chat template's tool list (Qwen2.5-VL's ``{"type": "function",
"function": {"name", "description", "parameters"}}``). A tool raises :class:`ToolArgumentError`
for arguments it cannot use (a box off the image, no area, a missing key); the runner
(:func:`mmrl.tools.calls.run_tool_call`) turns that into an error observation the model reads, so
a bad call never crashes a rollout. :class:`ToolState` is what a tool may read of the trajectory:
the example's images and its coordinate frame (``pred_space`` / ``frame``, recorded by the
trainer; see :mod:`mmrl.media.coords`). :class:`ToolBudget` caps a trajectory's turns, tool
pixels and tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from mmrl.registry import TOOLS, register_tool

__all__ = ["Tool", "ToolArgumentError", "ToolBudget", "ToolObservation", "ToolState", "make_tool",
           "register_tool", "tool_schemas"]


class ToolArgumentError(ValueError):
    """A tool's arguments cannot be used; the message says what is wrong, for the model to read."""


@dataclass
class ToolObservation:
    """What a tool returns: an image, a text, or both (the next turn's content)."""

    image: Any = None  # a PIL image or None
    text: Optional[str] = None
    # the region of the original image the image shows (x1, y1, x2, y2 in its pixels), for crop
    # tools: recorded in the trajectory so rewards can ground it (crop_iou)
    box: Optional[tuple] = None


@dataclass
class ToolState:
    """What a tool may read of its trajectory. ``images``: the example's images as given (the
    first is the one boxes refer to, as in DeepEyes); ``example``: the example dict, whose
    ``pred_space`` / ``frame`` say in which coordinate frame the model writes boxes."""

    images: list
    example: dict = field(default_factory=dict)

    @property
    def image(self):
        if not self.images:
            raise ToolArgumentError("this conversation has no image to work on")
        return self.images[0]


class Tool:
    """Base class of tool plugins (see the module docstring)."""

    name: str = "tool"  # set by @register_tool
    description: str = ""
    parameters: dict = {"type": "object", "properties": {}, "required": []}
    example_arguments: dict = {}  # shown in error messages: what a valid call looks like

    def __init__(self, **options: Any):
        unknown = set(options) - set(self.default_options())
        if unknown:
            raise ValueError(f"tool {self.name!r} has no option(s) {sorted(unknown)}; "
                             f"valid options: {sorted(self.default_options())}")
        self.options = {**self.default_options(), **options}

    def default_options(self) -> dict[str, Any]:
        """Tool-specific options and their defaults."""
        return {}

    def schema(self) -> dict:
        """The entry of the chat template's tool list (Qwen2.5-VL / OpenAI function format)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    def __call__(self, arguments: dict, state: ToolState) -> ToolObservation:
        raise NotImplementedError(f"tool {self.name!r} must implement __call__(arguments, state)")


def make_tool(name: str, **options: Any) -> Tool:
    """The registered tool ``name`` built with ``options``; an unknown name raises
    :class:`mmrl.UnknownNameError` naming the closest registered tools."""
    return TOOLS.get(name, key="tools")(**options)


def tool_schemas(tools: dict[str, Tool]) -> list[dict]:
    """The chat template's ``tools`` list for the tools of a run."""
    return [t.schema() for t in tools.values()]


@dataclass
class ToolBudget:
    """A trajectory's limits and what it has spent of them.

    ``max_turns``: tool turns (one turn runs every call of one assistant message);
    ``max_pixels``: total pixels of the images tools return (width * height, summed);
    ``max_tokens``: tokens of the whole trajectory (generated and observation tokens; the engine
    charges them). ``None`` is no limit. :meth:`refusal` says why the next turn or image is refused.
    """

    max_turns: Optional[int] = 5  # DeepEyes trains with rollout.agent.max_turns=5
    max_pixels: Optional[int] = None
    max_tokens: Optional[int] = None
    turns: int = 0
    pixels: int = 0
    tokens: int = 0
    refused: int = 0  # calls refused for lack of budget

    def __post_init__(self) -> None:
        for key in ("max_turns", "max_pixels", "max_tokens"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"ToolBudget: {key} must be a non-negative int or None, got {value!r}")

    def turn_refusal(self) -> Optional[str]:
        """Why another tool turn is not allowed, or None."""
        if self.max_turns is not None and self.turns >= self.max_turns:
            return f"the limit of {self.max_turns} tool turns is reached; answer now"
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            return f"the limit of {self.max_tokens} tokens is reached; answer now"
        return None

    def start_turn(self) -> Optional[str]:
        """Charge one tool turn, or return why it is refused (nothing charged then)."""
        why = self.turn_refusal()
        if why is None:
            self.turns += 1
        return why

    def image_refusal(self, width: int, height: int) -> Optional[str]:
        """Why an image of ``width`` x ``height`` may not be returned, or None."""
        if self.max_pixels is not None and self.pixels + width * height > self.max_pixels:
            left = self.max_pixels - self.pixels
            return (f"the image ({width}x{height} = {width * height} pixels) exceeds the {left} pixels left "
                    f"of this conversation's tool budget ({self.max_pixels}); zoom on a smaller region or answer")
        return None

    def charge_image(self, width: int, height: int) -> None:
        self.pixels += int(width) * int(height)

    def charge_tokens(self, n: int) -> None:
        self.tokens += int(n)

    @property
    def exhausted(self) -> bool:
        """No further tool turn is allowed (turns or tokens spent)."""
        return self.turn_refusal() is not None

    def summary(self) -> dict[str, int]:
        """What was spent, for the trajectory record (``ex["tool_budget"]``) and the run's metrics."""
        return {"turns": self.turns, "pixels": self.pixels, "tokens": self.tokens, "refused": self.refused}
