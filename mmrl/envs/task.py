"""Episodic tasks: a task whose examples are an environment's tasks, rolled out as episodes.

An :class:`EnvTask` is a :class:`~mmrl.task.Task` whose ``examples(split)`` are an environment's task
specs (``{"task": spec, "instruction": ...}``); the trainer rolls each one out as ``n`` episodes
through the agent loop (:mod:`mmrl.core.agent_loop`; one :class:`~mmrl.envs.interaction.EnvEpisode`
per episode) instead of ``n`` single completions. Every step of an episode becomes
one trained row: its example is :meth:`EnvTask.step_example` (the screenshot, instruction and a
bounded history of earlier actions), its completion the action the policy wrote, and the episode
adds what the step led to (``step_reward``, ``episode_id``, ``step_index``, ``anchor_key``, and
``episode_success`` / ``episode_return`` / ``episode_length`` once the episode is over), which
rewards (``env_reward``), estimators (``episode_grpo``, ``gigpo``) and metrics read.

The defaults speak the GUI action space of :mod:`mmrl.measures.gui`; an environment with another
action space overrides :meth:`prompt`, :meth:`read_action` and :meth:`format_expert_action`.
"""

from __future__ import annotations

from typing import Any, Sequence

from mmrl.core.agent_loop import LoopOptions
from mmrl.core.episodes import EpisodicTask, episode_key
from mmrl.measures.gui import format_action, history_text, parse_action, pixel_point
from mmrl.media.coords import pixels_to_prediction
from mmrl.media.draw import FOOTER, PRED, canvas, draw_label, draw_point
from mmrl.data.sequence import LazySequence
from mmrl.task import Task, image_prompt

from .base import Env, Observation, make_env
from .interaction import EnvEpisode

__all__ = ["EnvTask", "expert_episode"]

# The answer layout of an action step: the reasoning block is optional (``thinking`` option).
ACTION_INSTRUCTION = 'Answer with <think>...</think><answer>{"action": ...}</answer>.'
ACTION_ONLY_INSTRUCTION = 'Answer with <answer>{"action": ...}</answer>.'
INVALID_ACTION = "invalid"  # how an unreadable action appears in the history of later prompts


class EnvTask(Task, EpisodicTask):
    """Base class of episodic tasks (see the module docstring)."""

    modality = "vlm"
    rewards = {"env_reward": 1.0}
    success_metric = "success"
    env_name: str = "synthetic_gui"  # the default ``env`` option

    def default_options(self) -> dict[str, Any]:
        return {
            "env": self.env_name,  # a registered environment (mmrl.envs.register_env)
            "env_options": {},  # its options
            "max_steps": None,  # actions per episode; None: the environment's max_steps
            "history_length": 4,  # earlier actions shown in each step's prompt (0: none)
            "thinking": False,  # True: <think> before the action
            # seconds an environment step may take; a step that takes longer ends its episode
            # (abandoned, counted in episode/timeouts). 0: no limit (the step runs in this thread).
            "step_timeout": 0,
        }

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.env_options = dict(self.options["env_options"] or {})
        self._prototype = self.make_env()  # validates the environment's name and options now
        steps = self.options["max_steps"]
        self.max_steps = int(steps if steps is not None else self._prototype.max_steps)
        if self.max_steps < 1:
            raise ValueError(f"{self.name}: max_steps must be >= 1, got {self.max_steps}")
        self.step_timeout = float(self.options["step_timeout"] or 0)
        if self.step_timeout < 0:
            raise ValueError(f"{self.name}: step_timeout must be >= 0 seconds, got {self.step_timeout}")

    # -- the environment --------------------------------------------------------------------------
    def make_env(self) -> Env:
        """A fresh environment instance (one per episode)."""
        return make_env(self.options["env"], **self.env_options)

    def interactions(self, policy, examples: Sequence[dict], n: int) -> list[EnvEpisode]:
        """``n`` episodes of each task spec of ``examples``, each in its own environment; every
        step's example is prepared by the policy as it happens (:mod:`mmrl.envs.interaction`)."""
        return [EnvEpisode(self, spec, policy.prepare_examples) for spec in examples for _ in range(n)]

    def loop_options(self) -> LoopOptions:
        return LoopOptions(max_turns=self.max_steps, step_timeout=self.step_timeout)

    def examples(self, split: str) -> Sequence[dict]:
        """The environment's task specs of ``split``, as ``{"task": spec, "instruction": ...}``."""
        return _Specs(self._prototype.tasks(split))

    def step_example(self, ex: dict, obs: Observation, history: Sequence[dict | None]) -> dict:
        """The example of one step: what the policy sees (screenshot, instruction, the earlier
        actions with points in screenshot pixels, None for an unreadable one) and, for
        coordinates, the screenshot's size."""
        return {
            "task": ex["task"], "instruction": obs.instruction, "image": obs.image,
            "image_size": tuple(obs.image.size), "elements": obs.elements, "history": list(history),
            **({"_index": ex["_index"]} if "_index" in ex else {}),
        }

    # -- prompts, actions and references ------------------------------------------------------------
    def prompt(self, ex: dict) -> list[dict]:
        instruction = ACTION_INSTRUCTION if self.thinking else ACTION_ONLY_INSTRUCTION
        earlier = [INVALID_ACTION if a is None else format_action(self.to_policy_space(a, ex))
                   for a in ex.get("history") or []]
        history = history_text(earlier, int(self.options["history_length"]))
        return image_prompt(ex["image"], f"Task: {ex['instruction']}. Previous actions: {history}. {instruction}")

    def read_action(self, completion: str, ex: dict) -> dict | None:
        """The action of ``completion`` with its point in screenshot pixels (converted from the
        policy's space recorded in ``ex``), or None when unreadable."""
        action = parse_action(completion)
        if action is None or "point" not in action:
            return action
        point = pixel_point(action, ex)
        return None if point is None else {**action, "point": [float(v) for v in point]}

    @staticmethod
    def to_policy_space(action: dict, ex: dict) -> dict:
        """``action`` with its point (screenshot pixels) in the policy's coordinate space."""
        if "point" not in action:
            return action
        return {**action, "point": list(pixels_to_prediction(action["point"], ex))}

    def format_expert_action(self, action: dict, ex: dict) -> str:
        """The reference completion of a scripted-solver action, its point in the policy's space."""
        answer = f"<answer>{format_action(self.to_policy_space(action, ex))}</answer>"
        return f"<think>{ex['instruction']}.</think>{answer}" if self.thinking else answer

    def target(self, ex: dict) -> str:
        """The scripted solver's action for a step example that carries it (``expert_action``;
        :meth:`sft_examples` makes such examples)."""
        if ex.get("expert_action") is None:
            raise ValueError(f"{self.name}: target() needs a step example with an expert_action "
                             "(see sft_examples); a task spec has none")
        return self.format_expert_action(ex["expert_action"], ex)

    def sft_examples(self, split: str) -> Sequence[dict]:
        """Step examples along scripted-solver episodes of ``split``'s tasks, each with the
        solver's ``expert_action``: what a warm start imitates."""
        return _ExpertSteps(self, self.examples(split))

    # -- metrics and pictures ---------------------------------------------------------------------------
    def metrics(self, completions, examples) -> dict[str, float]:
        """Over the episodes the rows belong to: ``success`` (the task accomplished), mean
        ``episode_length`` (actions), ``invalid_actions`` (fraction of steps whose action was
        unreadable or not applicable)."""
        episodes = {episode_key(ex): ex for ex in examples if "episode_id" in ex}
        if not episodes:
            return {}
        n = len(episodes)
        steps = [ex for ex in examples if "episode_id" in ex]
        return {
            "success": sum(float(ex.get("episode_success", False)) for ex in episodes.values()) / n,
            "episode_length": sum(ex.get("episode_length", 0) for ex in episodes.values()) / n,
            "invalid_actions": sum(not ex.get("step_valid", True) for ex in steps) / max(len(steps), 1),
        }

    def success(self, completion: Any, ex: dict) -> bool | None:
        return bool(ex["episode_success"]) if "episode_success" in ex else None

    def visualize(self, ex: dict, completion: str):
        """The step's screenshot with the click (red ring) and the action and reward in a footer."""
        if ex.get("image") is None:
            return None
        image, draw = canvas(ex["image"], scale=2, footer=FOOTER)
        action = self.read_action(completion, ex) if isinstance(completion, str) else None
        if action is not None and "point" in action:
            draw_point(draw, action["point"], PRED, scale=2)
        what = format_action(action) if action is not None else INVALID_ACTION
        draw_label(draw, f"{ex.get('step_index', 0) + 1}: {what[:48]} r={ex.get('step_reward', 0):g}")
        return image

    def record(self, ex: dict, completion: Any) -> dict[str, Any]:
        return {**super().record(ex, completion), "prompt": ex.get("instruction", ""),
                "answer": "success" if ex.get("episode_success") else ""}


class _Specs(LazySequence):
    """A sequence view of task specs as examples."""

    def __init__(self, specs: Sequence[dict]):
        self._specs = specs

    def __len__(self) -> int:
        return len(self._specs)

    def item(self, i: int) -> dict:
        spec = self._specs[i]
        return {"task": spec, "instruction": spec["instruction"]}


class _ExpertSteps(LazySequence):
    """Step examples of scripted-solver episodes: item i is a step of the episode of spec
    ``i // max_steps`` (the same spec seen at each of its steps, cycling when shorter)."""

    def __init__(self, task: EnvTask, specs: Sequence[dict]):
        self.task, self.specs = task, specs

    def __len__(self) -> int:
        return len(self.specs) * self.task.max_steps

    def item(self, i: int) -> dict:
        steps = expert_episode(self.task, self.specs[i // self.task.max_steps])
        return steps[(i % self.task.max_steps) % len(steps)]


def expert_episode(task: EnvTask, ex: dict) -> list[dict]:
    """The step examples of one scripted-solver episode of ``ex``, each with its ``expert_action``
    (points in screenshot pixels), up to the task's step limit."""
    env = task.make_env()
    obs = env.reset(ex["task"])
    steps, history = [], []
    for _ in range(task.max_steps):
        action = env.expert_action()
        if action is None:
            break
        steps.append({**task.step_example(ex, obs, history), "expert_action": action})
        history.append(action)
        obs, _, done, _ = env.step(action)
        if done:
            break
    if not steps:
        raise ValueError(f"{task.name}: the scripted solver of {task.options['env']!r} took no action on {ex['task']!r}")
    return steps
