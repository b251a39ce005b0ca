"""A tool set as the agent loop's interaction: the model writes, its calls run, their images come back.

"Thinking with images" (DeepEyes: "DeepEyes: Incentivizing 'Thinking with Images' via
Reinforcement Learning"; Mini-o3: "Mini-o3: Scaling Up Reasoning Patterns and Interaction Turns
for Visual Search"). The agent loop (:mod:`mmrl.core.agent_loop`) rolls out ``n`` trajectories of
each example of a :class:`~mmrl.tools.task.ToolUseTask`, one :class:`ToolConversation` each: the
calls of each assistant message run (:func:`mmrl.tools.calls.run_turn`) and their observations
(tool images, error text) come back as the next user turn inside ``<tool_response>``. With the
task's ``stop_at_call`` (the default) a message's generation stops where it closes its call
(``</tool_call>``), so the model never writes past it; the chat template closes the message in the
next turn's prompt. A trajectory ends with a message that calls no tool (its answer), or when its
budget is spent (:class:`~mmrl.tools.base.ToolBudget`: cut, over-turn), or when its calls run past
the task's ``step_timeout`` (the agent loop's time limit): the trajectory ends there, each call of
that message recorded as failed, and its rows carry ``episode_timed_out``.

Each turn is a row whose log-probs are those of the model's tokens given everything before them:
exactly the unmasked positions of the one interleaved sequence verl / DeepEyes train on, so with
``algo.loss_agg_mode=token_mean`` the loss over a trajectory's rows is its masked loss (a test
checks it token by token). Generating a turn reuses the keys/values of the conversation so far
(``rollout.turn_cache``: the HF engine's :mod:`mmrl.vlm.turn_cache`, vLLM's prefix caching);
scoring a turn's log-probs (old, reference, the update) still reads its whole prompt.
Once a trajectory is over its rows carry the record of :mod:`mmrl.measures.tool_use`
(``trajectory``: the whole text; ``tool_calls``; ``tool_budget``) plus ``turns`` and ``over_turn``,
so every row scores the trajectory's reward (``episode_grpo`` with ``episode_return: final``:
trajectory-level GRPO).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Sequence

from mmrl.core.agent_loop import Interaction, Reply
from mmrl.core.rollouts import Rollouts

from .base import ToolObservation, ToolState
from .calls import RECORD_KEYS, parse_tool_calls, run_turn

__all__ = ["ToolConversation", "conversation", "observation_message", "observation_text"]

RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


def observation_message(observations) -> dict:
    """The user turn that returns a turn's observations: ``<tool_response>``, each image and
    text in order, ``</tool_response>`` (DeepEyes' layout, which every chat template renders)."""
    content: list[dict] = [{"type": "text", "text": RESPONSE_OPEN}]
    for obs in observations:
        if obs.image is not None:
            content.append({"type": "image", "image": obs.image})
        if obs.text:
            content.append({"type": "text", "text": obs.text})
    content.append({"type": "text", "text": RESPONSE_CLOSE})
    return {"role": "user", "content": content}


def observation_text(observations) -> str:
    """The observations as they appear in a trajectory's text: an image as ``<image>``."""
    parts = [("<image>" if obs.image is not None else "") + (obs.text or "") for obs in observations]
    return RESPONSE_OPEN + "".join(parts) + RESPONSE_CLOSE


def conversation(task, ex: dict, turns: Sequence[tuple[str, list]]) -> list[dict]:
    """The chat messages of a trajectory's next turn (:meth:`ToolUseTask.build_prompt` with the
    earlier ``turns``: ``(text, observations)`` pairs)."""
    return task.build_prompt({**ex, "tool_turns": list(turns)})


def trajectory_text(turns: Sequence[tuple[str, list]], last: str) -> str:
    """The whole trajectory as one text (the record's ``trajectory``)."""
    return "".join(text + observation_text(obs) for text, obs in turns) + last


def _conversation_tokens(batch: Rollouts, row: int) -> int | None:
    """Tokens of a row's conversation so far (prompt + this turn), when the policy reports ids."""
    prompts, comps = batch.payload.get("prompt_ids"), batch.payload.get("completion_ids")
    if prompts is None or comps is None:
        return None
    return int(len(prompts[row]) + len(comps[row]))


class ToolConversation(Interaction):
    """One trajectory of ``ex`` (prepared by the policy) for ``task`` (a
    :class:`~mmrl.tools.task.ToolUseTask`): its own tools, budget and the example's images.

    A turn's calls run on a copy of the budget, kept only if the turn was not abandoned at the
    time limit: a call that finishes after it changes nothing :meth:`outcome` reports."""

    def __init__(self, task, ex: dict):
        self.task, self.example = task, ex
        self.tools, self.budget = task.make_tools(), task.make_budget()
        self.state = ToolState(images=[ex["image"]] if ex.get("image") is not None else [], example=ex)
        self.turns: list[tuple[str, list]] = []  # (message, its observations) of every turn answered
        self.records: list[dict] = []  # one per call, in order (mmrl.tools.calls.RECORD_KEYS)
        self._lock, self._message, self._timed_out = threading.Lock(), "", False

    def ask(self) -> tuple[dict, list[dict]]:
        with self._lock:
            self._message = ""  # this turn's message, once its answer starts
        return self.example, conversation(self.task, self.example, self.turns)

    def answer(self, batch: Rollouts, row: int) -> Reply:
        """Run the message's calls; a message without one is the answer. With the budget spent
        (turns or tokens) a call is refused, and ends the trajectory, cut."""
        text, tokens = batch.completions[row], _conversation_tokens(batch, row)
        with self._lock:
            self._message = text  # what timed_out records, should the calls outlast the time limit
        budget = dataclasses.replace(self.budget)
        if tokens is not None:
            budget.charge_tokens(tokens - budget.tokens)
        spent = budget.exhausted
        observations, records = run_turn(text, self.tools, self.state, budget, self.task.max_calls_per_turn)
        with self._lock:
            if self._timed_out:  # abandoned at the time limit: timed_out has answered for this turn
                return Reply(done=True)
            self.budget = budget
            self.records.extend(records)
            self.turns.append((text, observations))
        return Reply(done=not records, cut=bool(records) and spent)

    def timed_out(self, seconds: float) -> Reply:
        """The message's calls ran past ``task.options.step_timeout``: the trajectory ends there,
        each of its calls recorded as failed with the reason (the budget as before the turn)."""
        error = f"Error: the tool calls took longer than {seconds:g} s."
        with self._lock:
            self._timed_out = True
            text = self._message  # "" only if the answer had not started by the deadline
        calls = parse_tool_calls(text, self.tools)
        self.records.extend({**dict.fromkeys(RECORD_KEYS), "turn": self.budget.turns + 1, "name": c.name,
                             "arguments": c.arguments, "ok": False, "error": error} for c in calls)
        self.turns.append((text, [ToolObservation(text=error)]))
        return Reply(done=True)

    def outcome(self, turns: int, over_turn: bool) -> dict:
        *before, (last, _) = self.turns
        return {"trajectory": trajectory_text(before, last), "over_turn": over_turn, "turns": turns,
                "tool_calls": self.records, "tool_budget": self.budget.summary(),
                "episode_timed_out": self._timed_out}
