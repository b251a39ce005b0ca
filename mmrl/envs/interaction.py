"""One episode of an environment task: the environment as the agent loop's interaction.

The agent loop (:mod:`mmrl.core.agent_loop`) runs ``n`` episodes of each task spec, batched. At
every turn an :class:`EnvEpisode` shows the policy its step example (:meth:`EnvTask.step_example
<mmrl.envs.task.EnvTask.step_example>`: the screenshot, the instruction and the earlier actions,
prepared by the policy), reads the action the policy wrote (``None`` for an unreadable one, which
the environment judges: an invalid action, not a crash) and steps the environment; the episode ends
when the environment says so, or at the task's step limit. Each step's row carries
``step_reward``, ``step_valid``, ``step_message`` and, as ``anchor_key``, the state it acted from;
every row of a finished episode its outcome (``episode_success``, ``episode_return``,
``episode_length``, ``episode_timed_out``): what the episode-aware estimators, rewards and metrics
read (:mod:`mmrl.core.episodes`).
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from mmrl.core.agent_loop import Interaction, Reply
from mmrl.core.rollouts import Rollouts

__all__ = ["EnvEpisode"]


def _step_keys(acted_from, reward: float, valid: bool, message: str) -> dict:
    return {"anchor_key": acted_from.state_key, "step_reward": float(reward), "step_valid": bool(valid),
            "step_message": str(message)}


class EnvEpisode(Interaction):
    """An episode of task spec ``spec`` in a fresh environment of ``task`` (an
    :class:`~mmrl.envs.task.EnvTask`); ``prepare`` is the policy's ``prepare_examples``."""

    def __init__(self, task, spec: dict, prepare: Callable[[Sequence[dict]], list[dict]]):
        self.task, self.spec, self.prepare = task, spec, prepare
        self.env = task.make_env()
        self.observation = self.env.reset(spec["task"])
        self.history: list = []  # the actions so far (None for an unreadable one)
        self.total, self.info = 0.0, {}  # the return so far; the last step's info
        self._lock, self._abandoned = threading.Lock(), False

    def ask(self) -> tuple[dict, list]:
        [ex] = self.prepare([self.task.step_example(self.spec, self.observation, self.history)])
        return ex, self.task.build_prompt(ex)

    def answer(self, batch: Rollouts, row: int) -> Reply:
        action = self.task.read_action(batch.completions[row], batch.examples[row])
        acted_from = self.observation
        observation, reward, done, info = self.env.step(action)
        with self._lock:  # a step abandoned at its time limit changes nothing when it finishes
            if self._abandoned:
                return Reply(done=True)
            self.history.append(action)
            self.observation, self.total, self.info = observation, self.total + float(reward), info
        return Reply(done=bool(done), row=_step_keys(acted_from, reward, info.get("valid", action is not None),
                                                     info.get("message", "")))

    def timed_out(self, seconds: float) -> Reply:
        """The environment step ran past ``task.options.step_timeout``: the episode ends there
        (reward 0, counted in ``episode_timed_out``); the environment is not used again."""
        with self._lock:
            self._abandoned = True
            self.info = {"valid": False, "success": False, "timed_out": True}
        message = f"the environment step took longer than {seconds:g} s"
        return Reply(done=True, row=_step_keys(self.observation, 0.0, False, message))

    def outcome(self, turns: int, over_turn: bool) -> dict:
        return {"episode_success": bool(self.info.get("success", False)), "episode_return": self.total,
                "episode_length": turns, "episode_timed_out": bool(self.info.get("timed_out", False))}
