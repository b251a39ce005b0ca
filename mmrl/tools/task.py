"""Tasks whose completions may call tools: each example is rolled out as multi-turn trajectories.

A :class:`ToolUseTask` is a :class:`~mmrl.task.Task` and an
:class:`~mmrl.core.episodes.EpisodicTask`: the trainer and the evaluation roll out its examples
through the agent loop (:mod:`mmrl.core.agent_loop`; one :class:`~mmrl.tools.interaction.ToolConversation`
per trajectory, every turn a row) instead of single completions.
A subclass writes the task as usual (examples, prompt, rewards on the trajectory record) and, for
its metrics, :meth:`trajectory_metrics` over one completion per trajectory: the whole trajectory's
text. Its options (``task.options.*``):

- ``tools``: name -> options of the registered tools the model may call (``@register_tool``);
- ``max_turns``: tool turns per trajectory (DeepEyes trains with 5); 0 makes a no-tool baseline;
- ``max_tool_pixels`` / ``max_tokens``: the trajectory's pixel budget for tool images and its
  token budget (conversation so far), None for none (:class:`~mmrl.tools.base.ToolBudget`);
- ``stop_at_call``: generation stops where the model closes a call (``</tool_call>``), the tool
  runs and the next turn continues (default); false: each message is generated to its end of turn
  and up to ``max_calls_per_turn`` of its calls run, as DeepEyes does;
- ``max_calls_per_turn``: calls run per message (DeepEyes' ``max_action_per_turn``, 3);
- ``over_turn_masking``: Mini-o3's over-turn masking (:mod:`mmrl.core.agent_loop`);
- ``step_timeout``: seconds the calls of one message may take (0: no limit), as an environment
  task's: past it the trajectory ends (:meth:`ToolConversation.timed_out
  <mmrl.tools.interaction.ToolConversation.timed_out>`), counted in ``tool/timeouts``;
- ``tools_in_prompt``: put the tool list in a system message (Qwen2.5's tool block), for a model
  whose chat template is not given the tools (mmrl renders the conversation without ``tools=``).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from mmrl.core.agent_loop import LoopOptions
from mmrl.core.episodes import EpisodicTask, episode_key
from mmrl.core.rollouts import Rollouts
from mmrl.measures.tool_use import tool_use_metrics
from mmrl.task import Task

from mmrl.data.sequence import LazySequence

from .base import ToolBudget, ToolState, make_tool
from .calls import CLOSE, run_turn
from .interaction import ToolConversation, observation_message

__all__ = ["ToolUseTask", "one_per_trajectory", "tools_system_prompt"]


def one_per_trajectory(completions: Sequence, examples: Sequence) -> tuple[list, list]:
    """(texts, examples) with one entry per trajectory: a turn row's whole trajectory text and its
    example, taken once (a trajectory is scored once, not once per turn); rows that are not turns
    (single completions) as they are."""
    texts, finals, seen = [], [], set()
    for completion, ex in zip(completions, examples):
        if isinstance(ex, dict) and "episode_id" in ex:
            key = episode_key(ex)
            if key in seen:
                continue
            seen.add(key)
            completion = ex.get("trajectory", completion)
        texts.append(completion)
        finals.append(ex)
    return texts, finals


def tools_system_prompt(tools) -> str:
    """The tool block Qwen2.5's chat template writes into the system message for ``tools=``."""
    listing = "\n".join(json.dumps(t.schema()) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{listing}\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


class ToolUseTask(Task, EpisodicTask):
    """Base class of tool-using tasks (module docstring)."""

    default_tools: dict[str, dict] = {"zoom_in": {}}

    def default_options(self) -> dict[str, Any]:
        return {**super().default_options(), "tools": {k: dict(v) for k, v in self.default_tools.items()},
                "max_turns": 5, "max_tool_pixels": None, "max_tokens": None, "max_calls_per_turn": 3,
                "over_turn_masking": False, "tools_in_prompt": True, "stop_at_call": True, "step_timeout": 0}

    def __init__(self, **options: Any):
        super().__init__(**options)
        o = self.options
        for key in ("max_turns", "max_calls_per_turn"):
            if isinstance(o[key], bool) or not isinstance(o[key], int) or o[key] < (0 if key == "max_turns" else 1):
                raise ValueError(f"{self.name}: {key} must be an int >= {0 if key == 'max_turns' else 1}, got {o[key]!r}")
        timeout = o["step_timeout"]
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout < float("inf"):
            raise ValueError(f"{self.name}: step_timeout must be a number of seconds >= 0 (0: no limit), "
                             f"got {timeout!r}")
        if not isinstance(o["tools"], dict):
            raise ValueError(f"{self.name}: tools must map tool names to their options, got {o['tools']!r}")
        self.bool_option("over_turn_masking"), self.bool_option("tools_in_prompt"), self.bool_option("stop_at_call")
        self.make_budget()  # the budget's values checked now, not at the first rollout
        self.tools = self.make_tools()  # unknown tools and options fail here, naming them

    # -- what a rollout uses -----------------------------------------------------------------------
    def make_tools(self) -> dict:
        """The tools of ``options["tools"]``, by name (fresh instances)."""
        return {name: make_tool(name, **dict(opts or {})) for name, opts in self.options["tools"].items()}

    def make_budget(self) -> ToolBudget:
        o = self.options
        return ToolBudget(max_turns=o["max_turns"], max_pixels=o["max_tool_pixels"], max_tokens=o["max_tokens"])

    @property
    def max_generations(self) -> int:
        """Assistant messages per trajectory at most: each tool turn, then the answer."""
        return int(self.options["max_turns"]) + 1

    @property
    def stop_texts(self) -> tuple[str, ...]:
        """The texts that end a turn's generation besides the end of turn (``stop_at_call``)."""
        return (CLOSE,) if self.bool_option("stop_at_call") else ()

    @property
    def max_calls_per_turn(self) -> int:
        return int(self.options["max_calls_per_turn"])

    def build_prompt(self, ex: dict) -> list[dict]:
        """The messages of a trajectory's next turn: the task's prompt (with the tool list as a
        system message when ``tools_in_prompt`` is on, the task has tools and the prompt has no
        system message of its own), then per earlier turn in ``ex["tool_turns"]`` (``(text,
        observations)`` pairs; none for the first turn) the model's message and its observations.
        A turn example of :meth:`sft_examples` replays its earlier reference turns."""
        if "sft_turn" in ex:  # a turn example of a reference trajectory: its earlier turns replayed
            ex = {**{k: v for k, v in ex.items() if k != "sft_turn"}, "tool_turns": self._replayed(ex)[1]}
        messages = super().build_prompt({k: v for k, v in ex.items() if k != "tool_turns"})
        if (self.options["tools_in_prompt"] and self.tools and self.options["max_turns"] > 0
                and not (messages and messages[0].get("role") == "system")):
            messages = [{"role": "system", "content": tools_system_prompt(self.tools.values())}] + messages
        for text, observations in ex.get("tool_turns") or ():
            messages = messages + [{"role": "assistant", "content": text}, observation_message(observations)]
        return messages

    # -- a warm start on reference trajectories (mmrl sft) -------------------------------------------
    def reference_turns(self, ex: dict) -> list[str]:
        """The assistant turns of a reference trajectory of ``ex`` (its calls in the policy's
        frame: ``ex`` is prepared); default: the task's one-turn :meth:`target`."""
        return [super().target(ex)]

    def sft_examples(self, split: str) -> Sequence[dict]:
        """Turn examples of the reference trajectories of ``split`` (what ``mmrl sft`` imitates):
        item i is turn ``i % max_generations`` of example ``i // max_generations`` (cycling
        over a shorter trajectory's turns), marked ``sft_turn``; its prompt replays the earlier
        reference turns with the tools' real observations (:meth:`build_prompt`), its
        :meth:`target` is that turn."""
        return _TurnExamples(self, self.examples(split))

    def _replayed(self, ex: dict) -> tuple[list[str], list[tuple[str, list]]]:
        """The reference turns of a turn example and the ``(text, observations)`` before its turn."""
        base = {k: v for k, v in ex.items() if k != "sft_turn"}
        turns = self.reference_turns(base)
        k = ex["sft_turn"] % len(turns)
        state = ToolState(images=[base["image"]] if base.get("image") is not None else [], example=base)
        budget, tools, replayed = self.make_budget(), self.make_tools(), []
        for text in turns[:k]:
            observations, _ = run_turn(text, tools, state, budget, self.max_calls_per_turn)
            replayed.append((text, observations))
        return turns, replayed

    def target(self, ex: dict) -> str:
        if "sft_turn" not in ex:
            return super().target(ex)
        turns, replayed = self._replayed(ex)
        return turns[len(replayed)]

    def interaction(self, ex: dict) -> ToolConversation:
        """One trajectory of ``ex`` (:mod:`mmrl.tools.interaction`)."""
        return ToolConversation(self, ex)

    def loop_options(self) -> LoopOptions:
        return LoopOptions(max_turns=self.max_generations, stop=self.stop_texts,
                           step_timeout=float(self.options["step_timeout"]),
                           mask_over_turn=self.bool_option("over_turn_masking"))

    # -- metrics over trajectories -----------------------------------------------------------------
    def metrics(self, completions, examples) -> dict[str, float]:
        """:meth:`trajectory_metrics` on one completion per trajectory (its whole text), with
        ``turns`` (assistant messages per trajectory), ``tool/over_turn`` (the share cut by the
        budget before answering) and ``tool/timeouts`` (the share ended by ``step_timeout``). Rows
        that are not turns (single completions) count as they are."""
        texts, finals = one_per_trajectory(completions, examples)
        out = self.trajectory_metrics(texts, finals)
        if finals:
            out["turns"] = sum(ex.get("turns", 1) for ex in finals) / len(finals)
            out["tool/over_turn"] = sum(float(ex.get("over_turn", False)) for ex in finals) / len(finals)
            out["tool/timeouts"] = sum(float(ex.get("episode_timed_out", False)) for ex in finals) / len(finals)
        return out

    def record(self, ex: dict, completion: Any) -> dict[str, Any]:
        """A saved rollout of a turn also shows its turn, the whole trajectory and its calls."""
        out = super().record(ex, completion)
        if isinstance(ex, dict) and "trajectory" in ex:
            out.update(turn=ex.get("step_index", 0), trajectory=ex["trajectory"],
                       tool_calls=[{k: c.get(k) for k in ("turn", "name", "arguments", "ok", "error")}
                                   for c in ex.get("tool_calls") or []])
        return out

    def rollout_metrics(self, rows: Rollouts) -> dict[str, float]:
        """A training step's trajectories: :meth:`metrics` (tool use, turns, the task's own)."""
        return self.metrics(rows.completions, rows.examples)

    def trajectory_metrics(self, completions, examples) -> dict[str, float]:
        """Metrics of whole trajectories (one completion each); default: the tool-use metrics."""
        return tool_use_metrics(examples)


class _TurnExamples(LazySequence):
    """Turn examples of the reference trajectories of ``examples`` (:meth:`ToolUseTask.sft_examples`)."""

    def __init__(self, task: ToolUseTask, examples: Sequence[dict]):
        self.task, self.examples = task, examples

    def __len__(self) -> int:
        return len(self.examples) * self.task.max_generations

    def item(self, i: int) -> dict:
        return {**self.examples[i // self.task.max_generations], "sft_turn": i % self.task.max_generations}
