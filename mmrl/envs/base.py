"""The environment plugin API: multi-step tasks in which the policy acts until the episode ends.

An environment is written like a task plugin::

    from mmrl.envs import Env, Observation, register_env

    @register_env("synthetic_gui")
    class SyntheticGUI(Env):
        max_steps = 6
        def tasks(self, split): ...            # task specs (dicts with an "instruction"), by seed
        def reset(self, task) -> Observation   # the first screen
        def step(self, action) -> tuple[Observation, float, bool, dict]
        def expert_action(self) -> dict        # a scripted solver's next action (optional)

gym-like on purpose (``reset`` / ``step`` returning observation, reward, done, info), so an
existing gym environment wraps in a few lines. An action is a dict of the GUI action space of
:mod:`mmrl.measures.gui` (``{"action": "click", "point": [x, y]}``, ...) with points in the
screenshot's pixels, or ``None`` for text the parser could not read; the episode runner
(:mod:`mmrl.core.episodes`) converts the policy's coordinates to pixels before ``step``.

``info`` may carry ``success`` (bool: the task is accomplished; the runner's success metric),
``valid`` (bool: the action was understood and applicable) and ``message`` (what happened, shown in
the episode viewer). One instance runs one episode at a time; the runner makes one per episode
with :func:`make_env`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Sequence

from mmrl.registry import ENVS, register_env

__all__ = ["Env", "Observation", "make_env", "register_env", "state_key_of"]


@dataclass
class Observation:
    """What the policy sees at one step: the screenshot, the task's instruction, and (for
    galleries, grounding and rewards) the screen's elements as an accessibility tree:
    ``[{"name": "Bluetooth toggle", "role": "switch", "box": (x1, y1, x2, y2)}, ...]`` in the
    screenshot's pixels. ``state_key`` identifies the state: two observations with equal keys are
    the same state (GiGPO's anchor states); left empty, it is a hash of the pixels and the
    instruction (:func:`state_key_of`)."""

    image: Any
    instruction: str
    elements: list[dict] = field(default_factory=list)
    state_key: str = ""

    def __post_init__(self) -> None:
        if not self.state_key:
            self.state_key = state_key_of(self.image, self.instruction)


def state_key_of(image, instruction: str = "") -> str:
    """A short stable hash of a screenshot's pixels (and size, mode) and the instruction."""
    h = hashlib.blake2b(digest_size=12)
    h.update(f"{getattr(image, 'size', None)}|{getattr(image, 'mode', None)}|{instruction}|".encode())
    if image is not None and hasattr(image, "tobytes"):
        h.update(image.tobytes())
    return h.hexdigest()


class Env:
    """Base class of environment plugins (see the module docstring)."""

    name: str = "env"  # set by @register_env
    max_steps: int = 8  # the runner ends an episode after this many actions (``env.max_steps`` overrides)

    def __init__(self, **options: Any):
        unknown = set(options) - set(self.default_options())
        if unknown:
            raise ValueError(f"environment {self.name!r} has no option(s) {sorted(unknown)}; "
                             f"valid options: {sorted(self.default_options())}")
        self.options = {**self.default_options(), **options}

    def default_options(self) -> dict[str, Any]:
        """Environment-specific options (``task.options.env_options`` of the env task) and defaults."""
        return {}

    def tasks(self, split: str) -> Sequence[dict]:
        """The task specs of ``split`` ("train" / "eval"), each a dict with at least an
        ``instruction``; deterministic, a sequence supporting len and indexing."""
        raise NotImplementedError(f"environment {self.name!r} must implement tasks(split)")

    def reset(self, task: dict) -> Observation:
        raise NotImplementedError(f"environment {self.name!r} must implement reset(task)")

    def step(self, action: dict | None) -> tuple[Observation, float, bool, dict]:
        raise NotImplementedError(f"environment {self.name!r} must implement step(action)")

    def expert_action(self) -> dict | None:
        """The next action of a scripted solver from the current state (SFT warm starts, tests);
        None when the environment has none."""
        return None


def make_env(name: str, **options: Any) -> Env:
    """The registered environment ``name`` built with ``options``."""
    return ENVS.get(name, "environment")(**options)
