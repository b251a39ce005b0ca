"""Tools a VLM calls in the middle of its reasoning ("thinking with images"): the plugin API
(:mod:`.base`), the call parser and runner (:mod:`.calls`) and the built-ins ``zoom_in`` /
``image_zoom_in_tool``, ``crop``, ``rotate`` and ``zoom_cell`` (:mod:`.builtin`). Importing this package registers
the built-ins. A tool set as the agent loop's interaction (:mod:`mmrl.core.agent_loop`):
:mod:`.interaction`, for a :class:`ToolUseTask` (:mod:`.task`). See docs/thinking-with-images.md."""

from .base import (Tool, ToolArgumentError, ToolBudget, ToolObservation, ToolState, make_tool, register_tool,
                   tool_schemas)
from .builtin import Crop, DeepEyesZoomIn, Rotate, ZoomCell, ZoomIn, cell_box, cell_name
from .calls import RECORD_KEYS, ToolCall, ToolError, call_text, parse_tool_calls, run_tool_call, run_turn
from .interaction import ToolConversation
from .task import ToolUseTask

__all__ = ["Crop", "DeepEyesZoomIn", "RECORD_KEYS", "Rotate", "Tool", "ToolArgumentError", "ToolBudget",
           "ToolCall", "ToolConversation", "ToolError", "ToolObservation", "ToolState", "ToolUseTask", "ZoomCell", "ZoomIn", "call_text", "cell_box", "cell_name", "make_tool",
           "parse_tool_calls", "register_tool", "run_tool_call", "run_turn", "tool_schemas"]
